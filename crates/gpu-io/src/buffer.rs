//! [`GpuBuffer`]: GPU memory a KV block can live in, with its synchronous
//! copies (the emulator's asynchronous ones are in `emulated_dma.rs`).

use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::CudaContext;

use crate::copy_lanes::CopyLanes;
use crate::cuda::{DeviceMem, Stream};
use crate::error::{drv, GpuError};
use crate::gpu::Gpu;

/// GPU memory (`cuMemAlloc`) that a KV block can live in. The emulator
/// reaches it through CUDA copies ([`nvme_emu::ExternalMemory`]); a real
/// drive would reach it by peer DMA (not yet written, see docs/gpu.md).
///
/// Its copies and its drop are not gated by `Quiesce`: the emulator's
/// controller thread makes the copies (a running I/O kernel waits on
/// them) and may drop the last reference.
#[derive(Debug)]
pub struct GpuBuffer {
    /// The synchronous copies to and from this memory (`copy_in`/`copy_out`).
    pub(crate) copies: Stream,
    /// The GPU's copy lanes, for the emulator's asynchronous copies
    /// (`emulated_dma.rs`, `copy_lanes.rs`).
    pub(crate) lanes: Arc<CopyLanes>,
    pub(crate) mem: DeviceMem,
}

impl GpuBuffer {
    /// Allocates `len` zeroed bytes of GPU memory.
    /// Waits for running I/O kernels first (`Quiesce`).
    pub fn zeroed(gpu: &Gpu, len: usize) -> Result<Self, GpuError> {
        let _quiet = gpu.quiet.enter()?;
        Ok(Self {
            copies: Stream::new(&gpu.ctx)?,
            lanes: gpu.copy_lanes.clone(),
            mem: DeviceMem::zeroed(&gpu.ctx, len)?,
        })
    }

    /// Wraps GPU memory the caller owns (`len` bytes at device pointer
    /// `dptr` in this GPU's context); it is never freed here. Waits for
    /// running I/O kernels first (`Quiesce`).
    ///
    /// # Safety
    ///
    /// `dptr..dptr + len` must be a live allocation of this context for as
    /// long as the returned value (and any mapping of it) exists.
    pub unsafe fn from_raw(gpu: &Gpu, dptr: u64, len: usize) -> Result<Self, GpuError> {
        // Creating the copy streams is kept off running I/O kernels too.
        let _quiet = gpu.quiet.enter()?;
        Ok(Self {
            copies: Stream::new(&gpu.ctx)?,
            lanes: gpu.copy_lanes.clone(),
            mem: DeviceMem { ptr: dptr, len, owned: false, ctx: gpu.ctx.clone() },
        })
    }

    /// The context the memory belongs to.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.mem.ctx
    }

    /// Device pointer of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.mem.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// Copies `src` to byte `offset` (host to GPU).
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        self.check(offset, src.len())?;
        self.mem.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: offset + len is inside the allocation (checked); `src`
        // outlives the copy (synchronised before returning).
        unsafe { result::memcpy_htod_async(self.mem.ptr + offset as u64, src, self.copies.raw) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        self.copies.sync()
    }

    /// Copies `dst.len()` bytes from byte `offset` (GPU to host).
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        self.check(offset, dst.len())?;
        self.mem.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: offset + len is inside the allocation (checked); `dst`
        // outlives the copy (synchronised before returning).
        unsafe { result::memcpy_dtoh_async(dst, self.mem.ptr + offset as u64, self.copies.raw) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.copies.sync()
    }

    pub(crate) fn check(&self, offset: usize, len: usize) -> Result<(), GpuError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.mem.len => Ok(()),
            _ => Err(GpuError::BufferOutOfBounds { offset, len, size: self.mem.len }),
        }
    }
}
