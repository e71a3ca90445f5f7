//! The emulated DMA engine: data in external memory that copies
//! asynchronously ([`ExternalMemory::start_read`] / `start_write` and a
//! fence). A command's CQE must appear only after its copies have ended,
//! with Data Transfer Error when they failed; the timing model still
//! applies; Delete I/O SQ, reset and shutdown wait for copies in flight;
//! and the RAM media is page-locked through a [`PageLocker`].
//!
//! The engine here ([`Gated`]) runs its copies only when the test opens
//! its gate, so "not before the data has moved" is observable.
#![allow(unsafe_code, missing_docs)]

mod common;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use nvme_emu::{CopyFence, ExternalMemory, FenceState, HostPin, PageLocker, TimingModel};
use nvme_regs::status::generic as gsc;
use nvme_regs::Status;

/// One queued copy: raw host address, offset in the memory, length, and
/// direction (`true`: memory -> host).
#[derive(Debug, Clone, Copy)]
struct Copy {
    host: usize,
    offset: usize,
    len: usize,
    to_host: bool,
}

/// External memory whose asynchronous copies wait for the test's gate.
#[derive(Debug, Default)]
struct Gated {
    data: Mutex<Vec<u8>>,
    queued: Mutex<Vec<Copy>>,
    /// Copies started so far / run so far (a fence waits for its count).
    started: AtomicU64,
    done: AtomicU64,
    /// The next `release` reports its copies as failed (and runs none).
    fail: AtomicBool,
    failed_upto: AtomicU64,
    /// Copies run asynchronously (not through read/write).
    async_copies: AtomicUsize,
    /// Fences asked for.
    fences: AtomicUsize,
}

impl Gated {
    fn new(data: Vec<u8>) -> Arc<Self> {
        Arc::new(Self { data: Mutex::new(data), ..Default::default() })
    }

    /// Runs every queued copy (or fails them all).
    fn release(&self) {
        let copies: Vec<Copy> = std::mem::take(&mut *self.queued.lock().unwrap());
        let fail = self.fail.swap(false, Ordering::SeqCst);
        let mut data = self.data.lock().unwrap();
        for c in &copies {
            if fail {
                continue;
            }
            let mem = &mut data[c.offset..c.offset + c.len];
            // SAFETY: the emulator keeps the host range (its RAM media)
            // allocated and untouched until the fence completes, which is
            // after this copy (`done` is advanced below).
            unsafe {
                if c.to_host {
                    std::ptr::copy_nonoverlapping(mem.as_ptr(), c.host as *mut u8, c.len);
                } else {
                    std::ptr::copy_nonoverlapping(c.host as *const u8, mem.as_mut_ptr(), c.len);
                }
            }
        }
        let n = copies.len() as u64;
        let upto = self.done.load(Ordering::SeqCst) + n;
        if fail {
            self.failed_upto.store(upto, Ordering::SeqCst);
        }
        self.async_copies.fetch_add(copies.len(), Ordering::SeqCst);
        self.done.store(upto, Ordering::SeqCst);
    }

    fn queue(&self, c: Copy) -> Option<bool> {
        if c.offset + c.len > self.data.lock().unwrap().len() {
            return Some(false);
        }
        self.queued.lock().unwrap().push(c);
        self.started.fetch_add(1, Ordering::SeqCst);
        Some(true)
    }
}

/// The fence of [`Gated`]: done once `done` reaches `upto`.
#[derive(Debug)]
struct GateFence {
    mem: Arc<Gated>,
    upto: u64,
}

impl CopyFence for GateFence {
    fn state(&self) -> FenceState {
        if self.mem.done.load(Ordering::SeqCst) < self.upto {
            FenceState::Pending
        } else if self.mem.failed_upto.load(Ordering::SeqCst) >= self.upto {
            FenceState::Failed
        } else {
            FenceState::Done
        }
    }
    fn wait(&self) -> FenceState {
        let deadline = Instant::now() + TIMEOUT;
        while self.state() == FenceState::Pending {
            assert!(Instant::now() < deadline, "fence never completed");
            std::thread::sleep(Duration::from_micros(100));
        }
        self.state()
    }
}

/// `Arc<Gated>` as the mapped memory (the fence needs the `Arc`).
#[derive(Debug)]
struct Mapped(Arc<Gated>);

impl ExternalMemory for Mapped {
    fn len(&self) -> u64 {
        self.0.data.lock().unwrap().len() as u64
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> bool {
        let d = self.0.data.lock().unwrap();
        let o = offset as usize;
        d.get(o..o + dst.len()).map(|s| dst.copy_from_slice(s)).is_some()
    }
    fn write(&self, offset: u64, src: &[u8]) -> bool {
        let mut d = self.0.data.lock().unwrap();
        let o = offset as usize;
        d.get_mut(o..o + src.len()).map(|s| s.copy_from_slice(src)).is_some()
    }
    unsafe fn start_read(&self, offset: u64, dst: NonNull<u8>, len: usize) -> Option<bool> {
        self.0.queue(Copy { host: dst.as_ptr() as usize, offset: offset as usize, len, to_host: true })
    }
    unsafe fn start_write(&self, offset: u64, src: NonNull<u8>, len: usize) -> Option<bool> {
        self.0.queue(Copy { host: src.as_ptr() as usize, offset: offset as usize, len, to_host: false })
    }
    fn fence(&self) -> Box<dyn CopyFence> {
        self.0.fences.fetch_add(1, Ordering::SeqCst);
        Box::new(GateFence { mem: self.0.clone(), upto: self.0.started.load(Ordering::SeqCst) })
    }
}

const BLOCK: usize = 4096;

/// An emulator (namespace 1: 4 KiB blocks) with I/O queue 1, and `mem`
/// mapped; returns the harness, the queue and `mem`'s device address.
fn setup(config: nvme_emu::EmulatorConfig, mem: &Arc<Gated>) -> (Harness, Queue, u64) {
    let mut h = Harness::start(config);
    let q = h.create_io(1, 16);
    let m = h.emu.map_external(Arc::new(Mapped(mem.clone()))).unwrap();
    let base = m.addr(0).unwrap();
    (h, q, base)
}

fn ring(h: &Harness, q: &Queue) {
    h.ring_sq(q.qid, q.sq_tail);
}

/// No CQE for `for_` (the controller keeps polling meanwhile).
fn assert_no_cqe(q: &Queue, for_: Duration) {
    let end = Instant::now() + for_;
    while Instant::now() < end {
        assert!(q.peek().is_none(), "a CQE appeared before its copies ended");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn take_cqe(h: &Harness, q: &mut Queue) -> nvme_regs::Cqe {
    let c = wait_for(|| q.peek()).expect("no CQE after the copies ended");
    q.pop();
    h.ring_cq(q.qid, q.cq_head);
    c
}

#[test]
fn a_write_and_a_read_complete_only_after_their_copies_have_run() {
    let data = pattern(2 * BLOCK, 7);
    let mem = Gated::new([data.clone(), vec![0; 2 * BLOCK]].concat());
    let (h, mut q, base) = setup(config("dma-order"), &mem);
    // Write 2 blocks from the memory's first half to LBA 10.
    q.push(rw(0x01, 1, 10, 2, base, base + BLOCK as u64));
    ring(&h, &q);
    assert_no_cqe(&q, Duration::from_millis(50));
    assert_eq!(mem.started.load(Ordering::SeqCst), 1, "the command was executed at fetch");
    mem.release();
    let c = take_cqe(&h, &mut q);
    assert_eq!(c.status(), Status::SUCCESS);
    let mut media = vec![0u8; 2 * BLOCK];
    h.emu.read_media(1, 10 * BLOCK as u64, &mut media).unwrap();
    assert_eq!(media, data, "the media holds the written bytes once the CQE is there");
    // Read them back into the second half.
    let dst = base + 2 * BLOCK as u64;
    q.push(rw(0x02, 1, 10, 2, dst, dst + BLOCK as u64));
    ring(&h, &q);
    assert_no_cqe(&q, Duration::from_millis(50));
    assert_eq!(mem.data.lock().unwrap()[2 * BLOCK..], vec![0u8; 2 * BLOCK][..], "no byte before the copy");
    mem.release();
    assert_eq!(take_cqe(&h, &mut q).status(), Status::SUCCESS);
    assert_eq!(mem.data.lock().unwrap()[2 * BLOCK..], data[..]);
    assert_eq!(mem.async_copies.load(Ordering::SeqCst), 2, "both went through the asynchronous path");
}

#[test]
fn commands_of_one_burst_share_one_fence_and_complete_after_it() {
    let data = pattern(4 * BLOCK, 9);
    let mem = Gated::new(vec![0; 4 * BLOCK]);
    let (h, mut q, base) = setup(config("dma-burst"), &mem);
    h.emu.write_media(1, 0, &data).unwrap();
    // Four reads behind one doorbell write: one burst.
    for k in 0..4u64 {
        q.push(rw(0x02, 1, k, 1, base + k * BLOCK as u64, 0));
    }
    ring(&h, &q);
    wait_for(|| (mem.started.load(Ordering::SeqCst) == 4).then_some(())).unwrap();
    assert_no_cqe(&q, Duration::from_millis(30));
    assert_eq!(mem.fences.load(Ordering::SeqCst), 1, "one fence for the burst, not one per command");
    mem.release();
    for _ in 0..4 {
        assert_eq!(take_cqe(&h, &mut q).status(), Status::SUCCESS);
    }
    assert_eq!(*mem.data.lock().unwrap(), data);
}

#[test]
fn commands_fetched_from_two_sqs_in_one_poll_share_one_fence() {
    let data = pattern(2 * BLOCK, 11);
    let mem = Gated::new(vec![0; 2 * BLOCK]);
    let (mut h, mut q1, base) = setup(config("dma-two-sqs"), &mem);
    let mut q2 = h.create_io(2, 16);
    h.emu.write_media(1, 0, &data).unwrap();
    // Both doorbells rung back to back while the controller naps: both
    // SQs are then drained in one poll iteration, and their commands are
    // one burst with one fence (before, one fence per SQ). A poll between
    // the two stores would see them apart, so the round is repeated: one
    // round with a single fence is enough, and none ever had one before.
    let mut single = false;
    for round in 0..5u64 {
        std::thread::sleep(Duration::from_millis(60));
        let before = mem.fences.load(Ordering::SeqCst);
        let started = mem.started.load(Ordering::SeqCst);
        q1.push(rw(0x02, 1, 0, 1, base, 0));
        q2.push(rw(0x02, 1, 1, 1, base + BLOCK as u64, 0));
        ring(&h, &q1);
        ring(&h, &q2);
        wait_for(|| (mem.started.load(Ordering::SeqCst) == started + 2).then_some(())).unwrap();
        // The fences follow the drains: let the iteration end (the gate
        // stays closed, so nothing else happens meanwhile).
        std::thread::sleep(Duration::from_millis(20));
        let fences = mem.fences.load(Ordering::SeqCst) - before;
        single |= fences == 1;
        mem.release();
        assert_eq!(take_cqe(&h, &mut q1).status(), Status::SUCCESS, "round {round}");
        assert_eq!(take_cqe(&h, &mut q2).status(), Status::SUCCESS, "round {round}");
        assert_eq!(*mem.data.lock().unwrap(), data, "round {round}");
        mem.data.lock().unwrap().fill(0);
        if single {
            break;
        }
    }
    assert!(single, "the two SQs' commands never shared a fence");
}

#[test]
fn a_failed_copy_completes_its_command_with_data_transfer_error() {
    let mem = Gated::new(vec![0; BLOCK]);
    let (h, mut q, base) = setup(config("dma-fail"), &mem);
    q.push(rw(0x02, 1, 0, 1, base, 0));
    ring(&h, &q);
    wait_for(|| (mem.started.load(Ordering::SeqCst) == 1).then_some(())).unwrap();
    mem.fail.store(true, Ordering::SeqCst);
    mem.release();
    let c = take_cqe(&h, &mut q);
    assert_eq!(c.status().sct, 0);
    assert_eq!(c.status().sc, gsc::DATA_TRANSFER_ERROR, "{}", c.status());
    assert!(h.emu.stats().dma_faults >= 1);
}

#[test]
fn the_timing_model_still_applies_when_the_copies_end_at_once() {
    let mem = Gated::new(vec![0; BLOCK]);
    let mut cfg = config("dma-timing");
    cfg.timing =
        Some(TimingModel { bandwidth_bytes_per_s: None, iops: None, latency: Duration::from_millis(40) });
    let (h, mut q, base) = setup(cfg, &mem);
    let t0 = Instant::now();
    q.push(rw(0x02, 1, 0, 1, base, 0));
    ring(&h, &q);
    // Release the copy as soon as it is queued: the CQE still waits for
    // the modelled latency.
    wait_for(|| (mem.started.load(Ordering::SeqCst) == 1).then_some(())).unwrap();
    mem.release();
    let c = take_cqe(&h, &mut q);
    assert_eq!(c.status(), Status::SUCCESS);
    assert!(t0.elapsed() >= Duration::from_millis(40), "posted after {:?}", t0.elapsed());
}

/// Submits one read into `mem`, waits until its copy has started, and
/// returns a thread that runs the copy 100 ms later.
fn read_in_flight_released_later(
    h: &Harness,
    q: &mut Queue,
    base: u64,
    mem: &Arc<Gated>,
) -> std::thread::JoinHandle<()> {
    q.push(rw(0x02, 1, 0, 1, base, 0));
    ring(h, q);
    wait_for(|| (mem.started.load(Ordering::SeqCst) == 1).then_some(())).unwrap();
    let mem = mem.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        mem.release();
    })
}

#[test]
fn delete_sq_waits_for_copies_in_flight_and_aborts_their_commands() {
    let mem = Gated::new(vec![0; BLOCK]);
    let (mut h, q, base) = setup(config("dma-delete"), &mem);
    let mut q = q;
    let releaser = read_in_flight_released_later(&h, &mut q, base, &mem);
    let t0 = Instant::now();
    let mut del = nvme_regs::Sqe::new(0x00, 0);
    del.cdw10 = 1;
    let c = h.admin(del);
    assert_eq!(c.status(), Status::SUCCESS);
    assert!(t0.elapsed() >= Duration::from_millis(90), "Delete I/O SQ returned before the copy ran");
    releaser.join().unwrap();
    let aborted = take_cqe(&h, &mut q);
    assert_eq!(aborted.status().sc, gsc::ABORTED_SQ_DELETION, "{}", aborted.status());
    assert_eq!(mem.done.load(Ordering::SeqCst), 1);
}

#[test]
fn reset_waits_for_copies_in_flight() {
    let mem = Gated::new(vec![0; BLOCK]);
    let (h, q, base) = setup(config("dma-reset"), &mem);
    let mut q = q;
    let releaser = read_in_flight_released_later(&h, &mut q, base, &mem);
    let t0 = Instant::now();
    h.write_cc(nvme_regs::Cc(0));
    assert!(h.wait_csts(|c| !c.rdy()).is_some());
    assert!(t0.elapsed() >= Duration::from_millis(90), "the reset ended before the copy ran");
    releaser.join().unwrap();
    assert!(q.peek().is_none(), "a reset posts nothing");
}

/// A locker that records what it locked and when it was unlocked.
#[derive(Debug, Default)]
struct Recorder {
    locked: Mutex<Vec<(usize, usize)>>,
    unlocked: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct Guard(Arc<AtomicUsize>);
impl HostPin for Guard {}
impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl PageLocker for Recorder {
    unsafe fn lock(&self, host: NonNull<u8>, len: usize) -> Option<Box<dyn HostPin>> {
        self.locked.lock().unwrap().push((host.as_ptr() as usize, len));
        Some(Box::new(Guard(self.unlocked.clone())))
    }
}

#[test]
fn the_ram_media_is_page_locked_once_per_image_and_unlocked_at_power_loss() {
    let h = Harness::start(config("dma-lock"));
    let r = Recorder::default();
    assert_eq!(h.emu.lock_media_pages(&r), 2, "two namespaces, two images");
    assert_eq!(h.emu.lock_media_pages(&r), 2, "already locked: not again");
    let locked = r.locked.lock().unwrap().clone();
    assert_eq!(locked.iter().map(|l| l.1).collect::<Vec<_>>(), vec![1024 * 4096, 4096 * 512]);
    assert_eq!(r.unlocked.load(Ordering::SeqCst), 0);
    h.emu.power_fail();
    assert_eq!(r.unlocked.load(Ordering::SeqCst), 2, "unlocked before the media is released");
    drop(h);
}

#[test]
fn a_file_store_has_nothing_to_lock() {
    let dir = std::env::temp_dir().join(format!("tutti-dma-lock-{}", std::process::id()));
    let mut cfg = config("dma-file");
    cfg.backing = nvme_emu::BackingSpec::File(dir.clone());
    let h = Harness::start(cfg);
    assert_eq!(h.emu.lock_media_pages(&Recorder::default()), 0);
    drop(h);
    let _ = std::fs::remove_file(dir);
}

#[test]
fn memory_without_asynchronous_copies_keeps_the_synchronous_path() {
    // `Mapped`'s read/write are used when start_* says "unsupported": a
    // plain copy-only memory (the default trait methods).
    #[derive(Debug)]
    struct Plain(Mutex<Vec<u8>>);
    impl ExternalMemory for Plain {
        fn len(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read(&self, o: u64, dst: &mut [u8]) -> bool {
            let d = self.0.lock().unwrap();
            dst.copy_from_slice(&d[o as usize..o as usize + dst.len()]);
            true
        }
        fn write(&self, o: u64, src: &[u8]) -> bool {
            self.0.lock().unwrap()[o as usize..o as usize + src.len()].copy_from_slice(src);
            true
        }
    }
    let mut h = Harness::start(config("dma-plain"));
    let mut q = h.create_io(1, 16);
    let data = pattern(BLOCK, 3);
    let mem = Arc::new(Plain(Mutex::new(data.clone())));
    let m = h.emu.map_external(mem.clone()).unwrap();
    let base = m.addr(0).unwrap();
    let c = h.submit_on(&mut q, rw(0x01, 1, 5, 1, base, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    mem.0.lock().unwrap().fill(0);
    let c = h.submit_on(&mut q, rw(0x02, 1, 5, 1, base, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(*mem.0.lock().unwrap(), data);
    nvm_queue::NvmeDevice::dma_unmap(&*h.dev, &m).unwrap();
}
