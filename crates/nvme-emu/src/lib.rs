// Unsafe code is allowed in this crate because the emulator plays the
// device: it reads and writes host memory that the driver mapped for DMA,
// through raw pointers kept in its IOVA table (`dma.rs`), and it allocates
// its register page and RAM store by hand (`regs.rs`, `backing.rs`). Every
// block states the invariant that makes it sound.
#![allow(unsafe_code)]

//! A software NVMe controller that serves [`nvm_queue::NvmeDevice`].
//!
//! Follows the *NVM Express Base Specification 2.0* (PCIe transport, with
//! 1.4 section numbers where noted) and the *NVM Command Set 1.0*. The
//! driver talks to it exactly as to a real controller: 32-bit register and
//! doorbell writes to the page behind [`NvmeDevice::bar0`], SQEs and PRP
//! lists in DMA memory mapped through [`NvmeDevice::dma_map`], CQEs with a
//! phase tag.
//!
//! # What it implements
//!
//! * Register page (CAP, VS 1.4.0, CC, CSTS, AQA, ASQ, ACQ, doorbells with
//!   CAP.DSTRD stride) and the CC state machine: enable with validation
//!   (CSTS.CFS on invalid values), controller reset (CC.EN 1 -> 0), normal
//!   and abrupt shutdown (CSTS.SHST).
//! * Queues: admin and up to `io_queues` I/O SQ/CQ pairs, physically
//!   contiguous (CAP.CQR = 1), invalid doorbell writes counted and ignored,
//!   CQ-full back-pressure, CQEs written body first and phase dword last
//!   (unless [`FaultAction::PhaseBeforeBody`] says otherwise).
//! * Admin: Identify (CNS 00h, 01h, 02h), Create/Delete I/O SQ and CQ, Get
//!   Log Page (Error Information, SMART / Health), Set/Get Features (Number
//!   of Queues; Volatile Write Cache), Abort, Asynchronous Event Request
//!   (accepted, see below).
//! * NVM: Read, Write (FUA), Flush, Write Zeroes (DEAC accepted), Dataset
//!   Management (deallocate zeroes the ranges).
//! * PRP walking with the specification's checks (PRP Offset Invalid, Data
//!   Transfer Error for anything outside a mapped region), MDTS.
//! * Backing stores: RAM, named RAM disk that outlives the emulator,
//!   sparse file, null ([`BackingSpec`]); an optional single-channel
//!   timing model ([`TimingModel`]).
//! * An optional volatile write cache ([`WriteCacheSpec`], VWC = 1) and
//!   power failures ([`Emulator::power_fail`], [`FaultAction::PowerFail`]):
//!   see "Power loss" below. Direct media access for corruption tests
//!   ([`Emulator::write_media`], [`Emulator::read_media`]).
//!
//! # What it does not implement
//!
//! * Interrupts: no MSI-X, MSI or pin interrupts; IEN/IV of Create I/O CQ
//!   are ignored. Drivers poll.
//! * SGLs (PSDT != 0 is Invalid Field), metadata and protection
//!   information (MPTR is ignored; [`NamespaceSpec::with_metadata`] only
//!   serves a metadata format in Identify Namespace, and Read and Write on
//!   that namespace fail with Invalid Namespace or Format), fused
//!   operations (FUSE != 0 is Invalid Field).
//! * CMB, PMR, boot partitions, NVM subsystem reset (NSSR writes are
//!   ignored), reservations, namespace management and attachment, Format
//!   NVM, firmware commands, Compare, Write Uncorrectable, Verify, and
//!   everything else not listed above (Invalid Command Opcode).
//! * Multiple controllers per subsystem, multiple I/O command sets.
//! * Features other than Number of Queues and Volatile Write Cache
//!   (Invalid Field); no feature is saveable.
//! * Abort never aborts: commands run when fetched, so it completes with
//!   DW0 bit 0 = 1 ("command not aborted").
//! * Asynchronous events: AERs are accepted (up to AERL + 1 = 4
//!   outstanding, then AER Limit Exceeded) and never completed; invalid
//!   doorbell writes, which the specification reports as an asynchronous
//!   event, are only counted in [`EmuStats::doorbell_violations`].
//! * Error Information log entries are always zero (no error is logged).
//! * Weighted round robin / urgent priorities: SQs are served round robin.
//! * Without [`EmulatorConfig::write_cache`] (the default), no volatile
//!   write cache (VWC = 0): a completed write is durable, Flush succeeds at
//!   once, the file store is never `fsync`ed and nothing is lost at a
//!   power failure. Capacitor-backed power-loss protection is modelled
//!   only that way: no write cache, or one disabled with Set Features
//!   (WCE = 0, write-through).
//! * Power loss below the logical block: a block is kept or lost whole,
//!   never partially written (AWUPF = 0 means one block is atomic); no
//!   metadata, no media errors from the failure (a lost block reads its
//!   last durable contents, not an Unrecovered Read Error), no reordering
//!   of destaging beyond "oldest first".
//!
//! # Behaviour worth knowing
//!
//! * Commands execute when fetched (data moves then); with a
//!   [`TimingModel`] only the CQE waits. Delete I/O SQ completes every
//!   command of the SQ fetched but not completed (held by
//!   [`FaultAction::NeverComplete`], or scheduled by the timing model or a
//!   [`FaultAction::Delay`]) with "Command Aborted due to SQ Deletion"
//!   (SCT 0h, SC 08h), posted to its CQ before the Delete's own
//!   completion (behind a full CQ they wait for the host's head doorbell);
//!   entries published but not fetched are dropped.
//!
//! # Checks on the driver
//!
//! Besides invalid doorbell values ([`EmuStats::doorbell_violations`]) and
//! DMA outside mapped memory (a Data Transfer Error for data, CSTS.CFS for
//! queue memory; [`EmuStats::dma_faults`]), the controller counts, warns
//! about (`tracing::warn!`) and survives:
//!
//! * DMA into another client's memory: with DMA domains
//!   ([`Emulator::dma_map_in_domain`], [`Emulator::set_sq_domain`]) a
//!   command from an SQ of domain `D != 0` whose data buffer or PRP list
//!   page lies in a mapping of another domain completes with Data Transfer
//!   Error (SCT 0h, SC 04h, DNR), the status an IOMMU fault on the
//!   device's DMA gives on a real host and the same as an unmapped
//!   address, so a client learns nothing about others' mappings; the
//!   foreign memory is not touched ([`EmuStats::dma_domain_faults`]);
//! * an SQ tail doorbell that moves backwards or laps the head
//!   ([`EmuStats::sq_tail_backwards`], ignored);
//! * an SQE overwritten while its slot was still the controller's
//!   ([`EmuStats::sqe_overwritten`]; see `queues.rs` for why this is
//!   checked when a CQE releases the slot rather than at fetch);
//! * a CQ whose head doorbell is not written: the CQ fills, completions
//!   wait and the SQs feeding it stop being fetched until the head moves
//!   ([`EmuStats::cq_full_stalls`]).
//! * Write Zeroes and Dataset Management deallocation zero the blocks in
//!   the store: deallocated blocks read as zeroes (DLFEAT = 001b, DEAC
//!   supported).
//! * SQHD in a CQE is the SQ head when the CQE is written (one entry less
//!   under [`FaultAction::LaggingSqhd`]).
//! * The controller thread polls without pause while it finds work. Once
//!   idle it spins for 30 us, then sleeps (`park_timeout`) 50 us at a time,
//!   200 us at a time after 5 ms idle and 1 ms at a time after 50 ms idle;
//!   it never calls `sched_yield` (on small virtual machines that is a
//!   costly system call that mostly returns at once). Doorbell writes do
//!   not wake it, so the first command after a long idle period may wait up
//!   to about 1 ms.
//!
//! A fault on queue memory (an SQ entry or CQ slot outside every mapped
//! region) is unrecoverable: the controller sets CSTS.CFS and waits for a
//! reset.
//!
//! # Fault injection
//!
//! A hook inside this one emulator (not a separate fault-injecting device):
//! [`FaultRule`]s, given in [`EmulatorConfig::faults`] or added while it
//! runs with [`Emulator::add_fault`] (removed with
//! [`Emulator::clear_faults`]), are checked in order for every fetched
//! command, admin and I/O, before it executes. The first rule whose
//! [`FaultMatch`] holds (SQ, opcode, NSID, overlapping LBA range) and
//! whose `times` is not used up applies, and uses up one of its `times`:
//!
//! * [`FaultAction::Fail`]: the command is not executed (no data moves, no
//!   side effect); its CQE carries the given status, posted at once.
//! * [`FaultAction::NeverComplete`]: the command is fetched (the SQ head
//!   advances and later CQEs' SQHD show it) but not executed and never
//!   completed. Its CID stays outstanding at the host until the host
//!   deletes the SQ (Delete I/O SQ completes it as "Aborted due to SQ
//!   Deletion") or resets the controller (CC.EN 1 -> 0, no completion);
//!   Abort never aborts.
//! * [`FaultAction::Delay`]: the command executes normally; its CQE is
//!   posted that much later (after the timing model's due time, if there is
//!   a model). Delayed completions wait in the timing model's heap of
//!   scheduled completions, which exists for this even without a
//!   [`TimingModel`]; so, like modelled completions, a Delete I/O SQ
//!   completes them at once as aborted and a controller reset drops them.
//! * [`FaultAction::CompleteTwice`]: the command executes normally; its CQE
//!   is posted twice, in consecutive CQ slots when there is room (the
//!   second a duplicate with the same CID, status and DW0). A driver should
//!   drop the second as a protocol error.
//! * [`FaultAction::UnknownCid`]: the command executes normally, but its
//!   CQE carries the given CID instead of its own; the command itself never
//!   completes (its CID stays outstanding until a controller reset).
//! * [`FaultAction::LaggingSqhd`]: the command executes and completes
//!   normally, but the SQHD of its CQE is one entry behind the SQ head
//!   (modulo the SQ size); later CQEs report the real head again.
//! * [`FaultAction::PhaseBeforeBody`]: the command executes and completes
//!   normally, but its CQE's DW3 (CID, status, phase tag) is written first
//!   and DW0 to DW2 (result, SQHD, SQID) about 200 us later (the controller
//!   thread spins meanwhile). A host that acts on the new phase tag at once
//!   reads the slot's previous body: zeroes on the CQ's first pass (SQID 0,
//!   SQHD 0), else the CQE posted there one pass earlier. The entry ends up
//!   correct.
//! * [`FaultAction::ControllerFatal`]: the command is neither executed nor
//!   completed; CSTS.CFS becomes 1 and the controller stops processing all
//!   queues (no fetch, no completion, scheduled and waiting ones included)
//!   until the host resets it: CC.EN 1 -> 0 clears CFS and deletes every
//!   queue, as on real hardware.
//! * [`FaultAction::PowerFail`]: the command is executed (a Write into the
//!   write cache), then the power fails before its CQE, as
//!   [`Emulator::power_fail`] (see "Power loss").
//!
//! [`FaultRule::skip`] lets the first matches pass (to later rules), so a
//! rule can hit the k-th matching command.
//! [`EmuStats::faults_injected`] counts the commands a rule applied to.
//! With no rule installed the check costs one atomic load per command; the
//! rule list's lock is taken only while rules are installed.
//!
//! Controller-level faults, off by default:
//!
//! * [`EmulatorConfig::never_ready`]: CC.EN = 1 never sets CSTS.RDY (the
//!   controller stays disabled), so the host's enable times out after
//!   CAP.TO ([`EmulatorConfig::cap_to_500ms`]).
//! * [`EmulatorConfig::registers_all_ones`], or [`Emulator::set_gone`] at
//!   run time: the device is gone. The register page is filled with all
//!   ones (CAP, CSTS and every doorbell read `0xFFFF_FFFF`, the
//!   specification's sign of a removed device) and the controller thread
//!   stops all work; it only restores the all-ones page about every
//!   millisecond, undoing host register writes. Commands in flight never
//!   complete; nothing brings the device back.
//!
//! # Power loss
//!
//! With a volatile write cache ([`EmulatorConfig::write_cache`]): Identify
//! Controller VWC = 07h (present; Flush takes NSID FFFFFFFFh), AWUPF = 0,
//! Get Features Volatile Write Cache (FID 06h) reports WCE = 1, and Set
//! Features may clear it (the cache is flushed, then writes are
//! write-through) or set it again. A logical block is *durable* when its
//! contents survive any power failure. Durable, at the completion of:
//!
//! * a Write with FUA (CDW12 bit 30): its own blocks;
//! * a Flush: every block of its namespace (all namespaces for NSID
//!   FFFFFFFFh); the file store is `sync_data`ed first, and a failed sync
//!   completes the Flush with Write Fault (SCT 2h, SC 80h), the blocks
//!   staying non-durable;
//! * Write Zeroes and Dataset Management deallocation: their blocks (as a
//!   mapping update, not cached);
//! * a shutdown notification (CC.SHN, normal or abrupt), or Set Features
//!   WCE = 0: every block.
//!
//! Any other Write completes with its blocks in the cache, not durable.
//! While the cache holds more than [`WriteCacheSpec::capacity_bytes`] of
//! non-durable blocks, the oldest (by when each became non-durable) are
//! destaged: durable, as a drive writes its cache back in the background.
//! Reads always return the newest contents. A controller reset (CC.EN 1
//! -> 0) keeps the cache as it is; dropping an [`Emulator`] without a power
//! failure is an orderly power-off: everything is kept.
//!
//! [`Emulator::power_fail`] (or [`FaultAction::PowerFail`]) first stops
//! the controller as [`Emulator::set_gone`] does: no more fetches or
//! completions, registers all ones. Then every non-durable logical block
//! is, independently, kept (its new contents) or lost (its last durable
//! contents restored), by one draw each from a SplitMix64 generator
//! seeded with [`WriteCacheSpec::seed`], oldest block first: so a Write of
//! several blocks may be torn at block boundaries, and the same seed and
//! history give the same outcome. Then the backing store is released, so
//! that a new emulator can open the same RAM disk or file: it sees the
//! durable data, and each block written since the last durable point is
//! whole, old or new. [`PowerFailReport`] counts kept and lost blocks.
//!
//! The model is an undo log: a Write goes to the store in place, and the
//! first Write to a durable block first copies the block's contents into
//! an arena. Memory is bounded by the capacity (plus one command).
//! [`Emulator::read_media`] and [`Emulator::write_media`] reach the media
//! under the cache: a non-durable block's last durable contents.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nvm_queue::{DeviceError, DmaMapping, Mmio, NvmeDevice};

mod admin;
mod backing;
mod cache;
pub mod config;
mod controller;
mod dma;
mod fault;
mod identify;
mod in_transfer;
mod media;
mod nvm;
mod prp;
mod queues;
mod ram_disk;
mod regs;
mod timing;
mod transfer;
mod undo;
mod zeroed;

pub use config::{
    BackingSpec, EmulatorConfig, NamespaceSpec, TimingModel, WriteCacheSpec, DEFAULT_IDLE_SPIN,
    SHARED_DOORBELL_DSTRD,
};
pub use dma::{CopyFence, ExternalMemory, FenceState, HostPin, PageLocker, IOVA_BASE, SHARED_DOMAIN};
pub use fault::{FaultAction, FaultMatch, FaultRule};
pub use identify::{CONTROLLER_ID, VENDOR_ID};
pub use media::{MediaAccessError, PowerFailReport};
pub use ram_disk::remove_ram_disk;

use controller::{Controller, Shared, StatsAtomics};

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

/// A snapshot of an emulator's counters.
///
/// The hot counters (`commands`, `media_bytes_*`) are published by the
/// controller thread once per poll iteration, so they may trail the CQEs
/// the host has already seen by a few microseconds; the others are updated
/// before the corresponding CQE is posted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmuStats {
    /// Completions posted (admin and I/O), counted before each CQE is
    /// written: a host that has seen a completion sees it counted.
    pub commands: u64,
    /// Admin completions posted.
    pub admin_commands: u64,
    /// Bytes read from the media by successful Read commands (also counted
    /// for the null store).
    pub media_bytes_read: u64,
    /// Bytes written to the media by successful Write commands.
    pub media_bytes_written: u64,
    /// Invalid doorbell writes seen and ignored (value outside the queue,
    /// or a CQ head beyond the posted entries).
    pub doorbell_violations: u64,
    /// Accesses to device addresses outside every mapped region (data,
    /// PRP lists, queue memory).
    pub dma_faults: u64,
    /// Commands refused because a data buffer or PRP list page lay in a
    /// mapping of another DMA domain than their SQ's
    /// ([`Emulator::set_sq_domain`], [`Emulator::dma_map_in_domain`]):
    /// what an IOMMU fault would be on a real host. Not counted in
    /// `dma_faults`; the foreign memory was not touched.
    pub dma_domain_faults: u64,
    /// Commands a fault-injection rule applied to ([`FaultRule`]), counted
    /// when the command is fetched.
    pub faults_injected: u64,
    /// SQ tail doorbell writes outside the window the host may fill: the
    /// tail moved backwards, or past the oldest slot not yet reported free
    /// by a CQE's SQHD (also counted in `doorbell_violations`; ignored).
    pub sq_tail_backwards: u64,
    /// SQ slots whose SQE changed between its fetch and the CQE that
    /// released the slot to the host (SQHD past it): the host overwrote a
    /// slot the controller still owned.
    pub sqe_overwritten: u64,
    /// Times a CQ filled up with completions waiting for the host to move
    /// its CQ head doorbell (one per episode; the controller stalls, as
    /// real hardware does, until the head moves).
    pub cq_full_stalls: u64,
    /// Commands completed with "Command Aborted due to SQ Deletion" by a
    /// Delete I/O SQ.
    pub sq_deletion_aborts: u64,
    /// New SQ tail doorbell values the controller read (admin and I/O
    /// queues). The controller polls the doorbell page, so two writes that
    /// land between two of its reads are seen once: this is at most the
    /// number of SQ tail doorbell writes, and at least one per write that
    /// was followed by a pause.
    pub sq_tail_updates: u64,
}

/// A running software NVMe controller. Dropping it stops and joins the
/// controller thread.
pub struct Emulator {
    shared: Arc<Shared>,
    config: EmulatorConfig,
    name: String,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Emulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Emulator").field("name", &self.name).field("stats", &self.stats()).finish()
    }
}

impl Emulator {
    /// Validates `config`, allocates the register page and the backing
    /// store, and spawns the controller thread `nvme-emu-<name>`.
    pub fn start(config: EmulatorConfig) -> Result<Arc<Emulator>, EmuError> {
        config.validate()?;
        let regs = regs::RegisterPage::new(&config)?;
        let media = media::Media::new(&config)?;
        let shared = Arc::new(Shared {
            regs,
            iova: dma::IovaSpace::new(),
            sq_domains: (0..=config.io_queues).map(|_| std::sync::atomic::AtomicU32::new(0)).collect(),
            stats: StatsAtomics::default(),
            stop: AtomicBool::new(false),
            faults: fault::Faults::new(config.faults.clone()),
            gone: AtomicBool::new(config.registers_all_ones),
            gone_fill: std::sync::atomic::AtomicU32::new(u32::MAX),
            gone_ack: AtomicBool::new(false),
            kick: AtomicBool::new(false),
            media: std::sync::Mutex::new(media),
        });
        if config.registers_all_ones {
            shared.regs.fill_ones();
        }
        let ctrl = Controller::new(config.clone());
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nvme-emu-{}", config.name))
            .spawn(move || controller::run(thread_shared, ctrl))
            .map_err(EmuError::Spawn)?;
        Ok(Arc::new(Emulator { name: format!("emu:{}", config.name), shared, config, thread: Some(thread) }))
    }

    /// The memfd of I/O queue pair `qid`'s doorbell page (SQ tail and CQ
    /// head doorbells, the 4096 bytes at `1000h + qid * 4096` of BAR0),
    /// when the emulator was started with
    /// [`EmulatorConfig::shared_doorbells`] and `1 <= qid <= io_queues`;
    /// `None` otherwise. The admin queue's page is never handed out.
    pub fn doorbell_page_fd(&self, qid: u16) -> Option<std::os::fd::OwnedFd> {
        if qid == 0 {
            return None;
        }
        self.shared.regs.doorbell_page_fd(qid)
    }

    /// Replaces I/O queue pair `qid`'s doorbell page by a fresh, zeroed
    /// memfd page, so a process that mapped the old page (a client whose
    /// lease was reclaimed) can no longer ring this queue's doorbells once
    /// it is granted to someone else. Call it while the queue does not
    /// exist on the controller. `Ok(false)` without shared doorbells.
    ///
    /// # Errors
    ///
    /// [`EmuError::Os`] when the new page cannot be made.
    pub fn renew_doorbell_page(&self, qid: u16) -> Result<bool, EmuError> {
        if qid == 0 {
            return Ok(false);
        }
        self.shared.regs.renew_doorbell_page(qid)
    }

    /// The counters now.
    pub fn stats(&self) -> EmuStats {
        let s = &self.shared.stats;
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        EmuStats {
            commands: l(&s.commands),
            admin_commands: l(&s.admin_commands),
            media_bytes_read: l(&s.media_bytes_read),
            media_bytes_written: l(&s.media_bytes_written),
            doorbell_violations: l(&s.doorbell_violations),
            dma_faults: l(&s.dma_faults),
            dma_domain_faults: l(&s.dma_domain_faults),
            faults_injected: l(&self.shared.faults.injected),
            sq_tail_backwards: l(&s.sq_tail_backwards),
            sqe_overwritten: l(&s.sqe_overwritten),
            cq_full_stalls: l(&s.cq_full_stalls),
            sq_deletion_aborts: l(&s.sq_deletion_aborts),
            sq_tail_updates: l(&s.sq_tail_updates),
        }
    }

    /// Appends a fault-injection rule, checked after those already
    /// installed (from [`EmulatorConfig::faults`] or earlier calls). It
    /// applies to commands the controller fetches from now on; commands
    /// already fetched are not affected. Safe to call from any thread while
    /// the controller runs. A rule with `times: Some(0)` is ignored.
    pub fn add_fault(&self, rule: FaultRule) {
        self.shared.faults.add(rule);
    }

    /// Removes every fault-injection rule. Commands fetched from now on
    /// execute normally; completions already delayed by a
    /// [`FaultAction::Delay`] are still posted when due, and commands held
    /// by [`FaultAction::NeverComplete`] stay without a completion.
    pub fn clear_faults(&self) {
        self.shared.faults.clear();
    }

    /// Fault injection: the device disappears (surprise removal, dead
    /// link), as [`EmulatorConfig::registers_all_ones`] from the start.
    /// Every register, CAP, CSTS and the doorbells included, reads
    /// `0xFFFF_FFFF` from when this returns; the controller thread stops
    /// all work (no fetch, no completion, no DMA: commands in flight never
    /// complete). Host register writes still land in the page's memory
    /// until the thread restores all ones, at most about 1 ms later. There
    /// is no way back: start a new emulator.
    ///
    /// Returns once the controller thread has stopped working (it finishes
    /// the poll iteration in progress first).
    pub fn set_gone(&self) {
        self.stop_answering(u32::MAX);
    }

    /// Fault injection: the function's memory space is disabled (PCI
    /// Command register bit 1 cleared under the driver, e.g. with
    /// `setpci`): as [`Emulator::set_gone`], except that the register page
    /// reads all zeros, which is what QEMU's guest sees for a BAR that no
    /// longer decodes. CSTS then reads RDY = 0 and CFS = 0: only a host
    /// that checks RDY notices. There is no way back: start a new emulator.
    pub fn disable_memory_space(&self) {
        self.stop_answering(0);
    }

    fn stop_answering(&self, fill: u32) {
        self.shared.gone_fill.store(fill, Ordering::SeqCst);
        self.shared.gone.store(true, Ordering::SeqCst);
        self.shared.regs.fill(fill);
        if let Some(t) = &self.thread {
            t.thread().unpark();
            while !self.shared.gone_ack.load(Ordering::Acquire) && !t.is_finished() {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }

    /// Fault injection: the power fails. At once, as [`Emulator::set_gone`]:
    /// the controller stops fetching and completing (commands in flight
    /// never complete) and every register reads `0xFFFF_FFFF`. Then each
    /// logical block that the write cache holds non-durable is kept (its
    /// new contents) or lost (back to its last durable contents), each
    /// decided on its own by a generator seeded with
    /// [`WriteCacheSpec::seed`], so a multi-block write may be torn at
    /// logical block boundaries, never inside a block (AWUPF = 0). Then
    /// the backing store is released: a RAM disk goes back to its
    /// registry and a file is closed, so a new emulator can open them
    /// while this handle (and any DMA buffer holding it) lives on. Without
    /// a write cache nothing is lost. See the crate documentation, "Power
    /// loss".
    ///
    /// Only the first power failure acts (this call or a
    /// [`FaultAction::PowerFail`] rule); later calls return its report.
    /// There is no way back: start a new emulator.
    pub fn power_fail(&self) -> PowerFailReport {
        self.stop_answering(u32::MAX);
        self.shared.lock_media().power_loss()
    }

    /// The report of the power failure, once the power has failed
    /// ([`Emulator::power_fail`] or a [`FaultAction::PowerFail`] rule);
    /// `None` before.
    pub fn power_fail_report(&self) -> Option<PowerFailReport> {
        self.shared.lock_media().power_report()
    }

    /// Writes `data` straight to the media of namespace `nsid` at byte
    /// `byte_offset`, bypassing the commands and the write cache (for
    /// corruption tests): durable at once. A logical block the write cache
    /// holds non-durable gets the bytes in its last durable contents: host
    /// reads still return its cached contents, which replace the written
    /// bytes if the block is destaged or kept at a power failure. Any byte
    /// range inside the namespace, no alignment needed. Waits for the
    /// controller's current poll iteration.
    ///
    /// # Errors
    ///
    /// [`MediaAccessError::NoNamespace`], [`MediaAccessError::OutOfRange`]
    /// (the range is not inside the namespace),
    /// [`MediaAccessError::PoweredOff`] after a power failure,
    /// [`MediaAccessError::NullBacking`], [`MediaAccessError::Store`] (a
    /// file I/O error).
    pub fn write_media(&self, nsid: u32, byte_offset: u64, data: &[u8]) -> Result<(), MediaAccessError> {
        self.shared.lock_media().write_direct(nsid, byte_offset, data)
    }

    /// Reads what the media of namespace `nsid` holds at byte
    /// `byte_offset` into `buf`, bypassing the commands and the write
    /// cache: for a logical block the write cache holds non-durable, its
    /// last durable contents (what a power failure that loses it leaves).
    /// Errors as [`Emulator::write_media`].
    pub fn read_media(&self, nsid: u32, byte_offset: u64, buf: &mut [u8]) -> Result<(), MediaAccessError> {
        self.shared.lock_media().read_direct(nsid, byte_offset, buf)
    }

    /// Maps memory the emulator reaches only through copies (GPU memory,
    /// see [`ExternalMemory`]) into this controller's device address space,
    /// for data transfers, in [`SHARED_DOMAIN`] (SQs given another domain
    /// with [`Emulator::set_sq_domain`] cannot reach it). Unmap with
    /// [`NvmeDevice::dma_unmap`].
    pub fn map_external(&self, mem: Arc<dyn ExternalMemory>) -> Result<DmaMapping, DeviceError> {
        self.shared.iova.map_external(mem)
    }

    /// Maps `host..host + len` (4 KiB-aligned `host`, `len > 0`) as
    /// [`NvmeDevice::dma_map`] does, owned by DMA domain `domain`: commands
    /// from SQs of another non-zero domain cannot reach it (their data
    /// buffers and PRP list pages there fail with Data Transfer Error,
    /// counted in [`EmuStats::dma_domain_faults`]). Domain
    /// [`SHARED_DOMAIN`] (0) is the controller owner's, the same as
    /// [`NvmeDevice::dma_map`]. Unmap with [`NvmeDevice::dma_unmap`].
    ///
    /// # Errors
    ///
    /// As [`NvmeDevice::dma_map`]: [`DeviceError::BadRange`] for an
    /// unaligned or empty range, [`DeviceError::AddressSpaceExhausted`].
    ///
    /// # Safety
    ///
    /// As [`NvmeDevice::dma_map`]: the memory must stay allocated until
    /// [`NvmeDevice::dma_unmap`] of the mapping has returned, and nothing
    /// may hold a Rust reference into it while the controller may write it.
    pub unsafe fn dma_map_in_domain(
        &self,
        host: NonNull<u8>,
        len: usize,
        domain: u32,
    ) -> Result<DmaMapping, DeviceError> {
        self.shared.iova.map(host, len, domain)
    }

    /// Sets the DMA domain of I/O SQ `qid` (1..=`io_queues`): the SQ the
    /// next Create I/O SQ of `qid` makes belongs to `domain`, and its
    /// commands reach only data buffers and PRP list pages mapped in that
    /// domain (every mapping for [`SHARED_DOMAIN`], the default). Set it
    /// before sending Create I/O SQ; an SQ that exists keeps the domain
    /// it was created with. Rings are fetched and completions posted by
    /// the controller whatever their domain.
    ///
    /// # Errors
    ///
    /// [`EmuError::NoSuchQueue`] when `qid` is 0 (the admin queue, always
    /// the owner's) or above `io_queues`.
    pub fn set_sq_domain(&self, qid: u16, domain: u32) -> Result<(), EmuError> {
        let slot = (qid != 0).then(|| self.shared.sq_domains.get(usize::from(qid))).flatten();
        let slot = slot.ok_or(EmuError::NoSuchQueue { qid, io_queues: self.config.io_queues })?;
        // Release: ordered before the doorbell write of the Create I/O SQ
        // that follows, whose handling reads it (Acquire).
        slot.store(domain, Ordering::Release);
        Ok(())
    }

    /// Page-locks the RAM media (the RAM and RAM disk stores' images)
    /// through `locker`, once per image and for as long as the media
    /// lives (a power failure releases the locks with the media), so that
    /// the copies of a DMA engine between it and external memory
    /// ([`ExternalMemory::start_read`]) run asynchronously and at full
    /// speed. Returns how many images are locked (0 for the file and null
    /// stores, or when the locker refuses). Waits for the controller's
    /// current poll iteration and holds it back while locking, which takes
    /// time in proportion to the media's size: call it at set-up, not
    /// while commands are expected to complete.
    pub fn lock_media_pages(&self, locker: &dyn PageLocker) -> usize {
        self.shared.lock_media().lock_pages(locker)
    }

    /// `true` while the controller thread runs: `false` after it stopped,
    /// and (a bug, which tests and fuzzing look for) if it panicked.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &EmulatorConfig {
        &self.config
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                tracing::error!(name = %self.name, "nvme-emu controller thread panicked");
            }
        }
    }
}

impl NvmeDevice for Emulator {
    fn name(&self) -> &str {
        &self.name
    }

    fn bar0(&self) -> &Mmio {
        self.shared.regs.mmio()
    }

    /// Maps `host..host + len` (4 KiB-aligned `host`, `len > 0`) at fresh
    /// device addresses from [`IOVA_BASE`] up, followed by an unmapped
    /// guard page.
    unsafe fn dma_map(&self, host: NonNull<u8>, len: usize) -> Result<DmaMapping, DeviceError> {
        self.shared.iova.map(host, len, SHARED_DOMAIN)
    }

    /// Removes a mapping; waits until the controller thread's current poll
    /// iteration (which may be touching it) has ended.
    fn dma_unmap(&self, mapping: &DmaMapping) -> Result<(), DeviceError> {
        self.shared.iova.unmap(mapping)
    }

    /// Wakes the controller thread and keeps it polling for at least
    /// 200 us: a GPU kernel about to write doorbells in
    /// the register page cannot wake it, and a napping thread would see
    /// them only at the end of its nap (up to 1 ms; 50 us plus the
    /// timer's overshoot between a host's requests).
    fn expect_doorbells(&self) {
        self.shared.kick.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}
