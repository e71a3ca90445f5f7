//! [`Quiesce`]: the gate of the GPU path's own CUDA memory management.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::cuda::event::KernelEvent;
use crate::cuda::stream::Stream;
use crate::error::{drv, GpuError};

/// The gate of the GPU path's own CUDA memory management (device
/// allocations and frees, memsets, synchronous copies, stream creation):
/// each runs only while no I/O kernel runs.
///
/// Why: an I/O kernel waits for completions that the emulator delivers
/// after CUDA copies from its controller thread (`GpuBuffer::copy_in` /
/// `copy_out`). On the H200 (2026-12-01), such a call made by another
/// thread while an I/O kernel ran (a checksum's buffers, a second launch's
/// descriptors) left the emulator's copies waiting behind the kernel,
/// and the kernel waiting for the copies until each command's budget
/// ended: puts of GPU memory in flight together timed out. Whatever the
/// driver's reason (an implicit device synchronisation in `cuMemFree`,
/// or the ordering the CUDA programming guide gives allocations and
/// memsets), none of this crate's calls of that kind now overlaps an I/O
/// kernel. Shown on the H200: see docs/gpu.md, "Memory management while
/// I/O kernels run".
///
/// Never entered by the emulator's controller thread (a `GpuBuffer`'s
/// copies, its asynchronous copies and fences, and its drop are not
/// gated), which the kernels wait on.
#[derive(Debug)]
pub(crate) struct Quiesce {
    /// The end events of the launches in flight (on any stream).
    lock: Mutex<Vec<Arc<KernelEvent>>>,
    /// The I/O kernels' own stream (launches that name no stream).
    pub(crate) io: Stream,
    /// Kernels that run until told to stop (GPU null controllers): while
    /// one runs, reusable memory is kept rather than freed (a CUDA free
    /// may wait for every kernel, this one included).
    persistent: std::sync::atomic::AtomicUsize,
}

impl Quiesce {
    pub(crate) fn new(io: Stream) -> Self {
        Self { lock: Mutex::new(Vec::new()), io, persistent: Default::default() }
    }

    /// Counts a kernel that runs until told to stop (`+1`) or its end.
    pub(crate) fn persistent_kernel(&self, started: bool) {
        use std::sync::atomic::Ordering;
        if started {
            self.persistent.fetch_add(1, Ordering::AcqRel);
        } else {
            self.persistent.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether memory may be freed now (no persistent kernel runs).
    pub(crate) fn may_free(&self) -> bool {
        self.persistent.load(std::sync::atomic::Ordering::Acquire) == 0
    }

    /// Returns `item` (a launch slot, a checksum scratch) to the pool
    /// `free` when `keep` says the pool wants it, or while a persistent
    /// kernel runs; otherwise frees it inside the gate (re-checking there:
    /// a persistent kernel starts inside the gate, and a free would wait
    /// for it).
    pub(crate) fn keep_or_free<T>(&self, free: &Mutex<Vec<T>>, item: T, keep: impl FnOnce(&[T]) -> bool) {
        let mut pool = free.lock().unwrap_or_else(|p| p.into_inner());
        if keep(&pool) || !self.may_free() {
            pool.push(item);
            return;
        }
        drop(pool);
        let gate = self.enter();
        if !self.may_free() {
            free.lock().unwrap_or_else(|p| p.into_inner()).push(item);
            return;
        }
        drop(item);
        drop(gate);
    }

    /// Takes the gate, then waits until every I/O kernel launched so far
    /// has ended (each command bounded by its launch's budget; the thread
    /// sleeps on each launch's event). Hold the guard across the memory
    /// management: no launch starts meanwhile.
    pub(crate) fn enter(&self) -> Result<MutexGuard<'_, Vec<Arc<KernelEvent>>>, GpuError> {
        let mut guard = self.lock();
        for e in guard.iter() {
            e.synchronize()?;
        }
        guard.clear();
        self.io.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        self.io.sync()?;
        Ok(guard)
    }

    /// The list of launches in flight, locked (a launch holds it while it
    /// queues its work and lists itself).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<Arc<KernelEvent>>> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unlists a launch that has ended.
    pub(crate) fn finished(&self, done: &Arc<KernelEvent>) {
        self.lock().retain(|e| !Arc::ptr_eq(e, done));
    }
}
