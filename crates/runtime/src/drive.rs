//! A drive owned by the runtime: its device (emulated, or vfio-pci),
//! its controller and the I/O queue pairs its datapath uses.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpu_io::{Gpu, GpuDrive, GpuQueue};
use nvm_queue::{Controller, ControllerOptions, NamespaceInfo, NvmeDevice, QueuePair};
use nvme_emu::{
    BackingSpec, Emulator, EmulatorConfig, FaultAction, FaultMatch, FaultRule, NamespaceSpec, TimingModel,
};

use crate::config::{
    Backing, DriveConfig, EmulatedDriveConfig, Execution, FaultActionConfig, FaultConfig, FaultOp,
    PciDriveConfig,
};
use crate::error::Error;

/// How a datapath wants a drive set up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DriveUse {
    pub nsid: u32,
    pub queues: u16,
    pub queue_depth: u32,
    pub execution: Execution,
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
    pub controller: Mutex<Controller>,
    /// GPU-driven queues (execution: gpu), kept for the drive's lifetime.
    pub gpu: Option<GpuQueues>,
    pub queues: Vec<Mutex<QueuePair>>,
    next_queue: AtomicUsize,
    /// Cleared when the runtime shuts the controller down: its queues are
    /// gone, so nothing may ring their doorbells or poll them any more.
    alive: AtomicBool,
    /// Set when the controller reported a fatal status (CSTS.CFS) or
    /// vanished: its queues are dead until `Runtime::reset_drive`.
    pub failed: AtomicBool,
    /// GPU kernels launched on this drive's GPU queues that have not
    /// finished (see [`KernelsRunning`]); a reset or shutdown of the drive
    /// must wait for 0.
    pub gpu_kernels: AtomicUsize,
    pub ns: NamespaceInfo,
    pub max_transfer: usize,
}

fn emulator_config(name: &str, cfg: &EmulatedDriveConfig) -> EmulatorConfig {
    let namespaces = cfg
        .namespaces
        .iter()
        .map(|n| NamespaceSpec::new(n.capacity.0 / u64::from(n.block_size), n.block_size))
        .collect();
    let mut e = EmulatorConfig::new(name, namespaces);
    e.backing = match &cfg.backing {
        Backing::Ram => BackingSpec::Ram,
        Backing::Null => BackingSpec::Null,
        Backing::File(p) => BackingSpec::File(p.clone()),
    };
    e.mqes = cfg.mqes;
    e.dstrd = cfg.dstrd;
    e.mdts = cfg.mdts;
    e.io_queues = cfg.io_queues;
    e.faults = cfg.faults.iter().map(fault_rule).collect();
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
            }),
            nsid: f.nsid,
            lba: f.lba.map(|[a, b]| a..b),
        },
        action: match f.action {
            FaultActionConfig::Fail { sct, sc, dnr } => {
                FaultAction::Fail(nvme_regs::Status::new(sct, sc).with_dnr(dnr))
            }
            FaultActionConfig::NeverComplete => FaultAction::NeverComplete,
            FaultActionConfig::ControllerFatal => FaultAction::ControllerFatal,
            FaultActionConfig::DelayUs(us) => FaultAction::Delay(Duration::from_micros(us)),
        },
        times: f.times,
    }
}

/// Opens a PCI function bound to vfio-pci (or, when allowed, to a
/// no-IOMMU driver).
fn open_pci(name: &str, p: &PciDriveConfig) -> Result<Arc<dyn NvmeDevice>, Error> {
    // Config validation parsed the address already; this only fails for a
    // config built in code without `validate`.
    let addr: nvme_pci::PciAddr = p.addr.trim().parse().map_err(|e: nvme_pci::PciAddrParseError| {
        Error::Uri { uri: name.to_owned(), reason: format!("PCI address {:?}: {e}", p.addr) }
    })?;
    let opts = nvme_pci::OpenOptions { allow_no_iommu: p.allow_no_iommu, ..Default::default() };
    nvme_pci::open(&addr, &opts).map_err(|source| Error::Pci { drive: name.to_owned(), source })
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
            DriveConfig::Emulated(e) => {
                let emu = Emulator::start(emulator_config(name, e))
                    .map_err(|source| Error::Emulator { drive: name.to_owned(), source })?;
                (emu.clone(), Some(emu))
            }
            DriveConfig::Pci(p) => (open_pci(name, p)?, None),
        };
        let ctrl_err = |source| Error::Controller { drive: name.to_owned(), source };
        let queues_wanted = usage.map_or(1, |u| u.queues.max(1));
        let mut controller = Controller::init(
            device.clone(),
            ControllerOptions { io_queues: queues_wanted, ..ControllerOptions::default() },
        )
        .map_err(ctrl_err)?;
        let nsid = usage.map_or(1, |u| u.nsid);
        let ns =
            *controller.namespace(nsid).ok_or_else(|| Error::NoNamespace { drive: name.to_owned(), nsid })?;
        let mut queues = Vec::new();
        let mut gpu_queues = None;
        if let Some(mut u) = usage {
            // A real controller may grant fewer queue pairs than asked (Set
            // Features, Number of Queues) and support shallower queues
            // (CAP.MQES): use what it offers. Emulated drives were checked
            // against their config already, so this only fires for PCI.
            let granted = controller.io_queues_granted();
            if u.queues > granted {
                tracing::warn!(
                    drive = name,
                    asked = u.queues,
                    granted,
                    "controller granted fewer I/O queue pairs"
                );
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
            let depth = u.queue_depth;
            // One CQ slot always stays empty: never have more commands
            // outstanding than the CQ can hold.
            let outstanding = (depth - 1).clamp(1, 32768) as u16;
            let mut pairs = Vec::new();
            for qid in 1..=u.queues {
                pairs.push(controller.create_io_queue_pair(qid, depth, outstanding).map_err(ctrl_err)?);
            }
            match (u.execution, gpu) {
                (Execution::Cpu, _) => queues = pairs.into_iter().map(Mutex::new).collect(),
                (Execution::Gpu, Some(g)) => {
                    let gpu_err = |source| Error::Gpu { context: format!("drive {name:?}"), source };
                    let gd = GpuDrive::map(g, device.clone()).map_err(gpu_err)?;
                    let qs = pairs
                        .into_iter()
                        .map(|qp| GpuQueue::new(g, &gd, qp))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(gpu_err)?;
                    gpu_queues = Some(GpuQueues { queues: qs, _drive: gd });
                }
                (Execution::Gpu, None) => {
                    return Err(Error::Gpu {
                        context: format!("drive {name:?}"),
                        source: gpu_io::GpuError::NoDriver,
                    })
                }
            }
        }
        let max_transfer = controller.max_transfer();
        Ok(Self {
            name: name.to_owned(),
            index,
            device,
            emulator,
            controller: Mutex::new(controller),
            gpu: gpu_queues,
            queues,
            next_queue: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
            failed: AtomicBool::new(false),
            gpu_kernels: AtomicUsize::new(0),
            ns,
            max_transfer,
        })
    }

    /// `false` once the controller was shut down.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire) && !self.failed.load(Ordering::Acquire)
    }

    /// Marks the drive's queues gone (before deleting them), waiting for any
    /// thread that is using one of them to let go.
    pub fn retire_queues(&self) {
        self.alive.store(false, Ordering::Release);
        for q in &self.queues {
            drop(q.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// A queue pair for the next request, round robin, locked.
    pub fn pick_queue(&self) -> Option<MutexGuard<'_, QueuePair>> {
        let n = self.queues.len();
        if n == 0 || !self.is_alive() {
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

/// Counts one running GPU kernel on each of `drives` from creation until
/// drop. It is created before the launch and dropped after the kernel is
/// known to have finished (it sits after the launch in the runtime's
/// per-operation state, and a launch waits for its kernel when dropped).
#[derive(Debug)]
pub(crate) struct KernelsRunning {
    drives: Vec<Arc<Drive>>,
}

impl KernelsRunning {
    /// Counts a kernel on each drive (each once).
    pub fn new(mut drives: Vec<Arc<Drive>>) -> Self {
        drives.sort_by_key(|d| d.index);
        drives.dedup_by_key(|d| d.index);
        for d in &drives {
            // SeqCst pairs with reset_drive: it sets `failed` then reads this
            // count; a launch adds here then re-reads `failed`. One of the
            // two always sees the other.
            d.gpu_kernels.fetch_add(1, Ordering::SeqCst);
        }
        Self { drives }
    }

    /// `false` if one of the drives failed or is being reset (the launch
    /// must then not go ahead).
    pub fn all_alive(&self) -> bool {
        self.drives.iter().all(|d| !d.failed.load(Ordering::SeqCst) && d.is_alive())
    }
}

impl Drop for KernelsRunning {
    fn drop(&mut self) {
        for d in &self.drives {
            d.gpu_kernels.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
