//! Completion: `wait`, `try_wait` and `reap` poll the completion queues of
//! an operation's drives and route every CQE, by the tag its command
//! carries, to its request in the operations table (`ops.rs`).
//!
//! A queue pair is polled under its own lock into a local buffer; the lock
//! is let go before the operations table is taken to route what was
//! reaped. A thread that finds a queue locked skips it (its holder reaps
//! it). While nothing of the waited operation completes (other
//! operations' completions do not count), the controllers of its drives
//! are checked for a fatal or vanished state (`recovery.rs`) every
//! [`HEALTH_CHECK_INTERVAL`].
//!
//! Locks, never two at once: one queue pair at a time, then the
//! operations table.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvm_queue::{Completion, QueuePair};

use super::ops::{drop_if_done, split_tag, OpState, Settle};
use super::{lock, Runtime};
use crate::drive::Drive;
use crate::error::{Error, RequestStatus};
use crate::handle::{HandleError, HandleKind, HandleTable, OpHandle};

/// How long a waiter sees no completion of its operation before it reads
/// the controllers' status (CSTS) of the drives it waits on (and then at
/// most once per interval).
pub const HEALTH_CHECK_INTERVAL: Duration = Duration::from_millis(20);

impl Runtime {
    /// Waits until every request of `op` is final or `timeout` passes, and
    /// returns one status per request of the batch, in submission order.
    /// Completions are always reaped once before the deadline is checked,
    /// so a zero timeout is a non-blocking poll. Requests not final at the
    /// deadline are [`RequestStatus::Timeout`] (the drives still holding
    /// their commands are named in a warning, with their queue state).
    /// Either way the handle is consumed: a second wait is a stale-handle
    /// error. A timed-out request's commands stay tracked, and its memory
    /// busy, until their completions arrive (reaped by later waits,
    /// [`Runtime::reap`] or [`Runtime::unregister_memory`]) or the runtime
    /// shuts down.
    ///
    /// While none of the operation's commands completes (whether or not
    /// other operations' commands do), the controllers of the operation's
    /// drives are checked every [`HEALTH_CHECK_INTERVAL`]: one that reports a
    /// fatal status (CSTS.CFS), is no longer ready, or reads all ones fails
    /// the requests it holds with [`RequestStatus::ControllerFatal`] naming
    /// it.
    ///
    /// # Errors
    ///
    /// [`Error::Handle`] for a stale, foreign or forged handle.
    pub fn wait(&self, op: OpHandle, timeout: Duration) -> Result<Vec<RequestStatus>, Error> {
        let deadline = Instant::now().checked_add(timeout);
        let dps = self.live_op_datapaths(op)?;
        // GPU-executed commands: waited for until the deadline. A kernel
        // still running then is left to end on its own (its requests are
        // Timeout below; `reap` finishes it later, its memory busy until
        // then).
        if self.wait_kernel(op, deadline)? {
            self.finish_gpu(op)?;
        }
        let mut buf = ReapBuffer::take();
        let mut last_progress = Instant::now();
        let mut last_check = last_progress;
        // Progress of this operation (not of others whose completions this
        // thread happens to reap): what the controller check keys on, so
        // that a busy datapath cannot hide a dead drive.
        let mut op_progress = last_progress;
        let mut op_left = u64::MAX;
        let mut polled = false;
        loop {
            {
                let mut ops = lock(&self.ops);
                let st = ops.get_mut(op.0)?;
                if st.is_retired() {
                    // Another thread's wait on the same handle took the
                    // statuses first.
                    return Err(stale_op(op));
                }
                if st.outstanding() != op_left {
                    op_left = st.outstanding();
                    op_progress = Instant::now();
                }
                // Reaped at least once before a deadline is honoured, so a
                // zero timeout still sees work the drives have finished.
                // After shutdown deleted the queues nothing more can come:
                // what is not final is final as it is.
                let expired = polled
                    && (deadline.is_some_and(|d| Instant::now() >= d)
                        || self.queues_gone.load(std::sync::atomic::Ordering::Acquire));
                if st.is_final() || expired {
                    let timed_out = !st.is_final();
                    let statuses = finalize(&mut ops, op)?;
                    drop(ops);
                    if timed_out {
                        self.report_stalled(&dps, op);
                    }
                    return Ok(statuses);
                }
            }
            polled = true;
            let reaped = self.poll_datapaths(&dps, &mut buf);
            let now = Instant::now();
            if now.duration_since(op_progress) >= HEALTH_CHECK_INTERVAL
                && now.duration_since(last_check) >= HEALTH_CHECK_INTERVAL
            {
                // Nothing of this operation completes (whatever else does):
                // is a controller dead or gone?
                self.check_drives(&dps);
                last_check = now;
            }
            if reaped > 0 {
                last_progress = now;
                continue;
            }
            backoff(now.duration_since(last_progress));
        }
    }

    /// Non-blocking wait: reaps the operation's completions once and returns
    /// its statuses if every request is final (consuming the handle, as
    /// [`Runtime::wait`] does), or `None` (the handle stays valid). While
    /// the operation is not final, calls at least [`HEALTH_CHECK_INTERVAL`]
    /// apart read its drives' controller status, as [`Runtime::wait`]
    /// does, so a dead drive's requests end as
    /// [`RequestStatus::ControllerFatal`] for a caller that only polls.
    ///
    /// # Errors
    ///
    /// [`Error::Handle`] for a stale, foreign or forged handle.
    pub fn try_wait(&self, op: OpHandle) -> Result<Option<Vec<RequestStatus>>, Error> {
        let dps = self.live_op_datapaths(op)?;
        let gpu_busy = lock(&self.ops).get(op.0)?.gpu.as_ref().is_some_and(|g| !g.launch.is_done());
        if gpu_busy {
            return Ok(None);
        }
        self.finish_gpu(op)?;
        self.poll_datapaths(&dps, &mut Vec::new());
        let mut ops = lock(&self.ops);
        let st = ops.get_mut(op.0)?;
        if st.is_retired() {
            return Err(stale_op(op));
        }
        if st.is_final() {
            return finalize(&mut ops, op).map(Some);
        }
        // A caller that only polls must learn of a dead drive too: at most
        // once per HEALTH_CHECK_INTERVAL per operation, read the
        // controllers' status of its drives (the first call only starts
        // the clock).
        let now = Instant::now();
        let check = match st.health_checked {
            None => {
                st.health_checked = Some(now);
                false
            }
            Some(t) => now.duration_since(t) >= HEALTH_CHECK_INTERVAL,
        };
        if !check {
            return Ok(None);
        }
        st.health_checked = Some(now);
        drop(ops);
        self.check_drives(&dps);
        let mut ops = lock(&self.ops);
        let st = ops.get(op.0)?;
        if st.is_retired() {
            return Err(stale_op(op));
        }
        if !st.is_final() {
            return Ok(None);
        }
        finalize(&mut ops, op).map(Some)
    }

    /// Reaps every queue's completions once, from the calling thread: late
    /// completions of timed-out operations are matched and their memory
    /// released, and so are the kernels of GPU-executed operations whose
    /// wait's deadline passed before they ended, once they have. [`Runtime::wait`] does this for its own operation's
    /// datapaths; this covers the rest. Returns completions consumed.
    pub fn reap(&self) -> usize {
        self.reap_gpu_retired();
        let all: Vec<usize> = (0..self.datapaths.len()).collect();
        self.poll_datapaths(&all, &mut Vec::new())
    }

    fn live_op_datapaths(&self, op: OpHandle) -> Result<Arc<[usize]>, Error> {
        let ops = lock(&self.ops);
        let st = ops.get(op.0)?;
        if st.is_retired() {
            return Err(stale_op(op));
        }
        Ok(st.datapaths.clone())
    }

    /// Polls every CPU queue of the given datapaths' ready drives that no
    /// other thread holds, routing what it reaps. Returns completions
    /// consumed.
    pub(super) fn poll_datapaths(&self, dps: &[usize], buf: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        for &dpi in dps {
            for d in self.datapaths[dpi].drives() {
                if !d.is_ready() {
                    continue;
                }
                for q in &d.queues {
                    n += self.poll_queue(q, d, false, buf);
                }
            }
        }
        n
    }

    /// Reaps one queue pair (waiting for its lock when `block`, else
    /// skipping it if another thread holds it) into `buf`, lets the queue
    /// go, then routes what it reaped. Returns the number of CQEs consumed.
    pub(super) fn poll_queue(
        &self,
        q: &Mutex<QueuePair>,
        d: &Drive,
        block: bool,
        buf: &mut Vec<Completion>,
    ) -> usize {
        buf.clear();
        let n = {
            let mut qp = if block {
                lock(q)
            } else {
                match q.try_lock() {
                    Ok(qp) => qp,
                    Err(_) => return 0,
                }
            };
            qp.poll(|c| buf.push(c))
        };
        if !buf.is_empty() {
            let mut ops = lock(&self.ops);
            // Completions of one operation usually come in a run: route
            // each run with one table lookup.
            for run in buf.chunk_by(|a, b| split_tag(a.tag).0 == split_tag(b.tag).0) {
                self.route_run(&mut ops, d, run);
            }
        }
        n
    }

    /// Delivers completions from drive `d` whose tags all name the same
    /// operation slot.
    fn route_run(&self, ops: &mut HandleTable<OpState>, d: &Drive, run: &[Completion]) {
        let Some(first) = run.first() else { return };
        let Some((h, st)) = ops.get_mut_by_slot(split_tag(first.tag).0) else {
            self.count_late(run.len());
            return;
        };
        for c in run {
            let (_, gen16, index) = split_tag(c.tag);
            if h.generation & 0xFFFF != gen16 {
                self.count_late(1);
                continue;
            }
            let failure = (!c.status.is_success())
                .then(|| RequestStatus::Nvme { drive: d.name.clone(), status: c.status });
            if st.complete(index, failure) == Settle::Refused {
                self.count_late(1);
            }
        }
        drop_if_done(ops, h);
    }

    /// Delivers one completion from drive `d` to its request.
    pub(super) fn route(&self, ops: &mut HandleTable<OpState>, d: &Drive, c: Completion) {
        self.route_run(ops, d, std::slice::from_ref(&c));
    }

    fn count_late(&self, n: usize) {
        self.late_completions.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Names the drives of `dps` that still hold commands of timed-out
    /// operation `op`, with their queue state.
    fn report_stalled(&self, dps: &[usize], op: OpHandle) {
        for &dpi in dps {
            for d in self.datapaths[dpi].drives() {
                for q in &d.queues {
                    let Ok(qp) = q.try_lock() else { continue };
                    let mine =
                        qp.outstanding_tags().iter().filter(|(_, t)| split_tag(*t).0 == op.0.slot).count();
                    if mine > 0 {
                        tracing::warn!(
                            drive = %d.name,
                            commands = mine,
                            queue = %qp.dump(),
                            "wait timed out with commands outstanding on this drive (controller status looks healthy)"
                        );
                    }
                }
            }
        }
    }
}

thread_local! {
    /// Each waiting thread's buffer of reaped completions, kept between
    /// waits so a wait allocates nothing for it.
    static REAPED: RefCell<Vec<Completion>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's reap buffer, taken for one wait and given back when
/// dropped.
struct ReapBuffer(Vec<Completion>);

impl ReapBuffer {
    fn take() -> Self {
        Self(REAPED.with(|b| std::mem::take(&mut *b.borrow_mut())))
    }
}

impl std::ops::Deref for ReapBuffer {
    type Target = Vec<Completion>;
    fn deref(&self) -> &Vec<Completion> {
        &self.0
    }
}

impl std::ops::DerefMut for ReapBuffer {
    fn deref_mut(&mut self) -> &mut Vec<Completion> {
        &mut self.0
    }
}

impl Drop for ReapBuffer {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        // `try_with`: the thread may be exiting.
        let _ = REAPED.try_with(|b| *b.borrow_mut() = buf);
    }
}

/// The error for a handle whose operation was already consumed by a wait.
fn stale_op(op: OpHandle) -> Error {
    HandleError::Stale { kind: HandleKind::Operation, slot: op.0.slot, generation: op.0.generation }.into()
}

/// Takes the final statuses of operation `op` (requests not final become
/// [`RequestStatus::Timeout`]) and consumes its handle: the entry goes
/// away, or stays retired until its outstanding commands leave.
fn finalize(ops: &mut HandleTable<OpState>, op: OpHandle) -> Result<Vec<RequestStatus>, Error> {
    let statuses = ops.get_mut(op.0)?.retire();
    drop_if_done(ops, op.0);
    Ok(statuses)
}

/// How long a waiter that sees nothing complete keeps spinning before it
/// naps: about one NVMe flash read, so a waiter keeping a queue busy does
/// not sleep through the completions it needs to refill it.
pub(crate) const SPIN_BEFORE_NAP: Duration = Duration::from_micros(100);

/// Idle back-off of a polling waiter idle for `idle`: spin first
/// (completions usually follow within microseconds), then sleep in short
/// naps so that a waiter on a slow drive does not take a core from the
/// drives and other threads.
fn backoff(idle: Duration) {
    if idle < SPIN_BEFORE_NAP {
        std::hint::spin_loop();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}
