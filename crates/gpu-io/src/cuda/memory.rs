//! Memory the GPU reaches: device memory ([`DeviceMem`]), host memory
//! registered and mapped into the GPU ([`HostMapping`]) and pinned host
//! memory allocated mapped ([`PinnedBuf`]).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext};

use crate::error::{drv, GpuError};

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub(crate) struct DeviceMem {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) len: usize,
    /// `false` for memory the caller owns (never freed here).
    pub(crate) owned: bool,
    pub(crate) ctx: Arc<CudaContext>,
}

impl DeviceMem {
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: plain allocation in the bound context; freed in Drop.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }.map_err(drv("cuMemAlloc"))?;
        let mem = Self { ptr, len, owned: true, ctx: ctx.clone() };
        // SAFETY: `ptr` is a live allocation of at least `len` bytes.
        unsafe { result::memset_d8_sync(ptr, 0, len.max(1)) }.map_err(drv("cuMemsetD8"))?;
        Ok(mem)
    }

    pub(crate) fn from_slice<T: Copy>(ctx: &Arc<CudaContext>, data: &[T]) -> Result<Self, GpuError> {
        let mem = Self::zeroed(ctx, std::mem::size_of_val(data))?;
        if !data.is_empty() {
            // SAFETY: the allocation holds exactly `data`'s bytes; T is plain
            // data (Copy, repr(C) ABI structs or integers).
            unsafe { result::memcpy_htod_sync(mem.ptr, data) }.map_err(drv("cuMemcpyHtoD"))?;
        }
        Ok(mem)
    }

    pub(crate) fn read<T: Copy + Default>(&self, n: usize) -> Result<Vec<T>, GpuError> {
        let bytes = n.saturating_mul(size_of::<T>());
        if bytes > self.len {
            return Err(GpuError::DeviceReadPastEnd { bytes, size: self.len });
        }
        let mut v = vec![T::default(); n];
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `v` has room for n elements; the allocation holds at least
        // as many bytes (checked above).
        unsafe { result::memcpy_dtoh_sync(&mut v, self.ptr) }.map_err(drv("cuMemcpyDtoH"))?;
        Ok(v)
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `malloc_sync` in this context, freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Host memory registered with CUDA and mapped into the GPU's address space
/// (`cuMemHostRegister` with `DEVICEMAP | PORTABLE`); unregistered on drop.
#[derive(Debug)]
pub(crate) struct HostMapping {
    host: *mut c_void,
    pub(crate) dptr: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the mapping is an address pair; CUDA calls on it bind the context
// of the thread that makes them.
unsafe impl Send for HostMapping {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for HostMapping {}

impl HostMapping {
    /// # Safety
    ///
    /// `host..host + len` must stay allocated until the mapping is dropped,
    /// and must not overlap another registration.
    pub(crate) unsafe fn new(ctx: &Arc<CudaContext>, host: *mut u8, len: usize) -> Result<Self, GpuError> {
        // SAFETY: forwarded.
        unsafe { Self::with_flags(ctx, host, len, 0) }
    }

    /// As [`HostMapping::new`], adding `extra` registration flags (e.g.
    /// `CU_MEMHOSTREGISTER_IOMEMORY` for a device's MMIO window).
    ///
    /// # Safety
    ///
    /// As for [`HostMapping::new`].
    pub(crate) unsafe fn with_flags(
        ctx: &Arc<CudaContext>,
        host: *mut u8,
        len: usize,
        extra: u32,
    ) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP | extra;
        // SAFETY: forwarded from this function's contract.
        unsafe { sys::cuMemHostRegister_v2(host.cast(), len, flags) }
            .result()
            .map_err(drv("cuMemHostRegister"))?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` was registered with DEVICEMAP just above.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host.cast(), 0) }.result();
        let mapping = Self { host: host.cast(), dptr, ctx: ctx.clone() };
        r.map_err(drv("cuMemHostGetDevicePointer"))?;
        Ok(mapping)
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered in `new`, unregistered once.
        let _ = unsafe { sys::cuMemHostUnregister(self.host) };
    }
}

/// Pinned host memory from `cuMemHostAlloc`, mapped into the GPU
/// (`DEVICEMAP`), freed on drop.
#[derive(Debug)]
pub(crate) struct PinnedBuf {
    pub(crate) ptr: *mut u8,
    /// The GPU's address of the first byte.
    pub(crate) dptr: u64,
    pub(crate) len: usize,
    ctx: Arc<cudarc::driver::CudaContext>,
}

// SAFETY: plain memory owned by this value; CUDA calls bind the context.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    pub(crate) fn new(ctx: &Arc<cudarc::driver::CudaContext>, len: usize) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: `p` is a valid out-pointer; freed in Drop.
        unsafe { sys::cuMemHostAlloc(&mut p, len, flags) }.result().map_err(drv("cuMemHostAlloc"))?;
        let mut buf = Self { ptr: p.cast(), dptr: 0, len, ctx: ctx.clone() };
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `p` was allocated just above with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, p, 0) }
            .result()
            .map_err(drv("cuMemHostGetDevicePointer"))?;
        buf.dptr = dptr;
        Ok(buf)
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `cuMemHostAlloc` in `new`, freed once, after
        // every kernel or copy that uses it has ended: a launch slot is only
        // dropped when no launch uses it, a checksum scratch after its
        // stream was synchronised, the copy lanes' words after their
        // streams were (`CopyLanes`'s drop), the null controllers' memory
        // after their kernel ended.
        let _ = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}
