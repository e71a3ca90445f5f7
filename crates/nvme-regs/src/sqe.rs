//! The 64-byte submission queue entry (NVMe Base 2.0, 4.2 "Submission Queue
//! Entry", "Common Command Format"; Base 1.4, 4.2).
//!
//! Commands are built with the builders of [`crate::opcode`]; the queue then
//! fills in the command identifier ([`Sqe::set_cid`]) and the data pointer
//! ([`Sqe::set_prp`]).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// NSID `FFFF_FFFFh`: all namespaces / broadcast (NVMe Base 2.0, 3.2.1.2
/// "Valid and Invalid NSIDs").
pub const NSID_ALL: u32 = 0xFFFF_FFFF;

/// A submission queue entry: 64 bytes, 16 dwords, little-endian (NVMe Base
/// 2.0, 4.2).
///
/// Fields are named after the spec's dwords; command-specific meanings are
/// documented by the builders in [`crate::opcode`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Sqe {
    /// CDW0 (bytes 3:0): OPC bits 7:0, FUSE bits 9:8, PSDT bits 15:14
    /// (00b = PRPs), CID bits 31:16.
    pub cdw0: u32,
    /// NSID, Namespace Identifier (bytes 7:4); 0 when unused,
    /// `FFFF_FFFFh` = all namespaces.
    pub nsid: u32,
    /// CDW2 (bytes 11:8), command specific.
    pub cdw2: u32,
    /// CDW3 (bytes 15:12), command specific.
    pub cdw3: u32,
    /// MPTR, Metadata Pointer (bytes 23:16), bus address.
    pub mptr: u64,
    /// PRP1, first half of DPTR (bytes 31:24): bus address of the first
    /// data page (may carry a dword-aligned offset).
    pub prp1: u64,
    /// PRP2, second half of DPTR (bytes 39:32): second page or PRP list
    /// address, page aligned; 0 when unused.
    pub prp2: u64,
    /// CDW10 (bytes 43:40), command specific.
    pub cdw10: u32,
    /// CDW11 (bytes 47:44), command specific.
    pub cdw11: u32,
    /// CDW12 (bytes 51:48), command specific.
    pub cdw12: u32,
    /// CDW13 (bytes 55:52), command specific.
    pub cdw13: u32,
    /// CDW14 (bytes 59:56), command specific.
    pub cdw14: u32,
    /// CDW15 (bytes 63:60), command specific.
    pub cdw15: u32,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<Sqe>() == Sqe::SIZE);
    assert!(1 << Sqe::SIZE_LOG2 == Sqe::SIZE);
    assert!(offset_of!(Sqe, cdw0) == 0);
    assert!(offset_of!(Sqe, nsid) == 4);
    assert!(offset_of!(Sqe, cdw2) == 8);
    assert!(offset_of!(Sqe, cdw3) == 12);
    assert!(offset_of!(Sqe, mptr) == 16);
    assert!(offset_of!(Sqe, prp1) == 24);
    assert!(offset_of!(Sqe, prp2) == 32);
    assert!(offset_of!(Sqe, cdw10) == 40);
    assert!(offset_of!(Sqe, cdw11) == 44);
    assert!(offset_of!(Sqe, cdw12) == 48);
    assert!(offset_of!(Sqe, cdw13) == 52);
    assert!(offset_of!(Sqe, cdw14) == 56);
    assert!(offset_of!(Sqe, cdw15) == 60);
};

impl Sqe {
    /// Size of an SQE in bytes.
    pub const SIZE: usize = 64;
    /// log2 of [`Sqe::SIZE`]: the value for CC.IOSQES and the required
    /// value of Identify Controller SQES bits 3:0.
    pub const SIZE_LOG2: u8 = 6;

    /// An all-zero entry.
    pub const ZERO: Sqe = Sqe::new(0, 0);

    /// An entry with only OPC and NSID set (FUSE 0, PSDT 0 = PRPs, CID 0).
    pub const fn new(opcode: u8, nsid: u32) -> Sqe {
        Sqe {
            cdw0: opcode as u32,
            nsid,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            prp1: 0,
            prp2: 0,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }

    /// OPC, opcode, CDW0 bits 7:0 (see [`crate::opcode::admin_opcode`] and
    /// [`crate::opcode::nvm_opcode`]).
    pub const fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }

    /// FUSE, fused operation, CDW0 bits 9:8 (00b normal).
    pub const fn fuse(&self) -> u8 {
        ((self.cdw0 >> 8) & 3) as u8
    }

    /// PSDT, PRP or SGL for Data Transfer, CDW0 bits 15:14 (00b = PRPs).
    pub const fn psdt(&self) -> u8 {
        ((self.cdw0 >> 14) & 3) as u8
    }

    /// CID, Command Identifier, CDW0 bits 31:16.
    pub const fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }

    /// Sets CID (CDW0 bits 31:16), leaving OPC, FUSE and PSDT unchanged.
    pub const fn set_cid(&mut self, cid: u16) {
        self.cdw0 = (self.cdw0 & 0xFFFF) | (cid as u32) << 16;
    }

    /// Sets DPTR as two PRP entries (bus addresses); PSDT must be 00b,
    /// which every builder of this crate leaves it at.
    pub const fn set_prp(&mut self, prp1: u64, prp2: u64) {
        self.prp1 = prp1;
        self.prp2 = prp2;
    }

    /// The entry as 16 dwords, dword 0 first (64-bit fields split low dword
    /// first), i.e. the order in which they sit in memory.
    pub const fn as_dwords(&self) -> [u32; 16] {
        [
            self.cdw0,
            self.nsid,
            self.cdw2,
            self.cdw3,
            self.mptr as u32,
            (self.mptr >> 32) as u32,
            self.prp1 as u32,
            (self.prp1 >> 32) as u32,
            self.prp2 as u32,
            (self.prp2 >> 32) as u32,
            self.cdw10,
            self.cdw11,
            self.cdw12,
            self.cdw13,
            self.cdw14,
            self.cdw15,
        ]
    }

    /// Inverse of [`Sqe::as_dwords`].
    pub const fn from_dwords(d: [u32; 16]) -> Sqe {
        Sqe {
            cdw0: d[0],
            nsid: d[1],
            cdw2: d[2],
            cdw3: d[3],
            mptr: d[4] as u64 | (d[5] as u64) << 32,
            prp1: d[6] as u64 | (d[7] as u64) << 32,
            prp2: d[8] as u64 | (d[9] as u64) << 32,
            cdw10: d[10],
            cdw11: d[11],
            cdw12: d[12],
            cdw13: d[13],
            cdw14: d[14],
            cdw15: d[15],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zerocopy::IntoBytes;

    #[test]
    fn cdw0_fields() {
        let mut s = Sqe::new(0x02, 1);
        s.cdw0 |= 1 << 8 | 2 << 14;
        s.set_cid(0xBEEF);
        assert_eq!(s.opcode(), 2);
        assert_eq!(s.fuse(), 1);
        assert_eq!(s.psdt(), 2);
        assert_eq!(s.cid(), 0xBEEF);
        s.set_cid(7);
        assert_eq!(s.cid(), 7);
        assert_eq!(s.opcode(), 2);
        s.set_prp(0x1000, 0x2000);
        assert_eq!(&s.as_bytes()[24..32], &0x1000u64.to_le_bytes());
        assert_eq!(&s.as_bytes()[32..40], &0x2000u64.to_le_bytes());
        assert_eq!(Sqe::ZERO, Sqe::default());
    }

    proptest! {
        #[test]
        fn dwords_round_trip(d in proptest::array::uniform16(any::<u32>())) {
            let s = Sqe::from_dwords(d);
            prop_assert_eq!(s.as_dwords(), d);
            // The dword view is the memory view.
            let mut bytes = [0u8; 64];
            for (i, w) in d.iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
            }
            prop_assert_eq!(s.as_bytes(), &bytes[..]);
        }
    }
}
