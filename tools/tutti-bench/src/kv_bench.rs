//! `kv`: what tutti-kv costs over raw runtime I/O on the same drives, and
//! how long recovery takes.
//!
//! Bandwidth: the same emulated drives (RAM, a fresh runtime per pass),
//! every object slot written then read in batches, once through raw
//! `submit`/`wait` and once through the store (`put`/`wait_put`, which adds
//! the CRC32C of each payload and a group commit of two Flushes and the
//! record blocks per batch; `get`/`wait_get`, which adds the CRC32C check),
//! alternating `--rounds` times; the medians and their ratio are printed.
//!
//! Recovery: a store of 4 KiB objects filled with `--recovery N` objects,
//! dropped, and opened again: the time to read the record table and
//! rebuild the index.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use tutti::{Config, MemoryHandle, Request, Runtime};
use tutti_kv::{Get, Key, KvStore, OpenOptions, Put, Value};

use crate::interrupt::{Ended, Stop};

const T: Duration = Duration::from_secs(60);

/// Options of `kv`.
#[derive(Debug, Args)]
pub struct KvArgs {
    /// Emulated RAM drives (striped when more than one), 1..=4.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=4))]
    pub drives: u64,
    /// Capacity of each drive, MiB.
    #[arg(long, default_value_t = 512)]
    pub drive_mib: u64,
    /// Object (slot) size, KiB.
    #[arg(long, default_value_t = 1024)]
    pub object_kib: u64,
    /// Objects per submit / put / get call.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Calls in flight at once (each with its own `batch` objects of
    /// memory): the next batches' payloads move while earlier ones commit.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub depth: u64,
    /// Passes of each path, alternating; medians are compared (0 skips
    /// the bandwidth passes).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Objects for the recovery measurement (comma-separated counts; 0
    /// skips it).
    #[arg(long, value_delimiter = ',', default_value = "100000")]
    pub recovery: Vec<u64>,
    /// Print JSON (docs/benchmarks.md, "JSON output").
    #[arg(long)]
    pub json: bool,
    /// Also draw put/get against raw write/read GB/s into FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
}

use tutti_bench::schema::kv::median;
use tutti_bench::schema::{Document, KvPass as Pass, KvResult};

/// Runs `kv` and prints the result.
pub fn kv(a: &KvArgs, stop: &Stop) -> Result<Ended, String> {
    let obj = a.object_kib << 10;
    let (mut raw, mut store) = (Vec::new(), Vec::new());
    let mut objects = 0;
    for _ in 0..a.rounds {
        if let Some(signal) = stop.requested() {
            return Ok(Ended::Interrupted { signal, detail: "kv: stopped between passes".into() });
        }
        let (p, n) = raw_pass(a, obj)?;
        raw.push(p);
        store.push(store_pass(a, obj)?);
        objects = n;
    }
    let m = |v: &[Pass], f: fn(&Pass) -> f64| median(v.iter().map(f).collect());
    let mut r = KvResult {
        drives: a.drives,
        object_bytes: obj,
        objects,
        batch: a.batch,
        put_ratio: m(&store, |p| p.write_gbps) / m(&raw, |p| p.write_gbps),
        get_ratio: m(&store, |p| p.read_gbps) / m(&raw, |p| p.read_gbps),
        raw,
        store,
        recovery: Vec::new(),
    };
    for &n in a.recovery.iter().filter(|&&n| n > 0) {
        r.recovery.push((n, recovery(n)?));
    }
    print(a, &r);
    if let Some(path) = &a.plot {
        crate::output::plot(path, tutti_bench::plot::kv::svg(&r))?;
    }
    Ok(Ended::Complete)
}

fn print(a: &KvArgs, r: &KvResult) {
    if a.json {
        println!("{}", Document::new("kv", r).to_json());
        return;
    }
    let m = |v: &[Pass], f: fn(&Pass) -> f64| median(v.iter().map(f).collect());
    if r.raw.is_empty() {
        return print_recovery(r);
    }
    println!(
        "{} objects of {} KiB on {} RAM drive(s), batches of {}, median of {} passes:",
        r.objects,
        r.object_bytes >> 10,
        r.drives,
        r.batch,
        r.raw.len()
    );
    println!(
        "  raw runtime: write {:.2} GB/s, read {:.2} GB/s",
        m(&r.raw, |p| p.write_gbps),
        m(&r.raw, |p| p.read_gbps)
    );
    println!(
        "  tutti-kv:    put {:.2} GB/s ({:.1}% of raw), get {:.2} GB/s ({:.1}% of raw)",
        m(&r.store, |p| p.write_gbps),
        r.put_ratio * 100.0,
        m(&r.store, |p| p.read_gbps),
        r.get_ratio * 100.0
    );
    print_recovery(r);
}

fn print_recovery(r: &KvResult) {
    for (n, s) in &r.recovery {
        println!("  recovery of {n} objects: {:.3} s ({:.3} s per million)", s, s * 1e6 / *n as f64);
    }
}

fn runtime(drives: u64, drive_bytes: u64, obj: u64) -> Result<Arc<Runtime>, String> {
    let cfg = Config::builtin_striped_ram(drives as usize, drive_bytes, obj);
    Runtime::from_config(cfg).map(Arc::new).map_err(|e| tutti::error_chain(&e))
}

/// A host buffer of `len` bytes with a fixed pattern.
fn buffer(len: usize) -> Vec<u64> {
    (0..len / 8).map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x7175_7474).collect()
}

/// Raw writes then reads of every slot (but the first, as the store's
/// metadata takes at least one), `batch` per submit, `depth` in flight;
/// (GB/s, objects).
fn raw_pass(a: &KvArgs, obj: u64) -> Result<(Pass, u64), String> {
    let rt = runtime(a.drives, a.drive_mib << 20, obj)?;
    let slots = rt.store_info("kv").and_then(|s| s.slots).ok_or("no slots")?;
    let depth = a.depth as usize;
    let mut buf = buffer(depth * a.batch * obj as usize);
    // SAFETY: `buf` outlives the registration (unregistered below) and is
    // only touched between waits.
    #[allow(unsafe_code)]
    let mem =
        unsafe { rt.register_memory(buf.as_mut_ptr().cast(), buf.len() * 8) }.map_err(|e| e.to_string())?;
    let targets: Vec<tutti::TargetHandle> = (1..slots)
        .map(|s| rt.open(&format!("tutti://kv/{s}")))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut gbps = [0.0; 2];
    for (i, write) in [true, false].into_iter().enumerate() {
        let batches: Vec<&[tutti::TargetHandle]> = targets.chunks(a.batch).collect();
        let secs = pipelined(
            &batches,
            depth,
            |k, chunk| {
                let base = (k % depth * a.batch) as u64 * obj;
                let reqs: Vec<Request> = chunk
                    .iter()
                    .enumerate()
                    .map(|(j, &t)| raw_request(write, t, obj, mem, base + j as u64 * obj))
                    .collect();
                rt.submit(&reqs).op().ok_or_else(|| "refused".to_owned())
            },
            |op| raw_wait(&rt, op),
        )?;
        gbps[i] = targets.len() as f64 * obj as f64 / secs / 1e9;
    }
    rt.unregister_memory(mem).map_err(|e| e.to_string())?;
    Ok((Pass { write_gbps: gbps[0], read_gbps: gbps[1] }, targets.len() as u64))
}

/// Runs `start` on each batch (with its index) keeping at most `depth`
/// started and not finished, finishing the oldest first; seconds taken.
fn pipelined<B: Copy, P>(
    batches: &[B],
    depth: usize,
    mut start: impl FnMut(usize, B) -> Result<P, String>,
    mut finish: impl FnMut(P) -> Result<(), String>,
) -> Result<f64, String> {
    let t0 = Instant::now();
    let mut in_flight = VecDeque::new();
    for (k, &b) in batches.iter().enumerate() {
        if in_flight.len() == depth.max(1) {
            finish(in_flight.pop_front().ok_or("empty")?)?;
        }
        in_flight.push_back(start(k, b)?);
    }
    for p in in_flight {
        finish(p)?;
    }
    Ok(t0.elapsed().as_secs_f64())
}

fn raw_wait(rt: &Runtime, op: tutti::OpHandle) -> Result<(), String> {
    let st = rt.wait(op, T).map_err(|e| e.to_string())?;
    if !st.iter().all(|s| s.is_success()) {
        return Err(format!("raw I/O failed: {st:?}"));
    }
    Ok(())
}

fn raw_request(write: bool, t: tutti::TargetHandle, obj: u64, mem: MemoryHandle, at: u64) -> Request {
    if write {
        Request::write(t, 0, obj, mem, at)
    } else {
        Request::read(t, 0, obj, mem, at)
    }
}

fn key(i: u64) -> Key {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&i.to_le_bytes());
    Key::new(&b).unwrap_or_else(|_| unreachable!("32 bytes"))
}

/// Puts then gets of as many objects as the store holds, `batch` per
/// call, `depth` calls in flight (later batches' payloads move while
/// earlier ones commit or are verified).
fn store_pass(a: &KvArgs, obj: u64) -> Result<Pass, String> {
    let rt = runtime(a.drives, a.drive_mib << 20, obj)?;
    let kv = KvStore::open(rt, &OpenOptions::new("kv")).map_err(|e| e.to_string())?;
    let n = kv.stats().capacity;
    let depth = a.depth as usize;
    let mut buf = buffer(depth * a.batch * obj as usize);
    // SAFETY: as in `raw_pass`.
    #[allow(unsafe_code)]
    let mem =
        unsafe { kv.register_host(buf.as_mut_ptr().cast(), buf.len() * 8) }.map_err(|e| e.to_string())?;
    let ids: Vec<u64> = (0..n).collect();
    let v =
        |k: usize, j: usize| Value { memory: &mem, offset: (k % depth * a.batch + j) as u64 * obj, len: obj };
    let all_ok = |st: Vec<tutti_kv::ItemStatus>| match st.iter().all(|s| s.is_ok()) {
        true => Ok(()),
        false => Err(format!("store I/O failed: {st:?}")),
    };
    let gbps = |secs: f64| n as f64 * obj as f64 / secs / 1e9;
    let batches: Vec<&[u64]> = ids.chunks(a.batch).collect();
    let secs = pipelined(
        &batches,
        depth,
        |k, chunk| {
            let puts: Vec<Put> =
                chunk.iter().enumerate().map(|(j, &i)| Put { key: key(i), value: v(k, j) }).collect();
            kv.put(&puts).map_err(|e| e.to_string())
        },
        |p| all_ok(kv.wait_put(p, T).map_err(|e| e.to_string())?),
    )?;
    let write_gbps = gbps(secs);
    let secs = pipelined(
        &batches,
        depth,
        |k, chunk| {
            let gets: Vec<Get> =
                chunk.iter().enumerate().map(|(j, &i)| Get { key: key(i), into: v(k, j) }).collect();
            kv.get(&gets).map_err(|e| e.to_string())
        },
        |p| all_ok(kv.wait_get(p, T).map_err(|e| e.to_string())?),
    )?;
    let read_gbps = gbps(secs);
    kv.unregister(mem).map_err(|e| e.to_string())?;
    Ok(Pass { write_gbps, read_gbps })
}

/// Seconds to reopen a store holding `n` objects of 4 KiB.
fn recovery(n: u64) -> Result<f64, String> {
    const OBJ: u64 = 4096;
    // Room for n objects, their records and the superblock, over 4 drives.
    let per_drive = ((n * (OBJ + 64) + (8 << 20)) / 4).next_multiple_of(1 << 20);
    let rt = runtime(4, per_drive, OBJ)?;
    let kv = KvStore::open(rt.clone(), &OpenOptions::new("kv")).map_err(|e| e.to_string())?;
    if kv.stats().capacity < n {
        return Err(format!("store holds {} objects, not {n}", kv.stats().capacity));
    }
    const BATCH: usize = 4096;
    let mut buf = buffer(BATCH * OBJ as usize);
    // SAFETY: as in `raw_pass`.
    #[allow(unsafe_code)]
    let mem =
        unsafe { kv.register_host(buf.as_mut_ptr().cast(), buf.len() * 8) }.map_err(|e| e.to_string())?;
    let ids: Vec<u64> = (0..n).collect();
    for chunk in ids.chunks(BATCH) {
        let puts: Vec<Put> = chunk
            .iter()
            .enumerate()
            .map(|(j, &i)| Put {
                key: key(i),
                value: Value { memory: &mem, offset: j as u64 * OBJ, len: OBJ },
            })
            .collect();
        let st = kv.put_sync(&puts, T).map_err(|e| e.to_string())?;
        if !st.iter().all(|s| s.is_ok()) {
            return Err("put failed while filling the store".into());
        }
    }
    kv.unregister(mem).map_err(|e| e.to_string())?;
    drop(kv);
    let t0 = Instant::now();
    let kv = KvStore::open(rt, &OpenOptions::new("kv")).map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    tracing::info!(open_s = secs, scan_s = kv.stats().recovery_ns as f64 / 1e9, "reopened");
    if kv.stats().objects != n {
        return Err(format!("recovered {} objects, not {n}", kv.stats().objects));
    }
    Ok(secs)
}
