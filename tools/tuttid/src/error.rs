//! The daemon's errors. A request's refusal carries the [`Rule`] that
//! refused it; [`DaemonError::rule`] maps each error to one.

use tuttid_proto::Rule;

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
    /// The client holds its quota of queue pairs on the drive.
    #[error("quota of {quota} queue pairs on drive {drive:?} reached")]
    Quota {
        /// The drive.
        drive: String,
        /// The quota.
        quota: u16,
    },
    /// The client holds its quota of memory registrations.
    #[error("quota of {quota} memory registrations reached")]
    MemoryQuota {
        /// The quota.
        quota: u32,
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
            DaemonError::NotAllowed { .. } => Rule::NotAllowed,
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
