//! The holder's side: renewing the lease while the store is open, and
//! freeing it when the store closes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{LeaseIo, Shared};
use crate::format::{LeaseDecode, LeaseRecord};

/// The renewal thread: every `every`, reads the lease back and, while it is
/// still `record`'s owner's, writes it with the next generation. Another writer's
/// lease sets `lost` and ends the thread; an I/O failure is logged and
/// retried at the next interval. Frees the lease when asked to stop.
pub(super) fn run(mut io: LeaseIo, mut record: LeaseRecord, every: Duration, shared: &Shared, store: &str) {
    let bs = io.block_size();
    loop {
        {
            let stop = shared.stop.lock().unwrap_or_else(|p| p.into_inner());
            let (stop, _) =
                shared.wake.wait_timeout_while(stop, every, |s| !*s).unwrap_or_else(|p| p.into_inner());
            if *stop {
                break;
            }
        }
        let found = match io.read(every) {
            Ok(b) => LeaseRecord::decode(&b),
            Err(e) => {
                tracing::warn!(store, error = %e, "tutti-kv: reading the lease block for its renewal failed");
                continue;
            }
        };
        match found {
            // Ours (a renewal whose write failed may still have landed:
            // the owner tells, not the generation).
            LeaseDecode::Held(r) if r.owner == record.owner => {
                record.generation = record.generation.max(r.generation)
            }
            other => {
                shared.lost.store(true, Ordering::Release);
                tracing::error!(store, found = ?other, "tutti-kv: the store's lease was taken by another writer; this store writes nothing more");
                return;
            }
        }
        let next = LeaseRecord { generation: record.generation + 1, ..record };
        match io.write(&next.encode(bs), every) {
            Ok(()) => record = next,
            Err(e) => tracing::warn!(store, error = %e, "tutti-kv: renewing the lease failed"),
        }
    }
    release(&mut io, &record);
}

/// Frees the lease (writes a free lease block) if the block still names
/// `record`'s owner; leaves another writer's lease alone.
pub(super) fn release(io: &mut LeaseIo, record: &LeaseRecord) {
    const T: Duration = Duration::from_secs(1);
    let bs = io.block_size();
    match io.read(T) {
        Ok(b) if holds(&b, record) => {
            if let Err(e) = io.write(&LeaseRecord::encode_free(bs), T) {
                // The next opener on this host finds this process's lease
                // with an owner no longer live, or this process gone.
                tracing::debug!(error = %e, "tutti-kv: freeing the lease failed");
            }
        }
        _ => {}
    }
}

/// Whether lease block `b` names `record`'s owner.
fn holds(b: &[u8], record: &LeaseRecord) -> bool {
    matches!(LeaseRecord::decode(b), LeaseDecode::Held(r) if r.owner == record.owner)
}
