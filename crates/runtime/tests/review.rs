//! Adversarial review tests: concurrency, recovery and shutdown races on
//! a 4-drive stripe of emulated drives, with every byte verified.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tutti::{Config, Error, HandleError, MemoryHandle, Request, RequestError, RequestStatus, Runtime};

const T: Duration = Duration::from_secs(5);

/// Four 16 MiB drives a..d (512-byte blocks) striped with a 128 KiB unit,
/// `queues` queue pairs of `depth` entries per drive; drive `fault_on` gets
/// the YAML fault list `fault`; 1 MiB slots.
fn stripe_with(queues: u16, depth: u32, fault_on: &str, fault: &str) -> Runtime {
    let drive = |name: &str| {
        let faults = if name == fault_on { format!(", faults: {fault}") } else { String::new() };
        format!("{name}: {{ emulated: {{ namespaces: [{{ capacity: 16MiB, block_size: 512 }}]{faults} }} }}")
    };
    let yaml = format!(
        "drives: {{ {}, {}, {}, {} }}
resolvers: {{ slots: {{ slab: {{ slot_size: 1MiB }} }} }}
datapaths: {{ s: {{ striped_local_nvme: {{ drives: [a, b, c, d], stripe_unit: 128KiB, queues_per_drive: {queues}, queue_depth: {depth} }} }} }}
stores: {{ kv: {{ resolver: slots, datapath: s }} }}
",
        drive("a"),
        drive("b"),
        drive("c"),
        drive("d")
    );
    Runtime::from_config(Config::from_yaml_str(&yaml).unwrap()).unwrap()
}

fn stripe() -> Runtime {
    stripe_with(2, 256, "", "")
}

/// Test-owned memory (u64s, so 8-byte aligned), viewed as bytes.
struct Buf {
    v: Vec<u64>,
}

impl Buf {
    fn new(bytes: usize) -> Self {
        Self { v: vec![0; bytes / 8] }
    }
    fn bytes(&mut self) -> &mut [u8] {
        let n = self.v.len() * 8;
        // SAFETY: u8 has no alignment or validity requirements; same length.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.v.as_mut_ptr().cast(), n)
        }
    }
    fn register(&mut self, rt: &Runtime) -> MemoryHandle {
        let n = self.v.len() * 8;
        // SAFETY: each test keeps the buffer alive past the runtime (or
        // unregisters first) and touches it only between submit and wait.
        #[allow(unsafe_code)]
        unsafe {
            rt.register_memory(self.v.as_mut_ptr().cast(), n).unwrap()
        }
    }
}

fn fill(b: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = c.len();
        c.copy_from_slice(&x.to_le_bytes()[..n]);
    }
}

/// Several threads write and read back their own 1 MiB slots (four drives,
/// two stripe units per drive, one command per piece) through shallow
/// queues, concurrently; every byte read must be the byte written, and the
/// runtime's counters must balance.
#[test]
fn concurrent_stripe_writers_and_readers_see_their_own_bytes() {
    let rt = Arc::new(stripe_with(2, 8, "", ""));
    let threads: Vec<_> = (0..4u64)
        .map(|ti| {
            let rt = rt.clone();
            std::thread::spawn(move || {
                let mut src = Buf::new(1 << 20);
                let mut dst = Buf::new(1 << 20);
                let (ms, md) = (src.register(&rt), dst.register(&rt));
                let t = rt.open(&format!("tutti://kv/{ti}")).unwrap();
                for round in 0..12u64 {
                    fill(src.bytes(), ti * 1000 + round);
                    // 16 x 64 KiB writes in one batch, then one 1 MiB read.
                    let ws: Vec<Request> =
                        (0..16u64).map(|k| Request::write(t, k << 16, 1 << 16, ms, k << 16)).collect();
                    let st = rt.wait(rt.submit(&ws).op().unwrap(), T).unwrap();
                    assert!(st.iter().all(RequestStatus::is_success), "{st:?}");
                    dst.bytes().fill(0xEE);
                    let st =
                        rt.wait(rt.submit(&[Request::read(t, 0, 1 << 20, md, 0)]).op().unwrap(), T).unwrap();
                    assert_eq!(st, [RequestStatus::Success]);
                    assert!(src.bytes() == dst.bytes(), "thread {ti} round {round}: data mismatch");
                }
                rt.unregister_memory(ms).unwrap();
                rt.unregister_memory(md).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = rt.stats();
    assert_eq!(s.commands_submitted, s.commands_completed, "{s:?}");
    assert_eq!((s.protocol_errors, s.late_completions), (0, 0), "{s:?}");
}

/// A 64-request batch over four drives with 4-entry queues (3 commands
/// outstanding per queue): the queue-full path reaps and retries, every
/// request succeeds and the data lands where each request says.
#[test]
fn a_batch_larger_than_every_queue_completes_and_lands_in_place() {
    let rt = stripe_with(1, 4, "", "");
    let mut src = Buf::new(4 << 20);
    let mut dst = Buf::new(4 << 20);
    fill(src.bytes(), 7);
    let (ms, md) = (src.register(&rt), dst.register(&rt));
    let reqs = |write: bool| -> Vec<Request> {
        (0..64u64)
            .map(|i| {
                // 64 KiB pieces of four slots, in an order that alternates drives.
                let t = rt.open(&format!("tutti://kv/{}", i % 4)).unwrap();
                let off = (i / 4) << 16;
                let mem = i << 16;
                if write {
                    Request::write(t, off, 1 << 16, ms, mem)
                } else {
                    Request::read(t, off, 1 << 16, md, mem)
                }
            })
            .collect()
    };
    let before = rt.stats();
    let st = rt.wait(rt.submit(&reqs(true)).op().unwrap(), T).unwrap();
    assert!(st.iter().all(RequestStatus::is_success), "{st:?}");
    let st = rt.wait(rt.submit(&reqs(false)).op().unwrap(), T).unwrap();
    assert!(st.iter().all(RequestStatus::is_success), "{st:?}");
    assert!(src.bytes() == dst.bytes());
    let s = rt.stats();
    assert_eq!(s.commands_submitted - before.commands_submitted, 128);
    assert_eq!(s.commands_completed - before.commands_completed, 128);
    // Each queue held 3: more than one doorbell write per queue per submit,
    // but never more than one per command.
    let db = s.sq_doorbell_writes - before.sq_doorbell_writes;
    assert!((8..=128).contains(&db), "{db} doorbell writes");
    rt.unregister_memory(ms).unwrap();
    rt.unregister_memory(md).unwrap();
}

/// `wait` and `try_wait` race on one handle: exactly one of them gets the
/// statuses, the other a stale-handle error (or `None` before the end).
#[test]
fn wait_and_try_wait_race_on_one_handle_exactly_one_gets_the_statuses() {
    let rt = Arc::new(stripe());
    let mut b = Buf::new(1 << 20);
    let m = b.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    for _ in 0..200 {
        let op = rt.submit(&[Request::write(t, 0, 1 << 20, m, 0)]).op().unwrap();
        let go = Arc::new(AtomicBool::new(false));
        let r2 = rt.clone();
        let g2 = go.clone();
        let poller = std::thread::spawn(move || {
            while !g2.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            loop {
                match r2.try_wait(op) {
                    Ok(None) => continue,
                    Ok(Some(st)) => return Some(st),
                    Err(Error::Handle(HandleError::Stale { .. })) => return None,
                    Err(e) => panic!("try_wait: {e}"),
                }
            }
        });
        go.store(true, Ordering::Release);
        let mine = match rt.wait(op, T) {
            Ok(st) => Some(st),
            Err(Error::Handle(HandleError::Stale { .. })) => None,
            Err(e) => panic!("wait: {e}"),
        };
        let theirs = poller.join().unwrap();
        match (mine, theirs) {
            (Some(st), None) | (None, Some(st)) => assert_eq!(st, [RequestStatus::Success]),
            (a, b) => panic!("both or neither got statuses: {a:?} / {b:?}"),
        }
    }
    rt.unregister_memory(m).unwrap();
}

/// A request spanning four drives, one of them failed: it fails (its piece
/// on the failed drive is not sent), the others are not disturbed, nothing
/// is left outstanding and the memory can go.
#[test]
fn a_request_over_a_failed_drive_fails_alone_and_leaves_nothing_behind() {
    let rt = stripe_with(2, 256, "b", "[{ op: read, lba: [0, 1], action: controller_fatal, times: 1 }]");
    let mut buf = Buf::new(2 << 20);
    let m = buf.register(&rt);
    let (t0, t1) = (rt.open("tutti://kv/0").unwrap(), rt.open("tutti://kv/1").unwrap());
    // Drive b dies under this one.
    let st = rt.wait(rt.submit(&[Request::read(t0, 0, 1 << 20, m, 0)]).op().unwrap(), T).unwrap();
    assert_eq!(st, [RequestStatus::ControllerFatal { drive: "b".into() }]);
    // Now b is failed: a 4-drive request fails, a request on a alone works.
    let reqs = [Request::read(t1, 0, 1 << 20, m, 0), Request::read(t1, 0, 128 << 10, m, 1 << 20)];
    let st = rt.wait(rt.submit(&reqs).op().unwrap(), T).unwrap();
    assert!(
        matches!(&st[0], RequestStatus::SubmitFailed { reason: tutti::SubmitFailure::DriveNotReady { drive, .. } } if drive == "b"),
        "{st:?}"
    );
    assert_eq!(st[1], RequestStatus::Success);
    let s = rt.stats();
    assert_eq!(s.late_completions, 0, "{s:?}");
    // Pinned by b's abandoned command until b is reset.
    assert!(matches!(rt.unregister_memory(m), Err(Error::MemoryBusy { .. })));
    rt.reset_drive("b").unwrap();
    rt.unregister_memory(m).unwrap();
    let r = rt.shutdown(T);
    assert_eq!((r.ops_in_flight, r.commands_in_flight, r.commands_lost), (0, 0, 0), "{r:?}");
}

/// A timed-out request on a drive that never completes it pins its memory;
/// resetting the drive abandons the command and releases it, with no
/// operation left behind.
#[test]
fn reset_releases_memory_of_a_timed_out_request() {
    let rt = stripe_with(2, 256, "c", "[{ op: read, action: never_complete }]");
    let mut buf = Buf::new(1 << 20);
    let m = buf.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    let st = rt
        .wait(rt.submit(&[Request::read(t, 0, 1 << 20, m, 0)]).op().unwrap(), Duration::from_millis(50))
        .unwrap();
    assert_eq!(st, [RequestStatus::Timeout]);
    assert!(matches!(rt.unregister_memory(m), Err(Error::MemoryBusy { .. })));
    rt.emulator("c").unwrap().clear_faults();
    rt.reset_drive("c").unwrap();
    rt.unregister_memory(m).unwrap();
    let r = rt.shutdown(T);
    assert_eq!((r.ops_in_flight, r.commands_in_flight, r.commands_lost), (0, 0, 0), "{r:?}");
}

/// Late completions of a timed-out operation land on it (its slot is not
/// reused while they are outstanding), never on a newer operation.
#[test]
fn late_completions_do_not_complete_a_newer_operation() {
    let rt = stripe_with(2, 256, "a", "[{ op: read, lba: [0, 8], action: { delay_us: 200000 }, times: 1 }]");
    let mut buf = Buf::new(1 << 20);
    let m = buf.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    // 4 KiB at 0 on drive a, 200 ms late.
    let old = rt.submit(&[Request::read(t, 0, 4096, m, 0)]).op().unwrap();
    assert_eq!(rt.wait(old, Duration::from_millis(10)).unwrap(), [RequestStatus::Timeout]);
    // A newer operation with a command on the same drive that must still
    // be outstanding when the late one arrives: not a second of its own.
    let t0 = Instant::now();
    let new =
        rt.submit(&[Request::read(t, 0, 4096, m, 4096), Request::read(t, 4096, 4096, m, 8192)]).op().unwrap();
    assert_ne!(new, old);
    let st = rt.wait(new, T).unwrap();
    assert_eq!(st, [RequestStatus::Success, RequestStatus::Success]);
    assert!(t0.elapsed() < Duration::from_millis(150), "the new op waited for the old one");
    std::thread::sleep(Duration::from_millis(300));
    rt.unregister_memory(m).unwrap();
    let s = rt.stats();
    assert_eq!((s.late_completions, s.protocol_errors), (0, 0), "{s:?}");
    assert_eq!(s.commands_submitted, s.commands_completed);
}

/// Memory may start at any dword: PRP1 carries the offset, and the data
/// lands at exactly the bytes asked for, across page boundaries.
#[test]
fn dword_aligned_memory_offsets_move_exactly_the_bytes_asked_for() {
    let rt = stripe();
    let mut src = Buf::new(1 << 20);
    let mut dst = Buf::new(1 << 20);
    fill(src.bytes(), 3);
    let (ms, md) = (src.register(&rt), dst.register(&rt));
    let t = rt.open("tutti://kv/2").unwrap();
    for (k, &mo) in [4u64, 4092, 4096 + 8, 65532, 12].iter().enumerate() {
        let off = (k as u64) * (160 << 10);
        let len = (136u64 << 10) + 512; // crosses a stripe unit
        let st = rt.wait(rt.submit(&[Request::write(t, off, len, ms, mo)]).op().unwrap(), T).unwrap();
        assert_eq!(st, [RequestStatus::Success]);
        dst.bytes().fill(0x5A);
        let st = rt.wait(rt.submit(&[Request::read(t, off, len, md, mo + 8)]).op().unwrap(), T).unwrap();
        assert_eq!(st, [RequestStatus::Success]);
        let (mo, len) = (mo as usize, len as usize);
        let d = dst.bytes().to_vec();
        assert!(d[mo + 8..mo + 8 + len] == src.bytes()[mo..mo + len], "offset {mo}");
        assert!(d[..mo + 8].iter().all(|&x| x == 0x5A), "bytes before the range written ({mo})");
        assert!(d[mo + 8 + len..].iter().all(|&x| x == 0x5A), "bytes after the range written ({mo})");
    }
    let st = rt.submit(&[Request::read(t, 0, 4096, md, 2)]);
    assert_eq!(st.states(), [Err(RequestError::MemoryUnaligned { offset: 2 })]);
    assert!(st.op().is_none());
    let st = rt.submit(&[Request::read(t, 0, 4096, md, u64::MAX - 100)]);
    assert!(matches!(st.states()[0], Err(RequestError::MemoryRange { .. })));
    let st = rt.submit(&[Request::read(t, u64::MAX - 511, 512, md, 0)]);
    assert!(matches!(st.states()[0], Err(RequestError::OutOfRange { .. })));
}

/// reset_drive on drive b, repeatedly, while four threads write and read
/// back 1 MiB slots (all four drives): every request ends Success,
/// ControllerFatal(b) or SubmitFailed (never Timeout, never a hang); every
/// successful read after a successful write returns the written bytes;
/// afterwards nothing is pinned or outstanding.
#[test]
fn reset_drive_under_load_never_hangs_or_corrupts() {
    let rt = Arc::new(stripe_with(2, 16, "", ""));
    let stop = Arc::new(AtomicBool::new(false));
    let verified = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|ti| {
            let (rt, stop, verified) = (rt.clone(), stop.clone(), verified.clone());
            std::thread::spawn(move || {
                let mut src = Buf::new(1 << 20);
                let mut dst = Buf::new(1 << 20);
                let (ms, md) = (src.register(&rt), dst.register(&rt));
                let t = rt.open(&format!("tutti://kv/{ti}")).unwrap();
                let ok = |st: &RequestStatus| match st {
                    RequestStatus::Success | RequestStatus::SubmitFailed { .. } => true,
                    RequestStatus::ControllerFatal { drive } => drive == "b",
                    _ => false,
                };
                let mut round = 0u64;
                while !stop.load(Ordering::Acquire) {
                    round += 1;
                    fill(src.bytes(), ti << 32 | round);
                    let ws: Vec<Request> =
                        (0..8u64).map(|k| Request::write(t, k << 17, 1 << 17, ms, k << 17)).collect();
                    let st = rt.wait(rt.submit(&ws).op().unwrap(), T).unwrap();
                    assert!(st.iter().all(ok), "write: {st:?}");
                    if !st.iter().all(RequestStatus::is_success) {
                        continue;
                    }
                    dst.bytes().fill(0);
                    let st =
                        rt.wait(rt.submit(&[Request::read(t, 0, 1 << 20, md, 0)]).op().unwrap(), T).unwrap();
                    assert!(ok(&st[0]), "read: {st:?}");
                    if st[0].is_success() {
                        assert!(src.bytes() == dst.bytes(), "thread {ti} round {round}: data mismatch");
                        verified.fetch_add(1, Ordering::Relaxed);
                    }
                }
                (ms, md, src, dst)
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut resets = 0;
    while t0.elapsed() < Duration::from_millis(1500) {
        std::thread::sleep(Duration::from_millis(20));
        rt.reset_drive("b").unwrap();
        resets += 1;
    }
    stop.store(true, Ordering::Release);
    let bufs: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(resets > 5 && verified.load(Ordering::Relaxed) > 5, "{resets} resets, {verified:?} verified");
    rt.reap();
    for (ms, md, _, _) in &bufs {
        rt.unregister_memory(*ms).unwrap();
        rt.unregister_memory(*md).unwrap();
    }
    let s = rt.stats();
    assert_eq!((s.protocol_errors, s.late_completions), (0, 0), "{s:?}");
    let r = rt.shutdown(T);
    assert_eq!((r.ops_in_flight, r.commands_in_flight, r.commands_lost), (0, 0, 0), "{r:?}");
}

/// shutdown while threads submit and wait: each request is refused with
/// ShuttingDown or reported once with a final status (Success, an abort by
/// SQ deletion, SubmitFailed), within a bounded wait.
#[test]
fn shutdown_while_submitting_reports_every_request() {
    let rt = Arc::new(stripe_with(2, 16, "", ""));
    let threads: Vec<_> = (0..4u64)
        .map(|ti| {
            let rt = rt.clone();
            std::thread::spawn(move || {
                let mut b = Buf::new(1 << 20);
                let m = b.register(&rt);
                let t = rt.open(&format!("tutti://kv/{ti}")).unwrap();
                let mut reported = 0usize;
                loop {
                    let reqs: Vec<Request> =
                        (0..8u64).map(|k| Request::write(t, k << 17, 1 << 17, m, k << 17)).collect();
                    let sub = rt.submit(&reqs);
                    let Some(op) = sub.op() else {
                        assert!(sub.states().iter().all(|s| *s == Err(RequestError::ShuttingDown)));
                        return (reported, b);
                    };
                    let st = rt.wait(op, Duration::from_secs(3)).unwrap();
                    for s in &st {
                        match s {
                            RequestStatus::Success | RequestStatus::SubmitFailed { .. } => {}
                            RequestStatus::Nvme { status, .. } if (status.sct, status.sc) == (0, 0x08) => {}
                            other => panic!("thread {ti}: {other:?}"),
                        }
                    }
                    reported += st.len();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let r = rt.shutdown(Duration::from_millis(200));
    let mut total = 0;
    for t in threads {
        total += t.join().unwrap().0;
    }
    assert!(total > 0);
    assert_eq!(r.commands_lost, 0, "{r:?}");
}

/// A drive that vanishes must be named by a waiter even while other
/// requests keep completing on the same datapath's other drives (a busy
/// runtime is when a dead drive matters most).
#[test]
fn a_vanished_drive_is_noticed_while_other_drives_keep_completing() {
    // Drive c holds its reads, so only the controller check can end them.
    let rt = Arc::new(stripe_with(2, 256, "c", "[{ op: read, action: never_complete }]"));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (rt, stop) = (rt.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut b = Buf::new(128 << 10);
            let m = b.register(&rt);
            let t = rt.open("tutti://kv/1").unwrap();
            // 4 KiB reads of drive a only, back to back.
            while !stop.load(Ordering::Acquire) {
                let st = rt.wait(rt.submit(&[Request::read(t, 0, 4096, m, 0)]).op().unwrap(), T).unwrap();
                assert_eq!(st, [RequestStatus::Success]);
            }
            b
        })
    };
    let mut buf = Buf::new(1 << 20);
    let m = buf.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    // 4 KiB at 256 KiB: drive c only.
    let op = rt.submit(&[Request::read(t, 256 << 10, 4096, m, 0)]).op().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    rt.emulator("c").unwrap().set_gone();
    let t0 = Instant::now();
    let st = rt.wait(op, Duration::from_secs(3)).unwrap();
    let took = t0.elapsed();
    stop.store(true, Ordering::Release);
    let _b = load.join().unwrap();
    assert_eq!(st, [RequestStatus::ControllerFatal { drive: "c".into() }], "after {took:?}");
    assert!(took < Duration::from_secs(1), "noticed after {took:?}");
}

/// Two waits on one GPU-executed operation: the first waits for the
/// kernel, the second (zero timeout) takes the statuses (Timeout) and
/// retires the operation. When the kernel's statuses then arrive (its
/// command never completes: the kernel gives up after GPU_COMMAND_BUDGET),
/// nothing is left outstanding: the retired operation must go. Its memory
/// stays pinned to the drive (which may still write it) until a reset, and
/// only until then. Needs a CUDA GPU (skips otherwise); takes about
/// GPU_COMMAND_BUDGET.
#[test]
fn a_retired_gpu_operation_is_dropped_when_its_kernel_finishes() {
    use tutti::config::{DataPathConfig, DriveConfig, Execution, FaultActionConfig, FaultConfig};
    let mut cfg = Config::builtin_striped_ram(1, 64 << 20, 1 << 20);
    for dp in cfg.datapaths.values_mut() {
        match dp {
            DataPathConfig::LocalNvme(l) => l.execution = Execution::Gpu,
            DataPathConfig::StripedLocalNvme(s) => s.execution = Execution::Gpu,
            _ => {}
        }
    }
    for d in cfg.drives.values_mut() {
        let DriveConfig::Emulated(e) = d else { continue };
        e.faults.push(FaultConfig {
            lba: None,
            nsid: None,
            // The write below, not a command of the bring-up.
            op: Some(tutti::config::FaultOp::Write),
            action: FaultActionConfig::NeverComplete,
            times: Some(1),
            skip: 0,
        });
    }
    let rt = match Runtime::from_config(cfg) {
        Ok(rt) => Arc::new(rt),
        Err(e @ Error::Gpu { .. }) => {
            eprintln!("skipped: {}", tutti::error_chain(&e));
            return;
        }
        Err(e) => panic!("{}", tutti::error_chain(&e)),
    };
    let mut b = Buf::new(1 << 20);
    let m = b.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    let op = rt.submit(&[Request::write(t, 0, 4096, m, 0)]).op().unwrap();
    let long = {
        let rt = rt.clone();
        std::thread::spawn(move || rt.wait(op, Duration::from_secs(60)))
    };
    // The long wait has taken the kernel by now; this one polls once.
    std::thread::sleep(Duration::from_millis(100));
    let short = rt.wait(op, Duration::ZERO);
    let long = long.join().unwrap();
    assert_eq!(short.unwrap(), [RequestStatus::Timeout]);
    assert!(matches!(long, Err(Error::Handle(HandleError::Stale { .. }))), "{long:?}");
    // The kernel finished (the long wait returned after it). The drive may
    // still write the memory: pinned until its reset; the operation itself
    // must not hold it any more (it would stay busy after the reset).
    assert!(matches!(rt.unregister_memory(m), Err(Error::MemoryBusy { .. })));
    rt.reset_drive("d0").unwrap();
    rt.unregister_memory(m).unwrap();
}

/// An event loop that polls with `try_wait` only must also learn that a
/// drive vanished: the request ends ControllerFatal, not "not yet" forever.
#[test]
fn try_wait_alone_notices_a_vanished_drive() {
    let rt = stripe_with(2, 256, "c", "[{ op: read, action: never_complete }]");
    let mut buf = Buf::new(1 << 20);
    let m = buf.register(&rt);
    let t = rt.open("tutti://kv/0").unwrap();
    let op = rt.submit(&[Request::read(t, 256 << 10, 4096, m, 0)]).op().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    rt.emulator("c").unwrap().set_gone();
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = rt.try_wait(op).unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(2), "try_wait never noticed drive c is gone");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(st, [RequestStatus::ControllerFatal { drive: "c".into() }]);
}
