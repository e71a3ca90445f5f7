//! tutti: kernel-bypass NVMe I/O runtime for LLM KV-cache offload.
//!
//! The public API is `open`, `open_batch`, `register_memory`, `submit`,
//! `wait`, `close` and `shutdown` on a runtime assembled from a [`config::Config`]
//! (drives, resolvers, datapaths and stores). Every object the runtime hands
//! out is named by an opaque, generation-checked handle ([`handle`]).
//! See `docs/architecture.md` for the contracts between the crates.

pub mod config;
pub mod handle;
