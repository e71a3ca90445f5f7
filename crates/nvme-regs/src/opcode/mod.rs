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
//!
//! [`Sqe::set_cid`]: crate::sqe::Sqe::set_cid
//! [`Sqe::set_prp`]: crate::sqe::Sqe::set_prp
//! [`Sqe::slba`]: crate::sqe::Sqe::slba
//! [`Sqe::nlb`]: crate::sqe::Sqe::nlb

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
mod admin;
mod decode;
mod nvm;

pub use admin::{
    Abort, AsyncEventRequest, Cns, CreateIoCq, CreateIoSq, DeleteIoCq, DeleteIoSq, GetFeatures, GetLogPage,
    Identify, SetFeatures,
};
pub use decode::CreateQueueFields;
pub use nvm::{DatasetManagement, DsmRange, Flush, Read, Write, WriteZeroes};

#[cfg(test)]
mod tests;
