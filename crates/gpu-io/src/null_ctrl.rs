//! Null-backed NVMe controllers played by GPU warps
//! (`kernels/tutti_null.cu`): a benchmark's device, fast enough that the
//! submitter (`tutti_io`) is what is measured. One warp serves one I/O
//! queue pair: it fetches up to 32 SQEs per doorbell read, checks them as
//! the emulator's null backing does (opcode, namespace, LBA range), and
//! posts their CQEs in order with the SQHD and SQID a controller writes;
//! no data moves. The rings and doorbells are the ones [`GpuQueue`]s
//! drive: an emulated controller's whose thread leaves its I/O queues alone
//! (`nvme_emu::EmulatorConfig::io_queues_detached`), in host memory, or in
//! GPU memory ([`GpuQueue::with_device_rings`]).
//!
//! While the controllers run, a kernel of theirs occupies the GPU until
//! [`NullControllers::stop`]: start them after every registration the run
//! needs (queues, regions, buffers) and drop none of those before stopping
//! them: a CUDA free may wait for every kernel, this one included. Launch
//! slots and checksum scratch given back meanwhile are kept, not freed,
//! whatever their size (the `Gpu`'s gate counts the kernel as persistent);
//! a launch or checksum that must allocate still may, as allocations do
//! not wait for kernels.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys};

use crate::abi::{TuttiNullQueue, TuttiNullReport};
use crate::cuda::{load_module, Module, PinnedBuf, Quiesce, Stream};
use crate::error::{drv, GpuError};
use crate::gpu::Gpu;
use crate::ptx::{TUTTI_NULL_ENTRY_C, TUTTI_NULL_PTX_C};
use crate::queue::GpuQueue;

/// Threads per block of the null controller (its `__launch_bounds__`): four
/// queues per block.
const THREADS: u32 = 128;

/// How long [`NullControllers::stop`] waits for the warps to notice.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Running null controllers, one warp per queue; stopped (and their
/// reports read) by [`NullControllers::stop`], or on drop.
/// Borrows the `Gpu` and the queues it serves: neither can be dropped (and
/// freed under the running kernel) before it stops.
#[derive(Debug)]
pub struct NullControllers<'a> {
    /// Descriptors, then the stop word, then the reports (pinned, mapped);
    /// leaked, with the module, if the kernel never ends.
    mem: ManuallyDrop<PinnedBuf>,
    reports_at: usize,
    stop_at: usize,
    queues: usize,
    stream: Stream,
    module: ManuallyDrop<Module>,
    stopped: bool,
    /// The wait for the kernel gave up once: the drop does not wait again.
    gave_up: bool,
    /// Counts this kernel as persistent while it runs (nothing is freed).
    quiet: Arc<Quiesce>,
    /// The queues served, marked as such until the kernel has ended.
    served: Vec<&'a GpuQueue>,
    _gpu: std::marker::PhantomData<&'a Gpu>,
}

// SAFETY: the pinned memory is written by the host only through the stop
// word (a volatile store) and read after the kernel ended; CUDA calls bind
// the context.
unsafe impl Send for NullControllers<'_> {}

impl Gpu {
    /// Starts null controllers on `queues` (one warp each) for a namespace
    /// 1 of `ns_blocks` logical blocks. Each queue must be fresh for the
    /// GPU: no launch has used it (the controllers start from the host's
    /// SQ tail, CQ head and phase), and no null controller serves it. One
    /// set of null controllers per `Gpu` at a time.
    ///
    /// # Errors
    ///
    /// [`GpuError::NullControllerQueueUsed`] for a queue a launch has used,
    /// that another null controller serves, or that appears twice;
    /// [`GpuError::NullControllersRunning`] while another set runs; driver
    /// errors from loading the module, allocating or launching.
    pub fn start_null_controllers<'a>(
        &'a self,
        queues: &[&'a GpuQueue],
        ns_blocks: u64,
    ) -> Result<NullControllers<'a>, GpuError> {
        let _quiet = self.quiet.enter()?;
        if !self.quiet.may_free() {
            return Err(GpuError::NullControllersRunning);
        }
        let mut descs = Vec::with_capacity(queues.len());
        for (i, q) in queues.iter().enumerate() {
            let twice = queues[..i].iter().any(|p| std::ptr::eq(*p, *q));
            if twice || q.last_launch().is_some() || q.null_served() {
                return Err(GpuError::NullControllerQueueUsed { qid: q.qid() });
            }
            descs.push(q.null_descriptor());
        }
        let (module, func) = load_module(&self.ctx, TUTTI_NULL_PTX_C, TUTTI_NULL_ENTRY_C)?;
        let descs_len = size_of_val(descs.as_slice());
        let stop_at = descs_len.next_multiple_of(64);
        let reports_at = stop_at + 64;
        let len = reports_at + queues.len() * size_of::<TuttiNullReport>();
        let mem = PinnedBuf::new(&self.ctx, len.max(4096))?;
        // SAFETY: `len` bytes lie inside the fresh allocation; no kernel
        // uses it yet; the descriptors are plain data.
        unsafe {
            std::ptr::write_bytes(mem.ptr, 0, len);
            std::ptr::copy_nonoverlapping(descs.as_ptr().cast::<u8>(), mem.ptr, descs_len);
        }
        let stream = Stream::new(&self.ctx)?;
        let nq = u32::try_from(queues.len()).unwrap_or(u32::MAX);
        let (pq, pstop, preports) = (mem.dptr, mem.dptr + stop_at as u64, mem.dptr + reports_at as u64);
        let mut params: [*mut c_void; 5] = [
            (&pq as *const u64).cast_mut().cast(),
            (&nq as *const u32).cast_mut().cast(),
            (&ns_blocks as *const u64).cast_mut().cast(),
            (&pstop as *const u64).cast_mut().cast(),
            (&preports as *const u64).cast_mut().cast(),
        ];
        let blocks = (u64::from(nq) * 32).div_ceil(u64::from(THREADS)).max(1) as u32;
        // SAFETY: the parameters match `tutti_null_ctrl`'s signature (a
        // pointer, a u32, a u64, two pointers) and are copied by the launch;
        // the pinned memory they point into lives until the kernel ended
        // (`stop` or drop waits for the stream).
        unsafe { result::launch_kernel(func, (blocks, 1, 1), (THREADS, 1, 1), 0, stream.raw, &mut params) }
            .map_err(drv("cuLaunchKernel"))?;
        self.quiet.persistent_kernel(true);
        for q in queues {
            q.set_null_served(true);
        }
        Ok(NullControllers {
            quiet: self.quiet.clone(),
            served: queues.to_vec(),
            _gpu: std::marker::PhantomData,
            gave_up: false,
            mem: ManuallyDrop::new(mem),
            reports_at,
            stop_at,
            queues: queues.len(),
            stream,
            module: ManuallyDrop::new(module),
            stopped: false,
        })
    }
}

impl GpuQueue {
    /// This queue as the null controller serves it, from the host's SQ
    /// tail, CQ head and phase.
    fn null_descriptor(&self) -> TuttiNullQueue {
        let (sq_head, cq_head, phase) = self.host_indexes();
        TuttiNullQueue {
            sq: self.desc.sq,
            cq: self.desc.cq,
            sq_doorbell: self.desc.sq_doorbell,
            cq_doorbell: self.desc.cq_doorbell,
            size: self.desc.size,
            qid: self.desc.qid,
            sq_head,
            cq_tail_phase: cq_head | (u32::from(phase) << 31),
        }
    }
}

impl NullControllers<'_> {
    /// Tells every warp to stop once its queue is idle, waits for them (at
    /// most 10 s), and returns one report per queue, in the order given to
    /// [`Gpu::start_null_controllers`].
    ///
    /// # Errors
    ///
    /// [`GpuError::NullControllerStuck`] when the kernel has not ended in
    /// time (a queue kept busy), or the driver's error for the kernel.
    pub fn stop(mut self) -> Result<Vec<TuttiNullReport>, GpuError> {
        self.halt()?;
        let mut out = vec![TuttiNullReport::default(); self.queues];
        // SAFETY: the reports lie inside the allocation and the kernel that
        // wrote them has ended (`halt`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.mem.ptr.add(self.reports_at),
                out.as_mut_ptr().cast::<u8>(),
                size_of_val(out.as_slice()),
            );
        }
        Ok(out)
    }

    /// Sets the stop word and waits for the kernel.
    fn halt(&mut self) -> Result<(), GpuError> {
        if self.stopped {
            return Ok(());
        }
        if self.gave_up {
            return Err(GpuError::NullControllerStuck);
        }
        // SAFETY: the stop word lies inside the allocation, 4-byte aligned;
        // the kernel only reads it.
        unsafe { std::ptr::write_volatile(self.mem.ptr.add(self.stop_at).cast::<u32>(), 1) };
        if self.stream.bind().is_err() {
            return Err(GpuError::NullControllerStuck);
        }
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            // SAFETY: a live stream of this context.
            match unsafe { sys::cuStreamQuery(self.stream.raw) } {
                sys::CUresult::CUDA_ERROR_NOT_READY if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(100));
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => {
                    self.gave_up = true;
                    return Err(GpuError::NullControllerStuck);
                }
                _ => break,
            }
        }
        self.stopped = true;
        self.quiet.persistent_kernel(false);
        for q in &self.served {
            q.set_null_served(false);
        }
        self.stream.sync()
    }
}

impl Drop for NullControllers<'_> {
    /// Stops the kernel before its memory goes; one that never ends keeps
    /// its memory (leaked) rather than freeing it under a running kernel.
    fn drop(&mut self) {
        if self.halt().is_err() && !self.stopped {
            tracing::error!("gpu-io: null controllers did not stop; their memory and module are leaked");
            return;
        }
        // SAFETY: the kernel has ended (`halt`); each is dropped once, here.
        unsafe {
            ManuallyDrop::drop(&mut self.mem);
            ManuallyDrop::drop(&mut self.module);
        }
    }
}
