//! The memory of checksum launches: [`CrcLayout`] (where each buffer
//! lies), [`CrcScratch`] (one launch's pinned and device memory) and
//! [`CrcScratchPool`] (scratch kept for reuse).

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use crate::abi::TuttiCrcItem;
use crate::cuda::{DeviceMem, PinnedBuf, Quiesce};
use crate::error::GpuError;

/// Byte offsets of one checksum launch's buffers (each 16-byte aligned).
/// In the scratch's mapped host memory: the items, the per-item task
/// offsets and the per-item results. In its device memory: a copy of the
/// items and offsets at the same offsets, then, zeroed before each launch,
/// the per-task chunk CRCs and the per-item done counters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CrcLayout {
    pub(crate) nitems: usize,
    pub(crate) items: usize,
    pub(crate) offsets: usize,
    pub(crate) out: usize,
    pub(crate) host_end: usize,
    pub(crate) chunk_crcs: usize,
    pub(crate) done: usize,
    pub(crate) dev_end: usize,
}

impl CrcLayout {
    pub(crate) fn new(nitems: usize, ntasks: usize) -> Self {
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
    pub(crate) host: PinnedBuf,
    pub(crate) dev: DeviceMem,
}

impl CrcScratch {
    fn fits(&self, l: &CrcLayout) -> bool {
        self.host.len >= l.host_end && self.dev.len >= l.dev_end
    }

    /// Copies `src`'s bytes to byte `at` of the host part.
    pub(crate) fn put<T: Copy>(&mut self, at: usize, src: &[T]) {
        let bytes = size_of_val(src);
        assert!(at + bytes <= self.host.len, "checksum scratch too small");
        // SAFETY: `at + bytes` lies inside the host part (checked); no
        // kernel reads it while the scratch is out of the pool and not yet
        // launched; T is plain data.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), self.host.ptr.add(at), bytes) };
    }

    /// The per-item results of the launch that used layout `l`.
    pub(crate) fn results(&self, l: &CrcLayout) -> Vec<u32> {
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
    pub(crate) fn take(
        &self,
        ctx: &Arc<CudaContext>,
        quiet: &Quiesce,
        l: &CrcLayout,
    ) -> Result<CrcScratch, GpuError> {
        {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = (0..free.len()).filter(|&i| free[i].fits(l)).min_by_key(|&i| free[i].dev.len) {
                return Ok(free.swap_remove(i));
            }
        }
        let _quiet = quiet.enter()?;
        let size = |b: usize| b.max(4096).next_power_of_two();
        Ok(CrcScratch {
            host: PinnedBuf::new(ctx, size(l.host_end))?,
            dev: DeviceMem::zeroed(ctx, size(l.dev_end))?,
        })
    }

    /// Returns a scratch no launch uses any more; one too large or beyond
    /// the pool's size is freed inside the gate.
    pub(crate) fn give(&self, scratch: CrcScratch, quiet: &Quiesce) {
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
