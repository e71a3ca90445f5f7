//! `tutti-bench rate`: commands per second of one submitting thread,
//! through the CPU queue pair (`nvm-queue`) and through the runtime API
//! (`Runtime::submit` / `Runtime::wait`), with the same commands (4 KiB
//! reads), queue depth and batch, against one emulated controller with null
//! backing (no data moves, so the driver and the runtime are what is
//! measured, with the emulator as the device).
//!
//! Both paths keep the queue as full as the depth allows: the queue pair
//! writes `batch` SQEs per doorbell and reaps between batches; the runtime
//! keeps `(depth - 1) / batch` operations of `batch` requests in flight and
//! waits for the oldest. `--compare` measures both in one run and prints
//! their ratio; `--repeat N` alternates N runs of each and compares their
//! medians and best runs (the machines this runs on are noisy). `--settle` waits, outside the measured functions, until the
//! emulator has completed each batch before reaping it (one batch in
//! flight), so that the work counted inside the `measured_*` functions is
//! the same on every run: count it with
//! `valgrind --tool=callgrind --toggle-collect='*rate::measured_*'`.
//!
//! Each path checks its [`Stop`] between batches: once a signal asked to
//! stop, it issues nothing new, lets what is in flight complete (bounded
//! by [`DRAIN`]), shuts its queues and controller down, and ends
//! [`Ended::Interrupted`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use nvm_queue::{
    Controller, ControllerOptions, DataRef, DmaBuffer, IoChunk, IoOp, NvmeDevice, QueuePair, SubmitError,
};
use nvme_emu::{BackingSpec, Emulator, EmulatorConfig, NamespaceSpec};
use nvme_regs::Nlb;
use serde::Serialize;
use tutti::{error_chain, Config, OpHandle, Request, RequestStatus, Runtime};
use tutti_bench::schema::{Document, RateRun};

use crate::interrupt::{shutdown_summary, Ended, Signal, Stop};

/// How long a stopped run keeps reaping what it had in flight.
const DRAIN: Duration = Duration::from_secs(10);

fn err(e: impl std::error::Error) -> String {
    error_chain(&e)
}

/// Options of `rate`.
#[derive(Debug, Args)]
pub struct RateArgs {
    /// Commands to complete (per path).
    #[arg(long, default_value_t = 5_000_000)]
    pub commands: u64,
    /// I/O queue entries, 2..=1024 (the emulator's CAP.MQES + 1).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(2..=1024))]
    pub queue_depth: u32,
    /// Commands written per doorbell write (queue pair) or requests per
    /// submit call (runtime), 1..=4096.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub batch: u32,
    /// Measure through the runtime API (`submit`/`wait` batches of `batch`
    /// 4 KiB reads on a `local_nvme` datapath) instead of the queue pair.
    #[arg(long, conflicts_with = "compare")]
    pub runtime: bool,
    /// Measure both paths, one after the other in this run, and print the
    /// runtime's rate as a fraction of the queue pair's.
    #[arg(long)]
    pub compare: bool,
    /// With `--compare`: measure each path this many times, alternating
    /// (queue pair, runtime, queue pair, ...), and compare their medians and
    /// their best runs (1..=50).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeat: u32,
    /// Wait until the emulator has completed each batch before reaping it
    /// (one batch in flight), so instruction counts are repeatable.
    #[arg(long)]
    pub settle: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Run the runtime path on drive `d0` of the `tuttid` listening on this
    /// socket (give that drive `backing: null`, `mqes` >= queue depth - 1).
    /// With `--compare`: the runtime owning an emulated drive directly
    /// against the runtime as a tuttid client, and the grant latency.
    #[arg(long, conflicts_with = "settle")]
    pub daemon: Option<std::path::PathBuf>,
    /// Also draw commands/s per run and path into FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct RateResult {
    path: &'static str,
    commands: u64,
    seconds: f64,
    commands_per_second: f64,
    queue_depth: u32,
    batch: u32,
    protocol_errors: u64,
    sq_doorbell_writes: u64,
    /// The signal that stopped the run early, and what its shutdown said.
    #[serde(skip)]
    interrupted: Option<(Signal, String)>,
}

impl RateResult {
    /// The run as its document type.
    fn run(&self) -> RateRun {
        RateRun {
            path: self.path.into(),
            commands: self.commands,
            seconds: self.seconds,
            commands_per_second: self.commands_per_second,
            queue_depth: self.queue_depth,
            batch: self.batch,
            protocol_errors: self.protocol_errors,
            sq_doorbell_writes: self.sq_doorbell_writes,
        }
    }

    /// [`Ended::Interrupted`] if a signal stopped the run.
    fn ended(&self, total: u64) -> Option<Ended> {
        self.interrupted.as_ref().map(|(signal, shutdown)| Ended::Interrupted {
            signal: *signal,
            detail: format!("after {} of {total} commands ({}); {shutdown}", self.commands, self.path),
        })
    }
}

#[derive(Debug, Serialize)]
struct Comparison {
    /// Each run of each path, in the order measured (alternating).
    queue_pair: Vec<RateResult>,
    runtime: Vec<RateResult>,
    /// Median runtime rate / median queue-pair rate.
    median_ratio: f64,
    /// Best runtime rate / best queue-pair rate.
    best_ratio: f64,
}

/// Median and best commands per second of some runs.
fn median_best(runs: &[RateResult]) -> (f64, f64) {
    let mut r: Vec<f64> = runs.iter().map(|x| x.commands_per_second).collect();
    r.sort_by(f64::total_cmp);
    let n = r.len();
    let median = if n % 2 == 1 { r[n / 2] } else { (r[n / 2 - 1] + r[n / 2]) / 2.0 };
    (median, r.last().copied().unwrap_or(0.0))
}

/// Measures both paths `a.repeat` times, alternating, and prints every run
/// and the ratios of their medians and bests.
fn compare(a: &RateArgs, stop: &Stop) -> Result<Ended, String> {
    let (mut qp, mut rt) = (Vec::new(), Vec::new());
    for _ in 0..a.repeat {
        // With a daemon: the runtime owning the drive is the baseline.
        let q = match &a.daemon {
            Some(_) => rate_runtime(a, None, stop)?,
            None => rate_queue_pair(a, stop)?,
        };
        if let Some(ended) = q.ended(a.commands) {
            return Ok(ended);
        }
        qp.push(q);
        let r = rate_runtime(a, a.daemon.as_deref(), stop)?;
        if let Some(ended) = r.ended(a.commands) {
            return Ok(ended);
        }
        rt.push(r);
    }
    if let Some(socket) = &a.daemon {
        grant_latency(socket, a.queue_depth)?;
    }
    let ((qm, qb), (rm, rb)) = (median_best(&qp), median_best(&rt));
    let c = Comparison { median_ratio: rm / qm, best_ratio: rb / qb, queue_pair: qp, runtime: rt };
    if let Some(path) = &a.plot {
        let runs = |v: &[RateResult]| v.iter().map(RateResult::run).collect::<Vec<_>>();
        crate::output::plot(
            path,
            tutti_bench::plot::rate::svg_runs(&runs(&c.queue_pair), &runs(&c.runtime)),
        )?;
    }
    if a.json {
        println!("{}", Document::new("rate-compare", &c).to_json());
        return Ok(Ended::Complete);
    }
    for (q, r) in c.queue_pair.iter().zip(&c.runtime) {
        print_rate(a, q);
        print_rate(a, r);
    }
    let what = if a.daemon.is_some() {
        "tuttid client / runtime owning the drive"
    } else {
        "runtime API / queue pair"
    };
    println!(
        "{what}: {:.3} (medians {:.2} / {:.2} M commands/s), best runs {:.3} ({:.2} / {:.2}), {} run(s) each",
        c.median_ratio,
        rm / 1e6,
        qm / 1e6,
        c.best_ratio,
        rb / 1e6,
        qb / 1e6,
        a.repeat
    );
    Ok(Ended::Complete)
}

/// Runs `rate` as asked and prints the result(s).
pub fn rate(a: &RateArgs, stop: &Stop) -> Result<Ended, String> {
    if a.compare {
        return compare(a, stop);
    }
    let r = if a.runtime || a.daemon.is_some() {
        rate_runtime(a, a.daemon.as_deref(), stop)?
    } else {
        rate_queue_pair(a, stop)?
    };
    if let Some(ended) = r.ended(a.commands) {
        return Ok(ended);
    }
    if a.json {
        println!("{}", Document::new("rate", &r).to_json());
    } else {
        print_rate(a, &r);
    }
    if let Some(path) = &a.plot {
        crate::output::plot(path, tutti_bench::plot::rate::svg_runs(&[r.run()], &[]))?;
    }
    Ok(Ended::Complete)
}

fn print_rate(a: &RateArgs, r: &RateResult) {
    println!(
        "{}: {} commands in {:.3} s: {:.2} M commands/s (one submitting thread, queue depth {}, batch {}, {} SQ doorbell writes, null backing{})",
        r.path,
        r.commands,
        r.seconds,
        r.commands_per_second / 1e6,
        r.queue_depth,
        r.batch,
        r.sq_doorbell_writes,
        if a.settle { ", settled batches" } else { "" }
    );
}

/// Spins until the emulator has posted `target` completions in all.
fn settle(emu: impl Fn() -> u64, target: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while emu() < target {
        if Instant::now() > deadline {
            return Err("the emulator did not complete the batch within 30 s".into());
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// Queues up to `n` reads (stopping at a full queue) and rings the SQ tail
/// doorbell once; returns how many were queued.
#[inline(never)]
fn measured_qp_submit(qp: &mut QueuePair, n: u64, first: u64, data: DataRef<'_>) -> Result<u64, String> {
    let nlb = Nlb::from_blocks(1).ok_or("nlb")?;
    let mut queued = 0;
    while queued < n {
        let id = first + queued;
        let chunk = IoChunk { slba: id % (1 << 20), nlb, offset: 0, len: 4096 };
        match qp.submit(IoOp::Read.sqe(1, &chunk), Some(data), id) {
            Ok(_) => queued += 1,
            Err(SubmitError::QueueFull { .. }) => break,
            Err(e) => return Err(err(e)),
        }
    }
    qp.ring();
    Ok(queued)
}

/// Reaps the posted completions; returns (completed, failed).
#[inline(never)]
fn measured_qp_reap(qp: &mut QueuePair) -> (u64, u64) {
    let (mut completed, mut failed) = (0, 0);
    qp.poll(|c| {
        completed += 1;
        failed += u64::from(!c.status.is_success());
    });
    (completed, failed)
}

/// The queue pair's commands per second with these settings (for
/// `gpu-rate`'s CPU baseline).
/// `Err(ended)` when a signal stopped it.
pub fn queue_pair_rate(
    commands: u64,
    queue_depth: u32,
    batch: u32,
    stop: &Stop,
) -> Result<Result<f64, Ended>, String> {
    let a = RateArgs {
        commands,
        queue_depth,
        batch,
        runtime: false,
        compare: false,
        repeat: 1,
        settle: false,
        json: false,
        daemon: None,
        plot: None,
    };
    let r = rate_queue_pair(&a, stop)?;
    Ok(r.ended(commands).map_or(Ok(r.commands_per_second), Err))
}

fn rate_queue_pair(a: &RateArgs, stop: &Stop) -> Result<RateResult, String> {
    let mut cfg = EmulatorConfig::new("rate", vec![NamespaceSpec::new(1 << 20, 4096)]);
    cfg.backing = BackingSpec::Null;
    cfg.io_queues = 1;
    let emu = Emulator::start(cfg).map_err(err)?;
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let mut ctrl = Controller::init(dev.clone(), ControllerOptions { io_queues: 1, ..Default::default() })
        .map_err(err)?;
    let depth = a.queue_depth.min(ctrl.cap().max_queue_entries());
    let mut qp = ctrl.create_io_queue_pair(1, depth, (depth - 1) as u16).map_err(err)?;
    let buf = DmaBuffer::new(&dev, 4096).map_err(err)?;
    let mapping = buf.mapping().clone();
    let data = DataRef { mapping: &mapping, offset: 0, len: 4096 };
    let base = emu.stats().commands;
    let (mut submitted, mut completed, mut failed) = (0u64, 0u64, 0u64);
    // Lowered to what was submitted when a stop is requested: the commands
    // in flight are reaped (for up to DRAIN), no new one is issued.
    let mut target = a.commands;
    let mut stopped: Option<(Signal, Instant)> = None;
    let start = Instant::now();
    while completed < target {
        match stopped {
            None => {
                if let Some(signal) = stop.requested() {
                    stopped = Some((signal, Instant::now() + DRAIN));
                    target = submitted;
                    continue;
                }
            }
            Some((_, deadline)) if Instant::now() >= deadline => break,
            Some(_) => {}
        }
        let n = u64::from(a.batch).min(target - submitted);
        submitted += measured_qp_submit(&mut qp, n, submitted, data)?;
        if a.settle {
            settle(|| emu.stats().commands - base, submitted)?;
        }
        let (c, f) = measured_qp_reap(&mut qp);
        completed += c;
        failed += f;
    }
    let secs = start.elapsed().as_secs_f64();
    if failed > 0 {
        return Err(format!("{failed} commands failed"));
    }
    let s = qp.stats();
    ctrl.delete_io_queue_pair(1).map_err(err)?;
    ctrl.shutdown().map_err(err)?;
    let interrupted = stopped
        .filter(|_| completed < a.commands)
        .map(|(signal, _)| (signal, "I/O queue deleted, controller shut down (CC.SHN): OK".to_string()));
    Ok(RateResult {
        path: "queue pair",
        commands: completed,
        seconds: secs,
        commands_per_second: completed as f64 / secs,
        queue_depth: depth,
        batch: a.batch,
        protocol_errors: s.protocol_errors,
        sq_doorbell_writes: s.sq_doorbell_writes,
        interrupted,
    })
}

#[inline(never)]
fn measured_rt_submit(rt: &Runtime, reqs: &[Request]) -> Result<OpHandle, String> {
    rt.submit(reqs).op().ok_or_else(|| "batch refused".to_string())
}

#[inline(never)]
fn measured_rt_wait(rt: &Runtime, op: OpHandle) -> Result<Vec<RequestStatus>, String> {
    rt.wait(op, Duration::from_secs(10)).map_err(err)
}

/// The runtime YAML of `rate`: drive `d0` emulated (null backing) or
/// drive `d0` of the tuttid at `daemon`, one `local_nvme` queue pair.
fn rate_yaml(queue_depth: u32, daemon: Option<&std::path::Path>) -> String {
    let drive = match daemon {
        Some(s) => format!("  d0: {{ daemon: {{ socket: {}, drive: d0 }} }}\n", s.display()),
        None => "  d0:\n    emulated:\n      namespaces: [{ capacity: 4GiB, block_size: 4096 }]\n      backing: null\n".into(),
    };
    format!(
        "drives:\n{drive}resolvers:\n  kv:\n    slab: {{ slot_size: 4KiB }}\n\
         datapaths:\n  one:\n    local_nvme: {{ drive: d0, queues: 1, queue_depth: {queue_depth} }}\n\
         stores:\n  kv: {{ resolver: kv, datapath: one }}\n"
    )
}

/// Grant latency against the tuttid at `socket`: 20 times, a runtime
/// started on it (connect, handshake, drive facts, one queue pair granted
/// and mapped) and 1 MiB of shared memory registered; prints the median
/// and the worst of each.
fn grant_latency(socket: &std::path::Path, queue_depth: u32) -> Result<(), String> {
    let (mut grant, mut register) = (Vec::new(), Vec::new());
    let mem = tutti::SharedMemory::new(1 << 20).map_err(err)?;
    for _ in 0..20 {
        let t = Instant::now();
        let rt =
            Runtime::from_config(Config::from_yaml_str(&rate_yaml(queue_depth, Some(socket))).map_err(err)?)
                .map_err(|e| error_chain(&e))?;
        grant.push(t.elapsed());
        let t = Instant::now();
        // SAFETY: `mem` outlives the registration, undone below; no I/O.
        #[allow(unsafe_code)]
        let h = unsafe { rt.register_memory(mem.as_ptr(), mem.len()) }.map_err(err)?;
        register.push(t.elapsed());
        rt.unregister_memory(h).map_err(err)?;
        drop(rt);
    }
    grant.sort();
    register.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "grant latency (connect + handshake + 1 queue pair of {queue_depth}): median {:.3} ms, worst {:.3} ms; register 1 MiB: median {:.3} ms, worst {:.3} ms (20 runs)",
        ms(grant[10]),
        ms(grant[19]),
        ms(register[10]),
        ms(register[19])
    );
    Ok(())
}

/// The runtime: one `local_nvme` drive (emulated with null backing, or
/// the tuttid drive at `daemon`) and one queue pair of `queue_depth`
/// entries; `batch` 4 KiB reads per submit.
fn rate_runtime(a: &RateArgs, daemon: Option<&std::path::Path>, stop: &Stop) -> Result<RateResult, String> {
    let yaml = rate_yaml(a.queue_depth, daemon);
    let rt = Runtime::from_config(Config::from_yaml_str(&yaml).map_err(err)?).map_err(|e| error_chain(&e))?;
    let batch = a.batch as usize;
    let targets: Vec<_> =
        (0..batch).map(|i| rt.open(&format!("tutti://kv/{i}"))).collect::<Result<_, _>>().map_err(err)?;
    // Shared memory: a tuttid drive reaches nothing else.
    let buf = tutti::SharedMemory::new(batch * 4096).map_err(err)?;
    // SAFETY: `buf` outlives the registration and is never read or written
    // by this thread (null backing moves no data).
    #[allow(unsafe_code)]
    let mem = unsafe { rt.register_memory(buf.as_ptr(), buf.len()) }.map_err(err)?;
    let reqs: Vec<Request> =
        targets.iter().enumerate().map(|(i, &t)| Request::read(t, 0, 4096, mem, i as u64 * 4096)).collect();
    let emu = || rt.emulator("d0").map_or(0, |e| e.stats().commands);
    let base = emu();
    // Operations in flight: as many batches as the queue holds.
    let window = if a.settle { 1 } else { ((a.queue_depth as usize - 1) / batch).max(1) };
    let mut in_flight: VecDeque<(OpHandle, u64)> = VecDeque::new();
    let (mut issued, mut completed) = (0u64, 0u64);
    let mut stopped = None;
    let start = Instant::now();
    while completed < a.commands {
        // Once stopped, only the operations in flight are waited on.
        stopped = stopped.or_else(|| stop.requested());
        while stopped.is_none() && in_flight.len() < window && issued < a.commands {
            let n = (batch as u64).min(a.commands - issued);
            in_flight.push_back((measured_rt_submit(&rt, &reqs[..n as usize])?, n));
            issued += n;
        }
        if a.settle {
            settle(|| emu() - base, issued)?;
        }
        let Some((op, n)) = in_flight.pop_front() else { break };
        let st = measured_rt_wait(&rt, op)?;
        if let Some(bad) = st.iter().find(|s| !s.is_success()) {
            return Err(format!("read failed: {bad:?}"));
        }
        completed += n;
    }
    let secs = start.elapsed().as_secs_f64();
    let stats = rt.stats();
    rt.unregister_memory(mem).map_err(err)?;
    let report = rt.shutdown(DRAIN);
    drop(rt);
    drop(buf);
    let interrupted = stopped.filter(|_| completed < a.commands).map(|s| (s, shutdown_summary(&report)));
    Ok(RateResult {
        path: if daemon.is_some() { "runtime API on tuttid" } else { "runtime API" },
        commands: completed,
        seconds: secs,
        commands_per_second: completed as f64 / secs,
        queue_depth: a.queue_depth,
        batch: a.batch,
        protocol_errors: stats.protocol_errors,
        sq_doorbell_writes: stats.sq_doorbell_writes,
        interrupted,
    })
}
