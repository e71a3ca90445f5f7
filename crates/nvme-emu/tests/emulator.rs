//! Driver-level tests of the emulator: raw registers, queues in DMA
//! buffers, commands and their statuses.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use nvm_queue::{DmaBuffer, NvmeDevice};
use nvme_emu::{BackingSpec, Emulator, EmulatorConfig, NamespaceSpec, TimingModel, IOVA_BASE};
use nvme_regs::registers::offset;
use nvme_regs::status::{command_specific as csc, generic as gsc};
use nvme_regs::{IdentifyController, IdentifyNamespace, ShutdownNotification, ShutdownStatus, Sqe, Status};

#[test]
fn enable_sets_rdy_and_reset_clears_it() {
    let h = Harness::start(config("en"));
    assert_eq!(h.dev.name(), "emu:en");
    let c = csts(&*h.dev);
    assert!(c.rdy() && !c.cfs());
    h.write_cc(cc_enable().with_en(false));
    assert!(h.wait_csts(|c| !c.rdy()).is_some());
    // Enable again after reset.
    h.program_admin();
    h.write_cc(cc_enable());
    assert!(h.wait_csts(|c| c.rdy()).is_some());
}

#[test]
fn bad_enable_sets_cfs() {
    let emu = Emulator::start(config("cfs")).unwrap();
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let admin = Queue::new(&dev, 0, 8, 8);
    let h = Harness { emu, dev, admin, dstrd: 0 };
    h.program_admin();
    h.write_cc(cc_enable().with_iosqes(7));
    assert!(h.wait_csts(|c| c.cfs()).is_some(), "CFS not set for IOSQES 7");
    assert!(!csts(&*h.dev).rdy());
    h.write_cc(cc_enable().with_en(false));
    assert!(h.wait_csts(|c| !c.cfs()).is_some(), "EN 0 clears CFS");
    // MPS beyond MPSMAX.
    h.write_cc(cc_enable().with_mps(5));
    assert!(h.wait_csts(|c| c.cfs()).is_some());
    h.write_cc(cc_enable().with_en(false));
    assert!(h.wait_csts(|c| !c.cfs()).is_some());
    // Misaligned ASQ.
    h.dev.bar0().write64(offset::ASQ, h.admin.sq.device_addr(0).unwrap() + 64).unwrap();
    h.write_cc(cc_enable());
    assert!(h.wait_csts(|c| c.cfs()).is_some());
}

#[test]
fn identify_contents() {
    let mut cfg = config("id");
    cfg.serial = "SN-123".into();
    cfg.model = "Model X".into();
    let mut h = Harness::start(cfg);
    let buf = DmaBuffer::new(&h.dev, 4096).unwrap();
    let c = h.admin(identify(1, 0, buf.device_addr(0).unwrap()));
    assert_eq!(c.status(), Status::SUCCESS);
    let mut bytes = vec![0u8; 4096];
    buf.read_bytes(0, &mut bytes).unwrap();
    let id = IdentifyController::parse(&bytes).unwrap();
    assert_eq!(id.vid(), nvme_emu::VENDOR_ID);
    assert_eq!(id.sn().unwrap().trim_end(), "SN-123");
    assert_eq!(id.mn().unwrap().trim_end(), "Model X");
    assert_eq!(id.mdts(), 5);
    assert_eq!(id.cntlid(), 1);
    assert_eq!(id.ver(), 0x0001_0400);
    assert_eq!(id.sqes(), 0x66);
    assert_eq!(id.cqes(), 0x44);
    assert_eq!(id.nn(), 2);
    assert_eq!(id.oncs() & 0x0C, 0x0C);
    assert_eq!(id.vwc(), 0);

    // Namespace 2: 4096 blocks of 512 bytes; PRP1 with an offset.
    let c = h.admin(identify(0, 2, buf.device_addr(0).unwrap()));
    assert_eq!(c.status(), Status::SUCCESS);
    buf.read_bytes(0, &mut bytes).unwrap();
    let ns = IdentifyNamespace::parse(&bytes).unwrap();
    assert_eq!(ns.nsze(), 4096);
    assert_eq!(ns.ncap(), 4096);
    assert_eq!(ns.block_size().unwrap(), 512);
    let c = h.admin(identify(0, 1, buf.device_addr(0).unwrap()));
    assert_eq!(c.status(), Status::SUCCESS);
    buf.read_bytes(0, &mut bytes).unwrap();
    assert_eq!(IdentifyNamespace::parse(&bytes).unwrap().block_size().unwrap(), 4096);

    // Invalid NSIDs and CNS.
    for nsid in [0, 3, 0xFFFF_FFFF] {
        let c = h.admin(identify(0, nsid, buf.device_addr(0).unwrap()));
        assert_eq!(c.status(), generic(gsc::INVALID_NAMESPACE_OR_FORMAT), "nsid {nsid:#x}");
    }
    let c = h.admin(identify(0x55, 0, buf.device_addr(0).unwrap()));
    assert_eq!(c.status(), generic(gsc::INVALID_FIELD));

    // Active namespace list after NSID 1.
    let c = h.admin(identify(2, 1, buf.device_addr(0).unwrap()));
    assert_eq!(c.status(), Status::SUCCESS);
    buf.read_bytes(0, &mut bytes).unwrap();
    assert_eq!(&bytes[0..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn write_then_read_with_prp_list() {
    let mut h = Harness::start(config("rw"));
    let mut q = h.create_io(1, 16);
    // 3 blocks starting 0x200 into the first page: 4 pages, so PRP2 is a
    // list of 3 entries.
    let data = DmaBuffer::new(&h.dev, 4 * PAGE).unwrap();
    let list = DmaBuffer::new(&h.dev, PAGE).unwrap();
    for i in 1..4 {
        list.store_u64((i - 1) * 8, data.device_addr(i * PAGE).unwrap(), Ordering::Relaxed).unwrap();
    }
    let payload = pattern(3 * PAGE, 7);
    data.write_bytes(0x200, &payload).unwrap();
    let prp1 = data.device_addr(0x200).unwrap();
    let prp2 = list.device_addr(0).unwrap();
    let c = h.submit_on(&mut q, rw(0x01, 1, 10, 3, prp1, prp2));
    assert_eq!(c.status(), Status::SUCCESS);
    data.fill(0);
    let c = h.submit_on(&mut q, rw(0x02, 1, 10, 3, prp1, prp2));
    assert_eq!(c.status(), Status::SUCCESS);
    let mut back = vec![0u8; 3 * PAGE];
    data.read_bytes(0x200, &mut back).unwrap();
    assert!(back == payload, "read back differs");
    // Nothing outside the transfer was touched.
    let mut head = vec![0u8; 0x200];
    data.read_bytes(0, &mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0));
    // Read the middle block alone into a fresh page.
    let one = DmaBuffer::new(&h.dev, PAGE).unwrap();
    let c = h.submit_on(&mut q, rw(0x02, 1, 11, 1, one.device_addr(0).unwrap(), 0));
    assert_eq!(c.status(), Status::SUCCESS);
    let mut blk = vec![0u8; PAGE];
    one.read_bytes(0, &mut blk).unwrap();
    assert!(blk[..] == payload[PAGE..2 * PAGE]);
    // Flush (no volatile cache) and Flush to all namespaces.
    assert_eq!(h.submit_on(&mut q, Sqe::new(0x00, 1)).status(), Status::SUCCESS);
    assert_eq!(h.submit_on(&mut q, Sqe::new(0x00, 0xFFFF_FFFF)).status(), Status::SUCCESS);
    let s = wait_for(|| Some(h.emu.stats()).filter(|s| s.media_bytes_read >= 4 * PAGE as u64)).unwrap();
    assert_eq!(s.media_bytes_written, 3 * PAGE as u64);
    assert_eq!(s.dma_faults, 0);
    // SQHD follows the SQ head.
    let c = h.submit_on(&mut q, Sqe::new(0x00, 1));
    assert_eq!(u32::from(c.sqhd), q.sq_tail);
}

#[test]
fn queue_creation_errors() {
    let mut cfg = config("qerr");
    cfg.io_queues = 2;
    cfg.mqes = 63;
    let mut h = Harness::start(cfg);
    let q = Queue::new(&h.dev, 1, 64, 64);
    let cq = q.cq.device_addr(0).unwrap();
    let sq = q.sq.device_addr(0).unwrap();
    let iqi = specific(csc::INVALID_QUEUE_IDENTIFIER);
    assert_eq!(h.admin(create_cq(0, 16, cq)).status(), iqi);
    assert_eq!(h.admin(create_cq(3, 16, cq)).status(), iqi);
    assert_eq!(h.admin(create_cq(1, 65, cq)).status(), specific(csc::INVALID_QUEUE_SIZE));
    assert_eq!(h.admin(create_cq(1, 1, cq)).status(), specific(csc::INVALID_QUEUE_SIZE));
    let mut pc0 = create_cq(1, 16, cq);
    pc0.cdw11 = 0;
    assert_eq!(h.admin(pc0).status(), generic(gsc::INVALID_FIELD));
    assert_eq!(h.admin(create_cq(1, 16, cq + 512)).status(), generic(gsc::INVALID_FIELD));
    assert_eq!(h.admin(create_sq(1, 16, sq, 1)).status(), specific(csc::COMPLETION_QUEUE_INVALID));
    assert_eq!(h.admin(create_sq(1, 16, sq, 0)).status(), specific(csc::COMPLETION_QUEUE_INVALID));
    assert_eq!(h.admin(create_cq(1, 64, cq)).status(), Status::SUCCESS);
    assert_eq!(h.admin(create_cq(1, 64, cq)).status(), iqi, "CQ 1 exists");
    assert_eq!(h.admin(create_sq(3, 16, sq, 1)).status(), iqi);
    assert_eq!(h.admin(create_sq(1, 64, sq, 1)).status(), Status::SUCCESS);
    assert_eq!(h.admin(create_sq(1, 64, sq, 1)).status(), iqi, "SQ 1 exists");
    let mut del_cq = Sqe::new(0x04, 0);
    del_cq.cdw10 = 1;
    assert_eq!(h.admin(del_cq).status(), specific(csc::INVALID_QUEUE_DELETION));
    // Number of Queues cannot change once I/O queues exist.
    let mut nq = Sqe::new(0x09, 0);
    nq.cdw10 = 0x07;
    assert_eq!(h.admin(nq).status(), generic(gsc::COMMAND_SEQUENCE_ERROR));
    let mut del_sq = Sqe::new(0x00, 0);
    del_sq.cdw10 = 1;
    assert_eq!(h.admin(del_sq).status(), Status::SUCCESS);
    assert_eq!(h.admin(del_sq).status(), iqi, "already deleted");
    assert_eq!(h.admin(del_cq).status(), Status::SUCCESS);
    assert_eq!(h.admin(del_cq).status(), iqi);
    let mut del_admin = Sqe::new(0x04, 0);
    del_admin.cdw10 = 0;
    assert_eq!(h.admin(del_admin).status(), iqi);
    drop(q);
}

#[test]
fn features_logs_and_misc_admin() {
    let mut cfg = config("feat");
    cfg.io_queues = 4;
    let mut h = Harness::start(cfg);
    let mut nq = Sqe::new(0x09, 0);
    nq.cdw10 = 0x07;
    nq.cdw11 = 7 | 1 << 16; // 8 SQs, 2 CQs requested
    let c = h.admin(nq);
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(c.dw0, 3 | 1 << 16, "min(requested, 4), zero-based");
    nq.cdw11 = 0xFFFF;
    assert_eq!(h.admin(nq).status(), generic(gsc::INVALID_FIELD));
    let mut gf = Sqe::new(0x0A, 0);
    gf.cdw10 = 0x07;
    assert_eq!(h.admin(gf).dw0, 3 | 1 << 16);
    gf.cdw10 = 0x06;
    let c = h.admin(gf);
    assert_eq!((c.status(), c.dw0), (Status::SUCCESS, 0));
    gf.cdw10 = 0x42;
    assert_eq!(h.admin(gf).status(), generic(gsc::INVALID_FIELD));
    // Only 2 CQs granted.
    let q = Queue::new(&h.dev, 3, 4, 4);
    assert_eq!(
        h.admin(create_cq(3, 4, q.cq.device_addr(0).unwrap())).status(),
        specific(csc::INVALID_QUEUE_IDENTIFIER)
    );

    // SMART log, 512 bytes, with NUMD larger than the log: rest zeroed.
    let buf = DmaBuffer::new(&h.dev, 2 * PAGE).unwrap();
    buf.fill(0xAA);
    let mut glp = Sqe::new(0x02, 0xFFFF_FFFF);
    glp.prp1 = buf.device_addr(0).unwrap();
    glp.cdw10 = 0x02 | (1024 - 1) << 16;
    assert_eq!(h.admin(glp).status(), Status::SUCCESS);
    let mut log = vec![0u8; PAGE];
    buf.read_bytes(0, &mut log).unwrap();
    assert_eq!(log[3], 100, "available spare");
    assert!(log[512..].iter().all(|&b| b == 0));
    let mut after = [0u8; 1];
    buf.read_bytes(PAGE, &mut after).unwrap();
    assert_eq!(after[0], 0xAA, "nothing beyond NUMD");
    glp.cdw10 = 0x01 | (16 - 1) << 16;
    assert_eq!(h.admin(glp).status(), Status::SUCCESS);
    glp.cdw10 = 0x7F;
    assert_eq!(h.admin(glp).status(), specific(csc::INVALID_LOG_PAGE));

    let c = h.admin(Sqe::new(0x08, 0));
    assert_eq!((c.status(), c.dw0 & 1), (Status::SUCCESS, 1), "Abort: not aborted");
    assert_eq!(h.admin(Sqe::new(0x80, 0)).status(), generic(gsc::INVALID_OPCODE));
    assert_eq!(h.admin(Sqe::new(0xC1, 0)).status(), generic(gsc::INVALID_OPCODE));
    let mut fused = Sqe::new(0x06, 0);
    fused.cdw0 |= 1 << 8;
    assert_eq!(h.admin(fused).status(), generic(gsc::INVALID_FIELD));
    let s = wait_for(|| Some(h.emu.stats()).filter(|s| s.commands >= 12)).unwrap();
    assert_eq!(s.admin_commands, s.commands);
}

#[test]
fn io_validation_errors() {
    let mut h = Harness::start(config("ioerr"));
    let mut q = h.create_io(1, 8);
    let buf = DmaBuffer::new(&h.dev, 2 * PAGE).unwrap();
    let a = buf.device_addr(0).unwrap();
    // LBA out of range: NS 1 has 1024 blocks.
    assert_eq!(h.submit_on(&mut q, rw(0x02, 1, 1023, 2, a, 0)).status(), generic(gsc::LBA_OUT_OF_RANGE));
    assert_eq!(h.submit_on(&mut q, rw(0x02, 1, u64::MAX, 1, a, 0)).status(), generic(gsc::LBA_OUT_OF_RANGE));
    assert_eq!(h.submit_on(&mut q, rw(0x02, 1, 1023, 1, a, 0)).status(), Status::SUCCESS);
    // Invalid NSIDs.
    for nsid in [0, 3, 0xFFFF_FFFF] {
        assert_eq!(
            h.submit_on(&mut q, rw(0x02, nsid, 0, 1, a, 0)).status(),
            generic(gsc::INVALID_NAMESPACE_OR_FORMAT)
        );
    }
    // Beyond MDTS (128 KiB = 32 blocks).
    assert_eq!(h.submit_on(&mut q, rw(0x02, 1, 0, 33, a, 0)).status(), generic(gsc::INVALID_FIELD));
    // Unknown opcode, SGL.
    assert_eq!(h.submit_on(&mut q, Sqe::new(0x05, 1)).status(), generic(gsc::INVALID_OPCODE));
    let mut sgl = rw(0x02, 1, 0, 1, a, 0);
    sgl.cdw0 |= 1 << 14;
    assert_eq!(h.submit_on(&mut q, sgl).status(), generic(gsc::INVALID_FIELD));
    // PRP1 not dword aligned.
    assert_eq!(h.submit_on(&mut q, rw(0x02, 1, 0, 1, a + 2, 0)).status(), generic(gsc::PRP_OFFSET_INVALID));
    // PRP2 data pointer with an offset.
    assert_eq!(
        h.submit_on(&mut q, rw(0x02, 1, 0, 1, a + 0x200, a + PAGE as u64 + 8)).status(),
        generic(gsc::PRP_OFFSET_INVALID)
    );
    assert_eq!(h.emu.stats().dma_faults, 0);
    // Unmapped PRP1, PRP2 into the guard page, an address below the IOVA base.
    for (p1, p2) in [(0x10_0000u64, 0), (a + 0x200, a + 2 * PAGE as u64), (IOVA_BASE - PAGE as u64, 0)] {
        let c = h.submit_on(&mut q, rw(0x02, 1, 0, 1, p1, p2));
        assert_eq!(c.status(), generic(gsc::DATA_TRANSFER_ERROR), "prp {p1:#x} {p2:#x}");
    }
    assert_eq!(h.emu.stats().dma_faults, 3);
    // A buffer that was unmapped is no longer reachable.
    let gone = DmaBuffer::new(&h.dev, PAGE).unwrap();
    let g = gone.device_addr(0).unwrap();
    drop(gone);
    assert_eq!(h.submit_on(&mut q, rw(0x01, 1, 0, 1, g, 0)).status(), generic(gsc::DATA_TRANSFER_ERROR));
    assert_eq!(h.emu.stats().dma_faults, 4);
    // The controller is still healthy.
    assert_eq!(h.submit_on(&mut q, rw(0x02, 1, 0, 1, a, 0)).status(), Status::SUCCESS);
    assert!(!csts(&*h.dev).cfs());
}

#[test]
fn invalid_doorbells_are_counted_and_ignored() {
    let mut h = Harness::start(config("db"));
    let mut q = h.create_io(1, 8);
    h.ring_sq(1, 8);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().doorbell_violations == 1)).is_some());
    h.ring_cq(1, 100);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().doorbell_violations == 2)).is_some());
    // CQ head beyond the posted entries.
    h.ring_cq(1, 3);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().doorbell_violations == 3)).is_some());
    std::thread::sleep(Duration::from_millis(5));
    assert!(q.peek().is_none(), "no command was fetched");
    h.ring_cq(1, 0);
    // Normal operation continues.
    assert_eq!(h.submit_on(&mut q, Sqe::new(0x00, 1)).status(), Status::SUCCESS);
    assert_eq!(h.emu.stats().doorbell_violations, 3);
}

#[test]
fn full_cq_stalls_until_head_moves() {
    let mut h = Harness::start(config("cqfull"));
    let mut q = Queue::new(&h.dev, 1, 16, 4);
    assert_eq!(h.admin(create_cq(1, 4, q.cq.device_addr(0).unwrap())).status(), Status::SUCCESS);
    assert_eq!(h.admin(create_sq(1, 16, q.sq.device_addr(0).unwrap(), 1)).status(), Status::SUCCESS);
    for _ in 0..6 {
        q.push(Sqe::new(0x00, 1));
    }
    h.ring_sq(1, q.sq_tail);
    let _ = wait_for(|| Some(()).filter(|_| h.emu.stats().commands >= 3 + 2));
    std::thread::sleep(Duration::from_millis(10));
    let mut got = Vec::new();
    while let Some(c) = q.pop() {
        got.push(c.cid);
    }
    assert_eq!(got, [0, 1, 2], "a 4-entry CQ holds 3 completions");
    assert!(q.peek().is_none());
    h.ring_cq(1, q.cq_head);
    for want in 3..6 {
        let c = wait_for(|| q.pop()).expect("stalled completion posted after the head moved");
        assert_eq!(c.cid, want);
        assert!(c.status().is_success());
    }
    h.ring_cq(1, q.cq_head);
}

#[test]
fn write_zeroes_and_deallocate() {
    let mut h = Harness::start(config("wz"));
    let mut q = h.create_io(1, 8);
    let data = DmaBuffer::new(&h.dev, 4 * PAGE).unwrap();
    let a = data.device_addr(0).unwrap();
    let ones = vec![0xFFu8; 4 * PAGE];
    data.write_bytes(0, &ones).unwrap();
    let list = DmaBuffer::new(&h.dev, PAGE).unwrap();
    for i in 1..4 {
        list.store_u64((i - 1) * 8, data.device_addr(i * PAGE).unwrap(), Ordering::Relaxed).unwrap();
    }
    let l = list.device_addr(0).unwrap();
    assert!(h.submit_on(&mut q, rw(0x01, 1, 100, 4, a, l)).status().is_success());
    // Write Zeroes block 101, deallocate block 103 (DSM, AD).
    assert!(h.submit_on(&mut q, rw(0x08, 1, 101, 1, 0, 0)).status().is_success());
    let ranges = DmaBuffer::new(&h.dev, PAGE).unwrap();
    let mut r = [0u8; 32];
    r[4..8].copy_from_slice(&1u32.to_le_bytes());
    r[8..16].copy_from_slice(&103u64.to_le_bytes());
    r[20..24].copy_from_slice(&0u32.to_le_bytes()); // empty range
    r[24..32].copy_from_slice(&5u64.to_le_bytes());
    ranges.write_bytes(0, &r).unwrap();
    let mut dsm = Sqe::new(0x09, 1);
    dsm.prp1 = ranges.device_addr(0).unwrap();
    dsm.cdw10 = 1; // 2 ranges
    dsm.cdw11 = 1 << 2;
    assert!(h.submit_on(&mut q, dsm).status().is_success());
    data.fill(0x55);
    assert!(h.submit_on(&mut q, rw(0x02, 1, 100, 4, a, l)).status().is_success());
    let mut back = vec![0u8; 4 * PAGE];
    data.read_bytes(0, &mut back).unwrap();
    for (blk, want) in [(0, 0xFF), (1, 0), (2, 0xFF), (3, 0)] {
        assert!(back[blk * PAGE..(blk + 1) * PAGE].iter().all(|&b| b == want), "block {blk}");
    }
    // Out-of-range DSM range fails and changes nothing.
    r[8..16].copy_from_slice(&1024u64.to_le_bytes());
    ranges.write_bytes(0, &r).unwrap();
    assert_eq!(h.submit_on(&mut q, dsm).status(), generic(gsc::LBA_OUT_OF_RANGE));
    assert_eq!(h.submit_on(&mut q, rw(0x08, 1, 1000, 100, 0, 0)).status(), generic(gsc::LBA_OUT_OF_RANGE));
}

#[test]
fn small_block_namespace() {
    let mut h = Harness::start(config("512"));
    let mut q = h.create_io(1, 8);
    let data = DmaBuffer::new(&h.dev, 2 * PAGE).unwrap();
    let payload = pattern(9 * 512, 3);
    data.write_bytes(0x600, &payload).unwrap();
    let (p1, p2) = (data.device_addr(0x600).unwrap(), data.device_addr(PAGE).unwrap());
    assert!(h.submit_on(&mut q, rw(0x01, 2, 4087, 9, p1, p2)).status().is_success());
    assert_eq!(h.submit_on(&mut q, rw(0x01, 2, 4088, 9, p1, p2)).status(), generic(gsc::LBA_OUT_OF_RANGE));
    data.fill(0);
    assert!(h.submit_on(&mut q, rw(0x02, 2, 4087, 9, p1, p2)).status().is_success());
    let mut back = vec![0u8; 9 * 512];
    data.read_bytes(0x600, &mut back).unwrap();
    assert!(back == payload);
}

#[test]
fn file_backing_persists() {
    let path = std::env::temp_dir().join(format!("nvme-emu-test-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let payload = pattern(2 * PAGE, 9);
    for round in 0..2 {
        let mut cfg = config("file");
        cfg.backing = BackingSpec::File(path.clone());
        let mut h = Harness::start(cfg);
        let mut q = h.create_io(1, 8);
        let data = DmaBuffer::new(&h.dev, 2 * PAGE).unwrap();
        let (p1, p2) = (data.device_addr(0).unwrap(), data.device_addr(PAGE).unwrap());
        if round == 0 {
            data.write_bytes(0, &payload).unwrap();
            assert!(h.submit_on(&mut q, rw(0x01, 1, 1022, 2, p1, p2)).status().is_success());
            // Namespace 2 (512-byte blocks) lies behind namespace 1.
            assert!(h.submit_on(&mut q, rw(0x01, 2, 0, 8, p1, 0)).status().is_success());
        } else {
            assert!(h.submit_on(&mut q, rw(0x02, 1, 1022, 2, p1, p2)).status().is_success());
            let mut back = vec![0u8; 2 * PAGE];
            data.read_bytes(0, &mut back).unwrap();
            assert!(back == payload);
            assert!(h.submit_on(&mut q, rw(0x08, 1, 1023, 1, 0, 0)).status().is_success());
            assert!(h.submit_on(&mut q, rw(0x02, 1, 1022, 2, p1, p2)).status().is_success());
            data.read_bytes(0, &mut back).unwrap();
            assert!(back[..PAGE] == payload[..PAGE] && back[PAGE..].iter().all(|&b| b == 0));
        }
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1024 * 4096 + 4096 * 512);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn null_backing_validates_without_moving_data() {
    let mut cfg = config("null");
    cfg.backing = BackingSpec::Null;
    let mut h = Harness::start(cfg);
    let mut q = h.create_io(1, 8);
    // PRPs are not walked: an unmapped buffer still succeeds.
    assert!(h.submit_on(&mut q, rw(0x02, 1, 0, 8, 0x1000, 0)).status().is_success());
    assert_eq!(h.submit_on(&mut q, rw(0x02, 1, 1024, 1, 0x1000, 0)).status(), generic(gsc::LBA_OUT_OF_RANGE));
    assert_eq!(h.emu.stats().dma_faults, 0);
}

#[test]
fn timing_model_delays_completions() {
    let mut cfg = config("timing");
    cfg.timing = Some(TimingModel {
        latency: Duration::from_millis(3),
        bandwidth_bytes_per_s: None,
        iops: Some(1000),
    });
    let mut h = Harness::start(cfg);
    let mut q = h.create_io(1, 8);
    let data = DmaBuffer::new(&h.dev, PAGE).unwrap();
    let t = Instant::now();
    for _ in 0..3 {
        q.push(rw(0x02, 1, 0, 1, data.device_addr(0).unwrap(), 0));
    }
    h.ring_sq(1, q.sq_tail);
    for _ in 0..3 {
        assert!(wait_for(|| q.pop()).unwrap().status().is_success());
    }
    // 3 commands at 1 ms each on one channel, plus 3 ms latency.
    assert!(t.elapsed() >= Duration::from_millis(6), "{:?}", t.elapsed());
}

#[test]
fn shutdown_sets_shst_complete() {
    let mut h = Harness::start(config("shn"));
    let mut q = h.create_io(1, 8);
    assert!(h.submit_on(&mut q, Sqe::new(0x00, 1)).status().is_success());
    h.write_cc(cc_enable().with_shn(ShutdownNotification::Normal));
    assert!(h.wait_csts(|c| c.shst() == ShutdownStatus::Complete).is_some());
    // No more commands are fetched.
    q.push(Sqe::new(0x00, 1));
    h.ring_sq(1, q.sq_tail);
    std::thread::sleep(Duration::from_millis(5));
    assert!(q.peek().is_none());
    h.write_cc(cc_enable().with_en(false));
    let c = h.wait_csts(|c| !c.rdy()).unwrap();
    assert_eq!(c.shst(), ShutdownStatus::Normal);
}

#[test]
fn config_is_validated_and_kept() {
    let mut cfg = EmulatorConfig::new("v", vec![NamespaceSpec::new(8, 1000)]);
    assert!(Emulator::start(cfg.clone()).is_err());
    cfg.namespaces[0].block_size = 512;
    let emu = Emulator::start(cfg.clone()).unwrap();
    assert_eq!(emu.config(), &cfg);
    assert_eq!(emu.bar0().len(), 0x2000);
}

#[test]
fn fuzz_random_commands() {
    let mut cfg = config("fuzz");
    cfg.namespaces = vec![NamespaceSpec::new(256, 4096), NamespaceSpec::new(512, 512)];
    let mut h = Harness::start(cfg);
    let mut q = h.create_io(1, 32);
    let scratch = DmaBuffer::new(&h.dev, 8 * PAGE).unwrap();
    let base = scratch.device_addr(0).unwrap();
    let mut rng = Rng(0x5EED);
    let fill = |rng: &mut Rng| {
        // Random bytes, with many qwords that are valid page addresses so
        // PRP lists and DSM ranges are sometimes meaningful.
        for i in 0..(8 * PAGE / 8) {
            let v = match rng.below(4) {
                0 => base + rng.below(8) * PAGE as u64,
                1 => rng.below(300),
                _ => rng.next(),
            };
            scratch.store_u64(i * 8, v, Ordering::Relaxed).unwrap();
        }
    };
    let prp = |rng: &mut Rng| match rng.below(5) {
        0 => 0,
        1 => rng.next(),
        2 => base + rng.below(8 * PAGE as u64),
        _ => base + rng.below(8) * PAGE as u64 + rng.below(4) * 512,
    };
    let (mut admin_ok, mut io_ok) = (0, 0);
    for i in 0..3000 {
        if i % 256 == 0 {
            fill(&mut rng);
        }
        let mut d = [0u32; 16];
        for w in &mut d {
            *w = rng.next() as u32;
        }
        let mut s = Sqe::from_dwords(d);
        if rng.below(4) != 0 {
            s.cdw0 &= 0xFFFF_00FF; // mostly no FUSE/PSDT
        }
        s.prp1 = prp(&mut rng);
        s.prp2 = prp(&mut rng);
        if i % 2 == 0 {
            // Admin: mostly known opcodes; never an AER (never completes),
            // never delete queue 1 (the fuzzed I/O queue).
            let op = [0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0A, rng.next() as u8]
                [rng.below(10) as usize];
            let op = if op == 0x0C { 0x06 } else { op };
            s.cdw0 = (s.cdw0 & !0xFF) | u32::from(op);
            if rng.below(2) == 0 {
                s.cdw10 &= 0x0F_00FF; // small sizes / CNS / LID, small NUMD
            }
            if matches!(op, 0x00 | 0x04) && s.cdw10 as u16 == 1 {
                s.cdw10 |= 2;
            }
            if rng.below(2) == 0 {
                s.nsid = rng.below(4) as u32;
            }
            let c = h.admin(s);
            admin_ok += usize::from(c.status().is_success());
        } else {
            let op = [0x00, 0x01, 0x02, 0x08, 0x09, rng.next() as u8][rng.below(6) as usize];
            s.cdw0 = (s.cdw0 & !0xFF) | u32::from(op);
            s.nsid = [0, 1, 2, 3, 0xFFFF_FFFF, s.nsid][rng.below(6) as usize];
            if rng.below(3) != 0 {
                s.cdw11 = 0;
                s.cdw10 %= 600;
                s.cdw12 &= if rng.below(2) == 0 { 0x7 } else { 0xFFFF };
            }
            let c = h.submit_on(&mut q, s);
            io_ok += usize::from(c.status().is_success());
        }
    }
    // Both outcomes were exercised.
    assert!((50..1450).contains(&admin_ok), "admin successes {admin_ok}");
    assert!((50..1450).contains(&io_ok), "I/O successes {io_ok}");
    let c = csts(&*h.dev);
    assert!(c.rdy() && !c.cfs(), "controller still healthy: {c:?}");
    let buf = DmaBuffer::new(&h.dev, PAGE).unwrap();
    assert!(h.admin(identify(1, 0, buf.device_addr(0).unwrap())).status().is_success());
    assert!(h.submit_on(&mut q, Sqe::new(0x00, 1)).status().is_success());
}

#[test]
fn burst_of_commands_wraps_queues() {
    let mut cfg = config("burst");
    cfg.backing = BackingSpec::Null;
    let mut h = Harness::start(cfg);
    let mut q = h.create_io(1, 64);
    let n = 50_000u32;
    let t = Instant::now();
    let (mut sent, mut done) = (0u32, 0u32);
    while done < n {
        // Keep up to 63 commands outstanding.
        let mut pushed = false;
        while sent < n && sent - done < 63 {
            q.push(rw(0x02, 1, u64::from(sent % 1000), 1, 0x1000, 0));
            sent += 1;
            pushed = true;
        }
        if pushed {
            h.ring_sq(1, q.sq_tail);
        }
        let mut got = false;
        while let Some(c) = q.pop() {
            assert!(c.status().is_success());
            done += 1;
            got = true;
        }
        if got {
            h.ring_cq(1, q.cq_head);
        } else {
            assert!(t.elapsed() < Duration::from_secs(30), "stalled at {done}");
            std::thread::yield_now();
        }
    }
    let rate = f64::from(n) / t.elapsed().as_secs_f64();
    eprintln!("burst: {n} commands, {rate:.0} commands/s");
    let s = wait_for(|| Some(h.emu.stats()).filter(|s| s.commands >= u64::from(n) + 2)).unwrap();
    assert_eq!(s.media_bytes_read, u64::from(n) * 4096);
}

#[test]
fn unmapped_queue_memory_is_fatal() {
    let mut h = Harness::start(config("fatal"));
    let cq = DmaBuffer::new(&h.dev, PAGE).unwrap();
    assert!(h.admin(create_cq(1, 8, cq.device_addr(0).unwrap())).status().is_success());
    // SQ base in the guard page after the CQ buffer: never mapped.
    let sq_base = cq.device_addr(0).unwrap() + PAGE as u64;
    assert!(h.admin(create_sq(1, 8, sq_base, 1)).status().is_success());
    h.ring_sq(1, 1);
    assert!(h.wait_csts(|c| c.cfs()).is_some(), "fetching from unmapped SQ memory sets CFS");
    assert_eq!(h.emu.stats().dma_faults, 1);
    // A reset recovers.
    h.write_cc(cc_enable().with_en(false));
    assert!(h.wait_csts(|c| !c.rdy() && !c.cfs()).is_some());
    h.admin = Queue::new(&h.dev, 0, 8, 8);
    h.program_admin();
    h.write_cc(cc_enable());
    assert!(h.wait_csts(|c| c.rdy()).is_some());
    let buf = DmaBuffer::new(&h.dev, PAGE).unwrap();
    assert!(h.admin(identify(1, 0, buf.device_addr(0).unwrap())).status().is_success());
}

/// A rule for every command of SQ `qid`.
fn on_queue(qid: u16, opcode: Option<u8>, action: nvme_emu::FaultAction) -> nvme_emu::FaultRule {
    nvme_emu::FaultRule {
        matches: nvme_emu::FaultMatch { qid: Some(qid), opcode, ..Default::default() },
        action,
        times: None,
        skip: 0,
    }
}

#[test]
fn sq_tail_moving_backwards_is_counted_and_ignored() {
    let mut h = Harness::start(config("backwards"));
    let mut q = h.create_io(1, 8);
    // Held commands: no CQE reports an SQHD, so slots 0..3 stay the
    // controller's.
    h.emu.add_fault(on_queue(1, None, nvme_emu::FaultAction::NeverComplete));
    for _ in 0..3 {
        q.push(Sqe::new(0x00, 1));
    }
    h.ring_sq(1, q.sq_tail);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().faults_injected == 3)).is_some());
    // 3 -> 2: backwards. Accepted, it would read as a wrap over 7 entries
    // (slots 3..7, 0, 1) and run whatever they hold.
    h.ring_sq(1, 2);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().sq_tail_backwards == 1)).is_some());
    std::thread::sleep(Duration::from_millis(10));
    let s = h.emu.stats();
    assert_eq!((s.doorbell_violations, s.faults_injected, s.commands), (1, 3, 2), "{s:?}");
    assert!(q.peek().is_none(), "nothing was fetched from the stale slots");
    // 2 -> 3 -> 4 (one new command): forward again, accepted.
    h.emu.clear_faults();
    let c = h.submit_on(&mut q, Sqe::new(0x00, 1));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(c.sqhd, 4);
    assert_eq!(h.emu.stats().sq_tail_backwards, 1);
    assert!(h.emu.is_running());
}

#[test]
fn an_sqe_overwritten_while_the_controller_owns_its_slot_is_counted() {
    let mut h = Harness::start(config("overwrite"));
    let mut q = h.create_io(1, 8);
    // The first command's CQE (which releases slot 0 with SQHD 1) comes
    // 200 ms after its fetch: the slot is the controller's meanwhile.
    h.emu.add_fault(nvme_emu::FaultRule {
        times: Some(1),
        ..on_queue(1, None, nvme_emu::FaultAction::Delay(Duration::from_millis(200)))
    });
    let cid = q.push(Sqe::new(0x00, 1));
    h.ring_sq(1, q.sq_tail);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().faults_injected == 1)).is_some());
    // The host reuses slot 0 too early (it has seen no SQHD yet).
    let mut other = Sqe::new(0x00, 1);
    other.set_cid(0x0BAD);
    q.sq.write_bytes(0, zerocopy::IntoBytes::as_bytes(&other)).unwrap();
    let c = wait_for(|| q.pop()).expect("the delayed CQE");
    h.ring_cq(1, q.cq_head);
    assert_eq!((c.cid, c.sqhd), (cid, 1));
    let s = h.emu.stats();
    assert_eq!(s.sqe_overwritten, 1, "{s:?}");
    // Reusing slots after their release is fine: three laps of the ring.
    for _ in 0..24 {
        assert_eq!(h.submit_on(&mut q, Sqe::new(0x00, 1)).status(), Status::SUCCESS);
    }
    assert_eq!(h.emu.stats().sqe_overwritten, 1);
    assert!(h.emu.is_running());
}

#[test]
fn a_cq_head_doorbell_never_written_fills_the_cq_and_stalls() {
    let mut h = Harness::start(config("cqstall"));
    let mut q = Queue::new(&h.dev, 1, 16, 4);
    assert_eq!(h.admin(create_cq(1, 4, q.cq.device_addr(0).unwrap())).status(), Status::SUCCESS);
    assert_eq!(h.admin(create_sq(1, 16, q.sq.device_addr(0).unwrap(), 1)).status(), Status::SUCCESS);
    for _ in 0..12 {
        q.push(Sqe::new(0x00, 1));
    }
    h.ring_sq(1, q.sq_tail);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().cq_full_stalls == 1)).is_some());
    std::thread::sleep(Duration::from_millis(20));
    // Three posted (one slot stays empty), the fourth slot untouched.
    let mut got = Vec::new();
    while let Some(c) = q.pop() {
        got.push(c.cid);
    }
    assert_eq!(got, [0, 1, 2]);
    let mut slot3 = [0u8; 16];
    q.cq.read_bytes(48, &mut slot3).unwrap();
    assert_eq!(slot3, [0u8; 16], "nothing written over the entry the host owns");
    let s = h.emu.stats();
    assert_eq!((s.cq_full_stalls, s.commands), (1, 2 + 3), "one stall; only 3 completions posted: {s:?}");
    // The SQ stopped being fetched once 4 completions waited (7 of 12
    // fetched): the head doorbell brings the rest, in order.
    h.ring_cq(1, q.cq_head);
    let mut cids = Vec::new();
    let t = Instant::now();
    while cids.len() < 9 && t.elapsed() < TIMEOUT {
        let mut any = false;
        while let Some(c) = q.pop() {
            assert!(c.status().is_success());
            cids.push(c.cid);
            any = true;
        }
        if any {
            h.ring_cq(1, q.cq_head);
        }
        std::thread::yield_now();
    }
    assert_eq!(cids, (3..12).collect::<Vec<u16>>());
    // Consumed promptly this time, but each refill of 3 without a doorbell
    // in between may stall again: at least the first episode was counted.
    assert!(h.emu.stats().cq_full_stalls >= 1);
    assert!(h.emu.is_running());
}

fn delete_sq(qid: u16) -> Sqe {
    let mut s = Sqe::new(0x00, 0);
    s.cdw10 = u32::from(qid);
    s
}

fn delete_cq(qid: u16) -> Sqe {
    let mut s = Sqe::new(0x04, 0);
    s.cdw10 = u32::from(qid);
    s
}

#[test]
fn delete_io_sq_aborts_held_and_delayed_commands_before_its_own_completion() {
    let mut h = Harness::start(config("abort"));
    let mut q = h.create_io(1, 8);
    let buf = DmaBuffer::new(&h.dev, PAGE).unwrap();
    let a = buf.device_addr(0).unwrap();
    h.emu.add_fault(on_queue(1, Some(0x02), nvme_emu::FaultAction::NeverComplete));
    h.emu.add_fault(on_queue(1, Some(0x01), nvme_emu::FaultAction::Delay(Duration::from_secs(30))));
    let held = [q.push(rw(0x02, 1, 0, 1, a, 0)), q.push(rw(0x02, 1, 1, 1, a, 0))];
    let delayed = q.push(rw(0x01, 1, 2, 1, a, 0));
    let flush = q.push(Sqe::new(0x00, 1));
    h.ring_sq(1, q.sq_tail);
    let c = wait_for(|| q.pop()).expect("the flush completes");
    assert_eq!((c.cid, c.status()), (flush, Status::SUCCESS));
    h.ring_cq(1, q.cq_head);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().faults_injected == 3)).is_some());
    std::thread::sleep(Duration::from_millis(5));
    assert!(q.peek().is_none());

    assert_eq!(h.admin(delete_sq(1)).status(), Status::SUCCESS);
    // The aborts were posted before the Delete's CQE: no wait needed.
    let mut aborted = Vec::new();
    while let Some(c) = q.pop() {
        assert_eq!(c.sqid, 1);
        assert_eq!(c.status(), Status::generic(gsc::ABORTED_SQ_DELETION), "CID {}", c.cid);
        assert!(!c.status().dnr);
        aborted.push(c.cid);
    }
    h.ring_cq(1, q.cq_head);
    aborted.sort_unstable();
    let mut want = vec![held[0], held[1], delayed];
    want.sort_unstable();
    assert_eq!(aborted, want, "each fetched, uncompleted command aborted once");
    std::thread::sleep(Duration::from_millis(20));
    assert!(q.peek().is_none(), "nothing else, ever");
    assert_eq!(h.emu.stats().sq_deletion_aborts, 3);
    assert_eq!(h.admin(delete_cq(1)).status(), Status::SUCCESS);
}

#[test]
fn delete_io_sq_drops_entries_it_has_not_fetched() {
    let mut h = Harness::start(config("dropunfetched"));
    let mut q = Queue::new(&h.dev, 1, 16, 4);
    assert_eq!(h.admin(create_cq(1, 4, q.cq.device_addr(0).unwrap())).status(), Status::SUCCESS);
    assert_eq!(h.admin(create_sq(1, 16, q.sq.device_addr(0).unwrap(), 1)).status(), Status::SUCCESS);
    // The CQ head never moves: 3 posted, 4 waiting, then fetching stops
    // with 5 of 12 entries unfetched.
    for _ in 0..12 {
        q.push(Sqe::new(0x00, 1));
    }
    h.ring_sq(1, q.sq_tail);
    assert!(wait_for(|| Some(()).filter(|_| h.emu.stats().cq_full_stalls == 1)).is_some());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(h.admin(delete_sq(1)).status(), Status::SUCCESS);
    // The 7 fetched ones complete (normally: they had finished); the other
    // 5 never run.
    let mut cids = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        while let Some(c) = q.pop() {
            cids.push(c.cid);
        }
        h.ring_cq(1, q.cq_head);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(cids, (0..7).collect::<Vec<u16>>());
    assert_eq!(h.emu.stats().sq_deletion_aborts, 0);
    assert_eq!(h.admin(delete_cq(1)).status(), Status::SUCCESS);
}

/// A host that returns its only CQ slot and submits the next command at
/// once never meets a "CQ full" stall: the controller re-reads the CQ head
/// doorbell before it declares the CQ full (it used to trust the value read
/// at the start of its poll iteration, and stalled whenever the new command
/// arrived later in the same iteration).
#[test]
fn a_cq_slot_returned_just_before_the_next_submission_is_seen() {
    let mut h = Harness::start(config("cqrefresh"));
    let mut q = Queue::new(&h.dev, 1, 16, 2);
    assert_eq!(h.admin(create_cq(1, 2, q.cq.device_addr(0).unwrap())).status(), Status::SUCCESS);
    assert_eq!(h.admin(create_sq(1, 16, q.sq.device_addr(0).unwrap(), 1)).status(), Status::SUCCESS);
    let before = h.emu.stats().cq_full_stalls;
    for _ in 0..20_000 {
        q.push(Sqe::new(0x00, 1));
        h.ring_sq(1, q.sq_tail);
        let c = wait_for(|| q.pop()).expect("a completion");
        assert!(c.status().is_success());
        // Return the slot, then (next iteration) submit at once.
        h.ring_cq(1, q.cq_head);
    }
    let s = h.emu.stats();
    assert_eq!(s.cq_full_stalls - before, 0, "{s:?}");
    assert_eq!(s.doorbell_violations, 0, "{s:?}");
}

/// `NvmeDevice::expect_doorbells` (what a GPU launch calls) wakes a
/// controller deep in its idle naps and leaves it working normally: the
/// doorbells written after it (here by the CPU, which, like a GPU kernel,
/// only stores into the register page) are all served, and the hint is
/// harmless on a controller that is gone.
#[test]
fn a_doorbell_hint_wakes_an_idle_controller_and_changes_nothing_else() {
    let mut h = Harness::start(config("kick"));
    let mut q = Queue::new(&h.dev, 1, 16, 16);
    assert_eq!(h.admin(create_cq(1, 16, q.cq.device_addr(0).unwrap())).status(), Status::SUCCESS);
    assert_eq!(h.admin(create_sq(1, 16, q.sq.device_addr(0).unwrap(), 1)).status(), Status::SUCCESS);
    for round in 0..5 {
        // Past 50 ms of idleness the thread naps 1 ms at a time.
        std::thread::sleep(Duration::from_millis(60));
        h.emu.expect_doorbells();
        for _ in 0..8 {
            q.push(Sqe::new(0x00, 1));
        }
        h.ring_sq(1, q.sq_tail);
        for i in 0..8 {
            let c = wait_for(|| q.pop()).unwrap_or_else(|| panic!("round {round}: completion {i}"));
            assert!(c.status().is_success());
        }
        h.ring_cq(1, q.cq_head);
    }
    let s = h.emu.stats();
    assert_eq!((s.doorbell_violations, s.cq_full_stalls), (0, 0), "{s:?}");
    h.emu.set_gone();
    h.emu.expect_doorbells();
    assert_eq!(h.dev.bar0().read32(offset::CSTS).ok(), Some(u32::MAX), "still gone");
}

/// With `io_queues_detached` the controller thread answers admin commands
/// (queues are created and deleted) but leaves the I/O queues to another
/// agent: a command rung on an I/O SQ is never fetched or completed, and
/// the I/O doorbells are not judged.
#[test]
fn detached_io_queues_are_left_to_another_agent() {
    let mut cfg = config("detached");
    cfg.io_queues_detached = true;
    let mut h = Harness::start(cfg);
    let mut q = Queue::new(&h.dev, 1, 16, 16);
    assert_eq!(h.admin(create_cq(1, 16, q.cq.device_addr(0).unwrap())).status(), Status::SUCCESS);
    assert_eq!(h.admin(create_sq(1, 16, q.sq.device_addr(0).unwrap(), 1)).status(), Status::SUCCESS);
    let before = h.emu.stats().commands;
    q.push(Sqe::new(0x00, 1));
    h.ring_sq(1, q.sq_tail);
    // An out-of-range CQ head would be a violation if the thread judged it.
    h.ring_cq(1, 9);
    std::thread::sleep(Duration::from_millis(50));
    assert!(q.pop().is_none(), "the I/O command was left alone");
    let s = h.emu.stats();
    assert_eq!((s.commands, s.doorbell_violations), (before, 0), "{s:?}");
    assert_eq!(h.admin(delete_sq(1)).status(), Status::SUCCESS);
    assert_eq!(h.admin(delete_cq(1)).status(), Status::SUCCESS);
}
