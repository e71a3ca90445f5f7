//! Errors of the runtime API and per-request statuses.

use nvme_regs::Status;

use crate::config::ConfigError;
use crate::handle::HandleError;

/// Errors of runtime calls (as opposed to the per-request statuses of a
/// batch, [`RequestError`] and [`RequestStatus`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration was refused.
    #[error("configuration")]
    Config(#[from] ConfigError),
    /// A handle is stale, foreign or forged.
    #[error(transparent)]
    Handle(#[from] HandleError),
    /// A URI does not parse or names nothing.
    #[error("URI {uri:?}: {reason}")]
    Uri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A resolver and a datapath joined by a store do not speak the same
    /// payload (type or version).
    #[error(
        "store {store:?}: resolver {resolver:?} produces {produced} but datapath {datapath:?} consumes {consumed}"
    )]
    BindingMismatch {
        /// Store name.
        store: String,
        /// Resolver name.
        resolver: String,
        /// Datapath name.
        datapath: String,
        /// The resolver's payload `type@version`.
        produced: String,
        /// The datapath's payload `type@version`.
        consumed: String,
    },
    /// Starting an emulated drive failed.
    #[error("drive {drive:?}: emulator")]
    Emulator {
        /// Drive name.
        drive: String,
        /// Cause.
        #[source]
        source: nvme_emu::EmuError,
    },
    /// Opening a PCI drive (vfio-pci) failed; the source says why and how
    /// to fix it (bind it with `tutti-probe bind`, enable the IOMMU...).
    #[error("drive {drive:?}: PCI device")]
    Pci {
        /// Drive name.
        drive: String,
        /// Cause.
        #[source]
        source: nvme_pci::PciError,
    },
    /// Bringing up or talking to a controller failed.
    #[error("drive {drive:?}: controller")]
    Controller {
        /// Drive name.
        drive: String,
        /// Cause.
        #[source]
        source: nvm_queue::ControllerError,
    },
    /// The GPU path failed (no CUDA driver or GPU, or a CUDA call).
    #[error("GPU ({context})")]
    Gpu {
        /// What was being set up or run.
        context: String,
        /// Cause.
        #[source]
        source: gpu_io::GpuError,
    },
    /// The drive lacks the namespace a datapath names.
    #[error("drive {drive:?} has no usable namespace {nsid}")]
    NoNamespace {
        /// Drive name.
        drive: String,
        /// NSID.
        nsid: u32,
    },
    /// Registering memory failed.
    #[error("register_memory: {reason}")]
    Memory {
        /// What went wrong.
        reason: String,
        /// Cause, when a device refused the mapping.
        #[source]
        source: Option<nvm_queue::DeviceError>,
    },
    /// The memory region still has operations in flight (or commands that
    /// timed out and may still be written by a drive).
    #[error("memory region is in use by {ops} operation(s)")]
    MemoryBusy {
        /// Operations referencing it.
        ops: usize,
    },
    /// A drive cannot be reset now: GPU kernels that use its queues are
    /// still running (each ends within `runtime::GPU_COMMAND_BUDGET`); wait
    /// for their operations first.
    #[error("drive {drive:?} is in use by {ops} running GPU operation(s); wait for them, then reset")]
    DriveBusy {
        /// Drive name.
        drive: String,
        /// Operations whose kernels still run.
        ops: usize,
    },
    /// The runtime is shutting down and accepts no new work.
    #[error("the runtime is shutting down")]
    ShuttingDown,
}

/// Why one request of a batch was not accepted. Nothing was sent to a drive
/// for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The target handle is stale (closed), foreign or forged.
    #[error("target: {0}")]
    Target(HandleError),
    /// The memory handle is stale, foreign or forged.
    #[error("memory: {0}")]
    Memory(HandleError),
    /// Zero-length request.
    #[error("zero-length request")]
    ZeroLength,
    /// The byte range lies outside the target.
    #[error("range {offset:#x}+{len:#x} is outside the {target_len:#x}-byte target")]
    OutOfRange {
        /// Offset in the target, bytes.
        offset: u64,
        /// Length, bytes.
        len: u64,
        /// Target size, bytes.
        target_len: u64,
    },
    /// Offset or length not a multiple of the logical block size.
    #[error("range {offset:#x}+{len:#x} is not aligned to the {block_size}-byte logical block")]
    Unaligned {
        /// Offset in the target, bytes.
        offset: u64,
        /// Length, bytes.
        len: u64,
        /// Block size, bytes.
        block_size: u32,
    },
    /// The memory range lies outside the registered region, or is not
    /// dword aligned (PRP1 must be).
    #[error(
        "memory range {offset:#x}+{len:#x} is outside the {region_len:#x}-byte region or not 4-byte aligned"
    )]
    MemoryRange {
        /// Offset in the region, bytes.
        offset: u64,
        /// Length, bytes.
        len: u64,
        /// Region size, bytes.
        region_len: u64,
    },
    /// The runtime is shutting down.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// A GPU-executed batch names more than one memory region (one kernel
    /// launch binds one region per queue).
    #[error("a GPU-executed batch must use one memory region")]
    GpuBatchMemory,
    /// Too many operations are in flight (submitted and not yet waited on).
    #[error("{limit} operations are already in flight; wait on some first")]
    TooManyOperations {
        /// Operations that may be in flight at once.
        limit: u64,
    },
}

/// Final status of one request, in the order the batch gave them.
///
/// Success only when every command of the request completed with NVMe
/// status 0; anything else names what failed.
#[must_use = "a request may have failed; check its status"]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestStatus {
    /// Every byte transferred; every command completed with status 0.
    Success,
    /// Not accepted at submission; nothing was sent.
    NotAccepted(RequestError),
    /// A drive completed a command of this request with an error status.
    /// The request's data must not be used (for a read, some of the buffer
    /// may hold partial data).
    Nvme {
        /// Name of the drive.
        drive: String,
        /// NVMe status (SCT, SC, CRD, M, DNR).
        status: Status,
    },
    /// Not complete when the wait's deadline passed. Its commands may still
    /// be outstanding; the memory stays mapped until they complete or the
    /// controller is reset.
    Timeout,
    /// The drive's controller reported a fatal error (CSTS.CFS) or vanished
    /// while the request was in flight; its commands were abandoned. The
    /// drive takes new work again after [`crate::Runtime::reset_drive`].
    ControllerFatal {
        /// Name of the drive.
        drive: String,
    },
    /// Some commands could not be queued (queue stayed full past the
    /// submission bound, or the buffer could not be described).
    SubmitFailed {
        /// Why.
        reason: String,
    },
}

impl RequestStatus {
    /// `true` for [`RequestStatus::Success`].
    pub fn is_success(&self) -> bool {
        matches!(self, RequestStatus::Success)
    }
}
