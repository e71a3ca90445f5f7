//! CC, Controller Configuration, and its shutdown notification field
//! (NVMe Base 2.0, 3.1.4.5).

use super::{bits32, set_bits32};

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
