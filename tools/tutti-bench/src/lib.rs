//! Workload logic for `tutti-bench`, the KV-cache offload benchmark.
//!
//! The benchmark replays an LLM serving workload against the `tutti` runtime:
//! every request's prompt is a list of 512-token KV-cache blocks (hash ids);
//! a block seen before is *loaded* from NVMe, a new one is *saved*. This
//! library holds everything that does not touch the runtime:
//!
//! - [`trace`]: reading Mooncake JSONL traces ([`trace::read_trace`]);
//! - [`synthetic`]: a seeded Mooncake-like workload generator;
//! - [`model`]: KV geometry presets (bytes per token / per block);
//! - [`cache`]: the block-cache index (hash id -> slot, LRU eviction);
//! - [`pattern`]: deterministic block contents and their verification;
//! - [`report`]: the run summary and the load-latency histogram.
#![forbid(unsafe_code)]

pub mod cache;
pub mod model;
pub mod pattern;
pub mod report;
pub mod synthetic;
pub mod trace;

pub use cache::{BlockCache, Insert, Slot, Uncacheable};
pub use model::{preset, ModelGeometry, PRESETS};
pub use pattern::{fill_block, verify_block, Mismatch};
pub use report::{LatencyRecorder, Summary};
pub use synthetic::synthetic_trace;
pub use trace::{parse_trace_line, read_trace, TraceError, TraceRequest, TraceStats};
