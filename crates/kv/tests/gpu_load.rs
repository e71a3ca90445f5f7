//! The GPU datapath under a serving engine's load (issue 23): the TTFT
//! benchmark's runtime (four Gen4-modelled emulated drives, 1 MiB slab
//! slots, 128 KiB stripe unit, two GPU queues of 256 entries per drive,
//! `execution: gpu`), 512 objects of 1 MiB put from GPU memory, then get
//! batches of B objects into GPU memory with 1 to 4 batches in flight.
//! Every item must be a verified hit, every byte must match, and every
//! wait must return by its deadline.
//!
//! On main at 95126fd this failed on the H200: B = 63 and 127 timed out
//! (whole batches) and two batches of 127 in flight hung. The cause: the
//! checksum of a get was queued on its own CUDA stream behind the load's
//! end event (`cuStreamWaitEvent`); a stream that waits blocks the
//! hardware queue (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default) it shares
//! with other streams, and when that queue was also an emulator copy
//! lane's, the copies the load's kernel waited for sat behind the wait for
//! that kernel. This binary runs with every stream on one hardware queue
//! (`CUDA_DEVICE_MAX_CONNECTIONS=1`, set before the CUDA driver starts)
//! so that any such cycle shows at once rather than by chance.
//!
//! Needs a CUDA GPU; elsewhere it prints why it skipped and passes.
//! `TUTTI_LOAD_CELLS` (e.g. `63x1,127x2`) runs other cells;
//! `TUTTI_LOAD_CONNECTIONS` another hardware-queue count.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{fill, key};
use gpu_io::GpuBuffer;
use tutti::{Config, Runtime};
use tutti_kv::{Get, ItemStatus, KvStore, OpenOptions, Put, Value};

const OBJ: usize = 1 << 20;
/// Objects put, then read back in every cell.
const OBJECTS: usize = 512;
/// Each wait's deadline: far under the 10 s GPU command budget, so a
/// stall fails the cell instead of passing slowly.
const WAIT: Duration = Duration::from_secs(5);
/// How far past its deadline a wait may return (it polls the kernel's
/// end; stated in docs/gpu.md).
const OVERRUN: Duration = Duration::from_millis(50);

/// Cells: (objects per batch, batches in flight).
const CELLS: [(usize, usize); 12] = [
    (1, 1),
    (1, 4),
    (16, 2),
    (31, 2),
    (32, 1),
    (48, 1),
    (63, 1),
    (63, 2),
    (127, 1),
    (127, 2),
    (256, 2),
    (512, 1),
];

fn runtime() -> Option<Arc<Runtime>> {
    let connections = std::env::var("TUTTI_LOAD_CONNECTIONS").unwrap_or_else(|_| "1".to_owned());
    // SAFETY: set before the CUDA driver is loaded (the runtime below
    // loads it), from the binary's only test, before any thread of ours
    // reads the environment.
    std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", connections);
    let timing = "{ bandwidth_mb_s: 7000, iops: 1500000, latency_us: 80 }";
    let mut y = String::from("drives:\n");
    for d in 0..4 {
        y += &format!(
            "  d{d}: {{ emulated: {{ namespaces: [{{ capacity: 256MiB, block_size: 4096 }}], backing: ram, timing: {timing} }} }}\n"
        );
    }
    y += "resolvers:\n  kv: { slab: { slot_size: 1MiB } }\n";
    y += "datapaths:\n  stripe: { striped_local_nvme: { drives: [d0, d1, d2, d3], nsid: 1, stripe_unit: 128KiB, \
          queues_per_drive: 2, queue_depth: 256, execution: gpu } }\n";
    y += "stores:\n  kv: { resolver: kv, datapath: stripe }\n";
    match Runtime::from_config(Config::from_yaml_str(&y).unwrap()) {
        Ok(rt) => Some(Arc::new(rt)),
        Err(e @ tutti::Error::Gpu { .. }) => {
            eprintln!("skipped: {}", tutti::error_chain(&e));
            None
        }
        Err(e) => panic!("{}", tutti::error_chain(&e)),
    }
}

fn cells() -> Vec<(usize, usize)> {
    match std::env::var("TUTTI_LOAD_CELLS") {
        Ok(s) => s
            .split(',')
            .map(|c| {
                let (b, f) = c.trim().split_once('x').expect("cells look like 63x2");
                (b.parse().unwrap(), f.parse().unwrap())
            })
            .collect(),
        Err(_) => CELLS.to_vec(),
    }
}

#[test]
fn kv_restores_of_every_batch_size_complete_with_every_byte_verified() {
    let Some(rt) = runtime() else { return };
    let gpu = rt.gpu().expect("a GPU runtime has a GPU").clone();
    let kv = KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap();
    let src = GpuBuffer::zeroed(&gpu, OBJECTS * OBJ).unwrap();
    let dst = GpuBuffer::zeroed(&gpu, OBJECTS * OBJ).unwrap();
    let mut host = vec![0u8; OBJECTS * OBJ];
    for (i, o) in host.chunks_exact_mut(OBJ).enumerate() {
        fill(o, i as u64, 1);
    }
    src.copy_in(0, &host).unwrap();
    // SAFETY: both buffers outlive their registrations (unregistered at the
    // end) and are written only by the store's gets while I/O runs.
    #[allow(unsafe_code)]
    let (ms, md) = unsafe {
        let s = kv.register_gpu(src.device_ptr(), src.len()).unwrap();
        (s, kv.register_gpu(dst.device_ptr(), dst.len()).unwrap())
    };
    let value = |m, i: usize| Value { memory: m, offset: (i * OBJ) as u64, len: OBJ as u64 };
    for chunk in (0..OBJECTS).collect::<Vec<_>>().chunks(64) {
        let puts: Vec<Put> =
            chunk.iter().map(|&i| Put { key: key(i as u64), value: value(&ms, i) }).collect();
        let st = kv.put_sync(&puts, Duration::from_secs(10)).unwrap();
        assert!(st.iter().all(|s| *s == ItemStatus::Ok), "puts: {st:?}");
    }
    let mut failures = Vec::new();
    let mut worst_overrun = Duration::ZERO;
    for (b, inflight) in cells() {
        assert!(b * inflight <= OBJECTS, "cell {b}x{inflight} needs more objects");
        dst.copy_in(0, &vec![0u8; OBJECTS * OBJ]).unwrap();
        let start = Instant::now();
        let mut bad = 0usize;
        // Batches of b objects, `inflight` issued before the first is waited.
        let rounds = (OBJECTS / (b * inflight)).clamp(1, 4);
        for r in 0..rounds {
            let first = r * b * inflight;
            let pending: Vec<_> = (0..inflight)
                .map(|f| {
                    let gets: Vec<Get> = (0..b)
                        .map(|j| {
                            let i = first + f * b + j;
                            Get { key: key(i as u64), into: value(&md, i) }
                        })
                        .collect();
                    kv.get(&gets).unwrap()
                })
                .collect();
            for p in pending {
                let t = Instant::now();
                let st = kv.wait_get(p, WAIT).unwrap();
                worst_overrun = worst_overrun.max(t.elapsed().saturating_sub(WAIT));
                bad += st.iter().filter(|s| **s != ItemStatus::Hit { len: OBJ as u64 }).count();
            }
            if bad > 0 {
                break; // each stalled batch costs a whole command budget
            }
        }
        let mut back = vec![0u8; OBJECTS * OBJ];
        dst.copy_out(0, &mut back).unwrap();
        let n = rounds * b * inflight;
        let wrong = (0..n).filter(|&i| back[i * OBJ..(i + 1) * OBJ] != host[i * OBJ..(i + 1) * OBJ]).count();
        println!(
            "cell B={b:4} x{inflight} in flight: {rounds} rounds, {n} objects, {bad} not hits, {wrong} wrong, {:?}",
            start.elapsed()
        );
        if bad + wrong > 0 {
            failures.push(format!("{b}x{inflight}: {bad} not hits, {wrong} wrong"));
        }
    }
    println!("worst wait overrun past its deadline: {worst_overrun:?}");
    assert!(failures.is_empty(), "cells failed: {failures:?}");
    assert!(worst_overrun <= OVERRUN, "a wait overran its deadline by {worst_overrun:?}");
    kv.unregister(ms).unwrap();
    kv.unregister(md).unwrap();
}
