//! The `--json` documents, as Rust types (docs/benchmarks.md, "JSON
//! output").
//!
//! Every document is one JSON object: `schema_version`, `bench` (which
//! benchmark wrote it), `run` ([`RunInfo`]: command line, version, machine,
//! commit, time), and that benchmark's own fields beside them
//! ([`Document::result`] is flattened). The types here are what `report`
//! and the plots read; `tests/schema.rs` runs each benchmark on the CPU and
//! checks that its output parses into them and serializes back to the same
//! JSON, so a field added, renamed or dropped on one side fails a test.

pub mod gpu_rate;
pub mod kv;
pub mod rate;
pub mod run;
pub mod stripe;
pub mod ttft;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

pub use gpu_rate::GpuRateResult;
pub use kv::{KvPass, KvResult};
pub use rate::{RateComparison, RateRun};
pub use run::RunInfo;
pub use stripe::{StripeDaemonPoint, StripeDaemonResult, StripePoint, StripeResult};
pub use ttft::{TtftReport, TtftRun, TtftVariant};

use crate::report::Summary;

/// The version of the document layout; bumped when a field changes meaning
/// or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// One `--json` document: the run's facts and one benchmark's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document<T> {
    /// [`SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// The benchmark: `replay`, `stripe`, `stripe-daemon`, `rate`,
    /// `rate-compare`, `kv` or `gpu-rate`.
    pub bench: String,
    /// Where and when it ran.
    pub run: RunInfo,
    /// The benchmark's fields, at the top level of the object.
    #[serde(flatten)]
    pub result: T,
}

impl<T: Serialize> Document<T> {
    /// `result` of benchmark `bench`, stamped with this process's
    /// [`RunInfo::process`].
    pub fn new(bench: &str, result: T) -> Self {
        Self { schema_version: SCHEMA_VERSION, bench: bench.into(), run: RunInfo::process().clone(), result }
    }

    /// Pretty-printed JSON (non-finite floats become `null`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// A document of any benchmark that has a typed result, read back.
#[derive(Debug, Clone, PartialEq)]
pub enum AnyDocument {
    /// `replay`.
    Replay(Box<Document<Summary>>),
    /// `stripe` (not `--daemon`).
    Stripe(Document<StripeResult>),
    /// `stripe --daemon`.
    StripeDaemon(Document<StripeDaemonResult>),
    /// `rate` (one path).
    Rate(Document<RateRun>),
    /// `rate --compare`.
    RateCompare(Document<RateComparison>),
    /// `kv`.
    Kv(Document<KvResult>),
    /// `gpu-rate`.
    GpuRate(Document<GpuRateResult>),
    /// A `crates/python/bench/ttft.py` report (no `run` of its own).
    Ttft(Box<TtftReport>),
}

/// Why a document could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Not JSON, or not of its benchmark's layout.
    #[error("not a tutti-bench document")]
    Json(#[from] serde_json::Error),
    /// A `bench` this build has no type for.
    #[error("benchmark {bench:?} has no typed result")]
    Untyped {
        /// The document's `bench`.
        bench: String,
    },
}

impl AnyDocument {
    /// Parses one document by its `bench` field.
    pub fn parse(text: &str) -> Result<Self, ReadError> {
        let v: serde_json::Value = serde_json::from_str(text)?;
        Self::from_value(v)
    }

    /// The same from a parsed value.
    pub fn from_value(v: serde_json::Value) -> Result<Self, ReadError> {
        fn doc<T: DeserializeOwned>(v: serde_json::Value) -> Result<Document<T>, ReadError> {
            Ok(serde_json::from_value(v)?)
        }
        if v.get("bench").is_none() && TtftReport::is_one(&v) {
            return Ok(Self::Ttft(Box::new(serde_json::from_value(v)?)));
        }
        let bench = v.get("bench").and_then(|b| b.as_str()).unwrap_or("").to_string();
        Ok(match bench.as_str() {
            "replay" => Self::Replay(Box::new(doc(v)?)),
            "stripe" => Self::Stripe(doc(v)?),
            "stripe-daemon" => Self::StripeDaemon(doc(v)?),
            "rate" => Self::Rate(doc(v)?),
            "rate-compare" => Self::RateCompare(doc(v)?),
            "kv" => Self::Kv(doc(v)?),
            "gpu-rate" => Self::GpuRate(doc(v)?),
            _ => return Err(ReadError::Untyped { bench }),
        })
    }

    /// The document as JSON again (for the round-trip check).
    pub fn to_value(&self) -> serde_json::Value {
        let v = match self {
            Self::Replay(d) => serde_json::to_value(d),
            Self::Stripe(d) => serde_json::to_value(d),
            Self::StripeDaemon(d) => serde_json::to_value(d),
            Self::Rate(d) => serde_json::to_value(d),
            Self::RateCompare(d) => serde_json::to_value(d),
            Self::Kv(d) => serde_json::to_value(d),
            Self::GpuRate(d) => serde_json::to_value(d),
            Self::Ttft(d) => serde_json::to_value(d),
        };
        v.unwrap_or_default()
    }

    /// The run's facts (`None` for a ttft.py report, which has its own
    /// `config`).
    pub fn run(&self) -> Option<&RunInfo> {
        Some(match self {
            Self::Replay(d) => &d.run,
            Self::Stripe(d) => &d.run,
            Self::StripeDaemon(d) => &d.run,
            Self::Rate(d) => &d.run,
            Self::RateCompare(d) => &d.run,
            Self::Kv(d) => &d.run,
            Self::GpuRate(d) => &d.run,
            Self::Ttft(_) => return None,
        })
    }

    /// The benchmark's name.
    pub fn bench(&self) -> &str {
        match self {
            Self::Replay(d) => &d.bench,
            Self::Stripe(d) => &d.bench,
            Self::StripeDaemon(d) => &d.bench,
            Self::Rate(d) => &d.bench,
            Self::RateCompare(d) => &d.bench,
            Self::Kv(d) => &d.bench,
            Self::GpuRate(d) => &d.bench,
            Self::Ttft(_) => "ttft",
        }
    }
}
