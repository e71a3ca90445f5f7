//! [`Crc32cEngine`]: a [`Gpu`](crate::Gpu)'s checksum kernel
//! (`tutti_crc32c`), its module, its own stream and its scratch, and the
//! launch of one checksum batch.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext};

use crate::abi::TuttiCrcItem;
use crate::crc32c::scratch::{CrcLayout, CrcScratch, CrcScratchPool};
use crate::crc32c::tasks::task_offsets;
use crate::cuda::{Module, Quiesce, Stream};
use crate::error::{drv, GpuError};

/// Threads per block of the CRC kernel (its `__launch_bounds__`).
pub(crate) const THREADS: u32 = 256;

/// Blocks per multiprocessor the grid is sized for (each block holds 38 KiB
/// of tables in shared memory; warps stride over the tasks, so more blocks
/// only rebuild more tables).
const BLOCKS_PER_SM: u64 = 4;

/// A CUDA event for timing the kernel; destroyed on drop.
struct Event {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

impl Event {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let raw =
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(drv("cuEventCreate"))?;
        Ok(Self { raw, ctx: ctx.clone() })
    }

    fn record(&self, stream: sys::CUstream) -> Result<(), GpuError> {
        // SAFETY: `raw` is a live event and `stream` a live stream of the
        // same context.
        unsafe { result::event::record(self.raw, stream) }.map_err(drv("cuEventRecord"))
    }

    /// Time from `self` to `end`, both recorded and complete.
    fn until(&self, end: &Event) -> Result<Duration, GpuError> {
        // SAFETY: both events were created in this context, recorded on one
        // stream, and are alive.
        let ms = unsafe { result::event::elapsed(self.raw, end.raw) }.map_err(drv("cuEventElapsedTime"))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { result::event::destroy(self.raw) };
    }
}

/// The checksum kernel of one `Gpu` and what its launches reuse.
#[derive(Debug)]
pub(crate) struct Crc32cEngine {
    /// `tutti_crc32c` (see [`Gpu::crc32c`](crate::Gpu::crc32c)).
    func: sys::CUfunction,
    _module: Module,
    /// The checksum kernels' own stream, so that a checksum never waits
    /// behind an I/O launch on the I/O stream.
    stream: Stream,
    /// Device scratch of the checksum launches, reused across calls.
    scratch: CrcScratchPool,
    /// Multiprocessors of the device (sizes the checksum grid).
    sm_count: u64,
}

impl Crc32cEngine {
    /// The engine of `func` in the loaded `module`, launching on `stream`
    /// over a grid sized for `sm_count` multiprocessors.
    pub(crate) fn new(module: Module, func: sys::CUfunction, stream: Stream, sm_count: u64) -> Self {
        Self { func, _module: module, stream, scratch: Default::default(), sm_count }
    }

    /// Launches the CRC kernel over `items` and waits for it (with
    /// `timed`, also the kernel's own time, between two events). Its
    /// buffers come from the scratch pool: only a launch larger than every
    /// free scratch allocates (inside the gate, `Quiesce`), so checksums do
    /// not wait for running I/O kernels.
    ///
    /// # Safety
    ///
    /// Every item of non-zero length is readable device memory of this
    /// context until this returns.
    pub(crate) unsafe fn run(
        &self,
        ctx: &Arc<CudaContext>,
        quiet: &Quiesce,
        items: &[TuttiCrcItem],
        timed: bool,
    ) -> Result<(Vec<u32>, Duration), GpuError> {
        if items.is_empty() {
            return Ok((Vec::new(), Duration::ZERO));
        }
        let events = if timed { Some((Event::new(ctx)?, Event::new(ctx)?)) } else { None };
        // SAFETY: forwarded from this function's contract.
        let (scratch, layout) = unsafe { self.start(ctx, quiet, items, events.as_ref()) }?;
        let out = self.finish(quiet, scratch, &layout)?;
        let took = match &events {
            Some((start, end)) => start.until(end)?,
            None => Duration::ZERO,
        };
        Ok((out, took))
    }

    /// Takes a scratch and queues one checksum launch over `items` on the
    /// checksum stream. On an error the stream has been synchronised and
    /// the scratch returned.
    ///
    /// Nothing on the checksum stream ever waits for an I/O kernel: a
    /// stream that waits (`cuStreamWaitEvent`) blocks the hardware queue
    /// it shares with other streams (`CUDA_DEVICE_MAX_CONNECTIONS`), and
    /// with emulated drives the copies an I/O kernel waits for may sit in
    /// that queue behind the wait, until every command's budget has passed
    /// (H200, issue 23: KV restores of 63 objects and more timed out).
    /// Callers checksum a load after it has ended.
    ///
    /// # Safety
    ///
    /// As [`Crc32cEngine::run`], until [`Crc32cEngine::finish`] has returned.
    unsafe fn start(
        &self,
        ctx: &Arc<CudaContext>,
        quiet: &Quiesce,
        items: &[TuttiCrcItem],
        events: Option<&(Event, Event)>,
    ) -> Result<(CrcScratch, CrcLayout), GpuError> {
        let offsets = task_offsets(items)?;
        let layout = CrcLayout::new(items.len(), offsets[items.len()] as usize);
        let mut scratch = self.scratch.take(ctx, quiet, &layout)?;
        // SAFETY: the items' memory is readable (this function's contract).
        let r = unsafe { self.launch(ctx, &mut scratch, &layout, items, &offsets, events) };
        if let Err(e) = r {
            // Whatever was queued has ended before the scratch is reused.
            let _ = self.stream.sync();
            self.scratch.give(scratch, quiet);
            return Err(e);
        }
        Ok((scratch, layout))
    }

    /// Waits for the checksum stream (every launch queued on it so far),
    /// reads the results of the launch that used `scratch` and returns the
    /// scratch to the pool.
    fn finish(&self, quiet: &Quiesce, scratch: CrcScratch, layout: &CrcLayout) -> Result<Vec<u32>, GpuError> {
        // Whatever was queued has ended before the scratch is reused.
        let synced = self.stream.sync();
        let out = if synced.is_ok() { scratch.results(layout) } else { Vec::new() };
        self.scratch.give(scratch, quiet);
        synced.map(|()| out)
    }

    /// Writes the launch's inputs into the scratch's pinned host memory and
    /// queues their copy to the device part, the zeroing of the kernel's
    /// counters and the kernel on the checksum stream; the caller
    /// synchronises the stream before reading the results (which the
    /// kernel writes into the mapped host memory: no copy back).
    ///
    /// # Safety
    ///
    /// As [`Crc32cEngine::run`]; `scratch` was taken for layout `l`.
    unsafe fn launch(
        &self,
        ctx: &Arc<CudaContext>,
        scratch: &mut CrcScratch,
        l: &CrcLayout,
        items: &[TuttiCrcItem],
        offsets: &[u32],
        events: Option<&(Event, Event)>,
    ) -> Result<(), GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let stream = self.stream.raw;
        scratch.put(l.items, items);
        scratch.put(l.offsets, offsets);
        scratch.put(l.out, &vec![0u32; items.len()]);
        let ntasks = offsets[items.len()];
        let nitems = items.len() as u32; // <= ntasks <= u32::MAX (every item has a task)
        let (h, d) = (scratch.host.dptr, scratch.dev.ptr);
        // The inputs go to the device part in one copy from pinned memory
        // (the kernel's searches of the task offsets then stay on the
        // device); the chunk CRCs and counters are zeroed.
        // SAFETY: both ranges lie inside the scratch (`CrcLayout`), which
        // lives until the caller has synchronised the stream; the host part
        // is pinned and not written again before then.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(d, scratch.host.ptr.cast::<std::ffi::c_void>(), l.out, stream)
                .result()
                .map_err(drv("cuMemcpyHtoDAsync"))?;
            result::memset_d8_async(d + l.chunk_crcs as u64, 0, l.dev_end - l.chunk_crcs, stream)
                .map_err(drv("cuMemsetD8Async"))?;
        }
        let warps_per_block = u64::from(THREADS / 32);
        let blocks =
            u64::from(ntasks).div_ceil(warps_per_block).min(self.sm_count * BLOCKS_PER_SM).max(1) as u32;
        let (pi, po, pc, pd, pout) = (
            d + l.items as u64,
            d + l.offsets as u64,
            d + l.chunk_crcs as u64,
            d + l.done as u64,
            h + l.out as u64,
        );
        let mut params: [*mut std::ffi::c_void; 7] = [
            (&pi as *const u64).cast_mut().cast(),
            (&po as *const u64).cast_mut().cast(),
            (&nitems as *const u32).cast_mut().cast(),
            (&ntasks as *const u32).cast_mut().cast(),
            (&pc as *const u64).cast_mut().cast(),
            (&pd as *const u64).cast_mut().cast(),
            (&pout as *const u64).cast_mut().cast(),
        ];
        if let Some((start, _)) = events {
            start.record(stream)?;
        }
        // SAFETY: the parameters match `tutti_crc32c`'s signature (pointers,
        // u32, u32, pointers: 7 arguments) and are copied by the launch; the
        // scratch lives until the caller has synchronised the stream; the
        // items' memory is readable (this function's contract).
        unsafe { result::launch_kernel(self.func, (blocks, 1, 1), (THREADS, 1, 1), 0, stream, &mut params) }
            .map_err(drv("cuLaunchKernel"))?;
        if let Some((_, end)) = events {
            end.record(stream)?;
        }
        Ok(())
    }
}
