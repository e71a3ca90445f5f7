//! Feature identifiers and feature values (NVMe Base 2.0, 5.27.1 "Feature
//! Specific Information", table "Feature Identifiers"; Base 1.4,
//! 5.21.1).
//!
//! The Set Features / Get Features command builders are
//! [`crate::opcode::SetFeatures`] and [`crate::opcode::GetFeatures`].

/// Feature identifiers, FID (CDW10 bits 7:0 of Set/Get Features; NVMe Base
/// 2.0, 5.27.1).
pub mod feature_id {
    /// 01h: Arbitration (Base 2.0 5.27.1).
    pub const ARBITRATION: u8 = 0x01;
    /// 02h: Power Management (Base 2.0 5.27.1).
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// 04h: Temperature Threshold (Base 2.0 5.27.1).
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// 06h: Volatile Write Cache (Base 2.0 5.27.1); CDW11 bit 0 WCE.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// 07h: Number of Queues (Base 2.0 5.27.1); see [`super::NumberOfQueues`].
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
}

/// SEL values of Get Features (CDW10 bits 10:8; NVMe Base 2.0, 5.15,
/// table "Select").
pub mod select {
    /// 000b: current value.
    pub const CURRENT: u8 = 0b000;
    /// 001b: default value.
    pub const DEFAULT: u8 = 0b001;
    /// 010b: saved value.
    pub const SAVED: u8 = 0b010;
    /// 011b: supported capabilities.
    pub const SUPPORTED_CAPABILITIES: u8 = 0b011;
}

/// Number of Queues feature (FID 07h; NVMe Base 2.0, 5.27.1, "Number of Queues"), as granted
/// by the controller in completion DW0 (NSQA bits 15:0, NCQA bits 31:16,
/// both zero-based on the wire).
///
/// Counts here are **1-based** I/O queue counts (the admin queue pair is not
/// included), in 1..=65536.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NumberOfQueues {
    /// Number of I/O submission queues allocated (NSQA + 1).
    pub sq_count: u32,
    /// Number of I/O completion queues allocated (NCQA + 1).
    pub cq_count: u32,
}

impl NumberOfQueues {
    /// Decodes completion DW0 of Set/Get Features (Number of Queues).
    pub const fn from_dw0(dw0: u32) -> NumberOfQueues {
        NumberOfQueues { sq_count: (dw0 & 0xFFFF) + 1, cq_count: (dw0 >> 16) + 1 }
    }

    /// Encodes completion DW0 (what the emulator returns). Counts are
    /// clamped to 1..=65536 before the zero-based conversion, so the result
    /// is always a valid encoding.
    pub const fn to_dw0(self) -> u32 {
        const fn z(count: u32) -> u32 {
            let c = if count == 0 { 1 } else { count };
            let c = if c > 0x1_0000 { 0x1_0000 } else { c };
            c - 1
        }
        z(self.sq_count) | z(self.cq_count) << 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_of_queues() {
        let n = NumberOfQueues::from_dw0(0x0003_0007);
        assert_eq!(n, NumberOfQueues { sq_count: 8, cq_count: 4 });
        assert_eq!(n.to_dw0(), 0x0003_0007);
        let max = NumberOfQueues::from_dw0(u32::MAX);
        assert_eq!(max.sq_count, 65536);
        assert_eq!(max.to_dw0(), u32::MAX);
        let bad = NumberOfQueues { sq_count: 0, cq_count: 1 << 20 };
        assert_eq!(bad.to_dw0(), 0xFFFF_0000);
    }
}
