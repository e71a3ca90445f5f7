//! Errors starting an emulator and changing its set-up.

/// Errors starting an emulator.
#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    /// A configuration field is out of range.
    #[error("invalid emulator config: {field} = {value}: {reason}")]
    Config {
        /// The field of [`EmulatorConfig`].
        field: &'static str,
        /// The offending value (or a count / length standing for it).
        value: u64,
        /// What is required.
        reason: &'static str,
    },
    /// Allocating the register page or a RAM namespace failed.
    #[error("allocating {bytes} bytes failed")]
    OutOfMemory {
        /// Size of the failed allocation.
        bytes: u64,
    },
    /// Opening or sizing the backing file failed.
    #[error("backing file {path:?}")]
    Backing {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A queue id outside the I/O queues the emulator was configured with.
    #[error("no I/O queue {qid} (the emulator has I/O queues 1..={io_queues})")]
    NoSuchQueue {
        /// The queue id asked for.
        qid: u16,
        /// `EmulatorConfig::io_queues`.
        io_queues: u16,
    },
    /// The register page could not be wrapped as an MMIO window.
    #[error("register page")]
    Mmio(#[source] nvm_queue::MmioError),
    /// The controller thread could not be spawned.
    #[error("spawning the controller thread")]
    Spawn(#[source] std::io::Error),
    /// A system call setting up shared doorbell pages failed.
    #[error("{op} failed")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another live emulator holds the RAM disk ([`BackingSpec::RamDisk`];
    /// or [`remove_ram_disk`] of a disk in use).
    #[error("RAM disk {name:?} is attached to another emulator")]
    RamDiskInUse {
        /// The disk's name.
        name: String,
    },
    /// The RAM disk exists with other namespaces than the emulator's.
    #[error("RAM disk {name:?} has namespaces {existing:?}, the emulator wants {requested:?} (blocks, block size)")]
    RamDiskLayout {
        /// The disk's name.
        name: String,
        /// The disk's namespaces: (size in logical blocks, logical block
        /// size in bytes), NSID order.
        existing: Vec<(u64, u32)>,
        /// The emulator's namespaces, as `existing`.
        requested: Vec<(u64, u32)>,
    },
}
