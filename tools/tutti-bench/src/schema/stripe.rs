//! `stripe`: striped bandwidth per drive count.

use serde::{Deserialize, Serialize};

/// The fields of a `stripe` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StripeResult {
    /// `cpu` (a CPU thread submits, data in host memory) or `gpu` (GPU
    /// threads submit, data in GPU memory).
    pub execution: String,
    /// Writes (`true`) or reads.
    pub write: bool,
    /// Bytes per request, KiB.
    pub request_kib: u64,
    /// Requests per batch (two batches in flight).
    pub batch: u64,
    /// The timing model's bandwidth per drive, MB/s (10^6 bytes/s).
    pub drive_mb_s: u64,
    /// The timing model's latency per command, microseconds.
    pub latency_us: u64,
    /// The timing model's commands per second per drive (0: unlimited).
    pub drive_iops: u64,
    /// One point per drive count, 1 upwards.
    pub points: Vec<StripePoint>,
}

/// One drive count's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StripePoint {
    /// Drives striped over.
    pub drives: usize,
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// `bytes / seconds`, GB/s (10^9 bytes/s).
    pub gb_s: f64,
    /// `gb_s` over the one-drive point's.
    pub speedup_vs_one: f64,
    /// The timing model's limit: drives x `drive_mb_s`, GB/s.
    pub modelled_gb_s: f64,
    /// `gb_s` / `modelled_gb_s`.
    pub of_modelled: f64,
    /// CPU seconds of the application's threads (all but the emulator's
    /// controller threads) per GB moved.
    pub app_cpu_s_per_gb: f64,
}

/// The fields of a `stripe-daemon` document (`stripe --daemon`): the
/// runtime owning the emulated drives against the runtime as a tuttid
/// client of the same drives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StripeDaemonResult {
    /// Writes (`true`) or reads.
    pub write: bool,
    /// Bytes per request, KiB.
    pub request_kib: u64,
    /// Requests per batch (two batches in flight).
    pub batch: u64,
    /// The timing model's bandwidth per drive, MB/s.
    pub drive_mb_s: u64,
    /// The timing model's latency per command, microseconds.
    pub latency_us: u64,
    /// The daemon's drives used mediated submission.
    pub mediated: bool,
    /// Runs of each path per drive count.
    pub repeat: u32,
    /// One point per drive count, 1 upwards.
    pub points: Vec<StripeDaemonPoint>,
}

/// One drive count of `stripe --daemon`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StripeDaemonPoint {
    /// Drives striped over.
    pub drives: usize,
    /// The runtime owning the emulated drives, GB/s: median of the runs.
    pub owner_gb_s: f64,
    /// The runtime as a tuttid client on the same drives, GB/s: median.
    pub client_gb_s: f64,
    /// `client_gb_s` / `owner_gb_s`.
    pub ratio: f64,
    /// Every run of the owner, in the order measured (alternating).
    pub owner_runs: Vec<f64>,
    /// Every run of the client, likewise.
    pub client_runs: Vec<f64>,
    /// The timing model's limit: drives x `drive_mb_s`, GB/s.
    pub modelled_gb_s: f64,
}
