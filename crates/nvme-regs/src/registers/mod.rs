//! Controller registers in BAR0 (NVMe Base 2.0, 3.1.4 "Controller
//! Properties"; Base 1.4, 3.1 "Register Definition").
//!
//! Register values are newtypes over the raw integer with accessors named
//! after the spec mnemonics. Zero-based fields end in `_z`. Builders
//! (`with_*`, `const fn`) exist for the fields the emulator and the driver
//! set; they mask their argument to the field width.
//!
//! This module performs no MMIO: the driver reads and writes these values
//! through its own register window, as aligned 32-bit accesses. The 64-bit
//! registers (CAP, ASQ, ACQ) are accessed as two 32-bit halves, low half
//! (lower address) first; see [`Cap::from_halves`].

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Byte offsets of the controller registers from the start of BAR0
/// (NVMe Base 2.0, 3.1.4; Base 1.4, 3.1).
pub mod offset {
    /// CAP, Controller Capabilities (64-bit, read-only). Base 2.0 3.1.4.1.
    pub const CAP: usize = 0x00;
    /// VS, Version (32-bit). Base 2.0 3.1.4.2.
    pub const VS: usize = 0x08;
    /// INTMS, Interrupt Mask Set (32-bit). Base 2.0 3.1.4.3.
    pub const INTMS: usize = 0x0C;
    /// INTMC, Interrupt Mask Clear (32-bit). Base 2.0 3.1.4.4.
    pub const INTMC: usize = 0x10;
    /// CC, Controller Configuration (32-bit). Base 2.0 3.1.4.5.
    pub const CC: usize = 0x14;
    /// CSTS, Controller Status (32-bit). Base 2.0 3.1.4.6.
    pub const CSTS: usize = 0x1C;
    /// NSSR, NVM Subsystem Reset (32-bit, optional). Base 2.0 3.1.4.7.
    pub const NSSR: usize = 0x20;
    /// AQA, Admin Queue Attributes (32-bit). Base 2.0 3.1.4.8.
    pub const AQA: usize = 0x24;
    /// ASQ, Admin Submission Queue Base Address (64-bit). Base 2.0 3.1.4.9.
    pub const ASQ: usize = 0x28;
    /// ACQ, Admin Completion Queue Base Address (64-bit). Base 2.0 3.1.4.10.
    pub const ACQ: usize = 0x30;
    /// CMBLOC, Controller Memory Buffer Location (32-bit, optional). Base 2.0 3.1.4.11.
    pub const CMBLOC: usize = 0x38;
    /// CMBSZ, Controller Memory Buffer Size (32-bit, optional). Base 2.0 3.1.4.12.
    pub const CMBSZ: usize = 0x3C;
    /// Offset of the first doorbell (SQ0TDBL). PCIe transport only
    /// (NVMe over PCIe Transport 1.0; Base 1.4 3.1.24). See [`super::doorbell_offset`].
    pub const DOORBELL_BASE: usize = 0x1000;
}

/// Value to write to NSSR to start an NVM Subsystem Reset: `"NVMe"` as
/// ASCII, `4E564D65h` (NVMe Base 2.0, 3.1.4.7).
pub const NSSR_RESET_VALUE: u32 = 0x4E56_4D65;

/// The first 64 bytes of BAR0, laid out at the offsets of [`offset`]
/// (NVMe Base 2.0, 3.1.4).
///
/// This is a description of the layout (and the backing store the emulator
/// may use for its register page); a driver must not read or write it as a
/// plain Rust structure. Registers are accessed individually as aligned
/// 32-bit loads and stores, and the 64-bit registers (CAP, ASQ, ACQ) as two
/// 32-bit halves, low half first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ControllerRegisters {
    /// CAP, Controller Capabilities, at 00h. See [`Cap`].
    pub cap: u64,
    /// VS, Version, at 08h. See [`Vs`].
    pub vs: u32,
    /// INTMS, Interrupt Mask Set, at 0Ch (one bit per interrupt vector).
    pub intms: u32,
    /// INTMC, Interrupt Mask Clear, at 10h (one bit per interrupt vector).
    pub intmc: u32,
    /// CC, Controller Configuration, at 14h. See [`Cc`].
    pub cc: u32,
    /// Reserved, at 18h.
    pub rsvd: u32,
    /// CSTS, Controller Status, at 1Ch. See [`Csts`].
    pub csts: u32,
    /// NSSR, NVM Subsystem Reset, at 20h. See [`NSSR_RESET_VALUE`].
    pub nssr: u32,
    /// AQA, Admin Queue Attributes, at 24h. See [`Aqa`].
    pub aqa: u32,
    /// ASQ, Admin Submission Queue base (bus address, page aligned), at 28h.
    pub asq: u64,
    /// ACQ, Admin Completion Queue base (bus address, page aligned), at 30h.
    pub acq: u64,
    /// CMBLOC, Controller Memory Buffer Location, at 38h.
    pub cmbloc: u32,
    /// CMBSZ, Controller Memory Buffer Size, at 3Ch.
    pub cmbsz: u32,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<ControllerRegisters>() == 0x40);
    assert!(offset_of!(ControllerRegisters, cap) == offset::CAP);
    assert!(offset_of!(ControllerRegisters, vs) == offset::VS);
    assert!(offset_of!(ControllerRegisters, intms) == offset::INTMS);
    assert!(offset_of!(ControllerRegisters, intmc) == offset::INTMC);
    assert!(offset_of!(ControllerRegisters, cc) == offset::CC);
    assert!(offset_of!(ControllerRegisters, rsvd) == 0x18);
    assert!(offset_of!(ControllerRegisters, csts) == offset::CSTS);
    assert!(offset_of!(ControllerRegisters, nssr) == offset::NSSR);
    assert!(offset_of!(ControllerRegisters, aqa) == offset::AQA);
    assert!(offset_of!(ControllerRegisters, asq) == offset::ASQ);
    assert!(offset_of!(ControllerRegisters, acq) == offset::ACQ);
    assert!(offset_of!(ControllerRegisters, cmbloc) == offset::CMBLOC);
    assert!(offset_of!(ControllerRegisters, cmbsz) == offset::CMBSZ);
};

/// Byte offset from the start of BAR0 of a queue's doorbell (NVMe Base 2.0,
/// SQyTDBL / CQyHDBL, PCIe transport (NVMe over PCIe Transport 1.0;
/// Base 1.4 3.1.24 / 3.1.25):
/// `1000h + (2 * qid + is_cq) * (4 << CAP.DSTRD)`.
///
/// `qid` is the queue identifier (0 = admin); `dstrd` is the raw CAP.DSTRD
/// value (stride = `4 << dstrd` bytes) and is masked to its 4 bits. Computed
/// in `usize`; the largest result (QID 65535, DSTRD 15) is about 16 GiB,
/// which fits on 64-bit targets (the arithmetic saturates elsewhere instead
/// of panicking).
pub const fn doorbell_offset(qid: u16, is_cq: bool, dstrd: u8) -> usize {
    let stride = 4usize << (dstrd & 0xF);
    let index = 2 * qid as usize + is_cq as usize;
    offset::DOORBELL_BASE.saturating_add(index.saturating_mul(stride))
}

/// Byte offset of SQyTDBL (Submission Queue y Tail Doorbell) in BAR0; see
/// [`doorbell_offset`]. Base 1.4 3.1.24.
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    doorbell_offset(qid, false, dstrd)
}

/// Byte offset of CQyHDBL (Completion Queue y Head Doorbell) in BAR0; see
/// [`doorbell_offset`]. Base 1.4 3.1.25.
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    doorbell_offset(qid, true, dstrd)
}

/// Extracts `width` bits of `v` starting at bit `lo`.
const fn bits64(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1u64 << width) - 1)
}

/// Returns `v` with `width` bits at `lo` replaced by `field` (masked).
const fn set_bits64(v: u64, lo: u32, width: u32, field: u64) -> u64 {
    let mask = ((1u64 << width) - 1) << lo;
    (v & !mask) | ((field << lo) & mask)
}

const fn bits32(v: u32, lo: u32, width: u32) -> u32 {
    (v >> lo) & ((1u32 << width) - 1)
}

const fn set_bits32(v: u32, lo: u32, width: u32, field: u32) -> u32 {
    let mask = ((1u32 << width) - 1) << lo;
    (v & !mask) | ((field << lo) & mask)
}

mod aqa;
mod cap;
mod cc;
mod csts;
mod vs;

pub use aqa::Aqa;
pub use cap::Cap;
pub use cc::{Cc, ShutdownNotification};
pub use csts::{Csts, ShutdownStatus};
pub use vs::Vs;

#[cfg(test)]
mod tests;
