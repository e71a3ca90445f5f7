//! `rate`: commands per second of one submitting thread.

use serde::{Deserialize, Serialize};

/// One run of one path; the fields of a `rate` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateRun {
    /// `queue pair`, `runtime API` or `runtime API on tuttid`.
    pub path: String,
    /// Commands completed.
    pub commands: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// `commands / seconds`.
    pub commands_per_second: f64,
    /// I/O queue entries.
    pub queue_depth: u32,
    /// Commands per doorbell write or per submit call.
    pub batch: u32,
    /// Completions with an unknown or stale command ID.
    pub protocol_errors: u64,
    /// SQ tail doorbell writes.
    pub sq_doorbell_writes: u64,
}

/// The fields of a `rate-compare` document (`rate --compare`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateComparison {
    /// The baseline's runs (the queue pair; with `--daemon`, the runtime
    /// owning the drive), in the order measured.
    pub queue_pair: Vec<RateRun>,
    /// The runtime's runs, alternating with the baseline's.
    pub runtime: Vec<RateRun>,
    /// Median runtime rate / median baseline rate.
    pub median_ratio: f64,
    /// Best runtime rate / best baseline rate.
    pub best_ratio: f64,
}
