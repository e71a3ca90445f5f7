//! The C ABI called from Rust, as a C program would call it: statuses,
//! last-error messages, handle checks, per-request outcomes, NVMe statuses.

// Reading the NUL-terminated strings the library writes needs `CStr::from_ptr`.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

use tutti_c::*;

const MIB: u64 = 1 << 20;

/// A small emulated runtime: 2 drives x 16 MiB, 1 MiB slots.
fn emulated() -> *mut tutti_runtime {
    let mut rt = null_mut();
    assert_eq!(tutti_runtime_new_emulated(2, 16 * MIB, MIB, &mut rt), tutti_status::Ok, "{}", last_error());
    assert!(!rt.is_null());
    rt
}

/// One emulated drive `d0` (16 MiB, 4096-byte blocks) with the YAML fault
/// list `faults`, a slab store `kv` of 1 MiB slots.
fn one_drive_with_faults(faults: &str) -> *mut tutti_runtime {
    let yaml = format!(
        "drives: {{ d0: {{ emulated: {{ namespaces: [{{ capacity: 16MiB, block_size: 4096 }}], faults: {faults} }} }} }}
resolvers: {{ kv: {{ slab: {{ slot_size: 1MiB }} }} }}
datapaths: {{ one: {{ local_nvme: {{ drive: d0 }} }} }}
stores: {{ kv: {{ resolver: kv, datapath: one }} }}
"
    );
    let yaml = CString::new(yaml).unwrap();
    let mut rt = null_mut();
    assert_eq!(tutti_runtime_new_yaml(yaml.as_ptr(), &mut rt), tutti_status::Ok, "{}", last_error());
    rt
}

/// This thread's last error message.
fn last_error() -> String {
    let mut n = 0usize;
    let st = tutti_last_error_message(null_mut(), 0, &mut n);
    assert!(st == tutti_status::Ok || st == tutti_status::BufferTooSmall);
    let mut buf = vec![0 as c_char; n + 1];
    assert_eq!(tutti_last_error_message(buf.as_mut_ptr(), buf.len(), &mut n), tutti_status::Ok);
    // SAFETY: the call wrote a NUL-terminated string into `buf`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_owned()
}

fn open(rt: *const tutti_runtime, uri: &str) -> u64 {
    let uri = CString::new(uri).unwrap();
    let mut t = 0;
    assert_eq!(tutti_open(rt, uri.as_ptr(), &mut t), tutti_status::Ok, "{}", last_error());
    t
}

fn register(rt: *const tutti_runtime, buf: &mut [u8]) -> u64 {
    let mut m = 0;
    let st = tutti_register_memory(rt, buf.as_mut_ptr().cast::<c_void>(), buf.len(), &mut m);
    assert_eq!(st, tutti_status::Ok, "{}", last_error());
    m
}

fn request(
    direction: tutti_direction,
    target: u64,
    len: u64,
    memory: u64,
    memory_offset: u64,
) -> tutti_request {
    tutti_request { direction, target, offset: 0, len, memory, memory_offset }
}

fn empty_status() -> tutti_request_status {
    tutti_request_status {
        kind: tutti_outcome::Other,
        sct: 0xff,
        sc: 0xff,
        crd: 0xff,
        more: true,
        dnr: true,
        drive_index: 99,
        message: [0; TUTTI_MESSAGE_LEN],
    }
}

fn message(s: &tutti_request_status) -> String {
    // SAFETY: `message` is NUL-terminated (written by the library).
    unsafe { CStr::from_ptr(s.message.as_ptr()) }.to_str().unwrap().to_owned()
}

/// Submits `reqs`; returns the op handle and the acceptance statuses.
fn submit(rt: *const tutti_runtime, reqs: &[tutti_request]) -> (u64, Vec<tutti_request_status>) {
    let mut states = vec![empty_status(); reqs.len()];
    let mut op = u64::MAX;
    let st = tutti_submit(rt, reqs.as_ptr(), reqs.len(), states.as_mut_ptr(), &mut op);
    assert_eq!(st, tutti_status::Ok, "{}", last_error());
    (op, states)
}

/// Waits on `op` for up to 5 s with room for `n` statuses.
fn wait(rt: *const tutti_runtime, op: u64, n: usize) -> Vec<tutti_request_status> {
    let mut out = vec![empty_status(); n];
    let mut count = 0;
    let st = tutti_wait(rt, op, 5000, out.as_mut_ptr(), out.len(), &mut count);
    assert_eq!(st, tutti_status::Ok, "{}", last_error());
    out.truncate(count);
    out
}

#[test]
fn null_pointers_are_null_argument_and_named() {
    let rt = emulated();
    let mut p = null_mut();
    let yaml = c"drives: {}";
    let mut u = 0u64;
    let mut n = 0usize;
    let mut buf = [0u8; 64];
    // Each call, then its message (the last error is per call).
    let check = |st: tutti_status, what: &str| {
        assert_eq!(st, tutti_status::NullArgument, "{what}");
        assert_eq!(last_error(), format!("{what} is NULL"));
    };
    check(tutti_runtime_new_yaml(null(), &mut p), "yaml");
    check(tutti_runtime_new_yaml(yaml.as_ptr(), null_mut()), "out_runtime");
    check(tutti_runtime_new_file(null(), &mut p), "path");
    check(tutti_runtime_new_emulated(2, 16 * MIB, MIB, null_mut()), "out_runtime");
    check(tutti_open(null(), c"tutti://kv/0".as_ptr(), &mut u), "runtime");
    check(tutti_open(rt, null(), &mut u), "uri");
    check(tutti_open(rt, c"tutti://kv/0".as_ptr(), null_mut()), "out_target");
    check(tutti_open_batch(rt, null(), 1, &mut u, null_mut()), "uris");
    check(tutti_target_len(rt, 1, null_mut()), "out_len");
    check(tutti_close(null(), 1), "runtime");
    check(tutti_register_memory(rt, buf.as_mut_ptr().cast(), buf.len(), null_mut()), "out_memory");
    check(tutti_register_gpu_memory(null(), 1, 1, &mut u), "runtime");
    check(tutti_unregister_memory(null(), 1), "runtime");
    check(tutti_submit(rt, null(), 1, null_mut(), &mut u), "requests");
    check(tutti_wait(rt, 1, 0, null_mut(), 1, &mut n), "out_statuses");
    check(tutti_try_wait(rt, 1, null_mut(), 1, null_mut()), "out_count");
    check(tutti_stats_get(rt, null_mut()), "out_stats");
    check(tutti_store_info_get(rt, null(), null_mut()), "name");
    check(tutti_drive_count(rt, null_mut()), "out_count");
    check(tutti_drive_name(rt, 0, null_mut(), 8, &mut n), "buf");
    check(tutti_reset_drive(rt, null()), "name");
    check(tutti_shutdown(null(), 0, null_mut()), "runtime");
    assert!(p.is_null(), "no runtime was handed out");
    assert_eq!(tutti_last_error_message(null_mut(), 0, null_mut()), tutti_status::NullArgument);
    tutti_runtime_destroy(null_mut()); // ignored
    tutti_runtime_destroy(rt);
}

#[test]
fn forged_stale_and_foreign_handles_are_handle_errors() {
    let (rt, other) = (emulated(), emulated());
    let t = open(rt, "tutti://kv/3");
    let mut len = 0;
    assert_eq!(tutti_target_len(rt, t, &mut len), tutti_status::Ok);
    assert_eq!(len, MIB);
    // Forged: a slot this runtime never minted (bits 47..24), and zero.
    let forged = (t & !(0xFF_FFFF << 24)) | (4321 << 24);
    assert_eq!(tutti_target_len(rt, forged, &mut len), tutti_status::Handle);
    assert!(last_error().contains("forged target handle"), "{}", last_error());
    assert_eq!(tutti_target_len(rt, 0, &mut len), tutti_status::Handle);
    // Foreign: minted by the other runtime.
    let t2 = open(other, "tutti://kv/3");
    assert_eq!(tutti_close(rt, t2), tutti_status::Handle);
    assert!(last_error().contains("foreign target handle"), "{}", last_error());
    // Stale: closed.
    assert_eq!(tutti_close(rt, t), tutti_status::Ok);
    assert_eq!(last_error(), "", "a success clears the message");
    assert_eq!(tutti_target_len(rt, t, &mut len), tutti_status::Handle);
    assert!(last_error().contains("stale target handle"), "{}", last_error());
    // Memory and operation handles are checked too.
    assert_eq!(tutti_unregister_memory(rt, forged), tutti_status::Handle);
    assert!(last_error().contains("memory handle"), "{}", last_error());
    let mut out = [empty_status()];
    let mut n = 0;
    assert_eq!(tutti_wait(rt, forged, 0, out.as_mut_ptr(), 1, &mut n), tutti_status::Handle);
    assert!(last_error().contains("operation handle"), "{}", last_error());
    assert_eq!(tutti_try_wait(rt, u64::MAX, out.as_mut_ptr(), 1, &mut n), tutti_status::Handle);
    tutti_runtime_destroy(rt);
    tutti_runtime_destroy(other);
}

#[test]
fn a_round_trip_moves_every_byte_and_the_facts_are_right() {
    let rt = emulated();
    let uris = [c"tutti://kv/0", c"tutti://kv/1", c"tutti://nope/1"];
    let ptrs: Vec<*const c_char> = uris.iter().map(|u| u.as_ptr()).collect();
    let mut targets = [7u64; 3];
    let mut sts = [tutti_status::Panic; 3];
    let st = tutti_open_batch(rt, ptrs.as_ptr(), 3, targets.as_mut_ptr(), sts.as_mut_ptr());
    assert_eq!(st, tutti_status::Uri);
    assert!(last_error().starts_with("uris[2]: URI \"tutti://nope/1\""), "{}", last_error());
    assert_eq!(sts, [tutti_status::Ok, tutti_status::Ok, tutti_status::Uri]);
    assert!(targets[0] != 0 && targets[1] != 0 && targets[0] != targets[1]);
    assert_eq!(targets[2], 0);
    let mut buf: Vec<u8> = (0..2 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    let m = register(rt, &mut buf);
    let w = [
        request(TUTTI_DIRECTION_WRITE, targets[0], MIB, m, 0),
        request(TUTTI_DIRECTION_WRITE, targets[1], MIB, m, MIB),
    ];
    let (op, states) = submit(rt, &w);
    assert!(states.iter().all(|s| s.kind == tutti_outcome::Pending && message(s).is_empty()));
    assert!(wait(rt, op, 2).iter().all(|s| s.kind == tutti_outcome::Success && s.drive_index == -1));
    let expected = buf.clone();
    buf.fill(0xEE);
    let r = [
        request(TUTTI_DIRECTION_READ, targets[1], MIB, m, 0),
        request(TUTTI_DIRECTION_READ, targets[0], MIB, m, MIB),
    ];
    let (op, _) = submit(rt, &r);
    assert_eq!(wait(rt, op, 2).iter().filter(|s| s.kind == tutti_outcome::Success).count(), 2);
    assert_eq!(&buf[..MIB as usize], &expected[MIB as usize..]);
    assert_eq!(&buf[MIB as usize..], &expected[..MIB as usize]);
    let mut stats = tutti_stats::default();
    assert_eq!(tutti_stats_get(rt, &mut stats), tutti_status::Ok);
    assert!(
        stats.commands_submitted >= 4 && stats.commands_completed == stats.commands_submitted,
        "{stats:?}"
    );
    let mut info = tutti_store_info::default();
    assert_eq!(tutti_store_info_get(rt, c"kv".as_ptr(), &mut info), tutti_status::Ok);
    assert_eq!((info.capacity, info.block_size, info.drive_count), (32 * MIB, 4096, 2));
    assert_eq!((info.slot_size, info.slots), (MIB, 32));
    assert_eq!(tutti_store_info_get(rt, c"nope".as_ptr(), &mut info), tutti_status::UnknownStore);
    check_drive_names(rt);
    assert_eq!(tutti_unregister_memory(rt, m), tutti_status::Ok);
    let mut report = tutti_shutdown_report { ops_in_flight: 9, ..Default::default() };
    assert_eq!(tutti_shutdown(rt, 1000, &mut report), tutti_status::Ok, "{}", last_error());
    assert_eq!(report, tutti_shutdown_report::default());
    let mut t = 0;
    assert_eq!(tutti_open(rt, c"tutti://kv/2".as_ptr(), &mut t), tutti_status::ShuttingDown);
    tutti_runtime_destroy(rt);
}

fn check_drive_names(rt: *const tutti_runtime) {
    let mut count = 0;
    assert_eq!(tutti_drive_count(rt, &mut count), tutti_status::Ok);
    assert_eq!(count, 2);
    let mut name = [0 as c_char; 8];
    let mut n = 0;
    assert_eq!(tutti_drive_name(rt, 1, name.as_mut_ptr(), name.len(), &mut n), tutti_status::Ok);
    // SAFETY: NUL-terminated by the call.
    assert_eq!(unsafe { CStr::from_ptr(name.as_ptr()) }, c"d1");
    assert_eq!(n, 2);
    assert_eq!(tutti_drive_name(rt, 2, name.as_mut_ptr(), name.len(), &mut n), tutti_status::InvalidArgument);
    assert_eq!(tutti_drive_name(rt, 0, name.as_mut_ptr(), 2, &mut n), tutti_status::BufferTooSmall);
    assert_eq!(n, 2, "the length needed without the NUL");
    let mut unknown = c"d9".as_ptr();
    assert_eq!(tutti_reset_drive(rt, unknown), tutti_status::UnknownDrive);
    assert!(last_error().contains("no drive named \"d9\""), "{}", last_error());
    unknown = c"d0".as_ptr();
    assert_eq!(tutti_reset_drive(rt, unknown), tutti_status::Ok, "{}", last_error());
}

#[test]
fn a_closed_target_in_a_batch_is_not_accepted_and_the_rest_runs() {
    let rt = emulated();
    let (a, b) = (open(rt, "tutti://kv/0"), open(rt, "tutti://kv/1"));
    assert_eq!(tutti_close(rt, b), tutti_status::Ok);
    let mut buf = vec![0u8; 2 * MIB as usize];
    let m = register(rt, &mut buf);
    let reqs = [request(TUTTI_DIRECTION_WRITE, a, MIB, m, 0), request(TUTTI_DIRECTION_WRITE, b, MIB, m, MIB)];
    let (op, states) = submit(rt, &reqs);
    assert_ne!(op, 0);
    assert_eq!(states[0].kind, tutti_outcome::Pending);
    assert_eq!(states[1].kind, tutti_outcome::NotAccepted);
    assert!(message(&states[1]).contains("stale target handle"), "{}", message(&states[1]));
    let done = wait(rt, op, 2);
    assert_eq!(done[0].kind, tutti_outcome::Success);
    assert_eq!(done[1].kind, tutti_outcome::NotAccepted);
    assert!(message(&done[1]).starts_with("target: stale target handle"), "{}", message(&done[1]));
    // Nothing accepted: no operation.
    let (op, states) = submit(rt, &[request(TUTTI_DIRECTION_READ, b, MIB, m, 0)]);
    assert_eq!(op, 0);
    assert_eq!(states[0].kind, tutti_outcome::NotAccepted);
    // Out of range and misaligned are refused per request too.
    let bad = [
        tutti_request { offset: MIB, ..request(TUTTI_DIRECTION_READ, a, 4096, m, 0) },
        request(TUTTI_DIRECTION_READ, a, 100, m, 0),
    ];
    let (op, states) = submit(rt, &bad);
    assert_eq!(op, 0);
    assert!(message(&states[0]).contains("outside"), "{}", message(&states[0]));
    assert!(message(&states[1]).contains("not a multiple"), "{}", message(&states[1]));
    tutti_runtime_destroy(rt);
}

#[test]
fn a_too_small_status_array_is_refused_and_the_op_stays_waitable() {
    let rt = emulated();
    let t = open(rt, "tutti://kv/0");
    let mut buf = vec![0u8; 3 * 4096];
    let m = register(rt, &mut buf);
    let reqs: Vec<tutti_request> = (0..3)
        .map(|i| tutti_request { offset: i * 4096, ..request(TUTTI_DIRECTION_WRITE, t, 4096, m, i * 4096) })
        .collect();
    let (op, _) = submit(rt, &reqs);
    let mut out = vec![empty_status(); 2];
    let mut count = 0;
    assert_eq!(tutti_wait(rt, op, 5000, out.as_mut_ptr(), 2, &mut count), tutti_status::BufferTooSmall);
    assert_eq!(count, 3, "the count needed");
    assert!(last_error().contains("3 requests"), "{}", last_error());
    assert_eq!(out[0].kind, tutti_outcome::Other, "nothing written");
    assert_eq!(tutti_try_wait(rt, op, out.as_mut_ptr(), 1, &mut count), tutti_status::BufferTooSmall);
    // Memory stays busy: the operation was not consumed.
    assert_eq!(tutti_unregister_memory(rt, m), tutti_status::MemoryBusy);
    let done = wait(rt, op, 3);
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|s| s.kind == tutti_outcome::Success));
    assert_eq!(tutti_wait(rt, op, 0, out.as_mut_ptr(), 2, &mut count), tutti_status::Handle, "consumed");
    assert_eq!(tutti_unregister_memory(rt, m), tutti_status::Ok);
    tutti_runtime_destroy(rt);
}

#[test]
fn bad_configs_and_arguments_are_refused_with_a_message() {
    let mut rt = null_mut();
    let yaml =
        c"drives: { d0: { emulated: { namespaces: [{ capacity: 16MiB, block_size: 4096 }], bogus: 1 } } }";
    assert_eq!(tutti_runtime_new_yaml(yaml.as_ptr(), &mut rt), tutti_status::Config);
    let msg = last_error();
    assert!(msg.starts_with("configuration: ") && msg.contains("drives.d0"), "{msg}");
    assert!(msg.contains("bogus"), "{msg}");
    let not_utf8 = [b'd', 0xFF, 0];
    assert_eq!(tutti_runtime_new_yaml(not_utf8.as_ptr().cast(), &mut rt), tutti_status::InvalidArgument);
    assert!(last_error().contains("not UTF-8"), "{}", last_error());
    assert_eq!(tutti_runtime_new_file(c"/nonexistent/tutti.yaml".as_ptr(), &mut rt), tutti_status::Config);
    assert!(last_error().contains("/nonexistent/tutti.yaml"), "{}", last_error());
    assert_eq!(tutti_runtime_new_emulated(0, 16 * MIB, MIB, &mut rt), tutti_status::InvalidArgument);
    assert_eq!(tutti_runtime_new_emulated(5, 16 * MIB, MIB, &mut rt), tutti_status::InvalidArgument);
    assert_eq!(tutti_runtime_new_emulated(2, 16 * MIB + 1, MIB, &mut rt), tutti_status::Config);
    assert!(rt.is_null(), "no runtime on failure");

    let rt = emulated();
    let t = open(rt, "tutti://kv/0");
    let mut buf = vec![0u8; 4096];
    let m = register(rt, &mut buf);
    let mut states = [empty_status()];
    let mut op = 0;
    let bad = [request(9, t, 4096, m, 0)];
    assert_eq!(
        tutti_submit(rt, bad.as_ptr(), 1, states.as_mut_ptr(), &mut op),
        tutti_status::InvalidArgument
    );
    assert!(last_error().contains("requests[0].direction is 9"), "{}", last_error());
    assert_eq!(
        tutti_submit(rt, bad.as_ptr(), 0, states.as_mut_ptr(), &mut op),
        tutti_status::InvalidArgument
    );
    let mut h = 0;
    assert_eq!(tutti_register_memory(rt, buf.as_mut_ptr().cast(), 0, &mut h), tutti_status::Memory);
    assert_eq!(tutti_register_memory(rt, null_mut(), 4096, &mut h), tutti_status::Memory);
    assert_eq!(tutti_register_gpu_memory(rt, 0x1000, 4096, &mut h), tutti_status::Memory);
    assert!(last_error().contains("GPU"), "{}", last_error());
    let mut bad_uri = 0;
    assert_eq!(tutti_open(rt, c"http://kv/0".as_ptr(), &mut bad_uri), tutti_status::Uri);
    assert!(last_error().contains("tutti://"), "{}", last_error());
    tutti_runtime_destroy(rt);
}

#[test]
fn try_wait_is_not_ready_until_the_drive_completes() {
    // Every write takes 300 ms in the drive.
    let rt = one_drive_with_faults("[{ op: write, action: { delay_us: 300000 } }]");
    let t = open(rt, "tutti://kv/0");
    let mut buf = vec![0x5Au8; 4096];
    let m = register(rt, &mut buf);
    let (op, _) = submit(rt, &[request(TUTTI_DIRECTION_WRITE, t, 4096, m, 0)]);
    let mut out = [empty_status()];
    let mut count = 0;
    let start = Instant::now();
    assert_eq!(tutti_try_wait(rt, op, out.as_mut_ptr(), 1, &mut count), tutti_status::NotReady);
    assert!(last_error().contains("not final"), "{}", last_error());
    assert_eq!(out[0].kind, tutti_outcome::Other, "nothing written");
    let mut polls = 1;
    loop {
        match tutti_try_wait(rt, op, out.as_mut_ptr(), 1, &mut count) {
            tutti_status::NotReady => polls += 1,
            tutti_status::Ok => break,
            other => panic!("{other:?}: {}", last_error()),
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never final");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(polls > 1 && start.elapsed() >= Duration::from_millis(250), "{polls} polls");
    assert_eq!((count, out[0].kind), (1, tutti_outcome::Success));
    assert_eq!(tutti_try_wait(rt, op, out.as_mut_ptr(), 1, &mut count), tutti_status::Handle, "consumed");
    tutti_runtime_destroy(rt);
}

#[test]
fn an_nvme_error_reaches_its_request_with_sct_sc_dnr_and_drive() {
    // Reads of LBA 0..8 fail with Unrecovered Read Error (SCT 2h, SC 81h), DNR.
    let rt = one_drive_with_faults(
        "[{ lba: [0, 8], op: read, action: { fail: { sct: 2, sc: 0x81, dnr: true } } }]",
    );
    let (t0, t1) = (open(rt, "tutti://kv/0"), open(rt, "tutti://kv/1"));
    let mut buf = vec![0u8; 2 * 4096];
    let m = register(rt, &mut buf);
    let reqs =
        [request(TUTTI_DIRECTION_READ, t0, 4096, m, 0), request(TUTTI_DIRECTION_READ, t1, 4096, m, 4096)];
    let (op, _) = submit(rt, &reqs);
    let done = wait(rt, op, 2);
    let e = &done[0];
    assert_eq!(e.kind, tutti_outcome::Nvme);
    assert_eq!((e.sct, e.sc, e.dnr, e.more, e.crd), (2, 0x81, true, false, 0));
    assert_eq!(e.drive_index, 0);
    let msg = message(e);
    assert!(msg.starts_with("drive \"d0\": "), "{msg}");
    assert!(msg.to_lowercase().contains("unrecovered read error"), "{msg}");
    assert_eq!(done[1].kind, tutti_outcome::Success, "only the failed request fails");
    assert_eq!((done[1].sct, done[1].sc, done[1].dnr), (0, 0, false));
    tutti_runtime_destroy(rt);
}

#[test]
fn the_last_error_message_can_be_measured_truncated_and_is_per_thread() {
    let mut rt = null_mut();
    assert_eq!(tutti_runtime_new_emulated(0, 0, 0, &mut rt), tutti_status::InvalidArgument);
    let full = last_error();
    assert_eq!(full, "drives is 0, expected 1..=4");
    let mut small = [0x7F as c_char; 6];
    let mut n = 0;
    assert_eq!(tutti_last_error_message(small.as_mut_ptr(), 6, &mut n), tutti_status::BufferTooSmall);
    assert_eq!(n, full.len());
    // SAFETY: NUL-terminated by the call.
    assert_eq!(unsafe { CStr::from_ptr(small.as_ptr()) }.to_str().unwrap(), &full[..5]);
    assert_eq!(last_error(), full, "reading it does not clear it");
    let other = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(other, "", "another thread has its own");
}

#[test]
fn unregistering_memory_in_use_is_memory_busy_until_waited() {
    let rt = emulated();
    let t = open(rt, "tutti://kv/0");
    let mut buf = vec![0u8; 4096];
    let m = register(rt, &mut buf);
    let (op, _) = submit(rt, &[request(TUTTI_DIRECTION_WRITE, t, 4096, m, 0)]);
    assert_eq!(tutti_unregister_memory(rt, m), tutti_status::MemoryBusy);
    assert!(last_error().contains("in use by 1 operation"), "{}", last_error());
    assert_eq!(wait(rt, op, 1)[0].kind, tutti_outcome::Success);
    let (op, states) =
        submit(rt, &[tutti_request { direction: TUTTI_DIRECTION_FLUSH, ..request(0, t, 0, 0, 0) }]);
    assert_eq!(states[0].kind, tutti_outcome::Pending, "a flush needs no memory");
    assert_eq!(wait(rt, op, 1)[0].kind, tutti_outcome::Success);
    assert_eq!(tutti_unregister_memory(rt, m), tutti_status::Ok);
    assert_eq!(tutti_unregister_memory(rt, m), tutti_status::Handle, "stale now");
    tutti_runtime_destroy(rt);
}

/// A runtime pointer shared with other threads (the API is thread-safe).
#[derive(Clone, Copy)]
struct Shared(*const tutti_runtime);
// SAFETY: every call but `tutti_runtime_destroy` may come from any thread
// (`tutti_runtime` wraps the `Send + Sync` runtime); the runtime is
// destroyed only after the threads are joined.
unsafe impl Send for Shared {}

#[test]
fn threads_share_one_runtime() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<tutti_runtime>();
    let rt = Shared(emulated());
    let threads: Vec<_> = (0..4u8)
        .map(|k| {
            std::thread::spawn(move || {
                let rt = rt;
                let t = open(rt.0, &format!("tutti://kv/{k}"));
                let mut buf = vec![0u8; 2 * 65536];
                let m = register(rt.0, &mut buf);
                for round in 0..8u8 {
                    let fill = k.wrapping_mul(16).wrapping_add(round);
                    buf[..65536].fill(fill);
                    let (op, _) = submit(rt.0, &[request(TUTTI_DIRECTION_WRITE, t, 65536, m, 0)]);
                    assert_eq!(wait(rt.0, op, 1)[0].kind, tutti_outcome::Success);
                    let (op, _) = submit(rt.0, &[request(TUTTI_DIRECTION_READ, t, 65536, m, 65536)]);
                    assert_eq!(wait(rt.0, op, 1)[0].kind, tutti_outcome::Success);
                    assert!(buf[65536..].iter().all(|b| *b == fill), "thread {k} round {round}");
                }
                assert_eq!(tutti_unregister_memory(rt.0, m), tutti_status::Ok);
                assert_eq!(tutti_close(rt.0, t), tutti_status::Ok);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut stats = tutti_stats::default();
    assert_eq!(tutti_stats_get(rt.0, &mut stats), tutti_status::Ok);
    assert!(stats.commands_completed >= 64, "{stats:?}");
    tutti_runtime_destroy(rt.0.cast_mut());
}

#[test]
fn a_null_uri_in_a_batch_is_named_by_its_index() {
    // The message said "uris[1]: uris[i] is NULL".
    let rt = emulated();
    let ptrs = [c"tutti://kv/0".as_ptr(), null()];
    let mut targets = [7u64; 2];
    let mut sts = [tutti_status::Panic; 2];
    let st = tutti_open_batch(rt, ptrs.as_ptr(), 2, targets.as_mut_ptr(), sts.as_mut_ptr());
    assert_eq!(st, tutti_status::NullArgument);
    assert_eq!(last_error(), "uris[1]: the URI is NULL");
    assert_eq!(sts, [tutti_status::Ok, tutti_status::NullArgument]);
    assert_eq!(targets[1], 0);
    assert_eq!(tutti_close(rt, targets[0]), tutti_status::Ok);
    tutti_runtime_destroy(rt);
}

#[test]
fn shared_memory_is_allocated_registered_and_moves_bytes() {
    let mut sm: *mut tutti_shared_memory = null_mut();
    assert_eq!(tutti_shared_memory_new(0, &mut sm), tutti_status::Memory);
    assert!(last_error().contains("shared memory"), "{}", last_error());
    assert_eq!(tutti_shared_memory_new(4096, null_mut()), tutti_status::NullArgument);
    assert!(tutti_shared_memory_ptr(null()).is_null());
    assert_eq!(tutti_shared_memory_len(null()), 0);
    tutti_shared_memory_free(null_mut());
    assert_eq!(tutti_shared_memory_new(5000, &mut sm), tutti_status::Ok, "{}", last_error());
    let len = tutti_shared_memory_len(sm);
    assert_eq!(len, 8192, "rounded up to whole pages");
    let p = tutti_shared_memory_ptr(sm).cast::<u8>();
    assert!(!p.is_null() && (p as usize).is_multiple_of(4096));
    // SAFETY: `p` points to `len` bytes of this shared memory, alive until
    // it is freed below, and no I/O runs while the slice is used.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, len) };
    for (i, b) in buf[..4096].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let rt = emulated();
    let t = open(rt, "tutti://kv/0");
    let m = register(rt, buf);
    let (op, _) = submit(rt, &[request(TUTTI_DIRECTION_WRITE, t, 4096, m, 0)]);
    assert_eq!(wait(rt, op, 1)[0].kind, tutti_outcome::Success);
    let (op, _) = submit(rt, &[request(TUTTI_DIRECTION_READ, t, 4096, m, 4096)]);
    assert_eq!(wait(rt, op, 1)[0].kind, tutti_outcome::Success);
    // SAFETY: as above; the read has completed.
    let buf = unsafe { std::slice::from_raw_parts(p, len) };
    assert!(buf[..4096] == buf[4096..], "bytes read back differ");
    assert_eq!(tutti_unregister_memory(rt, m), tutti_status::Ok);
    tutti_runtime_destroy(rt);
    tutti_shared_memory_free(sm);
}
