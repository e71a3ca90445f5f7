//! Errors of the runtime API and per-request statuses.

use nvme_regs::Status;

use crate::binding::ResolveError;
use crate::config::ConfigError;
use crate::handle::{HandleError, HandleKind};

/// What is wrong with a URI given to [`crate::Runtime::open`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriError {
    /// It does not start with `tutti://`.
    #[error("expected the scheme {}", crate::URI_SCHEME)]
    Scheme,
    /// No `/` between store and key.
    #[error("expected tutti://<store>/<key>")]
    NoKey,
    /// No store of that name.
    #[error("no store named {store:?} (stores: {known:?})")]
    UnknownStore {
        /// The store named.
        store: String,
        /// The stores the runtime has.
        known: Vec<String>,
    },
    /// The store's resolver refused the key.
    #[error(transparent)]
    Key(#[from] ResolveError),
}

/// Which block-alignment rule a request broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Alignment {
    /// The offset in the target is not a multiple of the logical block size.
    Offset,
    /// The length is not a multiple of the logical block size.
    Length,
}

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
    #[error("URI {uri:?}: {kind}")]
    Uri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        kind: UriError,
    },
    /// No drive of that name ([`crate::Runtime::reset_drive`]).
    #[error("no drive named {name:?} (drives: {known:?})")]
    UnknownDrive {
        /// The name given.
        name: String,
        /// The drives the runtime has.
        known: Vec<String>,
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
    /// A drive owned by `tuttid`: the daemon refused (the source names the
    /// rule), or the connection to it failed.
    #[error("drive {drive:?}: tuttid")]
    Daemon {
        /// Drive name.
        drive: String,
        /// Cause.
        #[source]
        source: tuttid_proto::DaemonDriveError,
    },
    /// The operation needs the controller (reset, admin commands), which
    /// the daemon owns: a client never touches it.
    #[error("drive {drive:?} is owned by tuttid: {operation} is done by the daemon, not by a client")]
    DaemonOwned {
        /// Drive name.
        drive: String,
        /// What was asked.
        operation: &'static str,
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
    /// still running (each ends within `runtime::GPU_COMMAND_BUDGET`; wait
    /// for their operations first), or `ops` is 0 and another thread is
    /// resetting it.
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
    /// A handle table is full: `limit` objects of this kind are open at
    /// once (or their slots retired after 2^24 reuses each; handles fit in
    /// 64 bits, [`crate::handle`]). Close or unregister some first.
    #[error("too many {kind} handles: every one of the {limit} slots is in use or retired")]
    TooManyHandles {
        /// Which table.
        kind: HandleKind,
        /// Slots a table has.
        limit: u64,
    },
    /// This process has created [`crate::handle::RUNTIME_ID_MAX`] runtimes
    /// already; runtime ids are never reused (old handles would become
    /// valid again), so it cannot create another.
    #[error("this process has created {limit} runtimes, the most it may; reuse one")]
    TooManyRuntimes {
        /// Runtimes a process may create.
        limit: u32,
    },
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
    /// The batch has more than [`crate::MAX_BATCH`] requests (a
    /// request's index travels in 24 bits of each command's tag); split it.
    #[error("a batch holds at most {max} requests, this one has {requests}; split it")]
    BatchTooLarge {
        /// Requests in the batch.
        requests: u64,
        /// Requests a batch may hold.
        max: u64,
    },
    /// The request needs more NVMe commands than one request may carry
    /// (its length over the drives' MDTS); split it.
    #[error("the request needs {commands} NVMe commands, more than {max}; split it")]
    TooManyCommands {
        /// Commands the request would need.
        commands: u64,
        /// Commands a request may carry.
        max: u64,
    },
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
    #[error(
        "range {offset:#x}+{len:#x}: the {} is not a multiple of the {block_size}-byte logical block",
        match rule { Alignment::Offset => "offset", Alignment::Length => "length" }
    )]
    Unaligned {
        /// Offset in the target, bytes.
        offset: u64,
        /// Length, bytes.
        len: u64,
        /// Block size, bytes (the largest LBA size of the datapath's drives).
        block_size: u32,
        /// The rule broken.
        rule: Alignment,
    },
    /// The memory range lies outside the registered region.
    #[error("memory range {offset:#x}+{len:#x} is outside the {region_len:#x}-byte region")]
    MemoryRange {
        /// Offset in the region, bytes.
        offset: u64,
        /// Length, bytes.
        len: u64,
        /// Region size, bytes.
        region_len: u64,
    },
    /// The memory offset does not give a 4-byte aligned address: PRP
    /// entries must be dword aligned (NVMe Base 2.0 4.1.1).
    #[error("memory offset {offset:#x} gives an address that is not 4-byte aligned (PRP1 must be)")]
    MemoryUnaligned {
        /// Offset in the region, bytes.
        offset: u64,
    },
    /// A drive refused to plan its piece of the request: its namespace
    /// disagrees with the datapath (a config built in code and not
    /// validated). Nothing was sent.
    #[error("drive {drive:?} cannot carry its piece of the request")]
    DrivePlan {
        /// Name of the drive.
        drive: String,
        /// Why.
        #[source]
        source: nvm_queue::IoError,
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
        /// Why, typed ([`SubmitFailure`]; its `Display` is the message).
        reason: SubmitFailure,
    },
}

/// Why a request's commands were not sent ([`RequestStatus::SubmitFailed`]).
/// None of them reached a drive unless the variant says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitFailure {
    /// The drive takes no commands now: failed (controller fatal or gone),
    /// being reset, or shut down. `Runtime::reset_drive` brings a failed
    /// drive back.
    #[error("drive {drive:?} is {state}; reset_drive brings a failed drive back")]
    DriveNotReady {
        /// The drive.
        drive: String,
        /// Its state, in words (`Failed`, `Resetting`, `ShutDown`).
        state: String,
    },
    /// The drive has no I/O queue of the kind the request needs (CPU
    /// queues, or GPU queues for a GPU-executed datapath).
    #[error("drive {drive:?} has no {kind} I/O queue")]
    NoQueue {
        /// The drive.
        drive: String,
        /// `"CPU"` or `"GPU"`.
        kind: &'static str,
    },
    /// The SQ stayed full past `SUBMIT_RETRY_BOUND`.
    #[error("drive {drive:?}: queue {qid} stayed full")]
    QueueFull {
        /// The drive.
        drive: String,
        /// The SQ's queue ID.
        qid: u16,
    },
    /// The SQ was deleted (shutdown or reset) while commands were queued.
    #[error("drive {drive:?}: queue {qid} was deleted")]
    SqDeleted {
        /// The drive.
        drive: String,
        /// The SQ's queue ID.
        qid: u16,
    },
    /// The queue refused one command (its buffer could not be described
    /// with PRPs); commands of the request queued before it were sent.
    #[error("drive {drive:?}: {detail}")]
    CommandRefused {
        /// The drive.
        drive: String,
        /// The queue's reason.
        detail: String,
    },
    /// An earlier command of the same request was refused; this one was
    /// not sent.
    #[error("an earlier command of the request was refused")]
    EarlierCommandRefused,
    /// The GPU kernel could not be launched (or its statuses read).
    #[error("GPU launch: {detail}")]
    GpuLaunch {
        /// The GPU error chain.
        detail: String,
    },
    /// The kernel reported a status the runtime has no meaning for.
    #[error("GPU: {detail}")]
    GpuStatus {
        /// The status, in words.
        detail: String,
    },
}

impl RequestStatus {
    /// `true` for [`RequestStatus::Success`].
    pub fn is_success(&self) -> bool {
        matches!(self, RequestStatus::Success)
    }
}
