//! The group-commit queue of a store (`commit.rs` runs its rounds): puts
//! whose payloads are written wait in it for a leader to commit them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::error::ItemStatus;
use crate::format::Record;

/// A put whose payload is written, waiting for its record: (slot, record
/// without its generation, which the round assigns).
pub(crate) type PendingPut = (u32, Record);

#[derive(Debug, Default)]
struct Queue {
    next_id: u64,
    waiting: Vec<(u64, Vec<PendingPut>)>,
    leading: bool,
    done: HashMap<u64, Result<(), ItemStatus>>,
}

/// The group-commit queue of a store.
#[derive(Debug, Default)]
pub(crate) struct Committer {
    q: Mutex<Queue>,
    cv: Condvar,
    /// A record-block write timed out: no more commit rounds (`commit.rs`).
    stuck: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Committer {
    /// Queues `puts` and returns the result of the round that committed
    /// them: the first thread to find no leader leads, running `round` (with
    /// the queue let go) over everything waiting, as often as needed until
    /// its own puts are done; the others wait for a leader's round.
    pub fn join(
        &self,
        puts: Vec<PendingPut>,
        round: impl Fn(Vec<PendingPut>) -> Result<(), ItemStatus>,
    ) -> Result<(), ItemStatus> {
        let mut q = lock(&self.q);
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
                let r = round(puts);
                q = lock(&self.q);
                for i in ids {
                    q.done.insert(i, r.clone());
                }
                q.leading = false;
                self.cv.notify_all();
                continue;
            }
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether a record-block write timed out: no round may run again.
    pub fn stuck(&self) -> bool {
        self.stuck.load(Ordering::Acquire)
    }

    /// A record-block write timed out: stops every later round.
    pub fn set_stuck(&self) {
        self.stuck.store(true, Ordering::Release);
    }
}
