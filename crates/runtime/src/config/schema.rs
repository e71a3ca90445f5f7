//! The config's schema: the serde types of each section's entries
//! (drives, resolvers, datapaths, stores) and the defaults of their
//! optional fields. What the schema cannot express is checked in
//! `validate.rs`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ByteSize;

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
    /// A drive owned by `tuttid`: this process gets I/O queue pairs on it
    /// from the daemon over its Unix socket, and never touches the
    /// controller's admin queue or registers (docs/tuttid.md).
    Daemon(DaemonDriveConfig),
}

/// A drive that `tuttid` owns, used through queue pairs it grants.
///
/// YAML: `{ daemon: { socket: /run/tutti.sock, drive: d0 } }` (and
/// optionally `daemon_uid: 0`). The
/// namespace, MQES, MDTS and the number of queue pairs this client may
/// hold come from the daemon at start. Memory registered for I/O must be
/// shared memory (`tutti::SharedMemory`); any other memory is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonDriveConfig {
    /// Path of the daemon's socket.
    pub socket: PathBuf,
    /// The drive's name in the daemon's config.
    pub drive: String,
    /// The uid the daemon must run as (checked with SO_PEERCRED before the
    /// runtime sends it anything, memfds of its memory included). Default:
    /// root or the client's own uid; a socket served by anyone else is
    /// refused as an impostor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_uid: Option<u32>,
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
    /// rule fail, never complete, complete late, make the controller fatal
    /// or cut its power. Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FaultConfig>,
    /// A volatile write cache (Identify Controller VWC = 1): a completed
    /// write is not durable until a Flush, a FUA write, destaging or a
    /// shutdown; a power failure (`Emulator::power_fail`, fault action
    /// `power_fail`) keeps or loses each cached logical block.
    /// YAML: `write_cache: { capacity: 64MiB, seed: 1 }` (both optional).
    /// Absent (the default): no cache, every completed write is durable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_cache: Option<WriteCacheConfig>,
    /// Microseconds the controller thread keeps polling after its last
    /// work before it naps (default 30). Longer keeps the emulated drive
    /// awake through short host pauses (for measuring host-side costs) at
    /// the price of a busy core per drive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_spin_us: Option<u64>,
}

/// An emulated drive's volatile write cache (the emulator's
/// `WriteCacheSpec`; NVMe Base 2.0 5.27.1.4). See docs/reliability.md,
/// "Power loss".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteCacheConfig {
    /// Most bytes of written but not yet durable logical blocks the cache
    /// holds; beyond it the oldest are destaged (become durable). At least
    /// 4096. Default 64 MiB.
    #[serde(default = "default_cache_capacity")]
    pub capacity: ByteSize,
    /// Seed of the per-block keep-or-lose choice at a power failure.
    /// Default 1.
    #[serde(default = "default_cache_seed")]
    pub seed: u64,
}

impl Default for WriteCacheConfig {
    fn default() -> Self {
        Self { capacity: default_cache_capacity(), seed: default_cache_seed() }
    }
}

/// One fault-injection rule of an emulated drive (the emulator's
/// `FaultRule`). YAML: `{ lba: [400, 401], op: read, action: never_complete }`,
/// `action: { fail: { sct: 2, sc: 0x81, dnr: true } }`,
/// `action: { delay_us: 5000 }`, `{ op: write, action: power_fail, skip: 9 }`
/// (the 10th write), `{ op: flush, action: { fail: { sct: 2, sc: 0x80 } } }`. Rules match I/O commands only, never the admin queue
/// (whose opcodes reuse the NVM numbers: 01h is Write and Create I/O SQ).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// Logical blocks `[start, end)`: I/O commands touching any of them
    /// match. Absent: every I/O command matches.
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
    /// Apply to the first `times` matches only (counted after `skip`).
    /// Absent: every match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u64>,
    /// Let this many matching commands pass first: the rule applies from
    /// the `skip + 1`-th match on. Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skip: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Command kinds a fault rule can match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultOp {
    /// NVM Read (02h).
    Read,
    /// NVM Write (01h).
    Write,
    /// NVM Flush (00h): e.g. `{ op: flush, action: { fail: { sct: 2, sc:
    /// 0x80 } } }` fails every Flush (nothing is made durable), and
    /// `{ op: flush, action: power_fail, skip: 2 }` executes the third
    /// Flush (its blocks durable) and cuts the power before its completion.
    /// A Flush has no LBA range: a rule with `op: flush` and `lba` is
    /// refused.
    Flush,
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
    /// Execute the command (into the write cache), then cut the drive's
    /// power before its completion: the controller stops answering
    /// (registers read all ones, the runtime fails the drive), each
    /// logical block still in the write cache is kept or lost, and the
    /// backing is released (a `ram_disk` or `file` can be opened by a new
    /// runtime).
    PowerFail,
}

// Defaults of the optional fields (serde `default = "..."`).

fn default_mqes() -> u16 {
    1023
}
fn default_mdts() -> u8 {
    5
}
fn default_io_queues() -> u16 {
    8
}
fn default_cache_capacity() -> ByteSize {
    ByteSize::mib(64)
}
fn default_cache_seed() -> u64 {
    1
}
pub(super) fn default_nsid() -> u32 {
    1
}
pub(super) fn default_queues() -> u16 {
    2
}
pub(super) fn default_queue_depth() -> u32 {
    256
}
pub(super) fn default_stripe_unit() -> ByteSize {
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
            write_cache: None,
            idle_spin_us: None,
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
    /// Format the namespace with metadata per block (the emulator serves the
    /// format in Identify Namespace but moves no metadata): for trying how
    /// the runtime and tutti-probe refuse such a namespace. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<MetadataConfig>,
}

/// Metadata per logical block of an emulated namespace (LBA format MS, and
/// FLBAS bit 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataConfig {
    /// Metadata bytes per block (MS), e.g. 8.
    pub bytes: u16,
    /// `true`: extended LBA (metadata at the end of each block's data);
    /// `false`: a separate buffer (MPTR).
    #[serde(default)]
    pub extended: bool,
}

/// Where an emulated drive keeps its data.
///
/// YAML: `ram`, `null`, `{ file: /path/to/sparse/file }`, or
/// `{ ram_disk: name }`.
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
    /// Data lives in a named RAM disk of this process (`nvme_emu`'s RAM
    /// disk registry), created zeroed on first use and kept when the
    /// runtime shuts down or the drive loses power, so that the next
    /// runtime naming it sees the data: for crash tests. Its namespaces
    /// must match the disk's; one drive at a time may hold it. Freed with
    /// `nvme_emu::remove_ram_disk`.
    RamDisk(String),
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

impl DataPathConfig {
    /// The YAML key naming this datapath's kind: `local_nvme` or
    /// `striped_local_nvme`.
    pub(crate) fn yaml_tag(&self) -> &'static str {
        match self {
            DataPathConfig::LocalNvme(_) => "local_nvme",
            DataPathConfig::StripedLocalNvme(_) => "striped_local_nvme",
        }
    }
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
    /// Name of the drive (a key of [`Config::drives`](super::Config::drives)).
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
    /// Names of the drives (keys of
    /// [`Config::drives`](super::Config::drives)), 2 to 4 distinct ones, in
    /// stripe order.
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

/// The GPU a runtime drives for `execution: gpu` datapaths.
///
/// YAML: `gpu: { ordinal: 1 }`. The ordinal counts the GPUs the process
/// sees (after `CUDA_VISIBLE_DEVICES`), as CUDA does; memory registered with
/// `register_gpu_memory` must live on that GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// CUDA device ordinal. Default 0.
    #[serde(default)]
    pub ordinal: u32,
}

impl GpuConfig {
    /// `true` for the default (GPU 0), which YAML output leaves out.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A store: one resolver joined to one datapath.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// Name of the resolver (a key of [`Config::resolvers`](super::Config::resolvers)).
    pub resolver: String,
    /// Name of the datapath (a key of [`Config::datapaths`](super::Config::datapaths)).
    pub datapath: String,
}
