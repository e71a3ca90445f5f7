//! Memory the emulator reaches only through copies (GPU memory): the
//! [`ExternalMemory`] a driver maps, the fences of its asynchronous copies,
//! the page locking that lets those copies run at full speed, and the
//! copies one burst of commands started ([`PendingCopies`]).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Memory the emulator cannot address directly but can copy to and from,
/// such as GPU memory (copied with the CUDA driver API by `gpu-io`). Data
/// transfers (PRP-described buffers) may target it; queue memory may not.
pub trait ExternalMemory: Send + Sync + std::fmt::Debug {
    /// Size in bytes.
    fn len(&self) -> u64;
    /// `true` when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `dst.len()` bytes at byte `offset` into `dst`; `false` on
    /// failure (reported to the host as a Data Transfer Error).
    fn read(&self, offset: u64, dst: &mut [u8]) -> bool;
    /// Copies `src` to byte `offset`; `false` on failure.
    fn write(&self, offset: u64, src: &[u8]) -> bool;

    /// Starts copying `len` bytes at byte `offset` of this memory to host
    /// memory at `dst`, without waiting for the copy: the asynchronous half
    /// of an emulated DMA engine. The copy is complete once a [`CopyFence`]
    /// from a later [`ExternalMemory::fence`] has completed. `None` when
    /// this memory has no asynchronous copies (the controller then uses
    /// [`ExternalMemory::write`]/[`ExternalMemory::read`]), `Some(false)`
    /// when the copy is refused at once (a Data Transfer Error). An
    /// implementation may only note the copy and start it at the fence; a
    /// copy refused then fails that fence (every command of the burst that
    /// touched this memory ends with Data Transfer Error).
    ///
    /// # Safety
    ///
    /// `dst..dst + len` must stay allocated, and must not be read or
    /// written by anyone else, until that fence has completed.
    unsafe fn start_read(&self, offset: u64, dst: NonNull<u8>, len: usize) -> Option<bool> {
        let _ = (offset, dst, len);
        None
    }

    /// Starts copying `len` bytes of host memory at `src` to byte `offset`
    /// of this memory, without waiting; as [`ExternalMemory::start_read`].
    ///
    /// # Safety
    ///
    /// `src..src + len` must stay allocated and unchanged until the fence
    /// of a later [`ExternalMemory::fence`] has completed.
    unsafe fn start_write(&self, offset: u64, src: NonNull<u8>, len: usize) -> Option<bool> {
        let _ = (offset, src, len);
        None
    }

    /// A fence that completes once every copy the calling thread has
    /// started on this memory so far has ended (a controller thread makes
    /// a burst's copies and its fence; copies of other threads may run
    /// beside them; a fence may also cover later copies of other memories
    /// that share its stream). Infallible: an implementation that cannot make one
    /// waits for its copies itself and returns a completed fence.
    fn fence(&self) -> Box<dyn CopyFence> {
        Box::new(FenceState::Done)
    }
}

/// Where a [`CopyFence`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceState {
    /// Copies before it are still running.
    Pending,
    /// Every copy before it ended successfully.
    Done,
    /// A copy before it failed, or the fence itself could not be queried:
    /// the data did not (all) move.
    Failed,
}

/// The completion of asynchronous copies (an event recorded after them).
pub trait CopyFence: Send + Sync + std::fmt::Debug {
    /// Polls without blocking.
    fn state(&self) -> FenceState;
    /// Blocks until the copies before the fence have ended; never
    /// [`FenceState::Pending`].
    fn wait(&self) -> FenceState;
}

impl CopyFence for FenceState {
    fn state(&self) -> FenceState {
        *self
    }
    fn wait(&self) -> FenceState {
        match self {
            FenceState::Pending => FenceState::Failed,
            s => *s,
        }
    }
}

/// Page-locks host memory for a DMA engine's copies (`gpu-io` registers
/// it with CUDA), so that copies between it and external memory run
/// asynchronously and at the interconnect's speed.
pub trait PageLocker {
    /// Locks `len` bytes at `host`; the guard unlocks them when dropped.
    /// `None` when refused (copies then run from pageable memory).
    ///
    /// # Safety
    ///
    /// `host..host + len` must stay allocated until the guard is dropped.
    unsafe fn lock(&self, host: NonNull<u8>, len: usize) -> Option<Box<dyn HostPin>>;
}

/// Host memory page-locked by a [`PageLocker`] while it lives.
pub trait HostPin: Send + std::fmt::Debug {}

/// The copies started asynchronously during one burst (the commands one
/// poll iteration executed from the admin SQ, or from all I/O SQs) and the
/// memories they touch (held,
/// so that an unmap cannot release them while a copy runs): one fence per
/// memory, shared by the burst's commands.
#[derive(Debug)]
pub(crate) struct PendingCopies {
    fences: Vec<(Arc<dyn ExternalMemory>, Box<dyn CopyFence>)>,
    /// The final state once known (0: not yet, 1: done, 2: failed), so
    /// that commands sharing the burst ask the fences once.
    settled: AtomicU8,
}

impl PendingCopies {
    /// The burst's fences, one per memory, each with its memory.
    pub(crate) fn new(fences: Vec<(Arc<dyn ExternalMemory>, Box<dyn CopyFence>)>) -> Self {
        Self { fences, settled: AtomicU8::new(0) }
    }

    /// [`FenceState::Done`] once every fence is, [`FenceState::Failed`]
    /// once all have ended and one failed, [`FenceState::Pending`] before.
    pub(crate) fn state(&self) -> FenceState {
        match self.settled.load(Ordering::Relaxed) {
            1 => return FenceState::Done,
            2 => return FenceState::Failed,
            _ => {}
        }
        let mut all = FenceState::Done;
        for (_, f) in &self.fences {
            match f.state() {
                FenceState::Done => {}
                FenceState::Pending => return FenceState::Pending,
                FenceState::Failed => all = FenceState::Failed,
            }
        }
        self.settle(all)
    }

    /// Blocks until every copy has ended.
    pub(crate) fn wait(&self) -> FenceState {
        let mut all = FenceState::Done;
        for (_, f) in &self.fences {
            if f.wait() != FenceState::Done {
                all = FenceState::Failed;
            }
        }
        self.settle(all)
    }

    fn settle(&self, s: FenceState) -> FenceState {
        self.settled.store(if s == FenceState::Done { 1 } else { 2 }, Ordering::Relaxed);
        s
    }
}
