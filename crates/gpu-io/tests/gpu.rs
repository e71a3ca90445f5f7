//! GPU threads driving emulated NVMe controllers. These tests need a CUDA
//! driver and a GPU; elsewhere each prints why it skipped and passes.
//! Run on the GPU machine: see docs/gpu.md.

#![allow(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use gpu_io::abi::TuttiRequest;
use gpu_io::{Gpu, GpuBuffer, GpuDrive, GpuError, GpuQueue, GpuQueueCounters, GpuRegion, GpuStatus};
use nvm_queue::{Controller, ControllerOptions, DmaBuffer, NvmeDevice};
use nvme_emu::{Emulator, EmulatorConfig, NamespaceSpec};
use nvme_regs::opcode::nvm_opcode;

const BUDGET: Duration = Duration::from_secs(10);

fn gpu() -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(e @ (GpuError::NoDriver | GpuError::Driver { .. })) => {
            eprintln!("skipped: no usable GPU ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

struct Drive {
    emu: Arc<Emulator>,
    dev: Arc<dyn NvmeDevice>,
    ctrl: Controller,
    gpu_drive: GpuDrive,
}

fn drive(gpu: &Gpu, name: &str, f: impl FnOnce(&mut EmulatorConfig)) -> Drive {
    let mut cfg = EmulatorConfig::new(name, vec![NamespaceSpec::new(65536, 4096)]);
    f(&mut cfg);
    let emu = Emulator::start(cfg).unwrap();
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let ctrl = Controller::init(dev.clone(), ControllerOptions::default()).unwrap();
    let gpu_drive = GpuDrive::map(gpu, dev.clone()).unwrap();
    Drive { emu, dev, ctrl, gpu_drive }
}

fn rw(op: u8, queue: u16, lba: u64, mem_offset: u64) -> TuttiRequest {
    TuttiRequest {
        opcode: op,
        queue,
        nsid: 1,
        slba: lba,
        nlb: 0,
        len: 4096,
        mem_offset,
        ..Default::default()
    }
}

fn pattern(block: u64) -> Vec<u8> {
    (0..4096u64).map(|i| (i.wrapping_mul(7) ^ block.wrapping_mul(131) ^ (block >> 3)) as u8).collect()
}

#[test]
fn many_warps_submit_to_one_queue_and_every_byte_round_trips() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "warps", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 256, 255).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let n = 4096u64;
    let buf = DmaBuffer::new(&d.dev, (n * 4096) as usize).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    for b in 0..n {
        buf.write_bytes((b * 4096) as usize, &pattern(b)).unwrap();
    }
    // 255 threads (8 warps) share one queue: 4096 writes, block b -> LBA 2b.
    let writes: Vec<_> = (0..n).map(|b| rw(nvm_opcode::WRITE, 0, 2 * b, b * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &writes, 255, BUDGET).unwrap();
    assert!(
        st.iter().all(|s| *s == GpuStatus::Success),
        "{:?}",
        st.iter().find(|s| **s != GpuStatus::Success)
    );
    buf.fill(0);
    // Read back in reverse order.
    let reads: Vec<_> = (0..n).map(|b| rw(nvm_opcode::READ, 0, 2 * (n - 1 - b), b * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &reads, 255, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success));
    let mut got = vec![0u8; 4096];
    for b in 0..n {
        buf.read_bytes((b * 4096) as usize, &mut got).unwrap();
        assert!(got == pattern(n - 1 - b), "block {b}");
    }
    let stats = d.emu.stats();
    assert_eq!(stats.doorbell_violations, 0, "the SQ tail never moved backwards or past the ring");
    assert_eq!(stats.commands - stats.admin_commands, 2 * n);
    assert_eq!(q.stale_completions().unwrap(), 0);
}

#[test]
fn two_entry_queue_wraps_a_thousand_times_from_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "wrap", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 2, 1).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let buf = DmaBuffer::new(&d.dev, 8 * 4096).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    for b in 0..8 {
        buf.write_bytes(b * 4096, &pattern(b as u64)).unwrap();
    }
    // 2000 commands through a 2-entry queue: one in flight at a time, the
    // CQ phase flips every second completion: 1000 wraps.
    let reqs: Vec<_> = (0..2000u64).map(|k| rw(nvm_opcode::WRITE, 0, k % 64, (k % 8) * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &reqs, 32, BUDGET).unwrap();
    assert!(
        st.iter().all(|s| *s == GpuStatus::Success),
        "{:?}",
        st.iter().position(|s| *s != GpuStatus::Success)
    );
    assert_eq!(d.emu.stats().doorbell_violations, 0);
    buf.fill(0);
    let reads: Vec<_> = (0..8u64).map(|b| rw(nvm_opcode::READ, 0, 56 + b, b * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &reads, 32, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success));
    let mut got = vec![0u8; 4096];
    for b in 0..8u64 {
        // LBA 56 + b was last written by k = 1976 + b, from buffer block b.
        buf.read_bytes((b * 4096) as usize, &mut got).unwrap();
        assert!(got == pattern(b), "block {b}");
    }
}

#[test]
fn fused_kernel_over_four_drives_with_data_verified() {
    let Some(gpu) = gpu() else { return };
    let mut drives: Vec<Drive> = (0..4).map(|i| drive(&gpu, &format!("fused{i}"), |_| {})).collect();
    let n = 1024u64;
    // One host buffer, mapped by each emulated drive (its own IOVA space).
    let buf = DmaBuffer::new(&drives[0].dev, (n * 4096) as usize).unwrap();
    let mut queues = Vec::new();
    let mut regions = Vec::new();
    for d in &mut drives {
        let qp = d.ctrl.create_io_queue_pair(1, 128, 127).unwrap();
        queues.push(GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap());
        // Map the same host buffer into this drive's IOVA space.
        // SAFETY: `buf` outlives every use (dropped after the drives' runs).
        #[allow(unsafe_code)]
        let m = unsafe { d.dev.dma_map(std::ptr::NonNull::new(buf.host_ptr()).unwrap(), buf.len()) }.unwrap();
        regions.push(GpuRegion::new(&gpu, &m, buf.len()).unwrap());
    }
    let batch: Vec<_> = queues.iter().zip(&regions).collect();
    for b in 0..n {
        buf.write_bytes((b * 4096) as usize, &pattern(b)).unwrap();
    }
    // Stripe 4 KiB blocks round robin over the four drives: block b -> drive
    // b % 4, LBA b / 4. One launch, four blocks of threads.
    let writes: Vec<_> = (0..n).map(|b| rw(nvm_opcode::WRITE, (b % 4) as u16, b / 4, b * 4096)).collect();
    let st = gpu.run(&batch, &writes, 127, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success));
    buf.fill(0);
    let reads: Vec<_> = (0..n).map(|b| rw(nvm_opcode::READ, (b % 4) as u16, b / 4, b * 4096)).collect();
    let st = gpu.run(&batch, &reads, 127, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success));
    let mut got = vec![0u8; 4096];
    for b in 0..n {
        buf.read_bytes((b * 4096) as usize, &mut got).unwrap();
        assert!(got == pattern(b), "block {b}");
    }
    for d in &drives {
        let s = d.emu.stats();
        assert_eq!(s.commands - s.admin_commands, 2 * n / 4, "each drive served its quarter");
        assert_eq!(s.doorbell_violations, 0);
    }
}

#[test]
fn an_nvme_error_reaches_exactly_its_request() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "err", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let buf = DmaBuffer::new(&d.dev, 600 * 4096).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    // Request 17 reads past the namespace (65536 blocks): LBA Out of Range.
    let mut reqs: Vec<_> = (0..64u64).map(|b| rw(nvm_opcode::READ, 0, b, b * 4096)).collect();
    reqs[17].slba = 65536;
    // Request 40 asks for 520 pages: more than one PRP list page holds.
    reqs[40].len = 520 * 4096;
    reqs[40].nlb = 519;
    reqs[40].mem_offset = 0;
    let st = gpu.run(&[(&q, &region)], &reqs, 63, BUDGET).unwrap();
    for (i, s) in st.iter().enumerate() {
        match i {
            17 => match s {
                GpuStatus::Nvme(status) => assert_eq!((status.sct, status.sc), (0, 0x80), "{status}"),
                other => panic!("request 17: {other:?}"),
            },
            40 => assert_eq!(*s, GpuStatus::Unsupported),
            _ => assert_eq!(*s, GpuStatus::Success, "request {i}"),
        }
    }
}

#[test]
fn without_a_driver_open_is_a_typed_error() {
    // On the GPU machine this opens the GPU; elsewhere it must be NoDriver,
    // never a panic.
    match Gpu::open(0) {
        Ok(_) | Err(GpuError::NoDriver) | Err(GpuError::Driver { .. }) => {}
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn kv_blocks_in_gpu_memory_round_trip_through_the_emulator() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "gpumem", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 256, 255).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let n = 512u64;
    // Source and destination blocks live in GPU memory; the emulator moves
    // their bytes with CUDA copies when a PRP points into them.
    let src = Arc::new(GpuBuffer::zeroed(&gpu, (n * 4096) as usize).unwrap());
    let dst = Arc::new(GpuBuffer::zeroed(&gpu, (n * 4096) as usize).unwrap());
    for b in 0..n {
        src.copy_in((b * 4096) as usize, &pattern(b)).unwrap();
    }
    let ms = d.emu.map_external(src.clone()).unwrap();
    let md = d.emu.map_external(dst.clone()).unwrap();
    let (rs, rd) =
        (GpuRegion::new(&gpu, &ms, src.len()).unwrap(), GpuRegion::new(&gpu, &md, dst.len()).unwrap());
    let writes: Vec<_> = (0..n).map(|b| rw(nvm_opcode::WRITE, 0, b, b * 4096)).collect();
    let st = gpu.run(&[(&q, &rs)], &writes, 255, BUDGET).unwrap();
    assert!(
        st.iter().all(|s| *s == GpuStatus::Success),
        "{:?}",
        st.iter().find(|s| **s != GpuStatus::Success)
    );
    let reads: Vec<_> = (0..n).map(|b| rw(nvm_opcode::READ, 0, n - 1 - b, b * 4096)).collect();
    let st = gpu.run(&[(&q, &rd)], &reads, 255, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success));
    let mut got = vec![0u8; 4096];
    for b in 0..n {
        dst.copy_out((b * 4096) as usize, &mut got).unwrap();
        assert!(got == pattern(n - 1 - b), "block {b}");
    }
    assert_eq!(d.emu.stats().dma_faults, 0);
    d.dev.dma_unmap(&ms).unwrap();
    d.dev.dma_unmap(&md).unwrap();
}

#[test]
fn a_command_the_emulator_never_completes_times_out_alone() {
    use nvme_emu::{FaultAction, FaultMatch, FaultRule};
    let Some(gpu) = gpu() else { return };
    // The emulator fetches the read of LBA 7 but never completes it; a
    // second drive in the same launch is untouched.
    let mut a = drive(&gpu, "never", |c| {
        c.faults.push(FaultRule {
            matches: FaultMatch { lba: Some(7..8), ..Default::default() },
            action: FaultAction::NeverComplete,
            times: None,
            skip: 0,
        })
    });
    let mut b = drive(&gpu, "fine", |_| {});
    let qa = GpuQueue::new(&gpu, &a.gpu_drive, a.ctrl.create_io_queue_pair(1, 32, 31).unwrap()).unwrap();
    let qb = GpuQueue::new(&gpu, &b.gpu_drive, b.ctrl.create_io_queue_pair(1, 32, 31).unwrap()).unwrap();
    let ba = DmaBuffer::new(&a.dev, 16 * 4096).unwrap();
    let bb = DmaBuffer::new(&b.dev, 16 * 4096).unwrap();
    let (ra, rb) = (
        GpuRegion::new(&gpu, ba.mapping(), ba.len()).unwrap(),
        GpuRegion::new(&gpu, bb.mapping(), bb.len()).unwrap(),
    );
    let mut reqs: Vec<_> = (0..16u64).map(|l| rw(nvm_opcode::READ, 0, l, l * 4096)).collect();
    reqs.extend((0..16u64).map(|l| rw(nvm_opcode::READ, 1, l, l * 4096)));
    let t = std::time::Instant::now();
    let st = gpu.run(&[(&qa, &ra), (&qb, &rb)], &reqs, 31, Duration::from_millis(200)).unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(2), "the budget bounds the launch ({took:?})");
    assert!(
        took >= Duration::from_millis(200),
        "the stuck command was given up before its budget ({took:?})"
    );
    for (i, s) in st.iter().enumerate() {
        let want = if i == 7 { GpuStatus::Timeout } else { GpuStatus::Success };
        assert_eq!(*s, want, "request {i}");
    }
    assert_eq!(a.emu.stats().faults_injected, 1);
}

#[test]
fn large_transfers_build_prp_lists_on_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "lists", |c| c.mdts = 7); // 512 KiB per command
    let qp = d.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    // 32 blocks of 128 KiB (PRP1 + a 31-entry list each), one of them 0x200
    // into its page (33 pages: PRP1 + 32 list entries).
    let n = 32u64;
    let blk = 128 * 1024u64;
    let buf = DmaBuffer::new(&d.dev, ((n + 1) * blk) as usize).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    let data: Vec<u8> = (0..n * blk).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    buf.write_bytes(0, &data).unwrap();
    let req = |op, b: u64, off: u64| TuttiRequest {
        opcode: op,
        queue: 0,
        nsid: 1,
        slba: b * 32,
        nlb: 31,
        len: blk as u32,
        mem_offset: off,
        ..Default::default()
    };
    let writes: Vec<_> = (0..n).map(|b| req(nvm_opcode::WRITE, b, b * blk)).collect();
    let st = gpu.run(&[(&q, &region)], &writes, 63, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success), "{st:?}");
    buf.fill(0);
    // Read every block back 0x200 bytes further into the buffer.
    let reads: Vec<_> = (0..n).map(|b| req(nvm_opcode::READ, b, b * blk + 0x200)).collect();
    let st = gpu.run(&[(&q, &region)], &reads, 63, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success), "{st:?}");
    let mut got = vec![0u8; (n * blk) as usize];
    buf.read_bytes(0x200, &mut got).unwrap();
    assert!(got == data);
    assert_eq!(d.emu.stats().dma_faults, 0);
}

#[test]
fn an_emulator_injected_media_error_reaches_exactly_its_request() {
    use nvme_emu::{FaultAction, FaultMatch, FaultRule};
    use nvme_regs::status::media;
    use nvme_regs::Status;
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "media", |_| {});
    d.emu.add_fault(FaultRule {
        matches: FaultMatch { opcode: Some(nvm_opcode::READ), lba: Some(33..34), ..Default::default() },
        action: FaultAction::Fail(Status::media(media::UNRECOVERED_READ_ERROR).with_dnr(true)),
        times: None,
        skip: 0,
    });
    let qp = d.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let buf = DmaBuffer::new(&d.dev, 128 * 4096).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    let reqs: Vec<_> = (0..128u64).map(|b| rw(nvm_opcode::READ, 0, b, b * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &reqs, 63, BUDGET).unwrap();
    for (i, s) in st.iter().enumerate() {
        if i == 33 {
            let GpuStatus::Nvme(s) = s else { panic!("request 33: {s:?}") };
            assert_eq!((s.sct, s.sc, s.dnr), (2, 0x81, true), "{s}");
        } else {
            assert_eq!(*s, GpuStatus::Success, "request {i}");
        }
    }
    assert_eq!(d.emu.stats().faults_injected, 1);
}

#[test]
fn a_launch_on_the_callers_stream_runs_after_the_work_queued_before_it() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "callerstream", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let n = 64u64;
    let buf = Arc::new(GpuBuffer::zeroed(&gpu, (n * 4096) as usize).unwrap());
    buf.copy_in(0, &vec![0x11u8; (n * 4096) as usize]).unwrap();
    let scratch = GpuBuffer::zeroed(&gpu, 2 << 30).unwrap();
    let m = d.emu.map_external(buf.clone()).unwrap();
    let region = GpuRegion::new(&gpu, &m, buf.len()).unwrap();
    let s = gpu_io::GpuStream::new(&gpu).unwrap();
    // Queued first on the caller's stream: a 2 GiB memset (a millisecond
    // or more), then the buffer's new contents. The writes must see them.
    // SAFETY: both allocations are live and only this stream uses them
    // until it is synchronised (by the launch's wait).
    unsafe {
        cudarc::driver::result::memset_d8_async(scratch.device_ptr(), 0, scratch.len(), s.raw() as _)
            .unwrap();
        cudarc::driver::result::memset_d8_async(buf.device_ptr(), 0x5A, buf.len(), s.raw() as _).unwrap();
    }
    let writes: Vec<_> = (0..n).map(|b| rw(nvm_opcode::WRITE, 0, b, b * 4096)).collect();
    // SAFETY: `s` outlives the launch (waited on below).
    let launch = unsafe { gpu.launch_on(&[(&q, &region)], &writes, 63, BUDGET, Some(s.raw())) }.unwrap();
    assert_ne!(launch.event(), 0);
    let st = launch.wait().unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success), "{st:?}");
    let mut media = vec![0u8; (n * 4096) as usize];
    d.emu.read_media(1, 0, &mut media).unwrap();
    assert!(media.iter().all(|&b| b == 0x5A), "the kernel ran before the work queued ahead of it");
    d.dev.dma_unmap(&m).unwrap();
}

#[test]
fn the_legacy_default_stream_is_refused() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "legacystream", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 8, 7).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let buf = Arc::new(GpuBuffer::zeroed(&gpu, 4096).unwrap());
    let m = d.emu.map_external(buf.clone()).unwrap();
    let region = GpuRegion::new(&gpu, &m, 4096).unwrap();
    // SAFETY: refused before anything is queued.
    let r = unsafe { gpu.launch_on(&[(&q, &region)], &[rw(nvm_opcode::READ, 0, 0, 0)], 1, BUDGET, Some(0)) };
    assert!(matches!(r, Err(GpuError::LegacyStream)), "{r:?}");
    d.dev.dma_unmap(&m).unwrap();
}

#[test]
fn launches_on_two_streams_that_share_a_queue_take_turns() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "twostreams", |c| {
        c.timing = Some(nvme_emu::TimingModel {
            latency: Duration::from_micros(200),
            bandwidth_bytes_per_s: None,
            iops: None,
        })
    });
    // A 16-entry queue: two kernels of 15 threads each on it at once would
    // overrun the SQ; each launch must wait for the other on the GPU.
    let qp = d.ctrl.create_io_queue_pair(1, 16, 15).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let n = 256u64;
    let buf = Arc::new(GpuBuffer::zeroed(&gpu, (2 * n * 4096) as usize).unwrap());
    for b in 0..n {
        buf.copy_in((b * 4096) as usize, &pattern(b)).unwrap();
    }
    let m = d.emu.map_external(buf.clone()).unwrap();
    let region = GpuRegion::new(&gpu, &m, buf.len()).unwrap();
    let (s1, s2) = (gpu_io::GpuStream::new(&gpu).unwrap(), gpu_io::GpuStream::new(&gpu).unwrap());
    let writes: Vec<_> = (0..n).map(|b| rw(nvm_opcode::WRITE, 0, b, b * 4096)).collect();
    // SAFETY: both streams outlive their launches (waited on below).
    let w = unsafe { gpu.launch_on(&[(&q, &region)], &writes, 15, BUDGET, Some(s1.raw())) }.unwrap();
    let reads: Vec<_> = (0..n).map(|b| rw(nvm_opcode::READ, 0, b, (n + b) * 4096)).collect();
    // SAFETY: as above.
    let r = unsafe { gpu.launch_on(&[(&q, &region)], &reads, 15, BUDGET, Some(s2.raw())) }.unwrap();
    let (ws, rs) = (w.wait().unwrap(), r.wait().unwrap());
    assert!(ws.iter().chain(&rs).all(|s| *s == GpuStatus::Success), "{ws:?} {rs:?}");
    let mut got = vec![0u8; 4096];
    for b in 0..n {
        buf.copy_out(((n + b) * 4096) as usize, &mut got).unwrap();
        assert!(got == pattern(b), "block {b}: the read did not run after the write");
    }
    assert_eq!(q.stale_completions().unwrap(), 0);
    assert_eq!(d.emu.stats().doorbell_violations, 0);
    d.dev.dma_unmap(&m).unwrap();
}

/// A queue listed twice in one launch is refused: its two blocks would
/// each keep up to `size - 1` commands in flight on it.
#[test]
fn a_queue_listed_twice_in_one_launch_is_refused() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "twice", |_| {});
    let q = GpuQueue::new(&gpu, &d.gpu_drive, d.ctrl.create_io_queue_pair(1, 16, 15).unwrap()).unwrap();
    let buf = DmaBuffer::new(&d.dev, 4096).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    let reqs = [rw(nvm_opcode::READ, 0, 0, 0), rw(nvm_opcode::READ, 1, 1, 0)];
    let e = gpu.run(&[(&q, &region), (&q, &region)], &reqs, 4, BUDGET).unwrap_err();
    assert!(matches!(e, GpuError::QueueTwice { qid: 1 }), "{e}");
    let st = gpu.run(&[(&q, &region)], &reqs[..1], 4, BUDGET).unwrap();
    assert_eq!(st, vec![GpuStatus::Success]);
}

/// Block-cooperative reaping against a controller that misbehaves: every
/// LBA 16..20 read is completed twice (the duplicate lands in the next CQ
/// slot, often in the same warp's pass), LBA 100's CQE names a CID nobody
/// waits for (so that command never completes), LBA 200's CQE comes 300 ms
/// late (after its 100 ms budget), LBA 300's SQHD lags one entry. Every
/// other request gets its own success and its own bytes; the two orphans
/// time out alone; every extra CQE is dropped and counted, never delivered.
#[test]
fn warp_reaping_drops_unknown_duplicate_and_late_completions() {
    use nvme_emu::{FaultAction, FaultMatch, FaultRule};
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "warpreap", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 64, 63).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let n = 512u64;
    let buf = DmaBuffer::new(&d.dev, (n * 4096) as usize).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    let data: Vec<u8> = (0..n).flat_map(pattern).collect();
    buf.write_bytes(0, &data).unwrap();
    let writes: Vec<_> = (0..n).map(|b| rw(nvm_opcode::WRITE, 0, b, b * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &writes, 63, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success), "{st:?}");
    assert_eq!(q.protocol_counters().unwrap(), GpuQueueCounters::default());

    let rule = |lba: std::ops::Range<u64>, action| FaultRule {
        matches: FaultMatch {
            opcode: Some(nvm_opcode::READ),
            lba: Some(lba),
            io_only: true,
            ..Default::default()
        },
        action,
        times: None,
        skip: 0,
    };
    d.emu.add_fault(rule(16..20, FaultAction::CompleteTwice));
    d.emu.add_fault(rule(100..101, FaultAction::UnknownCid(0xFFF0)));
    d.emu.add_fault(rule(200..201, FaultAction::Delay(Duration::from_millis(300))));
    d.emu.add_fault(rule(300..301, FaultAction::LaggingSqhd));
    buf.fill(0);
    let reads: Vec<_> = (0..n).map(|b| rw(nvm_opcode::READ, 0, b, b * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &reads, 63, Duration::from_millis(100)).unwrap();
    let mut got = vec![0u8; (n * 4096) as usize];
    buf.read_bytes(0, &mut got).unwrap();
    for (i, s) in st.iter().enumerate() {
        if i == 100 || i == 200 {
            assert_eq!(*s, GpuStatus::Timeout, "request {i}");
        } else {
            assert_eq!(*s, GpuStatus::Success, "request {i}");
            let r = i * 4096..(i + 1) * 4096;
            assert!(got[r.clone()] == data[r], "request {i}: wrong bytes");
        }
    }

    // After the late CQE has landed, a second launch on the same queue
    // reaps it first (and any duplicate left behind by the first launch):
    // two duplicates' worth per LBA 16..20, the unknown CID and the late one.
    std::thread::sleep(Duration::from_millis(500));
    d.emu.clear_faults();
    buf.fill(0);
    let st = gpu.run(&[(&q, &region)], &reads, 63, BUDGET).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success), "{st:?}");
    buf.read_bytes(0, &mut got).unwrap();
    assert!(got == data, "second launch: wrong bytes");
    let c = q.protocol_counters().unwrap();
    assert_eq!(c.stale, 4 + 1 + 1, "{c:?}");
    assert_eq!(c.bad_sqid, 0, "{c:?}");
    assert_eq!(d.emu.stats().faults_injected, 4 + 1 + 1 + 1);
}

/// The bare ring probe drives a queue without the protocol and hands it
/// back in a state `tutti_io` continues from: a probe run, then a verified
/// write and read on the same queue, with no stale completion.
#[test]
fn the_ring_probe_completes_every_entry_and_leaves_the_queue_usable() {
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "probe", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 32, 31).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let n = 64u64;
    let buf = DmaBuffer::new(&d.dev, (n * 4096) as usize).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    // 1000 one-block reads: 33 bursts of 31 and a last one of 7, wrapping
    // the 32-entry rings many times.
    let probe: Vec<_> = (0..1000u64).map(|k| rw(nvm_opcode::READ, 0, k % 4096, (k % n) * 4096)).collect();
    let host = std::time::Instant::now();
    let (st, kernel) = gpu.run_ring_probe(&[(&q, &region)], &probe, 31, BUDGET).unwrap();
    let kernel = kernel.expect("the probe kernel is timed");
    assert!(st.iter().all(|s| *s == GpuStatus::Success), "{st:?}");
    assert!(kernel > Duration::ZERO && kernel <= host.elapsed(), "probe kernel time {kernel:?}");
    let data: Vec<u8> = (0..n).flat_map(pattern).collect();
    buf.write_bytes(0, &data).unwrap();
    let writes: Vec<_> = (0..n).map(|b| rw(nvm_opcode::WRITE, 0, b, b * 4096)).collect();
    assert!(gpu.run(&[(&q, &region)], &writes, 31, BUDGET).unwrap().iter().all(|s| *s == GpuStatus::Success));
    buf.fill(0);
    let reads: Vec<_> = (0..n).map(|b| rw(nvm_opcode::READ, 0, b, b * 4096)).collect();
    // A timed launch reports its kernel's GPU time, within the host's view
    // of the whole launch; an untimed one none.
    let host = std::time::Instant::now();
    let (st, kernel) = gpu.launch_timed(&[(&q, &region)], &reads, 31, BUDGET).unwrap().wait_timed().unwrap();
    let kernel = kernel.expect("a timed launch has a kernel time");
    assert!(kernel > Duration::ZERO && kernel <= host.elapsed(), "kernel time {kernel:?}");
    assert!(st.iter().all(|s| *s == GpuStatus::Success));
    let mut got = vec![0u8; (n * 4096) as usize];
    buf.read_bytes(0, &mut got).unwrap();
    assert!(got == data);
    let (_, untimed) = gpu.launch(&[(&q, &region)], &reads, 31, BUDGET).unwrap().wait_timed().unwrap();
    assert_eq!(untimed, None);
    assert_eq!(q.protocol_counters().unwrap(), GpuQueueCounters::default());
    assert_eq!(d.emu.stats().cq_full_stalls, 0);
}

/// CIDs are taken only from free completion cells: a command the drive
/// never completes keeps its CID out of use, however many commands follow
/// it on the queue within its budget. With CIDs derived from tickets (mod
/// 65536), the 65,536th command after it shared its cell, and either could
/// take the other's completion (the stuck one then "succeeded" with no data
/// moved).
#[test]
fn a_command_stuck_past_65536_newer_commands_never_shares_its_cid() {
    use nvme_emu::{FaultAction, FaultMatch, FaultRule};
    let Some(gpu) = gpu() else { return };
    let mut d = drive(&gpu, "cidreuse", |_| {});
    let qp = d.ctrl.create_io_queue_pair(1, 256, 255).unwrap();
    let q = GpuQueue::new(&gpu, &d.gpu_drive, qp).unwrap();
    let buf = DmaBuffer::new(&d.dev, 256 * 4096).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    d.emu.add_fault(FaultRule {
        matches: FaultMatch {
            opcode: Some(nvm_opcode::READ),
            lba: Some(5..6),
            io_only: true,
            ..Default::default()
        },
        action: FaultAction::NeverComplete,
        times: Some(1),
        skip: 0,
    });
    // Request 0 reads LBA 5 (stuck); 70,000 more reads follow on the queue.
    let reqs: Vec<_> = (0..70_001u64)
        .map(|k| {
            if k == 0 {
                rw(nvm_opcode::READ, 0, 5, 0)
            } else {
                rw(nvm_opcode::READ, 0, 16 + k % 4000, (k % 256) * 4096)
            }
        })
        .collect();
    let st = gpu.run(&[(&q, &region)], &reqs, 255, Duration::from_secs(8)).unwrap();
    assert_eq!(st[0], GpuStatus::Timeout, "the stuck command must not take another's completion");
    let bad: Vec<_> =
        st.iter().enumerate().skip(1).filter(|(_, s)| **s != GpuStatus::Success).take(5).collect();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(q.protocol_counters().unwrap().stale, 0);
    assert_eq!(d.emu.stats().faults_injected, 1);
}

/// GPU null controllers (`kernels/tutti_null.cu`) play the I/O side of two
/// emulated controllers whose threads leave their I/O queues alone: the
/// full `tutti_io` protocol runs against them (CIDs, SQHD, phase tags, CQ
/// head doorbells over many wraps), an out-of-range LBA, another namespace
/// and an unknown opcode reach exactly their requests with the statuses a
/// controller returns, and each warp reports every command it served.
#[test]
fn null_controllers_on_the_gpu_serve_the_full_protocol() {
    let Some(gpu) = gpu() else { return };
    null_protocol(&gpu, false);
}

/// As above with the SQs, CQs and doorbells in GPU memory
/// (`GpuQueue::with_device_rings`): the same statuses, reports and
/// counters; such a queue cannot be re-created on a controller.
#[test]
fn null_controllers_serve_queues_whose_rings_are_in_gpu_memory() {
    let Some(gpu) = gpu() else { return };
    let mut drives = null_protocol(&gpu, true);
    let qp = drives[0].ctrl.create_io_queue_pair(3, 16, 15).unwrap();
    let q = GpuQueue::with_device_rings(&gpu, &drives[0].gpu_drive, qp).unwrap();
    assert!(q.has_device_rings());
    let e = q.recreate(&mut drives[0].ctrl).unwrap_err();
    assert!(matches!(e, GpuError::DeviceRings { qid: 3 }), "{e}");
}

/// 20,000 reads over four queues of two detached drives served by GPU null
/// controllers (rings in GPU memory for `device_rings`); returns the
/// drives.
fn null_protocol(gpu: &Gpu, device_rings: bool) -> Vec<Drive> {
    let mut drives: Vec<Drive> =
        (0..2).map(|i| drive(gpu, &format!("null{i}"), |c| c.io_queues_detached = true)).collect();
    let mut queues = Vec::new();
    let mut bufs = Vec::new();
    let mut regions = Vec::new();
    let mut tail_doorbells = Vec::new();
    for (di, d) in drives.iter_mut().enumerate() {
        for qid in 1..=2u16 {
            let qp = d.ctrl.create_io_queue_pair(qid, 16, 15).unwrap();
            tail_doorbells.push((di, qp.sq().doorbell_offset()));
            queues.push(
                if device_rings {
                    GpuQueue::with_device_rings(gpu, &d.gpu_drive, qp)
                } else {
                    GpuQueue::new(gpu, &d.gpu_drive, qp)
                }
                .unwrap(),
            );
            let buf = DmaBuffer::new(&d.dev, 4096).unwrap();
            regions.push(GpuRegion::new(gpu, buf.mapping(), 4096).unwrap());
            bufs.push(buf);
        }
    }
    let refs: Vec<&GpuQueue> = queues.iter().collect();
    let ctrls = gpu.start_null_controllers(&refs, 65536).unwrap();
    // 20,000 reads over 4 queues of 16 entries: each CQ wraps ~300 times.
    let n = 20_000u64;
    let mut reqs: Vec<_> = (0..n).map(|k| rw(nvm_opcode::READ, (k % 4) as u16, k % 65536, 0)).collect();
    reqs[101].slba = 65536; // past the namespace
    reqs[202].nsid = 2;
    reqs[303].opcode = 0x7F;
    let batch: Vec<_> = queues.iter().zip(&regions).collect();
    let st = gpu.run(&batch, &reqs, 15, BUDGET).unwrap();
    for (i, s) in st.iter().enumerate() {
        let want = match i {
            101 => Some(0x80),
            202 => Some(0x0B),
            303 => Some(0x01),
            _ => None,
        };
        match (want, s) {
            (None, GpuStatus::Success) => {}
            (Some(sc), GpuStatus::Nvme(status)) => {
                assert_eq!((status.sct, status.sc, status.dnr), (0, sc, true), "request {i}")
            }
            _ => panic!("request {i}: {s:?}, expected {want:?}"),
        }
    }
    let reports = ctrls.stop().unwrap();
    assert_eq!(reports.iter().map(|r| r.served).sum::<u64>(), n);
    for (q, r) in queues.iter().zip(&reports) {
        assert_eq!(r.served, n / 4, "queue {}: {r:?}", q.qid());
        assert_eq!(r.bad_doorbells, 0, "{r:?}");
        assert_eq!(q.protocol_counters().unwrap(), GpuQueueCounters::default(), "queue {}", q.qid());
    }
    for d in &drives {
        let s = d.emu.stats();
        assert_eq!(s.commands, s.admin_commands, "the emulators' threads served no I/O: {s:?}");
    }
    // The SQ tail doorbells in the register pages moved only if the rings
    // are the host's: 5,000 commands per queue of 16 leave the tail at 8.
    for (i, &(di, at)) in tail_doorbells.iter().enumerate() {
        let tail = drives[di].dev.bar0().read32(at).unwrap();
        assert_eq!(tail, if device_rings { 0 } else { 8 }, "queue {i}'s tail doorbell in the register page");
    }
    // A used queue is refused.
    assert!(matches!(
        gpu.start_null_controllers(&refs, 65536),
        Err(GpuError::NullControllerQueueUsed { .. })
    ));
    drop(refs);
    drop(queues);
    drives
}

#[test]
fn a_ring_of_timed_out_commands_frees_its_slots_when_they_complete_late() {
    use nvme_emu::{FaultAction, FaultMatch, FaultRule};
    let Some(gpu) = gpu() else { return };
    // An 8-entry ring (7 commands at most in flight). The first 7 reads
    // complete 600 ms late, past the launch's 200 ms budget: every entry
    // of the ring belongs to a timed-out command.
    let mut d = drive(&gpu, "late", |c| {
        c.faults.push(FaultRule {
            matches: FaultMatch { opcode: Some(nvm_opcode::READ), io_only: true, ..Default::default() },
            action: FaultAction::Delay(Duration::from_millis(600)),
            times: Some(7),
            skip: 0,
        })
    });
    let q = GpuQueue::new(&gpu, &d.gpu_drive, d.ctrl.create_io_queue_pair(1, 8, 7).unwrap()).unwrap();
    let buf = DmaBuffer::new(&d.dev, 16 * 4096).unwrap();
    let region = GpuRegion::new(&gpu, buf.mapping(), buf.len()).unwrap();
    let reqs: Vec<_> = (0..7u64).map(|l| rw(nvm_opcode::READ, 0, l, l * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &reqs, 7, Duration::from_millis(200)).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Timeout), "{st:?}");
    // The late completions arrive while no kernel runs.
    std::thread::sleep(Duration::from_millis(800));
    // The next launch reaps them first: their CIDs come back and their
    // entries are known fetched, so the ring takes commands again.
    let reqs: Vec<_> = (8..24u64).map(|l| rw(nvm_opcode::READ, 0, l, (l - 8) * 4096)).collect();
    let st = gpu.run(&[(&q, &region)], &reqs, 7, Duration::from_secs(2)).unwrap();
    assert!(st.iter().all(|s| *s == GpuStatus::Success), "{st:?}");
    assert_eq!(q.protocol_counters().unwrap().stale, 7, "the seven late CQEs were dropped as stale");
    assert_eq!(d.emu.stats().faults_injected, 7);
}
