//! One client's memory registrations on one drive, as the forwarder sees
//! them: device address ranges (what PRPs may name) and the daemon's own
//! mapping of each (where PRP list pages are read from).
//!
//! Unregistering must not leave a forwarded command pointing at memory
//! that may then be mapped for someone else. Commands are counted by the
//! epoch they were forwarded in until their completion is read.
//! [`Regions::remove`] takes the range out (no later command can name it),
//! starts the next epoch `e` and waits until no command of an epoch before
//! `e` is in flight, so every command that could name the range has
//! completed. Not two buckets as in RCU: after an unregistration that
//! timed out (its memory kept), a bucket's reuse would let the next one
//! return while a command older than both, which may name its memory too,
//! is still in flight.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use tuttid_proto::shm::MappedFd;

/// A registration: its length and the daemon's mapping of it.
#[derive(Debug)]
struct Region {
    len: u64,
    memory: Arc<MappedFd>,
}

/// A client's registrations on one drive, by device address.
#[derive(Debug, Default)]
pub struct Regions {
    map: RwLock<BTreeMap<u64, Region>>,
    inflight: Mutex<Inflight>,
}

/// The current epoch and the commands in flight per epoch (no entry for
/// an epoch with none).
#[derive(Debug, Default)]
struct Inflight {
    epoch: u64,
    count: BTreeMap<u64, u64>,
}

/// The registrations, read-locked while one entry is checked.
pub struct View<'a>(RwLockReadGuard<'a, BTreeMap<u64, Region>>);

impl Regions {
    /// Adds the registration at device address `iova` (`memory` is the
    /// daemon's mapping of its bytes, `memory.len()` long).
    pub fn insert(&self, iova: u64, memory: Arc<MappedFd>) {
        let len = memory.len() as u64;
        self.map.write().unwrap_or_else(|p| p.into_inner()).insert(iova, Region { len, memory });
    }

    /// Takes the registration at `iova` out, then waits up to `timeout`
    /// until every command forwarded before has completed. `false` when
    /// some did not (the caller keeps the memory mapped). The session uses
    /// the two steps apart, so that it can finish later.
    #[cfg(test)]
    pub fn remove(&self, iova: u64, timeout: Duration) -> bool {
        let epoch = self.begin_remove(iova);
        self.wait_drained(epoch, timeout)
    }

    /// Takes the registration at `iova` out and returns the epoch whose
    /// earlier commands may still name it ([`Regions::drained`]).
    pub fn begin_remove(&self, iova: u64) -> u64 {
        self.map.write().unwrap_or_else(|p| p.into_inner()).remove(&iova);
        // The write lock above ordered every check that could name the
        // range before this point; a command issued in the new epoch (the
        // mutex orders it after this) checks without the range.
        let mut f = self.inflight();
        f.epoch += 1;
        f.epoch
    }

    /// `true` once every command forwarded before `epoch` has completed.
    pub fn drained(&self, epoch: u64) -> bool {
        self.inflight().count.first_key_value().is_none_or(|(e, _)| *e >= epoch)
    }

    /// Waits up to `timeout` for [`Regions::drained`]`(epoch)`.
    pub fn wait_drained(&self, epoch: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.drained(epoch) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        true
    }

    fn inflight(&self) -> MutexGuard<'_, Inflight> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A command is forwarded now (before it is checked): returns its
    /// epoch, to give back to [`Regions::done`] when its completion is
    /// read.
    pub fn issue(&self) -> u64 {
        let mut f = self.inflight();
        let e = f.epoch;
        *f.count.entry(e).or_default() += 1;
        e
    }

    /// The command of epoch `epoch` completed (or will never be seen).
    pub fn done(&self, epoch: u64) {
        let mut f = self.inflight();
        if let std::collections::btree_map::Entry::Occupied(mut n) = f.count.entry(epoch) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }

    /// Read access for checking one entry.
    pub fn view(&self) -> View<'_> {
        View(self.map.read().unwrap_or_else(|p| p.into_inner()))
    }
}

impl View<'_> {
    /// The registration holding `iova .. iova + len` entirely, and the
    /// offset of `iova` in it.
    fn find(&self, iova: u64, len: u64) -> Option<(&Region, u64)> {
        let (start, r) = self.0.range(..=iova).next_back()?;
        let off = iova - start;
        (off.checked_add(len)? <= r.len).then_some((r, off))
    }

    /// Whether `iova .. iova + len` lies inside one registration.
    pub fn owns(&self, iova: u64, len: u64) -> bool {
        self.find(iova, len).is_some()
    }

    /// Copies `out.len()` little-endian u64 entries from device address
    /// `iova` (a PRP list in client memory) into `out`. `false` when the
    /// range is not inside one registration. The client may be writing
    /// those bytes: each entry is one atomic load, and what is copied is
    /// what gets checked and used.
    #[allow(unsafe_code)] // reading shared client memory, contract at the call
    pub fn read_u64s(&self, iova: u64, out: &mut [u64]) -> bool {
        let Some((r, off)) = self.find(iova, out.len() as u64 * 8) else { return false };
        if !off.is_multiple_of(8) {
            return false;
        }
        let base = r.memory.as_ptr();
        for (i, o) in out.iter_mut().enumerate() {
            let at = off as usize + i * 8;
            // SAFETY: `at + 8 <= r.len` (checked by `find`), the mapping
            // lives as long as `r` (an Arc held under the read lock), and
            // `base + at` is 8-byte aligned (page-aligned base, `off % 8
            // == 0`). The memory is shared with another process, so it is
            // only read through an atomic load, never as a reference.
            let p = unsafe { base.add(at) }.cast::<u64>();
            // SAFETY: as above.
            *o = u64::from_le(unsafe { std::sync::atomic::AtomicU64::from_ptr(p) }.load(Ordering::Relaxed));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tuttid_proto::shm::{sealed_memfd, PAGE};

    fn mem(pages: usize) -> Arc<MappedFd> {
        Arc::new(MappedFd::map(sealed_memfd("r", pages * PAGE).unwrap(), 0, (pages * PAGE) as u64).unwrap())
    }

    #[test]
    fn ranges_and_reads_stay_inside_one_registration() {
        let r = Regions::default();
        let m = mem(2);
        // SAFETY: test memory, no other user.
        #[allow(unsafe_code)]
        unsafe {
            m.as_ptr().add(8).cast::<u64>().write(7u64.to_le());
        }
        r.insert(0x10000, m);
        r.insert(0x13000, mem(1));
        let v = r.view();
        assert!(v.owns(0x10000, 2 * PAGE as u64) && v.owns(0x11ffc, 4) && v.owns(0x13000, 4096));
        assert!(!v.owns(0x11fff, 2) && !v.owns(0x12000, 1) && !v.owns(0xfff0, 0x20));
        assert!(!v.owns(0x13000, u64::MAX), "no overflow");
        let mut out = [0u64; 2];
        assert!(v.read_u64s(0x10000, &mut out));
        assert_eq!(out, [0, 7]);
        assert!(!v.read_u64s(0x11ff8, &mut out), "crosses the end");
        assert!(!v.read_u64s(0x10004, &mut out), "misaligned");
        drop(v);
        let b = r.issue();
        assert!(!r.remove(0x13000, Duration::from_millis(20)), "a command is in flight");
        r.done(b);
        assert!(r.remove(0x10000, Duration::from_millis(20)));
        assert!(!r.view().owns(0x10000, 1));
    }

    #[test]
    fn a_command_older_than_a_timed_out_unregistration_holds_the_next_one_too() {
        // A command checked while both registrations existed may name
        // either. The first unregistration times out on it (its memory
        // stays mapped); the second must wait for it as well, not only
        // for the commands of the epoch the first one started.
        let r = Regions::default();
        r.insert(0x10000, mem(1));
        r.insert(0x20000, mem(1));
        let old = r.issue();
        assert!(!r.remove(0x10000, Duration::from_millis(20)));
        let newer = r.issue();
        assert!(!r.remove(0x20000, Duration::from_millis(20)), "the old command may name this one");
        r.insert(0x30000, mem(1));
        r.done(old);
        assert!(!r.remove(0x30000, Duration::from_millis(20)), "a command of the second epoch is in flight");
        r.done(newer);
        r.insert(0x40000, mem(1));
        assert!(r.remove(0x40000, Duration::from_millis(20)));
    }
}
