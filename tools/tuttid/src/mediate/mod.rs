//! Mediated submission (docs/tuttid.md, "Mediated submission"): on a
//! mediated drive a client's SQEs go to a shadow SQ that the controller
//! never reads. The drive's forwarding thread checks each new entry and
//! copies it into the real SQ, which only the daemon writes; it copies the
//! controller's completions into the client's CQ, which only the daemon
//! writes too. A refused entry is never forwarded: the daemon completes it
//! in the client's CQ with the status of its [`Refusal`].
//!
//! One concept per file: [`sqe`] (opcode allow-list, NSID, LBA range,
//! transfer length), [`partition`] (a tenant's LBA range), [`prp`] (PRP1,
//! PRP2 and PRP lists inside the client's registrations, lists copied into
//! daemon memory), [`regions`] (a client's registrations as the forwarder
//! sees them), [`queue`] (one mediated queue pair: shadow SQ in, real SQ
//! out, real CQ in, client CQ out).

pub mod partition;
pub mod prp;
pub mod queue;
pub mod regions;
pub mod sqe;

use nvme_regs::status::generic;
use nvme_regs::Status;

pub use partition::Partition;
pub use queue::{MediatedQueue, QueueMemory};
pub use regions::Regions;
pub use sqe::Tenant;

/// Why a client's SQE was not forwarded. Each maps to the status the
/// daemon completes the entry with ([`Refusal::status`], always DNR: the
/// same command is refused again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not Read (02h), Write (01h), Flush (00h) or Write Zeroes (08h):
    /// Invalid Command Opcode (SCT 0h, SC 01h). Admin opcodes in an I/O SQ
    /// land here (an I/O SQ's opcodes are NVM command set opcodes).
    #[error("opcode {opcode:#04x} is not on the I/O allow-list")]
    Opcode {
        /// OPC of CDW0.
        opcode: u8,
    },
    /// A fused command, SGLs (PSDT != 00b) or a metadata pointer (MPTR):
    /// Invalid Field in Command (SCT 0h, SC 02h).
    #[error("FUSE {fuse}, PSDT {psdt}, MPTR {mptr:#x}: only plain PRP commands without metadata")]
    Shape {
        /// FUSE of CDW0.
        fuse: u8,
        /// PSDT of CDW0.
        psdt: u8,
        /// MPTR.
        mptr: u64,
    },
    /// A bit the daemon does not forward: in CDW12 anything but NLB, FUA,
    /// LR (and DEAC for Write Zeroes), any bit of CDW2, CDW3 or
    /// CDW13..15, and for Flush any bit past NSID. Reserved and
    /// command-specific fields are allow-listed like opcodes: a field the
    /// daemon does not read may reach past the partition (Write Zeroes'
    /// Namespace Zeroes, NVM Command Set 1.1) or pick someone else's key
    /// (Key Per I/O). Invalid Field in Command.
    #[error("CDW{dword} bits {bits:#010x} are not forwarded")]
    Reserved {
        /// The command dword (2, 3, 10..15).
        dword: u8,
        /// The bits set that may not be.
        bits: u32,
    },
    /// Not the tenant's namespace: Invalid Namespace or Format (SCT 0h,
    /// SC 0Bh).
    #[error("NSID {nsid}: the tenant's namespace is {expected}")]
    Nsid {
        /// NSID of the entry.
        nsid: u32,
        /// The drive's served namespace.
        expected: u32,
    },
    /// SLBA + NLB past the tenant's partition (it sees LBAs `0 .. len`):
    /// LBA Out of Range (SCT 0h, SC 80h).
    #[error("LBAs {slba}..{slba}+{blocks} outside the tenant's {len} blocks")]
    Lba {
        /// SLBA as the tenant wrote it.
        slba: u64,
        /// NLB + 1.
        blocks: u64,
        /// The partition's length in blocks.
        len: u64,
    },
    /// More bytes than the drive's mediated maximum transfer: Invalid
    /// Field in Command.
    #[error("transfer of {bytes} bytes is more than {max}")]
    TooLong {
        /// Bytes the entry moves.
        bytes: u64,
        /// The maximum.
        max: u64,
    },
    /// A PRP entry with an offset the PRP rules forbid (PRP1 not dword
    /// aligned, PRP2 or a list entry not page aligned, a list pointer not
    /// qword aligned): PRP Offset Invalid (SCT 0h, SC 13h).
    #[error("{which} {addr:#x} has an invalid offset")]
    PrpOffset {
        /// "PRP1", "PRP2", "PRP list entry", "PRP list pointer".
        which: &'static str,
        /// The entry.
        addr: u64,
    },
    /// A data buffer or PRP list page outside the client's own
    /// registrations (another client's memory, the daemon's, nothing):
    /// Invalid Field in Command. The same status for all three, so a
    /// client learns nothing about others' mappings.
    #[error("{which} {addr:#x} (+{len} bytes) is outside the client's registrations")]
    NotOwned {
        /// "PRP1", "PRP2", "PRP list entry", "PRP list page".
        which: &'static str,
        /// The address.
        addr: u64,
        /// Bytes it must cover.
        len: u64,
    },
}

impl Refusal {
    /// The status the daemon completes a refused entry with (DNR set).
    pub fn status(&self) -> Status {
        let sc = match self {
            Refusal::Opcode { .. } => generic::INVALID_OPCODE,
            Refusal::Shape { .. }
            | Refusal::Reserved { .. }
            | Refusal::TooLong { .. }
            | Refusal::NotOwned { .. } => generic::INVALID_FIELD,
            Refusal::Nsid { .. } => generic::INVALID_NAMESPACE_OR_FORMAT,
            Refusal::Lba { .. } => generic::LBA_OUT_OF_RANGE,
            Refusal::PrpOffset { .. } => generic::PRP_OFFSET_INVALID,
        };
        Status::generic(sc).with_dnr(true)
    }
}

/// A client broke a queue rule the daemon cannot answer with a
/// completion: its lease ends (as for a bad forwarded doorbell).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// The shadow SQ tail is not an entry index.
    #[error("SQ tail {value} is not an entry index of {entries}")]
    SqTail {
        /// The value written.
        value: u32,
        /// Entries of the queue.
        entries: u32,
    },
    /// The client CQ head is not an index, or passes completions the
    /// daemon has not posted.
    #[error("CQ head {value} passes completions not posted (head {head}, tail {tail})")]
    CqHead {
        /// The value written.
        value: u32,
        /// The head before.
        head: u32,
        /// The daemon's tail of the client CQ.
        tail: u32,
    },
}
