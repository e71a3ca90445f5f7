//! CRC32C (Castagnoli) of GPU-resident byte ranges, many per launch
//! (`kernels/tutti_crc32c.cu`): the standard CRC32C (reflected polynomial
//! 0x82F63B78, initial value 0xFFFFFFFF, final xor 0xFFFFFFFF), the value
//! the `crc32c` crate's `crc32c(&bytes)` returns for the same bytes.
//!
//! The host side here lays out the launch: each item's aligned 8-byte words
//! are cut into chunks of [`CRC32C_CHUNK_BYTES`], one warp per chunk, and
//! the kernel combines the chunk CRCs itself (see the source's header).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext};

use crate::abi::TuttiCrcItem;
use crate::gpu::{drv, DeviceMem, Gpu, GpuBuffer, GpuError, Quiesce};
use crate::launch::PinnedBuf;

/// Bytes of an item one warp checksums (`CHUNK_BYTES` in the kernel).
pub const CRC32C_CHUNK_BYTES: u64 = 8192;

/// Bytes the kernel reads per lane and round (`WORD_BYTES`).
const WORD_BYTES: u64 = 8;

/// Threads per block of the CRC kernel (its `__launch_bounds__`).
const THREADS: u32 = 256;

/// Blocks per multiprocessor the grid is sized for (each block holds 38 KiB
/// of tables in shared memory; warps stride over the tasks, so more blocks
/// only rebuild more tables).
const BLOCKS_PER_SM: u64 = 4;

/// Longest range one item may have, in bytes (2^48: far above any GPU's
/// memory; the kernel's arithmetic holds below 2^61).
pub const MAX_CRC32C_LEN: u64 = 1 << 48;

/// Most chunks (tasks) one launch takes: the kernel counts them in `u32`.
pub const MAX_CRC32C_TASKS: u64 = u32::MAX as u64;

/// `len` bytes at byte `offset` of a [`GpuBuffer`]: one object to checksum
/// with [`Gpu::crc32c`]. Bounds are checked there.
#[derive(Debug, Clone, Copy)]
pub struct GpuRange<'a> {
    buffer: &'a GpuBuffer,
    offset: usize,
    len: usize,
}

impl<'a> GpuRange<'a> {
    /// `len` bytes from byte `offset` of `buffer`.
    pub fn new(buffer: &'a GpuBuffer, offset: usize, len: usize) -> Self {
        Self { buffer, offset, len }
    }

    /// The whole buffer.
    pub fn all(buffer: &'a GpuBuffer) -> Self {
        Self { buffer, offset: 0, len: buffer.len() }
    }
}

/// Tasks (one warp each) of an item at device address `ptr` of `len` bytes:
/// one per started chunk of its aligned words, at least one (the kernel's
/// `layout_of` and task split, which must agree with this).
pub(crate) fn item_tasks(ptr: u64, len: u64) -> u64 {
    let to_aligned = (WORD_BYTES - ptr % WORD_BYTES) % WORD_BYTES;
    let words = (len - to_aligned.min(len)) / WORD_BYTES;
    words.div_ceil(CRC32C_CHUNK_BYTES / WORD_BYTES).max(1)
}

/// `first_task[i]` for every item and the total at the end (`items.len() + 1`
/// entries), or [`GpuError::Crc32cBatchTooLarge`].
fn task_offsets(items: &[TuttiCrcItem]) -> Result<Vec<u32>, GpuError> {
    let mut offsets = Vec::with_capacity(items.len() + 1);
    let mut total = 0u64;
    for it in items {
        offsets.push(total as u32);
        total += item_tasks(it.ptr, it.len);
        if total > MAX_CRC32C_TASKS {
            return Err(GpuError::Crc32cBatchTooLarge { items: items.len(), max_tasks: MAX_CRC32C_TASKS });
        }
    }
    offsets.push(total as u32);
    Ok(offsets)
}

/// `(device pointer, length)` ranges as kernel items, or
/// [`GpuError::Crc32cBadRange`] for one too long or wrapping.
fn raw_items(ranges: &[(u64, usize)]) -> Result<Vec<TuttiCrcItem>, GpuError> {
    let mut items = Vec::with_capacity(ranges.len());
    for (item, &(ptr, len)) in ranges.iter().enumerate() {
        let len64 = len as u64;
        if len64 > MAX_CRC32C_LEN || ptr.checked_add(len64).is_none() {
            return Err(GpuError::Crc32cBadRange { item, ptr, len });
        }
        items.push(TuttiCrcItem { ptr, len: len64 });
    }
    Ok(items)
}

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

impl Gpu {
    /// The standard CRC32C of each range, in order, computed on this GPU in
    /// one kernel launch (synchronous: returns when the kernel has ended).
    /// Empty ranges give 0, as `crc32c::crc32c(&[])` does. Its device
    /// buffers come from a pool, so it does not wait for running I/O
    /// kernels, except when it needs more scratch than any kept: that
    /// allocation waits for every I/O kernel of this `Gpu` launched so far
    /// (`Quiesce` in `gpu.rs`).
    ///
    /// The ranges are read on this `Gpu`'s checksum stream, which is not
    /// ordered with other CUDA streams: writes into the buffers made on
    /// another stream must have completed first ([`GpuBuffer::copy_in`]
    /// completes before it returns). Bytes written while the kernel runs
    /// give an unspecified checksum, never unsafety.
    ///
    /// # Errors
    ///
    /// [`GpuError::Crc32cOutOfBounds`] for a range past its buffer's end,
    /// [`GpuError::Crc32cForeignBuffer`] for a buffer of another [`Gpu`],
    /// [`GpuError::Crc32cBatchTooLarge`] past [`MAX_CRC32C_TASKS`] chunks,
    /// [`GpuError::Driver`] when CUDA fails.
    pub fn crc32c(&self, ranges: &[GpuRange<'_>]) -> Result<Vec<u32>, GpuError> {
        Ok(self.crc32c_ranges(ranges, false)?.0)
    }

    /// As [`Gpu::crc32c`], also returning the kernel's own time (CUDA
    /// events around the launch: no allocation or copy included).
    ///
    /// # Errors
    ///
    /// As for [`Gpu::crc32c`].
    pub fn crc32c_timed(&self, ranges: &[GpuRange<'_>]) -> Result<(Vec<u32>, Duration), GpuError> {
        self.crc32c_ranges(ranges, true)
    }

    fn crc32c_ranges(&self, ranges: &[GpuRange<'_>], timed: bool) -> Result<(Vec<u32>, Duration), GpuError> {
        let mut items = Vec::with_capacity(ranges.len());
        for (item, r) in ranges.iter().enumerate() {
            if !Arc::ptr_eq(r.buffer.context(), &self.ctx) {
                return Err(GpuError::Crc32cForeignBuffer { item });
            }
            let size = r.buffer.len();
            if r.offset.checked_add(r.len).is_none_or(|end| end > size) {
                return Err(GpuError::Crc32cOutOfBounds { item, offset: r.offset, len: r.len, size });
            }
            items.push(TuttiCrcItem { ptr: r.buffer.device_ptr() + r.offset as u64, len: r.len as u64 });
        }
        // SAFETY: every range lies inside a live GpuBuffer of this context
        // (checked above), which the borrows keep alive for the call.
        unsafe { self.run_crc32c(&items, timed) }
    }

    /// The standard CRC32C of each `(device pointer, length in bytes)`
    /// range, in order, in one launch (synchronous). Pointers may have any
    /// alignment; a range of length 0 is never read (its pointer may be 0).
    ///
    /// # Safety
    ///
    /// Each range of non-zero length must be device memory of this `Gpu`'s
    /// context (or mapped into it), readable by the GPU for the whole call.
    /// A range that is not faults the kernel, which leaves the CUDA context
    /// unusable for every later call.
    ///
    /// # Errors
    ///
    /// [`GpuError::Crc32cBadRange`] for a length above [`MAX_CRC32C_LEN`] or
    /// a range that wraps the address space, otherwise as [`Gpu::crc32c`].
    pub unsafe fn crc32c_raw(&self, ranges: &[(u64, usize)]) -> Result<Vec<u32>, GpuError> {
        let items = raw_items(ranges)?;
        // SAFETY: forwarded from this function's contract.
        Ok(unsafe { self.run_crc32c(&items, false) }?.0)
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
    unsafe fn run_crc32c(
        &self,
        items: &[TuttiCrcItem],
        timed: bool,
    ) -> Result<(Vec<u32>, Duration), GpuError> {
        if items.is_empty() {
            return Ok((Vec::new(), Duration::ZERO));
        }
        let events = if timed { Some((Event::new(&self.ctx)?, Event::new(&self.ctx)?)) } else { None };
        // SAFETY: forwarded from this function's contract.
        let (scratch, layout) = unsafe { self.start_crc32c(items, events.as_ref()) }?;
        let out = self.finish_crc32c(scratch, &layout)?;
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
    /// As [`Gpu::run_crc32c`], until [`Gpu::finish_crc32c`] has returned.
    unsafe fn start_crc32c(
        &self,
        items: &[TuttiCrcItem],
        events: Option<&(Event, Event)>,
    ) -> Result<(CrcScratch, CrcLayout), GpuError> {
        let offsets = task_offsets(items)?;
        let layout = CrcLayout::new(items.len(), offsets[items.len()] as usize);
        let mut scratch = self.crc_scratch.take(self, &layout)?;
        // SAFETY: the items' memory is readable (this function's contract).
        let r = unsafe { self.crc_launch(&mut scratch, &layout, items, &offsets, events) };
        if let Err(e) = r {
            // Whatever was queued has ended before the scratch is reused.
            let _ = self.crc_stream.sync();
            self.crc_scratch.give(scratch, &self.quiet);
            return Err(e);
        }
        Ok((scratch, layout))
    }

    /// Waits for the checksum stream (every launch queued on it so far),
    /// reads the results of the launch that used `scratch` and returns the
    /// scratch to the pool.
    fn finish_crc32c(&self, scratch: CrcScratch, layout: &CrcLayout) -> Result<Vec<u32>, GpuError> {
        // Whatever was queued has ended before the scratch is reused.
        let synced = self.crc_stream.sync();
        let out = if synced.is_ok() { scratch.results(layout) } else { Vec::new() };
        self.crc_scratch.give(scratch, &self.quiet);
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
    /// As [`Gpu::run_crc32c`]; `scratch` was taken for layout `l`.
    unsafe fn crc_launch(
        &self,
        scratch: &mut CrcScratch,
        l: &CrcLayout,
        items: &[TuttiCrcItem],
        offsets: &[u32],
        events: Option<&(Event, Event)>,
    ) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let stream = self.crc_stream.raw;
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
        unsafe {
            result::launch_kernel(self.crc_func, (blocks, 1, 1), (THREADS, 1, 1), 0, stream, &mut params)
        }
        .map_err(drv("cuLaunchKernel"))?;
        if let Some((_, end)) = events {
            end.record(stream)?;
        }
        Ok(())
    }
}

/// Byte offsets of one checksum launch's buffers (each 16-byte aligned).
/// In the scratch's mapped host memory: the items, the per-item task
/// offsets and the per-item results. In its device memory: a copy of the
/// items and offsets at the same offsets, then, zeroed before each launch,
/// the per-task chunk CRCs and the per-item done counters.
#[derive(Debug, Clone, Copy)]
struct CrcLayout {
    nitems: usize,
    items: usize,
    offsets: usize,
    out: usize,
    host_end: usize,
    chunk_crcs: usize,
    done: usize,
    dev_end: usize,
}

impl CrcLayout {
    fn new(nitems: usize, ntasks: usize) -> Self {
        let up = |x: usize| x.next_multiple_of(16);
        let items = 0;
        let offsets = up(nitems * size_of::<TuttiCrcItem>());
        let out = up(offsets + (nitems + 1) * 4);
        let host_end = up(out + nitems * 4);
        let chunk_crcs = out;
        let done = up(chunk_crcs + ntasks * 4);
        let dev_end = up(done + nitems * 4);
        Self { nitems, items, offsets, out, host_end, chunk_crcs, done, dev_end }
    }
}

/// Free scratch allocations kept for checksum launches.
const CRC_SCRATCH_KEPT: usize = 4;

/// Largest scratch (either part, bytes) kept for reuse; larger ones are
/// freed after their launch.
const CRC_SCRATCH_MAX: usize = 64 << 20;

/// The memory of one checksum launch: pinned host memory mapped into the
/// GPU (inputs and results: written and read by the host in place, so the
/// checksum stream carries no copies) and device memory (the kernel's
/// atomics).
#[derive(Debug)]
pub(crate) struct CrcScratch {
    host: PinnedBuf,
    dev: DeviceMem,
}

impl CrcScratch {
    fn fits(&self, l: &CrcLayout) -> bool {
        self.host.len >= l.host_end && self.dev.len >= l.dev_end
    }

    /// Copies `src`'s bytes to byte `at` of the host part.
    fn put<T: Copy>(&mut self, at: usize, src: &[T]) {
        let bytes = size_of_val(src);
        assert!(at + bytes <= self.host.len, "checksum scratch too small");
        // SAFETY: `at + bytes` lies inside the host part (checked); no
        // kernel reads it while the scratch is out of the pool and not yet
        // launched; T is plain data.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), self.host.ptr.add(at), bytes) };
    }

    /// The per-item results of the launch that used layout `l`.
    fn results(&self, l: &CrcLayout) -> Vec<u32> {
        let n = l.nitems;
        let mut out = vec![0u32; n];
        // SAFETY: the results lie inside the host part, and the kernel that
        // wrote them has ended (the stream was synchronised).
        unsafe {
            std::ptr::copy_nonoverlapping(self.host.ptr.add(l.out), out.as_mut_ptr().cast::<u8>(), n * 4)
        };
        out
    }
}

/// Reusable memory for checksum launches, one scratch per launch in flight.
#[derive(Debug, Default)]
pub(crate) struct CrcScratchPool {
    free: Mutex<Vec<CrcScratch>>,
}

impl CrcScratchPool {
    /// The smallest free scratch that fits `l`, or a new one (allocated
    /// inside the gate: it waits for running I/O kernels).
    fn take(&self, gpu: &Gpu, l: &CrcLayout) -> Result<CrcScratch, GpuError> {
        {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = (0..free.len()).filter(|&i| free[i].fits(l)).min_by_key(|&i| free[i].dev.len) {
                return Ok(free.swap_remove(i));
            }
        }
        let _quiet = gpu.quiet.enter()?;
        let size = |b: usize| b.max(4096).next_power_of_two();
        Ok(CrcScratch {
            host: PinnedBuf::new(&gpu.ctx, size(l.host_end))?,
            dev: DeviceMem::zeroed(&gpu.ctx, size(l.dev_end))?,
        })
    }

    /// Returns a scratch no launch uses any more; one too large or beyond
    /// the pool's size is freed inside the gate.
    fn give(&self, scratch: CrcScratch, quiet: &Quiesce) {
        let small = scratch.dev.len <= CRC_SCRATCH_MAX && scratch.host.len <= CRC_SCRATCH_MAX;
        quiet.keep_or_free(&self.free, scratch, |pool| small && pool.len() < CRC_SCRATCH_KEPT);
    }
}

#[cfg(test)]
mod layout_tests {
    use super::CrcLayout;

    /// Every buffer is 16-byte aligned, holds what the launch puts in it,
    /// and none overlaps the next; the zeroed part starts at the chunk CRCs.
    #[test]
    fn the_scratch_layout_holds_each_buffer_apart_and_aligned() {
        for (nitems, ntasks) in [(1, 1), (3, 7), (1000, 1000), (5, 1 << 20), (4097, 9000)] {
            let l = CrcLayout::new(nitems, ntasks);
            let host = [(l.items, nitems * 16), (l.offsets, (nitems + 1) * 4), (l.out, nitems * 4)];
            let dev = [
                (l.items, nitems * 16),
                (l.offsets, (nitems + 1) * 4),
                (l.chunk_crcs, ntasks * 4),
                (l.done, nitems * 4),
            ];
            for (spans, end) in [(&host[..], l.host_end), (&dev[..], l.dev_end)] {
                for w in spans.windows(2) {
                    assert!(w[0].0 + w[0].1 <= w[1].0, "{nitems} items, {ntasks} tasks: {spans:?}");
                }
                assert!(spans.iter().all(|(at, _)| at.is_multiple_of(16)));
                let (last, len) = spans[spans.len() - 1];
                assert!(last + len <= end && end.is_multiple_of(16));
            }
            assert!(l.chunk_crcs >= l.offsets + (nitems + 1) * 4, "the inputs' copy is not zeroed");
            assert!(l.out + l.nitems * 4 <= l.host_end, "one result per item");
        }
    }
}

/// A CPU model of `kernels/tutti_crc32c.cu`, step for step (tables, lanes,
/// rotation, shuffle trees, chunk combination, head and tail), so that the
/// kernel's math is checked against the `crc32c` crate without a GPU.
#[cfg(test)]
mod model {
    use super::{item_tasks, CRC32C_CHUNK_BYTES, WORD_BYTES};

    const POLY: u32 = 0x82F6_3B78;
    const LANES: usize = 32;
    const CHUNK_WORDS: usize = (CRC32C_CHUNK_BYTES / WORD_BYTES) as usize;
    const LOG2_CHUNK_BITS: u32 = 16;
    /// The kernel's kTableJ and the group indices into it.
    const TABLE_J: [u64; 36] = [
        0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15, 28, 29, 30, 31, 60, 61, 62, 63, 124, 125, 126, 127, 248, 249,
        250, 251, 252, 253, 254, 255, 8188, 8189, 8190, 8191,
    ];
    const PLAIN: usize = 0;
    const PADDED: usize = 24;
    const SCHUNK: usize = 32;
    const TREE: [usize; 5] = [4, 8, 12, 16, 20];

    pub(super) fn multmodp(a: u32, mut b: u32) -> u32 {
        let mut p = 0;
        for i in (0..32).rev() {
            if a & (1 << i) != 0 {
                p ^= b;
            }
            b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        }
        p
    }

    /// x^(2^k) mod P for k = 0..31 (the kernel's kX2n, plus k = 31).
    pub(super) fn x2n() -> [u32; 32] {
        let mut t = [0u32; 32];
        t[0] = 1 << 30;
        for k in 1..32 {
            t[k] = multmodp(t[k - 1], t[k - 1]);
        }
        t
    }

    fn x8nmodp(mut n: u64) -> u32 {
        let t = x2n();
        let (mut p, mut k) = (1u32 << 31, 3usize);
        while n != 0 {
            if n & 1 != 0 {
                p = multmodp(t[k], p);
            }
            n >>= 1;
            k = if k == 30 { 0 } else { k + 1 };
        }
        p
    }

    pub(super) struct Tables(Vec<[u32; 256]>);

    pub(super) fn tables() -> Tables {
        let mut tab = vec![[0u32; 256]; TABLE_J.len()];
        for (table, &j) in tab.iter_mut().zip(TABLE_J.iter()) {
            let op = x8nmodp(j);
            let basis: Vec<u32> = (0..8)
                .map(|i| {
                    let mut c = 1u32 << i;
                    for _ in 0..8 {
                        c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
                    }
                    multmodp(op, c)
                })
                .collect();
            for (b, entry) in table.iter_mut().enumerate() {
                *entry = (0..8).filter(|i| b & (1 << i) != 0).fold(0, |v, i| v ^ basis[i]);
            }
        }
        Tables(tab)
    }

    impl Tables {
        fn shift4(&self, g: usize, c: u32) -> u32 {
            let t = &self.0;
            t[g + 3][(c & 0xff) as usize]
                ^ t[g + 2][((c >> 8) & 0xff) as usize]
                ^ t[g + 1][((c >> 16) & 0xff) as usize]
                ^ t[g][(c >> 24) as usize]
        }

        fn fold(&self, base: usize, c: u32, w: u64) -> u32 {
            let lo = (w as u32) ^ c;
            let hi = (w >> 32) as u32;
            self.shift4(base + 4, lo) ^ self.shift4(base, hi)
        }
    }

    /// `chunk_crc`: the 32 lanes, the rotation and the shuffle tree.
    fn chunk_crc(tab: &Tables, words: &[u64]) -> u32 {
        let nw = words.len();
        let mut c: Vec<u32> = (0..LANES)
            .map(|lane| {
                let mine = nw / LANES + usize::from(lane < nw % LANES);
                let mut s = 0;
                for r in 0..mine {
                    let base = if r + 1 < mine { PADDED } else { PLAIN };
                    s = tab.fold(base, s, words[r * LANES + lane]);
                }
                s
            })
            .collect();
        c = (0..LANES).map(|u| c[(u + nw % LANES) % LANES]).collect();
        for (k, &g) in TREE.iter().enumerate() {
            // __shfl_down_sync: a lane whose source is past 31 keeps its own.
            let right: Vec<u32> =
                (0..LANES).map(|u| c[if u + (1 << k) < LANES { u + (1 << k) } else { u }]).collect();
            c = (0..LANES).map(|u| tab.shift4(g, c[u]) ^ right[u]).collect();
        }
        c[0]
    }

    /// `combine_chunks`.
    fn combine_chunks(tab: &Tables, crcs: &[u32]) -> u32 {
        let m = crcs.len() as u64;
        if m == 0 {
            return 0;
        }
        let mut lg = 2u32;
        while ((LANES as u64) << lg) < m {
            lg += 1;
        }
        let (g, t) = (1u64 << lg, x2n());
        let (q, lead) = (g / 4, LANES as u64 * g - m);
        let mut c: Vec<u32> = (0..LANES as u64)
            .map(|lane| {
                let mut acc = [0u32; 4];
                for j in 0..q {
                    for (s, a) in acc.iter_mut().enumerate() {
                        let v = lane * g + s as u64 * q + j;
                        let x = if v >= lead { crcs[(v - lead) as usize] } else { 0 };
                        *a = tab.shift4(SCHUNK, *a) ^ x;
                    }
                }
                let op = t[((LOG2_CHUNK_BITS + lg - 2) % 31) as usize];
                acc[1..].iter().fold(acc[0], |c, &a| multmodp(op, c) ^ a)
            })
            .collect();
        for k in 0..5u32 {
            let op = t[((LOG2_CHUNK_BITS + lg + k) % 31) as usize];
            let right: Vec<u32> =
                (0..LANES).map(|u| c[if u + (1 << k) < LANES { u + (1 << k) } else { u }]).collect();
            c = (0..LANES).map(|u| multmodp(op, c[u]) ^ right[u]).collect();
        }
        c[0]
    }

    /// The whole kernel for one item whose first byte sits at an address
    /// `addr` (only its alignment matters).
    pub(super) fn crc32c(tab: &Tables, addr: u64, bytes: &[u8]) -> u32 {
        let len = bytes.len() as u64;
        let head = ((WORD_BYTES - addr % WORD_BYTES) % WORD_BYTES).min(len) as usize;
        let words: Vec<u64> = bytes[head..]
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        let n = item_tasks(addr, len) as usize;
        let chunk_crcs: Vec<u32> = (0..n)
            .map(|j| {
                chunk_crc(
                    tab,
                    &words[(j * CHUNK_WORDS).min(words.len())..((j + 1) * CHUNK_WORDS).min(words.len())],
                )
            })
            .collect();
        let front = combine_chunks(tab, &chunk_crcs[..n - 1]);
        let last_words = (words.len() - (n - 1) * CHUNK_WORDS) as u64;
        let body = multmodp(x8nmodp(last_words * WORD_BYTES), front) ^ chunk_crcs[n - 1];
        let fold_byte = |r: u32, b: u8| tab.0[PLAIN][((r ^ u32::from(b)) & 0xff) as usize] ^ (r >> 8);
        let mut r = bytes[..head].iter().fold(0xFFFF_FFFFu32, |r, &b| fold_byte(r, b));
        r = multmodp(x8nmodp(words.len() as u64 * WORD_BYTES), r) ^ body;
        let tail = &bytes[head + words.len() * 8..];
        !tail.iter().fold(r, |r, &b| fold_byte(r, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64: reproducible test bytes without a dependency.
    fn bytes(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn the_model_of_the_kernel_matches_the_crc32c_crate() {
        let tab = model::tables();
        let data = bytes(3 << 20, 7);
        let c = CRC32C_CHUNK_BYTES as usize;
        let lens = [
            0,
            1,
            2,
            3,
            4,
            7,
            8,
            9,
            15,
            16,
            17,
            255,
            256,
            257,
            263,
            511,
            512,
            2047,
            c - 1,
            c,
            c + 1,
            c + 5,
            2 * c,
            2 * c + 9,
            3 * c + 256 * 5 + 8 * 3 + 5,
            129 * c + 3,
            (1 << 20) + 5,
            300 * c - 1,
            (2 << 20) + 77,
        ];
        for len in lens {
            for addr in 0..9u64 {
                let b = &data[addr as usize..addr as usize + len];
                assert_eq!(
                    model::crc32c(&tab, 0x7000_0000 + addr, b),
                    crc32c::crc32c(b),
                    "len {len} addr {addr}"
                );
            }
        }
    }

    #[test]
    fn the_kernels_constants_match_the_host() {
        let src = include_str!("../../../kernels/tutti_crc32c.cu");
        let table = src.split("kX2n[31] = {").nth(1).and_then(|s| s.split("};").next()).unwrap_or("");
        let parsed: Vec<u32> = table
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0))
            .collect();
        let x2n = model::x2n();
        assert_eq!(parsed, x2n[..31].to_vec());
        assert_eq!(x2n[31], x2n[0], "x^(2^k) has period 31 for CRC32C");
        assert!(src.contains(&format!("#define CHUNK_BYTES {CRC32C_CHUNK_BYTES}u ")));
        assert!(src.contains(&format!("#define WORD_BYTES {WORD_BYTES} ")));
        assert_eq!(1u64 << 16, 8 * CRC32C_CHUNK_BYTES, "LOG2_CHUNK_BITS");
        assert!(src.contains(&format!("__launch_bounds__({THREADS})")));
    }

    #[test]
    fn tasks_cover_every_chunk_and_at_least_one() {
        let c = CRC32C_CHUNK_BYTES;
        assert_eq!(item_tasks(0, 0), 1);
        assert_eq!(item_tasks(3, 4), 1);
        assert_eq!(item_tasks(0, c), 1);
        assert_eq!(item_tasks(0, c + 8), 2);
        assert_eq!(item_tasks(1, c + 7), 1, "7 head bytes, then c bytes of words");
        assert_eq!(item_tasks(1, c + 15), 2);
        let items = [TuttiCrcItem { ptr: 0, len: 0 }, TuttiCrcItem { ptr: 8, len: 3 * c }];
        assert_eq!(task_offsets(&items).unwrap_or_default(), vec![0, 1, 4]);
    }
}
