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
//! doorbell writes to the page behind [`nvm_queue::NvmeDevice::bar0`], SQEs and PRP
//! lists in DMA memory mapped through [`nvm_queue::NvmeDevice::dma_map`], CQEs with a
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
//! * Started with [`Emulator::start_on`] a [`nvm_queue::VirtualClock`],
//!   the emulator has no thread and takes no real time: it polls whenever
//!   something waits on that clock (the driver's bounded waits, through
//!   [`nvm_queue::NvmeDevice::clock`]), at that clock's virtual instant, so timing
//!   ([`EmulatorConfig::ready_delay`], the [`TimingModel`], fault delays)
//!   is virtual and a run is repeatable (tests, fuzzing).
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

mod admin;
mod backing;
mod cache;
mod cc;
pub mod config;
mod controller;
mod data;
mod dma;
mod emulator;
mod error;
mod external;
mod fault;
mod identify;
mod in_transfer;
mod media;
mod nvm;
mod prp;
mod queues;
mod ram_disk;
mod regs;
mod run;
mod shared;
mod stats;
mod timing;
mod transfer;
mod undo;
mod zeroed;

pub use config::{
    BackingSpec, EmulatorConfig, NamespaceSpec, TimingModel, WriteCacheSpec, DEFAULT_IDLE_SPIN,
    SHARED_DOORBELL_DSTRD,
};
pub use dma::{IOVA_BASE, SHARED_DOMAIN};
pub use emulator::Emulator;
pub use error::EmuError;
pub use external::{CopyFence, ExternalMemory, FenceState, HostPin, PageLocker};
pub use fault::{FaultAction, FaultMatch, FaultRule};
pub use identify::{CONTROLLER_ID, VENDOR_ID};
pub use media::{MediaAccessError, PowerFailReport};
pub use ram_disk::remove_ram_disk;
pub use stats::EmuStats;
