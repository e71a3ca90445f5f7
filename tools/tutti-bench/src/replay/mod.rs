//! `tutti-bench replay`: the KV-cache trace replay, through the tutti-kv
//! block store over the runtime's public API.
//!
//! The blocks live in a tutti-kv store opened over the runtime store
//! `--store` (formatted when blank; with `--persist DIR` on file-backed
//! drives, so a later run finds them). Per request ([`request`]): the
//! store says how many of its blocks, from the first, it holds
//! (`lookup_prefix`); that prefix is loaded (`get`: the store checks each
//! payload's CRC32C; the replay then checks every byte against the
//! pattern the block was saved with, in a staging buffer poisoned before
//! each load) and the rest is saved (`put`, durable when it returns). The
//! store evicts its least recently used blocks when it is full. Loads of a
//! request go out in batches of [`request::BATCH_BLOCKS`], saves likewise.

mod config;
mod request;
mod staging;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tutti::{error_chain, Runtime};
use tutti_bench::report::Timeline;
use tutti_bench::{
    preset, read_trace, synthetic_trace, BlockKeys, ModelGeometry, Summary, TraceRequest, PRESETS,
};
use tutti_kv::{Create, KeySize, KvStore, OpenOptions};

use crate::interrupt::{shutdown_summary, Ended, Stop};
use crate::ReplayArgs;
use request::{Replay, BATCH_BLOCKS};
use staging::Staging;

fn err(e: impl std::error::Error) -> String {
    error_chain(&e)
}

/// Replays the trace of `a`; see the module docs. Checks `stop` before
/// every batch: once a signal asked to stop, no new batch is issued and the
/// runtime is shut down in order.
pub fn run(a: &ReplayArgs, stop: &Stop) -> Result<Ended, String> {
    if a.list_models {
        list_models();
        return Ok(Ended::Complete);
    }
    let (model, block_bytes) = geometry(a)?;
    let (trace, trace_name) = load_trace(a)?;
    let keys = BlockKeys::new(&model, a.block_tokens, block_bytes, &trace_name);
    let config = config::runtime_config(a, block_bytes)?;
    // Declared before the runtime, so dropped after it: on an early return
    // the runtime shuts down (and its drives stop writing) first.
    let mut staging: Staging;
    let rt = Arc::new(Runtime::from_config(config).map_err(err)?);
    let (kv, drives) = open_store(&rt, a, block_bytes)?;
    let staging_len = usize::try_from(block_bytes)
        .ok()
        .and_then(|b| b.checked_mul(BATCH_BLOCKS))
        .ok_or_else(|| format!("{BATCH_BLOCKS} blocks of {block_bytes} bytes do not fit in memory"))?;
    staging = Staging::new(a.gpu.then(|| rt.gpu()), staging_len)?;
    let mem = staging.register(&kv)?;
    let summary = Summary {
        model: model.name.to_owned(),
        block_tokens: a.block_tokens,
        block_bytes,
        drives,
        execution: if a.gpu { "gpu".into() } else { "cpu".into() },
        persist_dir: a.persist.as_ref().map(|p| p.display().to_string()),
        store_objects_at_open: kv.stats().recovered,
        ..Summary::default()
    };
    let mut replay = Replay::new(&kv, &mem, &mut staging, &keys, block_bytes, summary);
    tracing::info!(requests = trace.len(), drives = ?replay.s.drives, "replay started");
    let bar = progress_bar(a.json, trace.len());
    let start = Instant::now();
    let mut stopped = None;
    let mut timeline = Timeline::new(trace.len());
    for (i, req) in trace.iter().enumerate() {
        stopped = replay.request(req, stop)?;
        timeline.observe(&replay.s, start.elapsed().as_secs_f64(), stopped.is_some() || i + 1 == trace.len());
        if stopped.is_some() {
            break;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut s = replay.finish(start.elapsed());
    s.timeline = timeline.into_points();
    s.store_evictions = kv.stats().evictions;
    kv.unregister(mem).map_err(|e| tutti::error_chain(&e))?;
    // Evictions' record clears made durable too (puts already are).
    kv.sync().map_err(|e| tutti::error_chain(&e))?;
    drop(kv);
    let report = rt.shutdown(Duration::from_secs(5));
    if let Some(signal) = stopped {
        let done = format!("after {} of {} requests", s.requests, trace.len());
        return Ok(Ended::Interrupted { signal, detail: format!("{done}; {}", shutdown_summary(&report)) });
    }
    for (drive, r) in &report.drives {
        if let Err(e) = r {
            eprintln!("warning: drive {drive} shutdown: {e}");
        }
    }
    drop(rt);
    print_summary(a, &s)
}

/// `--list-models`: one line per preset.
fn list_models() {
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
}

/// The model preset and the bytes of one block of `--block-tokens` tokens
/// (a multiple of 4096).
fn geometry(a: &ReplayArgs) -> Result<(ModelGeometry, u64), String> {
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
    Ok((model, block_bytes))
}

/// The requests to replay (from `--trace`, else the synthetic trace; never
/// empty) and the trace's name in block keys: the file's name, or
/// `synthetic seed N`.
fn load_trace(a: &ReplayArgs) -> Result<(Vec<TraceRequest>, String), String> {
    let (trace, name) = match &a.trace {
        Some(p) => {
            let name = p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into());
            (read_trace(p, a.requests).map_err(err)?, name)
        }
        None => (
            synthetic_trace(a.requests.unwrap_or(tutti_bench::synthetic::DEFAULT_REQUESTS), a.seed),
            format!("synthetic seed {}", a.seed),
        ),
    };
    if trace.is_empty() {
        return Err(match &a.trace {
            Some(p) => format!("trace {} has no requests", p.display()),
            None => "--requests must be at least 1".into(),
        });
    }
    Ok((trace, name))
}

/// Opens the tutti-kv store over runtime store `--store` (formatting it
/// when blank or with `--format`, else refusing one of another geometry or
/// not ours), whose slots must hold a block; and the names of its drives.
fn open_store(rt: &Arc<Runtime>, a: &ReplayArgs, block_bytes: u64) -> Result<(KvStore, Vec<String>), String> {
    let name = &a.store;
    let info = rt.store_info(name).ok_or_else(|| format!("no store named {name:?}"))?;
    let slot_size = info.slot_size.ok_or("the store's resolver is not a slab")?;
    if slot_size < block_bytes {
        return Err(format!("slot size {slot_size} is smaller than a block ({block_bytes} bytes)"));
    }
    let create = if a.format { Create::Always } else { Create::IfBlank };
    let opts = OpenOptions { key_size: Some(KeySize::B32), create, ..OpenOptions::new(name) };
    let kv = KvStore::open(rt.clone(), &opts).map_err(|e| {
        let place = a.persist.as_deref().map_or_else(String::new, |d: &Path| format!(" in {}", d.display()));
        format!("cannot open the tutti-kv store{place}: {}", tutti::error_chain(&e))
    })?;
    Ok((kv, info.drives))
}

/// The progress bar on stderr (hidden with `--json`).
fn progress_bar(hidden: bool, requests: usize) -> ProgressBar {
    let bar = if hidden { ProgressBar::hidden() } else { ProgressBar::new(requests as u64) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} requests {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Prints the summary (text or `--json`); fails unless every loaded block
/// verified.
fn print_summary(a: &ReplayArgs, s: &Summary) -> Result<Ended, String> {
    if a.json {
        println!("{}", tutti_bench::schema::Document::new("replay", s).to_json());
    } else {
        print!("{}", s.render_text());
    }
    if let Some(path) = &a.plot {
        crate::output::plot(path, tutti_bench::plot::replay::svg(s))?;
    }
    if s.blocks_verified != s.blocks_loaded {
        return Err(format!("{} of {} loaded blocks verified", s.blocks_verified, s.blocks_loaded));
    }
    Ok(Ended::Complete)
}
