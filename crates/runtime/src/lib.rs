//! tutti: kernel-bypass NVMe I/O runtime for LLM KV-cache offload.
//!
//! The API is [`Runtime::open`] / [`Runtime::open_batch`],
//! [`Runtime::register_memory`], [`Runtime::submit`], [`Runtime::wait`],
//! [`Runtime::close`] and [`Runtime::shutdown`] on a runtime assembled from
//! a [`Config`]: drives (resources), resolvers (URI key -> byte extent),
//! datapaths (byte requests -> NVMe commands) and stores joining one
//! resolver to one datapath. Every object the runtime hands out is named by
//! an opaque, generation-checked handle ([`TargetHandle`], [`MemoryHandle`],
//! [`OpHandle`]); a stale, foreign or forged handle is an error.
//!
//! Units: bytes everywhere in this API. Logical blocks exist only below it
//! (`nvm-queue`).
//!
//! Execution: a datapath's commands are submitted by CPU threads (the
//! caller's, in `submit`, with completions polled in `wait`) or, with
//! `execution: gpu`, by GPU threads: one `submit` is one kernel launch for
//! the batch (`gpu-io`, docs/gpu.md). GPU memory is registered with
//! [`Runtime::register_gpu_memory`].
//!
//! ```no_run
//! use std::time::Duration;
//! use tutti::{Config, Request, Runtime};
//!
//! let rt = Runtime::from_config(Config::builtin_striped_ram(4, 256 << 20, 1 << 20))?;
//! let target = rt.open("tutti://kv/7")?;
//! let mut buf = vec![0u8; 1 << 20];
//! // SAFETY: `buf` outlives the registration and is not touched while I/O runs.
//! let mem = unsafe { rt.register_memory(buf.as_mut_ptr(), buf.len())? };
//! let sub = rt.submit(&[Request::write(target, 0, 1 << 20, mem, 0)]);
//! let statuses = rt.wait(sub.op().expect("accepted"), Duration::from_secs(5))?;
//! assert!(statuses.iter().all(|s| s.is_success()));
//! rt.unregister_memory(mem)?;
//! # Ok::<(), tutti::Error>(())
//! ```

// Unsafe is allowed for one purpose: handing caller memory to devices for
// DMA. Two sites, both in `runtime/memory.rs`: `Runtime::register_memory`
// forwards its contract to `NvmeDevice::dma_map`, and
// `Runtime::register_gpu_memory` forwards its contract to
// `GpuBuffer::from_raw` (a device pointer the caller owns). Everything else
// in this crate is safe code.
#![allow(unsafe_code)]

mod binding;
pub mod config;
mod datapath;
mod drive;
mod error;
pub mod handle;
mod region;
mod request;
mod resolver;
mod runtime;

pub use binding::ResolveError;
pub use config::Config;
pub use drive::emulator_config;
pub use error::{Alignment, Error, RequestError, RequestStatus, SubmitFailure, UriError};
pub use handle::{HandleError, MemoryHandle, OpHandle, TargetHandle};
pub use nvme_regs::Status as NvmeStatus;
pub use request::{Direction, Request, Submission};
pub use runtime::{
    error_chain, Runtime, RuntimeStats, ShutdownHookId, ShutdownReport, StoreInfo, ABORT_REAP_BOUND,
    GPU_COMMAND_BUDGET, HEALTH_CHECK_INTERVAL, MAX_BATCH, SUBMIT_RETRY_BOUND, URI_SCHEME,
};
pub use tuttid_proto::SharedMemory;
