//! Errors of the store as a whole ([`KvError`]) and the status of each
//! item of a batch ([`ItemStatus`]).

use tutti::{NvmeStatus, RequestError, RequestStatus};

use crate::format::SuperblockError;

/// Why a store could not be opened, or a call could not run at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// The runtime refused (a handle, a registration, an unknown store).
    #[error(transparent)]
    Runtime(#[from] tutti::Error),
    /// The runtime has no store of this name.
    #[error("the runtime has no store {0:?}")]
    UnknownStore(String),
    /// The store does not cut its space into slots (tutti-kv needs a
    /// `slab` resolver: one slot per object).
    #[error("store {0:?} has no slab resolver: tutti-kv keeps one object per slot")]
    NotASlab(String),
    /// The store's geometry cannot hold a superblock, the record table and
    /// at least one object.
    #[error("store {store:?} is too small or misaligned for tutti-kv: {slots} slots of {slot_size} bytes, {block_size}-byte blocks")]
    Geometry {
        /// Store name.
        store: String,
        /// Slots in the store.
        slots: u64,
        /// Slot (object) size, bytes.
        slot_size: u64,
        /// Logical block size, bytes.
        block_size: u32,
    },
    /// The first block is not a superblock this build can use; nothing was
    /// written.
    #[error("store {store:?}: its first block is not a superblock this build can use (nothing was written)")]
    Superblock {
        /// Store name.
        store: String,
        /// What is wrong with it.
        #[source]
        source: SuperblockError,
    },
    /// The store was formatted with another key size than asked for.
    #[error("store {store:?} was formatted with {found}-byte keys, not {asked}")]
    KeySize {
        /// Store name.
        store: String,
        /// Key size in the superblock, bytes.
        found: usize,
        /// Key size asked for, bytes.
        asked: usize,
    },
    /// I/O needed to open, format, recover or sync the store failed.
    #[error("store {store:?}: {what} failed: {status}")]
    Io {
        /// Store name.
        store: String,
        /// What was being done.
        what: &'static str,
        /// The status of the I/O that failed, typed as a batch item's
        /// ([`ItemStatus::Device`] for a drive's NVMe status or a failed
        /// submission, [`ItemStatus::Timeout`]...).
        status: ItemStatus,
    },
    /// The OS gave no random bytes for a new store's UUID.
    #[error("store {store:?}: drawing a UUID failed")]
    Uuid {
        /// Store name.
        store: String,
        /// The OS's error.
        #[source]
        source: getrandom::Error,
    },
    /// More items in one call than one runtime submission holds.
    #[error("{items} items in one call; at most {max}")]
    BatchTooLarge {
        /// Items given.
        items: usize,
        /// The limit.
        max: usize,
    },
    /// Memory registered with another store.
    #[error("memory registered with another store or already unregistered")]
    ForeignMemory,
    /// A pending batch of another store.
    #[error("a pending batch of another store")]
    ForeignBatch,
    /// Memory that a put or get not yet waited on still uses.
    #[error("memory still used by a put or get that has not been waited on (or was dropped and is still in flight)")]
    MemoryInUse,
    /// The store is already open on this runtime.
    #[error("store {0:?} is already open on this runtime: one KvStore per store")]
    AlreadyOpen(String),
    /// Another open of the store holds its lease (the lease block on the
    /// media, docs/kv-store.md "One writer per store"): one writer per
    /// store, across processes. Nothing was written. Open it read-only
    /// ([`crate::Access::ReadOnly`]) to read beside that writer.
    #[error("store {store:?} is open for writing elsewhere ({holder}); one writer per store")]
    Leased {
        /// Store name.
        store: String,
        /// Who holds it.
        holder: LeaseHolder,
    },
    /// This store's lease was taken by another writer (found at a
    /// renewal: this process was thought gone): it writes nothing more.
    /// Reopen it.
    #[error("store {0:?} lost its lease to another writer; it writes nothing more (reopen it)")]
    LeaseLost(String),
    /// The lease block was freed or damaged between this opener's write
    /// and its read-back (another writer came and went at that moment).
    /// Opening again may succeed.
    #[error("store {0:?}: the lease changed under this open; try again")]
    LeaseContended(String),
    /// The store was opened read-only: puts and syncs are refused.
    #[error("store {0:?} was opened read-only")]
    ReadOnly(String),
    /// The checksum kernel failed on GPU-resident objects.
    #[error("checksumming GPU memory failed")]
    Gpu(#[source] gpu_io::GpuError),
    /// Checksums of GPU-resident objects need the runtime's GPU.
    #[error("GPU memory needs a runtime with a GPU (a datapath with execution: gpu)")]
    NoGpu,
}

/// The writer that holds a store's lease, as the lease block names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseHolder {
    /// Its process id, in its own PID namespace.
    pub pid: u32,
    /// Where it runs, as far as this process can tell.
    pub place: HolderPlace,
}

/// Where a lease holder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HolderPlace {
    /// This process (another runtime over the same drives).
    ThisProcess,
    /// Another running process of this host and PID namespace.
    ThisHost,
    /// Another PID namespace or host, seen renewing its lease.
    Elsewhere,
}

impl std::fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.place {
            HolderPlace::ThisProcess => {
                write!(f, "by this process, pid {}, through another runtime", self.pid)
            }
            HolderPlace::ThisHost => write!(f, "by running process {}", self.pid),
            HolderPlace::Elsewhere => {
                write!(f, "by process {} of another PID namespace or host, which renews its lease", self.pid)
            }
        }
    }
}

/// The outcome of one item of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ItemStatus {
    /// A put is durable (payload and record on stable media), a remove is
    /// done (durable after the next [`crate::KvStore::sync`]).
    Ok,
    /// A get found the object and its payload checksum matched: `len`
    /// bytes are in the caller's memory.
    Hit {
        /// Payload length, bytes.
        len: u64,
    },
    /// No object of this key.
    Miss,
    /// The object's payload read back with another CRC32C than it was
    /// stored with (torn, bit-flipped or never written): its bytes must not
    /// be used. Counts as a miss.
    ChecksumMismatch {
        /// CRC32C in the record.
        stored: u32,
        /// CRC32C of the bytes read.
        computed: u32,
    },
    /// No free slot, and every object that could be evicted is in use.
    Full,
    /// Longer than the store's object size.
    TooLarge {
        /// Length asked for, bytes.
        len: u64,
        /// The store's object size, bytes.
        max: u64,
    },
    /// The value's memory range is not inside its registration (the length
    /// is rounded up to whole logical blocks), or the length is zero.
    BadValue {
        /// Why.
        reason: String,
    },
    /// A drive failed the I/O.
    Device {
        /// The NVMe status, when a drive completed a command with one.
        status: Option<NvmeStatus>,
        /// The drive, when known.
        drive: Option<String>,
        /// The runtime's account of it.
        message: String,
    },
    /// Not complete by the deadline of the wait.
    Timeout,
}

impl ItemStatus {
    /// `true` for [`ItemStatus::Ok`] and [`ItemStatus::Hit`].
    pub fn is_ok(&self) -> bool {
        matches!(self, ItemStatus::Ok | ItemStatus::Hit { .. })
    }

    /// The status for a request the runtime did not complete successfully.
    pub(crate) fn from_request(s: &RequestStatus) -> Self {
        match s {
            RequestStatus::Timeout => ItemStatus::Timeout,
            RequestStatus::Nvme { drive, status } => ItemStatus::Device {
                status: Some(*status),
                drive: Some(drive.clone()),
                message: status.to_string(),
            },
            RequestStatus::ControllerFatal { drive } => ItemStatus::Device {
                status: None,
                drive: Some(drive.clone()),
                message: format!("drive {drive:?} failed (controller fatal or gone)"),
            },
            RequestStatus::NotAccepted(e) => ItemStatus::refused(e),
            RequestStatus::SubmitFailed { reason } => ItemStatus::Device {
                status: None,
                drive: submit_failure_drive(reason),
                message: reason.to_string(),
            },
            other => ItemStatus::Device { status: None, drive: None, message: format!("{other:?}") },
        }
    }

    /// The status of an item whose request the runtime refused at submit:
    /// the runtime shutting down, too many operations in flight or a drive
    /// that cannot plan its piece are [`ItemStatus::Device`] (the store
    /// cannot do I/O now); anything else is about the value
    /// ([`ItemStatus::BadValue`]).
    pub(crate) fn refused(e: &RequestError) -> Self {
        match e {
            RequestError::ShuttingDown
            | RequestError::TooManyOperations { .. }
            | RequestError::DrivePlan { .. } => {
                ItemStatus::Device { status: None, drive: None, message: tutti::error_chain(e) }
            }
            _ => ItemStatus::BadValue { reason: tutti::error_chain(e) },
        }
    }

    /// A runtime error as an item status (a device problem: the store
    /// could not do its own I/O).
    pub(crate) fn from_runtime(e: tutti::Error) -> Self {
        ItemStatus::Device { status: None, drive: None, message: tutti::error_chain(&e) }
    }

    /// The status of an item whose slot could not be opened as a target.
    pub(crate) fn from_open(e: &tutti::Error) -> Self {
        match e {
            tutti::Error::ShuttingDown | tutti::Error::TooManyHandles { .. } => {
                ItemStatus::Device { status: None, drive: None, message: tutti::error_chain(e) }
            }
            _ => ItemStatus::BadValue { reason: tutti::error_chain(e) },
        }
    }
}

impl std::fmt::Display for ItemStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ItemStatus::Ok => f.write_str("ok"),
            ItemStatus::Hit { len } => write!(f, "hit, {len} bytes"),
            ItemStatus::Miss => f.write_str("no object of this key"),
            ItemStatus::ChecksumMismatch { stored, computed } => {
                write!(f, "payload CRC32C {computed:#010x} differs from the stored {stored:#010x}")
            }
            ItemStatus::Full => f.write_str("no free slot and nothing evictable"),
            ItemStatus::TooLarge { len, max } => {
                write!(f, "{len} bytes is larger than the store's {max}-byte objects")
            }
            ItemStatus::BadValue { reason } => write!(f, "bad value: {reason}"),
            ItemStatus::Device { drive: Some(d), message, .. } => write!(f, "drive {d:?}: {message}"),
            ItemStatus::Device { drive: None, message, .. } => f.write_str(message),
            ItemStatus::Timeout => f.write_str("not complete by the wait's deadline"),
        }
    }
}

/// The drive a submit failure names, if it names one.
fn submit_failure_drive(f: &tutti::SubmitFailure) -> Option<String> {
    use tutti::SubmitFailure as F;
    match f {
        F::DriveNotReady { drive, .. }
        | F::NoQueue { drive, .. }
        | F::QueueFull { drive, .. }
        | F::SqDeleted { drive, .. }
        | F::CommandRefused { drive, .. } => Some(drive.clone()),
        _ => None,
    }
}
