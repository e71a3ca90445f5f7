//! [`Stream`]: a non-blocking CUDA stream, destroyed on drop.

use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext};

use crate::error::{drv, GpuError};

/// A non-blocking CUDA stream: it never synchronises with the legacy
/// default stream, so a kernel that waits on the emulator and the
/// emulator's CUDA copies into GPU memory can run at the same time.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) raw: sys::CUstream,
    pub(crate) ctx: Arc<CudaContext>,
}

// SAFETY: a stream handle may be used from any thread with its context bound.
unsafe impl Send for Stream {}
// SAFETY: as above; CUDA serialises work on one stream itself.
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let raw =
            result::stream::create(result::stream::StreamKind::NonBlocking).map_err(drv("cuStreamCreate"))?;
        Ok(Self { raw, ctx: ctx.clone() })
    }

    /// Binds the stream's context to the calling thread.
    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    pub(crate) fn sync(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `raw` is a live stream of this context.
        unsafe { result::stream::synchronize(self.raw) }.map_err(drv("cuStreamSynchronize"))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in `new`, destroyed once, after its work (callers
        // synchronise before dropping).
        let _ = unsafe { result::stream::destroy(self.raw) };
    }
}
