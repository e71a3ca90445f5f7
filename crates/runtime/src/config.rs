//! The runtime's YAML configuration.
//!
//! A config describes a graph of four kinds of named objects:
//!
//! - **drives** (resources): NVMe controllers, emulated
//!   ([`DriveConfig::Emulated`]) or PCI functions bound to vfio-pci
//!   ([`DriveConfig::Pci`]);
//! - **resolvers**: turn a key into byte extents of a datapath's byte space
//!   ([`ResolverConfig::Slab`]);
//! - **datapaths**: turn byte requests into NVMe commands on one drive
//!   ([`DataPathConfig::LocalNvme`]) or striped over 2 to 4 drives
//!   ([`DataPathConfig::StripedLocalNvme`]);
//! - **stores**: join one resolver to one datapath ([`StoreConfig`]).
//!
//! Every section is a map keyed by name; every drive, resolver and datapath
//! entry is an externally tagged single-key map naming its kind:
//!
//! ```yaml
//! drives:
//!   d0:
//!     emulated:
//!       namespaces:
//!         - { capacity: 1GiB, block_size: 4096 }
//!       backing: ram
//!   d1:
//!     emulated:
//!       namespaces: [ { capacity: 1GiB, block_size: 4096 } ]
//! resolvers:
//!   kv:
//!     slab: { slot_size: 1MiB }
//! datapaths:
//!   stripe:
//!     striped_local_nvme: { drives: [d0, d1], stripe_unit: 128KiB }
//! stores:
//!   kv: { resolver: kv, datapath: stripe }
//! ```
//!
//! The config fails closed: an unknown key, a duplicate key, a map naming two
//! kinds at once, or a byte size with a unit other than `B`, `KiB`, `MiB`,
//! `GiB`, `TiB` is refused while parsing; dangling references, out-of-range
//! values and shared drives are refused by [`Config::validate`], which
//! [`Config::from_yaml_str`] and [`Config::from_path`] always run. Every
//! [`ConfigError`] names the key path of the offending value, e.g.
//! `drives.d0.emulated.mqes` or `datapaths.stripe.striped_local_nvme.drives[2]`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

// ---------------------------------------------------------------------------
// ByteSize
// ---------------------------------------------------------------------------

/// A size in bytes.
///
/// In YAML it is either a non-negative integer (bytes) or a string made of a
/// non-negative decimal integer, optional spaces and one of the IEC units
/// `B`, `KiB` (2^10), `MiB` (2^20), `GiB` (2^30), `TiB` (2^40), e.g. `4096`,
/// `"4096"`, `128KiB`, `1 GiB`. Units are case-sensitive; SI or shorthand
/// units (`K`, `KB`, `M`, `MB`, `G`, ...), fractions (`1.5GiB`), signs and
/// values that overflow `u64` are refused.
///
/// [`Display`](fmt::Display) prints the largest IEC unit that divides the
/// value exactly (`128KiB`, `1GiB`, `4097B`); the output parses back to the
/// same value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// The units [`ByteSize`] accepts, largest first, with their multipliers.
const BYTE_UNITS: [(&str, u64); 5] =
    [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)];

const BYTE_SIZE_EXPECTED: &str = "expected an integer number of bytes, or an integer with unit \
     B, KiB, MiB, GiB or TiB (e.g. 128KiB); K/KB/M/MB/G/GB/T/TB and fractions are not accepted";

/// Why a string is not a [`ByteSize`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ByteSizeParseError {
    /// The string has no leading decimal digits (empty, signed, or a fraction
    /// like `.5GiB`).
    #[error("invalid byte size {input:?}: {BYTE_SIZE_EXPECTED}")]
    NotANumber {
        /// The input as given.
        input: String,
    },
    /// The unit after the number is not one of the accepted IEC units.
    #[error("invalid byte size {input:?}: unknown unit {unit:?}; {BYTE_SIZE_EXPECTED}")]
    UnknownUnit {
        /// The input as given.
        input: String,
        /// What followed the number.
        unit: String,
    },
    /// The number has a fractional part (`1.5GiB`).
    #[error("invalid byte size {input:?}: fractions are not accepted; {BYTE_SIZE_EXPECTED}")]
    Fraction {
        /// The input as given.
        input: String,
    },
    /// The value does not fit in 64 bits.
    #[error("invalid byte size {input:?}: larger than 2^64 - 1 bytes")]
    Overflow {
        /// The input as given.
        input: String,
    },
}

impl ByteSize {
    /// `n` bytes.
    pub const fn b(n: u64) -> Self {
        Self(n)
    }
    /// `n` KiB (`n * 2^10` bytes). Panics on overflow (const context: fails to compile).
    pub const fn kib(n: u64) -> Self {
        Self(n * (1 << 10))
    }
    /// `n` MiB (`n * 2^20` bytes). Panics on overflow.
    pub const fn mib(n: u64) -> Self {
        Self(n * (1 << 20))
    }
    /// `n` GiB (`n * 2^30` bytes). Panics on overflow.
    pub const fn gib(n: u64) -> Self {
        Self(n * (1 << 30))
    }
    /// `n` TiB (`n * 2^40` bytes). Panics on overflow.
    pub const fn tib(n: u64) -> Self {
        Self(n * (1 << 40))
    }
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl From<u64> for ByteSize {
    fn from(n: u64) -> Self {
        Self(n)
    }
}

impl From<ByteSize> for u64 {
    fn from(b: ByteSize) -> Self {
        b.0
    }
}

impl std::str::FromStr for ByteSize {
    type Err = ByteSizeParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let s = input.trim();
        let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (digits, rest) = s.split_at(digits_end);
        if digits.is_empty() {
            return Err(ByteSizeParseError::NotANumber { input: input.to_owned() });
        }
        if rest.starts_with(['.', ',']) {
            return Err(ByteSizeParseError::Fraction { input: input.to_owned() });
        }
        let unit = rest.trim_start();
        let multiplier = if unit.is_empty() {
            1
        } else {
            match BYTE_UNITS.iter().find(|(name, _)| *name == unit) {
                Some(&(_, m)) => m,
                None => {
                    return Err(ByteSizeParseError::UnknownUnit {
                        input: input.to_owned(),
                        unit: unit.to_owned(),
                    })
                }
            }
        };
        let overflow = || ByteSizeParseError::Overflow { input: input.to_owned() };
        let n: u64 = digits.parse().map_err(|_| overflow())?;
        n.checked_mul(multiplier).map(ByteSize).ok_or_else(overflow)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, m) = BYTE_UNITS
            .iter()
            .find(|(_, m)| self.0 != 0 && self.0.is_multiple_of(*m))
            .copied()
            .unwrap_or(("B", 1));
        write!(f, "{}{}", self.0 / m, name)
    }
}

impl Serialize for ByteSize {
    /// Serialized as its [`Display`](fmt::Display) form (`128KiB`), or as a
    /// plain integer when that has no larger unit than `B`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.is_multiple_of(1024) && self.0 != 0 {
            serializer.collect_str(self)
        } else {
            serializer.serialize_u64(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ByteSizeVisitor;

        impl Visitor<'_> for ByteSizeVisitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a byte size (an integer number of bytes, or an integer with unit \
                     B, KiB, MiB, GiB or TiB)",
                )
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v).map(ByteSize).map_err(|_| {
                    E::custom(format_args!("invalid byte size {v}: negative; {BYTE_SIZE_EXPECTED}"))
                })
            }

            fn visit_u128<E: de::Error>(self, v: u128) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format_args!("invalid byte size {v}: larger than 2^64 - 1 bytes")))
            }

            fn visit_i128<E: de::Error>(self, v: i128) -> Result<ByteSize, E> {
                if v < 0 {
                    return Err(E::custom(format_args!(
                        "invalid byte size {v}: negative; {BYTE_SIZE_EXPECTED}"
                    )));
                }
                self.visit_u128(v.unsigned_abs())
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteSize, E> {
                Err(E::custom(format_args!(
                    "invalid byte size {v}: fractions are not accepted; {BYTE_SIZE_EXPECTED}"
                )))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_any(ByteSizeVisitor)
    }
}

// ---------------------------------------------------------------------------
// Config types
// ---------------------------------------------------------------------------

/// The whole runtime configuration: four maps keyed by object name.
///
/// Every section may be omitted (empty). Names are non-empty strings; the
/// map order (sorted by name) is the order in which the runtime assembles
/// objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// NVMe drives (resources), by name.
    #[serde(default)]
    pub drives: BTreeMap<String, DriveConfig>,
    /// Resolvers (key -> byte extents), by name.
    #[serde(default)]
    pub resolvers: BTreeMap<String, ResolverConfig>,
    /// Datapaths (byte requests -> NVMe commands), by name.
    #[serde(default)]
    pub datapaths: BTreeMap<String, DataPathConfig>,
    /// Stores (one resolver joined to one datapath), by name.
    #[serde(default)]
    pub stores: BTreeMap<String, StoreConfig>,
}

/// One drive. Externally tagged: the single key names the kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum DriveConfig {
    /// A software NVMe controller (`nvme-emu`) running in this process.
    Emulated(EmulatedDriveConfig),
    /// A real NVMe controller (or QEMU's), a PCI function already bound to
    /// vfio-pci (`tutti-probe bind <addr>`), driven through the project's
    /// own queues.
    Pci(PciDriveConfig),
}

/// A PCI NVMe function driven through vfio-pci (`nvme-pci`).
///
/// YAML: `{ pci: { addr: "0000:01:00.0" } }`. Its namespaces, MQES and the
/// number of queue pairs it grants are read from the controller when the
/// runtime starts, so the checks that need them run then, not at parse
/// time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PciDriveConfig {
    /// PCI address, `dddd:bb:dd.f` (the domain may be omitted: `01:00.0`).
    pub addr: String,
    /// Accept a function bound to `uio_pci_generic` (or VFIO no-IOMMU) and
    /// program physical addresses: device DMA is then not confined by an
    /// IOMMU. Default `false`. See docs/real-drives.md.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_no_iommu: bool,
}

/// An emulated NVMe controller (`nvme-emu`).
///
/// The fields set the controller's registers and Identify data; only
/// `namespaces` is required.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmulatedDriveConfig {
    /// The namespaces, NSID 1, 2, ... in list order. At least one.
    pub namespaces: Vec<NamespaceConfig>,
    /// Where the data lives. Default [`Backing::Ram`].
    #[serde(default)]
    pub backing: Backing,
    /// CAP.MQES: maximum I/O queue size, **zero-based** (a value of 1023
    /// means 1024 entries). 1..=65535, default 1023. NVMe Base 2.0 §3.1.4.1.
    #[serde(default = "default_mqes")]
    pub mqes: u16,
    /// CAP.DSTRD: doorbell stride, the doorbells are `4 << dstrd` bytes
    /// apart. 0..=15, default 0. NVMe Base 2.0 §3.1.4.1.
    #[serde(default)]
    pub dstrd: u8,
    /// Identify Controller MDTS: maximum data transfer size is
    /// `2^mdts * 4 KiB` (CAP.MPSMIN = 4 KiB); 0 means no limit.
    /// 0..=31, default 5 (128 KiB). NVMe Base 2.0 §5.17.2.1.
    #[serde(default = "default_mdts")]
    pub mdts: u8,
    /// Number of I/O queue pairs the controller grants (Set Features,
    /// Number of Queues). 1..=65535, default 8.
    #[serde(default = "default_io_queues")]
    pub io_queues: u16,
    /// Timing model. Absent: commands complete as fast as the CPU goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<TimingConfig>,
    /// Fault injection, for testing error handling: commands matching a
    /// rule fail, never complete, or complete late. Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FaultConfig>,
}

/// One fault-injection rule of an emulated drive (the emulator's
/// `FaultRule`). YAML: `{ lba: [400, 401], op: read, action: never_complete }`,
/// `action: { fail: { sct: 2, sc: 0x81, dnr: true } }`,
/// `action: { delay_us: 5000 }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// Logical blocks `[start, end)`: I/O commands touching any of them
    /// match. Absent: every command (admin included) matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lba: Option<[u64; 2]>,
    /// Namespace to match. Absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    /// Command to match. Absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<FaultOp>,
    /// What happens to a matching command.
    pub action: FaultActionConfig,
    /// Apply to the first `times` matches only. Absent: every match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u64>,
}

/// Command kinds a fault rule can match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultOp {
    /// NVM Read (02h).
    Read,
    /// NVM Write (01h).
    Write,
}

/// What a fault rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultActionConfig {
    /// Complete with this NVMe status; no data moves.
    Fail {
        /// Status Code Type, 0..=7.
        sct: u8,
        /// Status Code.
        sc: u8,
        /// Do Not Retry.
        #[serde(default)]
        dnr: bool,
    },
    /// Fetch the command but never complete it.
    NeverComplete,
    /// Do not complete it; set CSTS.CFS and stop all queues until the
    /// controller is reset (`Runtime::reset_drive`).
    ControllerFatal,
    /// Complete normally, this many microseconds late.
    DelayUs(u64),
}

fn default_mqes() -> u16 {
    1023
}
fn default_mdts() -> u8 {
    5
}
fn default_io_queues() -> u16 {
    8
}
fn default_nsid() -> u32 {
    1
}
fn default_queues() -> u16 {
    2
}
fn default_queue_depth() -> u32 {
    256
}
fn default_stripe_unit() -> ByteSize {
    ByteSize::kib(128)
}

impl EmulatedDriveConfig {
    /// An emulated drive with the given namespaces and every other field at
    /// its default.
    pub fn with_namespaces(namespaces: Vec<NamespaceConfig>) -> Self {
        Self {
            namespaces,
            backing: Backing::default(),
            mqes: default_mqes(),
            dstrd: 0,
            mdts: default_mdts(),
            io_queues: default_io_queues(),
            timing: None,
            faults: Vec::new(),
        }
    }
}

/// One namespace of an emulated drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Size in bytes; a non-zero multiple of `block_size`.
    pub capacity: ByteSize,
    /// Logical block size in bytes: 512 or 4096.
    pub block_size: u32,
}

/// Where an emulated drive keeps its data.
///
/// YAML: `ram`, `null`, or `{ file: /path/to/sparse/file }`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Backing {
    /// Data lives in process memory (allocated lazily per namespace).
    #[default]
    Ram,
    /// No data movement at all: writes are discarded and reads transfer
    /// nothing (the host buffer is left untouched). For command-rate
    /// benchmarks only; never use it where the data matters.
    Null,
    /// Data lives in a (sparse) file at this path, created if missing.
    File(PathBuf),
}

/// The emulator's timing model. Every limit is per drive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimingConfig {
    /// Added latency per command, in microseconds. Default 0.
    #[serde(default)]
    pub latency_us: u64,
    /// Media bandwidth cap in MB/s (10^6 bytes per second). Absent: no cap.
    /// Must be non-zero when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_mb_s: Option<u64>,
    /// Command rate cap in commands per second. Absent: no cap. Must be
    /// non-zero when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
}

/// One resolver. Externally tagged: the single key names the kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum ResolverConfig {
    /// The datapath's byte space divided into fixed-size slots.
    Slab(SlabConfig),
}

/// The slab resolver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlabConfig {
    /// Slot size in bytes; a non-zero multiple of 4096.
    pub slot_size: ByteSize,
}

/// One datapath. Externally tagged: the single key names the kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum DataPathConfig {
    /// One namespace of one drive.
    LocalNvme(LocalNvmeConfig),
    /// The same namespace of 2 to 4 drives, striped in `stripe_unit` chunks.
    StripedLocalNvme(StripedConfig),
}

/// Who submits a datapath's NVMe commands and polls their completions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Execution {
    /// CPU threads: the caller's thread writes SQEs in `submit` and polls
    /// completions in `wait`.
    #[default]
    Cpu,
    /// GPU threads: one `submit` is one kernel launch for the whole batch;
    /// the kernel writes the SQEs, rings the doorbells and polls the CQs.
    /// Needs a CUDA GPU (the runtime refuses to start without one).
    Gpu,
}

/// A datapath over one namespace of one drive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalNvmeConfig {
    /// Name of the drive (a key of [`Config::drives`]).
    pub drive: String,
    /// Namespace ID (1-based). Default 1.
    #[serde(default = "default_nsid")]
    pub nsid: u32,
    /// Number of I/O queue pairs to create on the drive; 1..=the drive's
    /// `io_queues`. Default 2.
    #[serde(default = "default_queues")]
    pub queues: u16,
    /// Entries per I/O queue (one slot always stays empty, so at most
    /// `queue_depth - 1` commands are outstanding per queue). 2..=65536 and
    /// at most CAP.MQES + 1 of the drive. Default 256.
    #[serde(default = "default_queue_depth")]
    pub queue_depth: u32,
    /// CPU or GPU submission. Default `cpu`.
    #[serde(default)]
    pub execution: Execution,
}

/// A datapath striped over the same namespace of 2 to 4 drives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StripedConfig {
    /// Names of the drives (keys of [`Config::drives`]), 2 to 4 distinct
    /// ones, in stripe order.
    pub drives: Vec<String>,
    /// Namespace ID (1-based) used on every drive. Default 1.
    #[serde(default = "default_nsid")]
    pub nsid: u32,
    /// Stripe unit in bytes: a power of two, at least 4096, and a multiple of
    /// every used namespace's block size. Default 128 KiB.
    #[serde(default = "default_stripe_unit")]
    pub stripe_unit: ByteSize,
    /// I/O queue pairs per drive; 1..=each drive's `io_queues`. Default 2.
    #[serde(default = "default_queues")]
    pub queues_per_drive: u16,
    /// Entries per I/O queue, as in [`LocalNvmeConfig::queue_depth`].
    /// Default 256.
    #[serde(default = "default_queue_depth")]
    pub queue_depth: u32,
    /// CPU or GPU submission. Default `cpu`.
    #[serde(default)]
    pub execution: Execution,
}

/// A store: one resolver joined to one datapath.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// Name of the resolver (a key of [`Config::resolvers`]).
    pub resolver: String,
    /// Name of the datapath (a key of [`Config::datapaths`]).
    pub datapath: String,
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// What kind of object a name refers to, in [`ConfigError::UnknownReference`].
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

/// A refused configuration. Every variant carries `path`, the key path of
/// the offending value (`drives.d0.emulated.mqes`,
/// `datapaths.stripe.striped_local_nvme.drives[2]`), and its message starts
/// with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A fault rule's LBA range is empty or reversed.
    #[error("{path}: empty LBA range [{start}, {end})")]
    FaultRange {
        /// Key path.
        path: String,
        /// First block.
        start: u64,
        /// One past the last block.
        end: u64,
    },
    /// A PCI drive's address is malformed.
    #[error("{path}: {addr:?} is not a PCI address (want dddd:bb:dd.f, e.g. 0000:01:00.0)")]
    PciAddr {
        /// Key path.
        path: String,
        /// The address as written.
        addr: String,
    },
    /// Two PCI drives name the same function.
    #[error("{path}: PCI function {addr} is already drive {other:?}")]
    SharedPciFunction {
        /// Key path of the second drive's address.
        path: String,
        /// The address, normalised.
        addr: String,
        /// The drive that names it first.
        other: String,
    },
    /// Two emulated drives name the same backing file.
    #[error("{path}: backing file {} is already used by drive {other:?}", file.display())]
    SharedBackingFile {
        /// Key path of the second drive's backing.
        path: String,
        /// The file.
        file: PathBuf,
        /// The drive that uses it first.
        other: String,
    },
    /// The config file could not be read.
    #[error("{}: cannot read config file", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or does not match the schema: syntax error,
    /// unknown key, duplicate key, two kinds in one entry, wrong type, bad
    /// byte size, missing required field.
    #[error("{path}: {message}{}", fmt_location(*line, *column))]
    Parse {
        /// Key path (`.` for the document root).
        path: String,
        /// 1-based line of the error in the YAML text, if known.
        line: Option<u32>,
        /// 1-based column of the error in the YAML text, if known.
        column: Option<u32>,
        /// The parser's message, without the source snippet.
        message: String,
    },
    /// An object name (a map key) is empty.
    #[error("{path}: empty name")]
    EmptyName {
        /// Path of the section holding the empty key.
        path: String,
    },
    /// A name refers to no object of the expected kind.
    #[error("{path}: unknown {kind} {name:?}")]
    UnknownReference {
        /// Path of the reference.
        path: String,
        /// What the name should refer to.
        kind: RefKind,
        /// The name.
        name: String,
    },
    /// A number is outside its allowed range.
    #[error("{path}: invalid value {value}: must be in {min}..={max}")]
    OutOfRange {
        /// Path of the value.
        path: String,
        /// The value.
        value: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// An emulated drive has no namespace.
    #[error("{path}: a drive needs at least one namespace")]
    NoNamespaces {
        /// Path of the namespace list.
        path: String,
    },
    /// A block size other than 512 or 4096.
    #[error("{path}: invalid block size {block_size}: must be 512 or 4096")]
    BlockSize {
        /// Path of the block size.
        path: String,
        /// The value, bytes.
        block_size: u32,
    },
    /// A namespace capacity that is zero or not a multiple of its block size.
    #[error(
        "{path}: invalid capacity {capacity}: must be a non-zero multiple of the block size {block_size}"
    )]
    Capacity {
        /// Path of the capacity.
        path: String,
        /// The capacity, bytes.
        capacity: ByteSize,
        /// The namespace's block size, bytes.
        block_size: u32,
    },
    /// A slab slot size that is zero or not a multiple of 4096.
    #[error("{path}: invalid slot size {slot_size}: must be a non-zero multiple of 4096 bytes")]
    SlotSize {
        /// Path of the slot size.
        path: String,
        /// The value, bytes.
        slot_size: ByteSize,
    },
    /// A namespace ID that the drive does not have.
    #[error("{path}: drive {drive:?} has no namespace {nsid} (it has NSIDs 1..={namespaces})")]
    UnknownNamespace {
        /// Path of the NSID.
        path: String,
        /// The drive.
        drive: String,
        /// The NSID asked for.
        nsid: u32,
        /// How many namespaces the drive has.
        namespaces: usize,
    },
    /// A striped datapath with fewer than 2 or more than 4 drives.
    #[error("{path}: a striped datapath needs {min} to {max} drives, got {count}")]
    StripeWidth {
        /// Path of the drive list.
        path: String,
        /// Number of drives given.
        count: usize,
        /// Fewest drives allowed (2).
        min: usize,
        /// Most drives allowed (4).
        max: usize,
    },
    /// The same drive listed twice in one striped datapath.
    #[error("{path}: drive {drive:?} is listed twice in the stripe")]
    DuplicateStripeDrive {
        /// Path of the second occurrence.
        path: String,
        /// The drive.
        drive: String,
    },
    /// A drive used by a second datapath (one owner per drive).
    #[error("{path}: drive {drive:?} is already used by datapath {owner:?} (one datapath per drive)")]
    DriveAlreadyOwned {
        /// Path of the second use.
        path: String,
        /// The drive.
        drive: String,
        /// The datapath that uses it first (in name order).
        owner: String,
    },
    /// A datapath or resolver joined by a second store.
    #[error("{path}: {kind} {name:?} is already used by store {owner:?} (one store per {kind})")]
    AlreadyInStore {
        /// Path of the second use.
        path: String,
        /// Resolver or datapath.
        kind: RefKind,
        /// Its name.
        name: String,
        /// The store that uses it first (in name order).
        owner: String,
    },
    /// A stripe unit that is not a power of two or is below 4096 bytes.
    #[error("{path}: invalid stripe unit {stripe_unit}: must be a power of two and at least 4096 bytes")]
    StripeUnit {
        /// Path of the stripe unit.
        path: String,
        /// The value, bytes.
        stripe_unit: ByteSize,
    },
    /// A stripe unit that is not a multiple of a striped namespace's block size.
    #[error("{path}: stripe unit {stripe_unit} is not a multiple of the block size {block_size} of drive {drive:?} namespace {nsid}")]
    StripeUnitBlockSize {
        /// Path of the stripe unit.
        path: String,
        /// The value, bytes.
        stripe_unit: ByteSize,
        /// The drive.
        drive: String,
        /// The NSID.
        nsid: u32,
        /// Its block size, bytes.
        block_size: u32,
    },
    /// A queue depth above the drive's maximum queue size (CAP.MQES + 1).
    #[error(
        "{path}: queue depth {queue_depth} exceeds drive {drive:?}'s maximum queue size {max} (CAP.MQES + 1)"
    )]
    QueueDepthExceedsMqes {
        /// Path of the queue depth.
        path: String,
        /// The value, entries.
        queue_depth: u32,
        /// The drive.
        drive: String,
        /// CAP.MQES + 1 of the drive, entries.
        max: u32,
    },
    /// More I/O queue pairs than the drive grants.
    #[error("{path}: {queues} queues exceed drive {drive:?}'s {io_queues} I/O queues")]
    QueuesExceedIoQueues {
        /// Path of the queue count.
        path: String,
        /// The value.
        queues: u16,
        /// The drive.
        drive: String,
        /// The drive's `io_queues`.
        io_queues: u16,
    },
}

fn fmt_location(line: Option<u32>, column: Option<u32>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" (line {l}, column {c})"),
        (Some(l), None) => format!(" (line {l})"),
        _ => String::new(),
    }
}

impl ConfigError {
    /// The key path of the offending value (for [`ConfigError::Io`], the
    /// file path).
    pub fn path(&self) -> String {
        match self {
            ConfigError::Io { file, .. } => file.display().to_string(),
            ConfigError::Parse { path, .. }
            | ConfigError::EmptyName { path }
            | ConfigError::UnknownReference { path, .. }
            | ConfigError::OutOfRange { path, .. }
            | ConfigError::NoNamespaces { path }
            | ConfigError::BlockSize { path, .. }
            | ConfigError::Capacity { path, .. }
            | ConfigError::SlotSize { path, .. }
            | ConfigError::UnknownNamespace { path, .. }
            | ConfigError::StripeWidth { path, .. }
            | ConfigError::DuplicateStripeDrive { path, .. }
            | ConfigError::DriveAlreadyOwned { path, .. }
            | ConfigError::AlreadyInStore { path, .. }
            | ConfigError::StripeUnit { path, .. }
            | ConfigError::StripeUnitBlockSize { path, .. }
            | ConfigError::QueueDepthExceedsMqes { path, .. }
            | ConfigError::QueuesExceedIoQueues { path, .. }
            | ConfigError::SharedBackingFile { path, .. }
            | ConfigError::PciAddr { path, .. }
            | ConfigError::SharedPciFunction { path, .. }
            | ConfigError::FaultRange { path, .. } => path.clone(),
        }
    }
}

// ---------------------------------------------------------------------------
// Parsing, printing, building
// ---------------------------------------------------------------------------

/// Fewest drives in a striped datapath.
pub const MIN_STRIPE_DRIVES: usize = 2;
/// Most drives in a striped datapath.
pub const MAX_STRIPE_DRIVES: usize = 4;

impl Config {
    /// Parses a YAML document and [validates](Config::validate) it.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Parse`] (with key path, line and column) for malformed
    /// YAML or a schema mismatch; any other variant from
    /// [`Config::validate`].
    pub fn from_yaml_str(yaml: &str) -> Result<Config, ConfigError> {
        let config = Self::parse_yaml_str(yaml)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads a YAML file and parses and validates it as
    /// [`Config::from_yaml_str`] does.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Io`] if the file cannot be read, else as
    /// [`Config::from_yaml_str`].
    pub fn from_path(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let yaml = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Io { file: path.to_owned(), source })?;
        Self::from_yaml_str(&yaml)
    }

    /// Parses without semantic validation (schema errors only).
    fn parse_yaml_str(yaml: &str) -> Result<Config, ConfigError> {
        let mut key_path: Option<String> = None;
        let result = serde_saphyr::with_deserializer_from_str(yaml, |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                key_path = Some(e.path().to_string());
                e.into_inner()
            })
        });
        result.map_err(|e| {
            let location = e.location();
            let message = e.without_snippet().to_string();
            // Keep the message on one line, and drop serde-saphyr's own
            // " at line X, column Y" suffix: the fields carry it.
            let mut message = message.lines().next().unwrap_or_default().to_owned();
            if let Some(l) = location {
                let suffix = format!(" at line {}, column {}", l.line(), l.column());
                if message.ends_with(&suffix) {
                    message.truncate(message.len() - suffix.len());
                }
            }
            // serde-saphyr's wording for a second key after an externally
            // tagged enum's variant (`emulated: ..` next to `pci: ..`).
            if message.starts_with("expected end of mapping after enum variant") {
                message.push_str("; an entry names exactly one kind (mixed kind keys are refused)");
            }
            ConfigError::Parse {
                path: key_path.unwrap_or_else(|| ".".to_owned()),
                line: location.map(|l| l.line() as u32),
                column: location.map(|l| l.column() as u32),
                message,
            }
        })
    }

    /// Prints the config back as YAML; [`Config::from_yaml_str`] parses the
    /// output to an equal config.
    ///
    /// # Errors
    ///
    /// The serializer's error, which does not happen for these types.
    pub fn to_yaml_string(&self) -> Result<String, serde_saphyr::SerializeError> {
        serde_saphyr::to_string(self)
    }

    /// The bench's default config: `drives` emulated RAM drives named
    /// `d0`, `d1`, ... with one namespace of `capacity_per_drive` bytes in
    /// 4096-byte blocks (all other drive fields at their defaults), one slab
    /// resolver `kv` with `slot_size`-byte slots, and one store `kv`.
    ///
    /// With 2 or more drives the datapath is `stripe`, a
    /// `striped_local_nvme` over all of them with a 128 KiB stripe unit; with
    /// one drive it is `local`, a `local_nvme` on `d0`. The result is not
    /// validated: more than 4 drives, no drive, or sizes that are not
    /// multiples of 4096 are reported by [`Config::validate`].
    pub fn builtin_striped_ram(drives: usize, capacity_per_drive: u64, slot_size: u64) -> Config {
        let names: Vec<String> = (0..drives).map(|i| format!("d{i}")).collect();
        let drive = DriveConfig::Emulated(EmulatedDriveConfig::with_namespaces(vec![NamespaceConfig {
            capacity: ByteSize(capacity_per_drive),
            block_size: 4096,
        }]));
        let (dp_name, datapath) = if drives == 1 {
            (
                "local",
                DataPathConfig::LocalNvme(LocalNvmeConfig {
                    drive: names[0].clone(),
                    nsid: default_nsid(),
                    queues: default_queues(),
                    queue_depth: default_queue_depth(),
                    execution: Execution::Cpu,
                }),
            )
        } else {
            (
                "stripe",
                DataPathConfig::StripedLocalNvme(StripedConfig {
                    drives: names.clone(),
                    nsid: default_nsid(),
                    stripe_unit: default_stripe_unit(),
                    queues_per_drive: default_queues(),
                    queue_depth: default_queue_depth(),
                    execution: Execution::Cpu,
                }),
            )
        };
        Config {
            drives: names.into_iter().map(|n| (n, drive.clone())).collect(),
            resolvers: BTreeMap::from([(
                "kv".to_owned(),
                ResolverConfig::Slab(SlabConfig { slot_size: ByteSize(slot_size) }),
            )]),
            datapaths: BTreeMap::from([(dp_name.to_owned(), datapath)]),
            stores: BTreeMap::from([(
                "kv".to_owned(),
                StoreConfig { resolver: "kv".to_owned(), datapath: dp_name.to_owned() },
            )]),
        }
    }

    /// Checks everything the schema cannot: references, ranges, sharing.
    ///
    /// Rules (the first violation found is returned, sections checked in
    /// the order drives, resolvers, datapaths, stores, each in name order):
    ///
    /// - names are non-empty;
    /// - emulated drives: at least one namespace; block size 512 or 4096;
    ///   capacity a non-zero multiple of the block size; CAP.MQES >= 1;
    ///   CAP.DSTRD <= 15; MDTS <= 31; `io_queues` >= 1; timing caps, when
    ///   present, non-zero;
    /// - slab: slot size a non-zero multiple of 4096;
    /// - datapaths: every drive exists; the NSID exists on it; `queue_depth`
    ///   in 2..=65536 and <= CAP.MQES + 1; queues in 1..=`io_queues`; a
    ///   striped datapath has 2..=4 distinct drives and a stripe unit that is
    ///   a power of two, >= 4096 and a multiple of each namespace's block
    ///   size; no drive is used by two datapaths;
    /// - stores: the resolver and datapath exist; no resolver or datapath is
    ///   joined by two stores (they would share one byte space).
    ///
    /// # Errors
    ///
    /// The first rule broken, as a [`ConfigError`] naming its key path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut files: BTreeMap<PathBuf, &str> = BTreeMap::new();
        let mut functions: BTreeMap<String, &str> = BTreeMap::new();
        for (name, drive) in &self.drives {
            check_name("drives", name)?;
            match drive {
                DriveConfig::Pci(pci) => {
                    let path = format!("drives.{name}.pci.addr");
                    let addr = normalize_pci_addr(&pci.addr)
                        .ok_or_else(|| ConfigError::PciAddr { path: path.clone(), addr: pci.addr.clone() })?;
                    if let Some(other) = functions.insert(addr.clone(), name) {
                        return Err(ConfigError::SharedPciFunction { path, addr, other: other.to_owned() });
                    }
                }
                DriveConfig::Emulated(emu) => {
                    emu.validate(&format!("drives.{name}.emulated"))?;
                    if let Backing::File(f) = &emu.backing {
                        // Two drives on one file would overwrite each other's
                        // blocks; compare canonical paths where the file exists.
                        let key = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
                        if let Some(other) = files.insert(key, name) {
                            return Err(ConfigError::SharedBackingFile {
                                path: format!("drives.{name}.emulated.backing"),
                                file: f.clone(),
                                other: other.to_owned(),
                            });
                        }
                    }
                }
            }
        }
        for (name, resolver) in &self.resolvers {
            check_name("resolvers", name)?;
            match resolver {
                ResolverConfig::Slab(slab) => {
                    let s = slab.slot_size;
                    if s.0 == 0 || s.0 % 4096 != 0 {
                        return Err(ConfigError::SlotSize {
                            path: format!("resolvers.{name}.slab.slot_size"),
                            slot_size: s,
                        });
                    }
                }
            }
        }
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, dp) in &self.datapaths {
            check_name("datapaths", name)?;
            match dp {
                DataPathConfig::LocalNvme(c) => {
                    let base = format!("datapaths.{name}.local_nvme");
                    let path = format!("{base}.drive");
                    let drive = self.drive(&path, &c.drive)?;
                    claim(&mut owners, &path, &c.drive, name)?;
                    check_queues(&base, "queues", c.queues, c.queue_depth, &c.drive, drive)?;
                    namespace(&format!("{base}.nsid"), &c.drive, drive, c.nsid)?;
                }
                DataPathConfig::StripedLocalNvme(c) => {
                    let base = format!("datapaths.{name}.striped_local_nvme");
                    let n = c.drives.len();
                    if !(MIN_STRIPE_DRIVES..=MAX_STRIPE_DRIVES).contains(&n) {
                        return Err(ConfigError::StripeWidth {
                            path: format!("{base}.drives"),
                            count: n,
                            min: MIN_STRIPE_DRIVES,
                            max: MAX_STRIPE_DRIVES,
                        });
                    }
                    let su = c.stripe_unit;
                    if !su.0.is_power_of_two() || su.0 < 4096 {
                        return Err(ConfigError::StripeUnit {
                            path: format!("{base}.stripe_unit"),
                            stripe_unit: su,
                        });
                    }
                    for (i, dname) in c.drives.iter().enumerate() {
                        let path = format!("{base}.drives[{i}]");
                        let drive = self.drive(&path, dname)?;
                        if c.drives[..i].contains(dname) {
                            return Err(ConfigError::DuplicateStripeDrive { path, drive: dname.clone() });
                        }
                        claim(&mut owners, &path, dname, name)?;
                        check_queues(
                            &base,
                            "queues_per_drive",
                            c.queues_per_drive,
                            c.queue_depth,
                            dname,
                            drive,
                        )?;
                        if let Some(ns) = namespace(&format!("{base}.nsid"), dname, drive, c.nsid)? {
                            if su.0 % u64::from(ns.block_size) != 0 {
                                return Err(ConfigError::StripeUnitBlockSize {
                                    path: format!("{base}.stripe_unit"),
                                    stripe_unit: su,
                                    drive: dname.clone(),
                                    nsid: c.nsid,
                                    block_size: ns.block_size,
                                });
                            }
                        }
                    }
                }
            }
        }
        let mut resolver_owner: BTreeMap<&str, &str> = BTreeMap::new();
        let mut datapath_owner: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, store) in &self.stores {
            check_name("stores", name)?;
            let path = format!("stores.{name}.resolver");
            if !self.resolvers.contains_key(&store.resolver) {
                return Err(ConfigError::UnknownReference {
                    path,
                    kind: RefKind::Resolver,
                    name: store.resolver.clone(),
                });
            }
            if let Some(owner) = resolver_owner.insert(&store.resolver, name) {
                return Err(ConfigError::AlreadyInStore {
                    path,
                    kind: RefKind::Resolver,
                    name: store.resolver.clone(),
                    owner: owner.to_owned(),
                });
            }
            let path = format!("stores.{name}.datapath");
            if !self.datapaths.contains_key(&store.datapath) {
                return Err(ConfigError::UnknownReference {
                    path,
                    kind: RefKind::DataPath,
                    name: store.datapath.clone(),
                });
            }
            if let Some(owner) = datapath_owner.insert(&store.datapath, name) {
                return Err(ConfigError::AlreadyInStore {
                    path,
                    kind: RefKind::DataPath,
                    name: store.datapath.clone(),
                    owner: owner.to_owned(),
                });
            }
        }
        Ok(())
    }

    fn drive(&self, path: &str, name: &str) -> Result<&DriveConfig, ConfigError> {
        self.drives.get(name).ok_or_else(|| ConfigError::UnknownReference {
            path: path.to_owned(),
            kind: RefKind::Drive,
            name: name.to_owned(),
        })
    }
}

impl EmulatedDriveConfig {
    fn validate(&self, base: &str) -> Result<(), ConfigError> {
        if self.namespaces.is_empty() {
            return Err(ConfigError::NoNamespaces { path: format!("{base}.namespaces") });
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            if ns.block_size != 512 && ns.block_size != 4096 {
                return Err(ConfigError::BlockSize {
                    path: format!("{base}.namespaces[{i}].block_size"),
                    block_size: ns.block_size,
                });
            }
            if ns.capacity.0 == 0 || ns.capacity.0 % u64::from(ns.block_size) != 0 {
                return Err(ConfigError::Capacity {
                    path: format!("{base}.namespaces[{i}].capacity"),
                    capacity: ns.capacity,
                    block_size: ns.block_size,
                });
            }
        }
        range(base, "mqes", self.mqes.into(), 1, u16::MAX.into())?;
        range(base, "dstrd", self.dstrd.into(), 0, 15)?;
        range(base, "mdts", self.mdts.into(), 0, 31)?;
        range(base, "io_queues", self.io_queues.into(), 1, u16::MAX.into())?;
        for (i, f) in self.faults.iter().enumerate() {
            let path = format!("{base}.faults[{i}]");
            if let Some([a, b]) = f.lba {
                if a >= b {
                    return Err(ConfigError::FaultRange { path: format!("{path}.lba"), start: a, end: b });
                }
            }
            if let FaultActionConfig::Fail { sct, .. } = f.action {
                range(&format!("{path}.action.fail"), "sct", sct.into(), 0, 7)?;
            }
        }
        if let Some(t) = &self.timing {
            let base = format!("{base}.timing");
            if let Some(bw) = t.bandwidth_mb_s {
                range(&base, "bandwidth_mb_s", bw, 1, u64::MAX)?;
            }
            if let Some(iops) = t.iops {
                range(&base, "iops", iops, 1, u64::MAX)?;
            }
        }
        Ok(())
    }
}

fn check_name(section: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::EmptyName { path: section.to_owned() });
    }
    Ok(())
}

fn range(base: &str, field: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange { path: format!("{base}.{field}"), value, min, max })
    }
}

/// Records `datapath` as the owner of `drive`, refusing a second owner.
fn claim<'a>(
    owners: &mut BTreeMap<&'a str, &'a str>,
    path: &str,
    drive: &'a str,
    datapath: &'a str,
) -> Result<(), ConfigError> {
    if let Some(owner) = owners.insert(drive, datapath) {
        return Err(ConfigError::DriveAlreadyOwned {
            path: path.to_owned(),
            drive: drive.to_owned(),
            owner: owner.to_owned(),
        });
    }
    Ok(())
}

/// Checks queue count and depth of a datapath against one of its drives.
fn check_queues(
    base: &str,
    queues_field: &str,
    queues: u16,
    queue_depth: u32,
    drive_name: &str,
    drive: &DriveConfig,
) -> Result<(), ConfigError> {
    range(base, queues_field, queues.into(), 1, u16::MAX.into())?;
    range(base, "queue_depth", queue_depth.into(), 2, 65536)?;
    match drive {
        DriveConfig::Emulated(emu) => {
            let max = u32::from(emu.mqes) + 1;
            if queue_depth > max {
                return Err(ConfigError::QueueDepthExceedsMqes {
                    path: format!("{base}.queue_depth"),
                    queue_depth,
                    drive: drive_name.to_owned(),
                    max,
                });
            }
            if queues > emu.io_queues {
                return Err(ConfigError::QueuesExceedIoQueues {
                    path: format!("{base}.{queues_field}"),
                    queues,
                    drive: drive_name.to_owned(),
                    io_queues: emu.io_queues,
                });
            }
        }
        // MQES and the queue grant are read from the controller at start:
        // the depth is clamped to CAP.MQES + 1 and the queue count to what
        // Set Features grants, with a warning.
        DriveConfig::Pci(_) => {}
    }
    Ok(())
}

/// `dddd:bb:dd.f` (lower case) for a PCI address written as `dddd:bb:dd.f`
/// or `bb:dd.f` (domain 0), surrounding spaces allowed; `None` when
/// malformed. The parsing is `nvme_pci::PciAddr`'s.
pub fn normalize_pci_addr(addr: &str) -> Option<String> {
    addr.trim().parse::<nvme_pci::PciAddr>().ok().map(|a| a.to_string())
}

/// Looks up namespace `nsid` of a drive. `Ok(None)` for drive kinds whose
/// namespaces are only known at run time (`pci`).
fn namespace<'a>(
    path: &str,
    drive_name: &str,
    drive: &'a DriveConfig,
    nsid: u32,
) -> Result<Option<&'a NamespaceConfig>, ConfigError> {
    match drive {
        DriveConfig::Emulated(emu) => {
            let ns = (nsid as usize).checked_sub(1).and_then(|i| emu.namespaces.get(i));
            match ns {
                Some(ns) => Ok(Some(ns)),
                None => Err(ConfigError::UnknownNamespace {
                    path: path.to_owned(),
                    drive: drive_name.to_owned(),
                    nsid,
                    namespaces: emu.namespaces.len(),
                }),
            }
        }
        DriveConfig::Pci(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests;

// TEMPORARY SHIM (replaced by the config split)
#[allow(missing_docs)]
#[derive(Debug)]
pub enum ConfigErrorKind {
    StripeUnitVsLbaSize { unit: u64, drive: String, lba_size: u32 },
    NamespaceMissing { drive: String, nsid: u32, active: Vec<u32> },
    PciAddr { addr: String },
    Invalid { reason: String },
}
#[allow(missing_docs)]
impl ConfigError {
    pub fn new(path: impl Into<String>, kind: ConfigErrorKind) -> Self {
        ConfigError::PciAddr { path: path.into(), addr: format!("{kind:?}") }
    }
}
impl Config {
    pub(crate) fn datapath_key(&self, dp: &str, field: &str) -> String {
        format!("datapaths.{dp}.{field}")
    }
}
