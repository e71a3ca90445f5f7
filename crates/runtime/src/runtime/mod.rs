//! The runtime: the public API (`open`, `open_batch`, `register_memory`,
//! `submit`, `wait`, `close`, `reset_drive`, `shutdown`), one file per
//! phase of a request's life:
//!
//! | file | owns |
//! | --- | --- |
//! | `assemble.rs` | `from_config`: drives, datapaths, resolvers, stores |
//! | `targets.rs` | `open` / `close`: URIs to target handles |
//! | `memory.rs` | `register_memory` / `unregister_memory`: DMA mappings |
//! | `plan.rs` | checking each request and planning its commands, once |
//! | `ops.rs` | per-operation accounting: each command leaves once |
//! | `submit.rs` | `submit`: CPU execution, one doorbell write per queue |
//! | `gpu.rs` | GPU execution: one kernel launch per batch |
//! | `completion.rs` | `wait` / `try_wait` / `reap`: CQEs to requests |
//! | `recovery.rs` | dead controllers and `reset_drive` |
//! | `shutdown.rs` | `shutdown`: drain, delete queues, CC.SHN |
//!
//! Locks (each file says which it takes): the targets and memory tables
//! (read/write locks), the operations table, each queue pair, each drive's
//! controller and health. A thread holds at most one of the tables and
//! queue pairs at a time; the exceptions are named where they happen
//! (the controller lock during reset and shutdown, a drive's health lock
//! — a leaf — under the operations table).

mod assemble;
mod completion;
mod gpu;
mod hooks;
mod lanes;
mod memory;
mod ops;
mod plan;
mod recovery;
mod shutdown;
mod submit;
mod targets;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use gpu_io::Gpu;

use crate::binding::{Extent, Resolver};
use crate::datapath::DataPath;
use crate::drive::Drive;
use crate::handle::HandleTable;
use crate::region::Region;
pub use completion::HEALTH_CHECK_INTERVAL;
pub use hooks::ShutdownHookId;
use ops::OpState;
pub use shutdown::ShutdownReport;

/// URI scheme of targets: `tutti://<store>/<key>`.
pub const URI_SCHEME: &str = "tutti://";

/// How long `submit` keeps retrying a full queue (reaping its completions
/// in between) before failing the rest of the batch on that queue with
/// [`crate::RequestStatus::SubmitFailed`].
pub const SUBMIT_RETRY_BOUND: Duration = Duration::from_secs(5);

/// Default bound on each GPU-executed command's wait for its completion
/// (the kernel reports TIMEOUT for that command when it passes);
/// [`Runtime::set_gpu_command_budget`] changes it per runtime.
pub const GPU_COMMAND_BUDGET: Duration = Duration::from_secs(10);

/// Requests per [`Runtime::submit`] call (the request index travels in 24
/// bits of each command's tag).
pub const MAX_BATCH: usize = 1 << 24;

/// How long [`Runtime::shutdown`] reaps a queue's completions after
/// deleting its SQ, for the commands the controller completes or aborts
/// ("Command Aborted due to SQ Deletion") on the way out.
pub const ABORT_REAP_BOUND: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Store {
    name: String,
    resolver: Box<dyn Resolver>,
    datapath: usize,
    slot_size: Option<u64>,
    /// Facts of its datapath that planning reads for every request, kept
    /// here so it makes no dynamic call for them.
    facts: DataPathFacts,
}

/// What planning needs of a datapath, per request.
#[derive(Debug, Clone, Copy)]
struct DataPathFacts {
    /// Logical block size requests must be aligned to, bytes.
    block_size: u32,
    /// Its drives are driven by GPU threads.
    gpu: bool,
    /// Runtime index of its drive when the layout is the identity on one
    /// drive (`local_nvme`).
    single_drive: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
struct Target {
    store: usize,
    extent: Extent,
}

/// Counters of a runtime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Commands written to submission queues (CPU execution).
    pub commands_submitted: u64,
    /// Completions matched to a command.
    pub commands_completed: u64,
    /// CQEs with an unknown or stale command ID (dropped, counted).
    pub protocol_errors: u64,
    /// Completions that arrived for an operation no longer waited on, or
    /// for a command that had already left its operation.
    pub late_completions: u64,
    /// SQ tail doorbell writes (CPU execution): one per queue per
    /// [`Runtime::submit`] call, more only when a queue filled up.
    pub sq_doorbell_writes: u64,
}

/// Facts about a store, for sizing a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreInfo {
    /// Store name.
    pub name: String,
    /// Bytes in the store's datapath space.
    pub capacity: u64,
    /// Logical block size requests must be aligned to, bytes.
    pub block_size: u32,
    /// Slot size for a `slab` resolver, bytes.
    pub slot_size: Option<u64>,
    /// Number of slots for a `slab` resolver.
    pub slots: Option<u64>,
    /// Drives of its datapath, in layout order.
    pub drives: Vec<String>,
    /// Whether any of its drives reports a volatile write cache (Identify
    /// Controller VWC bit 0): then a completed write is durable only after
    /// a flush ([`crate::Request::flush`]); without one it is durable when
    /// it completes.
    pub volatile_write_cache: bool,
}

/// The tutti runtime. `Send + Sync`: share it by reference or `Arc`.
#[derive(Debug)]
pub struct Runtime {
    drives: Vec<Arc<Drive>>,
    datapaths: Vec<Arc<dyn DataPath>>,
    stores: Vec<Store>,
    store_index: HashMap<String, usize>,
    targets: RwLock<HandleTable<Target>>,
    memory: RwLock<HandleTable<Arc<Region>>>,
    ops: Mutex<HandleTable<OpState>>,
    shutting_down: AtomicBool,
    shut_down: AtomicBool,
    /// Run at the start of the first shutdown ([`Runtime::on_shutdown`]).
    shutdown_hooks: hooks::ShutdownHooks,
    /// Set when `shutdown` has deleted every queue: no completion can come
    /// any more, so a wait returns at once instead of at its deadline.
    queues_gone: AtomicBool,
    /// Threads inside `submit`.
    submitters: AtomicUsize,
    /// Launch lanes (queues and streams of GPU-executed batches), when a
    /// datapath uses GPU execution; dropped before `gpu`.
    lanes: Option<lanes::GpuLanes>,
    /// The GPU, when a datapath uses GPU execution.
    gpu: Option<Arc<Gpu>>,
    /// The CUDA ordinal of `gpu` (config `gpu.ordinal`).
    gpu_ordinal: u32,
    /// Each GPU-executed command's budget, nanoseconds
    /// ([`Runtime::set_gpu_command_budget`]).
    gpu_budget_ns: AtomicU64,
    /// The longest budget ever set, nanoseconds (for shutdown).
    gpu_budget_max_ns: AtomicU64,
    late_completions: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Runtime {
    /// Facts about store `name`.
    pub fn store_info(&self, name: &str) -> Option<StoreInfo> {
        let s = &self.stores[*self.store_index.get(name)?];
        let dp = &self.datapaths[s.datapath];
        Some(StoreInfo {
            name: s.name.clone(),
            capacity: dp.capacity(),
            block_size: dp.block_size(),
            slot_size: s.slot_size,
            slots: s.slot_size.map(|z| dp.capacity() / z),
            drives: dp.drives().iter().map(|d| d.name.clone()).collect(),
            volatile_write_cache: dp.drives().iter().any(|d| d.volatile_write_cache),
        })
    }

    /// Counters summed over every queue pair.
    pub fn stats(&self) -> RuntimeStats {
        let mut s = RuntimeStats {
            late_completions: self.late_completions.load(Ordering::Relaxed),
            ..Default::default()
        };
        for d in &self.drives {
            for q in &d.queues {
                let qs = lock(q).stats();
                s.commands_submitted += qs.submitted;
                s.commands_completed += qs.completed;
                s.protocol_errors += qs.protocol_errors;
                s.sq_doorbell_writes += qs.sq_doorbell_writes;
            }
        }
        s
    }

    /// The software controller behind emulated drive `drive`, for its
    /// counters (`stats`: commands, doorbell values seen...) and fault
    /// injection (`add_fault`, `set_gone`, `disable_memory_space`) in tests
    /// and benchmarks; `None` for a PCI drive or an unknown name.
    pub fn emulator(&self, drive: &str) -> Option<&Arc<nvme_emu::Emulator>> {
        self.drives.iter().find(|d| d.name == drive)?.emulator.as_ref()
    }

    /// The GPU the runtime drives (when a datapath uses `execution: gpu`),
    /// for work on GPU memory registered with it (such as checksums of
    /// GPU-resident objects); `None` without one.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu.as_ref()
    }

    /// The CUDA device ordinal of [`Runtime::gpu`] (config `gpu.ordinal`);
    /// `None` without a GPU. GPU memory registered must live there.
    pub fn gpu_ordinal(&self) -> Option<u32> {
        self.gpu.as_ref().map(|_| self.gpu_ordinal)
    }

    /// Names of the drives, in configuration order.
    pub fn drive_names(&self) -> Vec<String> {
        self.drives.iter().map(|d| d.name.clone()).collect()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if !self.shut_down.load(Ordering::Acquire) {
            let r = self.shutdown(Duration::from_secs(1));
            if r.commands_in_flight > 0 {
                tracing::warn!(commands = r.commands_in_flight, "runtime dropped with commands in flight");
            }
        }
    }
}

/// An error and its sources, joined with ": ".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}
