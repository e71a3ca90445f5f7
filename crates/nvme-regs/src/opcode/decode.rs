//! Decoders for the emulator, sharing the encoding rules of the builders
//! in [`super::admin`] and [`super::nvm`].

use super::nvm::{DEAC, FUA, LR};
use super::{admin_opcode, Nlb};
use crate::sqe::Sqe;

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
/// the same rules [`super::CreateIoSq`] and [`super::CreateIoCq`] encode them (NVMe Base
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
