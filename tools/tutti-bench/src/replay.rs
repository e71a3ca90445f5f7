//! `tutti-bench replay`: the KV-cache trace replay, through the runtime's
//! public API only.
//!
//! Per request: every block whose hash id is cached is loaded (read into a
//! staging buffer and verified against the pattern it was saved with); every
//! new block is saved (its pattern written, then the write submitted),
//! evicting the least recently used block when the store is full. Loads of a
//! request go out as one batch, saves as another.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tutti::config::{DataPathConfig, Execution};
use tutti::{error_chain, Config, MemoryHandle, Request, RequestStatus, Runtime, TargetHandle};
use tutti_bench::{
    fill_block, preset, read_trace, synthetic_trace, verify_block, BlockCache, LatencyRecorder, Summary,
    TraceRequest, PRESETS,
};

use crate::ReplayArgs;

/// Bound on one batch's wait.
const WAIT: Duration = Duration::from_secs(60);
/// Blocks per batch (bounds the staging buffer).
const BATCH_BLOCKS: usize = 64;
/// Byte written over the staging area before each load.
const POISON: u8 = 0xA5;

/// Where a batch's blocks sit between the runtime and the verifier: host
/// memory owned by the replay, or GPU memory (with a host mirror for
/// filling and checking, copied across each way).
enum Staging {
    Host(Vec<u64>),
    Gpu { buf: gpu_io::GpuBuffer, mirror: Vec<u8>, _gpu: gpu_io::Gpu },
}

impl Staging {
    fn len(&self) -> usize {
        match self {
            Staging::Host(w) => w.len() * 8,
            Staging::Gpu { buf, .. } => buf.len(),
        }
    }

    fn host_bytes(words: &mut [u64]) -> &mut [u8] {
        let n = words.len() * 8;
        let p = words.as_mut_ptr().cast::<u8>();
        // SAFETY: a u64 buffer viewed as bytes (no alignment or validity
        // requirement for u8); used only while no I/O on it is in flight.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(p, n)
        }
    }

    /// Overwrites `len` bytes at `at` with the poison byte.
    fn poison(&mut self, len: usize) -> Result<(), String> {
        match self {
            Staging::Host(w) => Self::host_bytes(w)[..len].fill(POISON),
            Staging::Gpu { buf, mirror, .. } => {
                mirror[..len].fill(POISON);
                buf.copy_in(0, &mirror[..len]).map_err(err)?;
            }
        }
        Ok(())
    }

    /// Writes block `(hash, version)`'s pattern at `at`.
    fn fill(&mut self, at: usize, len: usize, hash: u64, version: u64) -> Result<(), String> {
        match self {
            Staging::Host(w) => fill_block(&mut Self::host_bytes(w)[at..at + len], hash, version),
            Staging::Gpu { buf, mirror, .. } => {
                fill_block(&mut mirror[at..at + len], hash, version);
                buf.copy_in(at, &mirror[at..at + len]).map_err(err)?;
            }
        }
        Ok(())
    }

    /// Checks every byte of the block at `at` against its pattern.
    fn verify(
        &mut self,
        at: usize,
        len: usize,
        hash: u64,
        version: u64,
    ) -> Result<(), tutti_bench::Mismatch> {
        match self {
            Staging::Host(w) => verify_block(&Self::host_bytes(w)[at..at + len], hash, version),
            Staging::Gpu { buf, mirror, .. } => {
                // A failed copy leaves the mirror poisoned: a mismatch.
                mirror[at..at + len].fill(POISON);
                let _ = buf.copy_out(at, &mut mirror[at..at + len]);
                verify_block(&mirror[at..at + len], hash, version)
            }
        }
    }
}

fn err(e: impl std::error::Error) -> String {
    error_chain(&e)
}

pub fn run(a: &ReplayArgs) -> Result<(), String> {
    if a.list_models {
        for m in PRESETS {
            println!(
                "{:<14} {:>3} layers {:>2} KV heads x {:>3} dim: {:>4} KiB/token, {:>4} MiB per 512-token block",
                m.name,
                m.layers,
                m.kv_heads,
                m.head_dim,
                m.bytes_per_token() >> 10,
                m.block_bytes(512) >> 20
            );
        }
        return Ok(());
    }
    let model = preset(&a.model).ok_or_else(|| format!("unknown model {:?}; try --list-models", a.model))?;
    if a.block_tokens == 0 {
        return Err("--block-tokens must be at least 1".into());
    }
    let block_bytes = model.block_bytes(a.block_tokens);
    if block_bytes % 4096 != 0 {
        return Err(format!(
            "a block of {block_bytes} bytes is not a multiple of 4096; change --block-tokens"
        ));
    }
    let trace: Vec<TraceRequest> = match &a.trace {
        Some(p) => read_trace(p, a.requests).map_err(err)?,
        None => synthetic_trace(a.requests.unwrap_or(tutti_bench::synthetic::DEFAULT_REQUESTS), a.seed),
    };
    if trace.is_empty() {
        return Err(match &a.trace {
            Some(p) => format!("trace {} has no requests", p.display()),
            None => "--requests must be at least 1".into(),
        });
    }
    let mut config = match &a.config {
        Some(p) => Config::from_path(p).map_err(err)?,
        None => {
            if !(1..=4).contains(&a.drives) {
                return Err("--drives must be 1 to 4".into());
            }
            let per_drive = a
                .drive_mib
                .checked_mul(1 << 20)
                .ok_or_else(|| format!("--drive-mib {} is too large", a.drive_mib))?;
            Config::builtin_striped_ram(a.drives, per_drive, block_bytes)
        }
    };
    if a.gpu {
        for dp in config.datapaths.values_mut() {
            match dp {
                DataPathConfig::LocalNvme(l) => l.execution = Execution::Gpu,
                DataPathConfig::StripedLocalNvme(s) => s.execution = Execution::Gpu,
                _ => {}
            }
        }
    }
    if !config.stores.contains_key(&a.store) {
        let names: Vec<&String> = config.stores.keys().collect();
        return Err(if names.is_empty() {
            "the configuration defines no stores; replay needs one (see docs/config.md)".to_owned()
        } else {
            format!("no store named {:?}: the configuration has {names:?}; pick one with --store", a.store)
        });
    }
    let rt = Runtime::from_config(config).map_err(err)?;
    let info = rt.store_info(&a.store).ok_or_else(|| format!("no store named {:?}", a.store))?;
    let slot_size = info.slot_size.ok_or("the store's resolver is not a slab")?;
    if slot_size < block_bytes {
        return Err(format!("slot size {slot_size} is smaller than a block ({block_bytes} bytes)"));
    }
    let slots = info.slots.unwrap_or(0).min(u64::from(u32::MAX)) as u32;
    if slots == 0 {
        return Err("the store has no slots".into());
    }
    let uris: Vec<String> = (0..slots).map(|i| format!("tutti://{}/{i}", a.store)).collect();
    let uri_refs: Vec<&str> = uris.iter().map(String::as_str).collect();
    let targets: Vec<TargetHandle> =
        rt.open_batch(&uri_refs).into_iter().collect::<Result<_, _>>().map_err(err)?;

    let staging_len = BATCH_BLOCKS * block_bytes as usize;
    let mut staging = if a.gpu {
        let gpu = gpu_io::Gpu::open(0).map_err(err)?;
        let buf = gpu_io::GpuBuffer::zeroed(&gpu, staging_len).map_err(err)?;
        Staging::Gpu { buf, mirror: vec![0u8; staging_len], _gpu: gpu }
    } else {
        Staging::Host(vec![0u64; staging_len / 8])
    };
    let mem = match &mut staging {
        // SAFETY: `staging` outlives the registration (unregistered below,
        // and the runtime is dropped before it), and its bytes are touched
        // only between a batch's wait and the next submit.
        #[allow(unsafe_code)]
        Staging::Host(w) => unsafe { rt.register_memory(w.as_mut_ptr().cast(), staging_len) },
        // SAFETY: as above, for the GPU allocation.
        #[allow(unsafe_code)]
        Staging::Gpu { buf, .. } => unsafe { rt.register_gpu_memory(buf.device_ptr(), staging_len) },
    }
    .map_err(err)?;
    debug_assert_eq!(staging.len(), staging_len);
    let bar = if a.json { ProgressBar::hidden() } else { ProgressBar::new(trace.len() as u64) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} requests {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut cache = BlockCache::new(slots);
    let mut latency = LatencyRecorder::new();
    let mut s = Summary {
        model: model.name.to_owned(),
        block_tokens: a.block_tokens,
        block_bytes,
        drives: info.drives.clone(),
        execution: if a.gpu { "gpu".into() } else { "cpu".into() },
        ..Summary::default()
    };
    let start = Instant::now();
    let mut loads: Vec<(u64, u32, u64)> = Vec::new();
    let mut saves: Vec<(u64, u32, u64)> = Vec::new();
    for req in &trace {
        cache.begin_request();
        loads.clear();
        saves.clear();
        for &h in &req.hash_ids {
            // A hash id repeated within one request is the same block: it is
            // saved (or loaded) once.
            if loads.iter().chain(&saves).any(|&(x, _, _)| x == h) {
                continue;
            }
            if let Some(slot) = cache.lookup(h) {
                loads.push((h, slot.index, slot.version));
            } else {
                match cache.insert(h) {
                    Ok(ins) => saves.push((h, ins.slot.index, ins.slot.version)),
                    Err(_) => s.blocks_uncacheable += 1,
                }
            }
        }
        // Loads first (the prefix a serving engine would fetch), then saves.
        let t0 = Instant::now();
        for chunk in loads.chunks(BATCH_BLOCKS) {
            // Poison the staging area first, so that a read that moves no
            // data (or not all of it) cannot pass verification with bytes
            // left over from an earlier save.
            staging.poison(chunk.len() * block_bytes as usize)?;
            run_batch(&rt, mem, &targets, chunk, block_bytes, false)?;
            for (i, &(h, _, v)) in chunk.iter().enumerate() {
                let b = i * block_bytes as usize;
                staging
                    .verify(b, block_bytes as usize, h, v)
                    .map_err(|m| {
                        format!(
                            "block {h} (slot version {v}) loaded wrong data: byte {} is {:#04x}, expected {:#04x}",
                            m.offset, m.actual, m.expected
                        )
                    })?;
                s.blocks_verified += 1;
            }
        }
        if !loads.is_empty() {
            let d = t0.elapsed();
            latency.record(d);
            s.load_seconds += d.as_secs_f64();
            s.blocks_loaded += loads.len() as u64;
            s.bytes_loaded += loads.len() as u64 * block_bytes;
        }
        for chunk in saves.chunks(BATCH_BLOCKS) {
            for (i, &(h, _, v)) in chunk.iter().enumerate() {
                let b = i * block_bytes as usize;
                staging.fill(b, block_bytes as usize, h, v)?;
            }
            let t = Instant::now();
            run_batch(&rt, mem, &targets, chunk, block_bytes, true)?;
            s.save_seconds += t.elapsed().as_secs_f64();
        }
        s.blocks_saved += saves.len() as u64;
        s.bytes_saved += saves.len() as u64 * block_bytes;
        s.requests += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    s.elapsed_seconds = start.elapsed().as_secs_f64();
    s.set_load_latency(&latency);
    s.finish();
    rt.unregister_memory(mem).map_err(err)?;
    let report = rt.shutdown(Duration::from_secs(5));
    for (drive, r) in &report.drives {
        if let Err(e) = r {
            eprintln!("warning: drive {drive} shutdown: {e}");
        }
    }
    drop(rt);
    if a.json {
        println!("{}", s.to_json());
    } else {
        print!("{}", s.render_text());
    }
    if s.blocks_verified != s.blocks_loaded {
        return Err(format!("{} of {} loaded blocks verified", s.blocks_verified, s.blocks_loaded));
    }
    Ok(())
}

/// One batch: block `i` of `blocks` at staging offset `i * block_bytes`.
fn run_batch(
    rt: &Runtime,
    mem: MemoryHandle,
    targets: &[TargetHandle],
    blocks: &[(u64, u32, u64)],
    block_bytes: u64,
    write: bool,
) -> Result<(), String> {
    let reqs: Vec<Request> = blocks
        .iter()
        .enumerate()
        .map(|(i, &(_, slot, _))| {
            let t = targets[slot as usize];
            let off = i as u64 * block_bytes;
            if write {
                Request::write(t, 0, block_bytes, mem, off)
            } else {
                Request::read(t, 0, block_bytes, mem, off)
            }
        })
        .collect();
    let sub = rt.submit(&reqs);
    if let Some((i, Err(e))) = sub.states().iter().enumerate().find(|(_, s)| s.is_err()) {
        return Err(format!("request {i} of a batch was not accepted: {e}"));
    }
    let op = sub.op().ok_or("no request accepted")?;
    let statuses = rt.wait(op, WAIT).map_err(err)?;
    if let Some((i, st)) = statuses.iter().enumerate().find(|(_, s)| !s.is_success()) {
        let what = if write { "save" } else { "load" };
        let block = blocks[i].0;
        return Err(match st {
            RequestStatus::Nvme { drive, status } => {
                format!("{what} of block {block} failed on {drive}: {status}")
            }
            other => format!("{what} of block {block} failed: {other:?}"),
        });
    }
    Ok(())
}
