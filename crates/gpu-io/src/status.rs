//! What a launch reports per request ([`GpuStatus`], decoded from the
//! kernel's result words) and the limits of one launch.

use nvme_regs::Status;

use crate::abi::{STATUS_BAD_REQUEST, STATUS_NO_CID, STATUS_TIMEOUT, STATUS_UNSUPPORTED};

#[cfg(doc)]
use crate::Gpu;

/// Most queues one [`Gpu::launch`] serves (one block each; a request names
/// its queue with a `u16` index).
pub const MAX_QUEUES_PER_LAUNCH: usize = u16::MAX as usize;

/// Most requests one [`Gpu::launch`] takes (the kernel indexes them with
/// `u32`s).
pub const MAX_REQUESTS_PER_LAUNCH: usize = u32::MAX as usize;

/// Final state of one request of a GPU batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuStatus {
    /// Completed with NVMe status 0.
    Success,
    /// Completed with an NVMe error status.
    Nvme(Status),
    /// No completion within the budget.
    Timeout,
    /// Needs more than one PRP list page (more than 512 4 KiB pages after
    /// the first): not supported; split the transfer.
    Unsupported,
    /// Memory range or queue invalid.
    BadRequest,
    /// Not submitted: every CID of its queue is held by a command that
    /// timed out and never completed (the drive may still complete it).
    /// The queue needs a controller reset and `GpuQueue::recreate`.
    NoCid,
    /// The kernel did not reach it (a bug if ever seen).
    NotRun,
}

/// Result word the host writes before a launch.
pub(crate) const STATUS_NOT_RUN: u32 = 0x8000_00FF;

impl GpuStatus {
    /// Decodes the kernel's result word.
    pub fn from_word(w: u32) -> Self {
        match w {
            0 => GpuStatus::Success,
            STATUS_TIMEOUT => GpuStatus::Timeout,
            STATUS_UNSUPPORTED => GpuStatus::Unsupported,
            STATUS_BAD_REQUEST => GpuStatus::BadRequest,
            STATUS_NO_CID => GpuStatus::NoCid,
            w if w & 0x8000_0000 == 0 => GpuStatus::Nvme(Status::from_field((w << 1) as u16)),
            _ => GpuStatus::NotRun,
        }
    }
}
