//! The runtime's GPU execution mode (`execution: gpu`): one submit is one
//! kernel launch. Needs a CUDA GPU; elsewhere each test prints why it
//! skipped and passes.

use std::time::Duration;

use tutti::config::{DataPathConfig, DriveConfig, Execution, FaultActionConfig, FaultConfig, FaultOp};
use tutti::{Config, Error, Request, RequestStatus, Runtime};

fn gpu_runtime(drives: usize) -> Option<Runtime> {
    gpu_runtime_with(drives, |_| {})
}

fn gpu_runtime_with(drives: usize, f: impl FnOnce(&mut Config)) -> Option<Runtime> {
    let mut cfg = Config::builtin_striped_ram(drives, 64 << 20, 1 << 20);
    f(&mut cfg);
    for dp in cfg.datapaths.values_mut() {
        match dp {
            DataPathConfig::LocalNvme(l) => l.execution = Execution::Gpu,
            DataPathConfig::StripedLocalNvme(s) => s.execution = Execution::Gpu,
            _ => {}
        }
    }
    match Runtime::from_config(cfg) {
        Ok(rt) => Some(rt),
        Err(e @ Error::Gpu { .. }) => {
            eprintln!("skipped: {}", tutti::error_chain(&e));
            None
        }
        Err(e) => panic!("{}", tutti::error_chain(&e)),
    }
}

#[test]
fn gpu_execution_round_trips_host_memory_over_a_four_drive_stripe() {
    let Some(rt) = gpu_runtime(4) else { return };
    let mut src: Vec<u64> =
        (0..(8 << 20) / 8).map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    let mut dst = vec![0u64; (8 << 20) / 8];
    // SAFETY: both vectors outlive the registrations and are untouched
    // while I/O runs.
    #[allow(unsafe_code)]
    let (ms, md) = unsafe {
        (
            rt.register_memory(src.as_mut_ptr().cast(), 8 << 20).unwrap(),
            rt.register_memory(dst.as_mut_ptr().cast(), 8 << 20).unwrap(),
        )
    };
    let targets: Vec<_> = (0..8).map(|i| rt.open(&format!("tutti://kv/{i}")).unwrap()).collect();
    let writes: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(i, &t)| Request::write(t, 0, 1 << 20, ms, (i as u64) << 20))
        .collect();
    let st = rt.wait(rt.submit(&writes).op().unwrap(), Duration::from_secs(30)).unwrap();
    assert!(st.iter().all(RequestStatus::is_success), "{st:?}");
    let reads: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(i, &t)| Request::read(t, 0, 1 << 20, md, ((7 - i) as u64) << 20))
        .collect();
    let st = rt.wait(rt.submit(&reads).op().unwrap(), Duration::from_secs(30)).unwrap();
    assert!(st.iter().all(RequestStatus::is_success), "{st:?}");
    for i in 0..8 {
        let w = 1 << 17;
        assert!(src[i * w..(i + 1) * w] == dst[(7 - i) * w..(8 - i) * w], "slot {i}");
    }
    // Two memory regions in one GPU batch are refused per request.
    let mixed = [Request::read(targets[0], 0, 4096, ms, 0), Request::read(targets[1], 0, 4096, md, 0)];
    let sub = rt.submit(&mixed);
    assert!(sub.states()[0].is_ok());
    assert!(matches!(sub.states()[1], Err(tutti::RequestError::GpuBatchMemory)));
    let st = rt.wait(sub.op().unwrap(), Duration::from_secs(30)).unwrap();
    assert!(st[0].is_success());
    rt.unregister_memory(ms).unwrap();
    rt.unregister_memory(md).unwrap();
    let r = rt.shutdown(Duration::from_secs(5));
    assert!(r.drives.iter().all(|(_, x)| x.is_ok()), "{:?}", r.drives);
}

/// A GPU runtime on a 2-drive stripe whose drive d1 meets `action` on the
/// first read of its LBA 0 (`None` without a GPU).
fn two_drives_with_d1_first_read(action: FaultActionConfig) -> Option<Runtime> {
    gpu_runtime_with(2, |cfg| {
        let Some(DriveConfig::Emulated(e)) = cfg.drives.get_mut("d1") else { panic!("no drive d1") };
        e.faults.push(FaultConfig {
            lba: Some([0, 1]),
            nsid: None,
            op: Some(FaultOp::Read),
            action,
            times: Some(1),
            skip: 0,
        });
    })
}

#[test]
fn gpu_driven_drive_recovers_from_a_fatal_controller_by_reset() {
    // The first read of drive d1's LBA 0 makes its controller fatal (CFS).
    let Some(rt) = two_drives_with_d1_first_read(FaultActionConfig::ControllerFatal) else { return };
    let mut src: Vec<u64> =
        (0..(1 << 20) / 8).map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    let mut dst = vec![0u64; (1 << 20) / 8];
    // SAFETY: both vectors outlive the registrations and are untouched
    // while I/O runs.
    #[allow(unsafe_code)]
    let (ms, md) = unsafe {
        (
            rt.register_memory(src.as_mut_ptr().cast(), 1 << 20).unwrap(),
            rt.register_memory(dst.as_mut_ptr().cast(), 1 << 20).unwrap(),
        )
    };
    let t = rt.open("tutti://kv/0").unwrap();
    let wait = |reqs: &[Request]| rt.wait(rt.submit(reqs).op().unwrap(), Duration::from_secs(60)).unwrap();
    assert_eq!(wait(&[Request::write(t, 0, 1 << 20, ms, 0)]), [RequestStatus::Success]);
    // 1 MiB over two drives: d1 dies under the read; the GPU sees a timeout
    // and the runtime reads CSTS.CFS.
    let st = wait(&[Request::read(t, 0, 1 << 20, md, 0)]);
    assert_eq!(st, [RequestStatus::ControllerFatal { drive: "d1".into() }]);
    // While d1 is failed, new work on it is refused, not launched.
    let st = wait(&[Request::read(t, 128 << 10, 4096, md, 0)]);
    assert!(matches!(st[0], RequestStatus::SubmitFailed { .. }), "{st:?}");
    rt.reset_drive("d1").unwrap();
    // The re-created GPU queues start over at slot 0, phase 1.
    for _ in 0..3 {
        dst.fill(0);
        assert_eq!(wait(&[Request::read(t, 0, 1 << 20, md, 0)]), [RequestStatus::Success]);
        assert!(src == dst, "data read back after the reset");
    }
    rt.unregister_memory(ms).unwrap();
    rt.unregister_memory(md).unwrap();
    let r = rt.shutdown(Duration::from_secs(5));
    assert!(r.drives.iter().all(|(_, x)| x.is_ok()), "{:?}", r.drives);
}

#[test]
fn reset_drive_refuses_while_a_gpu_kernel_on_the_drive_runs_even_if_another_thread_waits_on_it() {
    // d1 never completes its first read of LBA 0: the kernel polls for it
    // until GPU_COMMAND_BUDGET while another thread waits on the operation.
    let Some(rt) = two_drives_with_d1_first_read(FaultActionConfig::NeverComplete) else { return };
    let mut dst = vec![0u64; (1 << 20) / 8];
    // SAFETY: `dst` outlives the registration and is untouched while I/O
    // runs (the waiting thread is joined before it is dropped).
    #[allow(unsafe_code)]
    let md = unsafe { rt.register_memory(dst.as_mut_ptr().cast(), 1 << 20).unwrap() };
    let t = rt.open("tutti://kv/0").unwrap();
    let op = rt.submit(&[Request::read(t, 0, 1 << 20, md, 0)]).op().unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| rt.wait(op, Duration::from_secs(60)).unwrap());
        std::thread::sleep(Duration::from_millis(500));
        match rt.reset_drive("d1") {
            Err(Error::DriveBusy { drive, ops }) => assert_eq!((drive.as_str(), ops), ("d1", 1)),
            other => panic!("reset while the kernel runs: {other:?}"),
        }
        let st = waiter.join().unwrap();
        assert_eq!(st, [RequestStatus::Timeout]);
    });
    // The kernel has ended: now the reset goes ahead and I/O works again.
    rt.reset_drive("d1").unwrap();
    let st =
        rt.wait(rt.submit(&[Request::read(t, 0, 1 << 20, md, 0)]).op().unwrap(), Duration::from_secs(30));
    assert_eq!(st.unwrap(), [RequestStatus::Success]);
    // The runtime (and its mappings) goes before `dst` does.
    drop(rt);
}
