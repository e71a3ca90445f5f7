use super::*;
use crate::sqe::{Sqe, NSID_ALL};

#[test]
fn nlb_bounds() {
    assert_eq!(Nlb::from_blocks(0), None);
    assert_eq!(Nlb::from_blocks(65537), None);
    assert_eq!(Nlb::from_blocks(u32::MAX), None);
    let max = Nlb::from_blocks(65536).unwrap();
    assert_eq!(max.zero_based(), 0xFFFF);
    assert_eq!(max.blocks(), 65536);
    assert_eq!(max, Nlb::MAX);
    let one = Nlb::from_blocks(1).unwrap();
    assert_eq!(one.zero_based(), 0);
    assert_eq!(one, Nlb::ONE);
    for b in [1u32, 2, 8, 255, 256, 4096, 65535, 65536] {
        assert_eq!(Nlb::from_blocks(b).unwrap().blocks(), b);
    }
}

#[test]
fn read() {
    let sqe = Read::new(1, 0x1_2345_6789, Nlb::from_blocks(8).unwrap()).build();
    assert_eq!(sqe.opcode(), 2);
    assert_eq!(sqe.nsid, 1);
    assert_eq!(sqe.cdw10, 0x2345_6789);
    assert_eq!(sqe.cdw11, 1);
    assert_eq!(sqe.cdw12, 7);
    assert_eq!(sqe.cid(), 0);
    assert_eq!((sqe.prp1, sqe.prp2), (0, 0));
    assert_eq!(sqe.slba(), 0x1_2345_6789);
    assert_eq!(sqe.nlb().blocks(), 8);
    assert!(!sqe.fua() && !sqe.limited_retry());
    let sqe = Read::new(1, 0, Nlb::ONE).fua(true).limited_retry(true).build();
    assert_eq!(sqe.cdw12, 0xC000_0000);
    assert!(sqe.fua() && sqe.limited_retry());
}

#[test]
fn write_flush_zeroes() {
    let sqe = Write::new(2, u64::MAX, Nlb::MAX).fua(true).build();
    assert_eq!(sqe.opcode(), nvm_opcode::WRITE);
    assert_eq!((sqe.cdw10, sqe.cdw11), (u32::MAX, u32::MAX));
    assert_eq!(sqe.cdw12, 0x4000_FFFF);
    assert_eq!(sqe.slba(), u64::MAX);
    assert_eq!(sqe.nlb().blocks(), 65536);
    let f = Flush::new(1).build();
    assert_eq!(f, Sqe::new(nvm_opcode::FLUSH, 1));
    let z = WriteZeroes::new(1, 10, Nlb::from_blocks(2).unwrap()).deallocate(true).build();
    assert_eq!(z.opcode(), 0x08);
    assert_eq!(z.cdw12, 1 | 1 << 25);
    assert!(z.deac() && !z.fua());
    let z = WriteZeroes::new(1, 10, Nlb::ONE).fua(true).build();
    assert_eq!(z.cdw12, 1 << 30);
}

#[test]
fn dataset_management() {
    assert_eq!(DatasetManagement::new(1, 0), None);
    assert_eq!(DatasetManagement::new(1, 257), None);
    let d = DatasetManagement::new(1, 256).unwrap().deallocate(true).build();
    assert_eq!(d.opcode(), 0x09);
    assert_eq!(d.cdw10, 0xFF);
    assert_eq!(d.cdw11, 1 << 2);
    assert_eq!(d.dsm_ranges(), 256);
    let d = DatasetManagement::new(1, 1).unwrap().integral_read(true).integral_write(true).build();
    assert_eq!(d.cdw10, 0);
    assert_eq!(d.cdw11, 3);
    assert_eq!(d.dsm_ranges(), 1);
    let r = DsmRange::new(0x10, 8);
    assert_eq!(zerocopy::IntoBytes::as_bytes(&r), &[0, 0, 0, 0, 8, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn create_queues() {
    let cq = CreateIoCq::new(3, 64).build();
    assert_eq!(cq.opcode(), 0x05);
    assert_eq!(cq.cdw10, (63 << 16) | 3);
    assert_eq!(cq.cdw11 & 1, 1);
    assert_eq!(cq.cdw11, 1);
    let f = CreateQueueFields::from_sqe(&cq);
    assert_eq!(f, CreateQueueFields { qid: 3, entries: 64, cqid: 0, qprio: 0, pc: true, ien: false, iv: 0 });
    let cq = CreateIoCq::new(1, 65536).interrupt_vector(5).interrupts_enabled(true).build();
    assert_eq!(cq.cdw10, 0xFFFF_0001);
    assert_eq!(cq.cdw11, 5 << 16 | 0b11);
    let f = CreateQueueFields::from_sqe(&cq);
    assert_eq!((f.entries, f.ien, f.iv, f.pc), (65536, true, 5, true));
    // Out-of-range sizes encode as the invalid QSIZE 0.
    for bad in [0u32, 1, 65537, 131073, u32::MAX] {
        assert_eq!(CreateIoCq::new(1, bad).build().cdw10 >> 16, 0);
        assert_eq!(CreateIoSq::new(1, bad, 1).build().cdw10 >> 16, 0);
    }
    let sq = CreateIoSq::new(2, 1024, 7).priority(0xFF).build();
    assert_eq!(sq.opcode(), 0x01);
    assert_eq!(sq.cdw10, (1023 << 16) | 2);
    assert_eq!(sq.cdw11, 7 << 16 | 3 << 1 | 1);
    let f = CreateQueueFields::from_sqe(&sq);
    assert_eq!(
        f,
        CreateQueueFields { qid: 2, entries: 1024, cqid: 7, qprio: 3, pc: true, ien: false, iv: 0 }
    );
    let d = DeleteIoSq::new(9).build();
    assert_eq!((d.opcode(), d.cdw10), (0x00, 9));
    let d = DeleteIoCq::new(9).build();
    assert_eq!((d.opcode(), d.cdw10), (0x04, 9));
}

#[test]
fn identify() {
    let s = Identify::new(Cns::Controller).build();
    assert_eq!((s.opcode(), s.nsid, s.cdw10), (0x06, 0, 1));
    let s = Identify::new(Cns::Namespace).nsid(1).cntid(0x12).build();
    assert_eq!((s.nsid, s.cdw10), (1, 0x0012_0000));
    assert_eq!(Cns::from_raw(2), Some(Cns::ActiveNamespaceList));
    assert_eq!(Cns::from_raw(3), None);
}

#[test]
fn features() {
    let s = SetFeatures::number_of_queues(4, 4).unwrap().build();
    assert_eq!(s.opcode(), 0x09);
    assert_eq!(s.cdw10, 7);
    assert_eq!(s.cdw11, 0x0003_0003);
    assert_eq!(SetFeatures::number_of_queues(0, 4), None);
    assert_eq!(SetFeatures::number_of_queues(4, 0), None);
    let s = SetFeatures::number_of_queues(u16::MAX, 1).unwrap().build();
    assert_eq!(s.cdw11, 0xFFFE);
    let s = SetFeatures::volatile_write_cache(true).save(true).build();
    assert_eq!((s.cdw10, s.cdw11), (0x8000_0006, 1));
    let g = GetFeatures::new(feature_id::ARBITRATION).select(0xFF).cdw11(9).build();
    assert_eq!((g.opcode(), g.cdw10, g.cdw11), (0x0A, 0x701, 9));
}

#[test]
fn get_log_page() {
    let s = GetLogPage::new(log_id::SMART_HEALTH, 128).build();
    assert_eq!(s.opcode(), 0x02);
    assert_eq!(s.nsid, NSID_ALL);
    assert_eq!(s.cdw10, 127 << 16 | 2);
    assert_eq!(s.cdw11, 0);
    assert_eq!(s.log_page_dwords(), 128);
    let s = GetLogPage::new(log_id::ERROR_INFORMATION, 0x12_3457)
        .nsid(1)
        .retain_async_event(true)
        .offset_bytes(0x1_0000_0040)
        .build();
    assert_eq!(s.nsid, 1);
    assert_eq!(s.cdw10, 0x3456 << 16 | 1 << 15 | 1);
    assert_eq!(s.cdw11, 0x12);
    assert_eq!((s.cdw12, s.cdw13), (0x40, 1));
    assert_eq!(s.log_page_dwords(), 0x12_3457);
    assert_eq!(s.log_page_offset(), 0x1_0000_0040);
    assert_eq!(GetLogPage::new(1, u32::MAX).build().log_page_dwords(), u32::MAX as u64);
    assert_eq!(GetLogPage::new(1, 0).build().log_page_dwords(), 1);
}

#[test]
fn misc_admin() {
    let a = Abort::new(3, 0x55).build();
    assert_eq!((a.opcode(), a.cdw10), (0x08, 0x0055_0003));
    assert_eq!(AsyncEventRequest::new().build(), Sqe::new(0x0C, 0));
}
