//! The runtime: assembly from a [`Config`], and the public API
//! (`open`, `open_batch`, `register_memory`, `submit`, `wait`, `close`,
//! `shutdown`).
//!
//! CPU execution mode: `submit` turns each request into per-drive pieces
//! (the datapath's layout), each piece into commands no larger than MDTS
//! ([`nvm_queue::plan_io`]), writes their SQEs and rings each queue's
//! doorbell once per piece; `wait` polls the completion queues of the
//! operation's drives and routes every completion, by the tag it carries,
//! to its request.
//!
//! Lock order: a queue pair's lock, then the operations table. Nothing
//! takes a queue lock while holding the operations table.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use gpu_io::abi::TuttiRequest;
use gpu_io::{Gpu, GpuBuffer, GpuLaunch, GpuQueue, GpuRegion, GpuStatus};
use nvm_queue::{
    plan_io, Completion, DataRef, DmaMapping, IoOp, NvmeDevice, QueuePair, SubmitError, HOST_PAGE_SIZE,
};

use crate::binding::{Extent, Resolver};
use crate::config::{Config, DataPathConfig, Execution, ResolverConfig};
use crate::datapath::{DataPath, LocalNvme, StripedLocalNvme};
use crate::drive::{Drive, DriveUse, KernelsRunning};
use crate::error::{Error, RequestError, RequestStatus};
use crate::handle::{
    next_runtime_id, HandleError, HandleKind, HandleTable, MemoryHandle, OpHandle, RawHandle, TargetHandle,
};
use crate::request::{Direction, Request, Submission};
use crate::resolver::Slab;

/// URI scheme of targets: `tutti://<store>/<key>`.
pub const URI_SCHEME: &str = "tutti://";

/// How long `submit` keeps retrying a full queue (polling completions in
/// between) before failing the rest of a request with
/// [`RequestStatus::SubmitFailed`].
pub const SUBMIT_RETRY_BOUND: Duration = Duration::from_secs(5);

/// Bound on each GPU-executed command's wait for its completion (the
/// kernel reports TIMEOUT for that command when it passes).
pub const GPU_COMMAND_BUDGET: Duration = Duration::from_secs(10);

/// Requests per [`Runtime::submit`] call (the request index travels in 24
/// bits of each command's tag).
pub const MAX_BATCH: usize = 1 << 24;

#[derive(Debug)]
struct Store {
    name: String,
    resolver: Box<dyn Resolver>,
    datapath: usize,
    slot_size: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Target {
    store: usize,
    extent: Extent,
}

/// A registered host memory range and its DMA mapping on every drive.
#[derive(Debug)]
struct Region {
    /// Bytes from the page-aligned start of the mapping to the caller's
    /// pointer.
    lead: usize,
    /// The caller's length.
    len: usize,
    /// One mapping per drive, by drive index.
    mappings: Vec<DmaMapping>,
    devices: Vec<Arc<dyn NvmeDevice>>,
    /// Per drive with GPU-driven queues: the region's page addresses as
    /// that drive sees them, uploaded to the GPU once at registration (the
    /// kernel builds each command's PRPs from it).
    gpu_regions: Vec<Option<GpuRegion>>,
}

impl Drop for Region {
    fn drop(&mut self) {
        for (dev, m) in self.devices.iter().zip(&self.mappings) {
            if let Err(e) = dev.dma_unmap(m) {
                tracing::error!(device = dev.name(), error = %e, "DMA unmap failed");
            }
        }
    }
}

/// A validated request: its datapath, extent, memory and command count.
#[derive(Debug)]
struct Planned {
    datapath: usize,
    extent: Extent,
    region: Arc<Region>,
    commands: u32,
}

#[derive(Debug)]
struct ReqState {
    /// Commands of this request not yet completed (or abandoned).
    remaining: u32,
    /// First failure seen, or the final status once `remaining` is 0.
    status: Option<RequestStatus>,
    done: bool,
}

#[derive(Debug)]
struct OpState {
    reqs: Vec<ReqState>,
    /// Requests not final yet.
    unfinished: usize,
    /// Commands submitted and not completed.
    outstanding: u64,
    /// Waited on with a deadline that passed: the handle is dead, the entry
    /// lives on until its outstanding commands complete (their memory
    /// stays mapped meanwhile).
    retired: bool,
    datapaths: Vec<usize>,
    _regions: Vec<Arc<Region>>,
    /// The kernel launch carrying this operation's GPU-executed commands.
    gpu: Option<GpuOp>,
}

/// Commands of an operation that GPU threads execute.
#[derive(Debug)]
struct GpuOp {
    launch: GpuLaunch,
    /// Request index of each command, in launch order.
    cmd_req: Vec<u32>,
    /// Drive index of each command.
    cmd_drive: Vec<u16>,
    /// Counts the kernel as running on its drives; declared after `launch`
    /// so it drops after the launch has waited for the kernel.
    _running: KernelsRunning,
}

/// Counters of a runtime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Commands written to submission queues.
    pub commands_submitted: u64,
    /// Completions matched to a command.
    pub commands_completed: u64,
    /// CQEs with an unknown or stale command ID (dropped, counted).
    pub protocol_errors: u64,
    /// Completions that arrived for an operation no longer waited on.
    pub late_completions: u64,
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
}

/// How long [`Runtime::shutdown`] reaps a queue's completions after
/// deleting its SQ, for the commands the controller completes or aborts
/// ("Command Aborted due to SQ Deletion") on the way out.
pub const ABORT_REAP_BOUND: Duration = Duration::from_secs(1);

/// What [`Runtime::shutdown`] found.
#[derive(Debug, Default)]
pub struct ShutdownReport {
    /// Operations still not final when the drain bound passed.
    pub ops_in_flight: usize,
    /// Commands still outstanding on the drives when the drain bound
    /// passed (before their SQs were deleted).
    pub commands_in_flight: u64,
    /// Completions reaped after deleting the SQs: commands the controllers
    /// aborted (or finished) because their SQ went away; each was matched
    /// to its request once.
    pub commands_reaped_at_deletion: u64,
    /// Commands that got no completion at all: the controller neither
    /// finished nor aborted them when their SQ was deleted, or deleting
    /// the SQ failed (see `drives`); their requests stay not final
    /// ([`RequestStatus::Timeout`] to a wait).
    pub commands_lost: u64,
    /// Per drive, the result of deleting its queues and CC.SHN shutdown.
    pub drives: Vec<(String, Result<(), String>)>,
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
    /// Threads inside `submit`.
    submitters: AtomicUsize,
    /// The GPU, when a datapath uses GPU execution.
    gpu: Option<Arc<Gpu>>,
    /// Regions a GPU command timed out on: the drive may still write them,
    /// so they stay mapped for the runtime's lifetime.
    zombie_regions: Mutex<Vec<Arc<Region>>>,
    /// Per drive index: regions of commands abandoned when its controller
    /// failed; kept mapped until `reset_drive` resets the controller.
    pinned_until_reset: Mutex<HashMap<usize, Vec<Arc<Region>>>>,
    late_completions: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Largest operation slot a command tag can carry.
const TAG_SLOT_MAX: u32 = 0xFF_FFFF;

/// Tag layout: op slot (24 bits) | op generation low 16 bits | request index (24 bits).
fn make_tag(op: RawHandle, req: usize) -> u64 {
    (u64::from(op.slot & 0xFF_FFFF) << 40) | (u64::from(op.generation & 0xFFFF) << 24) | req as u64
}

fn split_tag(tag: u64) -> (u32, u32, usize) {
    ((tag >> 40) as u32, ((tag >> 24) & 0xFFFF) as u32, (tag & 0xFF_FFFF) as usize)
}

impl Runtime {
    /// Assembles a runtime: validates `config`, starts every drive, brings
    /// up its controller and queues, builds the resolvers and datapaths, and
    /// checks that each store's resolver and datapath agree on their
    /// binding.
    pub fn from_config(config: Config) -> Result<Self, Error> {
        config.validate()?;
        // Which datapath uses which drive, and how.
        let mut usage: HashMap<&str, DriveUse> = HashMap::new();
        for dp in config.datapaths.values() {
            match dp {
                DataPathConfig::LocalNvme(l) => {
                    usage.insert(
                        &l.drive,
                        DriveUse {
                            nsid: l.nsid,
                            queues: l.queues,
                            queue_depth: l.queue_depth,
                            execution: l.execution,
                        },
                    );
                }
                DataPathConfig::StripedLocalNvme(s) => {
                    for d in &s.drives {
                        usage.insert(
                            d,
                            DriveUse {
                                nsid: s.nsid,
                                queues: s.queues_per_drive,
                                queue_depth: s.queue_depth,
                                execution: s.execution,
                            },
                        );
                    }
                }
            }
        }
        // A GPU only when some datapath asks for GPU execution.
        let gpu = if usage.values().any(|u| u.execution == Execution::Gpu) {
            Some(Arc::new(
                Gpu::open(0).map_err(|source| Error::Gpu { context: "opening GPU 0".into(), source })?,
            ))
        } else {
            None
        };
        let mut drives = Vec::new();
        let mut drive_index = HashMap::new();
        for (i, (name, cfg)) in config.drives.iter().enumerate() {
            let d = Drive::start(i, name, cfg, usage.get(name.as_str()).copied(), gpu.as_deref())?;
            drive_index.insert(name.clone(), i);
            drives.push(Arc::new(d));
        }
        let get_drive = |name: &String| drives[drive_index[name]].clone();
        let mut datapaths: Vec<Arc<dyn DataPath>> = Vec::new();
        let mut dp_index = HashMap::new();
        for (name, cfg) in &config.datapaths {
            let dp: Arc<dyn DataPath> = match cfg {
                DataPathConfig::LocalNvme(l) => Arc::new(LocalNvme::new(name, get_drive(&l.drive))),
                DataPathConfig::StripedLocalNvme(s) => {
                    let ds: Vec<Arc<Drive>> = s.drives.iter().map(get_drive).collect();
                    // PCI drives' LBA sizes are known only now (config
                    // validation checked the emulated ones).
                    if let Some(d) = ds.iter().find(|d| s.stripe_unit.0 % u64::from(d.ns.block_size) != 0) {
                        return Err(Error::Uri {
                            uri: name.clone(),
                            reason: format!(
                                "stripe unit {} is not a multiple of drive {:?}'s {}-byte LBA size",
                                s.stripe_unit, d.name, d.ns.block_size
                            ),
                        });
                    }
                    Arc::new(
                        StripedLocalNvme::new(name, ds, s.stripe_unit.0)
                            .ok_or_else(|| Error::Uri { uri: name.clone(), reason: "empty stripe".into() })?,
                    )
                }
            };
            dp_index.insert(name.clone(), datapaths.len());
            datapaths.push(dp);
        }
        let mut stores = Vec::new();
        let mut store_index = HashMap::new();
        for (name, sc) in &config.stores {
            let (resolver, slot_size): (Box<dyn Resolver>, Option<u64>) = match &config.resolvers
                [&sc.resolver]
            {
                ResolverConfig::Slab(s) => (
                    Box::new(
                        Slab::new(s.slot_size.0)
                            .ok_or_else(|| Error::Uri { uri: name.clone(), reason: "slot size 0".into() })?,
                    ),
                    Some(s.slot_size.0),
                ),
            };
            let datapath = dp_index[&sc.datapath];
            check_binding(name, &sc.resolver, &*resolver, &*datapaths[datapath])?;
            store_index.insert(name.clone(), stores.len());
            stores.push(Store { name: name.clone(), resolver, datapath, slot_size });
        }
        let id = next_runtime_id();
        Ok(Self {
            drives,
            datapaths,
            stores,
            store_index,
            targets: RwLock::new(HandleTable::new(id, HandleKind::Target)),
            memory: RwLock::new(HandleTable::new(id, HandleKind::Memory)),
            ops: Mutex::new(HandleTable::new(id, HandleKind::Operation)),
            shutting_down: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            submitters: AtomicUsize::new(0),
            gpu,
            zombie_regions: Mutex::new(Vec::new()),
            pinned_until_reset: Mutex::new(HashMap::new()),
            late_completions: AtomicU64::new(0),
        })
    }

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
        })
    }

    /// Opens `tutti://<store>/<key>` and returns a handle naming the byte
    /// extent the store's resolver gives `key` (for `slab`, the slot
    /// number).
    ///
    /// Errors: [`Error::Uri`] for a malformed URI, an unknown store, or a key
    /// the resolver refuses; [`Error::ShuttingDown`].
    pub fn open(&self, uri: &str) -> Result<TargetHandle, Error> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        let bad = |reason: String| Error::Uri { uri: uri.to_owned(), reason };
        let rest =
            uri.strip_prefix(URI_SCHEME).ok_or_else(|| bad(format!("expected the scheme {URI_SCHEME}")))?;
        let (store, key) = rest.split_once('/').ok_or_else(|| bad("expected <store>/<key>".into()))?;
        let si = *self.store_index.get(store).ok_or_else(|| bad(format!("no store named {store:?}")))?;
        let s = &self.stores[si];
        let extent = s.resolver.resolve(key, self.datapaths[s.datapath].capacity()).map_err(bad)?;
        let mut t = self.targets.write().unwrap_or_else(|p| p.into_inner());
        Ok(TargetHandle(t.insert(Target { store: si, extent })))
    }

    /// Opens several URIs; one result per URI, in order.
    pub fn open_batch(&self, uris: &[&str]) -> Vec<Result<TargetHandle, Error>> {
        uris.iter().map(|u| self.open(u)).collect()
    }

    /// Size in bytes of an opened target.
    pub fn target_len(&self, target: TargetHandle) -> Result<u64, Error> {
        let t = self.targets.read().unwrap_or_else(|p| p.into_inner());
        Ok(t.get(target.0)?.extent.len)
    }

    /// Closes a target; the handle (and every copy) is stale afterwards.
    /// Operations already submitted on it run to completion.
    pub fn close(&self, target: TargetHandle) -> Result<(), Error> {
        let mut t = self.targets.write().unwrap_or_else(|p| p.into_inner());
        t.remove(target.0)?;
        Ok(())
    }

    /// Registers `len` bytes of host memory at `ptr` for I/O: maps the pages
    /// covering it for DMA on every drive, once. Requests then name it by
    /// the returned handle and an offset, and allocate nothing.
    ///
    /// # Safety
    ///
    /// Until [`Runtime::unregister_memory`] succeeds for the handle (or the
    /// runtime is dropped), the memory must stay allocated, and while an
    /// operation that reads into it is in flight (submitted and not yet
    /// returned by [`Runtime::wait`] as final) the caller must not read or
    /// write it, nor write memory a write operation is reading. After a
    /// [`RequestStatus::Timeout`], the drive may still write it until
    /// `unregister_memory` succeeds.
    pub unsafe fn register_memory(&self, ptr: *mut u8, len: usize) -> Result<MemoryHandle, Error> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        let bad = |reason: &str| Error::Memory { reason: reason.into(), source: None };
        if ptr.is_null() || len == 0 {
            return Err(bad("null pointer or zero length"));
        }
        let addr = ptr as usize;
        let base_addr = addr & !(HOST_PAGE_SIZE - 1);
        let lead = addr - base_addr;
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(HOST_PAGE_SIZE))
            .ok_or_else(|| bad("range wraps the address space"))?;
        let base = NonNull::new(base_addr as *mut u8).ok_or_else(|| bad("null page"))?;
        let mut mappings = Vec::with_capacity(self.drives.len());
        let mut devices = Vec::with_capacity(self.drives.len());
        for d in &self.drives {
            // SAFETY: forwarded from this function's contract: the caller
            // keeps the memory alive until unregister succeeds, and the
            // runtime keeps the mapping until no command can touch it.
            match unsafe { d.device.dma_map(base, end - base_addr) } {
                Ok(m) => {
                    mappings.push(m);
                    devices.push(d.device.clone());
                }
                Err(e) => {
                    // Undo the mappings made so far (Region's Drop).
                    drop(Region { lead, len, mappings, devices, gpu_regions: Vec::new() });
                    return Err(Error::Memory {
                        reason: format!("mapping for drive {:?}", d.name),
                        source: Some(e),
                    });
                }
            }
        }
        let gpu_regions = self.gpu_regions(&mappings, end - base_addr)?;
        let region = Arc::new(Region { lead, len, mappings, devices, gpu_regions });
        let mut m = self.memory.write().unwrap_or_else(|p| p.into_inner());
        Ok(MemoryHandle(m.insert(region)))
    }

    /// Uploads a region's page addresses for every drive with GPU queues.
    fn gpu_regions(
        &self,
        mappings: &[DmaMapping],
        mapped_len: usize,
    ) -> Result<Vec<Option<GpuRegion>>, Error> {
        self.drives
            .iter()
            .zip(mappings)
            .map(|(d, m)| match (&self.gpu, &d.gpu) {
                (Some(g), Some(_)) => GpuRegion::new(g, m, mapped_len)
                    .map(Some)
                    .map_err(|source| Error::Gpu { context: "uploading PRP page addresses".into(), source }),
                _ => Ok(None),
            })
            .collect()
    }

    /// Registers `len` bytes of GPU memory at device pointer `dptr` (in the
    /// runtime's CUDA context, GPU 0) for I/O, like
    /// [`Runtime::register_memory`]: KV blocks are then saved from and
    /// loaded into GPU memory directly. Emulated drives move the bytes with
    /// CUDA copies; real drives would need peer DMA, which is not written
    /// yet (refused with [`Error::Memory`]). Needs a datapath with
    /// `execution: gpu` (the runtime's GPU).
    ///
    /// # Safety
    ///
    /// As for [`Runtime::register_memory`]: the allocation stays alive until
    /// unregistered, and is not touched while an operation on it is in
    /// flight.
    pub unsafe fn register_gpu_memory(&self, dptr: u64, len: usize) -> Result<MemoryHandle, Error> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        let Some(gpu) = &self.gpu else {
            return Err(Error::Memory { reason: "no datapath uses GPU execution".into(), source: None });
        };
        if dptr == 0 || len == 0 {
            return Err(Error::Memory { reason: "null device pointer or zero length".into(), source: None });
        }
        let mut mappings = Vec::with_capacity(self.drives.len());
        let mut devices = Vec::with_capacity(self.drives.len());
        for d in &self.drives {
            let Some(emu) = &d.emulator else {
                drop(Region { lead: 0, len, mappings, devices, gpu_regions: Vec::new() });
                return Err(Error::Memory {
                    reason: format!("drive {:?} would need peer DMA to GPU memory (not yet written)", d.name),
                    source: None,
                });
            };
            // SAFETY: forwarded from this function's contract.
            let buf = unsafe { GpuBuffer::from_raw(gpu, dptr, len) }
                .map_err(|source| Error::Gpu { context: "wrapping GPU memory".into(), source })?;
            match emu.map_external(Arc::new(buf)) {
                Ok(m) => {
                    mappings.push(m);
                    devices.push(d.device.clone());
                }
                Err(e) => {
                    drop(Region { lead: 0, len, mappings, devices, gpu_regions: Vec::new() });
                    return Err(Error::Memory {
                        reason: format!("mapping for drive {:?}", d.name),
                        source: Some(e),
                    });
                }
            }
        }
        let gpu_regions = self.gpu_regions(&mappings, len)?;
        let region = Arc::new(Region { lead: 0, len, mappings, devices, gpu_regions });
        let mut m = self.memory.write().unwrap_or_else(|p| p.into_inner());
        Ok(MemoryHandle(m.insert(region)))
    }

    /// Unregisters memory; refused with [`Error::MemoryBusy`] while an
    /// operation uses it: one not yet returned by [`Runtime::wait`], or one
    /// that timed out and whose commands are still outstanding on a drive
    /// (completions that have arrived are reaped first).
    pub fn unregister_memory(&self, memory: MemoryHandle) -> Result<(), Error> {
        // Late completions of timed-out operations may be waiting in a CQ:
        // reap them first so that memory they no longer pin can go.
        if Arc::strong_count(self.memory.read().unwrap_or_else(|p| p.into_inner()).get(memory.0)?) > 1 {
            self.reap();
        }
        let mut m = self.memory.write().unwrap_or_else(|p| p.into_inner());
        let users = Arc::strong_count(m.get(memory.0)?) - 1;
        if users > 0 {
            return Err(Error::MemoryBusy { ops: users });
        }
        drop(m.remove(memory.0)?);
        Ok(())
    }

    /// Submits a batch. Each request is validated (handles, range inside
    /// the target, block alignment, memory range) and then queued; the
    /// result carries one state per request, in order, and an operation
    /// handle to [`Runtime::wait`] on when at least one was accepted.
    pub fn submit(&self, requests: &[Request]) -> Submission {
        // Counted before the shutdown check, so `shutdown` can wait for every
        // submit that got past it before deleting queues.
        self.submitters.fetch_add(1, Ordering::AcqRel);
        let sub = self.submit_inner(requests);
        self.submitters.fetch_sub(1, Ordering::AcqRel);
        sub
    }

    fn submit_inner(&self, requests: &[Request]) -> Submission {
        if self.shutting_down.load(Ordering::Acquire) || requests.len() > MAX_BATCH {
            let e = if requests.len() > MAX_BATCH {
                RequestError::OutOfRange {
                    offset: 0,
                    len: requests.len() as u64,
                    target_len: MAX_BATCH as u64,
                }
            } else {
                RequestError::ShuttingDown
            };
            return Submission { op: None, states: requests.iter().map(|_| Err(e.clone())).collect() };
        }
        // 1. Validate and plan (count commands) under the read locks.
        let plans: Vec<Result<Planned, RequestError>> = {
            let targets = self.targets.read().unwrap_or_else(|p| p.into_inner());
            let memory = self.memory.read().unwrap_or_else(|p| p.into_inner());
            requests.iter().map(|r| self.validate(&targets, &memory, r)).collect()
        };
        // A GPU launch binds one memory region per queue: a GPU-executed
        // batch uses one region (the first GPU request's).
        let mut plans = plans;
        let mut gpu_region: Option<Arc<Region>> = None;
        for p in plans.iter_mut() {
            let Ok(pl) = p else { continue };
            if !self.is_gpu(pl.datapath) {
                continue;
            }
            match &gpu_region {
                None => gpu_region = Some(pl.region.clone()),
                Some(r) if Arc::ptr_eq(r, &pl.region) => {}
                Some(_) => *p = Err(RequestError::GpuBatchMemory),
            }
        }
        let states: Vec<Result<(), RequestError>> =
            plans.iter().map(|p| p.as_ref().map(|_| ()).map_err(Clone::clone)).collect();
        if plans.iter().all(Result::is_err) {
            return Submission { op: None, states };
        }
        // 2. Register the operation with every request's command count.
        let mut dps: Vec<usize> = plans.iter().flatten().map(|p| p.datapath).collect();
        dps.sort_unstable();
        dps.dedup();
        let mut regions: Vec<Arc<Region>> = Vec::new();
        for p in plans.iter().flatten() {
            if !regions.iter().any(|r| Arc::ptr_eq(r, &p.region)) {
                regions.push(p.region.clone());
            }
        }
        let reqs: Vec<ReqState> = plans
            .iter()
            .map(|p| match p {
                Ok(p) => ReqState { remaining: p.commands, status: None, done: false },
                Err(e) => {
                    ReqState { remaining: 0, status: Some(RequestStatus::NotAccepted(e.clone())), done: true }
                }
            })
            .collect();
        let unfinished = reqs.iter().filter(|r| !r.done).count();
        let total: u64 = reqs.iter().map(|r| u64::from(r.remaining)).sum();
        let op = {
            let mut ops = lock(&self.ops);
            let op = ops.insert(OpState {
                reqs,
                unfinished,
                outstanding: total,
                retired: false,
                datapaths: dps,
                _regions: regions,
                gpu: None,
            });
            if op.slot > TAG_SLOT_MAX {
                // The slot would not fit in a command tag: refuse the batch.
                let _ = ops.remove(op);
                let e = RequestError::TooManyOperations { limit: TAG_SLOT_MAX as u64 + 1 };
                return Submission { op: None, states: requests.iter().map(|_| Err(e.clone())).collect() };
            }
            op
        };
        // 3. Queue the commands: CPU-executed ones now, from this thread;
        // GPU-executed ones in one kernel launch.
        for (i, (r, p)) in requests.iter().zip(&plans).enumerate() {
            if let Ok(p) = p {
                if !self.is_gpu(p.datapath) {
                    self.queue_request(op, i, r, p.datapath, p.extent, &p.region);
                }
            }
        }
        if let Some(region) = gpu_region {
            self.launch_gpu(op, requests, &plans, &region);
        }
        Submission { op: Some(OpHandle(op)), states }
    }

    /// `true` when datapath `dpi`'s drives are driven by GPU threads.
    fn is_gpu(&self, dpi: usize) -> bool {
        self.datapaths[dpi].drives().first().is_some_and(|d| d.gpu.is_some())
    }

    /// Builds every GPU-executed command of the batch (per-drive pieces,
    /// split by MDTS, spread over each drive's GPU queues) and launches them
    /// as one kernel. The operation's CPU bookkeeping is adjusted so that
    /// only `wait` accounts for them.
    fn launch_gpu(
        &self,
        op: RawHandle,
        requests: &[Request],
        plans: &[Result<Planned, RequestError>],
        region: &Region,
    ) {
        let Some(gpu) = &self.gpu else { return };
        let mut cmds: Vec<TuttiRequest> = Vec::new();
        let mut cmd_req: Vec<u32> = Vec::new();
        let mut cmd_drive: Vec<u16> = Vec::new();
        let mut queues: Vec<(&GpuQueue, &GpuRegion)> = Vec::new();
        let mut first_queue: HashMap<usize, (u16, usize)> = HashMap::new(); // drive -> (first index, count)
        let mut next: HashMap<usize, usize> = HashMap::new();
        let mut failed: Vec<(usize, String)> = Vec::new();
        // Requests refused before launch: none of their commands is sent.
        let mut refused_reqs: Vec<(usize, String)> = Vec::new();
        for (i, (r, p)) in requests.iter().zip(plans).enumerate() {
            let Ok(p) = p else { continue };
            if !self.is_gpu(p.datapath) {
                continue;
            }
            let dp = &self.datapaths[p.datapath];
            let opcode = match r.direction {
                Direction::Read => nvme_regs::opcode::nvm_opcode::READ,
                Direction::Write => nvme_regs::opcode::nvm_opcode::WRITE,
            };
            let mut refused: Option<String> = None;
            let (mut mine, mut mine_drive): (Vec<TuttiRequest>, Vec<u16>) = (Vec::new(), Vec::new());
            dp.for_each_piece(p.extent.offset + r.offset, r.len, &mut |pc| {
                let d = &dp.drives()[pc.drive];
                if !d.is_alive() {
                    refused =
                        Some(format!("drive {:?} failed or shut down; reset_drive brings it back", d.name));
                    return;
                }
                let (Some(gq), Some(Some(greg))) = (&d.gpu, region.gpu_regions.get(d.index)) else {
                    refused = Some("GPU queues or page table missing for a drive".into());
                    return;
                };
                let (base, count) = *first_queue.entry(d.index).or_insert_with(|| {
                    let base = queues.len() as u16;
                    for q in &gq.queues {
                        queues.push((q, greg));
                    }
                    (base, gq.queues.len())
                });
                let Ok(plan) = plan_io(&d.ns, pc.drive_offset, pc.len, d.max_transfer) else {
                    refused = Some(format!("piece not aligned to drive {:?}'s LBA size", d.name));
                    return;
                };
                for c in plan {
                    let k = next.entry(d.index).or_insert(0);
                    let q = base + (*k % count.max(1)) as u16;
                    *k += 1;
                    mine.push(TuttiRequest {
                        opcode,
                        queue: q,
                        nsid: d.ns.nsid,
                        slba: c.slba,
                        nlb: u32::from(c.nlb.zero_based()),
                        len: c.len as u32,
                        mem_offset: (region.lead
                            + r.memory_offset as usize
                            + pc.request_offset as usize
                            + c.offset) as u64,
                        ..Default::default()
                    });
                    mine_drive.push(d.index as u16);
                }
            });
            // A request is launched whole or not at all: a refused piece
            // fails it before any of its commands reach a drive.
            match refused {
                Some(reason) => refused_reqs.push((i, reason)),
                None => {
                    cmd_req.extend(std::iter::repeat_n(i as u32, mine.len()));
                    cmds.append(&mut mine);
                    cmd_drive.append(&mut mine_drive);
                }
            }
        }
        // Counted before the launch; a drive that failed or started a reset
        // meanwhile stops the launch (see KernelsRunning).
        let running =
            KernelsRunning::new(cmd_drive.iter().map(|&d| self.drives[usize::from(d)].clone()).collect());
        let launched = if cmds.is_empty() {
            None
        } else if !running.all_alive() {
            for &i in &cmd_req {
                failed.push((i as usize, "a drive of the batch failed or is being reset".into()));
            }
            None
        } else {
            match gpu.launch(&queues, &cmds, u32::MAX, GPU_COMMAND_BUDGET) {
                Ok(l) => Some(l),
                Err(e) => {
                    let reason = error_chain(&e);
                    for &i in &cmd_req {
                        failed.push((i as usize, reason.clone()));
                    }
                    None
                }
            }
        };
        let mut ops = lock(&self.ops);
        let Ok(st) = ops.get_mut(op) else { return };
        // These commands are not tracked by the CPU completion path.
        let gpu_cmds = cmds.len() as u64;
        st.outstanding = st.outstanding.saturating_sub(gpu_cmds);
        for (i, reason) in refused_reqs {
            let n = st.reqs.get(i).map_or(0, |r| r.remaining);
            st.outstanding = st.outstanding.saturating_sub(u64::from(n));
            finish_commands(st, i, n, Some(RequestStatus::SubmitFailed { reason }));
        }
        failed.sort_unstable_by_key(|f| f.0);
        failed.dedup_by_key(|f| f.0);
        for (i, reason) in failed {
            let n = st.reqs.get(i).map_or(0, |r| r.remaining);
            finish_commands(st, i, n, Some(RequestStatus::SubmitFailed { reason }));
        }
        if let Some(launch) = launched {
            st.gpu = Some(GpuOp { launch, cmd_req, cmd_drive, _running: running });
        }
    }

    /// Waits for an operation's kernel, if it has one, and applies each
    /// command's status to its request.
    fn finish_gpu(&self, op: OpHandle) -> Result<(), Error> {
        let Some(g) = lock(&self.ops).get_mut(op.0)?.gpu.take() else { return Ok(()) };
        let statuses = g.launch.wait();
        let mut ops = lock(&self.ops);
        let st = ops.get_mut(op.0)?;
        match statuses {
            Ok(statuses) => {
                let mut timed_out = false;
                // Drives whose controller turned out fatal (CSTS.CFS or all
                // ones) when one of their commands timed out: the GPU
                // cannot tell a dead controller from a slow one, the
                // registers can.
                let mut fatal: HashMap<u16, bool> = HashMap::new();
                for (k, s) in statuses.iter().enumerate() {
                    let (Some(&i), Some(&d)) = (g.cmd_req.get(k), g.cmd_drive.get(k)) else { continue };
                    let drive =
                        || self.drives.get(usize::from(d)).map(|x| x.name.clone()).unwrap_or_default();
                    let failure = match *s {
                        GpuStatus::Success => None,
                        GpuStatus::Nvme(status) => Some(RequestStatus::Nvme { drive: drive(), status }),
                        GpuStatus::Timeout if *fatal.entry(d).or_insert_with(|| self.gpu_drive_fatal(d)) => {
                            // Pinned until this drive's reset ends its DMA.
                            lock(&self.pinned_until_reset)
                                .entry(usize::from(d))
                                .or_default()
                                .extend(st._regions.iter().cloned());
                            Some(RequestStatus::ControllerFatal { drive: drive() })
                        }
                        GpuStatus::Timeout => {
                            timed_out = true;
                            Some(RequestStatus::Timeout)
                        }
                        other => Some(RequestStatus::SubmitFailed { reason: format!("GPU: {other:?}") }),
                    };
                    finish_commands(st, i as usize, 1, failure);
                }
                if timed_out {
                    // The drive may still write these: keep them mapped.
                    lock(&self.zombie_regions).extend(st._regions.iter().cloned());
                }
            }
            Err(e) => {
                let reason = error_chain(&e);
                for &i in &g.cmd_req {
                    finish_commands(
                        st,
                        i as usize,
                        1,
                        Some(RequestStatus::SubmitFailed { reason: reason.clone() }),
                    );
                }
            }
        }
        Ok(())
    }

    fn validate(
        &self,
        targets: &HandleTable<Target>,
        memory: &HandleTable<Arc<Region>>,
        r: &Request,
    ) -> Result<Planned, RequestError> {
        let t = *targets.get(r.target.0).map_err(RequestError::Target)?;
        let region = memory.get(r.memory.0).map_err(RequestError::Memory)?.clone();
        if r.len == 0 {
            return Err(RequestError::ZeroLength);
        }
        match r.offset.checked_add(r.len) {
            Some(end) if end <= t.extent.len => {}
            _ => {
                return Err(RequestError::OutOfRange {
                    offset: r.offset,
                    len: r.len,
                    target_len: t.extent.len,
                })
            }
        }
        let dpi = self.stores[t.store].datapath;
        let dp = &self.datapaths[dpi];
        let bs = u64::from(dp.block_size());
        if !r.offset.is_multiple_of(bs) || !r.len.is_multiple_of(bs) {
            return Err(RequestError::Unaligned {
                offset: r.offset,
                len: r.len,
                block_size: dp.block_size(),
            });
        }
        let mem_bad =
            RequestError::MemoryRange { offset: r.memory_offset, len: r.len, region_len: region.len as u64 };
        match r.memory_offset.checked_add(r.len) {
            Some(end)
                if end <= region.len as u64 && (region.lead as u64 + r.memory_offset).is_multiple_of(4) => {}
            _ => return Err(mem_bad),
        }
        // Count commands; a drive-level refusal (should not happen after the
        // checks above) refuses the request here, before anything is sent.
        let mut commands = 0u64;
        let mut err = None;
        dp.for_each_piece(t.extent.offset + r.offset, r.len, &mut |p| {
            let d = &dp.drives()[p.drive];
            match plan_io(&d.ns, p.drive_offset, p.len, d.max_transfer) {
                Ok(plan) => commands += plan.commands() as u64,
                Err(_) => {
                    err = Some(RequestError::Unaligned {
                        offset: r.offset,
                        len: r.len,
                        block_size: d.ns.block_size,
                    })
                }
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        let commands = u32::try_from(commands).map_err(|_| RequestError::OutOfRange {
            offset: r.offset,
            len: r.len,
            target_len: t.extent.len,
        })?;
        Ok(Planned { datapath: dpi, extent: t.extent, region, commands })
    }

    fn queue_request(
        &self,
        op: RawHandle,
        index: usize,
        r: &Request,
        dpi: usize,
        extent: Extent,
        region: &Region,
    ) {
        let dp = &self.datapaths[dpi];
        let tag = make_tag(op, index);
        let io = match r.direction {
            Direction::Read => IoOp::Read,
            Direction::Write => IoOp::Write,
        };
        let mut unsent = 0u32;
        let mut reason = None;
        dp.for_each_piece(extent.offset + r.offset, r.len, &mut |p| {
            let d = &dp.drives()[p.drive];
            let Ok(plan) = plan_io(&d.ns, p.drive_offset, p.len, d.max_transfer) else {
                return; // counted at validation; cannot fail here
            };
            let Some(mut qp) = d.pick_queue() else {
                unsent += plan.commands() as u32;
                reason.get_or_insert_with(|| format!("drive {:?} has no I/O queue", d.name));
                return;
            };
            let mapping = &region.mappings[d.index];
            let mem_base = region.lead + r.memory_offset as usize + p.request_offset as usize;
            let mut remaining = plan.commands() as u32;
            for chunk in plan {
                let data = DataRef { mapping, offset: mem_base + chunk.offset, len: chunk.len };
                let sqe = io.sqe(d.ns.nsid, &chunk);
                match self.submit_with_retry(&mut qp, d, sqe, data, tag) {
                    Ok(()) => remaining -= 1,
                    Err(e) => {
                        reason.get_or_insert_with(|| format!("drive {:?}: {e}", d.name));
                        break;
                    }
                }
            }
            qp.ring();
            unsent += remaining;
        });
        if unsent > 0 {
            let mut ops = lock(&self.ops);
            if let Ok(st) = ops.get_mut(op) {
                st.outstanding -= u64::from(unsent);
                let status = RequestStatus::SubmitFailed { reason: reason.unwrap_or_default() };
                finish_commands(st, index, unsent, Some(status));
            }
        }
    }

    fn submit_with_retry(
        &self,
        qp: &mut QueuePair,
        d: &Drive,
        sqe: nvme_regs::Sqe,
        data: DataRef<'_>,
        tag: u64,
    ) -> Result<(), SubmitError> {
        let mut deadline = None;
        loop {
            match qp.submit(sqe, Some(data), tag) {
                Ok(_) => return Ok(()),
                Err(SubmitError::QueueFull { qid }) => {
                    // Publish what is queued, reap completions, retry.
                    qp.ring();
                    self.poll_queue(qp, d);
                    let dl = *deadline.get_or_insert_with(|| Instant::now() + SUBMIT_RETRY_BOUND);
                    if Instant::now() >= dl {
                        return Err(SubmitError::QueueFull { qid });
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reaps one queue pair's completions and routes them. Returns the
    /// number consumed.
    fn poll_queue(&self, qp: &mut QueuePair, d: &Drive) -> usize {
        let mut ops = lock(&self.ops);
        qp.poll(|c| self.route(&mut ops, d, c))
    }

    fn route(&self, ops: &mut HandleTable<OpState>, d: &Drive, c: Completion) {
        let (slot, gen16, index) = split_tag(c.tag);
        let Some((h, st)) = ops.get_mut_by_slot(slot) else {
            self.late_completions.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if h.generation & 0xFFFF != gen16 || index >= st.reqs.len() {
            self.late_completions.fetch_add(1, Ordering::Relaxed);
            return;
        }
        st.outstanding = st.outstanding.saturating_sub(1);
        let failure =
            (!c.status.is_success()).then(|| RequestStatus::Nvme { drive: d.name.clone(), status: c.status });
        finish_commands(st, index, 1, failure);
        if st.retired && st.outstanding == 0 {
            let _ = ops.remove(h);
        }
    }

    /// Polls every queue of the given datapaths that no other thread is
    /// polling. Returns completions consumed.
    fn poll_datapaths(&self, dps: &[usize]) -> usize {
        let mut n = 0;
        for &dpi in dps {
            for d in self.datapaths[dpi].drives() {
                if !d.is_alive() {
                    continue;
                }
                for q in &d.queues {
                    if let Ok(mut qp) = q.try_lock() {
                        n += self.poll_queue(&mut qp, d);
                    }
                }
            }
        }
        n
    }

    /// Waits until every request of `op` is final or `timeout` passes, and
    /// returns one status per request of the batch, in submission order.
    /// Completions are always reaped once before the deadline is checked,
    /// so a zero timeout is a non-blocking poll. Requests not final at the
    /// deadline are [`RequestStatus::Timeout`]. Either way the handle is
    /// consumed: a second wait is a stale-handle error. A timed-out
    /// request's commands stay tracked, and its memory busy, until their
    /// completions arrive (reaped by later waits, [`Runtime::reap`] or
    /// [`Runtime::unregister_memory`]) or the runtime shuts down.
    pub fn wait(&self, op: OpHandle, timeout: Duration) -> Result<Vec<RequestStatus>, Error> {
        let deadline = Instant::now().checked_add(timeout);
        let dps = self.live_op_datapaths(op)?;
        // GPU-executed commands: the kernel bounds each by its budget.
        self.finish_gpu(op)?;
        let mut idle = 0u32;
        // Completions are reaped at least once before a deadline is
        // honoured, so `wait(op, Duration::ZERO)` is a non-blocking poll
        // that still sees work the drives have finished.
        let mut polled = false;
        loop {
            {
                let mut ops = lock(&self.ops);
                let st = ops.get_mut(op.0)?;
                if st.retired {
                    // Another thread's wait on the same handle took the
                    // statuses first.
                    return Err(stale_op(op));
                }
                let expired = polled && deadline.is_some_and(|d| Instant::now() >= d);
                if st.unfinished == 0 || expired {
                    return finalize(&mut ops, op.0);
                }
            }
            let n = self.poll_datapaths(&dps);
            polled = true;
            if n > 0 {
                idle = 0;
            } else {
                idle += 1;
                if idle.is_multiple_of(256) {
                    // Nothing completes: is a controller dead?
                    self.check_drives(&dps);
                }
                backoff(idle);
            }
        }
    }

    /// Non-blocking wait: reaps the operation's completions once and returns
    /// its statuses if every request is final (consuming the handle, as
    /// [`Runtime::wait`] does), or `None` (the handle stays valid).
    pub fn try_wait(&self, op: OpHandle) -> Result<Option<Vec<RequestStatus>>, Error> {
        let dps = self.live_op_datapaths(op)?;
        let gpu_busy = lock(&self.ops).get(op.0)?.gpu.as_ref().is_some_and(|g| !g.launch.is_done());
        if gpu_busy {
            return Ok(None);
        }
        self.finish_gpu(op)?;
        self.poll_datapaths(&dps);
        let mut ops = lock(&self.ops);
        let st = ops.get(op.0)?;
        if st.retired {
            return Err(stale_op(op));
        }
        if st.unfinished > 0 {
            return Ok(None);
        }
        finalize(&mut ops, op.0).map(Some)
    }

    fn live_op_datapaths(&self, op: OpHandle) -> Result<Vec<usize>, Error> {
        let ops = lock(&self.ops);
        let st = ops.get(op.0)?;
        if st.retired {
            return Err(stale_op(op));
        }
        Ok(st.datapaths.clone())
    }

    /// `true` (and the drive marked failed) when GPU-driven drive `index`
    /// reports CSTS.CFS or reads all ones.
    fn gpu_drive_fatal(&self, index: u16) -> bool {
        let Some(d) = self.drives.get(usize::from(index)) else { return false };
        let dead = lock(&d.controller).csts().map_or(true, |csts| csts.cfs());
        if dead && !d.failed.swap(true, Ordering::AcqRel) {
            tracing::error!(drive = %d.name, "controller fatal status under GPU-driven I/O");
        }
        dead
    }

    /// Looks for controllers of these datapaths that reported CSTS.CFS or
    /// read all ones, and fails their outstanding commands.
    fn check_drives(&self, dps: &[usize]) {
        for &dpi in dps {
            for d in self.datapaths[dpi].drives() {
                if !d.is_alive() || d.queues.is_empty() {
                    continue;
                }
                let dead = match d.controller.try_lock() {
                    Ok(c) => c.csts().map_or(true, |csts| csts.cfs()),
                    Err(_) => false,
                };
                if dead {
                    self.fail_drive(d);
                }
            }
        }
    }

    /// Marks `d` failed and ends every command outstanding on its queues
    /// with [`RequestStatus::ControllerFatal`]. Their memory is released
    /// only by the controller reset ([`Runtime::reset_drive`]), because a
    /// controller in this state may still be writing it.
    fn fail_drive(&self, d: &Drive) {
        if d.failed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::error!(drive = %d.name, "controller fatal status: failing its outstanding commands");
        for q in &d.queues {
            let mut qp = lock(q);
            // The rings are dead; their commands end here (the queue memory
            // itself stays allocated in the pair).
            let lost = qp.reset_after_controller_reset();
            let mut ops = lock(&self.ops);
            for (_, tag) in lost {
                let (slot, gen16, index) = split_tag(tag);
                let Some((h, st)) = ops.get_mut_by_slot(slot) else { continue };
                if h.generation & 0xFFFF != gen16 {
                    continue;
                }
                st.outstanding = st.outstanding.saturating_sub(1);
                finish_commands(st, index, 1, Some(RequestStatus::ControllerFatal { drive: d.name.clone() }));
                lock(&self.pinned_until_reset)
                    .entry(d.index)
                    .or_default()
                    .extend(st._regions.iter().cloned());
                if st.retired && st.outstanding == 0 {
                    let _ = ops.remove(h);
                }
            }
        }
    }

    /// Resets drive `name`'s controller (CC.EN = 0, which also clears
    /// CSTS.CFS), brings it up again and re-creates its I/O queues, after a
    /// fatal controller error failed its outstanding requests with
    /// [`RequestStatus::ControllerFatal`]. Works on a healthy drive too
    /// (its outstanding commands fail the same way).
    ///
    /// GPU-executed drives (`execution: gpu`) are reset the same way, and
    /// their GPU-side queue state is rewritten for the re-created queues;
    /// a GPU command that timed out on a fatal controller ends as
    /// [`RequestStatus::ControllerFatal`].
    ///
    /// # Errors
    ///
    /// [`Error::DriveBusy`] while a GPU kernel that uses the drive has not
    /// finished (whether or not a thread is waiting on it; a batch being
    /// launched concurrently is refused instead), [`Error::Controller`] when
    /// the reset or a Create fails,
    /// [`Error::ShuttingDown`], [`Error::Uri`] for an unknown name.
    pub fn reset_drive(&self, name: &str) -> Result<(), Error> {
        let d = self
            .drives
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| Error::Uri { uri: name.to_owned(), reason: "no drive of that name".into() })?;
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        if let Some(g) = &d.gpu {
            // GPU threads keep the queues' state in device memory: no kernel
            // that uses this drive may still be running while it is reset.
            // Marking it failed first keeps new batches from launching on it
            // (launch_gpu refuses a drive that is not alive).
            let was_failed = d.failed.swap(true, Ordering::SeqCst);
            // Kernels launched and not finished, whether or not a thread is
            // waiting on them (see KernelsRunning).
            let running = d.gpu_kernels.load(Ordering::SeqCst);
            if running > 0 {
                d.failed.store(was_failed, Ordering::Release);
                return Err(Error::DriveBusy { drive: d.name.clone(), ops: running });
            }
            let mut c = lock(&d.controller);
            c.reset().map_err(|source| Error::Controller { drive: d.name.clone(), source })?;
            for q in &g.queues {
                q.recreate(&mut c)
                    .map_err(|source| Error::Gpu { context: format!("resetting drive {name:?}"), source })?;
            }
            lock(&self.pinned_until_reset).remove(&d.index);
            d.failed.store(false, Ordering::Release);
            return Ok(());
        }
        self.fail_drive(d);
        let ctrl_err = |source| Error::Controller { drive: d.name.clone(), source };
        let mut c = lock(&d.controller);
        c.reset().map_err(ctrl_err)?;
        for q in &d.queues {
            let mut qp = lock(q);
            c.recreate_io_queue_pair(&mut qp).map_err(ctrl_err)?;
        }
        // The reset ended every DMA of the abandoned commands.
        lock(&self.pinned_until_reset).remove(&d.index);
        d.failed.store(false, Ordering::Release);
        Ok(())
    }

    /// Reaps every queue's completions once, from the calling thread: late
    /// completions of timed-out operations are matched and their memory
    /// released. [`Runtime::wait`] does this for its own operation's
    /// datapaths; this covers the rest. Returns completions consumed.
    pub fn reap(&self) -> usize {
        let all: Vec<usize> = (0..self.datapaths.len()).collect();
        self.poll_datapaths(&all)
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
            }
        }
        s
    }

    /// Names of the drives, in configuration order.
    pub fn drive_names(&self) -> Vec<String> {
        self.drives.iter().map(|d| d.name.clone()).collect()
    }

    /// Orderly shutdown. Stops accepting work (a later [`Runtime::submit`]
    /// gets [`RequestError::ShuttingDown`] for each request), drains
    /// in-flight operations for up to `drain` (polling their completions),
    /// then, per drive and queue: deletes the SQ (the controller completes
    /// or aborts every command of it it had fetched, and drops the rest),
    /// reaps that CQ for up to 1 s (`ABORT_REAP_BOUND`) so that each
    /// outstanding command gets exactly one completion (an aborted one
    /// surfaces as [`RequestStatus::Nvme`] with SCT 0h / SC 08h on its
    /// request, which a later [`Runtime::wait`] returns), deletes the CQ;
    /// finally shuts each controller down (CC.SHN). Reports what was still
    /// in flight and how each drive's shutdown went.
    pub fn shutdown(&self, drain: Duration) -> ShutdownReport {
        self.shutting_down.store(true, Ordering::Release);
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return ShutdownReport::default();
        }
        let all: Vec<usize> = (0..self.datapaths.len()).collect();
        let deadline = Instant::now() + drain;
        let mut report = ShutdownReport::default();
        // Kernels still running use the GPU queues: let them finish (each
        // command is bounded by GPU_COMMAND_BUDGET) before queues go away.
        let gpu_ops: Vec<RawHandle> =
            lock(&self.ops).iter().filter(|(_, st)| st.gpu.is_some()).map(|(h, _)| h).collect();
        for h in gpu_ops {
            let _ = self.finish_gpu(OpHandle(h));
        }
        // Kernels another thread is waiting on end within the budget too.
        let gpu_deadline = Instant::now() + GPU_COMMAND_BUDGET + Duration::from_secs(1);
        while self.drives.iter().any(|d| d.gpu_kernels.load(Ordering::SeqCst) > 0)
            && Instant::now() < gpu_deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Submits that passed the shutting-down check finish queueing first.
        while self.submitters.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        loop {
            let (pending, cmds) = {
                let ops = lock(&self.ops);
                ops.iter()
                    .fold((0, 0), |(p, c), (_, st)| (p + usize::from(st.unfinished > 0), c + st.outstanding))
            };
            report.ops_in_flight = pending;
            report.commands_in_flight = cmds;
            if cmds == 0 || Instant::now() >= deadline {
                break;
            }
            if self.poll_datapaths(&all) == 0 {
                std::thread::yield_now();
            }
        }
        for d in &self.drives {
            d.retire_queues();
            let (reaped, r) = self.shutdown_drive(d);
            report.commands_reaped_at_deletion += reaped;
            report.drives.push((d.name.clone(), r.map_err(|e| error_chain(&e))));
        }
        report.commands_lost = lock(&self.ops).iter().map(|(_, st)| st.outstanding).sum();
        report
    }

    /// Shutdown of one drive whose queues are retired (no other thread
    /// uses them): each CPU queue's SQ deleted, its CQ reaped (bounded) and
    /// deleted, then the controller's CC.SHN shutdown (which also deletes
    /// GPU-driven queues). Returns the completions reaped after SQ deletion
    /// and the first error.
    fn shutdown_drive(&self, d: &Drive) -> (u64, Result<(), nvm_queue::ControllerError>) {
        let mut c = lock(&d.controller);
        let mut reaped = 0u64;
        let mut first_err = None;
        // A failed controller's queues were already emptied (fail_drive).
        if !d.failed.load(Ordering::Acquire) {
            for q in &d.queues {
                let mut qp = lock(q);
                let qid = qp.qid();
                if let Err(e) = c.delete_io_sq(qid) {
                    first_err.get_or_insert(e);
                    continue;
                }
                qp.sq_was_deleted();
                let deadline = Instant::now() + ABORT_REAP_BOUND;
                while qp.outstanding() > 0 && Instant::now() < deadline {
                    let n = self.poll_queue(&mut qp, d);
                    reaped += n as u64;
                    if n == 0 {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
                if qp.outstanding() > 0 {
                    tracing::warn!(
                        drive = %d.name,
                        qid,
                        commands = qp.outstanding(),
                        "commands got no completion after their SQ was deleted"
                    );
                }
                if let Err(e) = c.delete_io_cq(qid) {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Err(e) = c.shutdown() {
            first_err.get_or_insert(e);
        }
        (reaped, first_err.map_or(Ok(()), Err))
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

/// The error for a handle whose operation was already consumed by a wait.
fn stale_op(op: OpHandle) -> Error {
    HandleError::Stale { kind: HandleKind::Operation, slot: op.0.slot, generation: op.0.generation }.into()
}

/// Takes the final statuses of operation `h` (requests not final become
/// [`RequestStatus::Timeout`]) and consumes its handle: the entry goes away,
/// or is retired until its outstanding commands complete.
fn finalize(ops: &mut HandleTable<OpState>, h: RawHandle) -> Result<Vec<RequestStatus>, Error> {
    let st = ops.get_mut(h)?;
    let statuses =
        st.reqs
            .iter_mut()
            .map(|r| {
                if r.done {
                    r.status.take().unwrap_or(RequestStatus::Success)
                } else {
                    RequestStatus::Timeout
                }
            })
            .collect();
    if st.outstanding == 0 {
        ops.remove(h)?;
    } else {
        st.retired = true;
    }
    Ok(statuses)
}

/// Idle back-off of a polling waiter: spin briefly (completions usually
/// follow within microseconds), then sleep in short naps so that
/// a waiter on a slow drive does not take a core from the drives and other
/// threads.
fn backoff(idle_polls: u32) {
    if idle_polls < 256 {
        std::hint::spin_loop();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Marks `n` commands of request `index` finished, recording `failure` if it
/// is the first; finalises the request when none remain.
fn finish_commands(st: &mut OpState, index: usize, n: u32, failure: Option<RequestStatus>) {
    let Some(r) = st.reqs.get_mut(index) else { return };
    if r.done {
        return;
    }
    if let Some(f) = failure {
        r.status.get_or_insert(f);
    }
    r.remaining = r.remaining.saturating_sub(n);
    if r.remaining == 0 {
        r.done = true;
        st.unfinished -= 1;
    }
}

fn check_binding(
    store: &str,
    resolver_name: &str,
    resolver: &dyn Resolver,
    dp: &dyn DataPath,
) -> Result<(), Error> {
    let (p, c) = (resolver.binding(), dp.binding());
    if p != c {
        return Err(Error::BindingMismatch {
            store: store.to_owned(),
            resolver: resolver_name.to_owned(),
            datapath: dp.name().to_owned(),
            produced: p.to_string(),
            consumed: c.to_string(),
        });
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::Binding;
    use crate::datapath::Piece;

    #[derive(Debug)]
    struct OtherResolver;
    impl Resolver for OtherResolver {
        fn binding(&self) -> Binding {
            Binding::of::<Extent>(2)
        }
        fn resolve(&self, _: &str, _: u64) -> Result<Extent, String> {
            Err("unused".into())
        }
    }

    #[derive(Debug)]
    struct FakePath;
    impl DataPath for FakePath {
        fn name(&self) -> &str {
            "fake"
        }
        fn binding(&self) -> Binding {
            Binding::of::<Extent>(crate::binding::EXTENT_V1)
        }
        fn capacity(&self) -> u64 {
            0
        }
        fn block_size(&self) -> u32 {
            512
        }
        fn drives(&self) -> &[Arc<Drive>] {
            &[]
        }
        fn for_each_piece(&self, _: u64, _: u64, _: &mut dyn FnMut(Piece)) {}
    }

    #[test]
    fn mismatched_binding_version_is_refused() {
        let e = check_binding("kv", "r", &OtherResolver, &FakePath).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::BindingMismatch { .. }));
        assert!(msg.contains("@2") && msg.contains("@1"), "{msg}");
        check_binding("kv", "slab", &Slab::new(4096).unwrap(), &FakePath).unwrap();
    }

    #[test]
    fn tags_round_trip() {
        let h = RawHandle { runtime: 1, slot: 0xAB_CDEF, generation: 0x1234_5678 };
        assert_eq!(split_tag(make_tag(h, 0xFF_FFFF)), (0xAB_CDEF, 0x5678, 0xFF_FFFF));
    }
}
