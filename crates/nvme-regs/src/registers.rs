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

/// CAP, Controller Capabilities (offset 00h, 64-bit, read-only), NVMe Base
/// 2.0, 3.1.4.1.
///
/// Read as two 32-bit halves, low first, and reassembled with
/// [`Cap::from_halves`]. An all-ones value means the device is gone
/// ([`Cap::is_all_ones`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
#[must_use]
pub struct Cap(pub u64);

impl Cap {
    /// Reassembles CAP from its low (offset 00h) and high (offset 04h)
    /// 32-bit halves.
    pub const fn from_halves(lo: u32, hi: u32) -> Cap {
        Cap((hi as u64) << 32 | lo as u64)
    }

    /// Low 32 bits (the dword at offset 00h).
    pub const fn lo(self) -> u32 {
        self.0 as u32
    }

    /// High 32 bits (the dword at offset 04h).
    pub const fn hi(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// True when the register read as all ones: the device did not answer
    /// (surprise removal, or a dead PCIe link).
    pub const fn is_all_ones(self) -> bool {
        self.0 == u64::MAX
    }

    /// MQES, Maximum Queue Entries Supported, bits 15:0, **zero-based**:
    /// the largest I/O queue the controller supports has `mqes_z + 1`
    /// entries. The spec requires at least 1 (2 entries).
    pub const fn mqes_z(self) -> u16 {
        bits64(self.0, 0, 16) as u16
    }

    /// Maximum number of entries of one I/O queue, 1-based (MQES + 1), in
    /// 1..=65536.
    pub const fn max_queue_entries(self) -> u32 {
        self.mqes_z() as u32 + 1
    }

    /// CQR, Contiguous Queues Required, bit 16: I/O queues must be
    /// physically contiguous (PC = 1 in Create I/O SQ/CQ).
    pub const fn cqr(self) -> bool {
        bits64(self.0, 16, 1) != 0
    }

    /// AMS, Arbitration Mechanism Supported, bits 18:17 (bit 17 weighted
    /// round robin with urgent, bit 18 vendor specific; round robin is
    /// always supported).
    pub const fn ams(self) -> u8 {
        bits64(self.0, 17, 2) as u8
    }

    /// TO, Timeout, bits 31:24, raw, in **500 ms units**: the worst-case
    /// time to wait for CSTS.RDY to change after CC.EN changes.
    pub const fn to_500ms(self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }

    /// TO converted to milliseconds (`TO * 500`).
    pub const fn timeout_ms(self) -> u64 {
        self.to_500ms() as u64 * 500
    }

    /// DSTRD, Doorbell Stride, bits 35:32, raw: the stride between
    /// doorbells is `4 << DSTRD` bytes.
    pub const fn dstrd(self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }

    /// Doorbell stride in bytes (`4 << DSTRD`).
    pub const fn doorbell_stride_bytes(self) -> usize {
        4usize << self.dstrd()
    }

    /// NSSRS, NVM Subsystem Reset Supported, bit 36.
    pub const fn nssrs(self) -> bool {
        bits64(self.0, 36, 1) != 0
    }

    /// CSS, Command Sets Supported, bits 44:37, raw (bit 0 of this value =
    /// CAP bit 37 = NVM command set; bit 6 = CAP bit 43 = I/O command sets;
    /// bit 7 = CAP bit 44 = no I/O command set / admin only).
    pub const fn css(self) -> u8 {
        bits64(self.0, 37, 8) as u8
    }

    /// CSS bit 37: the NVM command set is supported.
    pub const fn css_nvm(self) -> bool {
        bits64(self.0, 37, 1) != 0
    }

    /// BPS, Boot Partition Support, bit 45.
    pub const fn bps(self) -> bool {
        bits64(self.0, 45, 1) != 0
    }

    /// MPSMIN, Memory Page Size Minimum, bits 51:48, raw: the smallest
    /// page size is `2^(12 + MPSMIN)` bytes.
    pub const fn mpsmin(self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }

    /// MPSMAX, Memory Page Size Maximum, bits 55:52, raw: the largest page
    /// size is `2^(12 + MPSMAX)` bytes.
    pub const fn mpsmax(self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }

    /// Smallest memory page size in bytes, `1 << (12 + MPSMIN)` (4 KiB to
    /// 128 MiB). Also the unit of Identify Controller MDTS.
    pub const fn min_page_size(self) -> usize {
        1usize << (12 + self.mpsmin() as u32)
    }

    /// Largest memory page size in bytes, `1 << (12 + MPSMAX)`.
    pub const fn max_page_size(self) -> usize {
        1usize << (12 + self.mpsmax() as u32)
    }

    /// PMRS, Persistent Memory Region Supported, bit 56.
    pub const fn pmrs(self) -> bool {
        bits64(self.0, 56, 1) != 0
    }

    /// CMBS, Controller Memory Buffer Supported, bit 57.
    pub const fn cmbs(self) -> bool {
        bits64(self.0, 57, 1) != 0
    }

    /// Sets MQES (bits 15:0) to the **zero-based** value `mqes_z`.
    pub const fn with_mqes_z(self, mqes_z: u16) -> Cap {
        Cap(set_bits64(self.0, 0, 16, mqes_z as u64))
    }

    /// Sets CQR (bit 16).
    pub const fn with_cqr(self, cqr: bool) -> Cap {
        Cap(set_bits64(self.0, 16, 1, cqr as u64))
    }

    /// Sets AMS (bits 18:17), masked to 2 bits.
    pub const fn with_ams(self, ams: u8) -> Cap {
        Cap(set_bits64(self.0, 17, 2, ams as u64))
    }

    /// Sets TO (bits 31:24), in 500 ms units.
    pub const fn with_to_500ms(self, to: u8) -> Cap {
        Cap(set_bits64(self.0, 24, 8, to as u64))
    }

    /// Sets DSTRD (bits 35:32), masked to 4 bits.
    pub const fn with_dstrd(self, dstrd: u8) -> Cap {
        Cap(set_bits64(self.0, 32, 4, dstrd as u64))
    }

    /// Sets NSSRS (bit 36).
    pub const fn with_nssrs(self, nssrs: bool) -> Cap {
        Cap(set_bits64(self.0, 36, 1, nssrs as u64))
    }

    /// Sets CSS (bits 44:37) to the raw 8-bit value `css`.
    pub const fn with_css(self, css: u8) -> Cap {
        Cap(set_bits64(self.0, 37, 8, css as u64))
    }

    /// Sets CSS bit 37 (NVM command set supported).
    pub const fn with_css_nvm(self, nvm: bool) -> Cap {
        Cap(set_bits64(self.0, 37, 1, nvm as u64))
    }

    /// Sets MPSMIN (bits 51:48), masked to 4 bits.
    pub const fn with_mpsmin(self, mpsmin: u8) -> Cap {
        Cap(set_bits64(self.0, 48, 4, mpsmin as u64))
    }

    /// Sets MPSMAX (bits 55:52), masked to 4 bits.
    pub const fn with_mpsmax(self, mpsmax: u8) -> Cap {
        Cap(set_bits64(self.0, 52, 4, mpsmax as u64))
    }
}

/// VS, Version (offset 08h), NVMe Base 2.0, 3.1.4.2: MJR 31:16, MNR 15:8,
/// TER 7:0.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash, PartialOrd, Ord)]
#[must_use]
pub struct Vs(pub u32);

impl Vs {
    /// NVMe 1.4.0 (`0001_0400h`).
    pub const V1_4: Vs = Vs(0x0001_0400);
    /// NVMe 2.0.0 (`0002_0000h`).
    pub const V2_0: Vs = Vs(0x0002_0000);

    /// Builds a version value from major, minor and tertiary numbers.
    pub const fn new(mjr: u16, mnr: u8, ter: u8) -> Vs {
        Vs((mjr as u32) << 16 | (mnr as u32) << 8 | ter as u32)
    }

    /// MJR, major version, bits 31:16.
    pub const fn mjr(self) -> u16 {
        (self.0 >> 16) as u16
    }

    /// MNR, minor version, bits 15:8.
    pub const fn mnr(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// TER, tertiary version, bits 7:0.
    pub const fn ter(self) -> u8 {
        self.0 as u8
    }
}

/// CC.SHN, Shutdown Notification, bits 15:14 of CC (NVMe Base 2.0,
/// 3.1.4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ShutdownNotification {
    /// 00b: no notification, no effect.
    None = 0,
    /// 01b: normal shutdown notification.
    Normal = 1,
    /// 10b: abrupt shutdown notification.
    Abrupt = 2,
    /// 11b: reserved.
    Reserved = 3,
}

impl ShutdownNotification {
    /// Decodes the 2-bit field (higher bits ignored).
    pub const fn from_bits(bits: u8) -> ShutdownNotification {
        match bits & 3 {
            0 => ShutdownNotification::None,
            1 => ShutdownNotification::Normal,
            2 => ShutdownNotification::Abrupt,
            _ => ShutdownNotification::Reserved,
        }
    }
}

/// CC, Controller Configuration (offset 14h), NVMe Base 2.0, 3.1.4.5.
///
/// Enabling a controller for the NVM command set with 64-byte SQEs and
/// 16-byte CQEs: `Cc(0).with_iosqes(6).with_iocqes(4).with_mps(..).with_en(true)`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
#[must_use]
pub struct Cc(pub u32);

impl Cc {
    /// CC.CSS value 000b: NVM command set.
    pub const CSS_NVM: u8 = 0b000;
    /// CC.CSS value 110b: all supported I/O command sets.
    pub const CSS_ALL_IO: u8 = 0b110;
    /// CC.CSS value 111b: admin command set only.
    pub const CSS_ADMIN_ONLY: u8 = 0b111;

    /// EN, Enable, bit 0.
    pub const fn en(self) -> bool {
        bits32(self.0, 0, 1) != 0
    }

    /// CSS, I/O Command Set Selected, bits 6:4 (see [`Cc::CSS_NVM`]).
    pub const fn css(self) -> u8 {
        bits32(self.0, 4, 3) as u8
    }

    /// MPS, Memory Page Size, bits 10:7, raw: page size is
    /// `2^(12 + MPS)` bytes.
    pub const fn mps(self) -> u8 {
        bits32(self.0, 7, 4) as u8
    }

    /// Host memory page size in bytes, `1 << (12 + MPS)`: the unit of PRP
    /// entries.
    pub const fn page_size(self) -> usize {
        1usize << (12 + self.mps() as u32)
    }

    /// AMS, Arbitration Mechanism Selected, bits 13:11 (000b round robin).
    pub const fn ams(self) -> u8 {
        bits32(self.0, 11, 3) as u8
    }

    /// SHN, Shutdown Notification, bits 15:14.
    pub const fn shn(self) -> ShutdownNotification {
        ShutdownNotification::from_bits(bits32(self.0, 14, 2) as u8)
    }

    /// IOSQES, I/O Submission Queue Entry Size, bits 19:16, as log2 of the
    /// entry size in bytes (6 = 64 bytes).
    pub const fn iosqes(self) -> u8 {
        bits32(self.0, 16, 4) as u8
    }

    /// IOCQES, I/O Completion Queue Entry Size, bits 23:20, as log2 of the
    /// entry size in bytes (4 = 16 bytes).
    pub const fn iocqes(self) -> u8 {
        bits32(self.0, 20, 4) as u8
    }

    /// Sets EN (bit 0).
    pub const fn with_en(self, en: bool) -> Cc {
        Cc(set_bits32(self.0, 0, 1, en as u32))
    }

    /// Sets CSS (bits 6:4), masked to 3 bits.
    pub const fn with_css(self, css: u8) -> Cc {
        Cc(set_bits32(self.0, 4, 3, css as u32))
    }

    /// Sets MPS (bits 10:7), masked to 4 bits (page size `2^(12 + mps)`).
    pub const fn with_mps(self, mps: u8) -> Cc {
        Cc(set_bits32(self.0, 7, 4, mps as u32))
    }

    /// Sets AMS (bits 13:11), masked to 3 bits.
    pub const fn with_ams(self, ams: u8) -> Cc {
        Cc(set_bits32(self.0, 11, 3, ams as u32))
    }

    /// Sets SHN (bits 15:14).
    pub const fn with_shn(self, shn: ShutdownNotification) -> Cc {
        Cc(set_bits32(self.0, 14, 2, shn as u32))
    }

    /// Sets IOSQES (bits 19:16, log2 of bytes), masked to 4 bits.
    pub const fn with_iosqes(self, iosqes: u8) -> Cc {
        Cc(set_bits32(self.0, 16, 4, iosqes as u32))
    }

    /// Sets IOCQES (bits 23:20, log2 of bytes), masked to 4 bits.
    pub const fn with_iocqes(self, iocqes: u8) -> Cc {
        Cc(set_bits32(self.0, 20, 4, iocqes as u32))
    }
}

/// CSTS.SHST, Shutdown Status, bits 3:2 of CSTS (NVMe Base 2.0, 3.1.4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ShutdownStatus {
    /// 00b: normal operation, no shutdown requested.
    Normal = 0,
    /// 01b: shutdown processing occurring.
    Occurring = 1,
    /// 10b: shutdown processing complete.
    Complete = 2,
    /// 11b: reserved.
    Reserved = 3,
}

impl ShutdownStatus {
    /// Decodes the 2-bit field (higher bits ignored).
    pub const fn from_bits(bits: u8) -> ShutdownStatus {
        match bits & 3 {
            0 => ShutdownStatus::Normal,
            1 => ShutdownStatus::Occurring,
            2 => ShutdownStatus::Complete,
            _ => ShutdownStatus::Reserved,
        }
    }
}

/// CSTS, Controller Status (offset 1Ch), NVMe Base 2.0, 3.1.4.6.
///
/// An all-ones read means the device is gone ([`Csts::is_all_ones`]); check
/// that before trusting any field.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
#[must_use]
pub struct Csts(pub u32);

impl Csts {
    /// True when the register read as `FFFF_FFFFh`: the device did not
    /// answer (surprise removal, dead link).
    pub const fn is_all_ones(self) -> bool {
        self.0 == u32::MAX
    }

    /// RDY, Ready, bit 0.
    pub const fn rdy(self) -> bool {
        bits32(self.0, 0, 1) != 0
    }

    /// CFS, Controller Fatal Status, bit 1.
    pub const fn cfs(self) -> bool {
        bits32(self.0, 1, 1) != 0
    }

    /// SHST, Shutdown Status, bits 3:2.
    pub const fn shst(self) -> ShutdownStatus {
        ShutdownStatus::from_bits(bits32(self.0, 2, 2) as u8)
    }

    /// NSSRO, NVM Subsystem Reset Occurred, bit 4.
    pub const fn nssro(self) -> bool {
        bits32(self.0, 4, 1) != 0
    }

    /// PP, Processing Paused, bit 5.
    pub const fn pp(self) -> bool {
        bits32(self.0, 5, 1) != 0
    }

    /// Sets RDY (bit 0).
    pub const fn with_rdy(self, rdy: bool) -> Csts {
        Csts(set_bits32(self.0, 0, 1, rdy as u32))
    }

    /// Sets CFS (bit 1).
    pub const fn with_cfs(self, cfs: bool) -> Csts {
        Csts(set_bits32(self.0, 1, 1, cfs as u32))
    }

    /// Sets SHST (bits 3:2).
    pub const fn with_shst(self, shst: ShutdownStatus) -> Csts {
        Csts(set_bits32(self.0, 2, 2, shst as u32))
    }
}

/// AQA, Admin Queue Attributes (offset 24h), NVMe Base 2.0, 3.1.4.8: ASQS
/// bits 11:0 and ACQS bits 27:16, both **zero-based** entry counts (the
/// spec requires at least 1, i.e. 2 entries; at most 4096 entries).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
#[must_use]
pub struct Aqa(pub u32);

impl Aqa {
    /// Builds AQA from zero-based sizes, each masked to 12 bits.
    pub const fn new(asqs_z: u16, acqs_z: u16) -> Aqa {
        Aqa((asqs_z as u32 & 0xFFF) | (acqs_z as u32 & 0xFFF) << 16)
    }

    /// ASQS, Admin Submission Queue Size, bits 11:0, zero-based.
    pub const fn asqs_z(self) -> u16 {
        bits32(self.0, 0, 12) as u16
    }

    /// ACQS, Admin Completion Queue Size, bits 27:16, zero-based.
    pub const fn acqs_z(self) -> u16 {
        bits32(self.0, 16, 12) as u16
    }

    /// Admin submission queue entries, 1-based (ASQS + 1).
    pub const fn asq_entries(self) -> u32 {
        self.asqs_z() as u32 + 1
    }

    /// Admin completion queue entries, 1-based (ACQS + 1).
    pub const fn acq_entries(self) -> u32 {
        self.acqs_z() as u32 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbells() {
        assert_eq!(sq_tail_doorbell(0, 2), 0x1000);
        assert_eq!(cq_head_doorbell(0, 2), 0x1010);
        assert_eq!(sq_tail_doorbell(3, 2), 0x1060);
        assert_eq!(cq_head_doorbell(3, 2), 0x1070);
        assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
        assert_eq!(cq_head_doorbell(1, 0), 0x100C);
        assert_eq!(doorbell_offset(1, true, 0), 0x100C);
        // Largest values do not overflow or panic.
        assert_eq!(doorbell_offset(u16::MAX, true, 0xFF), 0x1000 + (2 * 65535 + 1) * (4 << 15));
    }

    #[test]
    fn cap_fields() {
        let cap = Cap(0)
            .with_mqes_z(0x3FF)
            .with_dstrd(2)
            .with_to_500ms(0x14)
            .with_mpsmin(0)
            .with_mpsmax(4)
            .with_css_nvm(true)
            .with_cqr(true);
        assert_eq!(cap.mqes_z(), 0x3FF);
        assert_eq!(cap.max_queue_entries(), 1024);
        assert!(cap.cqr());
        assert_eq!(cap.ams(), 0);
        assert_eq!(cap.to_500ms(), 0x14);
        assert_eq!(cap.timeout_ms(), 10_000);
        assert_eq!(cap.dstrd(), 2);
        assert_eq!(cap.doorbell_stride_bytes(), 16);
        assert!(!cap.nssrs());
        assert_eq!(cap.css(), 1);
        assert!(cap.css_nvm());
        assert!(!cap.bps());
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.mpsmax(), 4);
        assert_eq!(cap.min_page_size(), 4096);
        assert_eq!(cap.max_page_size(), 65536);
        assert!(!cap.pmrs());
        assert!(!cap.cmbs());
        assert_eq!(cap.0, 0x0040_0022_1401_03FF);
        assert_eq!(Cap::from_halves(cap.lo(), cap.hi()), cap);
        assert_eq!(cap.lo(), 0x1401_03FF);
        assert_eq!(cap.hi(), 0x0040_0022);
        assert!(!cap.is_all_ones());
        assert!(Cap(u64::MAX).is_all_ones());
        // Masking.
        assert_eq!(Cap(0).with_dstrd(0xFF).dstrd(), 0xF);
        assert_eq!(Cap(u64::MAX).with_dstrd(0).0, !(0xFu64 << 32));
        assert_eq!(Cap(u64::MAX).max_page_size(), 1 << 27);
    }

    #[test]
    fn vs() {
        assert_eq!(Vs::V1_4.mjr(), 1);
        assert_eq!(Vs::V1_4.mnr(), 4);
        assert_eq!(Vs::V1_4.ter(), 0);
        assert_eq!(Vs::V2_0.mjr(), 2);
        assert_eq!(Vs::new(2, 0, 0), Vs::V2_0);
        assert!(Vs::V1_4 < Vs::V2_0);
    }

    #[test]
    fn cc_builder() {
        let cc = Cc(0).with_en(true).with_iosqes(6).with_iocqes(4).with_mps(0).with_css(Cc::CSS_NVM);
        assert_eq!(cc.0, 0x0046_0001);
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        assert_eq!(cc.page_size(), 4096);
        assert_eq!(cc.shn(), ShutdownNotification::None);
        let cc = cc.with_shn(ShutdownNotification::Normal).with_mps(1).with_ams(0b001);
        assert_eq!(cc.shn(), ShutdownNotification::Normal);
        assert_eq!((cc.0 >> 14) & 3, 1);
        assert_eq!(cc.mps(), 1);
        assert_eq!(cc.page_size(), 8192);
        assert_eq!(cc.ams(), 1);
        assert_eq!(cc.with_en(false).0 & 1, 0);
        assert_eq!(Cc(0).with_shn(ShutdownNotification::Abrupt).0, 0x8000);
        assert_eq!(Cc(0).with_css(Cc::CSS_ADMIN_ONLY).css(), 7);
    }

    #[test]
    fn csts() {
        let c = Csts(0).with_rdy(true).with_shst(ShutdownStatus::Complete);
        assert!(c.rdy());
        assert!(!c.cfs());
        assert_eq!(c.shst(), ShutdownStatus::Complete);
        assert_eq!(c.0, 0b1001);
        assert!(Csts(0).with_cfs(true).cfs());
        assert!(Csts(0x10).nssro());
        assert!(Csts(0x20).pp());
        assert!(Csts(u32::MAX).is_all_ones());
        assert_eq!(Csts(0b0100).shst(), ShutdownStatus::Occurring);
        assert_eq!(Csts(0b1100).shst(), ShutdownStatus::Reserved);
    }

    #[test]
    fn aqa() {
        let a = Aqa::new(31, 63);
        assert_eq!(a.0, 0x003F_001F);
        assert_eq!(a.asqs_z(), 31);
        assert_eq!(a.acqs_z(), 63);
        assert_eq!(a.asq_entries(), 32);
        assert_eq!(a.acq_entries(), 64);
        assert_eq!(Aqa::new(0xFFFF, 0xFFFF).0, 0x0FFF_0FFF);
    }
}
