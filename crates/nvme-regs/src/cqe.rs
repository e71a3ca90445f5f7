//! The 16-byte completion queue entry (NVMe Base 2.0, 4.2.1 "Common
//! Completion Queue Entry", PCIe layout; Base 1.4, 4.6).

use crate::status::Status;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A completion queue entry: 16 bytes, 4 dwords, little-endian (NVMe Base
/// 2.0, 4.2.1).
///
/// DW3 holds CID (bits 15:0), the phase tag P (bit 16) and the status field
/// (bits 31:17). The field [`Cqe::status`] is the whole upper half of DW3
/// *including* the phase tag in its bit 0; decode it with [`Cqe::status()`]
/// and [`Cqe::phase`].
///
/// A consumer must observe the phase tag (the dword at byte 12) with Acquire
/// ordering before reading the rest of the entry; a producer writes DW0..DW2
/// first and DW3 last with Release ordering. That is the queue's business;
/// this type is the layout only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Cqe {
    /// DW0 (bytes 3:0): command-specific result (e.g. Set Features Number of
    /// Queues granted counts).
    pub dw0: u32,
    /// DW1 (bytes 7:4): command specific (reserved in Base 1.4).
    pub dw1: u32,
    /// SQHD, SQ Head Pointer (DW2 bits 15:0): the SQ slot index the
    /// controller will fetch next, i.e. entries before it may be reused.
    pub sqhd: u16,
    /// SQID, SQ Identifier (DW2 bits 31:16): the queue the command came from.
    pub sqid: u16,
    /// CID, Command Identifier (DW3 bits 15:0), as submitted.
    pub cid: u16,
    /// DW3 bits 31:16: phase tag in bit 0, status field in bits 15:1.
    pub status: u16,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<Cqe>() == Cqe::SIZE);
    assert!(1 << Cqe::SIZE_LOG2 == Cqe::SIZE);
    assert!(offset_of!(Cqe, dw0) == 0);
    assert!(offset_of!(Cqe, dw1) == 4);
    assert!(offset_of!(Cqe, sqhd) == 8);
    assert!(offset_of!(Cqe, sqid) == 10);
    assert!(offset_of!(Cqe, cid) == 12);
    assert!(offset_of!(Cqe, status) == 14);
};

impl Cqe {
    /// Size of a CQE in bytes.
    pub const SIZE: usize = 16;
    /// log2 of [`Cqe::SIZE`]: the value for CC.IOCQES and the required
    /// value of Identify Controller CQES bits 3:0.
    pub const SIZE_LOG2: u8 = 4;

    /// Builds an entry (DW1 = 0) with the given status and phase tag.
    pub const fn new(dw0: u32, sqhd: u16, sqid: u16, cid: u16, status: Status, phase: bool) -> Cqe {
        Cqe { dw0, dw1: 0, sqhd, sqid, cid, status: status.to_field(phase) }
    }

    /// P, the phase tag: bit 16 of DW3 (bit 0 of [`Cqe::status`]). The
    /// controller inverts it on each pass through the queue; the first pass
    /// writes 1 into host-zeroed memory.
    pub const fn phase(&self) -> bool {
        self.status & 1 != 0
    }

    /// The decoded status field (DW3 bits 31:17).
    pub const fn status(&self) -> Status {
        Status::from_field(self.status)
    }

    /// DW3 as one dword: CID bits 15:0, P bit 16, status bits 31:17.
    pub const fn dw3(&self) -> u32 {
        self.cid as u32 | (self.status as u32) << 16
    }

    /// DW2 as one dword: SQHD bits 15:0, SQID bits 31:16.
    pub const fn dw2(&self) -> u32 {
        self.sqhd as u32 | (self.sqid as u32) << 16
    }

    /// Builds an entry from its four dwords, DW0 first.
    pub const fn from_dwords(d: [u32; 4]) -> Cqe {
        Cqe {
            dw0: d[0],
            dw1: d[1],
            sqhd: d[2] as u16,
            sqid: (d[2] >> 16) as u16,
            cid: d[3] as u16,
            status: (d[3] >> 16) as u16,
        }
    }

    /// The entry as four dwords, DW0 first.
    pub const fn to_dwords(&self) -> [u32; 4] {
        [self.dw0, self.dw1, self.dw2(), self.dw3()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{command_specific, generic};
    use proptest::prelude::*;
    use zerocopy::IntoBytes;

    #[test]
    fn new_and_decode() {
        let st = Status::command_specific(command_specific::INVALID_QUEUE_SIZE).with_dnr(true);
        let c = Cqe::new(0x1234, 5, 1, 0x42, st, true);
        assert!(c.phase());
        assert_eq!(c.status(), st);
        assert_eq!(c.cid, 0x42);
        assert_eq!(c.dw3() & 0xFFFF, 0x42);
        assert_eq!((c.dw3() >> 16) & 1, 1);
        assert_eq!((c.dw3() >> 17) & 0xFF, 0x02);
        assert_eq!((c.dw3() >> 25) & 7, 1);
        assert_eq!(c.dw3() >> 31, 1);
        let c = Cqe::new(0, 0, 0, 0, Status::generic(generic::SUCCESS), false);
        assert!(!c.phase());
        assert!(c.status().is_success());
        assert_eq!(c.dw3(), 0);
    }

    proptest! {
        #[test]
        fn dwords_round_trip(d in proptest::array::uniform4(any::<u32>())) {
            let c = Cqe::from_dwords(d);
            prop_assert_eq!(c.to_dwords(), d);
            let mut bytes = [0u8; 16];
            for (i, w) in d.iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
            }
            prop_assert_eq!(c.as_bytes(), &bytes[..]);
            prop_assert_eq!(c.phase(), d[3] & (1 << 16) != 0);
            let st = c.status();
            prop_assert_eq!(Cqe::new(c.dw0, c.sqhd, c.sqid, c.cid, st, c.phase()).dw3(), d[3]);
        }

        #[test]
        fn status_fields_round_trip(
            sct in 0u8..8, sc in any::<u8>(), crd in 0u8..4,
            more in any::<bool>(), dnr in any::<bool>(), phase in any::<bool>(),
            cid in any::<u16>(),
        ) {
            let st = Status::new(sct, sc).with_crd(crd).with_more(more).with_dnr(dnr);
            let c = Cqe::new(0, 0, 0, cid, st, phase);
            let back = Cqe::from_dwords(c.to_dwords());
            prop_assert_eq!(back.phase(), phase);
            prop_assert_eq!(back.cid, cid);
            let s = back.status();
            prop_assert_eq!(s.sct, sct);
            prop_assert_eq!(s.sc, sc);
            prop_assert_eq!(s.crd, crd);
            prop_assert_eq!(s.more, more);
            prop_assert_eq!(s.dnr, dnr);
        }
    }
}
