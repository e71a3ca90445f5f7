//! Fault injection in the emulator (`FaultRule`) seen through the driver:
//! media errors, commands that never complete, late completions, rules that
//! fire a limited number of times, rules added and cleared at run time,
//! protocol-breaking completions (duplicate, unknown CID, lagging SQHD,
//! phase tag before body), a fatal controller, and controller-level faults
//! (never ready, device gone).

use std::time::{Duration, Instant};

use std::collections::HashMap;
use std::sync::Arc;

use nvm_queue::{
    plan_io, Completion, Controller, ControllerError, ControllerOptions, DataRef, DmaBuffer, IoOp,
    NamespaceInfo, NvmeDevice, QueuePair,
};
use nvme_emu::{Emulator, EmulatorConfig, FaultAction, FaultMatch, FaultRule, NamespaceSpec};
use nvme_regs::opcode::nvm_opcode;
use nvme_regs::registers::{doorbell_offset, offset};
use nvme_regs::status::media;
use nvme_regs::Status;
use tutti_tests::rig;

/// Blocks per batch: one single-block command per LBA `0..BATCH`.
const BATCH: u64 = 16;

fn media_error() -> Status {
    Status::media(media::UNRECOVERED_READ_ERROR).with_dnr(true)
}

/// A rule matching I/O commands that touch logical block `lba`.
fn at_lba(lba: u64, action: FaultAction, times: Option<u64>) -> FaultRule {
    FaultRule {
        matches: FaultMatch { lba: Some(lba..lba + 1), ..Default::default() },
        action,
        times,
        skip: 0,
    }
}

/// Submits one `op` command of one block for each LBA in `lbas` (tag = LBA,
/// data at `buf[lba * block]`) and rings once.
fn submit(
    qp: &mut QueuePair,
    ns: &NamespaceInfo,
    op: IoOp,
    lbas: impl IntoIterator<Item = u64>,
    buf: &DmaBuffer,
) {
    let bs = u64::from(ns.block_size);
    let mapping = buf.mapping().clone();
    for lba in lbas {
        for c in plan_io(ns, lba * bs, bs, 1 << 20).unwrap() {
            let data = DataRef { mapping: &mapping, offset: (lba * bs) as usize, len: c.len };
            qp.submit(op.sqe(ns.nsid, &c), Some(data), lba).unwrap();
        }
    }
    qp.ring();
}

/// Polls until `n` completions have arrived or `within` has passed, and
/// returns them with their arrival times.
fn collect(qp: &mut QueuePair, n: usize, within: Duration) -> Vec<(Completion, Instant)> {
    let deadline = Instant::now() + within;
    let mut done = Vec::new();
    while done.len() < n && Instant::now() < deadline {
        qp.poll(|c| done.push((c, Instant::now())));
    }
    done
}

/// Runs a batch of `op` over `lbas` and waits (10 s at most) for all of it.
fn batch(
    qp: &mut QueuePair,
    ns: &NamespaceInfo,
    op: IoOp,
    lbas: std::ops::Range<u64>,
    buf: &DmaBuffer,
) -> Vec<Completion> {
    let n = (lbas.end - lbas.start) as usize;
    submit(qp, ns, op, lbas, buf);
    let done = collect(qp, n, Duration::from_secs(10));
    assert_eq!(done.len(), n, "timed out: {}", qp.dump());
    let mut v: Vec<Completion> = done.into_iter().map(|(c, _)| c).collect();
    v.sort_by_key(|c| c.tag);
    v
}

#[test]
fn media_error_on_one_lba_fails_only_that_command() {
    let mut r = rig(|c| c.faults = vec![at_lba(10, FaultAction::Fail(media_error()), None)]);
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    let done = batch(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    for c in &done {
        if c.tag == 10 {
            assert_eq!((c.status.sct, c.status.sc, c.status.dnr), (2, 0x81, true), "{c:?}");
            assert_eq!(c.status, media_error());
        } else {
            assert!(c.status.is_success(), "{c:?}");
        }
    }
    assert_eq!(r.emu.stats().faults_injected, 1);
    // A failed read moved no data.
    assert_eq!(r.emu.stats().media_bytes_read, (BATCH - 1) * 4096);
}

#[test]
fn never_complete_leaves_one_command_outstanding_past_the_sq_head() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    r.emu.add_fault(at_lba(5, FaultAction::NeverComplete, None));
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    buf.fill(0xA5);
    submit(&mut qp, &ns, IoOp::Write, 0..BATCH, &buf);
    let done = collect(&mut qp, BATCH as usize - 1, Duration::from_secs(10));
    assert_eq!(done.len(), BATCH as usize - 1, "{}", qp.dump());
    assert!(done.iter().all(|(c, _)| c.status.is_success() && c.tag != 5));
    std::thread::sleep(Duration::from_millis(300));
    let late = collect(&mut qp, 1, Duration::from_millis(10));
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(qp.outstanding(), 1);
    assert_eq!(qp.outstanding_tags().iter().map(|&(_, t)| t).collect::<Vec<_>>(), vec![5]);
    // The controller fetched it: SQHD of the later CQEs moved past it.
    assert_eq!(qp.sq().head(), qp.sq().tail(), "{}", qp.dump());
    assert_eq!(r.emu.stats().faults_injected, 1);
    // Not executed: LBA 5 still reads as zeroes, its neighbours as written.
    r.emu.clear_faults();
    let rd = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    rd.fill(0xFF);
    let c = batch(&mut qp, &ns, IoOp::Read, 4..7, &rd);
    assert!(c.iter().all(|c| c.status.is_success()));
    let mut b = [0u8; 4096];
    for (lba, want) in [(4u64, 0xA5u8), (5, 0), (6, 0xA5)] {
        rd.read_bytes((lba * 4096) as usize, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == want), "LBA {lba}");
    }
    assert_eq!(qp.outstanding(), 1, "the held command stays outstanding");
}

#[test]
fn delayed_command_completes_no_earlier_than_its_delay() {
    let delay = Duration::from_millis(200);
    let mut r = rig(|c| c.faults = vec![at_lba(3, FaultAction::Delay(delay), None)]);
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    let start = Instant::now();
    submit(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    let done = collect(&mut qp, BATCH as usize, Duration::from_secs(10));
    assert_eq!(done.len(), BATCH as usize, "{}", qp.dump());
    assert!(done.iter().all(|(c, _)| c.status.is_success()));
    let (last, at) = done.last().unwrap();
    assert_eq!(last.tag, 3, "the delayed command completes last");
    assert!(*at - start >= delay, "completed after {:?}", *at - start);
    assert_eq!(r.emu.stats().faults_injected, 1);
}

#[test]
fn delay_adds_to_the_timing_model() {
    let delay = Duration::from_millis(100);
    let mut r = rig(|c| {
        c.timing = Some(nvme_emu::TimingModel {
            latency: Duration::from_millis(20),
            bandwidth_bytes_per_s: None,
            iops: None,
        });
        c.faults = vec![at_lba(0, FaultAction::Delay(delay), Some(1))];
    });
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let buf = DmaBuffer::new(&r.dev, 2 * 4096).unwrap();
    let start = Instant::now();
    submit(&mut qp, &ns, IoOp::Read, 0..2, &buf);
    let done = collect(&mut qp, 2, Duration::from_secs(10));
    assert_eq!(done.len(), 2, "{}", qp.dump());
    assert_eq!(done[0].0.tag, 1);
    assert!(done[0].1 - start >= Duration::from_millis(20));
    assert_eq!(done[1].0.tag, 0);
    assert!(done[1].1 - start >= delay + Duration::from_millis(20), "{:?}", done[1].1 - start);
}

#[test]
fn rule_with_times_one_fails_once_and_the_retry_succeeds() {
    let mut r = rig(|c| c.faults = vec![at_lba(7, FaultAction::Fail(media_error()), Some(1))]);
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    let first = batch(&mut qp, &ns, IoOp::Read, 7..8, &buf);
    assert_eq!(first[0].status, media_error());
    let retry = batch(&mut qp, &ns, IoOp::Read, 7..8, &buf);
    assert!(retry[0].status.is_success(), "{retry:?}");
    let again = batch(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    assert!(again.iter().all(|c| c.status.is_success()));
    assert_eq!(r.emu.stats().faults_injected, 1);
}

#[test]
fn faults_added_at_run_time_apply_until_cleared() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    let ok = batch(&mut qp, &ns, IoOp::Write, 0..BATCH, &buf);
    assert!(ok.iter().all(|c| c.status.is_success()));
    assert_eq!(r.emu.stats().faults_injected, 0);

    // Every read from SQ 1 fails; writes are untouched.
    let read_fails = FaultRule {
        matches: FaultMatch {
            qid: Some(1),
            opcode: Some(nvm_opcode::READ),
            nsid: Some(1),
            lba: None,
            io_only: true,
        },
        action: FaultAction::Fail(media_error()),
        times: None,
        skip: 0,
    };
    r.emu.add_fault(read_fails);
    let reads = batch(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    assert!(reads.iter().all(|c| c.status == media_error()), "{reads:?}");
    let writes = batch(&mut qp, &ns, IoOp::Write, 0..BATCH, &buf);
    assert!(writes.iter().all(|c| c.status.is_success()));
    assert_eq!(r.emu.stats().faults_injected, BATCH);

    r.emu.clear_faults();
    let reads = batch(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    assert!(reads.iter().all(|c| c.status.is_success()), "{reads:?}");
    assert_eq!(r.emu.stats().faults_injected, BATCH);
}

#[test]
fn admin_commands_can_be_failed_too() {
    let mut r = rig(|_| {});
    let status = Status::generic(nvme_regs::status::generic::INTERNAL_ERROR);
    r.emu.add_fault(FaultRule {
        matches: FaultMatch { qid: Some(0), ..Default::default() },
        action: FaultAction::Fail(status),
        times: Some(1),
        skip: 0,
    });
    // Create I/O CQ fails (not executed), the next attempt goes through.
    assert!(r.ctrl.create_io_queue_pair(1, 16, 15).is_err());
    assert_eq!(r.emu.stats().faults_injected, 1);
    let mut qp = r.ctrl.create_io_queue_pair(1, 16, 15).unwrap();
    let ns = *r.ctrl.namespace(1).unwrap();
    let buf = DmaBuffer::new(&r.dev, 4096).unwrap();
    assert!(batch(&mut qp, &ns, IoOp::Read, 0..1, &buf)[0].status.is_success());
}

/// A rule matching every command of I/O SQ 1.
fn on_sq1(action: FaultAction, times: Option<u64>) -> FaultRule {
    FaultRule { matches: FaultMatch { qid: Some(1), ..Default::default() }, action, times, skip: 0 }
}

#[test]
fn complete_twice_delivers_one_completion_and_counts_a_protocol_error() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    r.emu.add_fault(at_lba(2, FaultAction::CompleteTwice, Some(1)));
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    let done = batch(&mut qp, &ns, IoOp::Read, 0..4, &buf);
    assert_eq!(done.iter().map(|c| c.tag).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert!(done.iter().all(|c| c.status.is_success()), "{done:?}");
    // The duplicate is consumed (now or in a later poll) but delivers nothing.
    let extra = collect(&mut qp, 1, Duration::from_millis(100));
    assert!(extra.is_empty(), "{extra:?}");
    let s = qp.stats();
    assert_eq!((s.completed, s.protocol_errors, s.wrong_sqid), (4, 1, 0), "{s:?}");
    assert_eq!(qp.outstanding(), 0);
    assert_eq!(r.emu.stats().faults_injected, 1);
    // The queue keeps working.
    let again = batch(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    assert!(again.iter().all(|c| c.status.is_success()));
    assert_eq!(qp.stats().protocol_errors, 1);
}

#[test]
fn unknown_cid_is_a_protocol_error_and_the_command_stays_outstanding() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    // 63 CIDs: slot bits 5:0, slots 0..=62; 0xFFFF names slot 63 (none).
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    r.emu.add_fault(at_lba(3, FaultAction::UnknownCid(0xFFFF), None));
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    submit(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    let done = collect(&mut qp, BATCH as usize - 1, Duration::from_secs(10));
    assert_eq!(done.len(), BATCH as usize - 1, "{}", qp.dump());
    assert!(done.iter().all(|(c, _)| c.status.is_success() && c.tag != 3));
    let late = collect(&mut qp, 1, Duration::from_millis(200));
    assert!(late.is_empty(), "{late:?}");
    let s = qp.stats();
    assert_eq!((s.completed, s.protocol_errors), (BATCH - 1, 1), "{s:?}");
    assert_eq!(qp.outstanding_tags().iter().map(|&(_, t)| t).collect::<Vec<_>>(), vec![3]);
    // Executed all the same: it read its block (the media counter shows it).
    assert_eq!(r.emu.stats().media_bytes_read, BATCH * 4096);
    assert_eq!(r.emu.stats().faults_injected, 1);
}

#[test]
fn lagging_sqhd_still_completes_and_the_queue_keeps_working() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    // Every command on LBA 0 reports an SQHD one entry behind.
    r.emu.add_fault(at_lba(0, FaultAction::LaggingSqhd, None));
    let buf = DmaBuffer::new(&r.dev, 20 * 4096).unwrap();
    let first = batch(&mut qp, &ns, IoOp::Read, 0..1, &buf);
    assert!(first[0].status.is_success(), "{first:?}");
    // 100 more, 20 per batch (one lagging CQE in each), wrapping the
    // 64-entry SQ; the driver's SQ head must never pass the controller's.
    for _ in 0..5 {
        let done = batch(&mut qp, &ns, IoOp::Read, 0..20, &buf);
        assert!(done.iter().all(|c| c.status.is_success()), "{done:?}");
    }
    let s = qp.stats();
    assert_eq!((s.completed, s.protocol_errors, s.wrong_sqid), (101, 0, 0), "{s:?}");
    assert_eq!(qp.outstanding(), 0);
    assert_eq!(r.emu.stats().faults_injected, 6);
}

#[test]
fn phase_before_body_still_delivers_the_right_cid_and_status() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    buf.fill(0x5A);
    // From the very first pass over the CQ, where a stale body is zeroes
    // (SQID 0): the driver re-reads a body that names another SQ until it
    // settles, instead of dropping the completion.
    r.emu.add_fault(on_sq1(FaultAction::PhaseBeforeBody, None));
    for _ in 0..4 {
        let done = batch(&mut qp, &ns, IoOp::Write, 0..BATCH, &buf);
        assert!(done.iter().all(|c| c.status.is_success()));
    }
    let bs = u64::from(ns.block_size);
    let mapping = buf.mapping().clone();
    let mut cids = HashMap::new();
    let mut tag = 0u64;
    // 200 commands, 20 per ring, writes and reads alternating by batch.
    for round in 0..10 {
        let op = if round % 2 == 0 { IoOp::Write } else { IoOp::Read };
        for lba in 0..20u64 {
            let c = plan_io(&ns, (lba % BATCH) * bs, bs, 1 << 20).unwrap().into_iter().next().unwrap();
            let data = DataRef { mapping: &mapping, offset: ((lba % BATCH) * bs) as usize, len: c.len };
            cids.insert(tag, qp.submit(op.sqe(ns.nsid, &c), Some(data), tag).unwrap());
            tag += 1;
        }
        qp.ring();
        let done = collect(&mut qp, 20, Duration::from_secs(10));
        assert_eq!(done.len(), 20, "{}", qp.dump());
        for (c, _) in &done {
            assert_eq!(Some(&c.cid), cids.get(&c.tag), "{c:?}");
            assert!(c.status.is_success(), "{c:?}");
        }
    }
    let s = qp.stats();
    assert_eq!((s.completed, s.protocol_errors, s.wrong_sqid), (64 + 200, 0, 0), "{s:?}");
    assert_eq!(qp.outstanding(), 0);
    assert_eq!(r.emu.stats().faults_injected, 264);
    // The data went through.
    let mut b = [0u8; 4096];
    buf.read_bytes(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0x5A));
}

#[test]
fn controller_fatal_sets_cfs_and_stops_all_queues_until_reset() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    r.emu.add_fault(at_lba(5, FaultAction::ControllerFatal, Some(1)));
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    assert!(!r.ctrl.csts().unwrap().cfs());
    submit(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    // Commands are fetched in order: 0..5 complete, 5 is the fatal one,
    // nothing after it is processed.
    let done = collect(&mut qp, 5, Duration::from_secs(10));
    assert_eq!(done.iter().map(|(c, _)| c.tag).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !r.ctrl.csts().unwrap().cfs() {
        assert!(Instant::now() < deadline, "CSTS.CFS never set");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Later commands, I/O and admin, are not completed.
    submit(&mut qp, &ns, IoOp::Read, 0..4, &buf);
    let late = collect(&mut qp, 1, Duration::from_millis(200));
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(qp.outstanding(), BATCH as usize - 5 + 4);
    let e = r.ctrl.create_io_queue_pair(2, 16, 15).unwrap_err();
    assert!(matches!(e, ControllerError::Fatal { .. }), "{e}");
    assert!(r.ctrl.csts().unwrap().cfs());
    assert_eq!(r.emu.stats().faults_injected, 1);

    // A controller reset (CC.EN 1 -> 0) clears CFS and every queue.
    r.ctrl.reset().unwrap();
    assert!(!r.ctrl.csts().unwrap().cfs());
    assert_eq!(qp.reset_after_controller_reset().len(), BATCH as usize - 5 + 4);
    r.ctrl.recreate_io_queue_pair(&mut qp).unwrap();
    let again = batch(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    assert!(again.iter().all(|c| c.status.is_success()), "{again:?}");
}

/// Starts an emulator configured by `f` without bringing it up.
fn bare(f: impl FnOnce(&mut EmulatorConfig)) -> (Arc<Emulator>, Arc<dyn NvmeDevice>) {
    let mut cfg = EmulatorConfig::new("bare", vec![NamespaceSpec::new(1024, 4096)]);
    f(&mut cfg);
    let emu = Emulator::start(cfg).expect("emulator starts");
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    (emu, dev)
}

#[test]
fn never_ready_makes_init_time_out_after_cap_to() {
    let (_emu, dev) = bare(|c| {
        c.never_ready = true;
        c.cap_to_500ms = 1;
    });
    let start = Instant::now();
    let e = Controller::init(dev, ControllerOptions::default()).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(e, ControllerError::Timeout { what: "CSTS.RDY = 1 after CC.EN = 1", .. }), "{e}");
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn registers_all_ones_make_init_report_the_device_gone() {
    let (emu, dev) = bare(|c| c.registers_all_ones = true);
    assert_eq!(dev.bar0().read64(offset::CAP).unwrap(), u64::MAX);
    let e = Controller::init(dev, ControllerOptions::default()).unwrap_err();
    assert!(matches!(e, ControllerError::DeviceGone { .. }), "{e}");
    assert_eq!(emu.stats().commands, 0);
}

#[test]
fn set_gone_at_run_time_reads_all_ones_and_stops_the_controller() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    assert!(batch(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf).iter().all(|c| c.status.is_success()));
    let before = r.emu.stats().commands;
    r.emu.set_gone();
    let e = r.ctrl.csts().unwrap_err();
    assert!(matches!(e, ControllerError::DeviceGone { register: "CSTS" }), "{e}");
    assert_eq!(r.dev.bar0().read64(offset::CAP).unwrap(), u64::MAX);
    submit(&mut qp, &ns, IoOp::Read, 0..4, &buf);
    let late = collect(&mut qp, 1, Duration::from_millis(200));
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(qp.outstanding(), 4);
    assert_eq!(r.emu.stats().commands, before);
    // The host's doorbell write did not stick.
    assert_eq!(r.dev.bar0().read32(doorbell_offset(1, false, 0)).unwrap(), u32::MAX);
    assert!(matches!(r.ctrl.reset(), Err(ControllerError::DeviceGone { .. })));
}

#[test]
fn delete_io_sq_aborts_held_commands_and_the_pair_matches_each_once() {
    let mut r = rig(|_| {});
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    r.emu.add_fault(at_lba(3, FaultAction::NeverComplete, None));
    r.emu.add_fault(at_lba(7, FaultAction::Delay(Duration::from_secs(30)), None));
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    submit(&mut qp, &ns, IoOp::Read, 0..BATCH, &buf);
    let done = collect(&mut qp, BATCH as usize - 2, Duration::from_secs(10));
    assert!(done.iter().all(|(c, _)| c.status.is_success() && c.tag != 3 && c.tag != 7));
    assert_eq!(qp.outstanding(), 2);

    r.ctrl.delete_io_sq(&mut qp).unwrap();
    assert!(qp.is_sq_deleted(), "delete_io_sq marks the pair");
    assert_eq!(
        qp.submit(nvme_regs::Sqe::new(0, 1), None, 99),
        Err(nvm_queue::SubmitError::SqDeleted { qid: 1 }),
        "no submissions once the SQ is gone"
    );
    let aborted = collect(&mut qp, 2, Duration::from_secs(5));
    let mut tags: Vec<u64> = aborted.iter().map(|(c, _)| c.tag).collect();
    tags.sort_unstable();
    assert_eq!(tags, [3, 7]);
    for (c, _) in &aborted {
        assert_eq!(c.status, Status::generic(nvme_regs::status::generic::ABORTED_SQ_DELETION), "{c:?}");
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(collect(&mut qp, 1, Duration::from_millis(10)).is_empty(), "nothing completes twice");
    let s = qp.stats();
    assert_eq!((qp.outstanding(), s.protocol_errors, s.bad_sqhd), (0, 0, 0), "{s:?}");
    assert_eq!(r.emu.stats().sq_deletion_aborts, 2);
    r.ctrl.delete_io_cq(1).unwrap();
    assert!(r.ctrl.live_io_queues().is_empty());
    // The pair can be created again on the same memory.
    r.ctrl.recreate_io_queue_pair(&mut qp).unwrap();
    r.emu.clear_faults();
    let again = batch(&mut qp, &ns, IoOp::Read, 0..4, &buf);
    assert!(again.iter().all(|c| c.status.is_success()));
    r.ctrl.shutdown().unwrap();
}

#[test]
fn four_entry_sq_reuses_slots_while_commands_stay_outstanding() {
    // Issue 5's case: a 4-entry SQ (CAP.MQES = 3) holds at most 3
    // commands. The controller fetches all 3 but completes only one,
    // reporting SQHD = 3: slots 0..2 are free again although two commands
    // are still outstanding, so command IDs must be tracked per outstanding
    // command, not per slot. 8 command IDs on the pair let it run ahead.
    let mut r = rig(|c| c.mqes = 3);
    assert_eq!(r.ctrl.cap().max_queue_entries(), 4);
    let ns = *r.ctrl.namespace(1).unwrap();
    let mut qp = r.ctrl.create_io_queue_pair(1, 4, 8).unwrap();
    assert_eq!(qp.sq().size(), 4);
    for lba in [1, 2] {
        r.emu.add_fault(at_lba(lba, FaultAction::NeverComplete, Some(1)));
    }
    // LBA 0 completes late, so its CQE is posted after all three fetches.
    r.emu.add_fault(at_lba(0, FaultAction::Delay(Duration::from_millis(50)), Some(1)));
    let buf = DmaBuffer::new(&r.dev, (BATCH * 4096) as usize).unwrap();
    let mapping = buf.mapping().clone();
    let mut cids = Vec::new();
    let submit_one = |qp: &mut QueuePair, lba: u64| {
        let c = plan_io(&ns, lba * 4096, 4096, 1 << 20).unwrap().next().unwrap();
        let data = DataRef { mapping: &mapping, offset: (lba * 4096) as usize, len: 4096 };
        qp.submit(IoOp::Read.sqe(1, &c), Some(data), lba)
    };
    for lba in 0..3 {
        cids.push(submit_one(&mut qp, lba).unwrap());
    }
    assert!(
        matches!(submit_one(&mut qp, 3), Err(nvm_queue::SubmitError::QueueFull { .. })),
        "a 4-entry SQ holds 3 commands"
    );
    qp.ring();
    let done = collect(&mut qp, 1, Duration::from_secs(10));
    assert_eq!(done.iter().map(|(c, _)| c.tag).collect::<Vec<_>>(), [0]);
    // SQHD = 3: all three fetched, so the SQ head is 3 and the ring is empty
    // while LBAs 1 and 2 are still outstanding.
    assert_eq!((qp.sq().head(), qp.sq().tail()), (3, 3), "{}", qp.dump());
    assert_eq!(qp.outstanding(), 2);
    // Reuse slots 3, 0, 1 for three more commands: 5 outstanding, 5 CIDs.
    for lba in 3..6 {
        cids.push(submit_one(&mut qp, lba).unwrap());
    }
    qp.ring();
    let mut distinct = cids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "every outstanding command has its own CID: {cids:?}");
    let done = collect(&mut qp, 3, Duration::from_secs(10));
    let mut tags: Vec<u64> = done.iter().map(|(c, _)| c.tag).collect();
    tags.sort_unstable();
    assert_eq!(tags, [3, 4, 5], "{}", qp.dump());
    assert!(done.iter().all(|(c, _)| c.status.is_success()));
    // The two held commands are still tracked, under their own CIDs.
    let mut held = qp.outstanding_tags();
    held.sort_unstable_by_key(|&(_, t)| t);
    assert_eq!(held, [(cids[1], 1), (cids[2], 2)]);
    assert_eq!(qp.stats().protocol_errors, 0);
}
