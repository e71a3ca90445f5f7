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
    fill_block, preset, read_trace, synthetic_trace, verify_block, BlockCache, LatencyRecorder,
    ModelGeometry, Summary, TraceRequest, PRESETS,
};

use crate::interrupt::{shutdown_summary, Ended, Signal, Stop};
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
    /// `len` bytes of host memory, or with `gpu` of memory on GPU 0.
    fn new(gpu: bool, len: usize) -> Result<Self, String> {
        Ok(if gpu {
            let gpu = gpu_io::Gpu::open(0).map_err(err)?;
            let buf = gpu_io::GpuBuffer::zeroed(&gpu, len).map_err(err)?;
            Staging::Gpu { buf, mirror: vec![0u8; len], _gpu: gpu }
        } else {
            Staging::Host(vec![0u64; len / 8])
        })
    }

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

/// Replays the trace of `a`; see the module docs. Checks `stop` before
/// every batch: once a signal asked to stop, no new batch is issued and the
/// runtime is shut down in order.
pub fn run(a: &ReplayArgs, stop: &Stop) -> Result<Ended, String> {
    if a.list_models {
        list_models();
        return Ok(Ended::Complete);
    }
    let (model, block_bytes) = geometry(a)?;
    let trace = load_trace(a)?;
    let config = runtime_config(a, block_bytes)?;
    // Declared before the runtime, so dropped after it: on an early return
    // the runtime shuts down (and its drives stop writing) first.
    let mut staging: Staging;
    let rt = Runtime::from_config(config).map_err(err)?;
    let store = open_store(&rt, &a.store, block_bytes)?;
    let staging_len = BATCH_BLOCKS * block_bytes as usize;
    staging = Staging::new(a.gpu, staging_len)?;
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
    let summary = Summary {
        model: model.name.to_owned(),
        block_tokens: a.block_tokens,
        block_bytes,
        drives: store.drives.clone(),
        execution: if a.gpu { "gpu".into() } else { "cpu".into() },
        ..Summary::default()
    };
    let mut replay = Replay {
        rt: &rt,
        mem,
        targets: &store.targets,
        staging: &mut staging,
        block_bytes,
        cache: BlockCache::new(store.slots),
        latency: LatencyRecorder::new(),
        s: summary,
        loads: Vec::new(),
        saves: Vec::new(),
    };
    tracing::info!(requests = trace.len(), drives = ?store.drives, "replay started");
    let bar = progress_bar(a.json, trace.len());
    let start = Instant::now();
    let mut stopped = None;
    for req in &trace {
        stopped = replay.request(req, stop)?;
        if stopped.is_some() {
            break;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let s = replay.finish(start.elapsed());
    rt.unregister_memory(mem).map_err(err)?;
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

/// The requests to replay: from `--trace`, else the synthetic trace; never
/// empty.
fn load_trace(a: &ReplayArgs) -> Result<Vec<TraceRequest>, String> {
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
    Ok(trace)
}

/// The runtime configuration: `--config`, else the built-in striped RAM
/// drives; with `--gpu`, every local datapath executes on the GPU. Its
/// store `--store` must exist.
fn runtime_config(a: &ReplayArgs, block_bytes: u64) -> Result<Config, String> {
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
    Ok(config)
}

/// The store's slots, opened, and its drives.
struct Store {
    /// Target of slot `i` at index `i`.
    targets: Vec<TargetHandle>,
    slots: u32,
    drives: Vec<String>,
}

/// Opens every slot of slab store `name`, whose slots must hold a block.
fn open_store(rt: &Runtime, name: &str, block_bytes: u64) -> Result<Store, String> {
    let info = rt.store_info(name).ok_or_else(|| format!("no store named {name:?}"))?;
    let slot_size = info.slot_size.ok_or("the store's resolver is not a slab")?;
    if slot_size < block_bytes {
        return Err(format!("slot size {slot_size} is smaller than a block ({block_bytes} bytes)"));
    }
    let slots = info.slots.unwrap_or(0).min(u64::from(u32::MAX)) as u32;
    if slots == 0 {
        return Err("the store has no slots".into());
    }
    let uris: Vec<String> = (0..slots).map(|i| format!("tutti://{name}/{i}")).collect();
    let uri_refs: Vec<&str> = uris.iter().map(String::as_str).collect();
    let targets: Vec<TargetHandle> =
        rt.open_batch(&uri_refs).into_iter().collect::<Result<_, _>>().map_err(err)?;
    Ok(Store { targets, slots, drives: info.drives })
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
        println!("{}", s.to_json());
    } else {
        print!("{}", s.render_text());
    }
    if s.blocks_verified != s.blocks_loaded {
        return Err(format!("{} of {} loaded blocks verified", s.blocks_verified, s.blocks_loaded));
    }
    Ok(Ended::Complete)
}

/// A block of a request: (hash id, slot, slot version).
type Block = (u64, u32, u64);

/// The replay between requests: the runtime side, the block cache and the
/// numbers so far.
struct Replay<'a> {
    rt: &'a Runtime,
    mem: MemoryHandle,
    targets: &'a [TargetHandle],
    staging: &'a mut Staging,
    block_bytes: u64,
    cache: BlockCache,
    latency: LatencyRecorder,
    s: Summary,
    /// The current request's blocks to load and to save.
    loads: Vec<Block>,
    saves: Vec<Block>,
}

impl Replay<'_> {
    /// Replays one request: its loads first (the prefix a serving engine
    /// would fetch), then its saves. Returns the signal when a stop request
    /// cut it short before one of its batches (it is then not counted).
    fn request(&mut self, req: &TraceRequest, stop: &Stop) -> Result<Option<Signal>, String> {
        self.plan(req);
        let t0 = Instant::now();
        if let Some(signal) = self.load(stop)? {
            return Ok(Some(signal));
        }
        if !self.loads.is_empty() {
            let d = t0.elapsed();
            self.latency.record(d);
            self.s.load_seconds += d.as_secs_f64();
            self.s.blocks_loaded += self.loads.len() as u64;
            self.s.bytes_loaded += self.loads.len() as u64 * self.block_bytes;
        }
        if let Some(signal) = self.save(stop)? {
            return Ok(Some(signal));
        }
        self.s.blocks_saved += self.saves.len() as u64;
        self.s.bytes_saved += self.saves.len() as u64 * self.block_bytes;
        self.s.requests += 1;
        Ok(None)
    }

    /// Sorts the request's blocks into loads (cached) and saves (new,
    /// inserted into the cache, which may evict).
    fn plan(&mut self, req: &TraceRequest) {
        self.cache.begin_request();
        self.loads.clear();
        self.saves.clear();
        for &h in &req.hash_ids {
            // A hash id repeated within one request is the same block: it is
            // saved (or loaded) once.
            if self.loads.iter().chain(&self.saves).any(|&(x, _, _)| x == h) {
                continue;
            }
            if let Some(slot) = self.cache.lookup(h) {
                self.loads.push((h, slot.index, slot.version));
            } else {
                match self.cache.insert(h) {
                    Ok(ins) => self.saves.push((h, ins.slot.index, ins.slot.version)),
                    Err(_) => self.s.blocks_uncacheable += 1,
                }
            }
        }
    }

    /// Reads the loads batch by batch and verifies every byte.
    fn load(&mut self, stop: &Stop) -> Result<Option<Signal>, String> {
        let bb = self.block_bytes as usize;
        for chunk in self.loads.chunks(BATCH_BLOCKS) {
            if let Some(signal) = stop.requested() {
                return Ok(Some(signal));
            }
            // Poison the staging area first, so that a read that moves no
            // data (or not all of it) cannot pass verification with bytes
            // left over from an earlier save.
            self.staging.poison(chunk.len() * bb)?;
            run_batch(self.rt, self.mem, self.targets, chunk, self.block_bytes, false)?;
            for (i, &(h, _, v)) in chunk.iter().enumerate() {
                self.staging.verify(i * bb, bb, h, v).map_err(|m| {
                    format!(
                        "block {h} (slot version {v}) loaded wrong data: byte {} is {:#04x}, expected {:#04x}",
                        m.offset, m.actual, m.expected
                    )
                })?;
                self.s.blocks_verified += 1;
            }
        }
        Ok(None)
    }

    /// Writes the saves batch by batch, each block filled with its pattern.
    fn save(&mut self, stop: &Stop) -> Result<Option<Signal>, String> {
        let bb = self.block_bytes as usize;
        for chunk in self.saves.chunks(BATCH_BLOCKS) {
            if let Some(signal) = stop.requested() {
                return Ok(Some(signal));
            }
            for (i, &(h, _, v)) in chunk.iter().enumerate() {
                self.staging.fill(i * bb, bb, h, v)?;
            }
            let t = Instant::now();
            run_batch(self.rt, self.mem, self.targets, chunk, self.block_bytes, true)?;
            self.s.save_seconds += t.elapsed().as_secs_f64();
        }
        Ok(None)
    }

    /// The summary, with the run's wall time and load latencies.
    fn finish(mut self, elapsed: Duration) -> Summary {
        self.s.elapsed_seconds = elapsed.as_secs_f64();
        self.s.set_load_latency(&self.latency);
        self.s.finish();
        self.s
    }
}

/// One batch: block `i` of `blocks` at staging offset `i * block_bytes`.
fn run_batch(
    rt: &Runtime,
    mem: MemoryHandle,
    targets: &[TargetHandle],
    blocks: &[Block],
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
