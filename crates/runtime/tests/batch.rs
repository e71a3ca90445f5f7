//! Batch submission: each queue's SQ tail doorbell is written once per
//! `submit` call, after every SQE of the batch is in place, and the data
//! still lands where each request says.

use std::time::Duration;

use tutti::{Config, Request, Runtime};

const T: Duration = Duration::from_secs(10);

/// One emulated drive, one I/O queue pair of 256 entries, 4 KiB slots.
fn one_queue() -> Runtime {
    let yaml = "drives:\n  d0:\n    emulated:\n      namespaces: [{ capacity: 64MiB, block_size: 4096 }]\n\
                resolvers:\n  kv:\n    slab: { slot_size: 4KiB }\n\
                datapaths:\n  one:\n    local_nvme: { drive: d0, queues: 1, queue_depth: 256 }\n\
                stores:\n  kv: { resolver: kv, datapath: one }\n";
    Runtime::from_config(Config::from_yaml_str(yaml).unwrap()).unwrap()
}

fn register(rt: &Runtime, v: &mut [u64]) -> tutti::MemoryHandle {
    // SAFETY: every caller keeps `v` alive past the runtime and touches it
    // only between submit/wait pairs.
    #[allow(unsafe_code)]
    unsafe {
        rt.register_memory(v.as_mut_ptr().cast(), v.len() * 8).unwrap()
    }
}

/// 64 x 4 KiB requests to 64 slots, as reads or writes.
fn requests(rt: &Runtime, mem: tutti::MemoryHandle, write: bool) -> Vec<Request> {
    (0..64u64)
        .map(|i| {
            let t = rt.open(&format!("tutti://kv/{i}")).unwrap();
            if write {
                Request::write(t, 0, 4096, mem, i * 4096)
            } else {
                Request::read(t, 0, 4096, mem, i * 4096)
            }
        })
        .collect()
}

#[test]
fn a_64_request_batch_on_one_queue_writes_the_sq_tail_doorbell_once() {
    let rt = one_queue();
    let mut src: Vec<u64> =
        (0..64 * 512).map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 7).collect();
    let mut dst = vec![0u64; 64 * 512];
    let (ms, md) = (register(&rt, &mut src), register(&rt, &mut dst));
    let emu_before = rt.emulator("d0").unwrap().stats().sq_tail_updates;

    let before = rt.stats();
    let op = rt.submit(&requests(&rt, ms, true)).op().unwrap();
    let after_submit = rt.stats();
    assert!(rt.wait(op, T).unwrap().iter().all(|s| s.is_success()));
    assert_eq!(after_submit.commands_submitted - before.commands_submitted, 64);
    assert_eq!(
        after_submit.sq_doorbell_writes - before.sq_doorbell_writes,
        1,
        "one doorbell write for 64 SQEs"
    );
    // The controller saw one new tail, covering all 64 entries.
    assert_eq!(rt.emulator("d0").unwrap().stats().sq_tail_updates - emu_before, 1);

    let op = rt.submit(&requests(&rt, md, false)).op().unwrap();
    assert!(rt.wait(op, T).unwrap().iter().all(|s| s.is_success()));
    assert_eq!(rt.stats().sq_doorbell_writes - before.sq_doorbell_writes, 2);
    assert!(src == dst, "every request's data landed at its own offset");
    rt.unregister_memory(ms).unwrap();
    rt.unregister_memory(md).unwrap();
    drop(rt);
}

#[test]
fn one_request_per_submit_writes_one_doorbell_each() {
    // The counter counts writes, not batches: 8 submits of one request
    // each are 8 doorbell writes.
    let rt = one_queue();
    let mut buf = vec![0u64; 64 * 512];
    let m = register(&rt, &mut buf);
    let reqs = requests(&rt, m, true);
    let before = rt.stats().sq_doorbell_writes;
    for r in &reqs[..8] {
        let op = rt.submit(std::slice::from_ref(r)).op().unwrap();
        assert!(rt.wait(op, T).unwrap()[0].is_success());
    }
    assert_eq!(rt.stats().sq_doorbell_writes - before, 8);
    rt.unregister_memory(m).unwrap();
    drop(rt);
}

#[test]
fn a_batch_over_a_four_drive_stripe_writes_each_drives_doorbell_once() {
    // 1 MiB slots striped at 128 KiB over four drives, 8 requests of 1 MiB:
    // every drive gets 16 commands on one of its queues, one doorbell write.
    let rt = Runtime::from_config(Config::builtin_striped_ram(4, 64 << 20, 1 << 20)).unwrap();
    let mut buf = vec![0u64; 8 << 17];
    let m = register(&rt, &mut buf);
    let reqs: Vec<Request> = (0..8u64)
        .map(|i| Request::write(rt.open(&format!("tutti://kv/{i}")).unwrap(), 0, 1 << 20, m, i << 20))
        .collect();
    let before = rt.stats();
    let op = rt.submit(&reqs).op().unwrap();
    let after = rt.stats();
    assert!(rt.wait(op, T).unwrap().iter().all(|s| s.is_success()));
    assert_eq!(after.sq_doorbell_writes - before.sq_doorbell_writes, 4);
    rt.unregister_memory(m).unwrap();
    drop(rt);
}
