//! The daemon's errors. A request's refusal carries the [`Rule`] that
//! refused it; [`DaemonError::rule`] maps each error to one.

use tuttid_proto::Rule;

/// The error beneath a [`DaemonError::Drive`].
pub type DriveCause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong serving a request or starting the daemon.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A request named a drive the config does not have.
    #[error("no drive named {drive:?}")]
    UnknownDrive {
        /// The name asked for.
        drive: String,
    },
    /// The peer is in none of the drive's allow lists.
    #[error("uid {uid} / gid {gid} is not in drive {drive:?}'s allow list")]
    NotAllowed {
        /// The drive.
        drive: String,
        /// Peer uid.
        uid: u32,
        /// Peer gid.
        gid: u32,
    },
    /// The uid holds its quota of queue pairs on the drive (all its
    /// connections together).
    #[error("quota of {quota} queue pairs on drive {drive:?} reached")]
    Quota {
        /// The drive.
        drive: String,
        /// The quota.
        quota: u16,
    },
    /// The uid holds its quota of memory registrations.
    #[error("quota of {quota} memory registrations reached")]
    MemoryQuota {
        /// The quota.
        quota: u32,
    },
    /// The uid holds its quota of registered bytes.
    #[error(
        "{held} bytes registered and {asked} more asked: more than the {limit} bytes one uid may register"
    )]
    MemoryBytes {
        /// Bytes the uid holds.
        held: u64,
        /// Bytes asked.
        asked: u64,
        /// The quota.
        limit: u64,
    },
    /// The uid (`Some`), or the daemon (`None`), holds its cap of
    /// connections.
    #[error("{}", match uid {
        Some(u) => format!("uid {u} holds its {limit} connections"),
        None => format!("the daemon serves {limit} connections, its most"),
    })]
    TooManyConnections {
        /// The uid, for the per-uid cap.
        uid: Option<u32>,
        /// The cap.
        limit: u32,
    },
    /// The peer is on no drive's allow list (and not the operator, or the
    /// operator asking for more than the status).
    #[error("uid {uid} / gid {gid} is on no drive's allow list: {what}")]
    Unauthenticated {
        /// Peer uid.
        uid: u32,
        /// Peer gid.
        gid: u32,
        /// What was refused.
        what: &'static str,
    },
    /// The drive lists LBA partitions and none for this peer.
    #[error("uid {uid} / gid {gid} has no LBA partition on drive {drive:?}")]
    NoPartition {
        /// The drive.
        drive: String,
        /// Peer uid.
        uid: u32,
        /// Peer gid.
        gid: u32,
    },
    /// No free I/O queue id on the drive.
    #[error("every I/O queue pair of drive {drive:?} is granted")]
    PoolEmpty {
        /// The drive.
        drive: String,
    },
    /// A queue or memory id this connection does not own.
    #[error("{what} {id} is not owned by this connection")]
    NotOwned {
        /// "queue" or "memory".
        what: &'static str,
        /// The id given.
        id: u64,
    },
    /// Memory that cannot be mapped (not a sealed memfd, misaligned...).
    #[error("memory cannot be registered: {0}")]
    BadMemory(String),
    /// A field out of range.
    #[error("{0}")]
    BadRequest(String),
    /// A drive operation failed.
    #[error("drive {drive:?}: {what}")]
    Drive {
        /// The drive.
        drive: String,
        /// What failed.
        what: String,
        /// The error underneath, when one caused it (a controller, the
        /// OS, the emulator), for callers that match or walk the chain.
        #[source]
        source: Option<DriveCause>,
    },
    /// Socket setup failed.
    #[error("{op} {path}")]
    Socket {
        /// What was being done.
        op: &'static str,
        /// The socket path.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl DaemonError {
    /// The protocol rule this refusal is reported under.
    pub fn rule(&self) -> Rule {
        match self {
            DaemonError::UnknownDrive { .. } => Rule::UnknownDrive,
            DaemonError::NotAllowed { .. }
            | DaemonError::Unauthenticated { .. }
            | DaemonError::NoPartition { .. } => Rule::NotAllowed,
            DaemonError::TooManyConnections { .. } => Rule::Quota,
            DaemonError::MemoryBytes { .. } => Rule::MemoryQuota,
            DaemonError::Quota { .. } => Rule::Quota,
            DaemonError::MemoryQuota { .. } => Rule::MemoryQuota,
            DaemonError::PoolEmpty { .. } => Rule::PoolEmpty,
            DaemonError::NotOwned { .. } => Rule::NotOwned,
            DaemonError::BadMemory(_) => Rule::BadMemory,
            DaemonError::BadRequest(_) => Rule::BadRequest,
            DaemonError::Drive { .. } | DaemonError::Socket { .. } => Rule::Device,
        }
    }
}
