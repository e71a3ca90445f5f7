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

/// Page-aligned staging memory owned by the replay.
struct Staging {
    words: Vec<u64>,
}

impl Staging {
    fn bytes(&mut self) -> &mut [u8] {
        let n = self.words.len() * 8;
        let p = self.words.as_mut_ptr().cast::<u8>();
        // SAFETY: a u64 buffer viewed as bytes (no alignment or validity
        // requirement for u8); called only while no I/O on it is in flight.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(p, n)
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
    let config = match &a.config {
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

    let mut staging = Staging { words: vec![0u64; BATCH_BLOCKS * block_bytes as usize / 8] };
    let staging_len = staging.words.len() * 8;
    // SAFETY: `staging` outlives the registration (unregistered below, and
    // the runtime is dropped before it), and its bytes are touched only
    // between a batch's wait and the next submit.
    #[allow(unsafe_code)]
    let mem = unsafe { rt.register_memory(staging.words.as_mut_ptr().cast(), staging_len) }.map_err(err)?;

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
            staging.bytes()[..chunk.len() * block_bytes as usize].fill(POISON);
            run_batch(&rt, mem, &targets, chunk, block_bytes, false)?;
            for (i, &(h, _, v)) in chunk.iter().enumerate() {
                let b = i * block_bytes as usize;
                verify_block(&staging.bytes()[b..b + block_bytes as usize], h, v)
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
                fill_block(&mut staging.bytes()[b..b + block_bytes as usize], h, v);
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
