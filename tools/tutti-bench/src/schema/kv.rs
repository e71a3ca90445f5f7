//! `kv`: tutti-kv against raw runtime I/O, and recovery time.

use serde::{Deserialize, Serialize};

/// One pass of one path, GB/s (10^9 bytes per second).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct KvPass {
    /// Writes (raw) or puts (store), GB/s.
    pub write_gbps: f64,
    /// Reads (raw) or gets (store), GB/s.
    pub read_gbps: f64,
}

/// The fields of a `kv` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvResult {
    /// Emulated RAM drives.
    pub drives: u64,
    /// Bytes per object (slot).
    pub object_bytes: u64,
    /// Objects per pass.
    pub objects: u64,
    /// Objects per call.
    pub batch: usize,
    /// Raw runtime I/O, one entry per pass.
    pub raw: Vec<KvPass>,
    /// tutti-kv, one entry per pass.
    pub store: Vec<KvPass>,
    /// Store median put GB/s over raw median write GB/s.
    pub put_ratio: f64,
    /// Store median get GB/s over raw median read GB/s.
    pub get_ratio: f64,
    /// `[objects, seconds]` per recovery run.
    pub recovery: Vec<(u64, f64)>,
}

/// The median of `v` as `kv` reports it: the upper middle for an even
/// count (0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

impl KvResult {
    /// Median of `f` over `passes`.
    pub fn median_of(passes: &[KvPass], f: fn(&KvPass) -> f64) -> f64 {
        median(passes.iter().map(f).collect())
    }
}
