//! The opener's side: taking a store's lease, or finding who holds it.

use std::time::{Duration, Instant};

use super::identity::{Identity, Liveness};
use super::{live, LeaseIo, LeaseOptions};
use crate::error::{HolderPlace, ItemStatus, KvError, LeaseHolder};
use crate::format::{LeaseDecode, LeaseRecord};

/// What an opener makes of the lease it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Free, or its holder is gone: take it.
    Take,
    /// A running holder: refuse.
    Refuse(LeaseHolder),
    /// A holder this process cannot check: watch it for a renewal this
    /// long.
    Watch(Duration),
}

/// Takes the lease of the store through `io`: reads the block,
/// judges its holder, writes a lease of this process, waits
/// `opts.settle` and reads it back. The record written, once it is this
/// process's.
///
/// # Errors
///
/// [`KvError::Leased`] when a running writer holds it (nothing written
/// then, or another opener's write won the read-back),
/// [`KvError::LeaseContended`] when the lease was freed or damaged between
/// this opener's write and its read-back, [`KvError::Io`] when the
/// block cannot be read or written, [`KvError::Uuid`] when the OS gives no
/// random bytes for the owner.
pub(crate) fn acquire(io: &mut LeaseIo, opts: &LeaseOptions, store: &str) -> Result<LeaseRecord, KvError> {
    let me = Identity::current();
    let block = read(io, store)?;
    let mut seen_at = Instant::now();
    match judge(&me, LeaseRecord::decode(&block), opts) {
        Verdict::Take => {}
        Verdict::Refuse(holder) => return Err(KvError::Leased { store: store.to_owned(), holder }),
        Verdict::Watch(expiry) => seen_at = watch(io, block, expiry, &me, store)?,
    }
    let mut owner = [0u8; 16];
    getrandom::fill(&mut owner).map_err(|source| KvError::Uuid { store: store.to_owned(), source })?;
    owner[0] |= 1; // never the all-zero owner of a free lease
    let mine = LeaseRecord {
        owner,
        generation: 1,
        boot_id: me.boot_id,
        pid_ns: me.pid_ns,
        pid: me.pid,
        start_time: me.start_time,
        renew_ms: opts.renew.map_or(0, |d| d.as_millis().clamp(1, u128::from(u32::MAX)) as u32),
    };
    live().push(owner);
    let r = confirm(io, &mine, seen_at, opts, &me, store);
    if r.is_err() {
        live().retain(|o| *o != owner);
    }
    r.map(|()| mine)
}

/// Writes `mine`, waits `settle`, reads it back.
fn confirm(
    io: &mut LeaseIo,
    mine: &LeaseRecord,
    seen_at: Instant,
    opts: &LeaseOptions,
    me: &Identity,
    store: &str,
) -> Result<(), KvError> {
    let bs = io.block_size();
    io.write(&mine.encode(bs), super::io_timeout()).map_err(io_error(store, "writing the lease block"))?;
    // A peer that read the block before this write landed writes within
    // the time this opener's own read-to-write took, if its drive is as
    // fast: wait `settle`, and that much longer when this write was slow.
    let landed = seen_at.elapsed();
    std::thread::sleep(if landed <= opts.settle { opts.settle } else { opts.settle + landed });
    let back = read(io, store)?;
    match LeaseRecord::decode(&back) {
        LeaseDecode::Held(r) if r == *mine => Ok(()),
        LeaseDecode::Held(r) => Err(KvError::Leased { store: store.to_owned(), holder: holder(me, &r) }),
        LeaseDecode::Free | LeaseDecode::Invalid => Err(KvError::LeaseContended(store.to_owned())),
    }
}

fn judge(me: &Identity, found: LeaseDecode, opts: &LeaseOptions) -> Verdict {
    let r = match found {
        LeaseDecode::Free => return Verdict::Take,
        LeaseDecode::Invalid => return Verdict::Watch(opts.expiry),
        LeaseDecode::Held(r) => r,
    };
    match me.liveness(&r) {
        Liveness::Running if r.pid == me.pid => {
            if live().contains(&r.owner) {
                Verdict::Refuse(holder(me, &r))
            } else {
                // Left by a store of this process that is gone (dropped
                // without freeing it, or lost in a simulated power cut).
                Verdict::Take
            }
        }
        Liveness::Running => Verdict::Refuse(holder(me, &r)),
        Liveness::Gone => Verdict::Take,
        Liveness::Unknown if r.renew_ms == 0 => Verdict::Refuse(holder(me, &r)),
        Liveness::Unknown => {
            Verdict::Watch(opts.expiry.max(Duration::from_millis(4 * u64::from(r.renew_ms))))
        }
    }
}

/// Watches a lease this process cannot check for `expiry`: a change
/// (a renewal, or a new holder) refuses, unless the lease became free;
/// none means its holder is gone. When the block was last read.
fn watch(
    io: &mut LeaseIo,
    first: Vec<u8>,
    expiry: Duration,
    me: &Identity,
    store: &str,
) -> Result<Instant, KvError> {
    let start = Instant::now();
    let poll = (expiry / 8).clamp(Duration::from_millis(10), Duration::from_millis(250));
    tracing::info!(
        store,
        ?expiry,
        "tutti-kv: the store's lease is held by a writer this process cannot check; watching it for renewals"
    );
    loop {
        std::thread::sleep(poll);
        let now = read(io, store)?;
        let at = Instant::now();
        if now != first {
            return match LeaseRecord::decode(&now) {
                LeaseDecode::Free => Ok(at),
                LeaseDecode::Held(r) => {
                    Err(KvError::Leased { store: store.to_owned(), holder: holder(me, &r) })
                }
                LeaseDecode::Invalid => Err(KvError::LeaseContended(store.to_owned())),
            };
        }
        if start.elapsed() >= expiry {
            tracing::warn!(store, "tutti-kv: no renewal of the store's lease in {expiry:?}: taking it over");
            return Ok(at);
        }
    }
}

/// `r`'s holder as an error names it.
fn holder(me: &Identity, r: &LeaseRecord) -> LeaseHolder {
    let place = match me.liveness(r) {
        Liveness::Running if r.pid == me.pid => HolderPlace::ThisProcess,
        Liveness::Running => HolderPlace::ThisHost,
        _ => HolderPlace::Elsewhere,
    };
    LeaseHolder { pid: r.pid, place }
}

fn read(io: &mut LeaseIo, store: &str) -> Result<Vec<u8>, KvError> {
    io.read(super::io_timeout()).map_err(io_error(store, "reading the lease block"))
}

fn io_error<'a>(store: &'a str, what: &'static str) -> impl Fn(ItemStatus) -> KvError + 'a {
    move |status| KvError::Io { store: store.to_owned(), what, status }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Identity {
        Identity { boot_id: [3; 16], pid_ns: 77, pid: 100, start_time: 5 }
    }

    fn rec(owner: u8, pid: u32, ns: u64, renew_ms: u32) -> LeaseRecord {
        LeaseRecord {
            owner: [owner; 16],
            generation: 1,
            boot_id: [3; 16],
            pid_ns: ns,
            pid,
            start_time: 5,
            renew_ms,
        }
    }

    #[test]
    fn free_invalid_and_unknown_holders_are_judged() {
        let o = LeaseOptions::default();
        assert_eq!(judge(&me(), LeaseDecode::Free, &o), Verdict::Take);
        assert_eq!(judge(&me(), LeaseDecode::Invalid, &o), Verdict::Watch(o.expiry));
        // Another PID namespace: watched, for at least 4 of its intervals.
        assert_eq!(
            judge(&me(), LeaseDecode::Held(rec(9, 100, 78, 5000)), &o),
            Verdict::Watch(Duration::from_secs(20))
        );
        assert_eq!(judge(&me(), LeaseDecode::Held(rec(9, 100, 78, 1000)), &o), Verdict::Watch(o.expiry));
        let never = judge(&me(), LeaseDecode::Held(rec(9, 100, 78, 0)), &o);
        assert_eq!(never, Verdict::Refuse(LeaseHolder { pid: 100, place: HolderPlace::Elsewhere }));
    }
}
