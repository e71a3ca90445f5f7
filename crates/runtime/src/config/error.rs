//! [`ConfigError`], a refused configuration: the key path of the offending
//! value plus a [`ConfigErrorKind`] saying what is wrong with it and how to
//! fix it; and [`RefKind`], what a dangling name should have referred to.

use std::fmt;
use std::path::PathBuf;

use super::ByteSize;

/// What kind of object a name refers to, in
/// [`ConfigErrorKind::UnknownReference`] and
/// [`ConfigErrorKind::AlreadyInStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefKind {
    /// A key of `drives`.
    Drive,
    /// A key of `resolvers`.
    Resolver,
    /// A key of `datapaths`.
    DataPath,
}

impl fmt::Display for RefKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RefKind::Drive => "drive",
            RefKind::Resolver => "resolver",
            RefKind::DataPath => "datapath",
        })
    }
}

/// A refused configuration.
///
/// [`path`](ConfigError::path) is the key path of the offending value
/// (`drives.d0.emulated.mqes`,
/// `datapaths.stripe.striped_local_nvme.drives[2]`; `.` for the document
/// root; the file's path for [`ConfigErrorKind::Io`]), and
/// [`kind`](ConfigError::kind) says what is wrong with it. The message is
/// `"{path}: {kind}"`, e.g. `datapaths.stripe.striped_local_nvme.drives[2]:
/// unknown drive "d9"`. Programs match on the kind:
///
/// ```
/// use tutti::config::{ConfigErrorKind, RefKind};
///
/// let yaml = "stores:\n  kv: { resolver: nope, datapath: dp }\n";
/// let err = tutti::Config::from_yaml_str(yaml).unwrap_err();
/// assert_eq!(err.path(), "stores.kv.resolver");
/// assert!(matches!(
///     err.kind(),
///     ConfigErrorKind::UnknownReference { kind: RefKind::Resolver, name } if name == "nope"
/// ));
/// ```
#[derive(Debug)]
pub struct ConfigError {
    path: String,
    kind: ConfigErrorKind,
}

impl ConfigError {
    /// An error of `kind` at key path `path` (e.g.
    /// `datapaths.fast.striped_local_nvme.stripe_unit`; see
    /// [`Config::datapath_key`](super::Config::datapath_key)).
    pub fn new(path: impl Into<String>, kind: ConfigErrorKind) -> Self {
        Self { path: path.into(), kind }
    }

    /// The key path of the offending value (for [`ConfigErrorKind::Io`],
    /// the file path).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong with the value at [`path`](ConfigError::path).
    pub fn kind(&self) -> &ConfigErrorKind {
        &self.kind
    }

    /// The kind, by value (e.g. to take the I/O error out of
    /// [`ConfigErrorKind::Io`]).
    pub fn into_kind(self) -> ConfigErrorKind {
        self.kind
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.kind)
    }
}

impl std::error::Error for ConfigError {
    /// The kind's cause, where it has one (the I/O error of
    /// [`ConfigErrorKind::Io`]); the kind itself is part of this error's
    /// message, not a separate link of the chain.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.kind)
    }
}

/// What is wrong with a configuration value. Its message is the part of
/// [`ConfigError`]'s message after the key path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A fault rule's LBA range is empty or reversed.
    #[error("empty LBA range [{start}, {end})")]
    FaultRange {
        /// First block.
        start: u64,
        /// One past the last block.
        end: u64,
    },
    /// A fault rule for Flush commands with an LBA range: a Flush carries
    /// none, so the rule could never match.
    #[error("op: flush with an lba range would never match: a Flush carries no LBA range")]
    FaultFlushLba,
    /// A PCI drive's address is malformed.
    #[error("{addr:?} is not a PCI address (want dddd:bb:dd.f, e.g. 0000:01:00.0)")]
    PciAddr {
        /// The address as written.
        addr: String,
    },
    /// Two PCI drives name the same function (path: the second drive's
    /// address).
    #[error("PCI function {addr} is already drive {other:?}")]
    SharedPciFunction {
        /// The address, normalised.
        addr: String,
        /// The drive that names it first.
        other: String,
    },
    /// Two emulated drives name the same backing file (path: the second
    /// drive's backing).
    #[error("backing file {} is already used by drive {other:?}", file.display())]
    SharedBackingFile {
        /// The file.
        file: PathBuf,
        /// The drive that uses it first.
        other: String,
    },
    /// Two emulated drives name the same RAM disk (path: the second
    /// drive's backing).
    #[error("RAM disk {name:?} is already used by drive {other:?}")]
    SharedRamDisk {
        /// The RAM disk's name.
        name: String,
        /// The drive that uses it first.
        other: String,
    },
    /// A RAM disk backing with an empty name (path: the drive's backing).
    #[error("a RAM disk needs a non-empty name")]
    EmptyRamDiskName,
    /// The config file could not be read (path: the file's path).
    #[error("cannot read config file")]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or does not match the schema: syntax error,
    /// unknown key, duplicate key, two kinds in one entry, wrong type, bad
    /// byte size, missing required field (path: `.` for the document root).
    #[error("{message}{}", fmt_location(*line, *column))]
    Parse {
        /// 1-based line of the error in the YAML text, if known.
        line: Option<u32>,
        /// 1-based column of the error in the YAML text, if known.
        column: Option<u32>,
        /// The parser's message, without the source snippet.
        message: String,
    },
    /// An object name (a map key) is empty (path: the section holding it).
    #[error("empty name")]
    EmptyName,
    /// A name refers to no object of the expected kind.
    #[error("unknown {kind} {name:?}")]
    UnknownReference {
        /// What the name should refer to.
        kind: RefKind,
        /// The name.
        name: String,
    },
    /// A number is outside its allowed range.
    #[error("invalid value {value}: must be in {min}..={max}")]
    OutOfRange {
        /// The value.
        value: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// An emulated drive has no namespace.
    #[error("a drive needs at least one namespace")]
    NoNamespaces,
    /// A block size other than 512 or 4096.
    #[error("invalid block size {block_size}: must be 512 or 4096")]
    BlockSize {
        /// The value, bytes.
        block_size: u32,
    },
    /// A namespace capacity that is zero or not a multiple of its block size.
    #[error("invalid capacity {capacity}: must be a non-zero multiple of the block size {block_size}")]
    Capacity {
        /// The capacity, bytes.
        capacity: ByteSize,
        /// The namespace's block size, bytes.
        block_size: u32,
    },
    /// A slab slot size that is zero or not a multiple of 4096.
    #[error("invalid slot size {slot_size}: must be a non-zero multiple of 4096 bytes")]
    SlotSize {
        /// The value, bytes.
        slot_size: ByteSize,
    },
    /// A namespace ID that an emulated drive does not have (checked when
    /// the config is validated).
    #[error("drive {drive:?} has no namespace {nsid} (it has NSIDs 1..={namespaces})")]
    UnknownNamespace {
        /// The drive.
        drive: String,
        /// The NSID asked for.
        nsid: u32,
        /// How many namespaces the drive has.
        namespaces: usize,
    },
    /// A namespace ID that is not active on a drive whose namespaces are
    /// only known once it is opened (a `pci` drive; checked when the
    /// runtime starts). Path: the datapath's `nsid`.
    #[error(
        "drive {drive:?} has no active namespace {nsid} (active: {active:?}); {}",
        namespace_hint(active)
    )]
    NamespaceMissing {
        /// The drive.
        drive: String,
        /// The NSID asked for.
        nsid: u32,
        /// The drive's active NSIDs, ascending.
        active: Vec<u32>,
    },
    /// A striped datapath with fewer than 2 or more than 4 drives.
    #[error("a striped datapath needs {min} to {max} drives, got {count}")]
    StripeWidth {
        /// Number of drives given.
        count: usize,
        /// Fewest drives allowed (2).
        min: usize,
        /// Most drives allowed (4).
        max: usize,
    },
    /// The same drive listed twice in one striped datapath (path: the
    /// second occurrence).
    #[error("drive {drive:?} is listed twice in the stripe")]
    DuplicateStripeDrive {
        /// The drive.
        drive: String,
    },
    /// A drive used by a second datapath (one owner per drive; path: the
    /// second use).
    #[error("drive {drive:?} is already used by datapath {owner:?} (one datapath per drive)")]
    DriveAlreadyOwned {
        /// The drive.
        drive: String,
        /// The datapath that uses it first (in name order).
        owner: String,
    },
    /// A datapath or resolver joined by a second store (path: the second
    /// use).
    #[error("{kind} {name:?} is already used by store {owner:?} (one store per {kind})")]
    AlreadyInStore {
        /// Resolver or datapath.
        kind: RefKind,
        /// Its name.
        name: String,
        /// The store that uses it first (in name order).
        owner: String,
    },
    /// A stripe unit that is not a power of two or is below 4096 bytes.
    #[error("invalid stripe unit {stripe_unit}: must be a power of two and at least 4096 bytes")]
    StripeUnit {
        /// The value, bytes.
        stripe_unit: ByteSize,
    },
    /// A stripe unit that is not a multiple of a striped emulated
    /// namespace's block size (checked when the config is validated).
    #[error(
        "stripe unit {stripe_unit} is not a multiple of the block size {block_size} of drive {drive:?} namespace {nsid}"
    )]
    StripeUnitBlockSize {
        /// The value, bytes.
        stripe_unit: ByteSize,
        /// The drive.
        drive: String,
        /// The NSID.
        nsid: u32,
        /// Its block size, bytes.
        block_size: u32,
    },
    /// A stripe unit that is not a multiple of the LBA size of a drive
    /// whose LBA size is only known once it is opened (a `pci` drive;
    /// checked when the runtime starts). Path: the datapath's
    /// `stripe_unit`.
    #[error(
        "stripe unit {unit} bytes is not a multiple of drive {drive:?}'s {lba_size}-byte LBA size; use a multiple of it"
    )]
    StripeUnitVsLbaSize {
        /// The stripe unit, bytes.
        unit: u64,
        /// The drive.
        drive: String,
        /// The LBA size of the drive's namespace in use, bytes.
        lba_size: u32,
    },
    /// A queue depth above the drive's maximum queue size (CAP.MQES + 1).
    #[error("queue depth {queue_depth} exceeds drive {drive:?}'s maximum queue size {max} (CAP.MQES + 1)")]
    QueueDepthExceedsMqes {
        /// The value, entries.
        queue_depth: u32,
        /// The drive.
        drive: String,
        /// CAP.MQES + 1 of the drive, entries.
        max: u32,
    },
    /// More I/O queue pairs than the drive grants.
    #[error("{queues} queues exceed drive {drive:?}'s {io_queues} I/O queues")]
    QueuesExceedIoQueues {
        /// The value.
        queues: u16,
        /// The drive.
        drive: String,
        /// The drive's `io_queues`.
        io_queues: u16,
    },
    /// A namespace the drive has but tutti cannot use (checked when the
    /// drive is opened), e.g. one formatted with metadata: the reason says
    /// how to reformat it or which namespace to pick instead.
    #[error("drive {drive:?}: {reason}")]
    NamespaceUnsupported {
        /// The drive.
        drive: String,
        /// Why, from the driver.
        reason: nvm_queue::NamespaceError,
    },
}

/// ` (line L, column C)`, ` (line L)` or nothing, for
/// [`ConfigErrorKind::Parse`].
fn fmt_location(line: Option<u32>, column: Option<u32>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" (line {l}, column {c})"),
        (Some(l), None) => format!(" (line {l})"),
        _ => String::new(),
    }
}

/// How to fix [`ConfigErrorKind::NamespaceMissing`].
fn namespace_hint(active: &[u32]) -> &'static str {
    if active.is_empty() {
        "the drive has none: create and attach a namespace first"
    } else {
        "set nsid to one of them"
    }
}
