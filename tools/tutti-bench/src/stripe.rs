//! `tutti-bench stripe`: striped bandwidth over 1 to 4 emulated drives with
//! a timing model, reads or writes, from host memory with CPU execution or
//! from GPU memory with GPU execution (`--gpu`), reported against the
//! timing model's limit with the CPU time the application's own threads
//! spent per GB moved (the emulator's controller threads excluded).
//!
//! With `--daemon` it measures, for each drive count, the runtime owning
//! the emulated drives and then the same runtime as a client of a `tuttid`
//! child process serving the same drives (granted queue pairs, the
//! emulators in the daemon), with data in shared memory (memfd) for both,
//! and reports each path's GB/s and their ratio (see [`crate::daemon`]).
//!
//! It checks its [`Stop`] between batches: once a signal asked to stop, it
//! issues nothing new, lets what is in flight complete (bounded), shuts its
//! queues and controllers down, and ends [`Ended::Interrupted`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use tutti::config::{DataPathConfig, DriveConfig, Execution, TimingConfig};
use tutti::{error_chain, Config, MemoryHandle, Request, Runtime};
use tutti_bench::schema::{
    Document, StripeDaemonPoint as ComparePoint, StripeDaemonResult, StripePoint, StripeResult,
};

use crate::bench::seconds;
use crate::interrupt::{shutdown_summary, Ended, Signal, Stop};
use crate::threads::app_cpu_seconds;

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
    /// Per-drive command rate of the timing model (0: unlimited).
    #[arg(long, default_value_t = 0)]
    pub drive_iops: u64,
    /// Request size, KiB (one slot of the store), 4..=65536, a multiple of 4.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(4..=65536))]
    pub request_kib: u64,
    /// Requests per batch, 1..=1024; two batches are kept in flight.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub batch: u64,
    /// Seconds of I/O per drive count (0.1..=600).
    #[arg(long, default_value_t = 2.0, value_parser = seconds)]
    pub seconds: f64,
    /// Largest drive count to measure (1..=4).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=4))]
    pub max_drives: u64,
    /// Emulated drives keep data in RAM (`ram`, the default: every byte is
    /// really copied) or move none (`null`: timing model only).
    #[arg(long, default_value = "ram", value_parser = ["ram", "null"])]
    pub backing: String,
    /// Writes instead of reads.
    #[arg(long)]
    pub write: bool,
    /// GPU execution (`execution: gpu`), data in GPU memory (GPU 0).
    #[arg(long)]
    pub gpu: bool,
    /// For each drive count, the runtime owning the drives and then the
    /// same runtime as a client of a `tuttid` child process serving the
    /// same emulated drives; data in shared memory for both; prints both
    /// and their ratio.
    #[arg(long, conflicts_with = "gpu")]
    pub daemon: bool,
    /// The `tuttid` binary for `--daemon` (default: `tuttid` next to this
    /// executable).
    #[arg(long, requires = "daemon")]
    pub tuttid: Option<PathBuf>,
    /// With `--daemon`: runs of each path per drive count (alternating,
    /// 1..=20); the medians are compared.
    #[arg(long, default_value_t = 1, requires = "daemon", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// With `--daemon`: the daemon's drives use mediated submission (every
    /// SQE checked and copied by the daemon; docs/tuttid.md).
    #[arg(long, requires = "daemon")]
    pub mediated: bool,
    /// Print JSON (docs/benchmarks.md, "JSON output").
    #[arg(long)]
    pub json: bool,
    /// Also draw GB/s against drive count, beside the modelled limit, into
    /// FILE (SVG; with --daemon: owner and tuttid client).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
}

/// Runs 1..=max_drives and prints the points.
pub fn stripe(a: &StripeArgs, stop: &Stop) -> Result<Ended, String> {
    if a.daemon {
        return stripe_compare(a, stop);
    }
    let req = a.request_kib << 10;
    let mut points: Vec<StripePoint> = Vec::new();
    for n in 1..=a.max_drives as usize {
        let run = stripe_run(a, n, req, None, stop)?;
        if let Some((signal, report)) = run.interrupted {
            let detail = format!("during the {n}-drive run; {}", shutdown_summary(&report));
            return Ok(Ended::Interrupted { signal, detail });
        }
        let gb_s = run.bytes as f64 / run.seconds / 1e9;
        let base = points.first().map_or(gb_s, |p| p.gb_s);
        let modelled_gb_s = n as f64 * a.drive_mb_s as f64 / 1000.0;
        points.push(StripePoint {
            drives: n,
            bytes: run.bytes,
            seconds: run.seconds,
            gb_s,
            speedup_vs_one: gb_s / base,
            modelled_gb_s,
            of_modelled: gb_s / modelled_gb_s,
            app_cpu_s_per_gb: run.app_cpu_s / (run.bytes as f64 / 1e9),
        });
    }
    let result = StripeResult {
        execution: if a.gpu { "gpu" } else { "cpu" }.into(),
        write: a.write,
        request_kib: a.request_kib,
        batch: a.batch,
        drive_mb_s: a.drive_mb_s,
        latency_us: a.latency_us,
        drive_iops: a.drive_iops,
        points,
    };
    if a.json {
        println!("{}", Document::new("stripe", &result).to_json());
    } else {
        print_points(a, &result.points);
    }
    if let Some(path) = &a.plot {
        crate::output::plot(path, tutti_bench::plot::stripe::svg(&result))?;
    }
    Ok(Ended::Complete)
}

fn print_points(a: &StripeArgs, points: &[StripePoint]) {
    println!(
        "striped {}, {} KiB requests, 2 batches of {} in flight, execution: {}, timing model {} MB/s + {} us per drive:",
        if a.write { "writes" } else { "reads" },
        a.request_kib,
        a.batch,
        if a.gpu { "GPU, data in GPU memory" } else { "CPU, data in host memory" },
        a.drive_mb_s,
        a.latency_us
    );
    for p in points {
        println!(
            "  {} drive(s): {:6.3} GB/s  ({:.2}x one drive, {:5.1}% of the modelled {:.1} GB/s), application CPU {:.4} s/GB",
            p.drives,
            p.gb_s,
            p.speedup_vs_one,
            100.0 * p.of_modelled,
            p.modelled_gb_s,
            p.app_cpu_s_per_gb
        );
    }
}

/// One measurement: bytes moved, seconds, the application's CPU seconds,
/// and the signal and shutdown report if a stop request ended it early.
struct StripeRun {
    bytes: u64,
    seconds: f64,
    app_cpu_s: f64,
    interrupted: Option<(Signal, tutti::ShutdownReport)>,
}

/// The runtime configuration over `n` drives, `req`-byte slots.
fn stripe_config(a: &StripeArgs, n: usize, req: u64) -> Config {
    let slots = a.batch;
    // Enough capacity per drive for every slot, rounded to whole units.
    let per_drive = (slots * req).div_ceil(n as u64).next_multiple_of(128 << 10) + (1 << 20);
    let mut cfg = Config::builtin_striped_ram(n, per_drive, req);
    for d in cfg.drives.values_mut() {
        let DriveConfig::Emulated(e) = d else { continue };
        e.timing = Some(TimingConfig {
            latency_us: a.latency_us,
            bandwidth_mb_s: Some(a.drive_mb_s),
            iops: (a.drive_iops > 0).then_some(a.drive_iops),
        });
        e.mdts = 5;
        if a.backing == "null" {
            e.backing = tutti::config::Backing::Null;
        }
    }
    if a.gpu {
        for dp in cfg.datapaths.values_mut() {
            match dp {
                DataPathConfig::LocalNvme(l) => l.execution = Execution::Gpu,
                DataPathConfig::StripedLocalNvme(s) => s.execution = Execution::Gpu,
                _ => {}
            }
        }
    }
    cfg
}

/// The I/O buffer: host words, shared memory (`--daemon`), or a GPU
/// allocation.
enum Buffer {
    Host(Vec<u64>),
    Shared(tutti::SharedMemory),
    Gpu(gpu_io::GpuBuffer),
}

impl Buffer {
    fn register(&mut self, rt: &Runtime, len: usize) -> Result<MemoryHandle, String> {
        match self {
            // SAFETY: the buffer outlives the registration (unregistered
            // before it is dropped) and is not touched while I/O is in
            // flight.
            #[allow(unsafe_code)]
            Buffer::Host(w) => unsafe { rt.register_memory(w.as_mut_ptr().cast(), len) }.map_err(err),
            // SAFETY: as above.
            #[allow(unsafe_code)]
            Buffer::Shared(m) => unsafe { rt.register_memory(m.as_ptr(), len) }.map_err(err),
            // SAFETY: as above, for the device allocation.
            #[allow(unsafe_code)]
            Buffer::Gpu(b) => unsafe { rt.register_gpu_memory(b.device_ptr(), len) }.map_err(err),
        }
    }
}

/// Moves data for `a.seconds` (or until a stop request) over `n` drives:
/// emulated in this process, or the same drives of the `tuttid` at
/// `daemon`.
fn stripe_run(
    a: &StripeArgs,
    n: usize,
    req: u64,
    daemon: Option<&Path>,
    stop: &Stop,
) -> Result<StripeRun, String> {
    let slots = a.batch;
    let cfg = match daemon {
        Some(socket) => crate::daemon::as_client(stripe_config(a, n, req), socket),
        None => stripe_config(a, n, req),
    };
    let rt = Runtime::from_config(cfg).map_err(err)?;
    let targets: Vec<_> =
        (0..slots).map(|i| rt.open(&format!("tutti://kv/{i}"))).collect::<Result<_, _>>().map_err(err)?;
    // Two batches, each with its own half of the buffer, are kept in
    // flight (like fio's iodepth): while one is being waited on, the
    // other keeps every drive's queue non-empty.
    let len = (2 * slots * req) as usize;
    let mut buf = match (a.gpu, rt.gpu()) {
        // Shared memory on both paths of `--daemon`: the only difference
        // between them is who owns the drives.
        (false, _) if a.daemon => Buffer::Shared(tutti::SharedMemory::new(len).map_err(err)?),
        (false, _) => Buffer::Host(vec![0u64; len / 8]),
        (true, Some(g)) => Buffer::Gpu(gpu_io::GpuBuffer::zeroed(g, len).map_err(err)?),
        (true, None) => return Err("--gpu: the runtime has no GPU".into()),
    };
    let mem = buf.register(&rt, len)?;
    let batch = |half: u64| -> Vec<Request> {
        let at = |i: usize| (half * slots + i as u64) * req;
        targets
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                if a.write {
                    Request::write(t, 0, req, mem, at(i))
                } else {
                    Request::read(t, 0, req, mem, at(i))
                }
            })
            .collect()
    };
    let reqs = [batch(0), batch(1)];
    let run = keep_two_in_flight(&rt, &reqs, req * slots, a.seconds, stop);
    // The run's own error first: after a failed wait the memory is still
    // in use, and that refusal would hide why.
    let unregistered = rt.unregister_memory(mem).map_err(err);
    let report = rt.shutdown(Duration::from_secs(5));
    drop(rt);
    drop(buf);
    let (bytes, seconds, app_cpu_s) = run?;
    unregistered?;
    Ok(StripeRun { bytes, seconds, app_cpu_s, interrupted: stop.requested().map(|s| (s, report)) })
}

/// Submits the two batches alternately, waiting for one while the other is
/// in flight, for `secs` seconds. Returns bytes moved, seconds, and the
/// application threads' CPU seconds over the run.
fn keep_two_in_flight(
    rt: &Runtime,
    reqs: &[Vec<Request>; 2],
    per_batch: u64,
    secs: f64,
    stop: &Stop,
) -> Result<(u64, f64, f64), String> {
    let submit = |r: &[Request]| rt.submit(r).op().ok_or_else(|| "batch refused".to_string());
    let check = |st: Vec<tutti::RequestStatus>| match st.iter().find(|s| !s.is_success()) {
        Some(bad) => Err(format!("I/O failed: {bad:?}")),
        None => Ok(()),
    };
    let cpu0 = app_cpu_seconds();
    let start = Instant::now();
    let mut inflight = [submit(&reqs[0])?, submit(&reqs[1])?];
    let mut bytes = 0u64;
    let mut turn = 0;
    loop {
        check(rt.wait(inflight[turn], Duration::from_secs(60)).map_err(err)?)?;
        bytes += per_batch;
        if start.elapsed().as_secs_f64() >= secs || stop.requested().is_some() {
            check(rt.wait(inflight[1 - turn], Duration::from_secs(60)).map_err(err)?)?;
            bytes += per_batch;
            break;
        }
        inflight[turn] = submit(&reqs[turn])?;
        turn = 1 - turn;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok((bytes, seconds, app_cpu_seconds() - cpu0))
}

/// The `stripe-daemon` document's fields.
fn daemon_result(a: &StripeArgs, points: &[ComparePoint]) -> StripeDaemonResult {
    StripeDaemonResult {
        write: a.write,
        request_kib: a.request_kib,
        batch: a.batch,
        drive_mb_s: a.drive_mb_s,
        latency_us: a.latency_us,
        mediated: a.mediated,
        repeat: a.repeat,
        points: points.to_vec(),
    }
}

/// `--daemon`: a tuttid child serving `max_drives` drives like the
/// benchmark's own; per drive count, the runtime owning its drives, then
/// the runtime on the daemon's.
fn stripe_compare(a: &StripeArgs, stop: &Stop) -> Result<Ended, String> {
    let req = a.request_kib << 10;
    let binary = crate::daemon::tuttid_binary(a.tuttid.as_deref())?;
    // Every daemon drive as the one-drive run's (the largest capacity).
    let one = stripe_config(a, 1, req);
    let drive = one.drives.values().next().cloned().ok_or("no drive in the stripe config")?;
    let drives: Vec<_> = (0..a.max_drives).map(|i| (format!("d{i}"), drive.clone())).collect();
    let daemon = crate::daemon::DaemonChild::start(&binary, &drives, 8, a.mediated)?;
    let mut points = Vec::new();
    for n in 1..=a.max_drives as usize {
        let mut runs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..a.repeat {
            for (i, socket) in [None, Some(daemon.socket())].into_iter().enumerate() {
                let run = stripe_run(a, n, req, socket, stop)?;
                if let Some((signal, report)) = run.interrupted {
                    let detail = format!("during the {n}-drive run; {}", shutdown_summary(&report));
                    return Ok(Ended::Interrupted { signal, detail });
                }
                runs[i].push(run.bytes as f64 / run.seconds / 1e9);
            }
        }
        let (owner, client) = (median(&runs[0]), median(&runs[1]));
        let [owner_runs, client_runs] = runs;
        points.push(ComparePoint {
            drives: n,
            owner_gb_s: owner,
            client_gb_s: client,
            ratio: client / owner,
            owner_runs,
            client_runs,
            modelled_gb_s: n as f64 * a.drive_mb_s as f64 / 1000.0,
        });
    }
    drop(daemon);
    let result = daemon_result(a, &points);
    if let Some(path) = &a.plot {
        crate::output::plot(path, tutti_bench::plot::stripe::svg_daemon(&result))?;
    }
    if a.json {
        println!("{}", Document::new("stripe-daemon", result).to_json());
        return Ok(Ended::Complete);
    }
    println!(
        "striped {}, {} KiB requests, 2 batches of {} in flight, data in shared memory, timing model {} MB/s + {} us per drive; runtime owning the drives vs tuttid client{}, same run, medians of {} run(s) each:",
        if a.write { "writes" } else { "reads" },
        a.request_kib,
        a.batch,
        a.drive_mb_s,
        a.latency_us,
        if a.mediated { " (mediated submission)" } else { "" },
        a.repeat
    );
    for p in &points {
        println!(
            "  {} drive(s): owner {:6.3} GB/s, tuttid client {:6.3} GB/s, client / owner {:.3} (modelled {:.1} GB/s)",
            p.drives, p.owner_gb_s, p.client_gb_s, p.ratio, p.modelled_gb_s
        );
    }
    Ok(Ended::Complete)
}

/// The median of `v` (the mean of the middle two for an even count; 0 when
/// empty).
fn median(v: &[f64]) -> f64 {
    let mut r = v.to_vec();
    r.sort_by(f64::total_cmp);
    match r.len() {
        0 => 0.0,
        n if n % 2 == 1 => r[n / 2],
        n => (r[n / 2 - 1] + r[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
