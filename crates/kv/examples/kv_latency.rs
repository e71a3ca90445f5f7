//! Latency of single operations, CPU execution against GPU execution, on
//! the built-in four emulated drives (RAM, no timing model): one runtime
//! read (896 KiB: one `qwen2.5-7b` block of 16 tokens; 512 KiB: four stripe
//! units, one command per drive; 128 KiB: one stripe unit, one command; and
//! 4 KiB; with GPU execution also 896 KiB into host memory, which the
//! emulator moves with a memcpy instead of CUDA copies), one
//! CRC32C of a block, and tutti-kv gets and puts of 1 and 4 blocks. Each
//! line is p10 / p50 / p90 over 300 runs after 20 warm-up runs; the GPU
//! half needs a CUDA GPU (skipped, with a line saying so, without one).
//!
//! ```sh
//! cargo run --release -p tutti-kv --example kv_latency
//! ```
//!
//! Numbers and what they showed: docs/benchmarks.md, "Single-operation
//! latency".

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_io::GpuBuffer;
use tutti::config::{DataPathConfig, Execution};
use tutti::{Config, MemoryHandle, Request, Runtime};
use tutti_kv::{Get, ItemStatus, Key, KvMemory, KvStore, OpenOptions, Put, Value};

/// Bytes of one block (`qwen2.5-7b`, 16 tokens: `tutti-bench replay`'s).
const BLOCK: usize = 917_504;
/// Blocks of memory registered.
const BLOCKS: usize = 8;
/// Timed runs per line.
const RUNS: usize = 300;
/// Untimed runs first.
const WARM_UP: usize = 20;
/// Bound on each wait.
const WAIT: Duration = Duration::from_secs(10);

fn main() -> Result<(), String> {
    for gpu in [false, true] {
        let cfg = config(gpu);
        let rt = match Runtime::from_config(cfg) {
            Ok(rt) => Arc::new(rt),
            Err(e) if gpu => {
                println!("GPU execution skipped: {}", tutti::error_chain(&e));
                return Ok(());
            }
            Err(e) => return Err(tutti::error_chain(&e)),
        };
        run(&rt, if gpu { "gpu" } else { "cpu" })?;
    }
    Ok(())
}

/// Four RAM-backed emulated drives striped, CPU or GPU execution.
fn config(gpu: bool) -> Config {
    let mut cfg = Config::builtin_striped_ram(4, 256 << 20, BLOCK as u64);
    if gpu {
        for dp in cfg.datapaths.values_mut() {
            if let DataPathConfig::StripedLocalNvme(s) = dp {
                s.execution = Execution::Gpu;
            }
        }
    }
    cfg
}

/// Memory for the operations: host memory for CPU execution, GPU memory
/// for GPU execution, registered with the store and with the runtime.
struct Memory {
    host: Vec<u8>,
    gpu: Option<GpuBuffer>,
    kv: KvMemory,
    rt: MemoryHandle,
    /// With GPU execution, `host` registered with the runtime too.
    rt_host: Option<MemoryHandle>,
}

fn memory(rt: &Arc<Runtime>, kv: &KvStore) -> Result<Memory, String> {
    let len = BLOCKS * BLOCK;
    let mut host: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4099) as u8).collect();
    let gpu = match rt.gpu() {
        Some(g) => {
            let b = GpuBuffer::zeroed(g, len).map_err(|e| e.to_string())?;
            b.copy_in(0, &host).map_err(|e| e.to_string())?;
            Some(b)
        }
        None => None,
    };
    let e = |e: &dyn std::error::Error| e.to_string();
    // SAFETY: the memory (the vector's heap buffer, or the GPU buffer)
    // lives in the returned value, which outlives every operation on it
    // (it is dropped after the store and runtime are done with it: `run`
    // ends its operations first), and nothing else writes it.
    #[allow(unsafe_code)]
    let (kvm, rtm) = unsafe {
        match &gpu {
            Some(b) => (
                kv.register_gpu(b.device_ptr(), len).map_err(|x| e(&x))?,
                rt.register_gpu_memory(b.device_ptr(), len).map_err(|x| e(&x))?,
            ),
            None => (
                kv.register_host(host.as_mut_ptr(), len).map_err(|x| e(&x))?,
                rt.register_memory(host.as_mut_ptr(), len).map_err(|x| e(&x))?,
            ),
        }
    };
    let rt_host = match &gpu {
        // SAFETY: as above: `host` lives in the returned value.
        #[allow(unsafe_code)]
        Some(_) => Some(unsafe { rt.register_memory(host.as_mut_ptr(), len) }.map_err(|x| e(&x))?),
        None => None,
    };
    Ok(Memory { host, gpu, kv: kvm, rt: rtm, rt_host })
}

/// The `i`th 32-byte key.
fn key(i: u64) -> Key {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&i.to_le_bytes());
    Key::new(&b).expect("32 bytes is a valid key length")
}

fn run(rt: &Arc<Runtime>, tag: &str) -> Result<(), String> {
    let kv = KvStore::open(rt.clone(), &OpenOptions::new("kv")).map_err(|e| e.to_string())?;
    let m = memory(rt, &kv)?;
    let value = |i: usize| Value { memory: &m.kv, offset: (i * BLOCK) as u64, len: BLOCK as u64 };
    let puts: Vec<Put> = (0..BLOCKS).map(|i| Put { key: key(i as u64), value: value(i) }).collect();
    let st = kv.put_sync(&puts, WAIT).map_err(|e| e.to_string())?;
    if !st.iter().all(|s| matches!(s, ItemStatus::Ok)) {
        return Err(format!("setup puts failed: {st:?}"));
    }
    let (t, t4) = (
        rt.open("tutti://kv/100").map_err(|e| e.to_string())?,
        rt.open("tutti://kv/101").map_err(|e| e.to_string())?,
    );
    let read_into = |target, len: u64, mem: MemoryHandle| -> Result<(), String> {
        let op = rt.submit(&[Request::read(target, 0, len, mem, 0)]).op().ok_or("read refused")?;
        let st = rt.wait(op, WAIT).map_err(|e| e.to_string())?;
        st[0].is_success().then_some(()).ok_or_else(|| format!("read failed: {:?}", st[0]))
    };
    let read = |target, len: u64| read_into(target, len, m.rt);
    time(&format!("{tag} runtime read 896 KiB"), || read(t, BLOCK as u64))?;
    if let Some(h) = m.rt_host {
        time("gpu runtime read 896 KiB to host", || read_into(t, BLOCK as u64, h))?;
    }
    time(&format!("{tag} runtime read 512 KiB"), || read(t4, 512 << 10))?;
    time(&format!("{tag} runtime read 128 KiB"), || read(t4, 128 << 10))?;
    time(&format!("{tag} runtime read 4 KiB"), || read(t4, 4096))?;
    match (rt.gpu(), &m.gpu) {
        (Some(g), Some(b)) => time("gpu CRC32C of 896 KiB", || {
            // SAFETY: the range lies inside the live buffer `b`, which no
            // operation writes now.
            #[allow(unsafe_code)]
            unsafe { g.crc32c_raw(&[(b.device_ptr(), BLOCK)]) }.map(drop).map_err(|e| e.to_string())
        })?,
        _ => time("cpu CRC32C of 896 KiB", || {
            std::hint::black_box(crc32c::crc32c(&m.host[..BLOCK]));
            Ok(())
        })?,
    }
    for n in [1, 4] {
        time(&format!("{tag} kv get {n} block(s)"), || {
            let gets: Vec<Get> = (0..n).map(|i| Get { key: key(i as u64), into: value(i) }).collect();
            let st = kv.get_sync(&gets, WAIT).map_err(|e| e.to_string())?;
            st.iter().all(|s| matches!(s, ItemStatus::Hit { .. })).then_some(()).ok_or(format!("{st:?}"))
        })?;
    }
    let mut next = 1000u64;
    for n in [1, 4] {
        time(&format!("{tag} kv put {n} block(s)"), || {
            let puts: Vec<Put> = (0..n)
                .map(|i| {
                    next += 1;
                    Put { key: key(next), value: value(i) }
                })
                .collect();
            let st = kv.put_sync(&puts, WAIT).map_err(|e| e.to_string())?;
            st.iter().all(|s| matches!(s, ItemStatus::Ok)).then_some(()).ok_or(format!("{st:?}"))
        })?;
    }
    Ok(())
}

/// Runs `f` [`WARM_UP`] times, then [`RUNS`] times timed, and prints the
/// 10th, 50th and 90th percentiles.
fn time(name: &str, mut f: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    for _ in 0..WARM_UP {
        f()?;
    }
    let mut v = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed());
    }
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{name:<32} p10 {:>5.0}  p50 {:>5.0}  p90 {:>5.0} us",
        us(v[RUNS / 10]),
        us(v[RUNS / 2]),
        us(v[RUNS * 9 / 10])
    );
    Ok(())
}
