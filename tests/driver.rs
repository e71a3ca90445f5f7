//! The driver (nvm-queue) against the software controller (nvme-emu):
//! queue discipline, doorbells, PRPs and I/O splitting end to end.

use std::time::{Duration, Instant};

use nvm_queue::{plan_io, Completion, DataRef, DmaBuffer, IoOp, QueuePair};
use nvme_emu::NamespaceSpec;
use nvme_regs::Status;
use tutti_tests::rig;

/// Submits `op` for `len` bytes at byte `offset` of namespace 1 with data at
/// `buf[buf_off..]`, split by MDTS, and waits for every command.
fn io(
    qp: &mut QueuePair,
    op: IoOp,
    (ns, max): (&nvm_queue::NamespaceInfo, usize),
    offset: u64,
    len: u64,
    buf: &DmaBuffer,
    buf_off: usize,
) -> Vec<Completion> {
    let plan = plan_io(ns, offset, len, max).unwrap();
    let mapping = buf.mapping().clone();
    let mut n = 0;
    for (i, c) in plan.enumerate() {
        let data = DataRef { mapping: &mapping, offset: buf_off + c.offset, len: c.len };
        qp.submit(op.sqe(ns.nsid, &c), Some(data), i as u64).unwrap();
        n += 1;
    }
    qp.ring();
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while done.len() < n {
        qp.poll(|c| done.push(c));
        assert!(Instant::now() < deadline, "timed out: {}", qp.dump());
    }
    done
}

#[test]
fn two_entry_queue_wraps_a_thousand_times_with_the_right_phase() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 2, 1).unwrap();
    assert_eq!(qp.sq().size(), 2);
    let buf = DmaBuffer::new(&r.dev, 4096).unwrap();
    for k in 0..2000u64 {
        // Before completion k the host expects phase 1 on even passes.
        let expect_phase = (k / 2) % 2 == 0;
        assert_eq!(qp.cq().phase(), expect_phase, "round trip {k}");
        assert_eq!(qp.cq().head(), (k % 2) as u32);
        buf.write_bytes(0, &k.to_le_bytes()).unwrap();
        let c = io(&mut qp, IoOp::Write, (&ns, r.ctrl.max_transfer()), (k % 16) * 4096, 4096, &buf, 0);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, Status::SUCCESS);
        // One slot always stays empty: the SQ never holds two commands.
        assert_eq!(qp.sq().head(), qp.sq().tail());
    }
    // 2000 completions on a 2-entry queue: 1000 wraps, back to phase 1.
    assert!(qp.cq().phase());
    assert_eq!(qp.stats().completed, 2000);
    assert_eq!(qp.stats().protocol_errors, 0);
    let buf2 = DmaBuffer::new(&r.dev, 4096).unwrap();
    io(&mut qp, IoOp::Read, (&ns, r.ctrl.max_transfer()), 15 * 4096, 4096, &buf2, 0);
    let mut got = [0u8; 8];
    buf2.read_bytes(0, &mut got).unwrap();
    assert_eq!(u64::from_le_bytes(got), 1999, "last write to LBA 15 was round trip 1999");
    r.ctrl.delete_io_queue_pair(1).unwrap();
    r.ctrl.shutdown().unwrap();
}

#[test]
fn doorbell_stride_two_puts_queue_three_at_0x1060_and_0x1070() {
    let mut r = rig(|c| {
        c.dstrd = 2;
        c.io_queues = 4;
    });
    assert_eq!(r.ctrl.cap().dstrd(), 2);
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qps: Vec<QueuePair> = (1..=3).map(|q| r.ctrl.create_io_queue_pair(q, 8, 7).unwrap()).collect();
    let q3 = &mut qps[2];
    assert_eq!(q3.sq().doorbell_offset(), 0x1060);
    assert_eq!(q3.cq().doorbell_offset(), 0x1070);
    let buf = DmaBuffer::new(&r.dev, 8192).unwrap();
    buf.write_bytes(0, b"stride").unwrap();
    let c = io(q3, IoOp::Write, (&ns, r.ctrl.max_transfer()), 0, 4096, &buf, 0);
    assert!(c[0].status.is_success());
    let c = io(q3, IoOp::Read, (&ns, r.ctrl.max_transfer()), 0, 4096, &buf, 4096);
    assert!(c[0].status.is_success());
    let mut got = [0u8; 6];
    buf.read_bytes(4096, &mut got).unwrap();
    assert_eq!(&got, b"stride");
    assert_eq!(r.emu.stats().doorbell_violations, 0);
}

#[test]
fn request_larger_than_mdts_is_split_and_reassembled() {
    // MDTS 1 = 8 KiB per command with 4 KiB pages: 72 KiB -> 9 commands.
    let mut r = rig(|c| c.mdts = 1);
    assert_eq!(r.ctrl.max_transfer(), 8192);
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let src = DmaBuffer::new(&r.dev, 72 << 10).unwrap();
    let pattern: Vec<u8> = (0..72 << 10).map(|i: u32| (i % 251) as u8).collect();
    src.write_bytes(0, &pattern).unwrap();
    let before = r.emu.stats().commands;
    let c = io(&mut qp, IoOp::Write, (&ns, r.ctrl.max_transfer()), 4096 * 5, 72 << 10, &src, 0);
    assert_eq!(c.len(), 9);
    assert!(c.iter().all(|c| c.status.is_success()));
    assert_eq!(r.emu.stats().commands - before, 9);
    // Read the same range back as one unsplit plan on a fresh buffer, at an
    // in-page offset, so every 8 KiB command spans three pages (PRP list).
    let dst = DmaBuffer::new(&r.dev, 80 << 10).unwrap();
    let c = io(&mut qp, IoOp::Read, (&ns, r.ctrl.max_transfer()), 4096 * 5, 72 << 10, &dst, 512);
    assert_eq!(c.len(), 9);
    let mut got = vec![0u8; 72 << 10];
    dst.read_bytes(512, &mut got).unwrap();
    assert!(got == pattern);
}

#[test]
fn prp_list_transfer_with_in_page_offset_round_trips() {
    // 12 KiB at buffer offset 0x200 needs PRP1 + a 3-entry PRP list.
    let mut r = rig(|c| c.mdts = 5);
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 16, 15).unwrap();
    let buf = DmaBuffer::new(&r.dev, 64 << 10).unwrap();
    let data: Vec<u8> = (0..12288u32).map(|i| (i * 7 % 256) as u8).collect();
    buf.write_bytes(0x200, &data).unwrap();
    let c = io(&mut qp, IoOp::Write, (&ns, r.ctrl.max_transfer()), 12288, 12288, &buf, 0x200);
    assert!(c[0].status.is_success());
    let c = io(&mut qp, IoOp::Read, (&ns, r.ctrl.max_transfer()), 12288, 12288, &buf, 32 << 10);
    assert!(c[0].status.is_success());
    let mut got = vec![0u8; 12288];
    buf.read_bytes(32 << 10, &mut got).unwrap();
    assert!(got == data);
}

#[test]
fn namespaces_with_512_byte_blocks_and_a_second_namespace() {
    let r = rig(|c| c.namespaces.push(NamespaceSpec::new(8192, 512)));
    let ns = r.ctrl.namespaces();
    assert_eq!(ns.len(), 2);
    assert_eq!((ns[0].nsid, ns[0].block_size, ns[0].blocks), (1, 4096, 16384));
    assert_eq!((ns[1].nsid, ns[1].block_size, ns[1].blocks), (2, 512, 8192));
    assert_eq!(r.ctrl.info().nn, 2);
}

#[test]
fn lba_out_of_range_from_the_drive_reaches_the_command() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    // Lie about the namespace size so the host sends an out-of-range LBA.
    let big = nvm_queue::NamespaceInfo { blocks: ns.blocks * 2, ..ns };
    let mut qp = r.ctrl.create_io_queue_pair(1, 16, 15).unwrap();
    let buf = DmaBuffer::new(&r.dev, 4096).unwrap();
    let c = io(&mut qp, IoOp::Read, (&big, r.ctrl.max_transfer()), ns.capacity_bytes(), 4096, &buf, 0);
    assert_eq!(
        c[0].status,
        Status::generic(nvme_regs::status::generic::LBA_OUT_OF_RANGE).with_dnr(c[0].status.dnr)
    );
    assert_eq!((c[0].status.sct, c[0].status.sc), (0, 0x80));
}

/// Memory the emulator reaches only through copies (as it does GPU memory).
#[derive(Debug)]
struct CopyOnly(std::sync::Mutex<Vec<u8>>);

impl nvme_emu::ExternalMemory for CopyOnly {
    fn len(&self) -> u64 {
        self.0.lock().unwrap().len() as u64
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> bool {
        let v = self.0.lock().unwrap();
        let o = offset as usize;
        match v.get(o..o + dst.len()) {
            Some(src) => {
                dst.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
    fn write(&self, offset: u64, src: &[u8]) -> bool {
        let mut v = self.0.lock().unwrap();
        let o = offset as usize;
        match v.get_mut(o..o + src.len()) {
            Some(dst) => {
                dst.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
}

#[test]
fn data_in_copy_only_memory_round_trips_through_prps() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 16, 15).unwrap();
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
    let src = std::sync::Arc::new(CopyOnly(std::sync::Mutex::new(data.clone())));
    let dst = std::sync::Arc::new(CopyOnly(std::sync::Mutex::new(vec![0; 64 * 1024])));
    let ms = r.emu.map_external(src.clone()).unwrap();
    let md = r.emu.map_external(dst.clone()).unwrap();
    // 64 KiB per command: PRP1 + a 15-entry list into copy-only memory.
    for (op, m) in [(IoOp::Write, &ms), (IoOp::Read, &md)] {
        let plan = plan_io(&ns, 0, 64 * 1024, r.ctrl.max_transfer()).unwrap();
        for c in plan {
            let d = DataRef { mapping: m, offset: c.offset, len: c.len };
            qp.submit(op.sqe(1, &c), Some(d), 0).unwrap();
        }
        qp.ring();
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while n < 1 {
            qp.poll(|c| {
                assert!(c.status.is_success(), "{}", c.status);
                n += 1;
            });
            assert!(Instant::now() < deadline);
        }
    }
    assert!(*dst.0.lock().unwrap() == data);
    // Queue memory can never be external: its accesses need host addresses.
    r.dev.dma_unmap(&ms).unwrap();
    r.dev.dma_unmap(&md).unwrap();
}

#[test]
fn cq_head_doorbell_follows_every_completion_on_a_64_entry_queue() {
    // After k completions the CQ head doorbell must read k mod 64, or the
    // controller would see a full CQ and the 64th completion never arrive.
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let db = qp.cq().doorbell_offset();
    let buf = DmaBuffer::new(&r.dev, 4096).unwrap();
    for k in 1..=200u32 {
        let c = io(&mut qp, IoOp::Read, (&ns, r.ctrl.max_transfer()), 0, 4096, &buf, 0);
        assert!(c[0].status.is_success());
        assert_eq!(r.dev.bar0().read32(db).unwrap(), k % 64, "after {k} completions");
    }
}

#[test]
fn cq_memory_full_of_0xff_before_create_shows_no_phantom_completion() {
    // 0xFF bytes carry phase tag 1, the phase of the first pass: a driver
    // that does not clear CQ memory before Create I/O CQ would take them for
    // completions. Delete the pair, poison its CQ, create it again.
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 16, 15).unwrap();
    r.ctrl.delete_io_queue_pair(1).unwrap();
    qp.cq().memory().fill(0xFF);
    r.ctrl.recreate_io_queue_pair(&mut qp).unwrap();
    let mut seen = 0;
    qp.poll(|_| seen += 1);
    assert_eq!(seen, 0, "no completion before the first doorbell");
    assert_eq!(qp.stats().protocol_errors, 0);
    let buf = DmaBuffer::new(&r.dev, 4096).unwrap();
    let plan = plan_io(&ns, 0, 4096, r.ctrl.max_transfer()).unwrap();
    let c = plan.into_iter().next().unwrap();
    let cid = qp
        .submit(IoOp::Read.sqe(1, &c), Some(DataRef { mapping: buf.mapping(), offset: 0, len: 4096 }), 7)
        .unwrap();
    qp.ring();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.is_empty() && Instant::now() < deadline {
        qp.poll(|c| got.push(c));
    }
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].cid, got[0].tag), (cid, 7));
    assert!(got[0].status.is_success());
    assert_eq!(qp.stats().wrong_sqid, 0, "the real CQE names SQ 1");
}
