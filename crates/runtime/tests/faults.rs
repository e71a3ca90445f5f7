//! Failures reach exactly the request they belong to, through the runtime,
//! on a 4-drive stripe (128 KiB stripe unit, 512-byte blocks).

use std::time::Duration;

use tutti::{Config, MemoryHandle, Request, RequestStatus, Runtime};

/// Four drives a..d striped; `fault_on` gets `fault` (a YAML fault list).
fn stripe(fault_on: &str, fault: &str) -> Runtime {
    let drive = |name: &str| {
        let faults = if name == fault_on { format!(", faults: {fault}") } else { String::new() };
        format!("{name}: {{ emulated: {{ namespaces: [{{ capacity: 16MiB, block_size: 512 }}]{faults} }} }}")
    };
    let yaml = format!(
        "drives: {{ {}, {}, {}, {} }}
resolvers: {{ whole: {{ slab: {{ slot_size: 64MiB }} }} }}
datapaths: {{ s: {{ striped_local_nvme: {{ drives: [a, b, c, d], stripe_unit: 128KiB }} }} }}
stores: {{ kv: {{ resolver: whole, datapath: s }} }}
",
        drive("a"),
        drive("b"),
        drive("c"),
        drive("d")
    );
    Runtime::from_config(Config::from_yaml_str(&yaml).unwrap()).unwrap()
}

fn memory(rt: &Runtime, buf: &mut [u64]) -> MemoryHandle {
    // SAFETY: `buf` outlives the runtime in each test and is untouched while
    // I/O runs.
    #[allow(unsafe_code)]
    unsafe {
        rt.register_memory(buf.as_mut_ptr().cast(), buf.len() * 8).unwrap()
    }
}

/// Request 1: 300 KiB at 100 KiB (drive a SLBA 200 x 56, b and c SLBA 0 x
/// 256, d SLBA 0 x 32). Request 2: 384 KiB at 896 KiB (drives d, a, b only).
fn two_requests(rt: &Runtime, m: MemoryHandle) -> Vec<Request> {
    let t = rt.open("tutti://kv/0").unwrap();
    vec![Request::read(t, 100 << 10, 300 << 10, m, 0), Request::read(t, 896 << 10, 384 << 10, m, 512 << 10)]
}

#[test]
fn a_drive_that_never_completes_times_out_only_the_request_touching_it() {
    // Drive c never completes reads of its LBAs 0..256.
    let rt = stripe("c", "[{ lba: [0, 256], op: read, action: never_complete }]");
    let mut buf = vec![0u64; (1 << 20) / 8];
    let m = memory(&rt, &mut buf);
    let st = rt.wait(rt.submit(&two_requests(&rt, m)).op().unwrap(), Duration::from_millis(500)).unwrap();
    assert_eq!(st, [RequestStatus::Timeout, RequestStatus::Success]);
    // The drive may still write the buffer: it stays registered.
    assert!(rt.unregister_memory(m).is_err());
}

#[test]
fn a_media_error_on_one_drive_fails_only_its_logical_request() {
    // Drive b fails reads of LBA 0 with Unrecovered Read Error.
    let rt = stripe("b", "[{ lba: [0, 1], op: read, action: { fail: { sct: 2, sc: 0x81, dnr: true } } }]");
    let mut buf = vec![0u64; (1 << 20) / 8];
    let m = memory(&rt, &mut buf);
    let st = rt.wait(rt.submit(&two_requests(&rt, m)).op().unwrap(), Duration::from_secs(10)).unwrap();
    match &st[0] {
        RequestStatus::Nvme { drive, status } => {
            assert_eq!(drive, "b");
            assert_eq!((status.sct, status.sc, status.dnr), (2, 0x81, true), "{status}");
        }
        other => panic!("request 1: {other:?}"),
    }
    assert_eq!(st[1], RequestStatus::Success);
    rt.unregister_memory(m).unwrap();
}

#[test]
fn a_late_completion_still_lands_within_the_wait() {
    let rt = stripe("d", "[{ op: read, action: { delay_us: 100000 } }]");
    let mut buf = vec![0u64; (1 << 20) / 8];
    let m = memory(&rt, &mut buf);
    let t0 = std::time::Instant::now();
    let st = rt.wait(rt.submit(&two_requests(&rt, m)).op().unwrap(), Duration::from_secs(10)).unwrap();
    assert_eq!(st, [RequestStatus::Success, RequestStatus::Success]);
    assert!(t0.elapsed() >= Duration::from_millis(100));
}

#[test]
fn a_fatal_controller_fails_its_requests_and_reset_drive_brings_it_back() {
    // The first read of drive b's LBA 0 makes its controller fatal (CFS).
    let rt = stripe("b", "[{ lba: [0, 1], op: read, action: controller_fatal, times: 1 }]");
    let mut buf = vec![0u64; (2 << 20) / 8];
    let m = memory(&rt, &mut buf);
    let t = rt.open("tutti://kv/0").unwrap();
    // Write 1 MiB (all four drives), then read it back: the read touching
    // drive b's LBA 0 hits the fault.
    let w = rt
        .wait(rt.submit(&[Request::write(t, 0, 1 << 20, m, 0)]).op().unwrap(), Duration::from_secs(10))
        .unwrap();
    assert_eq!(w, [RequestStatus::Success]);
    let reqs =
        [Request::read(t, 0, 256 << 10, m, 1 << 20), Request::read(t, 512 << 10, 128 << 10, m, 1 << 20)];
    let st = rt.wait(rt.submit(&reqs).op().unwrap(), Duration::from_secs(10)).unwrap();
    // Request 1 covers drives a and b: b died under it.
    assert_eq!(st[0], RequestStatus::ControllerFatal { drive: "b".into() });
    // Request 2 touches only drive c.
    assert_eq!(st[1], RequestStatus::Success);
    // While b is failed, new work on it is refused, not lost.
    let st = rt
        .wait(rt.submit(&[Request::read(t, 128 << 10, 4096, m, 0)]).op().unwrap(), Duration::from_secs(5))
        .unwrap();
    assert!(matches!(st[0], RequestStatus::SubmitFailed { .. }), "{st:?}");
    rt.reset_drive("b").unwrap();
    let st = rt
        .wait(rt.submit(&[Request::read(t, 0, 1 << 20, m, 1 << 20)]).op().unwrap(), Duration::from_secs(10))
        .unwrap();
    assert_eq!(st, [RequestStatus::Success]);
    let (a, b) = buf.split_at(1 << 17);
    assert!(a == &b[..1 << 17], "data read back after the reset");
    assert!(rt.reset_drive("zz").is_err());
}

/// Drive c stops answering while a read waits on it, in the way `stop`
/// makes it; the wait must name drive c as failed long before its 30 s
/// deadline, and the request on the other drives alone succeeds.
fn vanished_drive_is_named_quickly(stop: impl FnOnce(&nvme_emu::Emulator)) {
    // c holds its reads (never completes them), so only the controller
    // check can end the request.
    let rt = stripe("c", "[{ lba: [0, 256], op: read, action: never_complete }]");
    let mut buf = vec![0u64; (1 << 20) / 8];
    let m = memory(&rt, &mut buf);
    let op = rt.submit(&two_requests(&rt, m)).op().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    stop(rt.emulator("c").unwrap());
    let t0 = std::time::Instant::now();
    let st = rt.wait(op, Duration::from_secs(30)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "noticed after {:?}", t0.elapsed());
    assert_eq!(st, [RequestStatus::ControllerFatal { drive: "c".into() }, RequestStatus::Success]);
    // The drive may still write the memory until reset: it stays pinned.
    assert!(matches!(rt.unregister_memory(m), Err(tutti::Error::MemoryBusy { .. })));
    // New work on c is refused, not lost; the report names it.
    let t = rt.open("tutti://kv/0").unwrap();
    let st =
        rt.wait(rt.submit(&[Request::read(t, 256 << 10, 4096, m, 0)]).op().unwrap(), Duration::from_secs(5));
    // A caller matches why: the failed drive, by name, and its state.
    match &st.unwrap()[0] {
        RequestStatus::SubmitFailed { reason: tutti::SubmitFailure::DriveNotReady { drive, state } } => {
            assert_eq!((drive.as_str(), state.as_str()), ("c", "Failed"))
        }
        other => panic!("{other:?}"),
    }
    // Shutdown sends no CC.SHN to a controller that no longer answers (it
    // would wait out CAP.TO) and says so; the others shut down normally.
    let t0 = std::time::Instant::now();
    let r = rt.shutdown(Duration::from_secs(1));
    assert!(t0.elapsed() < Duration::from_secs(3), "shutdown took {:?}", t0.elapsed());
    for (name, res) in &r.drives {
        match name.as_str() {
            "c" => assert!(res.as_ref().is_err_and(|e| e.contains("no CC.SHN")), "{res:?}"),
            _ => assert!(res.is_ok(), "{name}: {res:?}"),
        }
    }
}

#[test]
fn a_drive_whose_memory_space_is_disabled_is_failed_by_csts_rdy() {
    // QEMU's guest reads zeros from a BAR that no longer decodes: CSTS.RDY
    // = 0 and CFS = 0, so only the RDY check catches it.
    vanished_drive_is_named_quickly(|e| e.disable_memory_space());
}

#[test]
fn a_drive_that_vanishes_is_failed_by_all_ones_csts() {
    vanished_drive_is_named_quickly(|e| e.set_gone());
}

#[test]
fn after_shutdown_a_wait_on_lost_commands_returns_at_once() {
    // Drive c holds its reads and then stops answering with nobody waiting:
    // shutdown cannot delete its queues, so its commands are lost, and a
    // later wait, even unbounded, must not spin until a deadline.
    let rt = stripe("c", "[{ lba: [0, 256], op: read, action: never_complete }]");
    let mut buf = vec![0u64; (1 << 20) / 8];
    let m = memory(&rt, &mut buf);
    let op = rt.submit(&two_requests(&rt, m)).op().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    rt.emulator("c").unwrap().disable_memory_space();
    let t0 = std::time::Instant::now();
    let r = rt.shutdown(Duration::ZERO);
    assert!(t0.elapsed() < Duration::from_secs(3), "shutdown took {:?}", t0.elapsed());
    assert!(r.commands_lost > 0, "{r:?}");
    let c = r.drives.iter().find(|(n, _)| n == "c").unwrap();
    assert!(c.1.as_ref().is_err_and(|e| e.contains("no CC.SHN")), "{c:?}");
    let t0 = std::time::Instant::now();
    let st = rt.wait(op, Duration::MAX).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "wait took {:?}", t0.elapsed());
    assert_eq!(st[0], RequestStatus::Timeout);
    // Its memory stays registered: the device may still write it.
    assert!(rt.unregister_memory(m).is_err());
}

#[test]
fn a_yaml_fault_on_writes_does_not_touch_the_admin_queue() {
    // `op: write` is NVM opcode 01h, which is also Create I/O SQ on the
    // admin queue: the rule must hit the drive's writes, not its bring-up.
    let rt = stripe("b", "[{ op: write, action: never_complete }]");
    let mut buf = vec![0u64; (1 << 20) / 8];
    let m = memory(&rt, &mut buf);
    let t = rt.open("tutti://kv/0").unwrap();
    // 512 KiB at 0: drives a, b, c, d; b never completes its write.
    let st = rt
        .wait(rt.submit(&[Request::write(t, 0, 512 << 10, m, 0)]).op().unwrap(), Duration::from_millis(300));
    assert_eq!(st.unwrap(), [RequestStatus::Timeout]);
    let st = rt.wait(
        rt.submit(&[Request::read(t, 0, 128 << 10, m, 512 << 10)]).op().unwrap(),
        Duration::from_secs(5),
    );
    assert_eq!(st.unwrap(), [RequestStatus::Success], "reads of drive a are untouched");
}
