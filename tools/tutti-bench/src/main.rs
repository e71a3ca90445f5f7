//! `tutti-bench`: the KV-cache replay (the project's main job) and the
//! driver benchmarks.
//!
//! - `replay`: replays a Mooncake-format KV-cache trace through the
//!   tutti-kv block store on the tutti runtime's public API, verifying
//!   every loaded byte.
//! - `rate`: commands per second of one submitting thread against one
//!   emulated controller with no data movement.
//! - `stripe`: striped read bandwidth over 1 to 4 emulated drives with the
//!   timing model on.
//! - `gpu-soak`: the GPU soak suite: a sweep of batch sizes, batches in
//!   flight, object sizes, queue depths and drive counts against tutti-kv,
//!   with injected faults, every byte verified (see [`soak`]).
//!
//! The first SIGINT or SIGTERM stops a run in order (see [`interrupt`]):
//! no new batch, the one in flight finishes, the runtime shuts down (I/O
//! queues deleted, CC.SHN), one line on stderr says so, exit status 130
//! (SIGINT) or 143 (SIGTERM). A second signal exits at once.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use interrupt::Ended;

mod bench;
mod daemon;
mod interrupt;
mod kv_bench;
mod output;
mod rate;
mod replay;
mod soak;
mod stripe;
mod threads;
mod words;

/// KV-cache offload benchmark for tutti.
#[derive(Debug, Parser)]
#[command(
    name = "tutti-bench",
    version,
    about,
    after_help = "SIGINT or SIGTERM stops a run in order: the batch in flight finishes, the drives' I/O queues \
                  are deleted and the controllers shut down (CC.SHN); exit status 130 (SIGINT) or 143 (SIGTERM). \
                  A second signal exits at once."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a KV-cache trace through the runtime (default: built-in
    /// synthetic trace on four emulated RAM drives, striped).
    Replay(ReplayArgs),
    /// Commands per second of one submitting thread, one emulated
    /// controller, no data movement (null backing), through the queue pair
    /// or the runtime API (`--compare`: both, and their ratio).
    Rate(rate::RateArgs),
    /// Striped read bandwidth over 1, 2, 3 and 4 emulated drives with the
    /// timing model on.
    Stripe(stripe::StripeArgs),
    /// Commands per second issued by GPU threads (one kernel launch) to
    /// emulated controllers with no data movement, beside one CPU thread
    /// through the CPU queue pair. Needs a CUDA GPU.
    GpuRate(bench::GpuRateArgs),
    /// tutti-kv against raw runtime I/O on the same drives (put/get GB/s),
    /// and recovery time.
    Kv(kv_bench::KvArgs),
    /// The GPU soak suite: batch sizes x batches in flight x object sizes
    /// x queue depths x drives against tutti-kv, puts, gets and both, GPU-
    /// and CPU-executed stores side by side, injected faults; every byte
    /// verified, every wait under a deadline and a watchdog. One line per
    /// cell, then one `gpu-soak:` summary line; exit 0 when every cell is
    /// ok, 1 on a failure or hang, 2 when it cannot start (no GPU).
    GpuSoak(soak::SoakArgs),
    /// One self-contained HTML page (inline SVG charts and tables) of the
    /// `--json` documents (*.json) in a directory.
    Report(output::ReportArgs),
    /// The chart of one `--json` document, drawn again from the file (SVG),
    /// e.g. of a run recorded on another machine.
    Plot(output::PlotArgs),
}

/// Options of `replay`.
#[derive(Debug, Args, Default)]
pub struct ReplayArgs {
    /// Mooncake JSONL trace to replay; default: a built-in synthetic trace.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Replay only the first N requests.
    #[arg(long)]
    pub requests: Option<usize>,
    /// Model whose KV geometry sizes a block (see --list-models).
    #[arg(long, default_value = "qwen2.5-7b")]
    pub model: String,
    /// Tokens per KV block. Trace blocks are 512 tokens; a smaller value
    /// scales every block's bytes down so a run fits a small machine.
    #[arg(long, default_value_t = 16)]
    pub block_tokens: u32,
    /// Emulated drives in the built-in configuration (1 to 4; 1 uses
    /// `local_nvme`, 2 to 4 `striped_local_nvme`).
    #[arg(long, default_value_t = 4, conflicts_with = "config")]
    pub drives: usize,
    /// Capacity of each emulated drive, MiB (the store holds
    /// drives x capacity; fewer slots than distinct blocks means eviction).
    #[arg(long, default_value_t = 256, conflicts_with = "config")]
    pub drive_mib: u64,
    /// Keep the built-in drives in sparse files DIR/d0.img, DIR/d1.img, ...
    /// (DIR is created if missing) instead of RAM, so a later run with the
    /// same arguments finds this run's blocks (see the restart hit ratio).
    /// A store of another geometry there is refused, not overwritten
    /// (unless --format).
    #[arg(long, value_name = "DIR", conflicts_with = "config")]
    pub persist: Option<PathBuf>,
    /// Format the tutti-kv store first, whatever it holds: destroys its
    /// contents (an earlier run's blocks, or anything else on the store's
    /// drives). Without it a blank store is formatted, a tutti-kv store of
    /// this geometry is reused, and anything else is refused.
    #[arg(long)]
    pub format: bool,
    /// Runtime configuration (YAML) instead of the built-in one; its store
    /// named by --store must use a `slab` resolver.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Store to use from --config.
    #[arg(long, default_value = "kv")]
    pub store: String,
    /// Seed of the synthetic trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// KV blocks live in GPU memory and GPU threads submit the NVMe
    /// commands (one kernel launch per batch); needs a CUDA GPU.
    #[arg(long)]
    pub gpu: bool,
    /// Print the summary as JSON (docs/benchmarks.md, "JSON output").
    #[arg(long)]
    pub json: bool,
    /// Also draw the load-latency CDF and the save/load GB/s into FILE
    /// (SVG).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// List the model presets and exit.
    #[arg(long)]
    pub list_models: bool,
}

fn main() -> ExitCode {
    // Before anything else, so that no signal finds the default handler
    // once work has started.
    let stop = match interrupt::Stop::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tutti-bench: cannot install the SIGINT/SIGTERM handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    tutti_signals::init_logging();
    // The run's facts (command line, machine, start time) for `--json`.
    tutti_bench::schema::RunInfo::process();
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Replay(ReplayArgs {
        model: "qwen2.5-7b".into(),
        block_tokens: 16,
        drives: 4,
        drive_mib: 256,
        store: "kv".into(),
        seed: 1,
        ..ReplayArgs::default()
    })) {
        Command::Replay(a) => replay::run(&a, &stop),
        Command::Rate(a) => rate::rate(&a, &stop),
        Command::Stripe(a) => stripe::stripe(&a, &stop),
        Command::GpuRate(a) => bench::gpu_rate(&a, &stop),
        Command::Kv(a) => kv_bench::kv(&a, &stop),
        Command::GpuSoak(a) => return soak::gpu_soak(&a, &stop),
        Command::Report(a) => output::report(&a),
        Command::Plot(a) => output::plot_file(&a),
    };
    match result {
        Ok(Ended::Complete) => ExitCode::SUCCESS,
        Ok(Ended::Interrupted { signal, detail }) => {
            eprintln!("tutti-bench: interrupted by {}: {detail}", signal.name());
            ExitCode::from(signal.exit_code())
        }
        Err(e) => {
            eprintln!("tutti-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
