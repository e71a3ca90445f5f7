//! Identify Namespace data structure for the NVM command set and its LBA
//! formats (NVM Command Set 1.0, 4.1.5.1; Base 1.4, 5.15.2.1).

use super::{check_len, IDENTIFY_SIZE};
use crate::error::DecodeError;
use zerocopy::little_endian::{U16, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Bits of Identify Namespace FLBAS and MC (NVM Command Set 1.0, 4.1.5.1).
pub mod metadata_bits {
    /// FLBAS bit 4: metadata is transferred at the end of the data of each
    /// logical block (extended LBA); 0 = in a separate buffer (MPTR).
    pub const FLBAS_EXTENDED: u8 = 1 << 4;
    /// MC bit 0: the namespace supports metadata as part of an extended LBA.
    pub const MC_EXTENDED: u8 = 1 << 0;
    /// MC bit 1: the namespace supports metadata in a separate buffer.
    pub const MC_SEPARATE: u8 = 1 << 1;
}

/// LBA Format data structure, LBAF (NVM Command Set 1.0, 4.1.5.1): 4
/// bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct LbaFormat {
    /// MS, Metadata Size (bytes 1:0), bytes of metadata per logical block.
    pub ms: U16,
    /// LBADS, LBA Data Size (byte 2): log2 of the logical block size in
    /// bytes; 0 = format not available; values below 9 are not supported.
    pub lbads: u8,
    /// RP, Relative Performance (byte 3, bits 1:0; 0 best .. 3 degraded).
    pub rp: u8,
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<LbaFormat>() == 4);
    assert!(align_of::<LbaFormat>() == 1);
    assert!(offset_of!(LbaFormat, ms) == 0);
    assert!(offset_of!(LbaFormat, lbads) == 2);
    assert!(offset_of!(LbaFormat, rp) == 3);
};

impl LbaFormat {
    /// A format with `ms` metadata bytes, blocks of `2^lbads` bytes and
    /// relative performance `rp` (masked to 2 bits).
    pub fn new(ms: u16, lbads: u8, rp: u8) -> LbaFormat {
        LbaFormat { ms: U16::new(ms), lbads, rp: rp & 3 }
    }

    /// MS: metadata bytes per logical block.
    pub fn ms(&self) -> u16 {
        self.ms.get()
    }

    /// LBADS: log2 of the logical block size in bytes, raw.
    pub fn lbads(&self) -> u8 {
        self.lbads
    }

    /// RP, Relative Performance (bits 1:0 of byte 3).
    pub fn rp(&self) -> u8 {
        self.rp & 3
    }

    /// Logical block size in bytes, `2^LBADS`; [`DecodeError::LbaDataSize`]
    /// unless LBADS is in 9..=16 (512 B to 64 KiB).
    pub fn block_size(&self) -> Result<u32, DecodeError> {
        match self.lbads {
            9..=16 => Ok(1u32 << self.lbads),
            lbads => Err(DecodeError::LbaDataSize { lbads }),
        }
    }
}

/// Identify Namespace data structure for the NVM command set (CNS 00h),
/// 4096 bytes (NVM Command Set 1.0, 4.1.5.1).
///
/// Sizes (NSZE, NCAP, NUSE) are in logical blocks of the formatted LBA
/// format ([`Self::block_size`]).
#[repr(C)]
#[derive(Clone, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyNamespace {
    /// NSZE, Namespace Size (bytes 7:0), logical blocks.
    pub nsze: U64,
    /// NCAP, Namespace Capacity (bytes 15:8), logical blocks.
    pub ncap: U64,
    /// NUSE, Namespace Utilization (bytes 23:16), logical blocks.
    pub nuse: U64,
    /// NSFEAT, Namespace Features (byte 24).
    pub nsfeat: u8,
    /// NLBAF, Number of LBA Formats (byte 25), **zero-based**.
    pub nlbaf: u8,
    /// FLBAS, Formatted LBA Size (byte 26): format index bits 3:0, extended
    /// metadata bit 4, index bits 5:4 in bits 6:5 when NLBAF >= 16.
    pub flbas: u8,
    /// MC, Metadata Capabilities (byte 27).
    pub mc: u8,
    /// DPC, End-to-end Data Protection Capabilities (byte 28).
    pub dpc: u8,
    /// DPS, End-to-end Data Protection Type Settings (byte 29).
    pub dps: u8,
    /// NMIC, Namespace Multi-path I/O and Namespace Sharing Capabilities
    /// (byte 30).
    pub nmic: u8,
    /// RESCAP, Reservation Capabilities (byte 31).
    pub rescap: u8,
    /// FPI, Format Progress Indicator (byte 32).
    pub fpi: u8,
    /// DLFEAT, Deallocate Logical Block Features (byte 33).
    pub dlfeat: u8,
    /// NAWUN, Namespace Atomic Write Unit Normal (bytes 35:34), zero-based,
    /// logical blocks.
    pub nawun: U16,
    /// NAWUPF, Namespace Atomic Write Unit Power Fail (bytes 37:36),
    /// zero-based, logical blocks.
    pub nawupf: U16,
    /// NACWU, Namespace Atomic Compare & Write Unit (bytes 39:38).
    pub nacwu: U16,
    /// NABSN, Namespace Atomic Boundary Size Normal (bytes 41:40).
    pub nabsn: U16,
    /// NABO, Namespace Atomic Boundary Offset (bytes 43:42).
    pub nabo: U16,
    /// NABSPF, Namespace Atomic Boundary Size Power Fail (bytes 45:44).
    pub nabspf: U16,
    /// NOIOB, Namespace Optimal I/O Boundary (bytes 47:46), logical blocks.
    pub noiob: U16,
    /// NVMCAP, NVM Capacity (bytes 63:48), bytes, 128-bit.
    pub nvmcap: [u8; 16],
    /// Bytes 103:64 (NPWG, NPWA, NPDG, NPDA, NOWS, ANAGRPID, NSATTR, ...).
    pub rsvd64: [u8; 40],
    /// NGUID, Namespace Globally Unique Identifier (bytes 119:104).
    pub nguid: [u8; 16],
    /// EUI64, IEEE Extended Unique Identifier (bytes 127:120).
    pub eui64: [u8; 8],
    /// LBAF0..LBAF63, LBA Format support (bytes 383:128), 4 bytes each;
    /// only `0..=NLBAF` are valid.
    pub lbaf: [LbaFormat; 64],
    /// Bytes 3711:384 (reserved).
    pub rsvd384: [u8; 3328],
    /// Vendor specific (bytes 4095:3712).
    pub vs: [u8; 384],
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    type N = IdentifyNamespace;
    assert!(size_of::<N>() == IDENTIFY_SIZE);
    assert!(align_of::<N>() == 1);
    assert!(offset_of!(N, nsze) == 0);
    assert!(offset_of!(N, ncap) == 8);
    assert!(offset_of!(N, nuse) == 16);
    assert!(offset_of!(N, nsfeat) == 24);
    assert!(offset_of!(N, nlbaf) == 25);
    assert!(offset_of!(N, flbas) == 26);
    assert!(offset_of!(N, mc) == 27);
    assert!(offset_of!(N, dpc) == 28);
    assert!(offset_of!(N, dps) == 29);
    assert!(offset_of!(N, dlfeat) == 33);
    assert!(offset_of!(N, noiob) == 46);
    assert!(offset_of!(N, nvmcap) == 48);
    assert!(offset_of!(N, nguid) == 104);
    assert!(offset_of!(N, eui64) == 120);
    assert!(offset_of!(N, lbaf) == 128);
    assert!(offset_of!(N, rsvd384) == 384);
    assert!(offset_of!(N, vs) == 3712);
};

impl core::fmt::Debug for IdentifyNamespace {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IdentifyNamespace")
            .field("nsze", &self.nsze())
            .field("ncap", &self.ncap())
            .field("nuse", &self.nuse())
            .field("nlbaf", &self.nlbaf())
            .field("flbas", &format_args!("{:#04x}", self.flbas()))
            .field("formatted_lba_format", &self.formatted_lba_format())
            .finish_non_exhaustive()
    }
}

impl IdentifyNamespace {
    /// Views a 4096-byte buffer as Identify Namespace data.
    /// [`DecodeError::WrongLength`] unless `bytes.len() == 4096`.
    pub fn parse(bytes: &[u8]) -> Result<&IdentifyNamespace, DecodeError> {
        check_len("Identify Namespace", IDENTIFY_SIZE, bytes)?;
        IdentifyNamespace::ref_from_bytes(bytes).map_err(|_| DecodeError::WrongLength {
            what: "Identify Namespace",
            expected: IDENTIFY_SIZE,
            actual: bytes.len(),
        })
    }

    /// An all-zero structure, for the emulator to fill with the setters.
    /// (An all-zero Identify Namespace is what a controller returns for an
    /// inactive NSID.)
    pub fn new_zeroed() -> IdentifyNamespace {
        <IdentifyNamespace as FromZeros>::new_zeroed()
    }

    /// NSZE, Namespace Size, in logical blocks.
    pub fn nsze(&self) -> u64 {
        self.nsze.get()
    }

    /// NCAP, Namespace Capacity, in logical blocks.
    pub fn ncap(&self) -> u64 {
        self.ncap.get()
    }

    /// NUSE, Namespace Utilization, in logical blocks.
    pub fn nuse(&self) -> u64 {
        self.nuse.get()
    }

    /// NSFEAT, Namespace Features, raw.
    pub fn nsfeat(&self) -> u8 {
        self.nsfeat
    }

    /// NLBAF, Number of LBA Formats, **zero-based** (`nlbaf + 1` formats).
    pub fn nlbaf(&self) -> u8 {
        self.nlbaf
    }

    /// FLBAS, Formatted LBA Size, raw.
    pub fn flbas(&self) -> u8 {
        self.flbas
    }

    /// Index of the formatted LBA format: FLBAS bits 3:0, plus bits 6:5 as
    /// index bits 5:4 when more than 16 formats exist (NLBAF >= 16; the
    /// bits are reserved otherwise and ignored here).
    pub fn formatted_lba_index(&self) -> u8 {
        let low = self.flbas & 0xF;
        if self.nlbaf >= 16 {
            low | ((self.flbas >> 5) & 3) << 4
        } else {
            low
        }
    }

    /// FLBAS bit 4: metadata is transferred at the end of each logical
    /// block (extended LBA) rather than in a separate buffer.
    pub fn extended_metadata(&self) -> bool {
        self.flbas & metadata_bits::FLBAS_EXTENDED != 0
    }

    /// MC, Metadata Capabilities, raw (see [`metadata_bits`]).
    pub fn mc(&self) -> u8 {
        self.mc
    }

    /// The LBA formats `0..=NLBAF`, in index order (at most 64).
    pub fn lba_formats(&self) -> impl Iterator<Item = LbaFormat> + '_ {
        self.lbaf.iter().take(usize::from(self.nlbaf) + 1).copied()
    }

    /// LBA format `i`, or `None` if `i` is beyond NLBAF or beyond the 64
    /// entries of the structure.
    pub fn lbaf(&self, i: usize) -> Option<LbaFormat> {
        if i > usize::from(self.nlbaf) {
            return None;
        }
        self.lbaf.get(i).copied()
    }

    /// The LBA format selected by FLBAS; [`DecodeError::LbaFormatIndex`]
    /// when the index is beyond NLBAF.
    pub fn formatted_lba_format(&self) -> Result<LbaFormat, DecodeError> {
        let index = self.formatted_lba_index();
        self.lbaf(usize::from(index)).ok_or(DecodeError::LbaFormatIndex { index, nlbaf: self.nlbaf })
    }

    /// Logical block size of the formatted LBA format, in bytes (`2^LBADS`,
    /// LBADS checked to be in 9..=16, else [`DecodeError::LbaDataSize`]).
    pub fn block_size(&self) -> Result<u32, DecodeError> {
        self.formatted_lba_format()?.block_size()
    }

    /// Namespace size in bytes (NSZE * block size);
    /// [`DecodeError::InvalidValue`] if it overflows `u64`.
    pub fn size_bytes(&self) -> Result<u64, DecodeError> {
        let bs = self.block_size()?;
        self.nsze()
            .checked_mul(u64::from(bs))
            .ok_or(DecodeError::InvalidValue { field: "NSZE", value: self.nsze() })
    }

    /// Sets NSZE (logical blocks).
    pub fn set_nsze(&mut self, nsze: u64) {
        self.nsze = U64::new(nsze);
    }

    /// Sets NCAP (logical blocks).
    pub fn set_ncap(&mut self, ncap: u64) {
        self.ncap = U64::new(ncap);
    }

    /// Sets NUSE (logical blocks).
    pub fn set_nuse(&mut self, nuse: u64) {
        self.nuse = U64::new(nuse);
    }

    /// Sets NLBAF (zero-based number of formats).
    pub fn set_nlbaf(&mut self, nlbaf: u8) {
        self.nlbaf = nlbaf;
    }

    /// Sets FLBAS (raw).
    pub fn set_flbas(&mut self, flbas: u8) {
        self.flbas = flbas;
    }

    /// Sets MC (raw, see [`metadata_bits`]).
    pub fn set_mc(&mut self, mc: u8) {
        self.mc = mc;
    }

    /// Sets LBA format `i` (0..64); [`DecodeError::InvalidValue`] for an
    /// index beyond the 64 entries. Does not change NLBAF.
    pub fn set_lbaf(&mut self, i: usize, format: LbaFormat) -> Result<(), DecodeError> {
        match self.lbaf.get_mut(i) {
            Some(slot) => {
                *slot = format;
                Ok(())
            }
            None => Err(DecodeError::InvalidValue { field: "LBAF index", value: i as u64 }),
        }
    }
}
