//! CSTS, Controller Status, and its shutdown status field (NVMe Base 2.0,
//! 3.1.4.6).

use super::{bits32, set_bits32};

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
