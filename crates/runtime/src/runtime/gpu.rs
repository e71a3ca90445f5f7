//! GPU execution: the GPU-executed requests of a batch become one kernel
//! launch (`gpu-io`), built from the batch's plan; `wait` collects the
//! kernel's per-command statuses into the operation's accounting.
//!
//! A request is launched whole or not at all: one whose drive is not ready
//! or lacks GPU queues is failed before any of its commands reaches a
//! drive. The launch counts itself on each of its drives
//! ([`KernelsRunning`]) so that `reset_drive` and `shutdown` wait for it.
//! A command the kernel gave up on (its budget passed) is abandoned: if
//! the drive's controller turns out dead it is
//! [`RequestStatus::ControllerFatal`], else [`RequestStatus::Timeout`];
//! either way its memory stays pinned to the drive until a reset, because
//! the drive may still write it.
//!
//! Locks: the drives' health locks (counting the kernel), then the
//! operations table (recording the launch); `finish_gpu` waits for the
//! kernel with no lock held.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu_io::abi::TuttiRequest;
use gpu_io::{GpuLaunch, GpuQueue, GpuRegion, GpuStatus};

use super::ops::drop_if_done;
use super::ops::OpState;
use super::plan::{BatchPlan, PlannedRequest};
#[cfg(doc)]
use super::GPU_COMMAND_BUDGET;
use super::{error_chain, lock, Runtime};
use crate::drive::KernelsRunning;
use crate::error::{Error, RequestStatus, SubmitFailure};
use crate::handle::{OpHandle, RawHandle};
use crate::request::Direction;

/// Commands of an operation that GPU threads execute.
#[derive(Debug)]
pub(crate) struct GpuOp {
    pub launch: GpuLaunch,
    cmds: GpuCmds,
    /// Counts the kernel as running on its drives; declared after `launch`
    /// so it drops after the launch has waited for the kernel.
    _running: KernelsRunning,
}

/// The commands of a launch, in launch order.
#[derive(Debug)]
struct GpuCmds {
    /// Request index of each command.
    req: Vec<u32>,
    /// Drive index of each command.
    drive: Vec<u16>,
}

/// A batch's GPU commands being built.
#[derive(Default)]
struct Launch<'a> {
    cmds: Vec<TuttiRequest>,
    cmd_req: Vec<u32>,
    cmd_drive: Vec<u16>,
    /// The launch's lane (`lanes.rs`).
    lane: usize,
    /// The launch's queue list: the lane's GPU queue of each drive used.
    queues: Vec<(&'a GpuQueue, &'a GpuRegion)>,
    /// Drive index -> index of its queue in `queues`.
    first_queue: HashMap<usize, u16>,
    /// Requests failed before launch: (request, commands, why).
    refused: Vec<(usize, u32, SubmitFailure)>,
}

impl Runtime {
    /// Launches every GPU-executed command of the batch as one kernel, on
    /// one lane (`lanes.rs`): one GPU queue of each drive, and the caller's
    /// CUDA stream (see [`Runtime::submit_on_stream`]) or, for `None`, the
    /// lane's own.
    pub(super) fn launch_gpu(&self, op: RawHandle, plan: &BatchPlan, stream: Option<u64>) {
        let (Some(gpu), Some(lanes)) = (&self.gpu, &self.lanes) else { return };
        let lane = lanes.pick(stream);
        let mut l = Launch { lane: lane.index, ..Launch::default() };
        for (i, r) in plan.accepted().filter(|(_, r)| r.gpu) {
            if let Err(why) = self.add_request(&mut l, plan, i, r) {
                l.refused.push((i, r.commands, why));
            }
        }
        let mut failed: Vec<(usize, u32, SubmitFailure)> = std::mem::take(&mut l.refused);
        let mut launched = None;
        if !l.cmds.is_empty() {
            let drives = l.cmd_drive.iter().map(|&d| self.drives[usize::from(d)].clone()).collect();
            match KernelsRunning::start(drives) {
                None => failed.extend(per_request(
                    &l.cmd_req,
                    &launch_failure("a drive of the batch failed or is being reset"),
                )),
                Some(running) => {
                    // SAFETY: the lane's own stream lives as long as the
                    // runtime, which waits for its kernels before it goes;
                    // the caller of `submit_on_stream` keeps its stream
                    // alive until the operation is waited on, which waits
                    // for this launch.
                    let r = unsafe {
                        gpu.launch_on(
                            &l.queues,
                            &l.cmds,
                            u32::MAX,
                            self.gpu_command_budget(),
                            Some(lane.stream),
                        )
                    };
                    match r {
                        Ok(launch) => {
                            lanes.launched(lane, launch.end());
                            launched = Some((launch, running));
                        }
                        Err(e) => failed.extend(per_request(&l.cmd_req, &launch_failure(&error_chain(&e)))),
                    }
                }
            }
        }
        let mut ops = lock(&self.ops);
        let Ok(st) = ops.get_mut(op) else { return };
        for (i, n, reason) in failed {
            let _ = st.unsent(i, n, RequestStatus::SubmitFailed { reason });
        }
        if let Some((launch, running)) = launched {
            let cmds = GpuCmds { req: l.cmd_req, drive: l.cmd_drive };
            st.gpu = Some(GpuOp { launch, cmds, _running: running });
        }
    }

    /// Each GPU-executed command's budget: the kernel reports a command it
    /// has waited this long for as timed out (default
    /// [`GPU_COMMAND_BUDGET`]).
    pub fn gpu_command_budget(&self) -> Duration {
        Duration::from_nanos(self.gpu_budget_ns.load(Ordering::Relaxed))
    }

    /// Sets each GPU-executed command's budget for launches from now on,
    /// clamped to 1 ms..=10 min. A longer one suits kernels that run
    /// slowly on purpose (under `compute-sanitizer`, whose instrumentation
    /// slows the I/O kernel's polling many times over; `tutti-bench
    /// gpu-soak --time-scale`); a shorter one gives up on a drive sooner.
    /// Waits keep their own deadlines either way; the budget bounds how
    /// long a timed-out command's memory stays busy.
    pub fn set_gpu_command_budget(&self, budget: Duration) {
        let b = budget.clamp(Duration::from_millis(1), Duration::from_secs(600));
        self.gpu_budget_ns.store(b.as_nanos() as u64, Ordering::Relaxed);
        self.gpu_budget_max_ns.fetch_max(b.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The longest command budget any launch of this runtime may have had
    /// (shutdown waits that long for running kernels, whatever the budget
    /// is now).
    pub(super) fn longest_gpu_command_budget(&self) -> Duration {
        Duration::from_nanos(self.gpu_budget_max_ns.load(Ordering::Relaxed))
    }

    /// Appends request `i`'s commands to the launch, or says why it cannot
    /// go (nothing appended).
    fn add_request<'a>(
        &'a self,
        l: &mut Launch<'a>,
        plan: &'a BatchPlan,
        i: usize,
        r: &'a PlannedRequest,
    ) -> Result<(), SubmitFailure> {
        let opcode = match r.direction {
            Direction::Read => nvme_regs::opcode::nvm_opcode::READ,
            Direction::Write => nvme_regs::opcode::nvm_opcode::WRITE,
            // Planned as CPU-executed (`plan_flush`); never reaches here.
            Direction::Flush => return Err(launch_failure("a flush is executed by CPU threads")),
        };
        let Some(region) = r.region else { return Err(launch_failure("a GPU request without memory")) };
        let start = l.cmds.len();
        for p in &plan.pieces[r.pieces.clone()] {
            let d = &self.drives[p.drive];
            let (Some(gq), Some(Some(greg))) = (&d.gpu, plan.regions[region].gpu_regions.get(d.index)) else {
                l.truncate(start);
                return Err(SubmitFailure::NoQueue { drive: d.name.clone(), kind: "GPU" });
            };
            if !d.is_ready() {
                l.truncate(start);
                return Err(SubmitFailure::DriveNotReady {
                    drive: d.name.clone(),
                    state: format!("{:?}", d.state()),
                });
            }
            let lane = l.lane % gq.queues.len().max(1);
            let Some(queue) = gq.queues.get(lane) else {
                l.truncate(start);
                return Err(SubmitFailure::NoQueue { drive: d.name.clone(), kind: "GPU" });
            };
            let index = *l.first_queue.entry(d.index).or_insert_with(|| {
                l.queues.push((queue, greg));
                (l.queues.len() - 1) as u16
            });
            for c in p.io {
                l.cmds.push(TuttiRequest {
                    opcode,
                    queue: index,
                    nsid: d.ns.nsid,
                    slba: c.slba,
                    nlb: u32::from(c.nlb.zero_based()),
                    len: c.len as u32,
                    mem_offset: (p.mem_offset + c.offset) as u64,
                    ..Default::default()
                });
                l.cmd_req.push(i as u32);
                l.cmd_drive.push(d.index as u16);
            }
        }
        Ok(())
    }

    /// The end event of operation `op`'s GPU launch (a `CUevent` of the
    /// runtime's GPU context, as a number), recorded on the launch's stream
    /// after the kernel and its status copy: a caller orders another
    /// stream after the I/O with `cuStreamWaitEvent`. `None` when the
    /// operation has no GPU-executed command, or it has been waited on
    /// already (the event is valid until then). With emulated drives, a
    /// stream made to wait for a kernel still running can stall the
    /// emulator's copies that kernel needs, when the two streams share a
    /// hardware queue (docs/gpu.md, "Under load"): wait for the operation
    /// first, or set `CUDA_DEVICE_MAX_CONNECTIONS=32` before CUDA starts.
    ///
    /// # Errors
    ///
    /// [`Error::Handle`] for a stale, foreign or forged handle.
    pub fn gpu_event(&self, op: OpHandle) -> Result<Option<u64>, Error> {
        let ops = lock(&self.ops);
        Ok(ops.get(op.0)?.gpu.as_ref().map(|g| g.launch.event()))
    }

    /// Waits until operation `op`'s kernel has ended or `deadline` has
    /// passed; `true` when it has ended or the operation has none (then
    /// [`Runtime::finish_gpu`] returns at once). The operations table is
    /// not held while waiting.
    pub(super) fn wait_kernel(&self, op: OpHandle, deadline: Option<Instant>) -> Result<bool, Error> {
        let end = match &lock(&self.ops).get(op.0)?.gpu {
            Some(g) => g.launch.end(),
            None => return Ok(true),
        };
        Ok(end.wait_until(deadline))
    }

    /// Finishes the kernels of retired operations (a wait's deadline passed
    /// before the kernel ended) that have ended since: their commands'
    /// statuses settle the accounting, so that memory they no longer use
    /// can go. Returns how many.
    pub(super) fn reap_gpu_retired(&self) -> usize {
        let ended: Vec<RawHandle> = lock(&self.ops)
            .iter()
            .filter(|(_, st)| st.is_retired() && st.gpu.as_ref().is_some_and(|g| g.launch.is_done()))
            .map(|(h, _)| h)
            .collect();
        for &h in &ended {
            let _ = self.finish_gpu(OpHandle(h));
        }
        ended.len()
    }

    /// Waits for an operation's kernel, if it has one, and hands each
    /// command's status to the operation's accounting.
    pub(super) fn finish_gpu(&self, op: OpHandle) -> Result<(), Error> {
        let Some(GpuOp { launch, cmds, _running }) = lock(&self.ops).get_mut(op.0)?.gpu.take() else {
            return Ok(());
        };
        let statuses = launch.wait();
        // Drives the kernel saw a timeout on, judged once each by their
        // registers before the operations table is taken.
        let mut dead: HashMap<u16, bool> = HashMap::new();
        if let Ok(s) = &statuses {
            for (&d, _) in cmds.drive.iter().zip(s).filter(|(_, s)| **s == GpuStatus::Timeout) {
                dead.entry(d).or_insert_with(|| self.gpu_drive_dead(usize::from(d)));
            }
        }
        let mut ops = lock(&self.ops);
        let st = ops.get_mut(op.0)?;
        match statuses {
            Ok(s) => self.settle_gpu_commands(st, &cmds, &s, &dead),
            Err(e) => {
                for (i, n, reason) in per_request(&cmds.req, &launch_failure(&error_chain(&e))) {
                    let _ = st.unsent(i, n, RequestStatus::SubmitFailed { reason });
                }
            }
        }
        // A wait on another thread may have retired it meanwhile: then
        // nothing else will drop it.
        drop_if_done(&mut ops, op.0);
        Ok(())
    }

    /// Hands command `k`'s status `statuses[k]` to the accounting, for
    /// every command of the launch. `dead`: the drives a timed-out
    /// command's controller was found failed on.
    fn settle_gpu_commands(
        &self,
        st: &mut OpState,
        g: &GpuCmds,
        statuses: &[GpuStatus],
        dead: &HashMap<u16, bool>,
    ) {
        for ((&i, &d), s) in g.req.iter().zip(&g.drive).zip(statuses) {
            let i = i as usize;
            let drive = &self.drives[usize::from(d)];
            let name = || drive.name.clone();
            let _ = match *s {
                GpuStatus::Success => st.complete(i, None),
                GpuStatus::Nvme(status) => {
                    st.complete(i, Some(RequestStatus::Nvme { drive: name(), status }))
                }
                GpuStatus::Timeout => {
                    // The kernel gave up on it; the drive may still write
                    // its memory until a reset.
                    drive.pin_until_reset(&st.regions);
                    let why = if dead.get(&d).copied().unwrap_or(false) {
                        RequestStatus::ControllerFatal { drive: name() }
                    } else {
                        RequestStatus::Timeout
                    };
                    st.abandon(i, why)
                }
                other => st.unsent(
                    i,
                    1,
                    RequestStatus::SubmitFailed {
                        reason: SubmitFailure::GpuStatus { detail: format!("{other:?}") },
                    },
                ),
            };
        }
    }
}

impl Launch<'_> {
    /// Drops the commands from `start` on (a request refused part way).
    fn truncate(&mut self, start: usize) {
        self.cmds.truncate(start);
        self.cmd_req.truncate(start);
        self.cmd_drive.truncate(start);
    }
}

/// `(request, commands, why)` for each request of a command list.
fn per_request(cmd_req: &[u32], why: &SubmitFailure) -> Vec<(usize, u32, SubmitFailure)> {
    let mut out: Vec<(usize, u32, SubmitFailure)> = Vec::new();
    for &i in cmd_req {
        match out.last_mut() {
            Some((j, n, _)) if *j == i as usize => *n += 1,
            _ => out.push((i as usize, 1, why.clone())),
        }
    }
    out
}

/// [`SubmitFailure::GpuLaunch`] with `detail`.
fn launch_failure(detail: &str) -> SubmitFailure {
    SubmitFailure::GpuLaunch { detail: detail.to_owned() }
}
