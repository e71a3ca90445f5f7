//! `tutti-bench stripe` and `tutti-bench gpu-rate`: driver benchmarks whose
//! numbers go into docs/benchmarks.md (`rate` is in `rate.rs`).
//!
//! Each checks its [`Stop`] between batches: once a signal asked to stop,
//! it issues nothing new, lets what is in flight complete (bounded), shuts
//! its queues and controllers down, and ends [`Ended::Interrupted`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use nvm_queue::{Controller, ControllerOptions, DmaBuffer, NvmeDevice};
use nvme_emu::{BackingSpec, Emulator, EmulatorConfig, NamespaceSpec};
use serde::Serialize;
use tutti::config::{DriveConfig, TimingConfig};
use tutti::{error_chain, Config, Request, Runtime};

use crate::interrupt::{shutdown_summary, Ended, Signal, Stop};

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds in 0.1..=600")),
    }
}

fn err(e: impl std::error::Error) -> String {
    error_chain(&e)
}

/// Options of `stripe`.
#[derive(Debug, Args)]
pub struct StripeArgs {
    /// Per-drive media bandwidth of the timing model, MB/s.
    #[arg(long, default_value_t = 500)]
    pub drive_mb_s: u64,
    /// Per-command latency of the timing model, microseconds.
    #[arg(long, default_value_t = 80)]
    pub latency_us: u64,
    /// Request size, KiB (one slot of the store), 4..=65536, a multiple of 4.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(4..=65536))]
    pub request_kib: u64,
    /// Requests per batch, 1..=1024; two batches are kept in flight.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub batch: u64,
    /// Seconds of reads per drive count (0.1..=600).
    #[arg(long, default_value_t = 2.0, value_parser = seconds)]
    pub seconds: f64,
    /// Largest drive count to measure (1..=4).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=4))]
    pub max_drives: u64,
    /// Emulated drives keep data in RAM (`ram`, the default: every byte is
    /// really copied) or move none (`null`: timing model only).
    #[arg(long, default_value = "ram", value_parser = ["ram", "null"])]
    pub backing: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct StripePoint {
    drives: usize,
    bytes: u64,
    seconds: f64,
    gb_s: f64,
    speedup_vs_one: f64,
}

/// Reads `batch` requests of `request_kib` at a time through the runtime,
/// over 1..=max_drives RAM-backed emulated drives (striped, 128 KiB unit;
/// local_nvme for one drive) with the timing model on.
pub fn stripe(a: &StripeArgs, stop: &Stop) -> Result<Ended, String> {
    let req = a.request_kib << 10;
    if req == 0 || !req.is_multiple_of(4096) {
        return Err("--request-kib must be a non-zero multiple of 4".into());
    }
    let mut points: Vec<StripePoint> = Vec::new();
    for n in 1..=a.max_drives as usize {
        let run = stripe_run(a, n, req, stop)?;
        if let Some((signal, report)) = run.interrupted {
            let detail = format!("during the {n}-drive run; {}", shutdown_summary(&report));
            return Ok(Ended::Interrupted { signal, detail });
        }
        let gb_s = run.bytes as f64 / run.seconds / 1e9;
        let base = points.first().map_or(gb_s, |p| p.gb_s);
        points.push(StripePoint {
            drives: n,
            bytes: run.bytes,
            seconds: run.seconds,
            gb_s,
            speedup_vs_one: gb_s / base,
        });
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&points).unwrap_or_default());
    } else {
        println!(
            "striped reads, {} KiB requests, 2 batches of {} in flight, timing model {} MB/s + {} us per drive:",
            a.request_kib, a.batch, a.drive_mb_s, a.latency_us
        );
        for p in &points {
            println!("  {} drive(s): {:6.3} GB/s  ({:.2}x one drive)", p.drives, p.gb_s, p.speedup_vs_one);
        }
    }
    Ok(Ended::Complete)
}

/// One `stripe` measurement: bytes read, seconds, and the signal and
/// shutdown report if a stop request ended it early.
struct StripeRun {
    bytes: u64,
    seconds: f64,
    interrupted: Option<(Signal, tutti::ShutdownReport)>,
}

/// The runtime configuration of `stripe` over `n` drives, `req`-byte slots.
fn stripe_config(a: &StripeArgs, n: usize, req: u64) -> Config {
    let slots = a.batch;
    // Enough capacity per drive for every slot, rounded to whole units.
    let per_drive = (slots * req).div_ceil(n as u64).next_multiple_of(128 << 10) + (1 << 20);
    let mut cfg = Config::builtin_striped_ram(n, per_drive, req);
    for d in cfg.drives.values_mut() {
        let DriveConfig::Emulated(e) = d else { continue };
        e.timing =
            Some(TimingConfig { latency_us: a.latency_us, bandwidth_mb_s: Some(a.drive_mb_s), iops: None });
        e.mdts = 5;
        if a.backing == "null" {
            e.backing = tutti::config::Backing::Null;
        }
    }
    cfg
}

/// Reads for `a.seconds` (or until a stop request) over `n` drives.
fn stripe_run(a: &StripeArgs, n: usize, req: u64, stop: &Stop) -> Result<StripeRun, String> {
    let slots = a.batch;
    let rt = Runtime::from_config(stripe_config(a, n, req)).map_err(err)?;
    let targets: Vec<_> =
        (0..slots).map(|i| rt.open(&format!("tutti://kv/{i}"))).collect::<Result<_, _>>().map_err(err)?;
    // Two batches, each with its own half of the buffer, are kept in
    // flight (like fio's iodepth): while one is being waited on, the
    // other keeps every drive's queue non-empty.
    let mut buf = vec![0u64; (2 * slots * req / 8) as usize];
    // SAFETY: `buf` outlives the registration (unregistered below) and
    // is not touched while reads are in flight.
    #[allow(unsafe_code)]
    let mem = unsafe { rt.register_memory(buf.as_mut_ptr().cast(), buf.len() * 8) }.map_err(err)?;
    let batch = |half: u64| -> Vec<Request> {
        targets
            .iter()
            .enumerate()
            .map(|(i, &t)| Request::read(t, 0, req, mem, (half * slots + i as u64) * req))
            .collect()
    };
    let reqs = [batch(0), batch(1)];
    let submit = |r: &[Request]| rt.submit(r).op().ok_or_else(|| "batch refused".to_string());
    let start = Instant::now();
    let mut inflight = [submit(&reqs[0])?, submit(&reqs[1])?];
    let mut bytes = 0u64;
    let mut turn = 0;
    loop {
        let st = rt.wait(inflight[turn], Duration::from_secs(60)).map_err(err)?;
        if let Some(bad) = st.iter().find(|s| !s.is_success()) {
            return Err(format!("read failed: {bad:?}"));
        }
        bytes += req * slots;
        if start.elapsed().as_secs_f64() >= a.seconds || stop.requested().is_some() {
            let other = rt.wait(inflight[1 - turn], Duration::from_secs(60)).map_err(err)?;
            if other.iter().any(|s| !s.is_success()) {
                return Err("read failed".into());
            }
            bytes += req * slots;
            break;
        }
        inflight[turn] = submit(&reqs[turn])?;
        turn = 1 - turn;
    }
    let seconds = start.elapsed().as_secs_f64();
    rt.unregister_memory(mem).map_err(err)?;
    let report = rt.shutdown(Duration::from_secs(5));
    drop(rt);
    drop(buf);
    Ok(StripeRun { bytes, seconds, interrupted: stop.requested().map(|s| (s, report)) })
}

/// Options of `gpu-rate`.
#[derive(Debug, Args)]
pub struct GpuRateArgs {
    /// Emulated controllers (each has one controller thread), 1..=32.
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u64).range(1..=32))]
    pub drives: u64,
    /// I/O queue pairs per controller, 1..=64 (one GPU thread block each).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub queues_per_drive: u64,
    /// Entries per queue, 2..=1024 (threads per block = entries - 1).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=1024))]
    pub queue_depth: u32,
    /// Commands in the launch.
    #[arg(long, default_value_t = 8_000_000)]
    pub commands: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct GpuRateResult {
    drives: u64,
    queues: u64,
    queue_depth: u32,
    gpu_commands: u64,
    gpu_seconds: f64,
    gpu_commands_per_second: f64,
    cpu_commands_per_second: f64,
    ratio: f64,
}

/// One kernel launch issues `commands` 4 KiB reads spread over every queue
/// of `drives` null-backed emulated controllers; then one CPU thread runs the
/// `rate` measurement on one controller, for the ratio.
pub fn gpu_rate(a: &GpuRateArgs, stop: &Stop) -> Result<Ended, String> {
    use gpu_io::abi::TuttiRequest;
    use gpu_io::{Gpu, GpuStatus};
    let gpu = Gpu::open(0).map_err(err)?;
    let GpuSetup { drives, queues, regions } = gpu_setup(&gpu, a)?;
    let nq = queues.len() as u64;
    let reqs: Vec<TuttiRequest> = (0..a.commands)
        .map(|k| TuttiRequest {
            opcode: nvme_regs::opcode::nvm_opcode::READ,
            queue: (k % nq) as u16,
            nsid: 1,
            slba: (k / nq) % (1 << 20),
            nlb: 0,
            len: 4096,
            mem_offset: 0,
            ..Default::default()
        })
        .collect();
    let batch: Vec<_> = queues.iter().zip(&regions).collect();
    // Warm-up launch (module JIT, first-touch of mappings).
    let warm: Vec<_> = reqs.iter().take(nq as usize * 4).copied().collect();
    gpu.run(&batch, &warm, a.queue_depth - 1, Duration::from_secs(10)).map_err(err)?;
    let start = Instant::now();
    let st = gpu.run(&batch, &reqs, a.queue_depth - 1, Duration::from_secs(10)).map_err(err)?;
    let secs = start.elapsed().as_secs_f64();
    let bad = st.iter().filter(|s| **s != GpuStatus::Success).count();
    if bad > 0 {
        return Err(format!(
            "{bad} GPU commands failed, e.g. {:?}",
            st.iter().find(|s| **s != GpuStatus::Success)
        ));
    }
    drop(batch);
    drop(queues);
    drop(regions);
    drop(drives);
    // A stop request during the launch ends the CPU run at once.
    let cpu = match crate::rate::queue_pair_rate(5_000_000, 1024, 64, stop)? {
        Ok(cpu) => cpu,
        Err(ended) => return Ok(ended),
    };
    let r = GpuRateResult {
        drives: a.drives,
        queues: nq,
        queue_depth: a.queue_depth,
        gpu_commands: a.commands,
        gpu_seconds: secs,
        gpu_commands_per_second: a.commands as f64 / secs,
        cpu_commands_per_second: cpu,
        ratio: a.commands as f64 / secs / cpu,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else {
        println!(
            "GPU: {} commands in {:.3} s = {:.2} M commands/s ({} controllers x {} queues of {}, one launch)",
            r.gpu_commands,
            r.gpu_seconds,
            r.gpu_commands_per_second / 1e6,
            r.drives,
            a.queues_per_drive,
            r.queue_depth
        );
        println!(
            "CPU: one thread, one queue pair: {:.2} M commands/s; GPU/CPU = {:.2}",
            r.cpu_commands_per_second / 1e6,
            r.ratio
        );
    }
    Ok(Ended::Complete)
}

/// `gpu-rate`'s emulated controllers (with their GPU mappings and a 4 KiB
/// buffer each) and, for every I/O queue pair of theirs, a GPU queue and a
/// GPU view of that buffer.
struct GpuSetup {
    drives: Vec<(Controller, gpu_io::GpuDrive, DmaBuffer)>,
    queues: Vec<gpu_io::GpuQueue>,
    regions: Vec<gpu_io::GpuRegion>,
}

/// Starts `a.drives` null-backed emulated controllers with
/// `a.queues_per_drive` queue pairs of `a.queue_depth` each, mapped for `gpu`.
fn gpu_setup(gpu: &gpu_io::Gpu, a: &GpuRateArgs) -> Result<GpuSetup, String> {
    use gpu_io::{GpuDrive, GpuQueue, GpuRegion};
    let mut set = GpuSetup { drives: Vec::new(), queues: Vec::new(), regions: Vec::new() };
    for i in 0..a.drives {
        let mut cfg = EmulatorConfig::new(format!("gpu{i}"), vec![NamespaceSpec::new(1 << 20, 4096)]);
        cfg.backing = BackingSpec::Null;
        cfg.io_queues = a.queues_per_drive as u16;
        let dev: Arc<dyn NvmeDevice> = Emulator::start(cfg).map_err(err)?;
        let mut ctrl = Controller::init(
            dev.clone(),
            ControllerOptions { io_queues: a.queues_per_drive as u16, ..Default::default() },
        )
        .map_err(err)?;
        let gd = GpuDrive::map(gpu, dev.clone()).map_err(err)?;
        let buf = DmaBuffer::new(&dev, 4096).map_err(err)?;
        for q in 1..=a.queues_per_drive as u16 {
            let qp = ctrl.create_io_queue_pair(q, a.queue_depth, (a.queue_depth - 1) as u16).map_err(err)?;
            set.queues.push(GpuQueue::new(gpu, &gd, qp).map_err(err)?);
            set.regions.push(GpuRegion::new(gpu, buf.mapping(), 4096).map_err(err)?);
        }
        set.drives.push((ctrl, gd, buf));
    }
    Ok(set)
}
