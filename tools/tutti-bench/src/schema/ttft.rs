//! `ttft`: the report `crates/python/bench/ttft.py` writes (`--out FILE`):
//! time to first token per prompt length and variant. Not a tutti-bench
//! document: it has no `schema_version`, `bench` or `run` (its `config`
//! names the machine and versions); `report` and `plot` know it by its
//! `config` and `runs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TtftReport {
    /// Model shape, GPU, versions, drives, repetitions (kept as written).
    pub config: Value,
    /// One entry per prompt length (tokens, as a string key).
    pub runs: BTreeMap<String, TtftRun>,
    /// Ratios and goals per prompt length (kept as written).
    #[serde(default)]
    pub ratios: Value,
    /// The store's counters at the end (kept as written).
    #[serde(default)]
    pub store_stats: Value,
}

/// One prompt length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TtftRun {
    /// Prompt tokens.
    pub tokens: u64,
    /// Tokens restored (or recomputed) before the rest of the prompt.
    pub prefix_tokens: u64,
    /// Tokens prefilled after the prefix.
    pub rest_tokens: u64,
    /// Variants by name (`recompute`, `tutti`, `pinned`, ...).
    pub variants: BTreeMap<String, TtftVariant>,
}

/// One variant at one prompt length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TtftVariant {
    /// `ok`, or why it did not finish (`timeout`, an error).
    pub status: String,
    /// Median time to first token, seconds.
    #[serde(default)]
    pub ttft_median_s: Option<f64>,
    /// Median restore of the prefix's KV, seconds.
    #[serde(default)]
    pub restore_median_s: Option<f64>,
    /// Median prefill of the rest of the prompt, seconds.
    #[serde(default)]
    pub rest_prefill_median_s: Option<f64>,
    /// Every other field, as written.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl TtftReport {
    /// Whether `v` looks like a ttft.py report (`config` and `runs` with
    /// `variants`).
    pub fn is_one(v: &Value) -> bool {
        v.get("config").is_some_and(Value::is_object)
            && v.get("runs")
                .and_then(Value::as_object)
                .is_some_and(|r| r.values().all(|x| x.get("variants").is_some()))
    }
}
