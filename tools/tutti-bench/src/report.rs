//! The run summary and the load-latency histogram.
//!
//! Units: sizes in bytes, durations in seconds (`f64`) or microseconds
//! (latencies, `u64`), bandwidth in GB/s with **GB = 10^9 bytes**.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Bytes per GB in every bandwidth figure (decimal, 10^9).
pub const BYTES_PER_GB: f64 = 1e9;

/// Highest latency the recorder tracks exactly, in microseconds (one hour);
/// longer samples are recorded as this value.
pub const MAX_TRACKED_US: u64 = 3_600 * 1_000_000;

/// A latency histogram in microseconds (3 significant figures, 1 µs to
/// [`MAX_TRACKED_US`]). Recording never panics: out-of-range samples
/// saturate at the bound.
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    hist: Histogram<u64>,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        // Bounds are valid constants (low >= 1, high >= 2 * low, sigfig <= 5),
        // so construction cannot fail.
        let hist = Histogram::new_with_bounds(1, MAX_TRACKED_US, 3)
            .unwrap_or_else(|e| unreachable!("valid histogram bounds: {e}"));
        Self { hist }
    }

    /// Records one sample in microseconds (saturating).
    pub fn record_us(&mut self, us: u64) {
        self.hist.saturating_record(us);
    }

    /// Records one sample (truncated to whole microseconds, saturating).
    pub fn record(&mut self, d: Duration) {
        self.record_us(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    /// Adds all samples of `other`.
    pub fn merge(&mut self, other: &LatencyRecorder) {
        // Same bounds on both sides, so adding cannot go out of range.
        let _ = self.hist.add(&other.hist);
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    /// Whether no sample was recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// The value at `quantile` (0.0..=1.0) in microseconds, 0 when empty.
    pub fn quantile_us(&self, quantile: f64) -> u64 {
        if self.hist.is_empty() {
            0
        } else {
            // NaN and negatives count as 0.0.
            let q = if quantile >= 0.0 { quantile.min(1.0) } else { 0.0 };
            self.hist.value_at_quantile(q)
        }
    }

    /// Median in microseconds (0 when empty).
    pub fn p50_us(&self) -> u64 {
        self.quantile_us(0.50)
    }

    /// 99th percentile in microseconds (0 when empty).
    pub fn p99_us(&self) -> u64 {
        self.quantile_us(0.99)
    }

    /// Largest sample in microseconds (0 when empty; within the histogram's
    /// 3-significant-figure precision).
    pub fn max_us(&self) -> u64 {
        if self.hist.is_empty() {
            0
        } else {
            self.hist.max()
        }
    }

    /// The underlying histogram (values in microseconds).
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }
}

/// Bandwidth in GB/s (10^9 bytes per second); 0 when `seconds <= 0`.
pub fn gb_per_s(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / BYTES_PER_GB / seconds
    } else {
        0.0
    }
}

/// `loaded / (loaded + saved)`; 0 when both are 0.
pub fn hit_ratio(loaded: u64, saved: u64) -> f64 {
    ratio(loaded, loaded + saved)
}

/// `part / whole`; 0 when `whole` is 0.
pub fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The quantiles of [`Summary::load_latency_cdf`].
pub const CDF_QUANTILES: [f64; 17] =
    [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0];

/// One point of a latency distribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CdfPoint {
    /// Share of the samples at or below `us` (0.0..=1.0).
    pub quantile: f64,
    /// Microseconds.
    pub us: u64,
}

/// Points in [`Summary::timeline`] for a run of many requests.
pub const TIMELINE_POINTS: usize = 20;

/// The run after some of its requests.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Requests replayed so far.
    pub requests: u64,
    /// Wall-clock seconds since the replay started.
    pub elapsed_seconds: f64,
    /// `hit_ratio` of the requests so far.
    pub hit_ratio: f64,
    /// Save GB/s within this step (bytes saved over save seconds since the
    /// previous point; 0 when nothing was saved).
    pub save_gb_s: f64,
    /// Load GB/s within this step, likewise.
    pub load_gb_s: f64,
}

/// Builds [`Summary::timeline`]: call [`Timeline::observe`] after each
/// request; it samples every `step` requests and at the end.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    step: u64,
    last: Summary,
    points: Vec<TimelinePoint>,
}

impl Timeline {
    /// A timeline of a run of `requests` requests.
    pub fn new(requests: usize) -> Self {
        let step = (requests / TIMELINE_POINTS).max(1) as u64;
        Self { step, ..Self::default() }
    }

    /// Samples `s` if a step ended (or `last`, the final request).
    pub fn observe(&mut self, s: &Summary, elapsed_seconds: f64, last: bool) {
        if s.requests == 0
            || (!s.requests.is_multiple_of(self.step) && !last)
            || s.requests == self.last.requests
        {
            return;
        }
        let p = &self.last;
        self.points.push(TimelinePoint {
            requests: s.requests,
            elapsed_seconds,
            hit_ratio: hit_ratio(s.blocks_loaded, s.blocks_saved),
            save_gb_s: gb_per_s(s.bytes_saved - p.bytes_saved, s.save_seconds - p.save_seconds),
            load_gb_s: gb_per_s(s.bytes_loaded - p.bytes_loaded, s.load_seconds - p.load_seconds),
        });
        self.last = s.clone();
    }

    /// The points so far.
    pub fn into_points(self) -> Vec<TimelinePoint> {
        self.points
    }
}

/// The summary of one benchmark run.
///
/// Build it with `Summary { .., ..Default::default() }`, then call
/// [`Summary::set_load_latency`] and [`Summary::finish`] to fill the derived
/// fields. Serializes to JSON with the field names below.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Model preset name (e.g. `llama-3.1-8b`).
    pub model: String,
    /// Tokens per KV block.
    pub block_tokens: u32,
    /// Bytes per KV block.
    pub block_bytes: u64,
    /// The drives the store spans (names or PCI addresses), in stripe order.
    pub drives: Vec<String>,
    /// Who submitted the NVMe commands and where the blocks lived: `cpu`
    /// (host memory) or `gpu` (GPU threads, blocks in GPU memory).
    #[serde(default)]
    pub execution: String,
    /// Requests replayed.
    pub requests: u64,
    /// Blocks written to the store (after the prefix a request found).
    pub blocks_saved: u64,
    /// Blocks read from the store (the prefix each request found).
    pub blocks_loaded: u64,
    /// Blocks not saved because the store was full of blocks in use
    /// (tutti-kv answered `Full`).
    pub blocks_uncacheable: u64,
    /// `blocks_loaded / (blocks_loaded + blocks_saved)`.
    pub hit_ratio: f64,
    /// Directory of the file-backed drives (`--persist`); `None` for RAM
    /// drives or `--config`.
    #[serde(default)]
    pub persist_dir: Option<String>,
    /// Objects the store held when it was opened (saved by earlier runs).
    #[serde(default)]
    pub store_objects_at_open: u64,
    /// Distinct blocks this run looked up (see [`crate::restart`]).
    #[serde(default)]
    pub restart_lookups: u64,
    /// Of those, blocks loaded at their first lookup: saved by an earlier
    /// run.
    #[serde(default)]
    pub restart_hits: u64,
    /// `restart_hits / restart_lookups` (0 when nothing was looked up).
    #[serde(default)]
    pub restart_hit_ratio: f64,
    /// Objects the store evicted to make room during the run.
    #[serde(default)]
    pub store_evictions: u64,
    /// Bytes written.
    pub bytes_saved: u64,
    /// Bytes read.
    pub bytes_loaded: u64,
    /// Seconds spent in saves (summed over batches).
    pub save_seconds: f64,
    /// Seconds spent in loads (summed over batches): each batch's `get`
    /// and `wait_get`, without the benchmark's own poisoning of the
    /// destination before and verification after (until 2026-12-01 they
    /// were counted; for GPU memory they are two pageable CUDA copies).
    pub load_seconds: f64,
    /// `bytes_saved / save_seconds` in GB/s (10^9 bytes/s).
    pub save_gb_s: f64,
    /// `bytes_loaded / load_seconds` in GB/s (10^9 bytes/s).
    pub load_gb_s: f64,
    /// Median block-load latency (a request's loads, as `load_seconds`
    /// counts them), microseconds.
    pub load_latency_p50_us: u64,
    /// 99th-percentile block-load latency, microseconds.
    pub load_latency_p99_us: u64,
    /// Largest block-load latency, microseconds.
    pub load_latency_max_us: u64,
    /// The block-load latency distribution: microseconds at the quantiles
    /// of [`CDF_QUANTILES`] (empty when nothing was loaded).
    #[serde(default)]
    pub load_latency_cdf: Vec<CdfPoint>,
    /// The run in about [`TIMELINE_POINTS`] steps of requests (empty for
    /// none): hit ratio so far, save and load GB/s within each step.
    #[serde(default)]
    pub timeline: Vec<TimelinePoint>,
    /// Loaded blocks whose contents were checked against their pattern.
    pub blocks_verified: u64,
    /// Wall-clock duration of the whole replay, seconds.
    pub elapsed_seconds: f64,
}

impl Summary {
    /// Copies p50/p99/max from `latency` (microseconds).
    pub fn set_load_latency(&mut self, latency: &LatencyRecorder) {
        self.load_latency_p50_us = latency.p50_us();
        self.load_latency_p99_us = latency.p99_us();
        self.load_latency_max_us = latency.max_us();
        self.load_latency_cdf = if latency.is_empty() {
            Vec::new()
        } else {
            CDF_QUANTILES.iter().map(|&q| CdfPoint { quantile: q, us: latency.quantile_us(q) }).collect()
        };
    }

    /// Recomputes the derived fields: `hit_ratio`, `save_gb_s`, `load_gb_s`.
    pub fn finish(&mut self) {
        self.hit_ratio = hit_ratio(self.blocks_loaded, self.blocks_saved);
        self.restart_hit_ratio = ratio(self.restart_hits, self.restart_lookups);
        self.save_gb_s = gb_per_s(self.bytes_saved, self.save_seconds);
        self.load_gb_s = gb_per_s(self.bytes_loaded, self.load_seconds);
    }

    /// The summary as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain numbers and strings cannot fail (non-finite
        // floats become `null`).
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A human-readable, aligned table (GB = 10^9 bytes, MiB = 2^20 bytes).
    pub fn render_text(&self) -> String {
        let drives = if self.drives.is_empty() {
            "0".to_string()
        } else {
            format!("{} ({})", self.drives.len(), self.drives.join(", "))
        };
        let rows: [(&str, String); 17] = [
            ("model", self.model.clone()),
            (
                "block",
                format!(
                    "{} tokens, {} bytes ({:.2} MiB)",
                    self.block_tokens,
                    self.block_bytes,
                    self.block_bytes as f64 / (1u64 << 20) as f64
                ),
            ),
            ("drives", drives),
            (
                "execution",
                match self.execution.as_str() {
                    "gpu" => "GPU threads submit, blocks in GPU memory".to_string(),
                    _ => "CPU thread submits, blocks in host memory".to_string(),
                },
            ),
            ("requests", self.requests.to_string()),
            ("blocks saved", self.blocks_saved.to_string()),
            ("blocks loaded", self.blocks_loaded.to_string()),
            ("blocks uncacheable", self.blocks_uncacheable.to_string()),
            ("hit ratio", format!("{:.2} %", self.hit_ratio * 100.0)),
            (
                "store",
                format!(
                    "{} ({} objects at open, {} evicted)",
                    self.persist_dir.as_deref().unwrap_or("RAM drives, not persisted"),
                    self.store_objects_at_open,
                    self.store_evictions
                ),
            ),
            (
                "restart hit ratio",
                format!(
                    "{:.2} % ({} of {} distinct blocks loaded at first lookup)",
                    self.restart_hit_ratio * 100.0,
                    self.restart_hits,
                    self.restart_lookups
                ),
            ),
            (
                "save",
                format!(
                    "{:.2} GB in {:.3} s = {:.2} GB/s",
                    self.bytes_saved as f64 / BYTES_PER_GB,
                    self.save_seconds,
                    self.save_gb_s
                ),
            ),
            (
                "load",
                format!(
                    "{:.2} GB in {:.3} s = {:.2} GB/s",
                    self.bytes_loaded as f64 / BYTES_PER_GB,
                    self.load_seconds,
                    self.load_gb_s
                ),
            ),
            (
                "load latency (us)",
                format!(
                    "p50 {}  p99 {}  max {}",
                    self.load_latency_p50_us, self.load_latency_p99_us, self.load_latency_max_us
                ),
            ),
            ("blocks verified", format!("{} of {} loaded", self.blocks_verified, self.blocks_loaded)),
            ("elapsed", format!("{:.3} s", self.elapsed_seconds)),
            ("units", "GB = 10^9 bytes, MiB = 2^20 bytes".to_string()),
        ];
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 2;
        let mut out = String::from("tutti-bench summary\n");
        for (k, v) in rows {
            let _ = writeln!(out, "  {k:<width$}{v}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Summary {
        let mut s = Summary {
            model: "llama-3.1-8b".into(),
            block_tokens: 512,
            block_bytes: 64 << 20,
            drives: vec!["0000:01:00.0".into(), "0000:02:00.0".into()],
            requests: 400,
            blocks_saved: 300,
            blocks_loaded: 700,
            blocks_uncacheable: 2,
            bytes_saved: 300 * (64 << 20),
            bytes_loaded: 700 * (64 << 20),
            save_seconds: 2.0,
            load_seconds: 4.0,
            blocks_verified: 700,
            elapsed_seconds: 7.5,
            persist_dir: Some("/tmp/kv".into()),
            store_objects_at_open: 80,
            restart_lookups: 500,
            restart_hits: 125,
            ..Default::default()
        };
        let mut lat = LatencyRecorder::new();
        for us in 1..=1000 {
            lat.record_us(us);
        }
        s.set_load_latency(&lat);
        s.finish();
        s
    }

    #[test]
    fn derived_fields() {
        let s = sample();
        assert!((s.hit_ratio - 0.7).abs() < 1e-12);
        assert!((s.restart_hit_ratio - 0.25).abs() < 1e-12);
        assert!((s.save_gb_s - 300.0 * 67_108_864.0 / 1e9 / 2.0).abs() < 1e-9);
        assert!((s.load_gb_s - 700.0 * 67_108_864.0 / 1e9 / 4.0).abs() < 1e-9);
        assert_eq!(s.load_latency_p50_us, 500);
        assert!((985..=995).contains(&s.load_latency_p99_us));
        assert!((999..=1001).contains(&s.load_latency_max_us));
        assert_eq!(hit_ratio(0, 0), 0.0);
        assert_eq!(gb_per_s(100, 0.0), 0.0);
    }

    #[test]
    fn text_has_key_fields() {
        let t = sample().render_text();
        for needle in [
            "llama-3.1-8b",
            "512 tokens, 67108864 bytes (64.00 MiB)",
            "0000:02:00.0",
            "requests",
            "400",
            "hit ratio",
            "70.00 %",
            "10.07 GB/s",
            "11.74 GB/s",
            "p50 500",
            "700 of 700 loaded",
            "/tmp/kv (80 objects at open",
            "25.00 % (125 of 500 distinct blocks",
            "GB = 10^9 bytes",
        ] {
            assert!(t.contains(needle), "missing {needle:?} in\n{t}");
        }
        // Aligned: every value starts at the same column.
        let cols: Vec<usize> = t
            .lines()
            .skip(1)
            .map(|l| {
                let gap = 2 + l[2..].find("  ").unwrap();
                gap + l[gap..].find(|c: char| c != ' ').unwrap()
            })
            .collect();
        assert_eq!(cols.len(), 17);
        assert!(cols.iter().all(|&c| c == cols[0]), "{t}");
    }

    #[test]
    fn json_round_trip() {
        let s = sample();
        let json = s.to_json();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["model"], "llama-3.1-8b");
        assert_eq!(v["requests"], 400);
        assert_eq!(v["blocks_loaded"], 700);
        assert_eq!(v["block_bytes"], 64u64 << 20);
        assert_eq!(v["drives"][1], "0000:02:00.0");
        assert_eq!(v["load_latency_p50_us"], 500);
        assert!((v["hit_ratio"].as_f64().unwrap() - 0.7).abs() < 1e-12);
        assert!((v["restart_hit_ratio"].as_f64().unwrap() - 0.25).abs() < 1e-12);
        assert_eq!(v["persist_dir"], "/tmp/kv");
        let back: Summary = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn timeline_samples_every_step_and_the_end() {
        let mut t = Timeline::new(45); // step 2 (45 / 20)
        let mut s = Summary::default();
        for i in 1..=45u64 {
            s.requests = i;
            s.blocks_loaded += 1;
            s.blocks_saved += i % 2;
            s.bytes_loaded += 1_000_000;
            s.load_seconds += 0.001;
            t.observe(&s, i as f64, i == 45);
        }
        let p = t.into_points();
        assert_eq!(p.len(), 23, "{p:?}"); // 2, 4, ..., 44, then 45
        assert_eq!((p[0].requests, p[21].requests, p[22].requests), (2, 44, 45));
        assert!((p[0].hit_ratio - 2.0 / 3.0).abs() < 1e-12);
        assert!(p.iter().all(|x| (x.load_gb_s - 1.0).abs() < 1e-6 && x.save_gb_s == 0.0), "{p:?}");
        // The same request observed twice (a stop after the last step) adds
        // nothing.
        let mut t = Timeline::new(2);
        s.requests = 1;
        t.observe(&s, 1.0, true);
        t.observe(&s, 1.0, true);
        assert_eq!(t.into_points().len(), 1);
    }

    #[test]
    fn cdf_follows_the_recorder() {
        let s = sample();
        assert_eq!(s.load_latency_cdf.len(), CDF_QUANTILES.len());
        assert_eq!(s.load_latency_cdf[7], CdfPoint { quantile: 0.5, us: 500 });
        assert!(s.load_latency_cdf.windows(2).all(|w| w[0].us <= w[1].us));
        let mut empty = Summary::default();
        empty.set_load_latency(&LatencyRecorder::new());
        assert!(empty.load_latency_cdf.is_empty());
    }

    #[test]
    fn recorder_never_panics() {
        let mut r = LatencyRecorder::new();
        assert!(r.is_empty());
        assert_eq!((r.p50_us(), r.p99_us(), r.max_us()), (0, 0, 0));
        r.record_us(0);
        r.record_us(u64::MAX);
        r.record(Duration::MAX);
        r.record(Duration::from_micros(250));
        assert_eq!(r.len(), 4);
        assert!(r.max_us() >= MAX_TRACKED_US - MAX_TRACKED_US / 1000);
        let mut other = LatencyRecorder::new();
        other.record_us(10);
        r.merge(&other);
        assert_eq!(r.len(), 5);
        assert_eq!(r.quantile_us(f64::NAN), r.quantile_us(0.0));
        assert_eq!(r.quantile_us(7.0), r.quantile_us(1.0));
    }
}
