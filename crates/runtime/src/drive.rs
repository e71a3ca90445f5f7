//! A drive owned by the runtime: its device (emulated, or vfio-pci),
//! its controller, the I/O queue pairs its datapath uses, and its health
//! ([`DriveState`]: the one record of whether it takes work).
//!
//! Locks: `health` is a leaf lock (nothing else is taken while it is held);
//! the runtime may hold the operations table while it takes it (to pin
//! memory). A queue pair's lock is never held together with `health`.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpu_io::{Gpu, GpuDrive, GpuQueue};
use nvm_queue::{Controller, ControllerOptions, NamespaceInfo, NvmeDevice, QueuePair};
use nvme_emu::{
    BackingSpec, Emulator, EmulatorConfig, FaultAction, FaultMatch, FaultRule, NamespaceSpec, TimingModel,
    WriteCacheSpec,
};

use tuttid_proto::DaemonDevice;

use crate::config::{
    Backing, ConfigError, ConfigErrorKind, DaemonDriveConfig, DriveConfig, EmulatedDriveConfig, Execution,
    FaultActionConfig, FaultConfig, FaultOp, PciDriveConfig,
};
use crate::error::Error;
use crate::region::Region;

/// Whether a drive takes work. One value per drive, changed only under its
/// health lock (and mirrored in an atomic for lock-free reads on the
/// submission path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum DriveState {
    /// Controller enabled, queues live: takes work.
    Ready = 0,
    /// The controller reported a fatal status (CSTS.CFS), stopped being
    /// ready, or vanished (reads all ones / cannot be read): its commands
    /// were abandoned; dead until `Runtime::reset_drive`.
    Failed = 1,
    /// `Runtime::reset_drive` is resetting the controller.
    Resetting = 2,
    /// The runtime shut it down (queues deleted, CC.SHN).
    ShutDown = 3,
}

impl DriveState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Ready,
            1 => Self::Failed,
            2 => Self::Resetting,
            _ => Self::ShutDown,
        }
    }
}

/// What the health lock guards.
#[derive(Debug)]
struct Health {
    state: DriveState,
    /// GPU kernels launched on this drive's GPU queues that have not
    /// finished (see [`KernelsRunning`]); a reset or shutdown of the drive
    /// waits for 0.
    gpu_kernels: usize,
    /// Memory that commands abandoned on this drive (failed controller, GPU
    /// command timeout) may still be written by it: kept registered until
    /// a controller reset ends every DMA of the drive.
    pinned: Vec<Arc<Region>>,
}

/// How a datapath wants a drive set up.
#[derive(Debug, Clone)]
pub(crate) struct DriveUse {
    pub nsid: u32,
    /// YAML key path of the datapath's `nsid` (for errors).
    pub nsid_key: String,
    pub queues: u16,
    pub queue_depth: u32,
    pub execution: Execution,
}

impl DriveUse {
    /// The I/O queue pairs to ask for: `queues`, plus one kept by CPU
    /// threads for Flush under GPU execution.
    fn pairs_wanted(&self) -> u16 {
        self.queues.max(1).saturating_add(u16::from(self.execution == Execution::Gpu))
    }
}

/// Commands outstanding on a queue pair of `depth` entries: one CQ slot
/// always stays empty, so never more than the CQ can hold.
fn max_outstanding(depth: u32) -> u16 {
    (depth - 1).clamp(1, 32768) as u16
}

/// A drive's queues in GPU hands, with its register window mapped into the
/// GPU.
#[derive(Debug)]
pub(crate) struct GpuQueues {
    pub queues: Vec<GpuQueue>,
    pub _drive: GpuDrive,
}

/// One drive: device, controller, namespace in use, I/O queue pairs.
#[derive(Debug)]
pub(crate) struct Drive {
    pub name: String,
    /// Index in the runtime's drive list (memory regions keep one DMA
    /// mapping per drive, by this index).
    pub index: usize,
    pub device: Arc<dyn NvmeDevice>,
    /// The software controller, when the drive is emulated.
    pub emulator: Option<Arc<Emulator>>,
    /// The controller, when this process owns it (`None` for a `tuttid`
    /// drive, whose admin queue and registers are the daemon's).
    pub controller: Option<Mutex<Controller>>,
    /// The daemon-owned drive, for `daemon` drives.
    pub daemon: Option<Arc<DaemonDevice>>,
    /// The controller reports a volatile write cache (Identify VWC bit 0).
    pub volatile_write_cache: bool,
    /// GPU-driven queues (execution: gpu), kept for the drive's lifetime.
    pub gpu: Option<GpuQueues>,
    pub queues: Vec<Mutex<QueuePair>>,
    next_queue: AtomicUsize,
    /// [`DriveState`] as a `u8`, written only under `health`.
    state: AtomicU8,
    health: Mutex<Health>,
    pub ns: NamespaceInfo,
    pub max_transfer: usize,
}

/// The emulator configuration of emulated drive `name` as the runtime
/// starts it (also used by `tuttid`, which runs emulated drives itself).
pub fn emulator_config(name: &str, cfg: &EmulatedDriveConfig) -> EmulatorConfig {
    let namespaces = cfg
        .namespaces
        .iter()
        .map(|n| {
            let spec = NamespaceSpec::new(n.capacity.0 / u64::from(n.block_size), n.block_size);
            match n.metadata {
                Some(m) => spec.with_metadata(m.bytes, m.extended),
                None => spec,
            }
        })
        .collect();
    let mut e = EmulatorConfig::new(name, namespaces);
    e.backing = match &cfg.backing {
        Backing::Ram => BackingSpec::Ram,
        Backing::Null => BackingSpec::Null,
        Backing::File(p) => BackingSpec::File(p.clone()),
        Backing::RamDisk(n) => BackingSpec::RamDisk(n.clone()),
    };
    e.write_cache = cfg.write_cache.map(|c| WriteCacheSpec { capacity_bytes: c.capacity.0, seed: c.seed });
    e.mqes = cfg.mqes;
    e.dstrd = cfg.dstrd;
    e.mdts = cfg.mdts;
    e.io_queues = cfg.io_queues;
    e.faults = cfg.faults.iter().map(fault_rule).collect();
    if let Some(us) = cfg.idle_spin_us {
        e.idle_spin = Duration::from_micros(us);
    }
    e.timing = cfg.timing.map(|t| TimingModel {
        latency: Duration::from_micros(t.latency_us),
        bandwidth_bytes_per_s: t.bandwidth_mb_s.map(|b| b.saturating_mul(1_000_000)),
        iops: t.iops,
    });
    e
}

fn fault_rule(f: &FaultConfig) -> FaultRule {
    use nvme_regs::opcode::nvm_opcode;
    FaultRule {
        matches: FaultMatch {
            qid: None,
            opcode: f.op.map(|o| match o {
                FaultOp::Read => nvm_opcode::READ,
                FaultOp::Write => nvm_opcode::WRITE,
                FaultOp::Flush => nvm_opcode::FLUSH,
            }),
            nsid: f.nsid,
            lba: f.lba.map(|[a, b]| a..b),
            // A drive's YAML faults are for its I/O: `op: write` (01h) must
            // not match Create I/O SQ (also 01h) during bring-up.
            io_only: true,
        },
        action: match f.action {
            FaultActionConfig::Fail { sct, sc, dnr } => {
                FaultAction::Fail(nvme_regs::Status::new(sct, sc).with_dnr(dnr))
            }
            FaultActionConfig::NeverComplete => FaultAction::NeverComplete,
            FaultActionConfig::ControllerFatal => FaultAction::ControllerFatal,
            FaultActionConfig::DelayUs(us) => FaultAction::Delay(Duration::from_micros(us)),
            FaultActionConfig::PowerFail => FaultAction::PowerFail,
        },
        times: f.times,
        skip: f.skip,
    }
}

/// Opens a PCI function bound to vfio-pci (or, when allowed, to a
/// no-IOMMU driver).
fn open_pci(name: &str, p: &PciDriveConfig) -> Result<Arc<dyn NvmeDevice>, Error> {
    // Config validation parsed the address already; this only fails for a
    // config built in code without `validate`.
    let addr: nvme_pci::PciAddr = p.addr.trim().parse().map_err(|_: nvme_pci::PciAddrParseError| {
        ConfigError::new(format!("drives.{name}.pci.addr"), ConfigErrorKind::PciAddr { addr: p.addr.clone() })
    })?;
    let opts = nvme_pci::OpenOptions { allow_no_iommu: p.allow_no_iommu, ..Default::default() };
    nvme_pci::open(&addr, &opts).map_err(|source| Error::Pci { drive: name.to_owned(), source })
}

/// The config error for a namespace the drive cannot serve, at the key of
/// the datapath's `nsid`.
fn namespace_error(name: &str, usage: Option<&DriveUse>, reason: nvm_queue::NamespaceError) -> Error {
    let path = usage.map_or_else(|| format!("drives.{name}"), |u| u.nsid_key.clone());
    let drive = name.to_owned();
    let kind = match reason {
        nvm_queue::NamespaceError::NotActive { nsid, active } => {
            ConfigErrorKind::NamespaceMissing { drive, nsid, active }
        }
        reason => ConfigErrorKind::NamespaceUnsupported { drive, reason },
    };
    ConfigError::new(path, kind).into()
}

/// A drive's I/O queue pairs: CPU-driven ones, or GPU-driven ones.
type Queues = (Vec<Mutex<QueuePair>>, Option<GpuQueues>);

/// Creates the I/O queue pairs `u` asks for (lowered to what the
/// controller grants and clamped to CAP.MQES + 1, with a warning) and hands
/// them to CPU or GPU threads.
fn create_queues(
    name: &str,
    controller: &mut Controller,
    device: &Arc<dyn NvmeDevice>,
    mut u: DriveUse,
    gpu: Option<&Gpu>,
) -> Result<Queues, Error> {
    let ctrl_err = |source| Error::Controller { drive: name.to_owned(), source };
    // A real controller may grant fewer queue pairs than asked (Set
    // Features, Number of Queues) and support shallower queues
    // (CAP.MQES): use what it offers. Emulated drives were checked
    // against their config already, so this only fires for PCI.
    let granted = controller.io_queues_granted();
    if u.queues > granted {
        tracing::warn!(drive = name, asked = u.queues, granted, "controller granted fewer I/O queue pairs");
        u.queues = granted;
    }
    let max_entries = controller.cap().max_queue_entries();
    if u.queue_depth > max_entries {
        tracing::warn!(
            drive = name,
            asked = u.queue_depth,
            max_entries,
            "queue depth clamped to CAP.MQES + 1"
        );
        u.queue_depth = max_entries;
    }
    // GPU execution hands every pair to the GPU but one, kept for the
    // commands CPU threads issue on its behalf (Flush); with a single
    // pair granted the GPU gets it and a flush is refused.
    let on_gpu = u.execution == Execution::Gpu;
    let cpu_pairs = u16::from(on_gpu && granted >= 2);
    if on_gpu {
        u.queues = u.queues.min(granted - cpu_pairs).max(1);
    }
    let depth = u.queue_depth;
    let outstanding = max_outstanding(depth);
    let mut pairs = Vec::new();
    for qid in 1..=u.queues + cpu_pairs {
        pairs.push(controller.create_io_queue_pair(qid, depth, outstanding).map_err(ctrl_err)?);
    }
    hand_out(name, device, pairs, &u, gpu)
}

/// Asks `tuttid` for the queue pairs `u` asks for (lowered to the client's
/// quota and to CAP.MQES + 1, with a warning) and hands them to CPU or GPU
/// threads.
fn grant_queues(
    name: &str,
    dev: &Arc<DaemonDevice>,
    device: &Arc<dyn NvmeDevice>,
    mut u: DriveUse,
    gpu: Option<&Gpu>,
) -> Result<Queues, Error> {
    let derr = |source| Error::Daemon { drive: name.to_owned(), source };
    let f = dev.facts();
    let on_gpu = u.execution == Execution::Gpu;
    let wanted = u.pairs_wanted();
    let n = wanted.min(f.quota_left).max(1);
    if n < wanted {
        tracing::warn!(drive = name, asked = wanted, quota = f.quota_left, "tuttid quota: fewer queue pairs");
    }
    u.queues = if on_gpu && n >= 2 { n - 1 } else { n };
    u.queue_depth = u.queue_depth.min(u32::from(f.mqes) + 1);
    let outstanding = max_outstanding(u.queue_depth);
    let mut pairs = Vec::new();
    for _ in 0..n {
        pairs.push(dev.grant_queue_pair(u.queue_depth, outstanding).map_err(derr)?);
    }
    hand_out(name, device, pairs, &u, gpu)
}

/// What starting a drive made: [`Drive::ready`] turns it into a drive that
/// takes work. Emulated and PCI drives have a controller of this process;
/// `tuttid` drives a daemon device instead.
struct Started {
    device: Arc<dyn NvmeDevice>,
    emulator: Option<Arc<Emulator>>,
    controller: Option<Controller>,
    daemon: Option<Arc<DaemonDevice>>,
    queues: Queues,
    ns: NamespaceInfo,
    max_transfer: usize,
    volatile_write_cache: bool,
}

/// Hands `pairs` to CPU threads, or all but the last `pairs.len() -
/// u.queues` to the GPU (mapping the register window into it).
fn hand_out(
    name: &str,
    device: &Arc<dyn NvmeDevice>,
    mut pairs: Vec<QueuePair>,
    u: &DriveUse,
    gpu: Option<&Gpu>,
) -> Result<Queues, Error> {
    match (u.execution, gpu) {
        (Execution::Cpu, _) => Ok((pairs.into_iter().map(Mutex::new).collect(), None)),
        (Execution::Gpu, Some(g)) => {
            let gpu_err = |source| Error::Gpu { context: format!("drive {name:?}"), source };
            let gd = GpuDrive::map(g, device.clone()).map_err(gpu_err)?;
            let cpu: Vec<Mutex<QueuePair>> =
                pairs.split_off(usize::from(u.queues)).into_iter().map(Mutex::new).collect();
            let qs = pairs
                .into_iter()
                .map(|qp| GpuQueue::new(g, &gd, qp))
                .collect::<Result<Vec<_>, _>>()
                .map_err(gpu_err)?;
            Ok((cpu, Some(GpuQueues { queues: qs, _drive: gd })))
        }
        (Execution::Gpu, None) => {
            Err(Error::Gpu { context: format!("drive {name:?}"), source: gpu_io::GpuError::NoDriver })
        }
    }
}

impl Drive {
    /// Starts the drive's device, brings its controller up and creates the
    /// I/O queue pairs `usage` asks for.
    pub fn start(
        index: usize,
        name: &str,
        cfg: &DriveConfig,
        usage: Option<DriveUse>,
        gpu: Option<&Gpu>,
    ) -> Result<Self, Error> {
        let (device, emulator): (Arc<dyn NvmeDevice>, _) = match cfg {
            DriveConfig::Daemon(dc) => return Self::start_daemon(index, name, dc, usage, gpu),
            DriveConfig::Emulated(e) => {
                let emu = Emulator::start(emulator_config(name, e))
                    .map_err(|source| Error::Emulator { drive: name.to_owned(), source })?;
                (emu.clone(), Some(emu))
            }
            DriveConfig::Pci(p) => (open_pci(name, p)?, None),
        };
        let ctrl_err = |source| Error::Controller { drive: name.to_owned(), source };
        // GPU execution: one more pair, kept by CPU threads for Flush.
        let queues_wanted = usage.as_ref().map_or(1, DriveUse::pairs_wanted);
        let mut controller = Controller::init(
            device.clone(),
            ControllerOptions { io_queues: queues_wanted, ..ControllerOptions::default() },
        )
        .map_err(ctrl_err)?;
        let nsid = usage.as_ref().map_or(1, |u| u.nsid);
        let ns = controller
            .usable_namespace(nsid)
            .map_err(|reason| namespace_error(name, usage.as_ref(), reason))?;
        if let (Some(g), Some(emu)) = (gpu, &emulator) {
            // GPU memory may be registered on this drive: its RAM media is
            // page-locked for the emulator's asynchronous copies to and
            // from the GPU (once, now, before any kernel runs).
            let _locked = emu.lock_media_pages(g);
        }
        let queues = match usage {
            Some(u) => create_queues(name, &mut controller, &device, u, gpu)?,
            None => (Vec::new(), None),
        };
        Ok(Self::ready(
            index,
            name,
            Started {
                device,
                emulator,
                max_transfer: controller.max_transfer(),
                volatile_write_cache: controller.info().has_volatile_write_cache(),
                controller: Some(controller),
                daemon: None,
                queues,
                ns,
            },
        ))
    }

    /// Connects to `tuttid` for drive `dc.drive` and builds the queue
    /// pairs `usage` asks for on rings the daemon grants (lowered to the
    /// client's quota and CAP.MQES + 1, with a warning). No controller is
    /// touched here: the daemon owns it.
    fn start_daemon(
        index: usize,
        name: &str,
        dc: &DaemonDriveConfig,
        usage: Option<DriveUse>,
        gpu: Option<&Gpu>,
    ) -> Result<Self, Error> {
        let derr = |source| Error::Daemon { drive: name.to_owned(), source };
        let trust = dc.daemon_uid.map_or(tuttid_proto::DaemonUid::RootOrSelf, tuttid_proto::DaemonUid::Is);
        let client = tuttid_proto::Client::connect_trusting(&dc.socket, trust).map_err(|e| derr(e.into()))?;
        let dev = DaemonDevice::open(client, &dc.drive).map_err(derr)?;
        let f = dev.facts().clone();
        let ns = NamespaceInfo { nsid: f.nsid, block_size: f.block_size, blocks: f.blocks };
        if let Some(u) = &usage {
            if u.nsid != f.nsid {
                let reason = nvm_queue::NamespaceError::NotActive { nsid: u.nsid, active: vec![f.nsid] };
                return Err(namespace_error(name, Some(u), reason));
            }
        }
        let device: Arc<dyn NvmeDevice> = dev.clone();
        let queues = match usage {
            Some(u) => grant_queues(name, &dev, &device, u, gpu)?,
            None => (Vec::new(), None),
        };
        Ok(Self::ready(
            index,
            name,
            Started {
                device,
                emulator: None,
                controller: None,
                daemon: Some(dev),
                queues,
                ns,
                max_transfer: usize::try_from(f.max_transfer).unwrap_or(usize::MAX),
                volatile_write_cache: f.volatile_write_cache,
            },
        ))
    }

    /// A started drive, ready to take work.
    fn ready(index: usize, name: &str, s: Started) -> Self {
        let (queues, gpu) = s.queues;
        Self {
            volatile_write_cache: s.volatile_write_cache,
            name: name.to_owned(),
            index,
            device: s.device,
            emulator: s.emulator,
            controller: s.controller.map(Mutex::new),
            daemon: s.daemon,
            gpu,
            queues,
            next_queue: AtomicUsize::new(0),
            state: AtomicU8::new(DriveState::Ready as u8),
            health: Mutex::new(Health { state: DriveState::Ready, gpu_kernels: 0, pinned: Vec::new() }),
            ns: s.ns,
            max_transfer: s.max_transfer,
        }
    }

    /// Why a `tuttid` drive is dead (the connection to the daemon was
    /// lost: its grants are void), or `None`.
    pub fn daemon_dead(&self) -> Option<String> {
        let d = self.daemon.as_ref()?;
        d.client().is_dead().then(|| format!("connection to tuttid at {} lost", d.client().socket()))
    }

    /// The drive's state (a lock-free read).
    pub fn state(&self) -> DriveState {
        DriveState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// `true` when the drive takes work.
    pub fn is_ready(&self) -> bool {
        self.state() == DriveState::Ready
    }

    fn health(&self) -> MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_state(&self, h: &mut Health, state: DriveState) {
        h.state = state;
        self.state.store(state as u8, Ordering::Release);
    }

    /// Ready -> Failed. Returns `false` (changing nothing) when the drive
    /// was not ready: someone else failed, reset or shut it down first.
    pub fn mark_failed(&self) -> bool {
        let mut h = self.health();
        if h.state != DriveState::Ready {
            return false;
        }
        self.set_state(&mut h, DriveState::Failed);
        true
    }

    /// Starts a reset (Ready or Failed -> Resetting).
    ///
    /// # Errors
    ///
    /// `Err(kernels)` while GPU kernels that use the drive run (the state
    /// is unchanged); `Err(0)` when the drive is shut down or another reset
    /// is under way.
    pub fn begin_reset(&self) -> Result<(), usize> {
        let mut h = self.health();
        if h.gpu_kernels > 0 {
            return Err(h.gpu_kernels);
        }
        if !matches!(h.state, DriveState::Ready | DriveState::Failed) {
            return Err(0);
        }
        self.set_state(&mut h, DriveState::Resetting);
        Ok(())
    }

    /// Ends a reset: Ready (and the pinned memory released, since the
    /// reset ended every DMA of the drive) when `ok`, Failed otherwise.
    pub fn end_reset(&self, ok: bool) {
        let released = {
            let mut h = self.health();
            if h.state == DriveState::ShutDown {
                // The runtime shut down meanwhile: the drive stays down.
                return;
            }
            if !ok {
                self.set_state(&mut h, DriveState::Failed);
                return;
            }
            self.set_state(&mut h, DriveState::Ready);
            std::mem::take(&mut h.pinned)
        };
        // Unmapped outside the lock (a region's last reference unmaps it).
        drop(released);
    }

    /// Any state -> ShutDown; returns the state it had.
    pub fn mark_shut_down(&self) -> DriveState {
        let mut h = self.health();
        let was = h.state;
        self.set_state(&mut h, DriveState::ShutDown);
        was
    }

    /// Keeps `regions` registered until the drive's controller is reset.
    pub fn pin_until_reset(&self, regions: &[Arc<Region>]) {
        let mut h = self.health();
        for r in regions {
            if !h.pinned.iter().any(|p| Arc::ptr_eq(p, r)) {
                h.pinned.push(r.clone());
            }
        }
    }

    /// GPU kernels using this drive that have not finished.
    pub fn gpu_kernels(&self) -> usize {
        self.health().gpu_kernels
    }

    /// Waits until no thread uses one of the drive's queue pairs (after
    /// the state left Ready, so no new user comes).
    pub fn quiesce_queues(&self) {
        for q in &self.queues {
            drop(q.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// A queue pair for the next batch, round robin over those no other
    /// thread holds, locked; `None` when the drive has no CPU queue or is
    /// not ready. The caller re-checks [`Drive::is_ready`] under the lock.
    pub fn pick_queue(&self) -> Option<MutexGuard<'_, QueuePair>> {
        let n = self.queues.len();
        if n == 0 || !self.is_ready() {
            return None;
        }
        let start = self.next_queue.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            if let Ok(g) = self.queues[(start + i) % n].try_lock() {
                return Some(g);
            }
        }
        self.queues[start % n].lock().ok()
    }
}

/// Counts one running GPU kernel on each of its drives from creation until
/// drop. It is created before the launch and dropped after the kernel is
/// known to have finished (it sits after the launch in the runtime's
/// per-operation state, and a launch waits for its kernel when dropped).
#[derive(Debug)]
pub(crate) struct KernelsRunning {
    drives: Vec<Arc<Drive>>,
}

impl KernelsRunning {
    /// Counts a kernel on each of `drives` (each once), all or none: `None`
    /// when one of them is not ready (failed, being reset or shut down), so
    /// the launch must not go ahead. The check and the count happen under
    /// each drive's health lock, so a reset either sees the kernel counted
    /// (and refuses with `DriveBusy`) or the launch sees the reset.
    pub fn start(mut drives: Vec<Arc<Drive>>) -> Option<Self> {
        drives.sort_by_key(|d| d.index);
        drives.dedup_by_key(|d| d.index);
        let mut counted = Self { drives: Vec::with_capacity(drives.len()) };
        for d in drives {
            let mut h = d.health();
            if h.state != DriveState::Ready {
                return None; // `counted` drops: the counts made so far go back
            }
            h.gpu_kernels += 1;
            drop(h);
            counted.drives.push(d);
        }
        Some(counted)
    }
}

impl Drop for KernelsRunning {
    fn drop(&mut self) {
        for d in &self.drives {
            let mut h = d.health();
            // Only `start` counts up, once per drive listed here.
            debug_assert!(h.gpu_kernels > 0);
            h.gpu_kernels = h.gpu_kernels.saturating_sub(1);
        }
    }
}
