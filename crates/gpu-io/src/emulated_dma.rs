//! The emulator's DMA engine for GPU memory: how `nvme-emu` moves a
//! command's data between its RAM media and a [`GpuBuffer`].
//!
//! - Copies are asynchronous and batched: a command's copies are only
//!   noted when the controller starts them; the burst's fence queues the
//!   controller thread's noted copies on its lane, in one
//!   `cuMemcpyBatchAsync` per run of one direction, then a fence after
//!   them (a word the GPU writes, or an event: `copy_lanes.rs`). The
//!   emulator posts a CQE only once its fence has completed, so a
//!   completion still means the data has moved. The controller thread
//!   goes on fetching and executing the next commands meanwhile, and
//!   several drives copy at once, each on its own lane.
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
use nvme_emu::{CopyFence, ExternalMemory, HostPin, PageLocker};

use crate::buffer::GpuBuffer;
use crate::copy_lanes::{Deferred, Direction};
use crate::error::drv;
use crate::gpu::Gpu;

impl GpuBuffer {
    /// This buffer's key among the copy lanes' notes: its address, unique
    /// while it lives (the emulator holds it in an `Arc` from its first
    /// copy to the fence that covers it).
    fn owner_key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

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
        // Queued by the burst's fence, in one batch with its neighbours;
        // `dst` stays valid and untouched until that fence completes
        // (contract), and `off + len` lies inside the allocation (checked).
        let copy =
            Deferred { dir: Direction::DeviceToHost, dst: dst.as_ptr() as u64, src: self.mem.ptr + off, len };
        self.lanes.defer(self.owner_key(), copy);
        Some(true)
    }

    unsafe fn start_write(&self, offset: u64, src: NonNull<u8>, len: usize) -> Option<bool> {
        let Some(off) = self.checked(offset, len) else { return Some(false) };
        // As in `start_read`, the other direction.
        let copy =
            Deferred { dir: Direction::HostToDevice, dst: self.mem.ptr + off, src: src.as_ptr() as u64, len };
        self.lanes.defer(self.owner_key(), copy);
        Some(true)
    }

    fn fence(&self) -> Box<dyn CopyFence> {
        self.lanes.fence(self.owner_key())
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
