//! A drive the daemon owns: its controller (emulated in the daemon, or a
//! vfio-bound PCI function), its admin queue (`nvm_queue::Controller`), the
//! pool of I/O queue ids, the grants of rings in shared memory, and how
//! clients reach its doorbells (the emulator's per-queue doorbell pages, or
//! shadow pages that a [`Forwarder`] copies to the real doorbells).

use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nvm_queue::{Controller, ControllerOptions, DmaMapping, NvmeDevice};
use nvme_emu::{Emulator, SHARED_DOORBELL_DSTRD};
use tutti::config::{DriveConfig, PciDriveConfig};
use tuttid_proto::message::{DriveFacts, DriveStatus, QueueGrant};
use tuttid_proto::shm::{sealed_memfd, MappedFd, PAGE};

use crate::config::{Allow, DriveEntry};
use crate::error::DaemonError;
use crate::forward::{Forwarder, LeaseEnd, SHADOW_DSTRD};

/// How clients ring a drive's doorbells.
#[derive(Debug)]
enum Doorbells {
    /// The emulator's doorbell page of each queue pair (CAP.DSTRD = 9),
    /// passed to the client as is.
    Pages(Arc<Emulator>),
    /// Shadow pages forwarded by the daemon (docs/tuttid.md, "Forwarded
    /// doorbells").
    Forwarded(Arc<Forwarder>),
}

/// I/O queue pairs asked of a PCI controller (it grants what it has).
const PCI_IO_QUEUES: u16 = 64;

/// One drive.
#[derive(Debug)]
pub struct Drive {
    /// Name from the config.
    pub name: String,
    /// Who may use it.
    pub allow: Allow,
    /// Queue pairs per client.
    pub quota: u16,
    /// The emulated controller, if any (its DMA-fault counters).
    emulator: Option<Arc<Emulator>>,
    doorbells: Doorbells,
    device: Arc<dyn NvmeDevice>,
    controller: Mutex<Controller>,
    /// Queue ids not granted now.
    free: Mutex<Vec<u16>>,
    total: u16,
    facts: DriveFacts,
    /// Live memory registrations on this drive (all clients).
    pub registrations: AtomicU32,
    /// Queue pairs whose deletion failed (memory kept, qid withheld).
    pub quarantined: AtomicU32,
}

/// A granted queue pair's rings, as the daemon holds them. Dropping it
/// does not unmap anything from the device: [`Drive::reclaim_memory`] does,
/// after the queue is deleted.
#[derive(Debug)]
pub struct Rings {
    /// Queue id.
    pub qid: u16,
    /// Keeps the SQ ring mapped in the daemon (the device DMAs into it).
    _sq: MappedFd,
    /// Keeps the CQ ring mapped (shared with the forwarder, which reads it).
    cq: Arc<MappedFd>,
    sq_map: DmaMapping,
    cq_map: DmaMapping,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drive {
    /// Starts drive `name`: its device (an emulator whose doorbell pages
    /// are memfds at CAP.DSTRD = 9, or, with forwarded doorbells, a PCI
    /// function or an emulator at CAP.DSTRD = 0), controller bring-up with
    /// as many I/O queue pairs as it grants, and namespace `entry.nsid`.
    ///
    /// # Errors
    ///
    /// [`DaemonError::Drive`] naming the drive.
    pub fn start(name: &str, entry: &DriveEntry) -> Result<Self, DaemonError> {
        let fail = |what: String| DaemonError::Drive { drive: name.to_owned(), what };
        let forwarded = entry.forwarded();
        let (device, emulator, io_queues) = open_device(name, &entry.device, forwarded)?;
        let opts = ControllerOptions { io_queues, ..ControllerOptions::default() };
        let controller =
            Controller::init(device.clone(), opts).map_err(|e| fail(format!("bring-up: {e}")))?;
        let ns = controller.usable_namespace(entry.nsid).map_err(|e| fail(format!("namespace: {e}")))?;
        let total = controller.io_queues_granted();
        let doorbells = match (&emulator, forwarded) {
            (Some(emu), false) => Doorbells::Pages(emu.clone()),
            _ => Doorbells::Forwarded(
                Forwarder::start(name, device.clone(), controller.cap().dstrd(), entry.forward_spin())
                    .map_err(|e| fail(format!("forwarding thread: {e}")))?,
            ),
        };
        // Forwarded: the client sees the shadow layout (DSTRD 9, one page
        // per queue pair after the register page), never the real BAR0.
        let (dstrd, bar_len) = match doorbells {
            Doorbells::Pages(_) => (controller.cap().dstrd(), device.bar0().len() as u64),
            Doorbells::Forwarded(_) => (SHADOW_DSTRD, nvme_regs_doorbell_page(total) + PAGE as u64),
        };
        let facts = DriveFacts {
            drive: name.to_owned(),
            nsid: ns.nsid,
            block_size: ns.block_size,
            blocks: ns.blocks,
            max_transfer: controller.max_transfer() as u64,
            page_size: controller.page_size() as u32,
            dstrd,
            mqes: controller.cap().mqes_z(),
            bar_len,
            quota_left: entry.queues_per_client,
            volatile_write_cache: controller.info().has_volatile_write_cache(),
        };
        Ok(Self {
            name: name.to_owned(),
            allow: entry.allow.clone(),
            quota: entry.queues_per_client,
            emulator,
            doorbells,
            device,
            controller: Mutex::new(controller),
            free: Mutex::new((1..=total).rev().collect()),
            total,
            facts,
            registrations: AtomicU32::new(0),
            quarantined: AtomicU32::new(0),
        })
    }

    /// The device (for mapping client memory).
    pub fn device(&self) -> &Arc<dyn NvmeDevice> {
        &self.device
    }

    /// Facts for a client that may hold `quota_left` more pairs.
    pub fn facts(&self, quota_left: u16) -> DriveFacts {
        DriveFacts { quota_left, ..self.facts.clone() }
    }

    /// Creates a queue pair of up to `entries` entries per ring for the
    /// client of DMA domain `domain`: a qid from the pool, ring memfds
    /// mapped here and for the device (in `domain`), the SQ's domain set,
    /// Create I/O CQ then SQ. Returns the rings, the grant message and its
    /// 3 descriptors (SQ ring, CQ ring, doorbell page).
    ///
    /// # Errors
    ///
    /// [`DaemonError::PoolEmpty`]; [`DaemonError::Drive`] when memory or
    /// the admin commands fail (the qid goes back, nothing stays mapped).
    pub fn grant(
        &self,
        entries: u32,
        domain: u32,
        lease_end: &LeaseEnd,
    ) -> Result<(Rings, QueueGrant, [OwnedFd; 3]), DaemonError> {
        let entries = entries.clamp(2, u32::from(self.facts.mqes) + 1);
        let qid = lock(&self.free).pop().ok_or(DaemonError::PoolEmpty { drive: self.name.clone() })?;
        match self.create(qid, entries, domain, lease_end) {
            Ok(r) => Ok(r),
            Err(e) => {
                lock(&self.free).push(qid);
                Err(e)
            }
        }
    }

    fn create(
        &self,
        qid: u16,
        entries: u32,
        domain: u32,
        lease_end: &LeaseEnd,
    ) -> Result<(Rings, QueueGrant, [OwnedFd; 3]), DaemonError> {
        let fail = |what: String| DaemonError::Drive { drive: self.name.clone(), what };
        let sq_len = (entries as usize * 64).next_multiple_of(PAGE);
        let cq_len = (entries as usize * 16).next_multiple_of(PAGE);
        // A forwarded queue's shadow page is registered before the queue
        // exists: its words are 0, as the new queue's doorbells, so nothing
        // is forwarded until the client (who gets the page below) rings.
        let db = match &self.doorbells {
            Doorbells::Pages(emu) => {
                emu.doorbell_page_fd(qid).ok_or_else(|| fail(format!("no doorbell page for queue {qid}")))?
            }
            Doorbells::Forwarded(f) => f.add(qid, entries).map_err(fail)?,
        };
        let r = self.create_rings(qid, entries, (sq_len, cq_len), domain);
        if r.is_err() {
            self.stop_forwarding(qid);
        }
        let (rings, sq_fd, cq_fd) = r?;
        if let Doorbells::Forwarded(f) = &self.doorbells {
            // Cannot fail for a shadow just added and a page-aligned ring;
            // if it did, the queue's doorbells are never forwarded.
            if let Err(e) = f.attach(qid, rings.cq.clone(), lease_end.clone()) {
                tracing::error!(drive = %self.name, qid, error = %e, "forwarder attach");
            }
        }
        let grant = QueueGrant {
            qid,
            entries,
            sq_iova: rings.sq_map.pages()[0],
            cq_iova: rings.cq_map.pages()[0],
            sq_len: sq_len as u64,
            cq_len: cq_len as u64,
            doorbell_page: nvme_regs_doorbell_page(qid),
        };
        Ok((rings, grant, [sq_fd, cq_fd, db]))
    }

    /// Ring memfds mapped here and for the device, then Create I/O CQ and
    /// SQ on them.
    fn create_rings(
        &self,
        qid: u16,
        entries: u32,
        (sq_len, cq_len): (usize, usize),
        domain: u32,
    ) -> Result<(Rings, OwnedFd, OwnedFd), DaemonError> {
        let fail = |what: String| DaemonError::Drive { drive: self.name.clone(), what };
        let (sq, sq_fd) = self.ring(sq_len)?;
        let (cq, cq_fd) = self.ring(cq_len)?;
        let sq_map = self.map(&sq, domain)?;
        let cq_map = match self.map(&cq, domain) {
            Ok(m) => m,
            Err(e) => {
                let _ = self.device.dma_unmap(&sq_map);
                return Err(e);
            }
        };
        let rings = Rings { qid, _sq: sq, cq: Arc::new(cq), sq_map, cq_map };
        let (sq_iova, cq_iova) = (rings.sq_map.pages()[0], rings.cq_map.pages()[0]);
        // Before Create I/O SQ: the controller takes the SQ's domain then,
        // so the client's first command is already confined to its memory.
        // Emulated drives only: a real drive's isolation would be the
        // IOMMU's (PASID), not done.
        if let Some(emu) = &self.emulator {
            if let Err(e) = emu.set_sq_domain(qid, domain) {
                self.unmap_rings(&rings);
                return Err(fail(format!("DMA domain of queue {qid}: {e}")));
            }
        }
        if let Err(e) = lock(&self.controller).create_io_queues_at(qid, entries, sq_iova, cq_iova) {
            self.unmap_rings(&rings);
            return Err(fail(format!("creating queue {qid}: {e}")));
        }
        Ok((rings, sq_fd, cq_fd))
    }

    /// Forwarded doorbells: stop forwarding `qid`'s shadow page.
    fn stop_forwarding(&self, qid: u16) {
        if let Doorbells::Forwarded(f) = &self.doorbells {
            f.remove(qid);
        }
    }

    /// A zeroed, sealed ring memfd mapped here, and a descriptor for the client.
    fn ring(&self, len: usize) -> Result<(MappedFd, OwnedFd), DaemonError> {
        let fail = |what: String| DaemonError::Drive { drive: self.name.clone(), what };
        let fd = sealed_memfd("tuttid-ring", len).map_err(|e| fail(format!("ring memfd: {e}")))?;
        let theirs = fd.try_clone().map_err(|e| fail(format!("dup: {e}")))?;
        let m = MappedFd::map(fd, 0, len as u64).map_err(|e| fail(format!("ring mmap: {e}")))?;
        Ok((m, theirs))
    }

    /// Maps `m` for the device in DMA domain `domain` (a client's: only
    /// that client's SQs can reach it); refuses a mapping that is not one
    /// run of device addresses (the protocol sends one base address).
    #[allow(unsafe_code)] // dma_map's contract, stated at the call
    pub fn map(&self, m: &MappedFd, domain: u32) -> Result<DmaMapping, DaemonError> {
        let fail = |what: String| DaemonError::Drive { drive: self.name.clone(), what };
        let ptr = NonNull::new(m.as_ptr()).ok_or_else(|| fail("null mapping".into()))?;
        // SAFETY: `m` stays mapped until after `dma_unmap` of this mapping
        // (its owner, a `Rings` or a registration, is dropped only after
        // `reclaim_memory`/`unregister` unmapped it, or is leaked).
        let map = match &self.emulator {
            // SAFETY: as stated above.
            Some(emu) => unsafe { emu.dma_map_in_domain(ptr, m.len(), domain) },
            // A real drive: one IOMMU domain for the daemon's container.
            // SAFETY: as stated above.
            None => unsafe { self.device.dma_map(ptr, m.len()) },
        }
        .map_err(|e| fail(format!("DMA mapping: {e}")))?;
        let contiguous = map.pages().windows(2).all(|w| w[1] == w[0] + PAGE as u64);
        if !contiguous {
            let _ = self.device.dma_unmap(&map);
            return Err(fail("device addresses not contiguous".into()));
        }
        Ok(map)
    }

    fn unmap_rings(&self, r: &Rings) {
        for m in [&r.sq_map, &r.cq_map] {
            if let Err(e) = self.device.dma_unmap(m) {
                tracing::error!(drive = %self.name, qid = r.qid, error = %e, "ring unmap failed");
            }
        }
    }

    /// Delete I/O SQ `qid` (aborting what the controller had fetched).
    /// `false` when it failed: the queue is quarantined by the caller.
    pub fn delete_sq(&self, qid: u16) -> bool {
        // First: no forwarded doorbell write may reach a deleted queue.
        self.stop_forwarding(qid);
        match lock(&self.controller).delete_io_sq_of(qid) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(drive = %self.name, qid, error = %e, "Delete I/O SQ failed");
                false
            }
        }
    }

    /// Delete I/O CQ `qid` (after its SQ). `false` when it failed.
    pub fn delete_cq(&self, qid: u16) -> bool {
        match lock(&self.controller).delete_io_cq(qid) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(drive = %self.name, qid, error = %e, "Delete I/O CQ failed");
                false
            }
        }
    }

    /// After its SQ and CQ were deleted: unmaps the rings and returns the
    /// qid to the pool.
    pub fn reclaim_rings(&self, r: Rings) {
        self.unmap_rings(&r);
        // The old owner may still have the doorbell page mapped (a live
        // client whose lease expired): give the queue a new page. (A
        // forwarded queue's shadow page is new for every grant.)
        let renewed = match &self.doorbells {
            Doorbells::Pages(emu) => emu.renew_doorbell_page(r.qid).map(|_| ()).map_err(|e| e.to_string()),
            Doorbells::Forwarded(_) => Ok::<(), String>(()),
        };
        if let Err(e) = renewed {
            tracing::error!(drive = %self.name, qid = r.qid, error = %e, "doorbell page not renewed; qid withheld");
            self.quarantined.fetch_add(1, Ordering::Relaxed);
            return;
        }
        lock(&self.free).push(r.qid);
        drop(r);
    }

    /// Keeps `r` mapped forever and its qid out of the pool: its deletion
    /// failed, so the controller may still use it.
    pub fn quarantine(&self, r: Rings) {
        self.quarantined.fetch_add(1, Ordering::Relaxed);
        std::mem::forget(r);
    }

    /// The drive's row of the status report.
    pub fn status(&self) -> DriveStatus {
        let (dma_faults, sq_deletion_aborts) = self.emulator.as_ref().map_or((0, 0), |e| {
            let st = e.stats();
            (st.dma_faults, st.sq_deletion_aborts)
        });
        DriveStatus {
            name: self.name.clone(),
            queues_total: self.total,
            queues_free: lock(&self.free).len() as u16,
            registrations: self.registrations.load(Ordering::Relaxed),
            dma_faults,
            sq_deletion_aborts,
            quarantined: self.quarantined.load(Ordering::Relaxed),
        }
    }

    /// Live I/O queues on the controller (for shutdown).
    pub fn shutdown(&self) {
        if let Doorbells::Forwarded(f) = &self.doorbells {
            f.stop();
            let st = &f.stats;
            tracing::info!(
                drive = %self.name,
                forwarded = st.forwarded.load(Ordering::Relaxed),
                invalid = st.invalid.load(Ordering::Relaxed),
                "doorbell forwarding stopped"
            );
        }
        if let Err(e) = lock(&self.controller).shutdown() {
            tracing::warn!(drive = %self.name, error = %e, "controller shutdown");
        }
    }
}

impl Drop for Drive {
    /// Stops the forwarding thread (a drive dropped without `shutdown`,
    /// e.g. when another drive of the config failed to start).
    fn drop(&mut self) {
        if let Doorbells::Forwarded(f) = &self.doorbells {
            f.stop();
        }
    }
}

/// Offset of queue pair `qid`'s doorbell page at CAP.DSTRD = 9: SQyTDBL at
/// `1000h + 2y * 2048` = `1000h + y * 4096`, CQyHDBL 2048 bytes later.
fn nvme_regs_doorbell_page(qid: u16) -> u64 {
    0x1000 + u64::from(qid) * PAGE as u64
}

/// The drive's device: an emulator (doorbell pages at CAP.DSTRD = 9
/// unless `forwarded`) or a vfio-bound PCI function, and how many I/O
/// queue pairs to ask of its controller.
type Opened = (Arc<dyn NvmeDevice>, Option<Arc<Emulator>>, u16);

fn open_device(name: &str, cfg: &DriveConfig, forwarded: bool) -> Result<Opened, DaemonError> {
    let fail = |what: String| DaemonError::Drive { drive: name.to_owned(), what };
    match cfg {
        DriveConfig::Emulated(e) => {
            let mut ec = tutti::emulator_config(name, e);
            if !forwarded {
                ec.dstrd = SHARED_DOORBELL_DSTRD;
                ec.shared_doorbells = true;
            }
            let emulator = Emulator::start(ec).map_err(|e| fail(format!("emulator: {e}")))?;
            let device: Arc<dyn NvmeDevice> = emulator.clone();
            Ok((device, Some(emulator), e.io_queues))
        }
        DriveConfig::Pci(p) => Ok((open_pci(p).map_err(fail)?, None, PCI_IO_QUEUES)),
        _ => {
            Err(fail("only emulated and pci drives can be served (config validation refuses others)".into()))
        }
    }
}

/// Opens a vfio-bound function (`tutti-probe bind` first); its IOMMU
/// mappings are the daemon's container's. Never without an IOMMU (the
/// config refuses `allow_no_iommu`; this holds even if it did not).
fn open_pci(p: &PciDriveConfig) -> Result<Arc<dyn NvmeDevice>, String> {
    let addr: nvme_pci::PciAddr =
        p.addr.trim().parse().map_err(|e| format!("pci address {:?}: {e}", p.addr))?;
    let opts = nvme_pci::OpenOptions { allow_no_iommu: false, ..Default::default() };
    nvme_pci::open(&addr, &opts).map_err(|e| format!("opening {addr}: {e}"))
}
