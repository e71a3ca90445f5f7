//! Opcodes and command builders, in the style of io-uring's `opcode.rs`.
//!
//! Each command is a struct: required fields go through `new(..)`, optional
//! ones through `const fn` setters that take and return `Self`, and
//! `build(self) -> Sqe` destructures `self` without `..`, so a field that
//! `build` forgets to encode is a compile error.
//!
//! Builders leave CID, PRP1 and PRP2 at zero: the queue assigns the command
//! identifier ([`Sqe::set_cid`]) and the data pointer ([`Sqe::set_prp`]).
//! Counts are taken 1-based and converted to the spec's zero-based encodings
//! here, once ([`Nlb`], queue sizes, dword counts, range counts).
//!
//! References: admin commands NVMe Base 2.0, 5 (table "Opcodes for Admin
//! Commands"); I/O commands NVM Command Set 1.0, 3 (table "Opcodes for NVM
//! Commands"). For the emulator, [`Sqe::slba`], [`Sqe::nlb`] and
//! [`CreateQueueFields::from_sqe`] decode the same fields with the same
//! rules.

use crate::sqe::{Sqe, NSID_ALL};

pub use crate::features::{feature_id, NumberOfQueues};
pub use crate::log::log_id;

/// Admin command opcodes (NVMe Base 2.0, 5, "Opcodes for Admin Commands").
pub mod admin_opcode {
    /// 00h: Delete I/O Submission Queue (Base 1.4 5.6).
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// 01h: Create I/O Submission Queue (Base 1.4 5.4).
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// 02h: Get Log Page (Base 2.0 5.16).
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// 04h: Delete I/O Completion Queue (Base 1.4 5.5).
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// 05h: Create I/O Completion Queue (Base 1.4 5.3).
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// 06h: Identify (Base 2.0 5.17).
    pub const IDENTIFY: u8 = 0x06;
    /// 08h: Abort (Base 2.0 5.1).
    pub const ABORT: u8 = 0x08;
    /// 09h: Set Features (Base 2.0 5.27).
    pub const SET_FEATURES: u8 = 0x09;
    /// 0Ah: Get Features (Base 2.0 5.15).
    pub const GET_FEATURES: u8 = 0x0A;
    /// 0Ch: Asynchronous Event Request (Base 2.0 5.2).
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    /// 80h: Format NVM (Base 2.0 5.14).
    pub const FORMAT_NVM: u8 = 0x80;
}

/// NVM command set I/O opcodes (NVM Command Set 1.0, 3, "Opcodes for NVM
/// Commands").
pub mod nvm_opcode {
    /// 00h: Flush (Base 2.0 7.1).
    pub const FLUSH: u8 = 0x00;
    /// 01h: Write (NVM Command Set 1.0 3.3.6).
    pub const WRITE: u8 = 0x01;
    /// 02h: Read (NVM Command Set 1.0 3.3.4).
    pub const READ: u8 = 0x02;
    /// 04h: Write Uncorrectable (NVM Command Set 1.0 3.3.7).
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    /// 05h: Compare (NVM Command Set 1.0 3.3.1).
    pub const COMPARE: u8 = 0x05;
    /// 08h: Write Zeroes (NVM Command Set 1.0 3.3.8).
    pub const WRITE_ZEROES: u8 = 0x08;
    /// 09h: Dataset Management (NVM Command Set 1.0 3.3.3).
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// NLB, Number of Logical Blocks of an I/O command (CDW12 bits 15:0; NVM
/// Command Set 1.0, 3.3.4, Read command CDW12). Stored **zero-based**, as on the wire:
/// a command moves `zero_based() + 1` logical blocks, 1..=65536.
///
/// Construct it from a 1-based block count with [`Nlb::from_blocks`], so
/// the conversion happens once, here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nlb(u16);

impl Nlb {
    /// One logical block.
    pub const ONE: Nlb = Nlb(0);
    /// 65536 logical blocks, the largest count one command can carry.
    pub const MAX: Nlb = Nlb(u16::MAX);

    /// From a 1-based count of logical blocks; `None` for 0 or more than
    /// 65536.
    pub const fn from_blocks(blocks: u32) -> Option<Nlb> {
        if blocks == 0 || blocks > 0x1_0000 {
            None
        } else {
            Some(Nlb((blocks - 1) as u16))
        }
    }

    /// From the zero-based wire value (as read from CDW12 bits 15:0).
    pub const fn from_zero_based(nlb_z: u16) -> Nlb {
        Nlb(nlb_z)
    }

    /// Number of logical blocks, 1-based (1..=65536).
    pub const fn blocks(self) -> u32 {
        self.0 as u32 + 1
    }

    /// The zero-based wire value.
    pub const fn zero_based(self) -> u16 {
        self.0
    }
}

/// Zero-based QSIZE for a 1-based entry count. Counts outside 2..=65536
/// encode as 0, which the spec defines as an invalid size: the controller
/// then fails the command with Invalid Queue Size instead of creating a
/// queue of a size the caller did not ask for.
const fn qsize_z(entries: u32) -> u32 {
    if entries >= 2 && entries <= 0x1_0000 {
        entries - 1
    } else {
        0
    }
}

/// CNS, Controller or Namespace Structure (Identify CDW10 bits 7:0; NVMe
/// Base 2.0, 5.17.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Cns {
    /// 00h: Identify Namespace data structure for NSID (NVM Command Set 1.0
    /// 4.1.5.1).
    Namespace = 0x00,
    /// 01h: Identify Controller data structure (Base 2.0 5.17.2.1).
    Controller = 0x01,
    /// 02h: Active Namespace ID list: up to 1024 active NSIDs greater than
    /// NSID, ascending (Base 2.0 5.17.2.2).
    ActiveNamespaceList = 0x02,
}

impl Cns {
    /// Decodes a raw CNS value; `None` for values this crate does not know.
    pub const fn from_raw(cns: u8) -> Option<Cns> {
        match cns {
            0x00 => Some(Cns::Namespace),
            0x01 => Some(Cns::Controller),
            0x02 => Some(Cns::ActiveNamespaceList),
            _ => None,
        }
    }
}

/// Identify (admin 06h; NVMe Base 2.0, 5.17): returns a 4096-byte data
/// structure at PRP1. CDW10: CNS bits 7:0, CNTID bits 31:16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct Identify {
    cns: Cns,
    nsid: u32,
    cntid: u16,
}

impl Identify {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::IDENTIFY;

    /// Identify with the given CNS; NSID 0, CNTID 0.
    pub const fn new(cns: Cns) -> Self {
        Identify { cns, nsid: 0, cntid: 0 }
    }

    /// NSID: the namespace for CNS 00h, or the NSID to list after for CNS
    /// 02h.
    pub const fn nsid(mut self, nsid: u32) -> Self {
        self.nsid = nsid;
        self
    }

    /// CNTID, Controller Identifier (CDW10 bits 31:16).
    pub const fn cntid(mut self, cntid: u16) -> Self {
        self.cntid = cntid;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let Identify { cns, nsid, cntid } = self;
        let mut sqe = Sqe::new(Self::CODE, nsid);
        sqe.cdw10 = cns as u32 | (cntid as u32) << 16;
        sqe
    }
}

/// Create I/O Completion Queue (admin 05h; NVMe Base 2.0 "Create I/O Completion Queue
/// command", Base 1.4 5.3). PRP1 = queue
/// base (the queue sets it). CDW10: QSIZE bits 31:16 (zero-based), QID bits
/// 15:0. CDW11: IV bits 31:16, IEN bit 1, PC bit 0.
///
/// PC (physically contiguous) is always 1: this crate's queues are one
/// contiguous DMA allocation, so no PRP list describes the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct CreateIoCq {
    qid: u16,
    entries: u32,
    interrupt_vector: u16,
    interrupts_enabled: bool,
}

impl CreateIoCq {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::CREATE_IO_CQ;

    /// Queue `qid` (1..) with `entries` slots, **1-based**; it must be in
    /// 2..=65536 and at most CAP.MQES + 1. `build` stores `entries - 1` in
    /// QSIZE; an out-of-range count is encoded as QSIZE 0, which the spec
    /// defines as invalid, so the controller fails the command with Invalid
    /// Queue Size rather than creating a queue of another size.
    /// Interrupts are disabled (IEN 0, IV 0) unless set.
    pub const fn new(qid: u16, entries: u32) -> Self {
        CreateIoCq { qid, entries, interrupt_vector: 0, interrupts_enabled: false }
    }

    /// IV, Interrupt Vector (CDW11 bits 31:16; MSI-X vector index).
    pub const fn interrupt_vector(mut self, iv: u16) -> Self {
        self.interrupt_vector = iv;
        self
    }

    /// IEN, Interrupts Enabled (CDW11 bit 1).
    pub const fn interrupts_enabled(mut self, ien: bool) -> Self {
        self.interrupts_enabled = ien;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let CreateIoCq { qid, entries, interrupt_vector, interrupts_enabled } = self;
        let mut sqe = Sqe::new(Self::CODE, 0);
        sqe.cdw10 = qsize_z(entries) << 16 | qid as u32;
        sqe.cdw11 = (interrupt_vector as u32) << 16 | (interrupts_enabled as u32) << 1 | 1;
        sqe
    }
}

/// Create I/O Submission Queue (admin 01h; NVMe Base 2.0 "Create I/O Submission Queue
/// command", Base 1.4 5.4). PRP1 = queue
/// base (the queue sets it). CDW10: QSIZE bits 31:16 (zero-based), QID bits
/// 15:0. CDW11: CQID bits 31:16, QPRIO bits 2:1, PC bit 0 (always 1, see
/// [`CreateIoCq`]). The completion queue must exist first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct CreateIoSq {
    qid: u16,
    entries: u32,
    cqid: u16,
    priority: u8,
}

impl CreateIoSq {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::CREATE_IO_SQ;

    /// Queue `qid` with `entries` slots (**1-based**, 2..=65536; out-of-range
    /// counts encode as the invalid QSIZE 0, as for [`CreateIoCq::new`]),
    /// posting completions to CQ `cqid`. Priority 0 (urgent; only used with
    /// weighted round robin arbitration).
    pub const fn new(qid: u16, entries: u32, cqid: u16) -> Self {
        CreateIoSq { qid, entries, cqid, priority: 0 }
    }

    /// QPRIO, Queue Priority (CDW11 bits 2:1), masked to 2 bits: 0 urgent,
    /// 1 high, 2 medium, 3 low.
    pub const fn priority(mut self, qprio: u8) -> Self {
        self.priority = qprio & 3;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let CreateIoSq { qid, entries, cqid, priority } = self;
        let mut sqe = Sqe::new(Self::CODE, 0);
        sqe.cdw10 = qsize_z(entries) << 16 | qid as u32;
        sqe.cdw11 = (cqid as u32) << 16 | ((priority & 3) as u32) << 1 | 1;
        sqe
    }
}

/// Delete I/O Submission Queue (admin 00h; Base 1.4 5.6). CDW10: QID
/// bits 15:0. Delete an SQ before its CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct DeleteIoSq {
    qid: u16,
}

impl DeleteIoSq {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::DELETE_IO_SQ;

    /// Deletes SQ `qid`.
    pub const fn new(qid: u16) -> Self {
        DeleteIoSq { qid }
    }

    /// Encodes the command (CID zero).
    pub const fn build(self) -> Sqe {
        let DeleteIoSq { qid } = self;
        let mut sqe = Sqe::new(Self::CODE, 0);
        sqe.cdw10 = qid as u32;
        sqe
    }
}

/// Delete I/O Completion Queue (admin 04h; Base 1.4 5.5). CDW10: QID
/// bits 15:0. Fails with Invalid Queue Deletion while an SQ still uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct DeleteIoCq {
    qid: u16,
}

impl DeleteIoCq {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::DELETE_IO_CQ;

    /// Deletes CQ `qid`.
    pub const fn new(qid: u16) -> Self {
        DeleteIoCq { qid }
    }

    /// Encodes the command (CID zero).
    pub const fn build(self) -> Sqe {
        let DeleteIoCq { qid } = self;
        let mut sqe = Sqe::new(Self::CODE, 0);
        sqe.cdw10 = qid as u32;
        sqe
    }
}

/// Abort (admin 08h; NVMe Base 2.0, 5.1). CDW10: SQID bits 15:0, CID bits
/// 31:16 of the command to abort. Best effort: completion DW0 bit 0 = 1 means
/// the command was not aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct Abort {
    sqid: u16,
    cid: u16,
}

impl Abort {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::ABORT;

    /// Aborts command `cid` submitted on SQ `sqid`.
    pub const fn new(sqid: u16, cid: u16) -> Self {
        Abort { sqid, cid }
    }

    /// Encodes the command (CID of the Abort itself zero).
    pub const fn build(self) -> Sqe {
        let Abort { sqid, cid } = self;
        let mut sqe = Sqe::new(Self::CODE, 0);
        sqe.cdw10 = sqid as u32 | (cid as u32) << 16;
        sqe
    }
}

/// Asynchronous Event Request (admin 0Ch; NVMe Base 2.0, 5.2): no fields;
/// completes when the controller reports an event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct AsyncEventRequest {}

impl AsyncEventRequest {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::ASYNC_EVENT_REQUEST;

    /// The command.
    pub const fn new() -> Self {
        AsyncEventRequest {}
    }

    /// Encodes the command (CID zero).
    pub const fn build(self) -> Sqe {
        let AsyncEventRequest {} = self;
        Sqe::new(Self::CODE, 0)
    }
}

/// Get Log Page (admin 02h; NVMe Base 2.0, 5.16). CDW10: LID bits 7:0, RAE
/// bit 15, NUMDL bits 31:16; CDW11: NUMDU bits 15:0 (NUMD = NUMDU:NUMDL is
/// the zero-based number of dwords); CDW12/CDW13: LPOL/LPOU, the byte
/// offset into the log page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct GetLogPage {
    lid: u8,
    dwords: u32,
    nsid: u32,
    retain_async_event: bool,
    offset_bytes: u64,
}

impl GetLogPage {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::GET_LOG_PAGE;

    /// Log page `lid` ([`log_id`]), transferring `dwords` dwords
    /// (**1-based**; bytes = 4 * dwords). 0 is encoded as 1 dword, the
    /// smallest transfer the command can express. NSID defaults to
    /// `FFFF_FFFFh` (all namespaces, controller-wide data), offset 0, RAE 0.
    pub const fn new(lid: u8, dwords: u32) -> Self {
        GetLogPage { lid, dwords, nsid: NSID_ALL, retain_async_event: false, offset_bytes: 0 }
    }

    /// NSID for namespace-scoped log pages.
    pub const fn nsid(mut self, nsid: u32) -> Self {
        self.nsid = nsid;
        self
    }

    /// RAE, Retain Asynchronous Event (CDW10 bit 15).
    pub const fn retain_async_event(mut self, rae: bool) -> Self {
        self.retain_async_event = rae;
        self
    }

    /// LPOL/LPOU (CDW12/CDW13): offset into the log page in **bytes**; must
    /// be a multiple of 4.
    pub const fn offset_bytes(mut self, offset: u64) -> Self {
        self.offset_bytes = offset;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let GetLogPage { lid, dwords, nsid, retain_async_event, offset_bytes } = self;
        let numd = dwords.saturating_sub(1);
        let mut sqe = Sqe::new(Self::CODE, nsid);
        sqe.cdw10 = lid as u32 | (retain_async_event as u32) << 15 | (numd & 0xFFFF) << 16;
        sqe.cdw11 = numd >> 16;
        sqe.cdw12 = offset_bytes as u32;
        sqe.cdw13 = (offset_bytes >> 32) as u32;
        sqe
    }
}

/// Set Features (admin 09h; NVMe Base 2.0, 5.27). CDW10: FID bits 7:0, SV
/// (save) bit 31; CDW11: feature specific value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct SetFeatures {
    fid: u8,
    cdw11: u32,
    save: bool,
}

impl SetFeatures {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::SET_FEATURES;

    /// Sets feature `fid` ([`feature_id`]) to the raw CDW11 value `cdw11`.
    pub const fn new(fid: u8, cdw11: u32) -> Self {
        SetFeatures { fid, cdw11, save: false }
    }

    /// Number of Queues (FID 07h; Base 2.0 5.27.1): requests `sq_count`
    /// I/O SQs and `cq_count` I/O CQs, both **1-based** (admin queues not
    /// counted), encoded zero-based in NSQR (CDW11 bits 15:0) and NCQR (bits
    /// 31:16). Returns `None` if either count is 0. The granted counts come
    /// back in completion DW0 ([`NumberOfQueues::from_dw0`]).
    pub const fn number_of_queues(sq_count: u16, cq_count: u16) -> Option<SetFeatures> {
        if sq_count == 0 || cq_count == 0 {
            return None;
        }
        let cdw11 = (sq_count - 1) as u32 | ((cq_count - 1) as u32) << 16;
        Some(SetFeatures::new(feature_id::NUMBER_OF_QUEUES, cdw11))
    }

    /// Volatile Write Cache (FID 06h; Base 2.0 5.27.1): WCE, CDW11 bit 0.
    pub const fn volatile_write_cache(enable: bool) -> SetFeatures {
        SetFeatures::new(feature_id::VOLATILE_WRITE_CACHE, enable as u32)
    }

    /// SV, Save (CDW10 bit 31): make the value persist across resets.
    pub const fn save(mut self, save: bool) -> Self {
        self.save = save;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let SetFeatures { fid, cdw11, save } = self;
        let mut sqe = Sqe::new(Self::CODE, 0);
        sqe.cdw10 = fid as u32 | (save as u32) << 31;
        sqe.cdw11 = cdw11;
        sqe
    }
}

/// Get Features (admin 0Ah; NVMe Base 2.0, 5.15). CDW10: FID bits 7:0, SEL
/// bits 10:8. The value comes back in completion DW0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct GetFeatures {
    fid: u8,
    select: u8,
    cdw11: u32,
}

impl GetFeatures {
    /// The opcode.
    pub const CODE: u8 = admin_opcode::GET_FEATURES;

    /// Reads feature `fid` ([`feature_id`]), current value (SEL 000b).
    pub const fn new(fid: u8) -> Self {
        GetFeatures { fid, select: 0, cdw11: 0 }
    }

    /// SEL, Select (CDW10 bits 10:8), masked to 3 bits; see
    /// [`crate::features::select`].
    pub const fn select(mut self, sel: u8) -> Self {
        self.select = sel & 7;
        self
    }

    /// CDW11, for features that take a parameter (e.g. Temperature
    /// Threshold's sensor selection).
    pub const fn cdw11(mut self, cdw11: u32) -> Self {
        self.cdw11 = cdw11;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let GetFeatures { fid, select, cdw11 } = self;
        let mut sqe = Sqe::new(Self::CODE, 0);
        sqe.cdw10 = fid as u32 | ((select & 7) as u32) << 8;
        sqe.cdw11 = cdw11;
        sqe
    }
}

/// CDW12 FUA bit (Force Unit Access), NVM Command Set 1.0 3.3.4.
const FUA: u32 = 1 << 30;
/// CDW12 LR bit (Limited Retry).
const LR: u32 = 1 << 31;
/// CDW12 DEAC bit of Write Zeroes (Deallocate).
const DEAC: u32 = 1 << 25;

/// The shared layout of Read / Write / Write Zeroes: SLBA in CDW10 (bits
/// 31:0) and CDW11 (bits 63:32), NLB zero-based in CDW12 bits 15:0, plus
/// `flags` in the upper bits of CDW12.
const fn rw_sqe(opcode: u8, nsid: u32, slba: u64, nlb: Nlb, flags: u32) -> Sqe {
    let mut sqe = Sqe::new(opcode, nsid);
    sqe.cdw10 = slba as u32;
    sqe.cdw11 = (slba >> 32) as u32;
    sqe.cdw12 = nlb.zero_based() as u32 | flags;
    sqe
}

/// Read (NVM 02h; NVM Command Set 1.0, 3.3.4): reads `nlb` logical blocks
/// starting at logical block `slba` into the PRP-described buffer
/// (`nlb.blocks() * block size` bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct Read {
    nsid: u32,
    slba: u64,
    nlb: Nlb,
    fua: bool,
    limited_retry: bool,
}

impl Read {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::READ;

    /// Reads `nlb` blocks at SLBA `slba` (in logical blocks) of namespace
    /// `nsid`.
    pub const fn new(nsid: u32, slba: u64, nlb: Nlb) -> Self {
        Read { nsid, slba, nlb, fua: false, limited_retry: false }
    }

    /// FUA, Force Unit Access (CDW12 bit 30): read from non-volatile media.
    pub const fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }

    /// LR, Limited Retry (CDW12 bit 31).
    pub const fn limited_retry(mut self, lr: bool) -> Self {
        self.limited_retry = lr;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let Read { nsid, slba, nlb, fua, limited_retry } = self;
        let flags = if fua { FUA } else { 0 } | if limited_retry { LR } else { 0 };
        rw_sqe(Self::CODE, nsid, slba, nlb, flags)
    }
}

/// Write (NVM 01h; NVM Command Set 1.0, 3.3.6): writes `nlb` logical blocks
/// starting at logical block `slba` from the PRP-described buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct Write {
    nsid: u32,
    slba: u64,
    nlb: Nlb,
    fua: bool,
    limited_retry: bool,
}

impl Write {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::WRITE;

    /// Writes `nlb` blocks at SLBA `slba` (in logical blocks) of namespace
    /// `nsid`.
    pub const fn new(nsid: u32, slba: u64, nlb: Nlb) -> Self {
        Write { nsid, slba, nlb, fua: false, limited_retry: false }
    }

    /// FUA, Force Unit Access (CDW12 bit 30): complete only once the data
    /// is on non-volatile media.
    pub const fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }

    /// LR, Limited Retry (CDW12 bit 31).
    pub const fn limited_retry(mut self, lr: bool) -> Self {
        self.limited_retry = lr;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let Write { nsid, slba, nlb, fua, limited_retry } = self;
        let flags = if fua { FUA } else { 0 } | if limited_retry { LR } else { 0 };
        rw_sqe(Self::CODE, nsid, slba, nlb, flags)
    }
}

/// Flush (NVM 00h; NVMe Base 2.0, 7.1): commit volatile write cache contents
/// of namespace `nsid` (`FFFF_FFFFh` = all namespaces, if supported) to
/// non-volatile media. No data transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct Flush {
    nsid: u32,
}

impl Flush {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::FLUSH;

    /// Flushes namespace `nsid`.
    pub const fn new(nsid: u32) -> Self {
        Flush { nsid }
    }

    /// Encodes the command (CID zero).
    pub const fn build(self) -> Sqe {
        let Flush { nsid } = self;
        Sqe::new(Self::CODE, nsid)
    }
}

/// Write Zeroes (NVM 08h; NVM Command Set 1.0, 3.3.8): sets `nlb` logical
/// blocks at `slba` to zero, without a data transfer. CDW12: NLB bits 15:0
/// (zero-based), DEAC bit 25, FUA bit 30.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct WriteZeroes {
    nsid: u32,
    slba: u64,
    nlb: Nlb,
    deallocate: bool,
    fua: bool,
}

impl WriteZeroes {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::WRITE_ZEROES;

    /// Zeroes `nlb` blocks at SLBA `slba` (in logical blocks) of namespace
    /// `nsid`.
    pub const fn new(nsid: u32, slba: u64, nlb: Nlb) -> Self {
        WriteZeroes { nsid, slba, nlb, deallocate: false, fua: false }
    }

    /// DEAC, Deallocate (CDW12 bit 25): the controller may deallocate the
    /// blocks instead of writing zeroes.
    pub const fn deallocate(mut self, deac: bool) -> Self {
        self.deallocate = deac;
        self
    }

    /// FUA, Force Unit Access (CDW12 bit 30).
    pub const fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }

    /// Encodes the command (CID zero; no data pointer).
    pub const fn build(self) -> Sqe {
        let WriteZeroes { nsid, slba, nlb, deallocate, fua } = self;
        let flags = if deallocate { DEAC } else { 0 } | if fua { FUA } else { 0 };
        rw_sqe(Self::CODE, nsid, slba, nlb, flags)
    }
}

/// Dataset Management (NVM 09h; NVM Command Set 1.0, 3.3.3): hints about
/// ranges of logical blocks, e.g. deallocate ("trim"). The PRP-described
/// buffer holds `ranges` [`DsmRange`] entries (16 bytes each). CDW10: NR bits
/// 7:0 (zero-based range count); CDW11: IDR bit 0, IDW bit 1, AD bit 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct DatasetManagement {
    nsid: u32,
    nr_z: u8,
    deallocate: bool,
    integral_read: bool,
    integral_write: bool,
}

impl DatasetManagement {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::DATASET_MANAGEMENT;

    /// Largest number of ranges one command can carry.
    pub const MAX_RANGES: u16 = 256;

    /// `ranges` ranges (**1-based**, 1..=256) on namespace `nsid`; `None`
    /// for 0 or more than 256. No attribute is set until requested.
    pub const fn new(nsid: u32, ranges: u16) -> Option<Self> {
        if ranges == 0 || ranges > Self::MAX_RANGES {
            return None;
        }
        Some(DatasetManagement {
            nsid,
            nr_z: (ranges - 1) as u8,
            deallocate: false,
            integral_read: false,
            integral_write: false,
        })
    }

    /// AD, Attribute – Deallocate (CDW11 bit 2).
    pub const fn deallocate(mut self, ad: bool) -> Self {
        self.deallocate = ad;
        self
    }

    /// IDR, Attribute – Integral Dataset for Read (CDW11 bit 0).
    pub const fn integral_read(mut self, idr: bool) -> Self {
        self.integral_read = idr;
        self
    }

    /// IDW, Attribute – Integral Dataset for Write (CDW11 bit 1).
    pub const fn integral_write(mut self, idw: bool) -> Self {
        self.integral_write = idw;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let DatasetManagement { nsid, nr_z, deallocate, integral_read, integral_write } = self;
        let mut sqe = Sqe::new(Self::CODE, nsid);
        sqe.cdw10 = nr_z as u32;
        sqe.cdw11 = integral_read as u32 | (integral_write as u32) << 1 | (deallocate as u32) << 2;
        sqe
    }
}

/// One Dataset Management range (NVM Command Set 1.0, 3.3.3, "Dataset
/// Management – Range Definition"): 16 bytes, little-endian.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
pub struct DsmRange {
    /// Context Attributes (bytes 3:0): access hints; 0 for none.
    pub context_attributes: u32,
    /// Length in logical blocks (bytes 7:4), **1-based** (not zero-based).
    pub length_lbas: u32,
    /// Starting LBA (bytes 15:8), in logical blocks.
    pub slba: u64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<DsmRange>() == 16);
    assert!(offset_of!(DsmRange, context_attributes) == 0);
    assert!(offset_of!(DsmRange, length_lbas) == 4);
    assert!(offset_of!(DsmRange, slba) == 8);
};

impl DsmRange {
    /// A range of `length_lbas` logical blocks at `slba`, no context
    /// attributes.
    pub const fn new(slba: u64, length_lbas: u32) -> DsmRange {
        DsmRange { context_attributes: 0, length_lbas, slba }
    }
}

/// Decoders for the emulator, sharing the encoding rules of the builders.
impl Sqe {
    /// SLBA of Read / Write / Write Zeroes / Compare: CDW11:CDW10, in
    /// logical blocks.
    pub const fn slba(&self) -> u64 {
        (self.cdw11 as u64) << 32 | self.cdw10 as u64
    }

    /// NLB of Read / Write / Write Zeroes / Compare (CDW12 bits 15:0,
    /// zero-based on the wire).
    pub const fn nlb(&self) -> Nlb {
        Nlb::from_zero_based(self.cdw12 as u16)
    }

    /// FUA (CDW12 bit 30) of Read / Write / Write Zeroes.
    pub const fn fua(&self) -> bool {
        self.cdw12 & FUA != 0
    }

    /// LR, Limited Retry (CDW12 bit 31) of Read / Write / Write Zeroes.
    pub const fn limited_retry(&self) -> bool {
        self.cdw12 & LR != 0
    }

    /// DEAC (CDW12 bit 25) of Write Zeroes.
    pub const fn deac(&self) -> bool {
        self.cdw12 & DEAC != 0
    }

    /// Number of ranges of Dataset Management, **1-based** (NR + 1, so
    /// 1..=256).
    pub const fn dsm_ranges(&self) -> u16 {
        (self.cdw10 & 0xFF) as u16 + 1
    }

    /// Number of dwords requested by Get Log Page, **1-based** (NUMDU:NUMDL
    /// + 1; up to 2^32, hence `u64`).
    pub const fn log_page_dwords(&self) -> u64 {
        (((self.cdw11 & 0xFFFF) as u64) << 16 | (self.cdw10 >> 16) as u64) + 1
    }

    /// Byte offset of Get Log Page (LPOU:LPOL, CDW13:CDW12).
    pub const fn log_page_offset(&self) -> u64 {
        (self.cdw13 as u64) << 32 | self.cdw12 as u64
    }
}

/// The fields of Create I/O SQ (01h) and Create I/O CQ (05h), decoded with
/// the same rules [`CreateIoSq`] and [`CreateIoCq`] encode them (NVMe Base
/// 1.4, 5.3 and 5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CreateQueueFields {
    /// QID, queue identifier (CDW10 bits 15:0).
    pub qid: u16,
    /// Queue entries, **1-based** (QSIZE + 1, 1..=65536). QSIZE 0 decodes as
    /// 1, which is invalid: the controller must reject a size below 2 (and
    /// above CAP.MQES + 1) with Invalid Queue Size.
    pub entries: u32,
    /// CQID (CDW11 bits 31:16) for Create I/O SQ; 0 for Create I/O CQ.
    pub cqid: u16,
    /// QPRIO (CDW11 bits 2:1) for Create I/O SQ; 0 for Create I/O CQ.
    pub qprio: u8,
    /// PC, Physically Contiguous (CDW11 bit 0).
    pub pc: bool,
    /// IEN, Interrupts Enabled (CDW11 bit 1) for Create I/O CQ; false for
    /// Create I/O SQ.
    pub ien: bool,
    /// IV, Interrupt Vector (CDW11 bits 31:16) for Create I/O CQ; 0 for
    /// Create I/O SQ.
    pub iv: u16,
}

impl CreateQueueFields {
    /// Decodes an admin SQE. CDW11 is read as Create I/O SQ when the opcode
    /// is [`admin_opcode::CREATE_IO_SQ`] and as Create I/O CQ otherwise;
    /// the caller dispatches on the opcode first.
    pub const fn from_sqe(sqe: &Sqe) -> CreateQueueFields {
        let qid = sqe.cdw10 as u16;
        let entries = (sqe.cdw10 >> 16) + 1;
        let pc = sqe.cdw11 & 1 != 0;
        if sqe.opcode() == admin_opcode::CREATE_IO_SQ {
            CreateQueueFields {
                qid,
                entries,
                cqid: (sqe.cdw11 >> 16) as u16,
                qprio: ((sqe.cdw11 >> 1) & 3) as u8,
                pc,
                ien: false,
                iv: 0,
            }
        } else {
            CreateQueueFields {
                qid,
                entries,
                cqid: 0,
                qprio: 0,
                pc,
                ien: sqe.cdw11 & 2 != 0,
                iv: (sqe.cdw11 >> 16) as u16,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nlb_bounds() {
        assert_eq!(Nlb::from_blocks(0), None);
        assert_eq!(Nlb::from_blocks(65537), None);
        assert_eq!(Nlb::from_blocks(u32::MAX), None);
        let max = Nlb::from_blocks(65536).unwrap();
        assert_eq!(max.zero_based(), 0xFFFF);
        assert_eq!(max.blocks(), 65536);
        assert_eq!(max, Nlb::MAX);
        let one = Nlb::from_blocks(1).unwrap();
        assert_eq!(one.zero_based(), 0);
        assert_eq!(one, Nlb::ONE);
        for b in [1u32, 2, 8, 255, 256, 4096, 65535, 65536] {
            assert_eq!(Nlb::from_blocks(b).unwrap().blocks(), b);
        }
    }

    #[test]
    fn read() {
        let sqe = Read::new(1, 0x1_2345_6789, Nlb::from_blocks(8).unwrap()).build();
        assert_eq!(sqe.opcode(), 2);
        assert_eq!(sqe.nsid, 1);
        assert_eq!(sqe.cdw10, 0x2345_6789);
        assert_eq!(sqe.cdw11, 1);
        assert_eq!(sqe.cdw12, 7);
        assert_eq!(sqe.cid(), 0);
        assert_eq!((sqe.prp1, sqe.prp2), (0, 0));
        assert_eq!(sqe.slba(), 0x1_2345_6789);
        assert_eq!(sqe.nlb().blocks(), 8);
        assert!(!sqe.fua() && !sqe.limited_retry());
        let sqe = Read::new(1, 0, Nlb::ONE).fua(true).limited_retry(true).build();
        assert_eq!(sqe.cdw12, 0xC000_0000);
        assert!(sqe.fua() && sqe.limited_retry());
    }

    #[test]
    fn write_flush_zeroes() {
        let sqe = Write::new(2, u64::MAX, Nlb::MAX).fua(true).build();
        assert_eq!(sqe.opcode(), nvm_opcode::WRITE);
        assert_eq!((sqe.cdw10, sqe.cdw11), (u32::MAX, u32::MAX));
        assert_eq!(sqe.cdw12, 0x4000_FFFF);
        assert_eq!(sqe.slba(), u64::MAX);
        assert_eq!(sqe.nlb().blocks(), 65536);
        let f = Flush::new(1).build();
        assert_eq!(f, Sqe::new(nvm_opcode::FLUSH, 1));
        let z = WriteZeroes::new(1, 10, Nlb::from_blocks(2).unwrap()).deallocate(true).build();
        assert_eq!(z.opcode(), 0x08);
        assert_eq!(z.cdw12, 1 | 1 << 25);
        assert!(z.deac() && !z.fua());
        let z = WriteZeroes::new(1, 10, Nlb::ONE).fua(true).build();
        assert_eq!(z.cdw12, 1 << 30);
    }

    #[test]
    fn dataset_management() {
        assert_eq!(DatasetManagement::new(1, 0), None);
        assert_eq!(DatasetManagement::new(1, 257), None);
        let d = DatasetManagement::new(1, 256).unwrap().deallocate(true).build();
        assert_eq!(d.opcode(), 0x09);
        assert_eq!(d.cdw10, 0xFF);
        assert_eq!(d.cdw11, 1 << 2);
        assert_eq!(d.dsm_ranges(), 256);
        let d = DatasetManagement::new(1, 1).unwrap().integral_read(true).integral_write(true).build();
        assert_eq!(d.cdw10, 0);
        assert_eq!(d.cdw11, 3);
        assert_eq!(d.dsm_ranges(), 1);
        let r = DsmRange::new(0x10, 8);
        assert_eq!(zerocopy::IntoBytes::as_bytes(&r), &[0, 0, 0, 0, 8, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn create_queues() {
        let cq = CreateIoCq::new(3, 64).build();
        assert_eq!(cq.opcode(), 0x05);
        assert_eq!(cq.cdw10, (63 << 16) | 3);
        assert_eq!(cq.cdw11 & 1, 1);
        assert_eq!(cq.cdw11, 1);
        let f = CreateQueueFields::from_sqe(&cq);
        assert_eq!(
            f,
            CreateQueueFields { qid: 3, entries: 64, cqid: 0, qprio: 0, pc: true, ien: false, iv: 0 }
        );
        let cq = CreateIoCq::new(1, 65536).interrupt_vector(5).interrupts_enabled(true).build();
        assert_eq!(cq.cdw10, 0xFFFF_0001);
        assert_eq!(cq.cdw11, 5 << 16 | 0b11);
        let f = CreateQueueFields::from_sqe(&cq);
        assert_eq!((f.entries, f.ien, f.iv, f.pc), (65536, true, 5, true));
        // Out-of-range sizes encode as the invalid QSIZE 0.
        for bad in [0u32, 1, 65537, 131073, u32::MAX] {
            assert_eq!(CreateIoCq::new(1, bad).build().cdw10 >> 16, 0);
            assert_eq!(CreateIoSq::new(1, bad, 1).build().cdw10 >> 16, 0);
        }
        let sq = CreateIoSq::new(2, 1024, 7).priority(0xFF).build();
        assert_eq!(sq.opcode(), 0x01);
        assert_eq!(sq.cdw10, (1023 << 16) | 2);
        assert_eq!(sq.cdw11, 7 << 16 | 3 << 1 | 1);
        let f = CreateQueueFields::from_sqe(&sq);
        assert_eq!(
            f,
            CreateQueueFields { qid: 2, entries: 1024, cqid: 7, qprio: 3, pc: true, ien: false, iv: 0 }
        );
        let d = DeleteIoSq::new(9).build();
        assert_eq!((d.opcode(), d.cdw10), (0x00, 9));
        let d = DeleteIoCq::new(9).build();
        assert_eq!((d.opcode(), d.cdw10), (0x04, 9));
    }

    #[test]
    fn identify() {
        let s = Identify::new(Cns::Controller).build();
        assert_eq!((s.opcode(), s.nsid, s.cdw10), (0x06, 0, 1));
        let s = Identify::new(Cns::Namespace).nsid(1).cntid(0x12).build();
        assert_eq!((s.nsid, s.cdw10), (1, 0x0012_0000));
        assert_eq!(Cns::from_raw(2), Some(Cns::ActiveNamespaceList));
        assert_eq!(Cns::from_raw(3), None);
    }

    #[test]
    fn features() {
        let s = SetFeatures::number_of_queues(4, 4).unwrap().build();
        assert_eq!(s.opcode(), 0x09);
        assert_eq!(s.cdw10, 7);
        assert_eq!(s.cdw11, 0x0003_0003);
        assert_eq!(SetFeatures::number_of_queues(0, 4), None);
        assert_eq!(SetFeatures::number_of_queues(4, 0), None);
        let s = SetFeatures::number_of_queues(u16::MAX, 1).unwrap().build();
        assert_eq!(s.cdw11, 0xFFFE);
        let s = SetFeatures::volatile_write_cache(true).save(true).build();
        assert_eq!((s.cdw10, s.cdw11), (0x8000_0006, 1));
        let g = GetFeatures::new(feature_id::ARBITRATION).select(0xFF).cdw11(9).build();
        assert_eq!((g.opcode(), g.cdw10, g.cdw11), (0x0A, 0x701, 9));
    }

    #[test]
    fn get_log_page() {
        let s = GetLogPage::new(log_id::SMART_HEALTH, 128).build();
        assert_eq!(s.opcode(), 0x02);
        assert_eq!(s.nsid, NSID_ALL);
        assert_eq!(s.cdw10, 127 << 16 | 2);
        assert_eq!(s.cdw11, 0);
        assert_eq!(s.log_page_dwords(), 128);
        let s = GetLogPage::new(log_id::ERROR_INFORMATION, 0x12_3457)
            .nsid(1)
            .retain_async_event(true)
            .offset_bytes(0x1_0000_0040)
            .build();
        assert_eq!(s.nsid, 1);
        assert_eq!(s.cdw10, 0x3456 << 16 | 1 << 15 | 1);
        assert_eq!(s.cdw11, 0x12);
        assert_eq!((s.cdw12, s.cdw13), (0x40, 1));
        assert_eq!(s.log_page_dwords(), 0x12_3457);
        assert_eq!(s.log_page_offset(), 0x1_0000_0040);
        assert_eq!(GetLogPage::new(1, u32::MAX).build().log_page_dwords(), u32::MAX as u64);
        assert_eq!(GetLogPage::new(1, 0).build().log_page_dwords(), 1);
    }

    #[test]
    fn misc_admin() {
        let a = Abort::new(3, 0x55).build();
        assert_eq!((a.opcode(), a.cdw10), (0x08, 0x0055_0003));
        assert_eq!(AsyncEventRequest::new().build(), Sqe::new(0x0C, 0));
    }
}
