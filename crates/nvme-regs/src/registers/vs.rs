//! VS, Version (NVMe Base 2.0, 3.1.4.2).

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
