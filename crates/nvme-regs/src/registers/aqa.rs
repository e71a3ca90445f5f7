//! AQA, Admin Queue Attributes (NVMe Base 2.0, 3.1.4.8).

use super::bits32;

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
