//! `tutti-bench`: KV-cache offload benchmark (placeholder entry point; the
//! replay against the `tutti` runtime is wired in separately).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tutti_bench::trace::{read_trace, TraceStats};
use tutti_bench::{preset, synthetic_trace};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "tutti-bench",
    version,
    about = "KV-cache offload benchmark for tutti"
)]
struct Args {
    /// Mooncake JSONL trace to replay (default: the synthetic workload).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Replay at most this many requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Requests of the synthetic workload (when no --trace is given).
    #[arg(long, default_value_t = tutti_bench::synthetic::DEFAULT_REQUESTS)]
    requests: usize,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Model preset giving the KV block size.
    #[arg(long, default_value = "llama-3.1-8b")]
    model: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let Some(model) = preset(&args.model) else {
        eprintln!("tutti-bench: unknown model preset {:?}", args.model);
        return ExitCode::from(2);
    };
    let requests = match &args.trace {
        Some(path) => match read_trace(path, args.limit) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("tutti-bench: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => synthetic_trace(args.limit.unwrap_or(args.requests), args.seed),
    };
    let stats = TraceStats::from_requests(&requests);
    println!(
        "{} requests, {} blocks ({} unique, ideal hit ratio {:.2} %), {} bytes per block ({})",
        stats.requests,
        stats.total_blocks,
        stats.unique_blocks,
        stats.ideal_hit_ratio * 100.0,
        model.block_bytes(tutti_bench::trace::BLOCK_TOKENS),
        model.name
    );
    eprintln!("tutti-bench: the runtime replay is not wired in yet");
    ExitCode::SUCCESS
}
