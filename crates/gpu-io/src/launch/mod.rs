//! Launching the I/O kernel: [`Gpu::launch`] / [`Gpu::launch_on`] and the
//! [`GpuLaunch`] they return.
//!
//! A launch makes no CUDA memory management call (allocation, free,
//! memset, synchronous copy), so it never waits for running kernels and
//! several launches pipeline on a stream:
//!
//! - Its inputs (queue descriptors, requests, their per-queue order and
//!   offsets) and its status words live in a reusable slot
//!   ([`LaunchSlot`]): pinned host memory mapped into the GPU, which the
//!   kernel reads and writes in place (zero-copy), so the launch's stream
//!   carries the kernel alone, no copy before or after it. (With copies on
//!   the I/O kernel's stream, the emulator's copies into GPU memory stalled
//!   behind a kernel that waited for them: H200, 2026-12-01.) Slots are
//!   kept in a pool; only a launch larger than every free slot allocates
//!   one (inside the `Quiesce` gate).
//! - A `BLOCKING_SYNC` event recorded after the kernel marks the end:
//!   [`GpuLaunch::wait`] sleeps on it (`cuEventSynchronize`) instead of
//!   spinning a core, and [`GpuLaunch::is_done`] polls it.
//! - The stream is the `Gpu`'s own, or the caller's ([`Gpu::launch_on`]),
//!   so that a serving engine orders I/O with its own kernels. A queue is
//!   never driven by two kernels at once: a launch follows the last launch
//!   on each of its queues in stream order, or, when that one was made on
//!   another stream, waits for it on the host before it is queued. No
//!   stream ever waits for an I/O kernel on the GPU (`cuStreamWaitEvent`):
//!   the waiting stream would block the hardware queue it shares with
//!   other streams, and with emulated drives the copies the running kernel
//!   needs may be in that queue (issue 23).
//! - The memory-management gate (`Quiesce`) knows every launch in flight
//!   by its event, and waits for them all; launches take the gate's lock
//!   only for the few calls that queue the work.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::result;
use cudarc::driver::sys;

use crate::abi::{TuttiQueue, TuttiRequest};
use crate::cuda::{KernelEvent, Quiesce, Stream};
use crate::error::{drv, GpuError};
use crate::gpu::Gpu;
use crate::launch::order::{block_threads, func_max_threads, group_by_queue, order_after, After};
use crate::launch::slot::{LaunchSlot, Layout, SlotPool};
use crate::launch_end::{wait_spin, LaunchEnd};
use crate::queue::GpuQueue;
use crate::region::GpuRegion;
use crate::status::{GpuStatus, STATUS_NOT_RUN};

pub(crate) mod kernel;
pub(crate) mod order;
pub(crate) mod slot;

/// A batch's inputs, grouped by queue.
struct LaunchInput<'a> {
    /// The entry point: `tutti_io`, or `tutti_ring_probe` (same parameters).
    func: sys::CUfunction,
    descs: &'a [TuttiQueue],
    requests: &'a [TuttiRequest],
    order: &'a [u32],
    offsets: &'a [u32],
    /// Record a timing event before the kernel ([`GpuLaunch::wait_timed`]).
    timed: bool,
}

/// A launched batch, until [`GpuLaunch::wait`].
#[derive(Debug)]
pub struct GpuLaunch {
    /// `None` once waited on (back in the pool).
    slot: Option<LaunchSlot>,
    layout: Layout,
    /// Bytes the launch's requests move (sets the wait's poll).
    bytes: u64,
    done: Arc<KernelEvent>,
    /// Recorded just before the kernel, for a timed launch.
    started: Option<KernelEvent>,
    pool: Arc<SlotPool>,
    quiet: Arc<Quiesce>,
}

impl GpuLaunch {
    /// `true` once the kernel has ended and its statuses are back; never
    /// blocks.
    pub fn is_done(&self) -> bool {
        self.done.is_done()
    }

    /// The raw `CUevent` recorded after the kernel and its status copy, for
    /// a caller that orders its own stream after this launch
    /// (`cuStreamWaitEvent`). Valid until this launch is waited on or
    /// dropped. With emulated drives, a stream made to wait for a running
    /// I/O kernel can stall the emulator's copies that kernel needs (when
    /// the two share a hardware queue, `CUDA_DEVICE_MAX_CONNECTIONS`):
    /// prefer to wait for the launch first, or set that variable to 32.
    pub fn event(&self) -> u64 {
        self.done.raw() as u64
    }

    /// The launch's end, to wait for with a deadline
    /// ([`LaunchEnd::wait_until`]) while this value stays where it is.
    pub fn end(&self) -> LaunchEnd {
        LaunchEnd { event: self.done.clone(), bytes: self.bytes }
    }

    /// Waits for the kernel (bounded by the launch's per-command budget)
    /// and returns one status per request, in order. The calling thread
    /// polls for at most 300 us (launches of up to 8 MiB; 20 us for larger
    /// ones; `TUTTI_GPU_WAIT_SPIN_US` sets another bound), then sleeps in
    /// the driver (a `BLOCKING_SYNC` event): it does not spin a core
    /// through a long launch.
    pub fn wait(self) -> Result<Vec<GpuStatus>, GpuError> {
        self.wait_timed().map(|(statuses, _)| statuses)
    }

    /// As [`GpuLaunch::wait`], with the GPU time of the kernel itself (from
    /// an event recorded on its stream just before it to the one after it)
    /// for a launch from [`Gpu::launch_timed`]; `None` for other launches, or
    /// when the driver cannot time it (the statuses are returned anyway).
    /// Excludes the host's work of the launch (grouping the requests,
    /// filling the slot) and any wait for earlier launches on its queues.
    pub fn wait_timed(mut self) -> Result<(Vec<GpuStatus>, Option<Duration>), GpuError> {
        // A launch about to end is taken without a sleep and wake-up.
        let spin_until = Instant::now() + wait_spin(self.bytes);
        while !self.done.is_done() && Instant::now() < spin_until {
            std::hint::spin_loop();
        }
        let r = self.done.synchronize();
        let statuses = match (&r, &self.slot) {
            (Ok(()), Some(slot)) => Ok(slot.statuses(&self.layout)),
            (Err(_), _) => r.map(|()| Vec::new()),
            (Ok(()), None) => Ok(Vec::new()),
        };
        self.release(statuses.is_ok());
        let statuses = statuses?;
        // A timing the driver refuses loses the time, never the statuses.
        let kernel = self.started.as_ref().and_then(|start| self.done.elapsed_since(start).ok());
        Ok((statuses, kernel))
    }

    /// Unlists the launch from the gate and returns its slot to the pool
    /// (`reusable`: the event completed; otherwise the slot is dropped
    /// inside the gate, which waits for every kernel first).
    fn release(&mut self, reusable: bool) {
        self.quiet.finished(&self.done);
        let Some(slot) = self.slot.take() else { return };
        if reusable {
            self.pool.give(slot, &self.quiet);
        } else {
            let _quiet = self.quiet.enter();
            drop(slot);
        }
    }
}

impl Drop for GpuLaunch {
    /// A launch dropped without a wait: the kernel may still read its slot;
    /// wait for its event (bounded by the budget) before reusing it.
    fn drop(&mut self) {
        if self.slot.is_none() {
            return;
        }
        let ok = self.done.synchronize().is_ok();
        self.release(ok);
    }
}

impl Gpu {
    /// Runs one batch in one kernel launch and waits for it: see
    /// [`Gpu::launch`].
    pub fn run(
        &self,
        queues: &[(&GpuQueue, &GpuRegion)],
        requests: &[TuttiRequest],
        threads_per_queue: u32,
        budget: Duration,
    ) -> Result<Vec<GpuStatus>, GpuError> {
        self.launch(queues, requests, threads_per_queue, budget)?.wait()
    }

    /// Launches one batch as one kernel on this GPU's own stream and
    /// returns at once: `requests[i]` goes to `queues[requests[i].queue]`,
    /// whose data region is the paired [`GpuRegion`]. One block per queue,
    /// at most `threads_per_queue` (clamped to the queue size - 1, 1024 and
    /// the threads per block the kernel can run for its registers)
    /// commands in flight per queue; each command waits at most `budget`
    /// for its completion. [`GpuLaunch::wait`] returns one status per
    /// request.
    ///
    /// The queues and regions must stay alive until this launch is waited
    /// on. A launch on a queue that an earlier launch on the same stream
    /// still uses runs after it in stream order (no host wait); one whose
    /// earlier launch was on another stream blocks until that one has
    /// ended. Otherwise does not block, except for a launch larger than
    /// any before it (a new slot is allocated, which waits for running I/O
    /// kernels).
    pub fn launch(
        &self,
        queues: &[(&GpuQueue, &GpuRegion)],
        requests: &[TuttiRequest],
        threads_per_queue: u32,
        budget: Duration,
    ) -> Result<GpuLaunch, GpuError> {
        // SAFETY: no caller stream: the GPU's own stream lives as long as it.
        unsafe { self.launch_on(queues, requests, threads_per_queue, budget, None) }
    }

    /// As [`Gpu::launch`], with CUDA timing events around the kernel:
    /// [`GpuLaunch::wait_timed`] returns its GPU time. For benchmarks
    /// (`tutti-bench gpu-rate`), which want the device's rate apart from the
    /// host's work of preparing a launch.
    pub fn launch_timed(
        &self,
        queues: &[(&GpuQueue, &GpuRegion)],
        requests: &[TuttiRequest],
        threads_per_queue: u32,
        budget: Duration,
    ) -> Result<GpuLaunch, GpuError> {
        self.launch_with(self.io.func(), queues, requests, threads_per_queue, budget, self.quiet.io.raw, true)
    }

    /// As [`Gpu::launch`], on the caller's CUDA stream `stream` (a
    /// `CUstream` of this GPU's primary context, as a number: PyTorch's
    /// `torch.cuda.Stream.cuda_stream`, CuPy's `Stream.ptr`), or on this
    /// GPU's own stream for `None`. The kernel runs after the work queued
    /// before it on that stream, and work queued after it runs after the
    /// kernel: a serving engine orders loads and saves with its own
    /// kernels without a host synchronisation. The legacy default stream
    /// (0) is refused: it would serialise with the emulator's copies.
    ///
    /// # Safety
    ///
    /// `stream`, if given, must be a live stream of this GPU's context and
    /// stay alive until the launch has ended.
    pub unsafe fn launch_on(
        &self,
        queues: &[(&GpuQueue, &GpuRegion)],
        requests: &[TuttiRequest],
        threads_per_queue: u32,
        budget: Duration,
        stream: Option<u64>,
    ) -> Result<GpuLaunch, GpuError> {
        if stream == Some(0) {
            return Err(GpuError::LegacyStream);
        }
        let raw = stream.map_or(self.quiet.io.raw, |s| s as sys::CUstream);
        self.launch_with(self.io.func(), queues, requests, threads_per_queue, budget, raw, false)
    }

    /// Groups the batch by queue and starts `func` (`tutti_io` or
    /// `tutti_ring_probe`, same parameters) over it on `stream`, with timing
    /// events around the kernel when `timed`.
    #[allow(clippy::too_many_arguments)]
    fn launch_with(
        &self,
        func: sys::CUfunction,
        queues: &[(&GpuQueue, &GpuRegion)],
        requests: &[TuttiRequest],
        threads_per_queue: u32,
        budget: Duration,
        stream: sys::CUstream,
        timed: bool,
    ) -> Result<GpuLaunch, GpuError> {
        let (descs, order, offsets) = group_by_queue(queues, requests)?;
        let max_size = queues.iter().map(|(q, _)| q.desc.size).max().unwrap_or(2);
        let threads = block_threads(threads_per_queue, max_size, func_max_threads(func));
        let input = LaunchInput { func, descs: &descs, requests, order: &order, offsets: &offsets, timed };
        let qs: Vec<&GpuQueue> = queues.iter().map(|(q, _)| *q).collect();
        self.start(&input, &qs, threads, budget, stream)
    }

    /// Runs the bare ring probe (`tutti_ring_probe` in kernels/tutti_io.cu)
    /// over the same queues, regions and requests as [`Gpu::launch`] would,
    /// and waits for it: lockstep bursts of up to `threads_per_queue` SQEs
    /// per queue with one SQ tail doorbell each, completions found by phase
    /// tag alone, one CQ head doorbell per burst; no tickets, locks, CID
    /// matching, SQHD/SQID checks or PRP lists. A benchmark's yardstick for
    /// what the protocol of [`Gpu::launch`] costs (`tutti-bench gpu-rate`),
    /// not a datapath: each request moves at most the bytes PRP1 covers,
    /// and a request's status only says whether its CQE arrived
    /// ([`GpuStatus::Success`], whatever the CQE's status) or not
    /// ([`GpuStatus::Timeout`]; then the queue's state is no longer known
    /// and it must not be used again). Also returns the probe kernel's GPU
    /// time (as [`GpuLaunch::wait_timed`]: `None` when the driver cannot
    /// time it).
    ///
    /// # Errors
    /// As [`Gpu::launch`], and [`GpuError::NoRingProbe`] when the loaded
    /// module has no probe.
    pub fn run_ring_probe(
        &self,
        queues: &[(&GpuQueue, &GpuRegion)],
        requests: &[TuttiRequest],
        threads_per_queue: u32,
        budget: Duration,
    ) -> Result<(Vec<GpuStatus>, Option<Duration>), GpuError> {
        let func = self.io.probe_func().ok_or(GpuError::NoRingProbe)?;
        self.launch_with(func, queues, requests, threads_per_queue, budget, self.quiet.io.raw, true)?
            .wait_timed()
    }

    /// Queues the upload, the kernel, the status copy and the end event on
    /// `stream`.
    fn start(
        &self,
        input: &LaunchInput<'_>,
        queues: &[&GpuQueue],
        threads: u32,
        budget: Duration,
        stream: sys::CUstream,
    ) -> Result<GpuLaunch, GpuError> {
        let n = input.requests.len();
        let layout = Layout::new(input.descs.len(), n);
        let mut slot = self.io.slots().take(&self.quiet, &self.ctx, layout.end)?;
        slot.put(layout.queues, input.descs);
        slot.put(layout.reqs, input.requests);
        slot.put(layout.order, input.order);
        slot.put(layout.offsets, input.offsets);
        slot.put(layout.status, &vec![STATUS_NOT_RUN; n]);
        let events = KernelEvent::new(&self.ctx, input.timed, stream).and_then(|done| {
            let started = if input.timed { Some(KernelEvent::new(&self.ctx, true, stream)?) } else { None };
            Ok((Arc::new(done), started))
        });
        let (done, started) = match events {
            Ok(e) => e,
            Err(e) => {
                self.io.slots().give(slot, &self.quiet);
                return Err(e);
            }
        };
        // No memory management may start between the launch and its
        // listing in the gate. No launch on another stream may still run
        // on these queues (waited for here, on the host).
        let mut running = loop {
            self.wait_other_streams(queues, stream);
            let running = self.quiet.lock();
            if !queues.iter().any(|q| order_after(q.last_on(), stream) == After::HostWait) {
                break running;
            }
        };
        let events = (started.as_ref(), &*done);
        if let Err(e) = self.enqueue(input.func, &slot, &layout, queues, threads, budget, stream, events) {
            // Whatever was queued must end before the slot is reused.
            // SAFETY: `stream` is live (this function's caller's contract).
            let _ = unsafe { result::stream::synchronize(stream) };
            drop(running);
            self.io.slots().give(slot, &self.quiet);
            return Err(e);
        }
        running.push(done.clone());
        // Recorded before the gate's lock is let go: a launch on the same
        // queue from another thread (which reads `last_launch` under that
        // lock) must wait for this one, never for the one before it.
        for q in queues {
            q.set_last_launch(&done);
        }
        drop(running);
        for q in queues {
            q.expect_doorbells();
        }
        let bytes = input.requests.iter().map(|r| u64::from(r.len)).sum();
        Ok(GpuLaunch {
            slot: Some(slot),
            layout,
            bytes,
            done,
            started,
            pool: self.io.slots().clone(),
            quiet: self.quiet.clone(),
        })
    }

    /// Waits on the host until every earlier launch on `queues` made on a
    /// stream other than `stream` has ended. Never on the GPU: a stream
    /// that waits for an event (`cuStreamWaitEvent`) blocks the hardware
    /// queue it shares with other streams (`CUDA_DEVICE_MAX_CONNECTIONS`),
    /// and with emulated drives the copies a running I/O kernel waits for
    /// may sit in that queue behind the wait: a cycle that only the
    /// commands' budgets break (issue 23; docs/gpu.md, "No GPU work waits
    /// for an I/O kernel"). Earlier launches on the same stream are
    /// ordered by the stream itself.
    fn wait_other_streams(&self, queues: &[&GpuQueue], stream: sys::CUstream) {
        for q in queues {
            if order_after(q.last_on(), stream) == After::HostWait {
                if let Some(prev) = q.last_launch() {
                    // Bounded: the kernel ends within its commands' budgets.
                    let _ = prev.synchronize();
                }
            }
        }
    }

    /// The driver calls of a launch, in stream order: the start event
    /// (timed launches), the kernel, the end event. Earlier launches on
    /// its queues were on the same stream or have ended
    /// ([`Gpu::wait_other_streams`]).
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        func: sys::CUfunction,
        slot: &LaunchSlot,
        l: &Layout,
        queues: &[&GpuQueue],
        threads: u32,
        budget: Duration,
        stream: sys::CUstream,
        (started, done): (Option<&KernelEvent>, &KernelEvent),
    ) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // The kernel reads its inputs and writes its statuses in the slot's
        // mapped host memory (the launch makes the host's stores visible).
        let d = slot.host.dptr;
        let (pq, pr, po, pf, ps) = (
            d + l.queues as u64,
            d + l.reqs as u64,
            d + l.order as u64,
            d + l.offsets as u64,
            d + l.status as u64,
        );
        let nqueues = u32::try_from(queues.len()).unwrap_or(u32::MAX);
        let budget_ns = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
        if let Some(start) = started {
            // SAFETY: both handles are live in this context.
            unsafe { sys::cuEventRecord(start.raw(), stream) }.result().map_err(drv("cuEventRecord"))?;
        }
        let mut params: [*mut c_void; 7] = [
            (&pq as *const u64).cast_mut().cast(),
            (&nqueues as *const u32).cast_mut().cast(),
            (&pr as *const u64).cast_mut().cast(),
            (&po as *const u64).cast_mut().cast(),
            (&pf as *const u64).cast_mut().cast(),
            (&ps as *const u64).cast_mut().cast(),
            (&budget_ns as *const u64).cast_mut().cast(),
        ];
        // SAFETY: the parameter list matches the signature `tutti_io` and
        // `tutti_ring_probe` share (7 arguments: 5 device pointers, a u32,
        // a u64); cuLaunchKernel copies the values before returning; the
        // slot they point into lives until the launch's event has completed.
        unsafe { result::launch_kernel(func, (nqueues, 1, 1), (threads, 1, 1), 0, stream, &mut params) }
            .map_err(drv("cuLaunchKernel"))?;
        // SAFETY: both handles are live in this context.
        unsafe { sys::cuEventRecord(done.raw(), stream) }.result().map_err(drv("cuEventRecord"))
    }
}

/// A non-blocking CUDA stream of a [`Gpu`]'s context, destroyed on drop:
/// for callers without a CUDA runtime of their own (tests, benchmarks, the
/// C API) that want [`Gpu::launch_on`]'s ordering. PyTorch and CuPy users
/// pass their own streams instead.
#[derive(Debug)]
pub struct GpuStream(Stream);

impl GpuStream {
    /// Creates the stream (waits for running I/O kernels first, as this
    /// crate's other resource creation does).
    pub fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        let _quiet = gpu.quiet.enter()?;
        Ok(Self(Stream::new(&gpu.ctx)?))
    }

    /// The `CUstream`, as [`Gpu::launch_on`] and
    /// `tutti::Runtime::submit_on_stream` take it.
    pub fn raw(&self) -> u64 {
        self.0.raw as u64
    }

    /// Blocks until the work queued on the stream has ended.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.0.sync()
    }
}
