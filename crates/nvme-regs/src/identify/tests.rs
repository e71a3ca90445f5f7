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
