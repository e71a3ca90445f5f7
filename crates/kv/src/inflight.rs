//! What callers have in flight: memory regions a put or get still reads or
//! fills (`unregister` refuses them until the store is done with them), and
//! batches dropped without a wait, whose slots are released once the
//! runtime reports their commands final.
//!
//! A batch's memory stays "in use" from `put`/`get` until its
//! `wait_put`/`wait_get` has finished checksumming it, which is after the
//! runtime let the memory go: so the store, not only the runtime, must
//! refuse to unregister it until then. A batch dropped unwaited becomes an
//! orphan; every later call of the store polls the orphans
//! (`Runtime::try_wait`) and, once an orphan's commands are final, frees
//! its reserved slots, unpins its objects and lets its memory go.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tutti::{MemoryHandle, OpHandle, RequestStatus};

use crate::store::KvStore;

/// A slot a batch holds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Held {
    /// Reserved by a put (its record on the media is empty).
    Reserved(u32),
    /// Pinned by a get.
    Pinned(u32),
}

#[derive(Debug)]
struct Orphan {
    op: Option<OpHandle>,
    held: Vec<Held>,
    mems: Vec<MemoryHandle>,
}

/// The in-flight state of one store, shared with its pending batches.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    uses: Mutex<HashMap<MemoryHandle, usize>>,
    orphans: Mutex<Vec<Orphan>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inflight {
    /// `mems` are in use by a batch.
    pub fn take(&self, mems: &[MemoryHandle]) {
        let mut u = lock(&self.uses);
        for m in mems {
            *u.entry(*m).or_default() += 1;
        }
    }

    /// A batch is done with `mems`.
    pub fn give(&self, mems: &[MemoryHandle]) {
        let mut u = lock(&self.uses);
        for m in mems {
            if let Some(n) = u.get_mut(m) {
                *n -= 1;
                if *n == 0 {
                    u.remove(m);
                }
            }
        }
    }

    /// `true` when a batch still uses `mem`.
    pub fn in_use(&self, mem: MemoryHandle) -> bool {
        lock(&self.uses).contains_key(&mem)
    }

    /// A batch was dropped without a wait.
    pub fn orphan(&self, op: Option<OpHandle>, held: Vec<Held>, mems: Vec<MemoryHandle>) {
        lock(&self.orphans).push(Orphan { op, held, mems });
    }

    /// Orphans waiting for their commands.
    pub fn orphans(&self) -> usize {
        lock(&self.orphans).len()
    }
}

impl KvStore {
    /// The statuses of a batch's operation once final (none for a batch
    /// that submitted nothing), or `None` while it is in flight; the
    /// operation is consumed only when final.
    pub(crate) fn poll_op(&self, op: Option<OpHandle>) -> Result<Option<Vec<RequestStatus>>, tutti::Error> {
        match op {
            Some(op) => self.targets.rt.try_wait(op),
            None => Ok(Some(Vec::new())),
        }
    }

    /// Releases what dropped batches held, for those whose commands are
    /// final.
    pub(crate) fn reap_orphans(&self) {
        let orphans = std::mem::take(&mut *lock(&self.inflight.orphans));
        if orphans.is_empty() {
            return;
        }
        let mut keep = Vec::new();
        for o in orphans {
            // A stale handle (someone else consumed it) is final too.
            let done = !matches!(self.poll_op(o.op), Ok(None));
            if !done {
                keep.push(o);
                continue;
            }
            {
                let mut ix = self.index.lock().unwrap_or_else(|p| p.into_inner());
                for h in &o.held {
                    match *h {
                        Held::Reserved(s) => ix.unreserve(s, false),
                        Held::Pinned(s) => ix.unpin(s),
                    }
                }
            }
            self.inflight.give(&o.mems);
        }
        lock(&self.inflight.orphans).extend(keep);
    }
}
