//! The emulator's DMA engine for GPU memory: how `nvme-emu` moves a
//! command's data between its RAM media and a [`GpuBuffer`].
//!
//! - Copies are asynchronous: a command's copies are queued on the
//!   buffer's copy stream (`cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync`) and
//!   an event recorded after them is the command's fence ([`CopyEvent`]);
//!   the emulator posts the CQE only once the event has completed, so a
//!   completion still means the data has moved. The controller thread
//!   goes on fetching and executing the next commands meanwhile, and
//!   several drives' buffers copy on their own streams at once.
//! - The RAM media is page-locked ([`Gpu`] as a [`PageLocker`],
//!   `cuMemHostRegister`), which makes those copies truly asynchronous
//!   and lets them run at the interconnect's speed (pageable copies are
//!   staged by the driver and, device to host, synchronous).
//!
//! The synchronous `read`/`write` remain for data that is not in the RAM
//! media (the file store's bounce buffer, Identify data and log pages).

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};
use nvme_emu::{CopyFence, ExternalMemory, FenceState, HostPin, PageLocker};

use crate::gpu::{drv, Gpu, GpuBuffer};

impl ExternalMemory for GpuBuffer {
    fn len(&self) -> u64 {
        self.len() as u64
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> bool {
        usize::try_from(offset).is_ok_and(|o| self.copy_out(o, dst).is_ok())
    }

    fn write(&self, offset: u64, src: &[u8]) -> bool {
        usize::try_from(offset).is_ok_and(|o| self.copy_in(o, src).is_ok())
    }

    unsafe fn start_read(&self, offset: u64, dst: NonNull<u8>, len: usize) -> Option<bool> {
        let Some(off) = self.checked(offset, len) else { return Some(false) };
        if self.mem.ctx.bind_to_thread().is_err() {
            return Some(false);
        }
        // SAFETY: `off + len` lies inside the allocation (checked); `dst`
        // stays valid and untouched until the fence completes (contract).
        let r = unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_ptr().cast::<c_void>(), self.mem.ptr + off, len, self.copies.raw)
        };
        Some(r.result().is_ok())
    }

    unsafe fn start_write(&self, offset: u64, src: NonNull<u8>, len: usize) -> Option<bool> {
        let Some(off) = self.checked(offset, len) else { return Some(false) };
        if self.mem.ctx.bind_to_thread().is_err() {
            return Some(false);
        }
        // SAFETY: as in `start_read`, the other direction.
        let r = unsafe {
            sys::cuMemcpyHtoDAsync_v2(self.mem.ptr + off, src.as_ptr().cast::<c_void>(), len, self.copies.raw)
        };
        Some(r.result().is_ok())
    }

    fn fence(&self) -> Box<dyn CopyFence> {
        match CopyEvent::record(&self.mem.ctx, self.copies.raw) {
            Some(e) => Box::new(e),
            // No event: wait for the stream here instead.
            None => Box::new(if self.copies.sync().is_ok() { FenceState::Done } else { FenceState::Failed }),
        }
    }
}

impl GpuBuffer {
    /// `offset` as a device-pointer offset when `offset..offset + len` lies
    /// inside the buffer.
    fn checked(&self, offset: u64, len: usize) -> Option<u64> {
        let o = usize::try_from(offset).ok()?;
        self.check(o, len).ok()?;
        Some(offset)
    }
}

/// A CUDA event recorded after a command's copies: its fence.
#[derive(Debug)]
struct CopyEvent {
    event: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: an event handle may be queried and destroyed from any thread with
// its context bound (each call below binds it).
unsafe impl Send for CopyEvent {}
// SAFETY: as above; the driver API is thread-safe and the handle is never
// changed after `record`.
unsafe impl Sync for CopyEvent {}

impl CopyEvent {
    /// Creates an event (no timing) and records it on `stream`; `None` if
    /// either call fails.
    fn record(ctx: &Arc<CudaContext>, stream: sys::CUstream) -> Option<Self> {
        ctx.bind_to_thread().ok()?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: `event` is a valid out-pointer.
        unsafe { sys::cuEventCreate(&mut event, flags) }.result().ok()?;
        let e = Self { event, ctx: ctx.clone() };
        // SAFETY: both handles are live in this context.
        unsafe { sys::cuEventRecord(e.event, stream) }.result().ok()?;
        Some(e)
    }
}

impl CopyFence for CopyEvent {
    fn state(&self) -> FenceState {
        if self.ctx.bind_to_thread().is_err() {
            return FenceState::Failed;
        }
        // SAFETY: a live event of this context.
        match unsafe { sys::cuEventQuery(self.event) } {
            sys::CUresult::CUDA_SUCCESS => FenceState::Done,
            sys::CUresult::CUDA_ERROR_NOT_READY => FenceState::Pending,
            _ => FenceState::Failed,
        }
    }

    fn wait(&self) -> FenceState {
        if self.ctx.bind_to_thread().is_err() {
            return FenceState::Failed;
        }
        // SAFETY: a live event of this context.
        match unsafe { sys::cuEventSynchronize(self.event) }.result() {
            Ok(()) => FenceState::Done,
            Err(_) => FenceState::Failed,
        }
    }
}

impl Drop for CopyEvent {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in `record`, destroyed once; CUDA releases it once
        // the work before it has ended.
        let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
    }
}

/// Host memory page-locked with `cuMemHostRegister` (`PORTABLE`): the
/// emulator's RAM media. Unregistered on drop.
#[derive(Debug)]
struct LockedHost {
    host: *mut c_void,
    ctx: Arc<CudaContext>,
}

// SAFETY: an address; CUDA calls on it bind the context first.
unsafe impl Send for LockedHost {}

impl HostPin for LockedHost {}

impl Drop for LockedHost {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered in `Gpu::lock`, unregistered once.
        let _ = unsafe { sys::cuMemHostUnregister(self.host) };
    }
}

impl PageLocker for Gpu {
    /// Registers `len` bytes at `host` with CUDA (waits for running I/O
    /// kernels first, as all of this crate's memory management does).
    /// `None` when the driver refuses (for example over the locked-memory
    /// limit); a warning is logged.
    unsafe fn lock(&self, host: NonNull<u8>, len: usize) -> Option<Box<dyn HostPin>> {
        let _quiet = self.quiet.enter().ok()?;
        self.ctx.bind_to_thread().ok()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller keeps `host..host + len` allocated until the
        // returned guard is dropped.
        let r = unsafe { sys::cuMemHostRegister_v2(host.as_ptr().cast(), len, flags) }.result();
        match r.map_err(drv("cuMemHostRegister")) {
            Ok(()) => Some(Box::new(LockedHost { host: host.as_ptr().cast(), ctx: self.ctx.clone() })),
            Err(e) => {
                tracing::warn!(error = %e, len, "gpu-io: emulated media stays pageable (copies slower)");
                None
            }
        }
    }
}
