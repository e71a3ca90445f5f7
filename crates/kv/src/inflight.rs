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

use tutti::{MemoryHandle, OpHandle};

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

    /// Releases the orphans whose operation `is_final` says is final:
    /// `release` gets each one's held slots, and its memory is given back.
    /// The others stay.
    pub fn reap(&self, mut is_final: impl FnMut(Option<OpHandle>) -> bool, mut release: impl FnMut(&[Held])) {
        let orphans = std::mem::take(&mut *lock(&self.orphans));
        if orphans.is_empty() {
            return;
        }
        let mut keep = Vec::new();
        for o in orphans {
            if !is_final(o.op) {
                keep.push(o);
                continue;
            }
            release(&o.held);
            self.give(&o.mems);
        }
        lock(&self.orphans).extend(keep);
    }

    /// Orphans waiting for their commands.
    pub fn orphans(&self) -> usize {
        lock(&self.orphans).len()
    }
}
