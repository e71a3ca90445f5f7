//! Identify Controller data structure (NVMe Base 2.0, 5.17.2.1; Base 1.4, 5.15).

use super::{ascii_field, check_len, set_ascii_field, IDENTIFY_SIZE};
use crate::error::DecodeError;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

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
