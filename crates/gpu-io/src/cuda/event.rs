//! [`KernelEvent`]: the CUDA event that marks the end of one launch.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;

use crate::error::{drv, GpuError};

#[cfg(doc)]
use crate::Gpu;

/// A CUDA event that marks the end of one launch (`BLOCKING_SYNC`; with
/// timing only for a timed launch's pair of events). Shared by the launch,
/// the gate's list of launches in flight and the queues the launch used.
#[derive(Debug)]
pub(crate) struct KernelEvent {
    raw: sys::CUevent,
    /// The stream it is recorded on (a launch's end event: the launch's
    /// stream), so that a later launch on another stream knows it must
    /// not wait for it on the GPU ([`Gpu::wait_other_streams`]).
    pub(crate) stream: sys::CUstream,
    ctx: Arc<cudarc::driver::CudaContext>,
}

// SAFETY: an event handle may be recorded, queried, waited on and
// destroyed from any thread with its context bound (every call binds it).
unsafe impl Send for KernelEvent {}
// SAFETY: as above; the handle itself never changes after creation.
unsafe impl Sync for KernelEvent {}

impl KernelEvent {
    pub(crate) fn new(
        ctx: &Arc<cudarc::driver::CudaContext>,
        timing: bool,
        stream: sys::CUstream,
    ) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let mut flags = sys::CUevent_flags_enum::CU_EVENT_BLOCKING_SYNC as u32;
        if !timing {
            flags |= sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32;
        }
        // SAFETY: `raw` is a valid out-pointer.
        unsafe { sys::cuEventCreate(&mut raw, flags) }.result().map_err(drv("cuEventCreate"))?;
        Ok(Self { raw, stream, ctx: ctx.clone() })
    }

    /// The raw `CUevent`, for a caller's `cuStreamWaitEvent`.
    pub(crate) fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// Blocks (sleeping) until the work before the event has ended.
    pub(crate) fn synchronize(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: a live event of this context.
        unsafe { sys::cuEventSynchronize(self.raw) }.result().map_err(drv("cuEventSynchronize"))
    }

    /// GPU time from `start` to this event, both recorded with timing and
    /// both complete.
    pub(crate) fn elapsed_since(&self, start: &KernelEvent) -> Result<Duration, GpuError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let mut ms = 0f32;
        // SAFETY: two live events of this context; `ms` is a valid out-pointer.
        unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw) }
            .result()
            .map_err(drv("cuEventElapsedTime"))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    /// `true` once the work before the event has ended; never blocks.
    pub(crate) fn is_done(&self) -> bool {
        if self.ctx.bind_to_thread().is_err() {
            return false;
        }
        // SAFETY: a live event of this context.
        let r = unsafe { sys::cuEventQuery(self.raw) };
        r == sys::CUresult::CUDA_SUCCESS
    }
}

impl Drop for KernelEvent {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in `new`, destroyed once (CUDA defers the release
        // until the work before it has ended).
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}
