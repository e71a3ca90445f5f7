//! `tutti-bench gpu-soak`: the GPU soak suite. A sweep of what serving
//! engines do against tutti-kv on emulated drives (batch sizes, batches in
//! flight, object sizes, queue depths and counts, drive counts and stripe
//! units, puts, gets and both at once, a GPU-executed store beside a
//! CPU-executed one, injected faults), every byte verified, every wait
//! under a deadline and a watchdog.
//!
//! Each cell runs on a fresh runtime on a worker thread and prints one
//! line; the run ends with one summary line starting `gpu-soak:`. Exit
//! status: 0 when every cell is ok, 1 when a cell failed or hung, 2 when
//! the run cannot start (no GPU for `--execution gpu`, no cell matching
//! `--filter`), 130/143 when a signal stopped it between cells.
//!
//! - [`cells`]: the sweep (full and `--short`);
//! - [`config`]: a cell's runtime YAML;
//! - [`memory`]: value memory (host, or GPU with a host mirror);
//! - [`run`]: one cell on its worker: lanes, workload, drive checks;
//! - [`batches`], [`workload`], [`faults`]: the I/O and its checks;
//! - [`verify`]: expected statuses and the tally;
//! - [`watch`], [`supervise`]: the watchdog;
//! - [`report`]: cell lines, summary, JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;

use crate::interrupt::Stop;

pub mod batches;
pub mod cells;
pub mod config;
pub mod error;
pub mod faults;
pub mod memory;
pub mod report;
pub mod run;
pub mod supervise;
pub mod verify;
pub mod watch;
pub mod workload;

use report::{CellResult, JsonReport, Summary};
use supervise::{supervise, Outcome};

/// Exit status when the run cannot start.
const EXIT_USAGE: u8 = 2;

/// Who executes the NVMe commands of the sweep's stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Exec {
    /// GPU threads (`execution: gpu`), values in GPU memory; needs a CUDA
    /// GPU.
    Gpu,
    /// CPU threads (`execution: cpu`), values in host memory.
    Cpu,
}

/// Options of `gpu-soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// The short sweep: a dozen small cells (for compute-sanitizer and CI).
    #[arg(long)]
    pub short: bool,
    /// Who executes the stores' commands: `gpu` (values in GPU memory) or
    /// `cpu` (host memory; runs without a GPU). The pair cells put a
    /// CPU-executed store beside it either way.
    #[arg(long, value_enum, default_value = "gpu")]
    pub execution: Exec,
    /// Run only the cells whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
    /// Print the names of the cells (after --short and --filter) and exit.
    #[arg(long)]
    pub list: bool,
    /// Write every cell's result and the summary to this JSON file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Every cell with one batch in flight (its rounds multiplied by its
    /// batches in flight, so the same objects move). For compute-sanitizer,
    /// which serialises GPU work: there a launch or copy queued while an
    /// I/O kernel runs can wait for that kernel, which waits for the
    /// emulator's copies (docs/gpu.md, "The GPU soak suite").
    #[arg(long)]
    pub one_in_flight: bool,
    /// Multiply every deadline and bound, and the runtime's GPU command
    /// budget, by this (1 to 10): e.g. 10 under compute-sanitizer, which
    /// runs kernels far slower.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub time_scale: u32,
}

/// The run's deadlines and bounds (all scaled by `--time-scale`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Who executes lane 0's commands.
    pub exec: Exec,
    /// Deadline of every ordinary wait (5 s).
    pub deadline: Duration,
    /// How far past its deadline a wait may return before the cell fails
    /// (200 ms).
    pub overrun_bound: Duration,
    /// How far past its deadline (plus allowed lateness) a wait may run
    /// before the cell counts as hung (1 s).
    pub hang: Duration,
    /// Deadline of the waits of a read-delay fault (500 ms).
    pub fault_deadline: Duration,
    /// How far past `fault_deadline` the delayed read completes (400 ms).
    pub fault_late: Duration,
    /// A cell running longer than this counts as hung, waits or not
    /// (300 s).
    pub cell_limit: Duration,
    /// Each GPU-executed command's budget (the runtime's 10 s default,
    /// scaled: under compute-sanitizer the I/O kernel polls many times
    /// slower, and a command would time out that completes).
    pub gpu_budget: Duration,
    /// How long a hung cell's worker is given to return before the run
    /// exits (twice the GPU command budget, plus 10 s: a GPU wait ends
    /// with its kernel, whose commands may each wait a budget).
    pub grace: Duration,
    /// Pattern version of every object (names the run's data).
    pub version: u64,
}

impl Settings {
    /// The settings for `exec`, scaled by `scale`.
    pub fn new(exec: Exec, scale: u32) -> Self {
        let ms = |m: u64| Duration::from_millis(m * u64::from(scale));
        Self {
            exec,
            deadline: ms(5_000),
            overrun_bound: ms(200),
            hang: ms(1_000),
            fault_deadline: ms(500),
            fault_late: ms(400),
            cell_limit: ms(300_000),
            gpu_budget: tutti::GPU_COMMAND_BUDGET * scale,
            grace: tutti::GPU_COMMAND_BUDGET * scale * 2 + ms(10_000),
            version: 1,
        }
    }
}

/// The cells `a` selects.
fn selected(a: &SoakArgs) -> Vec<cells::Cell> {
    let all = if a.short { cells::short() } else { cells::full() };
    all.into_iter()
        .filter(|c| a.filter.as_ref().is_none_or(|f| c.name().contains(f.as_str())))
        .map(|c| if a.one_in_flight { c.one_in_flight() } else { c })
        .collect()
}

/// Who executes a cell's lanes, in words.
fn execution(cell: &cells::Cell, exec: Exec) -> String {
    let name = |e: Exec| if e == Exec::Gpu { "gpu" } else { "cpu" };
    if cell.pair {
        format!("{}+cpu", name(exec))
    } else {
        name(exec).to_owned()
    }
}

/// Runs `gpu-soak`; the process's exit status.
pub fn gpu_soak(a: &SoakArgs, stop: &Stop) -> ExitCode {
    let cells = selected(a);
    if a.list {
        for c in &cells {
            println!("{}", c.name());
        }
        return ExitCode::SUCCESS;
    }
    if cells.is_empty() {
        eprintln!("gpu-soak: no cell name contains {:?} (see --list)", a.filter.as_deref().unwrap_or(""));
        return ExitCode::from(EXIT_USAGE);
    }
    if a.execution == Exec::Gpu {
        if let Err(e) = gpu_io::Gpu::open(0) {
            eprintln!(
                "gpu-soak: --execution gpu needs a CUDA GPU: {}; use --execution cpu to run the sweep on CPU threads",
                tutti::error_chain(&e)
            );
            return ExitCode::from(EXIT_USAGE);
        }
    }
    let s = Settings::new(a.execution, a.time_scale);
    let mode = if a.short { "short" } else { "full" };
    let exec = if a.execution == Exec::Gpu { "gpu" } else { "cpu" };
    let start = Instant::now();
    let mut results = Vec::with_capacity(cells.len());
    for (i, cell) in cells.iter().enumerate() {
        if let Some(sig) = stop.requested() {
            let sum = Summary::of(&results, start.elapsed(), exec, mode);
            println!("{}", sum.line());
            eprintln!("tutti-bench: interrupted by {} after {i} of {} cells", sig.name(), cells.len());
            return ExitCode::from(sig.exit_code());
        }
        let (outcome, took) = supervise(cell, &s);
        let r = CellResult::new(cell, execution(cell, a.execution), &outcome, took);
        println!("{}", r.line(i, cells.len()));
        results.push(r);
        if let Outcome::Hung { returned: None, .. } = outcome {
            let sum = Summary::of(&results, start.elapsed(), exec, mode);
            println!("{}", sum.line());
            write_json(a, &sum, &results);
            eprintln!(
                "gpu-soak: cell {} hung and its worker did not return within {} s; exiting without cleanup",
                cell.name(),
                s.grace.as_secs()
            );
            std::process::exit(1);
        }
    }
    let sum = Summary::of(&results, start.elapsed(), exec, mode);
    println!("{}", sum.line());
    write_json(a, &sum, &results);
    if sum.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Writes the JSON report where `--json` asks (a failure is reported on
/// stderr; the verdict stands).
fn write_json(a: &SoakArgs, summary: &Summary, cells: &[CellResult]) {
    let Some(path) = &a.json else { return };
    // Stamped like every --json document: schema_version, bench, run.
    let doc = tutti_bench::schema::Document::new("gpu-soak", JsonReport { summary, cells });
    let r = serde_json::to_vec_pretty(&doc)
        .map_err(|e| e.to_string())
        .and_then(|b| std::fs::write(path, b).map_err(|e| e.to_string()));
    if let Err(e) = r {
        eprintln!("gpu-soak: cannot write {}: {e}", path.display());
    }
}
