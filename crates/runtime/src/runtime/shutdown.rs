//! Shutdown: stop taking work, drain, then per drive delete each I/O SQ,
//! reap what the controller aborts, delete the CQ, and shut the controller
//! down (CC.SHN, NVMe Base 2.0 3.6.3).
//!
//! Locks: the operations table (counting), then per drive its controller
//! lock, under which each queue pair's lock is taken in turn; completions
//! reaped there are routed under the operations table after the queue is
//! let go (the controller lock is still held: nothing else takes a drive's
//! controller lock and then the operations table the other way round).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::recovery::controller_gone;
use super::{error_chain, lock, Runtime, ABORT_REAP_BOUND, HEALTH_CHECK_INTERVAL};
use crate::drive::{Drive, DriveState};
use crate::handle::{OpHandle, RawHandle};

/// What [`Runtime::shutdown`] found.
#[derive(Debug, Default)]
pub struct ShutdownReport {
    /// Operations still not final when the drain bound passed.
    pub ops_in_flight: usize,
    /// Commands still outstanding on the drives when the drain bound
    /// passed (before their SQs were deleted).
    pub commands_in_flight: u64,
    /// Completions reaped after deleting the SQs: commands the controllers
    /// aborted (or finished) because their SQ went away; each was matched
    /// to its request once.
    pub commands_reaped_at_deletion: u64,
    /// Commands that got no completion at all: the controller neither
    /// finished nor aborted them when their SQ was deleted, or deleting
    /// the SQ failed (see `drives`); their requests stay not final
    /// ([`crate::RequestStatus::Timeout`] to a wait).
    pub commands_lost: u64,
    /// Per drive, the result of deleting its queues and CC.SHN shutdown.
    pub drives: Vec<(String, Result<(), String>)>,
}

impl Runtime {
    /// Orderly shutdown. Stops accepting work (a later [`Runtime::submit`]
    /// gets [`crate::RequestError::ShuttingDown`] for each request), drains
    /// in-flight operations for up to `drain` (polling their completions;
    /// a drive found dead meanwhile, as [`Runtime::wait`] finds one, fails
    /// its commands with [`crate::RequestStatus::ControllerFatal`] instead
    /// of holding the drain to its bound),
    /// then, per drive and queue: deletes the SQ (the controller completes
    /// or aborts every command of it it had fetched, and drops the rest),
    /// reaps that CQ for up to 1 s ([`ABORT_REAP_BOUND`]) so that each
    /// outstanding command gets exactly one completion (an aborted one
    /// surfaces as [`crate::RequestStatus::Nvme`] with SCT 0h / SC 08h on
    /// its request, which a later [`Runtime::wait`] returns), deletes the
    /// CQ; finally shuts each controller down (CC.SHN). Before all that it
    /// runs the hooks given to [`Runtime::on_shutdown`]. Reports what was
    /// still in flight and how each drive's shutdown went. A second call
    /// returns an empty report.
    pub fn shutdown(&self, drain: Duration) -> ShutdownReport {
        // Layers above finish their own work first (tutti-kv frees its
        // stores' leases), while I/O is still accepted.
        if !self.shut_down.load(Ordering::Acquire) {
            self.shutdown_hooks.run_all();
        }
        self.shutting_down.store(true, Ordering::Release);
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return ShutdownReport::default();
        }
        // A drain too long to add to now (u64::MAX seconds) waits as long
        // as the clock can count, rather than overflowing.
        let now = Instant::now();
        let deadline = now.checked_add(drain).unwrap_or_else(|| far_future(now));
        self.finish_gpu_kernels();
        // Submits that passed the shutting-down check finish queueing first.
        while self.submitters.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let mut report = ShutdownReport::default();
        (report.ops_in_flight, report.commands_in_flight) = self.drain(deadline);
        for d in &self.drives {
            let was = d.mark_shut_down();
            d.quiesce_queues();
            let (reaped, r) = self.shutdown_drive(d, was);
            report.commands_reaped_at_deletion += reaped;
            report.drives.push((d.name.clone(), r));
        }
        report.commands_lost = lock(&self.ops).iter().map(|(_, st)| st.outstanding()).sum();
        self.queues_gone.store(true, Ordering::Release);
        report
    }

    /// Lets every running kernel finish before GPU queues go away: those
    /// no thread waits on are waited on here; those another thread waits
    /// on end within their budget too.
    fn finish_gpu_kernels(&self) {
        let gpu_ops: Vec<RawHandle> =
            lock(&self.ops).iter().filter(|(_, st)| st.gpu.is_some()).map(|(h, _)| h).collect();
        for h in gpu_ops {
            let _ = self.finish_gpu(OpHandle(h));
        }
        let gpu_deadline = Instant::now() + self.longest_gpu_command_budget() + Duration::from_secs(1);
        while self.drives.iter().any(|d| d.gpu_kernels() > 0) && Instant::now() < gpu_deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Polls every queue until no command is outstanding or `deadline`
    /// passes; returns the operations not final and the commands
    /// outstanding at the end. While nothing completes, the controllers
    /// are checked every [`HEALTH_CHECK_INTERVAL`], as a waiter does
    /// (`recovery.rs`): a dead drive's commands (an operation nobody waits
    /// on, on a drive that lost power) are failed then, instead of being
    /// waited for until the deadline.
    fn drain(&self, deadline: Instant) -> (usize, u64) {
        let all: Vec<usize> = (0..self.datapaths.len()).collect();
        let mut buf = Vec::new();
        let mut last_progress = Instant::now();
        let mut last_check = last_progress;
        loop {
            let (pending, cmds) = {
                let ops = lock(&self.ops);
                ops.iter()
                    .fold((0, 0), |(p, c), (_, st)| (p + usize::from(!st.is_final()), c + st.outstanding()))
            };
            let now = Instant::now();
            if cmds == 0 || now >= deadline {
                return (pending, cmds);
            }
            if self.poll_datapaths(&all, &mut buf) > 0 {
                last_progress = now;
                continue;
            }
            if now.duration_since(last_progress) >= HEALTH_CHECK_INTERVAL
                && now.duration_since(last_check) >= HEALTH_CHECK_INTERVAL
            {
                self.check_drives(&all);
                last_check = now;
            }
            std::thread::yield_now();
        }
    }

    /// Shutdown of one drive whose queues no other thread uses (`was`: its
    /// state before): each CPU queue's SQ deleted, its CQ reaped (bounded)
    /// and deleted, then the controller's CC.SHN shutdown (which also
    /// deletes GPU-driven queues). A failed controller's queues were
    /// emptied already and are not touched, and one that no longer answers
    /// ([`controller_gone`]) is sent neither Delete I/O SQ/CQ nor CC.SHN
    /// (each would only wait out its timeout). Returns the completions reaped after SQ deletion and the
    /// first error.
    fn shutdown_drive(&self, d: &Drive, was: DriveState) -> (u64, Result<(), String>) {
        let Some(ctrl) = &d.controller else {
            return (0, release_daemon_queues(d));
        };
        let mut c = lock(ctrl);
        if let Some(why) = controller_gone(&c) {
            // Admin commands and CC.SHN would each wait out their timeout;
            // the commands its queues still hold are counted as lost.
            return (0, Err(format!("{why}; no queue deletion, no CC.SHN sent")));
        }
        let mut reaped = 0u64;
        let mut first_err = None;
        let mut buf = Vec::new();
        if was == DriveState::Ready {
            for q in &d.queues {
                if let Err(e) = c.delete_io_sq(&mut lock(q)) {
                    first_err.get_or_insert(e);
                    continue;
                }
                let deadline = Instant::now() + ABORT_REAP_BOUND;
                while lock(q).outstanding() > 0 && Instant::now() < deadline {
                    let n = self.poll_queue(q, d, true, &mut buf);
                    reaped += n as u64;
                    if n == 0 {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
                let qp = lock(q);
                if qp.outstanding() > 0 {
                    tracing::warn!(
                        drive = %d.name,
                        qid = qp.qid(),
                        commands = qp.outstanding(),
                        "commands got no completion after their SQ was deleted"
                    );
                }
                if let Err(e) = c.delete_io_cq(qp.qid()) {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Err(e) = c.shutdown() {
            first_err.get_or_insert(e);
        }
        (reaped, first_err.map_or(Ok(()), |e| Err(error_chain(&e))))
    }
}

/// Gives a `tuttid` drive's queue pairs back (the daemon deletes each SQ,
/// then its CQ); the connection closes when the runtime is dropped.
fn release_daemon_queues(d: &Drive) -> Result<(), String> {
    let Some(dev) = &d.daemon else { return Ok(()) };
    if let Some(why) = d.daemon_dead() {
        return Err(format!("{why}; the daemon reclaimed the queues"));
    }
    let mut first_err = None;
    for q in &d.queues {
        let qid = lock(q).qid();
        if let Err(e) = dev.client().release_queue(&dev.facts().drive, qid) {
            first_err.get_or_insert_with(|| error_chain(&e));
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// The latest instant after `now` this platform's clock can hold (searched
/// by halving from about 2^62 ns), for deadlines given as unbounded
/// durations.
fn far_future(now: Instant) -> Instant {
    let mut d = Duration::from_secs(1 << 32);
    loop {
        if let Some(t) = now.checked_add(d) {
            return t;
        }
        d /= 2;
    }
}
