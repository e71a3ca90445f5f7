//! CAP, Controller Capabilities (NVMe Base 2.0, 3.1.4.1).

use super::{bits64, set_bits64};

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
