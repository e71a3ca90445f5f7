//! NVM I/O command builders (NVM Command Set 1.0, 3): Read, Write, Flush,
//! Write Zeroes and Dataset Management.

use super::{nvm_opcode, Nlb};
use crate::sqe::Sqe;

/// CDW12 FUA bit (Force Unit Access), NVM Command Set 1.0 3.3.4.
pub(super) const FUA: u32 = 1 << 30;
/// CDW12 LR bit (Limited Retry).
pub(super) const LR: u32 = 1 << 31;
/// CDW12 DEAC bit of Write Zeroes (Deallocate).
pub(super) const DEAC: u32 = 1 << 25;

/// The shared layout of Read / Write / Write Zeroes: SLBA in CDW10 (bits
/// 31:0) and CDW11 (bits 63:32), NLB zero-based in CDW12 bits 15:0, plus
/// `flags` in the upper bits of CDW12.
const fn rw_sqe(opcode: u8, nsid: u32, slba: u64, nlb: Nlb, flags: u32) -> Sqe {
    let mut sqe = Sqe::new(opcode, nsid);
    sqe.cdw10 = slba as u32;
    sqe.cdw11 = (slba >> 32) as u32;
    sqe.cdw12 = nlb.zero_based() as u32 | flags;
    sqe
}

/// Read (NVM 02h; NVM Command Set 1.0, 3.3.4): reads `nlb` logical blocks
/// starting at logical block `slba` into the PRP-described buffer
/// (`nlb.blocks() * block size` bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct Read {
    nsid: u32,
    slba: u64,
    nlb: Nlb,
    fua: bool,
    limited_retry: bool,
}

impl Read {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::READ;

    /// Reads `nlb` blocks at SLBA `slba` (in logical blocks) of namespace
    /// `nsid`.
    pub const fn new(nsid: u32, slba: u64, nlb: Nlb) -> Self {
        Read { nsid, slba, nlb, fua: false, limited_retry: false }
    }

    /// FUA, Force Unit Access (CDW12 bit 30): read from non-volatile media.
    pub const fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }

    /// LR, Limited Retry (CDW12 bit 31).
    pub const fn limited_retry(mut self, lr: bool) -> Self {
        self.limited_retry = lr;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let Read { nsid, slba, nlb, fua, limited_retry } = self;
        let flags = if fua { FUA } else { 0 } | if limited_retry { LR } else { 0 };
        rw_sqe(Self::CODE, nsid, slba, nlb, flags)
    }
}

/// Write (NVM 01h; NVM Command Set 1.0, 3.3.6): writes `nlb` logical blocks
/// starting at logical block `slba` from the PRP-described buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct Write {
    nsid: u32,
    slba: u64,
    nlb: Nlb,
    fua: bool,
    limited_retry: bool,
}

impl Write {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::WRITE;

    /// Writes `nlb` blocks at SLBA `slba` (in logical blocks) of namespace
    /// `nsid`.
    pub const fn new(nsid: u32, slba: u64, nlb: Nlb) -> Self {
        Write { nsid, slba, nlb, fua: false, limited_retry: false }
    }

    /// FUA, Force Unit Access (CDW12 bit 30): complete only once the data
    /// is on non-volatile media.
    pub const fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }

    /// LR, Limited Retry (CDW12 bit 31).
    pub const fn limited_retry(mut self, lr: bool) -> Self {
        self.limited_retry = lr;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let Write { nsid, slba, nlb, fua, limited_retry } = self;
        let flags = if fua { FUA } else { 0 } | if limited_retry { LR } else { 0 };
        rw_sqe(Self::CODE, nsid, slba, nlb, flags)
    }
}

/// Flush (NVM 00h; NVMe Base 2.0, 7.1): commit volatile write cache contents
/// of namespace `nsid` (`FFFF_FFFFh` = all namespaces, if supported) to
/// non-volatile media. No data transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct Flush {
    nsid: u32,
}

impl Flush {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::FLUSH;

    /// Flushes namespace `nsid`.
    pub const fn new(nsid: u32) -> Self {
        Flush { nsid }
    }

    /// Encodes the command (CID zero).
    pub const fn build(self) -> Sqe {
        let Flush { nsid } = self;
        Sqe::new(Self::CODE, nsid)
    }
}

/// Write Zeroes (NVM 08h; NVM Command Set 1.0, 3.3.8): sets `nlb` logical
/// blocks at `slba` to zero, without a data transfer. CDW12: NLB bits 15:0
/// (zero-based), DEAC bit 25, FUA bit 30.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct WriteZeroes {
    nsid: u32,
    slba: u64,
    nlb: Nlb,
    deallocate: bool,
    fua: bool,
}

impl WriteZeroes {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::WRITE_ZEROES;

    /// Zeroes `nlb` blocks at SLBA `slba` (in logical blocks) of namespace
    /// `nsid`.
    pub const fn new(nsid: u32, slba: u64, nlb: Nlb) -> Self {
        WriteZeroes { nsid, slba, nlb, deallocate: false, fua: false }
    }

    /// DEAC, Deallocate (CDW12 bit 25): the controller may deallocate the
    /// blocks instead of writing zeroes.
    pub const fn deallocate(mut self, deac: bool) -> Self {
        self.deallocate = deac;
        self
    }

    /// FUA, Force Unit Access (CDW12 bit 30).
    pub const fn fua(mut self, fua: bool) -> Self {
        self.fua = fua;
        self
    }

    /// Encodes the command (CID zero; no data pointer).
    pub const fn build(self) -> Sqe {
        let WriteZeroes { nsid, slba, nlb, deallocate, fua } = self;
        let flags = if deallocate { DEAC } else { 0 } | if fua { FUA } else { 0 };
        rw_sqe(Self::CODE, nsid, slba, nlb, flags)
    }
}

/// Dataset Management (NVM 09h; NVM Command Set 1.0, 3.3.3): hints about
/// ranges of logical blocks, e.g. deallocate ("trim"). The PRP-described
/// buffer holds `ranges` [`DsmRange`] entries (16 bytes each). CDW10: NR bits
/// 7:0 (zero-based range count); CDW11: IDR bit 0, IDW bit 1, AD bit 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a command builder does nothing until `build` is called and the SQE submitted"]
pub struct DatasetManagement {
    nsid: u32,
    nr_z: u8,
    deallocate: bool,
    integral_read: bool,
    integral_write: bool,
}

impl DatasetManagement {
    /// The opcode.
    pub const CODE: u8 = nvm_opcode::DATASET_MANAGEMENT;

    /// Largest number of ranges one command can carry.
    pub const MAX_RANGES: u16 = 256;

    /// `ranges` ranges (**1-based**, 1..=256) on namespace `nsid`; `None`
    /// for 0 or more than 256. No attribute is set until requested.
    pub const fn new(nsid: u32, ranges: u16) -> Option<Self> {
        if ranges == 0 || ranges > Self::MAX_RANGES {
            return None;
        }
        Some(DatasetManagement {
            nsid,
            nr_z: (ranges - 1) as u8,
            deallocate: false,
            integral_read: false,
            integral_write: false,
        })
    }

    /// AD, Attribute – Deallocate (CDW11 bit 2).
    pub const fn deallocate(mut self, ad: bool) -> Self {
        self.deallocate = ad;
        self
    }

    /// IDR, Attribute – Integral Dataset for Read (CDW11 bit 0).
    pub const fn integral_read(mut self, idr: bool) -> Self {
        self.integral_read = idr;
        self
    }

    /// IDW, Attribute – Integral Dataset for Write (CDW11 bit 1).
    pub const fn integral_write(mut self, idw: bool) -> Self {
        self.integral_write = idw;
        self
    }

    /// Encodes the command (CID and PRPs zero).
    pub const fn build(self) -> Sqe {
        let DatasetManagement { nsid, nr_z, deallocate, integral_read, integral_write } = self;
        let mut sqe = Sqe::new(Self::CODE, nsid);
        sqe.cdw10 = nr_z as u32;
        sqe.cdw11 = integral_read as u32 | (integral_write as u32) << 1 | (deallocate as u32) << 2;
        sqe
    }
}

/// One Dataset Management range (NVM Command Set 1.0, 3.3.3, "Dataset
/// Management – Range Definition"): 16 bytes, little-endian.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
pub struct DsmRange {
    /// Context Attributes (bytes 3:0): access hints; 0 for none.
    pub context_attributes: u32,
    /// Length in logical blocks (bytes 7:4), **1-based** (not zero-based).
    pub length_lbas: u32,
    /// Starting LBA (bytes 15:8), in logical blocks.
    pub slba: u64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<DsmRange>() == 16);
    assert!(offset_of!(DsmRange, context_attributes) == 0);
    assert!(offset_of!(DsmRange, length_lbas) == 4);
    assert!(offset_of!(DsmRange, slba) == 8);
};

impl DsmRange {
    /// A range of `length_lbas` logical blocks at `slba`, no context
    /// attributes.
    pub const fn new(slba: u64, length_lbas: u32) -> DsmRange {
        DsmRange { context_attributes: 0, length_lbas, slba }
    }
}
