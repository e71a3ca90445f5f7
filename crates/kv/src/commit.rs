//! Group commit: puts whose payloads are written wait here; one thread at
//! a time leads a round that commits every waiting put together.
//!
//! A round: Flush (the payloads are durable) -> write the record blocks
//! of the round's puts and of the slots being cleared -> Flush (the
//! records are durable) -> publish. The Flushes are left out when no drive
//! of the store has a volatile write cache: a completed write is durable
//! then. So a record never reaches the media
//! before its payload is durable, and a slot is reused only after the
//! round that zeroed its record (`index.rs`). A put superseding an older
//! object of its key makes the old slot stale when its round publishes;
//! the old record is cleared by a later round, never by the same one (two
//! record blocks are not written atomically together).
//!
//! Locks: the commit queue, then (while leading, with the queue let go)
//! the index and the staging buffer, one at a time.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

use tutti::{Direction, Request};

use crate::committer::PendingPut;
use crate::error::ItemStatus;
use crate::format::RECORD_BYTES;
use crate::io::run;
use crate::store::KvStore;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KvStore {
    /// Commits `puts` (possibly none: then the round only clears stale
    /// records, a durability barrier for removes), together with whatever
    /// other threads are committing; returns when they are durable or the
    /// round failed.
    pub(crate) fn commit(&self, puts: Vec<PendingPut>) -> Result<(), ItemStatus> {
        let c = &self.committer;
        let mut q = lock(&c.q);
        let id = q.next_id;
        q.next_id += 1;
        q.waiting.push((id, puts));
        loop {
            if let Some(r) = q.done.remove(&id) {
                return r;
            }
            if !q.leading {
                q.leading = true;
                let work = std::mem::take(&mut q.waiting);
                drop(q);
                let ids: Vec<u64> = work.iter().map(|(i, _)| *i).collect();
                let puts: Vec<PendingPut> = work.into_iter().flat_map(|(_, p)| p).collect();
                let r = self.round(puts);
                q = lock(&c.q);
                for i in ids {
                    q.done.insert(i, r.clone());
                }
                q.leading = false;
                c.cv.notify_all();
                continue;
            }
            q = c.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// One round (see the module docs).
    fn round(&self, mut puts: Vec<PendingPut>) -> Result<(), ItemStatus> {
        if self.stuck.load(std::sync::atomic::Ordering::Acquire) {
            lock(&self.index).end_round(&puts, &[], false);
            return Err(ItemStatus::Device {
                status: None,
                drive: None,
                message: "a record-block write timed out earlier: the store commits nothing more; \
                          reset the drive and reopen the store"
                    .into(),
            });
        }
        if self.lease_lost() {
            lock(&self.index).end_round(&puts, &[], false);
            return Err(ItemStatus::Device {
                status: None,
                drive: None,
                message: "the store's lease was taken by another writer: it commits nothing more; reopen it"
                    .into(),
            });
        }
        let rt = &self.targets.rt;
        let flush = [Request::flush(self.targets.slot(0).map_err(runtime_status)?)];
        // Without a volatile write cache on any drive a completed write is
        // durable already (NVMe Base 2.0 §5.17.2.1, VWC) and a Flush would
        // only cost a round trip.
        let flush_needed = self.volatile_write_cache;
        if !puts.is_empty() && flush_needed {
            if let Err(e) = run(rt, &flush) {
                lock(&self.index).end_round(&puts, &[], false);
                return Err(e);
            }
        }
        let (clears, blocks) = {
            let mut ix = lock(&self.index);
            if puts.is_empty() && !ix.has_clears() {
                return Ok(());
            }
            let clears = ix.begin_round(&mut puts);
            let blocks: BTreeSet<u64> = puts
                .iter()
                .map(|(s, _)| u64::from(*s))
                .chain(clears.iter().map(|&s| u64::from(s)))
                .map(|s| s / self.layout.records_per_block())
                .collect();
            (clears, blocks)
        };
        let r =
            self.write_record_blocks(&blocks)
                .and_then(|()| if flush_needed { run(rt, &flush) } else { Ok(()) });
        lock(&self.index).end_round(&puts, &clears, r.is_ok());
        self.stats.count_round(puts.len(), clears.len(), r.is_ok());
        r
    }

    /// Writes record blocks `blocks` (indices in the record table) as the
    /// index says they are now, through the staging buffer.
    fn write_record_blocks(&self, blocks: &BTreeSet<u64>) -> Result<(), ItemStatus> {
        let bs = u64::from(self.layout.block_size);
        let per = self.layout.records_per_block();
        let mut staging = lock(&self.staging);
        let Some(st) = staging.as_mut() else {
            return Err(ItemStatus::Device { status: None, drive: None, message: "store closed".into() });
        };
        let per_chunk = (st.len() as u64 / bs).max(1) as usize;
        let blocks: Vec<u64> = blocks.iter().copied().collect();
        for chunk in blocks.chunks(per_chunk) {
            let mut reqs = Vec::with_capacity(chunk.len());
            {
                let ix = lock(&self.index);
                let buf = st.bytes_mut();
                for (j, &b) in chunk.iter().enumerate() {
                    let out = &mut buf[j * bs as usize..(j + 1) * bs as usize];
                    out.fill(0);
                    for k in 0..per {
                        let slot = b * per + k;
                        if slot >= self.layout.capacity {
                            break;
                        }
                        if let Some(rec) = ix.record_to_write(slot as u32) {
                            let at = (k as usize) * RECORD_BYTES;
                            out[at..at + RECORD_BYTES]
                                .copy_from_slice(&rec.encode(&self.sb.uuid, slot as u32));
                        }
                    }
                }
            }
            for (j, &b) in chunk.iter().enumerate() {
                let off = self.layout.record_offset + b * bs;
                self.targets
                    .span(Direction::Write, off, bs, st.handle, j as u64 * bs, &mut reqs)
                    .map_err(runtime_status)?;
            }
            if let Err(e) = run(&self.targets.rt, &reqs) {
                if e == ItemStatus::Timeout {
                    // The drive may still write these blocks later, with
                    // the records of this round: the buffer must never hold
                    // other records, and no later round may run, or that
                    // late write could undo it (bring back a cleared record).
                    self.stuck.store(true, std::sync::atomic::Ordering::Release);
                    std::mem::forget(staging.take());
                }
                return Err(e);
            }
        }
        Ok(())
    }
}

/// A runtime error as an item status.
pub(crate) fn runtime_status(e: tutti::Error) -> ItemStatus {
    ItemStatus::Device { status: None, drive: None, message: tutti::error_chain(&e) }
}
