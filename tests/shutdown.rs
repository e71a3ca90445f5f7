//! Orderly shutdown with commands in flight, through the runtime: no new
//! submissions once it begins, a bounded drain, then Delete I/O SQ aborts
//! what is left and each outstanding request gets exactly one completion
//! (issue 5).

use std::time::Duration;

use nvme_regs::status::generic;
use tutti::{Config, Request, RequestError, RequestStatus, Runtime};

/// One emulated drive, two I/O queues. Reads of LBAs 0..4 are never
/// completed; a read of LBA 8 is delayed by 30 s.
fn runtime() -> Runtime {
    let yaml = "drives: { d0: { emulated: { namespaces: [{ capacity: 16MiB, block_size: 4096 }], faults: [
    { lba: [0, 4], op: read, action: never_complete },
    { lba: [8, 9], op: read, action: { delay_us: 30000000 } } ] } } }
resolvers: { r: { slab: { slot_size: 1MiB } } }
datapaths: { one: { local_nvme: { drive: d0, queues: 2, queue_depth: 16 } } }
stores: { kv: { resolver: r, datapath: one } }
";
    Runtime::from_config(Config::from_yaml_str(yaml).unwrap()).unwrap()
}

#[test]
fn shutdown_aborts_held_commands_and_each_request_completes_exactly_once() {
    let rt = runtime();
    let mut buf = vec![0u64; (64 << 10) / 8];
    // SAFETY: `buf` outlives the runtime's use of it (the runtime is shut
    // down, and every command completed, before it is dropped).
    #[allow(unsafe_code)]
    let m = unsafe { rt.register_memory(buf.as_mut_ptr().cast(), buf.len() * 8).unwrap() };
    let t = rt.open("tutti://kv/0").unwrap();
    // Requests 0..4 are held by the drive, 4..8 complete, 8 is delayed.
    let reqs: Vec<Request> = (0..9u64).map(|i| Request::read(t, i * 4096, 4096, m, i * 4096)).collect();
    let sub = rt.submit(&reqs);
    assert_eq!(sub.accepted(), 9);
    let op = sub.op().unwrap();

    let report = std::thread::scope(|s| {
        let shut = s.spawn(|| rt.shutdown(Duration::from_millis(400)));
        // While the drain runs (held commands keep it busy), nothing new is
        // accepted.
        std::thread::sleep(Duration::from_millis(100));
        let late = rt.submit(&[Request::read(t, 0x8000, 4096, m, 0)]);
        assert!(late.op().is_none());
        assert_eq!(late.states(), [Err(RequestError::ShuttingDown)]);
        shut.join().unwrap()
    });
    assert_eq!(report.commands_in_flight, 5, "{report:?}");
    assert_eq!(report.commands_reaped_at_deletion, 5, "{report:?}");
    assert_eq!(report.commands_lost, 0, "{report:?}");
    assert!(report.drives.iter().all(|(_, r)| r.is_ok()), "{report:?}");

    let st = rt.wait(op, Duration::from_secs(1)).unwrap();
    for (i, s) in st.iter().enumerate() {
        if (4..8).contains(&i) {
            assert_eq!(*s, RequestStatus::Success, "request {i}");
            continue;
        }
        match s {
            RequestStatus::Nvme { drive, status } => {
                assert_eq!(drive, "d0");
                assert_eq!(
                    (status.sct, status.sc),
                    (0, generic::ABORTED_SQ_DELETION),
                    "request {i}: {status}"
                );
            }
            other => panic!("request {i}: {other:?}"),
        }
    }
    // Exactly one completion per command: nothing duplicated, nothing late,
    // nothing unmatched.
    let stats = rt.stats();
    assert_eq!(stats.commands_submitted, 9);
    assert_eq!(stats.commands_completed, 9);
    assert_eq!((stats.protocol_errors, stats.late_completions), (0, 0), "{stats:?}");
    // After shutdown: still refused, and a second shutdown is a no-op.
    assert_eq!(rt.submit(&reqs[..1]).states(), [Err(RequestError::ShuttingDown)]);
    assert_eq!(rt.shutdown(Duration::ZERO).commands_lost, 0);
    // Every command completed, so the memory is free again.
    rt.unregister_memory(m).unwrap();
}

#[test]
fn shutdown_with_nothing_in_flight_reaps_nothing() {
    let rt = runtime();
    let report = rt.shutdown(Duration::from_millis(100));
    assert_eq!(
        (report.commands_in_flight, report.commands_reaped_at_deletion, report.commands_lost),
        (0, 0, 0)
    );
    assert!(report.drives.iter().all(|(_, r)| r.is_ok()), "{report:?}");
}
