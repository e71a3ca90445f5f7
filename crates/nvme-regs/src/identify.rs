//! Identify data structures, 4096 bytes each: Identify Controller (NVMe Base
//! 2.0, 5.17.2.1; Base 1.4, 5.15), Identify Namespace for
//! the NVM command set (NVM Command Set 1.0, 4.1.5.1; Base 1.4,
//! 5.15.2.1) and the Active Namespace ID list (Base 2.0, 5.17.2.2).
//!
//! The structures have alignment 1 (multi-byte fields are
//! [`zerocopy::little_endian`] integers or byte arrays), so
//! [`IdentifyController::parse`] and [`IdentifyNamespace::parse`] accept any
//! 4096-byte slice. Fields not broken out are kept as reserved byte arrays at
//! their spec offsets; the accessors are the supported interface.

use crate::error::DecodeError;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Size of every Identify data structure in bytes.
pub const IDENTIFY_SIZE: usize = 4096;

/// Decodes an ASCII string field: trailing spaces and NULs are trimmed;
/// any non-ASCII byte is an error.
fn ascii_field<'a>(bytes: &'a [u8], field: &'static str) -> Result<&'a str, DecodeError> {
    let mut end = bytes.len();
    while end > 0 && matches!(bytes[end - 1], b' ' | 0) {
        end -= 1;
    }
    let bytes = &bytes[..end];
    if !bytes.is_ascii() {
        return Err(DecodeError::NotAscii { field });
    }
    core::str::from_utf8(bytes).map_err(|_| DecodeError::NotAscii { field })
}

/// Encodes an ASCII string field: space padded, truncated to the field
/// width, non-ASCII bytes replaced by `?` so the field always decodes.
fn set_ascii_field(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    for (d, &b) in dst.iter_mut().zip(s.as_bytes()) {
        *d = if b.is_ascii() { b } else { b'?' };
    }
}

fn check_len(what: &'static str, expected: usize, bytes: &[u8]) -> Result<(), DecodeError> {
    if bytes.len() == expected {
        Ok(())
    } else {
        Err(DecodeError::WrongLength { what, expected, actual: bytes.len() })
    }
}

/// ONCS, Optional NVM Command Support bits (Identify Controller bytes
/// 521:520; NVMe Base 2.0, 5.17.2.1).
pub mod oncs_bits {
    /// Bit 0: Compare supported.
    pub const COMPARE: u16 = 1 << 0;
    /// Bit 1: Write Uncorrectable supported.
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// Bit 2: Dataset Management supported.
    pub const DATASET_MANAGEMENT: u16 = 1 << 2;
    /// Bit 3: Write Zeroes supported.
    pub const WRITE_ZEROES: u16 = 1 << 3;
}

/// Identify Controller data structure (CNS 01h), 4096 bytes (NVMe Base 2.0,
/// 5.17.2.1).
///
/// Fields are public and sit at their spec byte offsets (asserted at compile
/// time); prefer the accessors, which decode units and strings.
#[repr(C)]
#[derive(Clone, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct IdentifyController {
    /// VID, PCI Vendor ID (bytes 1:0).
    pub vid: U16,
    /// SSVID, PCI Subsystem Vendor ID (bytes 3:2).
    pub ssvid: U16,
    /// SN, Serial Number (bytes 23:4), ASCII, space padded.
    pub sn: [u8; 20],
    /// MN, Model Number (bytes 63:24), ASCII, space padded.
    pub mn: [u8; 40],
    /// FR, Firmware Revision (bytes 71:64), ASCII, space padded.
    pub fr: [u8; 8],
    /// RAB, Recommended Arbitration Burst (byte 72), log2 of commands.
    pub rab: u8,
    /// IEEE OUI Identifier (bytes 75:73).
    pub ieee: [u8; 3],
    /// CMIC, Controller Multi-Path I/O and Namespace Sharing Capabilities
    /// (byte 76).
    pub cmic: u8,
    /// MDTS, Maximum Data Transfer Size (byte 77): log2, in units of the
    /// minimum memory page size (CAP.MPSMIN); 0 = no limit.
    pub mdts: u8,
    /// CNTLID, Controller ID (bytes 79:78).
    pub cntlid: U16,
    /// VER, Version (bytes 83:80), same format as the VS register.
    pub ver: U32,
    /// RTD3R, RTD3 Resume Latency (bytes 87:84), microseconds.
    pub rtd3r: U32,
    /// RTD3E, RTD3 Entry Latency (bytes 91:88), microseconds.
    pub rtd3e: U32,
    /// OAES, Optional Asynchronous Events Supported (bytes 95:92).
    pub oaes: U32,
    /// CTRATT, Controller Attributes (bytes 99:96).
    pub ctratt: U32,
    /// Bytes 255:100 (RRLS, CNTRLTYPE, FGUID, CRDT1..3, NVMe-MI fields).
    pub rsvd100: [u8; 156],
    /// OACS, Optional Admin Command Support (bytes 257:256).
    pub oacs: U16,
    /// ACL, Abort Command Limit (byte 258), zero-based.
    pub acl: u8,
    /// AERL, Asynchronous Event Request Limit (byte 259), zero-based.
    pub aerl: u8,
    /// FRMW, Firmware Updates (byte 260).
    pub frmw: u8,
    /// LPA, Log Page Attributes (byte 261).
    pub lpa: u8,
    /// ELPE, Error Log Page Entries (byte 262), zero-based.
    pub elpe: u8,
    /// NPSS, Number of Power States Support (byte 263), zero-based.
    pub npss: u8,
    /// Bytes 511:264 (AVSCC .. reserved).
    pub rsvd264: [u8; 248],
    /// SQES, Submission Queue Entry Size (byte 512): bits 3:0 required,
    /// bits 7:4 maximum, each log2 of bytes.
    pub sqes: u8,
    /// CQES, Completion Queue Entry Size (byte 513): bits 3:0 required,
    /// bits 7:4 maximum, each log2 of bytes.
    pub cqes: u8,
    /// MAXCMD, Maximum Outstanding Commands (bytes 515:514); 0 = not
    /// reported.
    pub maxcmd: U16,
    /// NN, Number of Namespaces (bytes 519:516): the largest valid NSID.
    pub nn: U32,
    /// ONCS, Optional NVM Command Support (bytes 521:520); see [`oncs_bits`].
    pub oncs: U16,
    /// FUSES, Fused Operation Support (bytes 523:522).
    pub fuses: U16,
    /// FNA, Format NVM Attributes (byte 524).
    pub fna: u8,
    /// VWC, Volatile Write Cache (byte 525): bit 0 = a volatile write cache
    /// is present.
    pub vwc: u8,
    /// AWUN, Atomic Write Unit Normal (bytes 527:526), zero-based, logical
    /// blocks.
    pub awun: U16,
    /// AWUPF, Atomic Write Unit Power Fail (bytes 529:528), zero-based,
    /// logical blocks.
    pub awupf: U16,
    /// Bytes 535:530 (ICSVSCC, NWPC, ACWU, OCFS).
    pub rsvd530: [u8; 6],
    /// SGLS, SGL Support (bytes 539:536).
    pub sgls: U32,
    /// Bytes 767:540 (MNAN, MAXDNA, .. reserved).
    pub rsvd540: [u8; 228],
    /// SUBNQN, NVM Subsystem NVMe Qualified Name (bytes 1023:768), UTF-8,
    /// NUL terminated.
    pub subnqn: [u8; 256],
    /// Bytes 2047:1024 (reserved, NVMe over Fabrics).
    pub rsvd1024: [u8; 1024],
    /// PSD0..PSD31, Power State Descriptors (bytes 3071:2048), 32 bytes
    /// each.
    pub psd: [[u8; 32]; 32],
    /// Vendor specific (bytes 4095:3072).
    pub vs: [u8; 1024],
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    type C = IdentifyController;
    assert!(size_of::<C>() == IDENTIFY_SIZE);
    assert!(align_of::<C>() == 1);
    assert!(offset_of!(C, vid) == 0);
    assert!(offset_of!(C, ssvid) == 2);
    assert!(offset_of!(C, sn) == 4);
    assert!(offset_of!(C, mn) == 24);
    assert!(offset_of!(C, fr) == 64);
    assert!(offset_of!(C, rab) == 72);
    assert!(offset_of!(C, ieee) == 73);
    assert!(offset_of!(C, cmic) == 76);
    assert!(offset_of!(C, mdts) == 77);
    assert!(offset_of!(C, cntlid) == 78);
    assert!(offset_of!(C, ver) == 80);
    assert!(offset_of!(C, ctratt) == 96);
    assert!(offset_of!(C, oacs) == 256);
    assert!(offset_of!(C, npss) == 263);
    assert!(offset_of!(C, sqes) == 512);
    assert!(offset_of!(C, cqes) == 513);
    assert!(offset_of!(C, maxcmd) == 514);
    assert!(offset_of!(C, nn) == 516);
    assert!(offset_of!(C, oncs) == 520);
    assert!(offset_of!(C, fuses) == 522);
    assert!(offset_of!(C, vwc) == 525);
    assert!(offset_of!(C, awupf) == 528);
    assert!(offset_of!(C, sgls) == 536);
    assert!(offset_of!(C, subnqn) == 768);
    assert!(offset_of!(C, psd) == 2048);
    assert!(offset_of!(C, vs) == 3072);
};

impl core::fmt::Debug for IdentifyController {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IdentifyController")
            .field("vid", &format_args!("{:#06x}", self.vid()))
            .field("sn", &self.sn())
            .field("mn", &self.mn())
            .field("fr", &self.fr())
            .field("mdts", &self.mdts())
            .field("cntlid", &self.cntlid())
            .field("ver", &format_args!("{:#010x}", self.ver()))
            .field("sqes", &format_args!("{:#04x}", self.sqes()))
            .field("cqes", &format_args!("{:#04x}", self.cqes()))
            .field("maxcmd", &self.maxcmd())
            .field("nn", &self.nn())
            .field("oncs", &format_args!("{:#06x}", self.oncs()))
            .field("vwc", &self.vwc())
            .finish_non_exhaustive()
    }
}

impl IdentifyController {
    /// Views a 4096-byte buffer as Identify Controller data.
    /// [`DecodeError::WrongLength`] unless `bytes.len() == 4096`.
    pub fn parse(bytes: &[u8]) -> Result<&IdentifyController, DecodeError> {
        check_len("Identify Controller", IDENTIFY_SIZE, bytes)?;
        IdentifyController::ref_from_bytes(bytes).map_err(|_| DecodeError::WrongLength {
            what: "Identify Controller",
            expected: IDENTIFY_SIZE,
            actual: bytes.len(),
        })
    }

    /// VID, PCI Vendor ID (bytes 1:0).
    pub fn vid(&self) -> u16 {
        self.vid.get()
    }

    /// SSVID, PCI Subsystem Vendor ID (bytes 3:2).
    pub fn ssvid(&self) -> u16 {
        self.ssvid.get()
    }

    /// SN, Serial Number (bytes 23:4), trailing spaces and NULs trimmed;
    /// [`DecodeError::NotAscii`] for non-ASCII bytes.
    pub fn sn(&self) -> Result<&str, DecodeError> {
        ascii_field(&self.sn, "SN")
    }

    /// MN, Model Number (bytes 63:24), trimmed as [`Self::sn`].
    pub fn mn(&self) -> Result<&str, DecodeError> {
        ascii_field(&self.mn, "MN")
    }

    /// FR, Firmware Revision (bytes 71:64), trimmed as [`Self::sn`].
    pub fn fr(&self) -> Result<&str, DecodeError> {
        ascii_field(&self.fr, "FR")
    }

    /// MDTS, Maximum Data Transfer Size (byte 77), raw: log2 in units of
    /// CAP.MPSMIN pages, 0 = no limit. See [`Self::max_transfer_bytes`].
    pub fn mdts(&self) -> u8 {
        self.mdts
    }

    /// CNTLID, Controller ID (bytes 79:78).
    pub fn cntlid(&self) -> u16 {
        self.cntlid.get()
    }

    /// VER, Version (bytes 83:80), in the VS register format (see
    /// [`crate::registers::Vs`]); 0 if not reported (pre-1.2 controllers).
    pub fn ver(&self) -> u32 {
        self.ver.get()
    }

    /// OACS, Optional Admin Command Support (bytes 257:256).
    pub fn oacs(&self) -> u16 {
        self.oacs.get()
    }

    /// SQES (byte 512), raw: bits 3:0 required and bits 7:4 maximum SQE
    /// size, each log2 of bytes (6 = 64 B).
    pub fn sqes(&self) -> u8 {
        self.sqes
    }

    /// SQES bits 3:0: required SQE size, log2 of bytes.
    pub fn sqes_required_log2(&self) -> u8 {
        self.sqes & 0xF
    }

    /// SQES bits 7:4: maximum SQE size, log2 of bytes.
    pub fn sqes_max_log2(&self) -> u8 {
        self.sqes >> 4
    }

    /// CQES (byte 513), raw: bits 3:0 required and bits 7:4 maximum CQE
    /// size, each log2 of bytes (4 = 16 B).
    pub fn cqes(&self) -> u8 {
        self.cqes
    }

    /// CQES bits 3:0: required CQE size, log2 of bytes.
    pub fn cqes_required_log2(&self) -> u8 {
        self.cqes & 0xF
    }

    /// CQES bits 7:4: maximum CQE size, log2 of bytes.
    pub fn cqes_max_log2(&self) -> u8 {
        self.cqes >> 4
    }

    /// MAXCMD, Maximum Outstanding Commands (bytes 515:514), 1-based count;
    /// 0 = not reported.
    pub fn maxcmd(&self) -> u16 {
        self.maxcmd.get()
    }

    /// NN, Number of Namespaces (bytes 519:516): the largest NSID.
    pub fn nn(&self) -> u32 {
        self.nn.get()
    }

    /// ONCS, Optional NVM Command Support (bytes 521:520); see
    /// [`oncs_bits`].
    pub fn oncs(&self) -> u16 {
        self.oncs.get()
    }

    /// VWC, Volatile Write Cache (byte 525): bit 0 = present.
    pub fn vwc(&self) -> u8 {
        self.vwc
    }

    /// SGLS, SGL Support (bytes 539:536); bits 1:0 = 00b: SGLs not
    /// supported.
    pub fn sgls(&self) -> u32 {
        self.sgls.get()
    }

    /// Largest data transfer of one command, in bytes: `2^MDTS *
    /// min_page_size` (`min_page_size` = CAP.MPSMIN page size in bytes,
    /// [`crate::registers::Cap::min_page_size`]). `None` means no limit:
    /// MDTS = 0, or a limit too large for `u64` (a malformed MDTS never
    /// panics).
    pub fn max_transfer_bytes(&self, min_page_size: usize) -> Option<u64> {
        if self.mdts == 0 {
            return None;
        }
        1u64.checked_shl(u32::from(self.mdts))?.checked_mul(min_page_size as u64)
    }

    /// An all-zero structure, for the emulator to fill with the setters.
    pub fn new_zeroed() -> IdentifyController {
        <IdentifyController as FromZeros>::new_zeroed()
    }

    /// Sets VID.
    pub fn set_vid(&mut self, vid: u16) {
        self.vid = U16::new(vid);
    }

    /// Sets SSVID.
    pub fn set_ssvid(&mut self, ssvid: u16) {
        self.ssvid = U16::new(ssvid);
    }

    /// Sets SN: space padded, truncated to 20 bytes, non-ASCII bytes
    /// replaced by `?`.
    pub fn set_sn(&mut self, sn: &str) {
        set_ascii_field(&mut self.sn, sn);
    }

    /// Sets MN: space padded, truncated to 40 bytes (see [`Self::set_sn`]).
    pub fn set_mn(&mut self, mn: &str) {
        set_ascii_field(&mut self.mn, mn);
    }

    /// Sets FR: space padded, truncated to 8 bytes (see [`Self::set_sn`]).
    pub fn set_fr(&mut self, fr: &str) {
        set_ascii_field(&mut self.fr, fr);
    }

    /// Sets MDTS (log2 of CAP.MPSMIN pages; 0 = no limit).
    pub fn set_mdts(&mut self, mdts: u8) {
        self.mdts = mdts;
    }

    /// Sets CNTLID.
    pub fn set_cntlid(&mut self, cntlid: u16) {
        self.cntlid = U16::new(cntlid);
    }

    /// Sets VER (VS register format).
    pub fn set_ver(&mut self, ver: u32) {
        self.ver = U32::new(ver);
    }

    /// Sets OACS.
    pub fn set_oacs(&mut self, oacs: u16) {
        self.oacs = U16::new(oacs);
    }

    /// Sets SQES (raw: bits 7:4 max, bits 3:0 required, log2 of bytes; use
    /// `0x66` for 64-byte entries only).
    pub fn set_sqes(&mut self, sqes: u8) {
        self.sqes = sqes;
    }

    /// Sets CQES (raw; use `0x44` for 16-byte entries only).
    pub fn set_cqes(&mut self, cqes: u8) {
        self.cqes = cqes;
    }

    /// Sets MAXCMD.
    pub fn set_maxcmd(&mut self, maxcmd: u16) {
        self.maxcmd = U16::new(maxcmd);
    }

    /// Sets NN (number of namespaces / largest NSID).
    pub fn set_nn(&mut self, nn: u32) {
        self.nn = U32::new(nn);
    }

    /// Sets ONCS (see [`oncs_bits`]).
    pub fn set_oncs(&mut self, oncs: u16) {
        self.oncs = U16::new(oncs);
    }

    /// Sets VWC.
    pub fn set_vwc(&mut self, vwc: u8) {
        self.vwc = vwc;
    }

    /// Sets SGLS.
    pub fn set_sgls(&mut self, sgls: u32) {
        self.sgls = U32::new(sgls);
    }
}

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

/// Parses an Active Namespace ID list (CNS 02h; NVMe Base 2.0, 5.17.2.2):
/// 1024 little-endian NSIDs in ascending order, ending at the first 0.
/// [`DecodeError::WrongLength`] unless `bytes.len() == 4096`.
pub fn parse_active_namespace_list(bytes: &[u8]) -> Result<impl Iterator<Item = u32> + '_, DecodeError> {
    check_len("Active Namespace ID list", IDENTIFY_SIZE, bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&nsid| nsid != 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;
    use zerocopy::IntoBytes;

    fn sample_controller() -> IdentifyController {
        let mut c = IdentifyController::new_zeroed();
        c.set_vid(0x1B36);
        c.set_ssvid(0x1AF4);
        c.set_sn("SN-0001");
        c.set_mn("tutti emulated NVMe controller, much too long for MN");
        c.set_fr("0.1");
        c.set_mdts(5);
        c.set_cntlid(1);
        c.set_ver(0x0002_0000);
        c.set_oacs(0);
        c.set_sqes(0x66);
        c.set_cqes(0x44);
        c.set_maxcmd(1024);
        c.set_nn(1);
        c.set_oncs(oncs_bits::DATASET_MANAGEMENT | oncs_bits::WRITE_ZEROES);
        c.set_vwc(1);
        c
    }

    #[test]
    fn controller_round_trip() {
        let c = sample_controller();
        let bytes = c.as_bytes();
        assert_eq!(bytes.len(), 4096);
        assert_eq!(&bytes[0..2], &[0x36, 0x1B]);
        assert_eq!(&bytes[4..11], b"SN-0001");
        assert_eq!(bytes[11], b' ');
        assert_eq!(bytes[77], 5);
        assert_eq!(&bytes[80..84], &[0, 0, 2, 0]);
        assert_eq!(bytes[512], 0x66);
        assert_eq!(&bytes[520..522], &[0x0C, 0]);
        let p = IdentifyController::parse(bytes).unwrap();
        assert_eq!(p.vid(), 0x1B36);
        assert_eq!(p.ssvid(), 0x1AF4);
        assert_eq!(p.sn(), Ok("SN-0001"));
        assert_eq!(p.mn(), Ok("tutti emulated NVMe controller, much too"));
        assert_eq!(p.fr(), Ok("0.1"));
        assert_eq!(p.mdts(), 5);
        assert_eq!(p.cntlid(), 1);
        assert_eq!(p.ver(), 0x0002_0000);
        assert_eq!(p.sqes(), 0x66);
        assert_eq!(p.sqes_required_log2(), 6);
        assert_eq!(p.sqes_max_log2(), 6);
        assert_eq!(p.cqes_required_log2(), 4);
        assert_eq!(p.cqes_max_log2(), 4);
        assert_eq!(p.maxcmd(), 1024);
        assert_eq!(p.nn(), 1);
        assert_eq!(p.oncs(), 0x0C);
        assert_eq!(p.vwc(), 1);
        assert_eq!(p.sgls(), 0);
        assert_eq!(p.max_transfer_bytes(4096), Some(128 * 1024));
        let _ = std::format!("{p:?}");
    }

    #[test]
    fn wrong_length() {
        let buf = vec![0u8; 4097];
        assert_eq!(
            IdentifyController::parse(&buf[..4095]).unwrap_err(),
            DecodeError::WrongLength { what: "Identify Controller", expected: 4096, actual: 4095 }
        );
        assert!(IdentifyController::parse(&buf).is_err());
        assert!(IdentifyController::parse(&[]).is_err());
        assert!(IdentifyNamespace::parse(&buf[..512]).is_err());
        assert!(parse_active_namespace_list(&buf[..4092]).is_err());
        // Unaligned 4096-byte slices are fine (alignment 1).
        assert!(IdentifyController::parse(&buf[1..]).is_ok());
        assert!(IdentifyNamespace::parse(&buf[1..]).is_ok());
    }

    #[test]
    fn strings() {
        let mut c = sample_controller();
        c.sn[3] = 0xC3;
        assert_eq!(c.sn(), Err(DecodeError::NotAscii { field: "SN" }));
        c.sn = [0; 20];
        assert_eq!(c.sn(), Ok(""));
        c.sn = *b"ABC \0 \0\0            ";
        assert_eq!(c.sn(), Ok("ABC"));
        c.set_fr("é1234567890");
        assert_eq!(c.fr(), Ok("??123456"));
        c.fr = [0xFF; 8];
        assert_eq!(c.fr(), Err(DecodeError::NotAscii { field: "FR" }));
    }

    #[test]
    fn max_transfer_never_panics() {
        let mut c = sample_controller();
        c.set_mdts(0);
        assert_eq!(c.max_transfer_bytes(4096), None);
        c.set_mdts(5);
        assert_eq!(c.max_transfer_bytes(4096), Some(131_072));
        assert_eq!(c.max_transfer_bytes(65536), Some(2 * 1024 * 1024));
        c.set_mdts(200);
        assert_eq!(c.max_transfer_bytes(4096), None);
        c.set_mdts(52);
        assert_eq!(c.max_transfer_bytes(4096), None);
        c.set_mdts(51);
        assert_eq!(c.max_transfer_bytes(4096), Some(1 << 63));
        for mdts in 0..=255u8 {
            c.set_mdts(mdts);
            let _ = c.max_transfer_bytes(usize::MAX);
            let _ = c.max_transfer_bytes(0);
        }
    }

    fn sample_namespace() -> IdentifyNamespace {
        let mut n = IdentifyNamespace::new_zeroed();
        n.set_nsze(1 << 21);
        n.set_ncap(1 << 21);
        n.set_nuse(1 << 20);
        n.set_nlbaf(1);
        n.set_lbaf(0, LbaFormat::new(0, 9, 2)).unwrap();
        n.set_lbaf(1, LbaFormat::new(8, 12, 0)).unwrap();
        n.set_flbas(1);
        n
    }

    #[test]
    fn namespace() {
        let n = sample_namespace();
        let bytes = n.as_bytes();
        assert_eq!(&bytes[0..8], &(1u64 << 21).to_le_bytes());
        assert_eq!(bytes[25], 1);
        assert_eq!(bytes[26], 1);
        assert_eq!(&bytes[128..136], &[0, 0, 9, 2, 8, 0, 12, 0]);
        let p = IdentifyNamespace::parse(bytes).unwrap();
        assert_eq!(p.nsze(), 1 << 21);
        assert_eq!(p.ncap(), 1 << 21);
        assert_eq!(p.nuse(), 1 << 20);
        assert_eq!(p.nlbaf(), 1);
        assert_eq!(p.formatted_lba_index(), 1);
        assert!(!p.extended_metadata());
        let f = p.formatted_lba_format().unwrap();
        assert_eq!((f.ms(), f.lbads(), f.rp()), (8, 12, 0));
        assert_eq!(p.block_size(), Ok(4096));
        assert_eq!(p.size_bytes(), Ok(8 << 30));
        assert_eq!(p.lbaf(0), Some(LbaFormat::new(0, 9, 2)));
        assert_eq!(p.lbaf(2), None);
        let all: Vec<LbaFormat> = p.lba_formats().collect();
        assert_eq!(all, [LbaFormat::new(0, 9, 2), LbaFormat::new(8, 12, 0)]);
        assert_eq!(p.mc(), 0);
        assert_eq!(p.lbaf(64), None);
        let _ = std::format!("{p:?}");
    }

    #[test]
    fn flbas_beyond_nlbaf() {
        let mut n = sample_namespace();
        n.set_flbas(2);
        assert_eq!(n.formatted_lba_format(), Err(DecodeError::LbaFormatIndex { index: 2, nlbaf: 1 }));
        assert!(n.block_size().is_err());
        // Bits 6:5 are reserved (ignored) with 16 or fewer formats ...
        n.set_flbas(0x61);
        assert_eq!(n.formatted_lba_index(), 1);
        assert!(!n.extended_metadata());
        // ... and are index bits 5:4 with more.
        n.set_nlbaf(63);
        assert_eq!(n.formatted_lba_index(), 0x31);
        n.set_lbaf(0x31, LbaFormat::new(0, 9, 0)).unwrap();
        assert_eq!(n.block_size(), Ok(512));
        n.set_flbas(0x10);
        assert!(n.extended_metadata());
        assert!(n.set_lbaf(64, LbaFormat::default()).is_err());
        // NLBAF larger than the 64 entries does not panic.
        n.set_nlbaf(255);
        assert_eq!(n.lbaf(100), None);
        assert_eq!(n.lba_formats().count(), 64);
    }

    #[test]
    fn bad_lbads() {
        let mut n = sample_namespace();
        for lbads in [0u8, 8, 17, 40, 255] {
            n.set_lbaf(1, LbaFormat::new(0, lbads, 0)).unwrap();
            assert_eq!(n.block_size(), Err(DecodeError::LbaDataSize { lbads }));
            assert!(n.size_bytes().is_err());
        }
        for lbads in 9..=16u8 {
            n.set_lbaf(1, LbaFormat::new(0, lbads, 0)).unwrap();
            assert_eq!(n.block_size(), Ok(1 << lbads));
        }
        n.set_lbaf(1, LbaFormat::new(0, 16, 0)).unwrap();
        n.set_nsze(u64::MAX);
        assert!(matches!(n.size_bytes(), Err(DecodeError::InvalidValue { field: "NSZE", .. })));
    }

    #[test]
    fn active_namespace_list() {
        let mut buf = vec![0u8; 4096];
        for (i, nsid) in [1u32, 2, 7].iter().enumerate() {
            buf[i * 4..i * 4 + 4].copy_from_slice(&nsid.to_le_bytes());
        }
        buf[20] = 9; // after the terminating zero: ignored
        let list: Vec<u32> = parse_active_namespace_list(&buf).unwrap().collect();
        assert_eq!(list, [1, 2, 7]);
        let full: Vec<u8> = (1..=1024u32).flat_map(|n| n.to_le_bytes()).collect();
        assert_eq!(parse_active_namespace_list(&full).unwrap().count(), 1024);
    }
}
