//! Admin command builders (NVMe Base 2.0, 5): Identify, queue creation and
//! deletion, Abort, Asynchronous Event Request, Get Log Page, Set and Get
//! Features.

use super::admin_opcode;
use crate::features::feature_id;
use crate::sqe::{Sqe, NSID_ALL};

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

    /// Log page `lid` ([`log_id`](crate::log::log_id)), transferring `dwords` dwords
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
    /// back in completion DW0 ([`NumberOfQueues::from_dw0`](crate::features::NumberOfQueues::from_dw0)).
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
