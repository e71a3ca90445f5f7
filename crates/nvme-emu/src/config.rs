//! Emulator configuration: namespaces, backing store, queue limits, timing.

use std::path::PathBuf;
use std::time::Duration;

use crate::{EmuError, FaultRule};

/// Largest register page the emulator allocates (doorbells included), in
/// bytes. Bounds `io_queues` x `4 << dstrd`.
pub const MAX_REGISTER_PAGE: usize = 16 << 20;

/// CAP.DSTRD that [`EmulatorConfig::shared_doorbells`] needs: doorbells
/// `4 << 9` = 2048 bytes apart, one 4 KiB page per queue pair.
pub const SHARED_DOORBELL_DSTRD: u8 = 9;

/// Most namespaces one controller exposes (one Identify active namespace
/// list, CNS 02h, holds 1024 NSIDs).
pub const MAX_NAMESPACES: usize = 1024;

/// One namespace (NVM Command Set 1.0, 4.1.5.1): `blocks` logical blocks of
/// `block_size` bytes; NSZE = NCAP = NUSE = `blocks`.
///
/// Identify Namespace serves, without metadata, one LBA format (NLBAF = 0,
/// FLBAS = 0, LBAF0 = `block_size`, MS = 0). With `metadata_size` > 0 it
/// serves two, LBAF0 = `block_size` without metadata and LBAF1 =
/// `block_size` + `metadata_size` bytes of metadata, formatted with LBAF1
/// (FLBAS = 1, bit 4 = `extended_lba`; MC names that one layout). Only the
/// format is served: no metadata is stored, and Read and Write on such a
/// namespace fail with Invalid Namespace or Format (SCT 0h, SC 0Bh, DNR),
/// so that drivers that refuse metadata formats can be tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceSpec {
    /// Size in logical blocks (NSZE), at least 1.
    pub blocks: u64,
    /// Logical block size in bytes: 512 (LBADS 9) or 4096 (LBADS 12).
    pub block_size: u32,
    /// MS of the formatted LBA format: metadata bytes per logical block;
    /// 0 (the default) = none.
    pub metadata_size: u16,
    /// FLBAS bit 4 when `metadata_size` > 0: metadata at the end of each
    /// block's data (extended LBA) rather than in a separate buffer (MPTR).
    /// Ignored without metadata. Default `false`.
    pub extended_lba: bool,
}

impl NamespaceSpec {
    /// A namespace of `blocks` blocks of `block_size` bytes, without
    /// metadata.
    pub fn new(blocks: u64, block_size: u32) -> Self {
        Self { blocks, block_size, metadata_size: 0, extended_lba: false }
    }

    /// The same namespace formatted with `metadata_size` bytes of metadata
    /// per block, extended LBA (`extended_lba`) or separate buffer.
    pub fn with_metadata(self, metadata_size: u16, extended_lba: bool) -> Self {
        Self { metadata_size, extended_lba, ..self }
    }

    /// Size in bytes, or `None` on overflow.
    pub fn bytes(&self) -> Option<u64> {
        self.blocks.checked_mul(u64::from(self.block_size))
    }

    /// LBADS (log2 of the block size), or `None` for an unsupported size.
    pub fn lbads(&self) -> Option<u8> {
        match self.block_size {
            512 => Some(9),
            4096 => Some(12),
            _ => None,
        }
    }
}

/// Where namespace data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackingSpec {
    /// Zero-initialised RAM, one allocation per namespace (pages are
    /// committed by the OS on first write).
    Ram,
    /// No storage: commands are validated and completed, but no data moves
    /// in either direction and PRPs are not walked (command-rate
    /// benchmarks; reads leave the host buffer untouched).
    Null,
    /// One sparse file for the controller, namespaces laid out back to back
    /// in NSID order. Created if missing; resized to the total size.
    File(PathBuf),
    /// A named RAM disk: zero-initialised RAM images, one per namespace,
    /// kept in a process-wide registry after the emulator is gone (or has
    /// lost power, [`crate::Emulator::power_fail`]), so that the next
    /// emulator naming it sees the same data. Created on first use with the
    /// namespaces' sizes; attaching and detaching move the images, never
    /// copy them. A layout that differs from the disk's, or a disk that
    /// another live emulator holds, fails [`crate::Emulator::start`]
    /// ([`crate::EmuError::RamDiskLayout`], [`crate::EmuError::RamDiskInUse`]).
    /// Removed with [`crate::remove_ram_disk`].
    RamDisk(String),
}

/// A volatile write cache (NVMe Base 2.0, 5.27.1.4 "Volatile Write Cache";
/// Identify Controller VWC, 5.17.2.1), as [`crate::Emulator`] models it: a
/// completed Write is in the cache, not yet durable, until a Flush, a Write
/// with FUA on its blocks, destaging (oldest first, beyond
/// `capacity_bytes`) or a shutdown notification makes it durable. What a
/// power failure ([`crate::Emulator::power_fail`]) does with the blocks
/// still in the cache is decided per logical block by a generator seeded
/// with `seed`. See the crate documentation, "Power loss".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteCacheSpec {
    /// Most bytes of non-durable logical blocks the cache holds; beyond
    /// it the oldest blocks are destaged (become durable). 0 = every write
    /// is destaged at once (the cache is reported but holds nothing).
    pub capacity_bytes: u64,
    /// Seed of the generator that decides, per non-durable logical block,
    /// whether a power failure keeps or loses it.
    pub seed: u64,
}

/// A single-channel media timing model: a command occupies the one media
/// channel for `bytes / bandwidth` or `1 / iops` seconds, whichever is longer,
/// starting when the channel is free; its CQE is posted `latency` after that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimingModel {
    /// Fixed latency added after the media channel has finished a command.
    pub latency: Duration,
    /// Media bandwidth in bytes per second; `None` = unlimited.
    pub bandwidth_bytes_per_s: Option<u64>,
    /// Media command rate in commands per second; `None` = unlimited.
    pub iops: Option<u64>,
}

/// Configuration of one emulated controller (one controller, one
/// subsystem).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulatorConfig {
    /// Name; the device reports `emu:<name>` and the thread is named
    /// `nvme-emu-<name>`.
    pub name: String,
    /// Namespaces, NSIDs 1..=n in this order.
    pub namespaces: Vec<NamespaceSpec>,
    /// Backing store for all namespaces.
    pub backing: BackingSpec,
    /// CAP.MQES, zero-based maximum I/O queue entries (default 1023, i.e.
    /// 1024 entries). At least 1.
    pub mqes: u16,
    /// CAP.DSTRD: doorbell stride is `4 << dstrd` bytes (default 0).
    pub dstrd: u8,
    /// Identify Controller MDTS: largest transfer is `2^mdts` pages of
    /// 4 KiB (CAP.MPSMIN = 0); 0 = no limit. Default 5 (128 KiB).
    pub mdts: u8,
    /// I/O SQ/CQ pairs the controller grants (default 16), 1..=65535.
    pub io_queues: u16,
    /// Media timing; `None` = completions are posted as soon as the
    /// command has been processed.
    pub timing: Option<TimingModel>,
    /// CAP.TO in 500 ms units (default 20 = 10 s).
    pub cap_to_500ms: u8,
    /// Identify Controller SN (ASCII, at most 20 bytes).
    pub serial: String,
    /// Identify Controller MN (ASCII, at most 40 bytes).
    pub model: String,
    /// Fault-injection rules installed at start, checked in order (see
    /// [`crate::FaultRule`]; more with [`crate::Emulator::add_fault`]).
    /// Default empty.
    pub faults: Vec<FaultRule>,
    /// Fault injection: CC.EN = 1 never sets CSTS.RDY (the controller
    /// stays disabled and processes nothing), so a host's enable times out
    /// after CAP.TO. Default `false`.
    pub never_ready: bool,
    /// How long after the controller sees CC.EN = 1 it sets CSTS.RDY (a
    /// real controller takes up to CAP.TO); the enable's checks run then.
    /// Default zero: ready at the first poll that sees EN. On a virtual
    /// clock ([`crate::Emulator::start_on`]) this is virtual time.
    pub ready_delay: Duration,
    /// Fault injection: the device is gone from the start; every register
    /// (CAP and CSTS included) reads `0xFFFF_FFFF` and the controller does
    /// nothing, as [`crate::Emulator::set_gone`] at run time. Default
    /// `false`.
    pub registers_all_ones: bool,
    /// Place each queue's doorbell page in its own memfd (sealed against
    /// shrinking), so the page of I/O queue pair y (offset `1000h + y *
    /// 4096`) can be handed to another process without the register page
    /// or other queues' doorbells ([`crate::Emulator::doorbell_page_fd`]).
    /// Needs `dstrd == 9`: a stride of 2048 bytes puts SQyTDBL at `1000h +
    /// 2y * 2048` and CQyHDBL 2048 bytes later, both in that one page
    /// (NVMe Base 2.0 3.1.4.23/24). Default `false`.
    pub shared_doorbells: bool,
    /// A volatile write cache (Identify Controller VWC = 1); `None` (the
    /// default): VWC = 0, a completed write is durable and Flush does
    /// nothing.
    pub write_cache: Option<WriteCacheSpec>,
    /// How long the controller thread keeps polling after its last piece of
    /// work before it starts to nap (50 us, then longer the longer it is
    /// idle). Default [`DEFAULT_IDLE_SPIN`] (30 us), which spares the CPUs
    /// of small machines; a longer spin keeps the controller awake through
    /// a host's short pauses between batches (benchmarks of host-side
    /// costs), at the price of a busy core per drive.
    pub idle_spin: Duration,
    /// The controller thread serves the admin queue only: I/O queues are
    /// created and deleted as usual, but it never reads their doorbells,
    /// fetches their commands or posts to their CQs, leaving them to
    /// another agent that plays the controller's I/O side (`gpu-io`'s null
    /// controllers on the GPU, `tutti-bench gpu-rate --controller
    /// gpu-null`). Default `false`.
    pub io_queues_detached: bool,
}

/// Default [`EmulatorConfig::idle_spin`].
pub const DEFAULT_IDLE_SPIN: Duration = Duration::from_micros(30);

impl EmulatorConfig {
    /// A RAM-backed controller with the defaults listed on each field; the
    /// serial number is `EMU-<name>` cut to 20 ASCII characters.
    pub fn new(name: impl Into<String>, namespaces: Vec<NamespaceSpec>) -> Self {
        let name = name.into();
        let serial: String = format!("EMU-{name}")
            .chars()
            .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '_' })
            .take(20)
            .collect();
        Self {
            name,
            namespaces,
            backing: BackingSpec::Ram,
            mqes: 1023,
            dstrd: 0,
            mdts: 5,
            io_queues: 16,
            timing: None,
            cap_to_500ms: 20,
            serial,
            model: "tutti nvme-emu".to_owned(),
            faults: Vec::new(),
            never_ready: false,
            ready_delay: Duration::ZERO,
            registers_all_ones: false,
            shared_doorbells: false,
            write_cache: None,
            idle_spin: DEFAULT_IDLE_SPIN,
            io_queues_detached: false,
        }
    }

    /// Size of the register page in bytes: `0x1000 + 2 * (io_queues + 1) *
    /// (4 << dstrd)` rounded up to 4 KiB.
    pub fn register_page_len(&self) -> Option<usize> {
        let stride = 4usize.checked_shl(u32::from(self.dstrd))?;
        let doorbells = (usize::from(self.io_queues) + 1).checked_mul(2)?.checked_mul(stride)?;
        0x1000usize.checked_add(doorbells)?.checked_next_multiple_of(0x1000)
    }

    /// Largest data transfer of one command in bytes (MDTS), `None` = no
    /// limit.
    pub fn max_transfer(&self) -> Option<u64> {
        if self.mdts == 0 {
            None
        } else {
            Some(4096u64 << self.mdts)
        }
    }

    /// Checks every field; [`crate::Emulator::start`] calls this first.
    pub fn validate(&self) -> Result<(), EmuError> {
        let bad = |field: &'static str, value: u64, reason: &'static str| {
            Err(EmuError::Config { field, value, reason })
        };
        if self.name.contains('\0') {
            return bad("name", 0, "contains a NUL byte");
        }
        if self.namespaces.is_empty() {
            return bad("namespaces", 0, "at least one namespace is required");
        }
        if self.namespaces.len() > MAX_NAMESPACES {
            return bad("namespaces", self.namespaces.len() as u64, "at most 1024 namespaces");
        }
        let mut total: u64 = 0;
        for ns in &self.namespaces {
            if ns.lbads().is_none() {
                return bad("block_size", u64::from(ns.block_size), "must be 512 or 4096");
            }
            if ns.blocks == 0 {
                return bad("blocks", 0, "a namespace needs at least one block");
            }
            let Some(bytes) = ns.bytes() else {
                return bad("blocks", ns.blocks, "namespace size overflows");
            };
            let in_ram = matches!(self.backing, BackingSpec::Ram | BackingSpec::RamDisk(_));
            if in_ram && bytes > isize::MAX as u64 {
                return bad("blocks", ns.blocks, "namespace too large for RAM backing");
            }
            total = match total.checked_add(bytes) {
                Some(t) if t <= i64::MAX as u64 => t,
                _ => return bad("namespaces", ns.blocks, "total size overflows"),
            };
        }
        if self.mqes == 0 {
            return bad("mqes", 0, "queues need at least 2 entries (MQES >= 1)");
        }
        if self.dstrd > 15 {
            return bad("dstrd", u64::from(self.dstrd), "CAP.DSTRD has 4 bits");
        }
        if self.mdts > 16 {
            return bad("mdts", u64::from(self.mdts), "at most 16 (256 MiB)");
        }
        if self.io_queues == 0 {
            return bad("io_queues", 0, "at least one I/O queue pair");
        }
        match self.register_page_len() {
            Some(n) if n <= MAX_REGISTER_PAGE => {}
            _ => return bad("io_queues", u64::from(self.io_queues), "register page too large for dstrd"),
        }
        if let BackingSpec::RamDisk(name) = &self.backing {
            if name.is_empty() {
                return bad("backing", 0, "a RAM disk needs a non-empty name");
            }
        }
        if self.shared_doorbells && self.dstrd != SHARED_DOORBELL_DSTRD {
            return bad(
                "dstrd",
                u64::from(self.dstrd),
                "shared_doorbells needs dstrd = 9 (one 4 KiB page per queue pair)",
            );
        }
        if self.cap_to_500ms == 0 {
            return bad("cap_to_500ms", 0, "CAP.TO must be at least 1");
        }
        if self.serial.len() > 20 || !self.serial.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return bad("serial", self.serial.len() as u64, "at most 20 printable ASCII bytes");
        }
        if self.model.len() > 40 || !self.model.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return bad("model", self.model.len() as u64, "at most 40 printable ASCII bytes");
        }
        if let Some(t) = &self.timing {
            if t.bandwidth_bytes_per_s == Some(0) {
                return bad("timing.bandwidth_bytes_per_s", 0, "must be positive");
            }
            if t.iops == Some(0) {
                return bad("timing.iops", 0, "must be positive");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        let c = EmulatorConfig::new("a", vec![NamespaceSpec::new(1024, 4096)]);
        c.validate().unwrap();
        assert_eq!(c.serial, "EMU-a");
        assert_eq!(c.register_page_len(), Some(0x2000));
        assert_eq!(c.max_transfer(), Some(128 << 10));
    }

    #[test]
    fn rejects_bad_values() {
        let ok = EmulatorConfig::new("a", vec![NamespaceSpec::new(8, 512)]);
        let mut c = ok.clone();
        c.namespaces[0].block_size = 1024;
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.namespaces.clear();
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.mqes = 0;
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.io_queues = u16::MAX;
        c.dstrd = 15;
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.serial = "x".repeat(21);
        assert!(c.validate().is_err());
        let mut c = ok;
        c.timing = Some(TimingModel { latency: Duration::ZERO, bandwidth_bytes_per_s: Some(0), iops: None });
        assert!(c.validate().is_err());
    }
}
