//! Launch slots: reusable pinned, GPU-mapped memory holding one launch's
//! inputs and statuses ([`LaunchSlot`], laid out by [`Layout`]), kept in a
//! [`SlotPool`].

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use crate::abi::{TuttiQueue, TuttiRequest};
use crate::cuda::{PinnedBuf, Quiesce};
use crate::error::GpuError;
use crate::status::GpuStatus;

/// Free slots kept for reuse.
const POOL_SLOTS: usize = 8;
/// Slots above this size are freed after use rather than kept.
const POOL_SLOT_MAX: usize = 16 << 20;
/// Smallest slot allocated.
const SLOT_MIN: usize = 64 << 10;

/// Byte offsets of one launch's inputs and statuses inside a slot (each
/// 16-byte aligned).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) queues: usize,
    pub(crate) reqs: usize,
    pub(crate) order: usize,
    pub(crate) offsets: usize,
    pub(crate) status: usize,
    /// Bytes in all.
    pub(crate) end: usize,
    pub(crate) n: usize,
}

impl Layout {
    pub(crate) fn new(nqueues: usize, n: usize) -> Self {
        let up = |x: usize| x.next_multiple_of(16);
        let queues = 0;
        let reqs = up(queues + nqueues * size_of::<TuttiQueue>());
        let order = up(reqs + n * size_of::<TuttiRequest>());
        let offsets = up(order + n * 4);
        let status = up(offsets + (nqueues + 1) * 4);
        let end = up(status + n * 4);
        Self { queues, reqs, order, offsets, status, end, n }
    }
}

/// Reusable pinned, GPU-mapped memory for one launch's inputs and
/// statuses.
#[derive(Debug)]
pub(crate) struct LaunchSlot {
    pub(crate) host: PinnedBuf,
}

impl LaunchSlot {
    fn cap(&self) -> usize {
        self.host.len
    }

    /// Copies `src`'s bytes to byte `at` of the staging memory.
    pub(crate) fn put<T: Copy>(&mut self, at: usize, src: &[T]) {
        let bytes = size_of_val(src);
        debug_assert!(at + bytes <= self.host.len);
        // SAFETY: `at + bytes` lies inside the buffer (the slot was chosen
        // for the layout); no kernel reads it while the slot is not in a
        // launch; T is plain data.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), self.host.ptr.add(at), bytes) };
    }

    pub(crate) fn statuses(&self, l: &Layout) -> Vec<GpuStatus> {
        let mut words = vec![0u32; l.n];
        // SAFETY: the status words lie inside the buffer, and the kernel
        // that wrote them has ended (the launch's event completed).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.host.ptr.add(l.status),
                words.as_mut_ptr().cast::<u8>(),
                l.n * 4,
            );
        }
        words.into_iter().map(GpuStatus::from_word).collect()
    }
}

/// The pool of free launch slots of one [`Gpu`](crate::Gpu).
#[derive(Debug, Default)]
pub(crate) struct SlotPool {
    free: Mutex<Vec<LaunchSlot>>,
}

impl SlotPool {
    /// A free slot of at least `bytes`, or a new one (allocated inside the
    /// gate: it waits for running kernels).
    pub(crate) fn take(
        &self,
        quiet: &Quiesce,
        ctx: &Arc<CudaContext>,
        bytes: usize,
    ) -> Result<LaunchSlot, GpuError> {
        {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) =
                (0..free.len()).filter(|&i| free[i].cap() >= bytes).min_by_key(|&i| free[i].cap())
            {
                return Ok(free.swap_remove(i));
            }
        }
        let cap = bytes.max(SLOT_MIN).next_power_of_two();
        let _quiet = quiet.enter()?;
        Ok(LaunchSlot { host: PinnedBuf::new(ctx, cap)? })
    }

    /// Returns a slot no launch uses any more; a large one, or one beyond
    /// the pool's size, is freed inside the gate.
    pub(crate) fn give(&self, slot: LaunchSlot, quiet: &Quiesce) {
        let small = slot.cap() <= POOL_SLOT_MAX;
        quiet.keep_or_free(&self.free, slot, |pool| small && pool.len() < POOL_SLOTS);
    }
}
