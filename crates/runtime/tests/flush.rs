//! Flush requests: one NVMe Flush per drive of the target's store, counted
//! and completed like any other command; a bad target is refused.

use std::time::Duration;

use tutti::{Config, Direction, Request, RequestError, Runtime, TargetHandle};

const T: Duration = Duration::from_secs(10);

fn runtime(drives: usize) -> Runtime {
    Runtime::from_config(Config::builtin_striped_ram(drives, 16 << 20, 1 << 20)).unwrap()
}

/// Commands each emulated drive has executed so far.
fn drive_commands(rt: &Runtime) -> Vec<u64> {
    rt.drive_names().iter().map(|d| rt.emulator(d).unwrap().stats().commands).collect()
}

#[test]
fn a_flush_sends_one_command_to_every_drive_of_a_stripe() {
    let rt = runtime(4);
    let t = rt.open("tutti://kv/3").unwrap();
    let (before, emu_before) = (rt.stats(), drive_commands(&rt));
    let flush = Request::flush(t);
    assert_eq!(flush.direction, Direction::Flush);
    assert!(flush.is_flush());
    let sub = rt.submit(&[flush]);
    assert_eq!(sub.accepted(), 1);
    let st = rt.wait(sub.op().unwrap(), T).unwrap();
    assert!(st[0].is_success(), "{st:?}");
    assert_eq!(rt.stats().commands_submitted - before.commands_submitted, 4);
    let emu_after = drive_commands(&rt);
    for (b, a) in emu_before.iter().zip(&emu_after) {
        assert_eq!(a - b, 1, "one Flush per drive: {emu_before:?} -> {emu_after:?}");
    }
}

#[test]
fn a_flush_on_one_drive_is_one_command_and_mixes_with_data_requests() {
    let rt = runtime(1);
    let t = rt.open("tutti://kv/0").unwrap();
    let mut buf = vec![7u8; 1 << 20];
    // SAFETY: `buf` outlives the registration and is not touched while I/O runs.
    #[allow(unsafe_code)]
    let mem = unsafe { rt.register_memory(buf.as_mut_ptr(), buf.len()).unwrap() };
    let before = rt.stats();
    let sub = rt.submit(&[Request::write(t, 0, 1 << 20, mem, 0), Request::flush(t)]);
    assert_eq!(sub.accepted(), 2);
    let st = rt.wait(sub.op().unwrap(), T).unwrap();
    assert!(st.iter().all(|s| s.is_success()), "{st:?}");
    // 1 MiB at the default 128 KiB MDTS: 8 writes, then 1 flush.
    assert_eq!(rt.stats().commands_submitted - before.commands_submitted, 9);
    rt.unregister_memory(mem).unwrap();
}

#[test]
fn a_flush_of_a_forged_or_closed_target_is_refused() {
    let rt = runtime(2);
    let forged = TargetHandle::from_raw_parts(u32::MAX, 5, 9);
    let sub = rt.submit(&[Request::flush(forged)]);
    assert!(sub.op().is_none());
    assert!(matches!(sub.states()[0], Err(RequestError::Target(_))), "{:?}", sub.states());
    let t = rt.open("tutti://kv/1").unwrap();
    rt.close(t).unwrap();
    let sub = rt.submit(&[Request::flush(t)]);
    assert!(matches!(sub.states()[0], Err(RequestError::Target(_))), "{:?}", sub.states());
}
