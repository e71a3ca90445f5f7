use super::*;

#[test]
fn doorbells() {
    assert_eq!(sq_tail_doorbell(0, 2), 0x1000);
    assert_eq!(cq_head_doorbell(0, 2), 0x1010);
    assert_eq!(sq_tail_doorbell(3, 2), 0x1060);
    assert_eq!(cq_head_doorbell(3, 2), 0x1070);
    assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
    assert_eq!(cq_head_doorbell(1, 0), 0x100C);
    assert_eq!(doorbell_offset(1, true, 0), 0x100C);
    // Largest values do not overflow or panic.
    assert_eq!(doorbell_offset(u16::MAX, true, 0xFF), 0x1000 + (2 * 65535 + 1) * (4 << 15));
}

#[test]
fn cap_fields() {
    let cap = Cap(0)
        .with_mqes_z(0x3FF)
        .with_dstrd(2)
        .with_to_500ms(0x14)
        .with_mpsmin(0)
        .with_mpsmax(4)
        .with_css_nvm(true)
        .with_cqr(true);
    assert_eq!(cap.mqes_z(), 0x3FF);
    assert_eq!(cap.max_queue_entries(), 1024);
    assert!(cap.cqr());
    assert_eq!(cap.ams(), 0);
    assert_eq!(cap.to_500ms(), 0x14);
    assert_eq!(cap.timeout_ms(), 10_000);
    assert_eq!(cap.dstrd(), 2);
    assert_eq!(cap.doorbell_stride_bytes(), 16);
    assert!(!cap.nssrs());
    assert_eq!(cap.css(), 1);
    assert!(cap.css_nvm());
    assert!(!cap.bps());
    assert_eq!(cap.mpsmin(), 0);
    assert_eq!(cap.mpsmax(), 4);
    assert_eq!(cap.min_page_size(), 4096);
    assert_eq!(cap.max_page_size(), 65536);
    assert!(!cap.pmrs());
    assert!(!cap.cmbs());
    assert_eq!(cap.0, 0x0040_0022_1401_03FF);
    assert_eq!(Cap::from_halves(cap.lo(), cap.hi()), cap);
    assert_eq!(cap.lo(), 0x1401_03FF);
    assert_eq!(cap.hi(), 0x0040_0022);
    assert!(!cap.is_all_ones());
    assert!(Cap(u64::MAX).is_all_ones());
    // Masking.
    assert_eq!(Cap(0).with_dstrd(0xFF).dstrd(), 0xF);
    assert_eq!(Cap(u64::MAX).with_dstrd(0).0, !(0xFu64 << 32));
    assert_eq!(Cap(u64::MAX).max_page_size(), 1 << 27);
}

#[test]
fn vs() {
    assert_eq!(Vs::V1_4.mjr(), 1);
    assert_eq!(Vs::V1_4.mnr(), 4);
    assert_eq!(Vs::V1_4.ter(), 0);
    assert_eq!(Vs::V2_0.mjr(), 2);
    assert_eq!(Vs::new(2, 0, 0), Vs::V2_0);
    assert!(Vs::V1_4 < Vs::V2_0);
}

#[test]
fn cc_builder() {
    let cc = Cc(0).with_en(true).with_iosqes(6).with_iocqes(4).with_mps(0).with_css(Cc::CSS_NVM);
    assert_eq!(cc.0, 0x0046_0001);
    assert!(cc.en());
    assert_eq!(cc.iosqes(), 6);
    assert_eq!(cc.iocqes(), 4);
    assert_eq!(cc.page_size(), 4096);
    assert_eq!(cc.shn(), ShutdownNotification::None);
    let cc = cc.with_shn(ShutdownNotification::Normal).with_mps(1).with_ams(0b001);
    assert_eq!(cc.shn(), ShutdownNotification::Normal);
    assert_eq!((cc.0 >> 14) & 3, 1);
    assert_eq!(cc.mps(), 1);
    assert_eq!(cc.page_size(), 8192);
    assert_eq!(cc.ams(), 1);
    assert_eq!(cc.with_en(false).0 & 1, 0);
    assert_eq!(Cc(0).with_shn(ShutdownNotification::Abrupt).0, 0x8000);
    assert_eq!(Cc(0).with_css(Cc::CSS_ADMIN_ONLY).css(), 7);
}

#[test]
fn csts() {
    let c = Csts(0).with_rdy(true).with_shst(ShutdownStatus::Complete);
    assert!(c.rdy());
    assert!(!c.cfs());
    assert_eq!(c.shst(), ShutdownStatus::Complete);
    assert_eq!(c.0, 0b1001);
    assert!(Csts(0).with_cfs(true).cfs());
    assert!(Csts(0x10).nssro());
    assert!(Csts(0x20).pp());
    assert!(Csts(u32::MAX).is_all_ones());
    assert_eq!(Csts(0b0100).shst(), ShutdownStatus::Occurring);
    assert_eq!(Csts(0b1100).shst(), ShutdownStatus::Reserved);
}

#[test]
fn aqa() {
    let a = Aqa::new(31, 63);
    assert_eq!(a.0, 0x003F_001F);
    assert_eq!(a.asqs_z(), 31);
    assert_eq!(a.acqs_z(), 63);
    assert_eq!(a.asq_entries(), 32);
    assert_eq!(a.acq_entries(), 64);
    assert_eq!(Aqa::new(0xFFFF, 0xFFFF).0, 0x0FFF_0FFF);
}
