//! Workload logic for `tutti-bench`, the KV-cache offload benchmark.
//!
//! The benchmark replays an LLM serving workload against the `tutti` runtime:
//! every request's prompt is a list of 512-token KV-cache blocks (hash ids);
//! the prefix of them found in the tutti-kv store is *loaded* from NVMe, the
//! rest is *saved*. This library holds everything that does not touch the
//! runtime:
//!
//! - [`trace`]: reading Mooncake JSONL traces ([`trace::read_trace`]);
//! - [`synthetic`]: a seeded Mooncake-like workload generator;
//! - [`model`]: KV geometry presets (bytes per token / per block);
//! - [`blockkey`]: a block's tutti-kv key (hash id, model geometry, trace)
//!   and the pattern version it is saved with;
//! - [`pattern`]: deterministic block contents and their verification;
//! - [`restart`]: the restart hit ratio of a run on a persisted store;
//! - [`report`]: the run summary and the load-latency histogram;
//! - [`schema`]: the `--json` documents as types (run facts and results);
//! - [`plot`]: SVG charts of those documents;
//! - [`page`]: one self-contained HTML page of a set of documents.
#![forbid(unsafe_code)]

pub mod blockkey;
pub mod model;
pub mod page;
pub mod pattern;
pub mod plot;
pub mod report;
pub mod restart;
pub mod schema;
pub mod synthetic;
pub mod trace;

pub use blockkey::{pattern_version, BlockKeys};
pub use model::{preset, ModelGeometry, PRESETS};
pub use pattern::{fill_block, verify_block, Mismatch};
pub use report::{LatencyRecorder, Summary};
pub use restart::RestartHits;
pub use synthetic::synthetic_trace;
pub use trace::{parse_trace_line, read_trace, TraceError, TraceRequest, TraceStats};
