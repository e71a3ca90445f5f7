//! `tutti-bench gpu-rate`: a driver benchmark whose numbers go into
//! docs/benchmarks.md (`rate` is in `rate.rs`, `stripe` in `stripe.rs`).
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
use tutti::error_chain;
use tutti_bench::schema::GpuRateResult;

use crate::interrupt::{Ended, Stop};

pub(crate) fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds in 0.1..=600")),
    }
}

fn err(e: impl std::error::Error) -> String {
    error_chain(&e)
}

/// Which device plays the controllers' I/O side in `gpu-rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateController {
    /// The emulator's controller threads (one CPU thread per controller).
    Emulator,
    /// Null controllers played by GPU warps, one per queue
    /// (`kernels/tutti_null.cu`): no CPU in the device's path, so the
    /// submitter's own rate shows.
    GpuNull,
}

impl RateController {
    /// The name `--controller` takes and the JSON carries.
    pub fn name(self) -> &'static str {
        match self {
            Self::Emulator => "emulator",
            Self::GpuNull => "gpu-null",
        }
    }
}

/// Where `gpu-rate`'s SQs, CQs and doorbells live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateRings {
    /// Host memory mapped into the GPU: the emulated controllers' rings
    /// and register pages, every poll a PCIe round trip.
    Host,
    /// GPU memory (`GpuQueue::with_device_rings`, BaM's layout): only
    /// with `--controller gpu-null`, which serves them from the GPU.
    Device,
}

impl RateRings {
    /// The name `--rings` takes and the JSON carries.
    pub fn name(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Device => "device",
        }
    }
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
    /// Who serves the I/O queues: the emulator's controller threads, or
    /// null controllers on the GPU (the controllers' admin side stays the
    /// emulator's either way).
    #[arg(long, value_enum, default_value = "emulator")]
    pub controller: RateController,
    /// Where the SQs, CQs and doorbells live: host memory (the emulated
    /// controllers' own), or GPU memory (needs `--controller gpu-null`).
    #[arg(long, value_enum, default_value = "host")]
    pub rings: RateRings,
    /// Skip the bare ring probe (run by default first, on the same queues).
    #[arg(long)]
    pub no_probe: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write an SVG chart of the run to this file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
}

/// The GPU part of `gpu-rate`: rates of the probe and the protocol run.
struct GpuRun {
    /// The protocol launch: kernel GPU time, whole launch on the host.
    secs: Timed,
    /// The probe's entries per second, by kernel time and by whole launch.
    probe: Option<(f64, f64)>,
    probe_skipped: Option<String>,
    cq_full: u64,
    null_served: Option<u64>,
}

/// One kernel launch issues `commands` 4 KiB reads spread over every queue
/// of `drives` null-backed emulated controllers (their I/O side played by
/// their threads or by GPU null controllers); then one CPU thread runs the
/// `rate` measurement on one controller, for the ratio.
pub fn gpu_rate(a: &GpuRateArgs, stop: &Stop) -> Result<Ended, String> {
    if a.rings == RateRings::Device && a.controller != RateController::GpuNull {
        return Err(
            "--rings device needs --controller gpu-null: the emulator's threads cannot reach GPU memory"
                .into(),
        );
    }
    let gpu = gpu_io::Gpu::open(0).map_err(err)?;
    let run = {
        let set = gpu_setup(&gpu, a)?;
        gpu_runs(&gpu, &set, a)?
    };
    // A stop request during the launch ends the CPU run at once.
    let cpu = match crate::rate::queue_pair_rate(5_000_000, 1024, 64, stop)? {
        Ok(cpu) => cpu,
        Err(ended) => return Ok(ended),
    };
    let r = GpuRateResult {
        drives: a.drives,
        queues: a.drives * a.queues_per_drive,
        queue_depth: a.queue_depth,
        controller: a.controller.name().to_owned(),
        rings: a.rings.name().to_owned(),
        gpu_commands: a.commands,
        gpu_kernel_seconds: run.secs.kernel,
        gpu_commands_per_second: a.commands as f64 / run.secs.kernel,
        gpu_launch_seconds: run.secs.launch,
        gpu_launch_commands_per_second: a.commands as f64 / run.secs.launch,
        probe_entries_per_second: run.probe.map(|p| p.0),
        probe_launch_entries_per_second: run.probe.map(|p| p.1),
        probe_skipped: run.probe_skipped,
        cq_full_stalls: run.cq_full,
        null_served: run.null_served,
        cpu_commands_per_second: cpu,
        ratio: a.commands as f64 / run.secs.kernel / cpu,
    };
    if let Some(path) = &a.plot {
        crate::output::plot(path, tutti_bench::plot::gpu_rate::svg(&r))?;
    }
    if a.json {
        println!("{}", tutti_bench::schema::Document::new("gpu-rate", &r).to_json());
    } else {
        print_rate(&r, a);
    }
    Ok(Ended::Complete)
}

/// The warm-up launch, the bare ring probe and the timed protocol launch
/// over `set`'s queues, with GPU null controllers serving them for
/// `--controller gpu-null` (started first, stopped last).
fn gpu_runs(gpu: &gpu_io::Gpu, set: &GpuSetup, a: &GpuRateArgs) -> Result<GpuRun, String> {
    use gpu_io::GpuStatus;
    let nq = set.queues.len() as u64;
    let reqs = rate_requests(a.commands, nq);
    let batch: Vec<_> = set.queues.iter().zip(&set.regions).collect();
    let null = match a.controller {
        RateController::GpuNull => {
            let refs: Vec<&gpu_io::GpuQueue> = set.queues.iter().collect();
            Some(gpu.start_null_controllers(&refs, RATE_NS_BLOCKS).map_err(err)?)
        }
        RateController::Emulator => None,
    };
    // Warm-up launch (module JIT, first-touch of mappings).
    let warm: Vec<_> = reqs.iter().take(nq as usize * 4).copied().collect();
    gpu.run(&batch, &warm, a.queue_depth - 1, Duration::from_secs(10)).map_err(err)?;
    let (probe, probe_skipped) = if a.no_probe {
        (None, Some("--no-probe".to_string()))
    } else {
        match ring_probe(gpu, &batch, &reqs, a.queue_depth - 1)? {
            Ok(rate) => (Some(rate), None),
            Err(why) => (None, Some(why)),
        }
    };
    let stalls = || set.drives.iter().map(|d| d.emu.stats().cq_full_stalls).sum::<u64>();
    let stalls_before = stalls();
    let start = Instant::now();
    let launch = gpu.launch_timed(&batch, &reqs, a.queue_depth - 1, Duration::from_secs(10)).map_err(err)?;
    let (st, kernel) = launch.wait_timed().map_err(err)?;
    let kernel = kernel.ok_or("the CUDA driver could not time the protocol kernel")?;
    let secs = Timed { kernel: kernel.as_secs_f64(), launch: start.elapsed().as_secs_f64() };
    let mut run = GpuRun { secs, probe, probe_skipped, cq_full: stalls() - stalls_before, null_served: None };
    if let Some(null) = null {
        let reports = match null.stop() {
            Ok(r) => r,
            // Its memory, and every queue and buffer it may touch, must
            // outlive a kernel that does not end: freeing them would hang
            // behind it. Exit without running destructors.
            Err(e @ gpu_io::GpuError::NullControllerStuck) => {
                eprintln!("tutti-bench: {}; exiting without cleanup", err(e));
                std::process::exit(1);
            }
            Err(e) => return Err(err(e)),
        };
        run.null_served = Some(reports.iter().map(|r| r.served).sum());
        run.cq_full = reports.iter().map(|r| r.cq_full_polls).sum();
    }
    let bad = st.iter().filter(|s| **s != GpuStatus::Success).count();
    if bad > 0 {
        return Err(format!(
            "{bad} GPU commands failed, e.g. {:?}",
            st.iter().find(|s| **s != GpuStatus::Success)
        ));
    }
    Ok(run)
}

/// Seconds one launch took: its kernel on the GPU (CUDA events), and the
/// whole launch on the host.
#[derive(Debug, Clone, Copy)]
struct Timed {
    kernel: f64,
    launch: f64,
}

/// Logical blocks of `gpu-rate`'s namespaces (4 KiB blocks).
const RATE_NS_BLOCKS: u64 = 1 << 20;

/// `n` 4 KiB reads spread round-robin over `queues` queues.
fn rate_requests(n: u64, queues: u64) -> Vec<gpu_io::abi::TuttiRequest> {
    (0..n)
        .map(|k| gpu_io::abi::TuttiRequest {
            opcode: nvme_regs::opcode::nvm_opcode::READ,
            queue: (k % queues) as u16,
            nsid: 1,
            slba: (k / queues) % RATE_NS_BLOCKS,
            nlb: 0,
            len: 4096,
            mem_offset: 0,
            ..Default::default()
        })
        .collect()
}

fn print_rate(r: &GpuRateResult, a: &GpuRateArgs) {
    let device = match a.controller {
        RateController::Emulator => "emulator threads",
        RateController::GpuNull => "GPU null controllers",
    };
    let rings = match a.rings {
        RateRings::Host => "rings in host memory",
        RateRings::Device => "rings in GPU memory",
    };
    println!(
        "GPU: {} commands, kernel {:.4} s = {:.2} M commands/s ({} controllers x {} queues of {}, one launch; I/O served by {device}; {rings})",
        r.gpu_commands,
        r.gpu_kernel_seconds,
        r.gpu_commands_per_second / 1e6,
        r.drives,
        a.queues_per_drive,
        r.queue_depth
    );
    println!(
        "     whole launch on the host (grouping, slot, kernel, statuses): {:.4} s = {:.2} M commands/s",
        r.gpu_launch_seconds,
        r.gpu_launch_commands_per_second / 1e6
    );
    match (r.probe_entries_per_second, r.probe_launch_entries_per_second, &r.probe_skipped) {
        (Some(p), Some(pl), _) => println!(
            "bare ring probe, same queues and requests: kernel {:.2} M entries/s (whole launch {:.2}); protocol/probe = {:.2}",
            p / 1e6,
            pl / 1e6,
            r.gpu_commands_per_second / p
        ),
        (_, _, why) => println!("bare ring probe: not run ({})", why.as_deref().unwrap_or("")),
    }
    match r.null_served {
        None => println!("CQ full stalls during the GPU run: {}", r.cq_full_stalls),
        Some(n) => println!(
            "GPU null controllers: {n} commands served (warm-up, probe and protocol runs); CQ full polls: {}",
            r.cq_full_stalls
        ),
    }
    println!(
        "CPU: one thread, one queue pair: {:.2} M commands/s; GPU/CPU = {:.2}",
        r.cpu_commands_per_second / 1e6,
        r.ratio
    );
}

/// Times the bare ring probe (`Gpu::run_ring_probe`) over the batch: its
/// entries per second by kernel time and by whole launch, or why it could
/// not run (a module without the probe). A probe request that never completed is an error: the queues
/// would then be unusable for the protocol run after it.
fn ring_probe(
    gpu: &gpu_io::Gpu,
    batch: &[(&gpu_io::GpuQueue, &gpu_io::GpuRegion)],
    reqs: &[gpu_io::abi::TuttiRequest],
    threads: u32,
) -> Result<Result<(f64, f64), String>, String> {
    let start = Instant::now();
    let (st, kernel) = match gpu.run_ring_probe(batch, reqs, threads, Duration::from_secs(10)) {
        Ok(st) => st,
        Err(e @ gpu_io::GpuError::NoRingProbe) => return Ok(Err(err(e))),
        Err(e) => return Err(err(e)),
    };
    let secs = start.elapsed().as_secs_f64();
    let lost = st.iter().filter(|s| **s != gpu_io::GpuStatus::Success).count();
    if lost > 0 {
        return Err(format!("the ring probe lost {lost} completions"));
    }
    let Some(kernel) = kernel.filter(|k| !k.is_zero()) else {
        return Ok(Err("the CUDA driver could not time the probe kernel".into()));
    };
    let n = reqs.len() as f64;
    Ok(Ok((n / kernel.as_secs_f64(), n / secs)))
}

/// One emulated controller of `gpu-rate`, with its GPU mapping and buffer.
struct GpuRateDrive {
    _ctrl: Controller,
    _gpu_drive: gpu_io::GpuDrive,
    _buf: DmaBuffer,
    emu: Arc<Emulator>,
}

/// `gpu-rate`'s emulated controllers (with their GPU mappings and a 4 KiB
/// buffer each) and, for every I/O queue pair of theirs, a GPU queue and a
/// GPU view of that buffer.
struct GpuSetup {
    drives: Vec<GpuRateDrive>,
    queues: Vec<gpu_io::GpuQueue>,
    regions: Vec<gpu_io::GpuRegion>,
}

/// Starts `a.drives` null-backed emulated controllers with
/// `a.queues_per_drive` queue pairs of `a.queue_depth` each, mapped for `gpu`.
fn gpu_setup(gpu: &gpu_io::Gpu, a: &GpuRateArgs) -> Result<GpuSetup, String> {
    use gpu_io::{GpuDrive, GpuQueue, GpuRegion};
    let mut set = GpuSetup { drives: Vec::new(), queues: Vec::new(), regions: Vec::new() };
    for i in 0..a.drives {
        let mut cfg = EmulatorConfig::new(format!("gpu{i}"), vec![NamespaceSpec::new(RATE_NS_BLOCKS, 4096)]);
        cfg.backing = BackingSpec::Null;
        cfg.io_queues_detached = a.controller == RateController::GpuNull;
        cfg.io_queues = a.queues_per_drive as u16;
        let emu = Emulator::start(cfg).map_err(err)?;
        let dev: Arc<dyn NvmeDevice> = emu.clone();
        let mut ctrl = Controller::init(
            dev.clone(),
            ControllerOptions { io_queues: a.queues_per_drive as u16, ..Default::default() },
        )
        .map_err(err)?;
        let gd = GpuDrive::map(gpu, dev.clone()).map_err(err)?;
        let buf = DmaBuffer::new(&dev, 4096).map_err(err)?;
        for q in 1..=a.queues_per_drive as u16 {
            let qp = ctrl.create_io_queue_pair(q, a.queue_depth, (a.queue_depth - 1) as u16).map_err(err)?;
            let q = match a.rings {
                RateRings::Host => GpuQueue::new(gpu, &gd, qp),
                RateRings::Device => GpuQueue::with_device_rings(gpu, &gd, qp),
            };
            set.queues.push(q.map_err(err)?);
            set.regions.push(GpuRegion::new(gpu, buf.mapping(), 4096).map_err(err)?);
        }
        set.drives.push(GpuRateDrive { emu, _ctrl: ctrl, _gpu_drive: gd, _buf: buf });
    }
    Ok(set)
}
