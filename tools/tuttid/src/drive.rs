//! A drive the daemon owns: its controller (emulated in the daemon, or a
//! vfio-bound PCI function), its admin queue (`nvm_queue::Controller`), the
//! pool of I/O queue ids, the grants of rings in shared memory, and how
//! clients reach its doorbells (the emulator's per-queue doorbell pages, or
//! shadow pages that a [`Forwarder`] copies to the real doorbells).

use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nvm_queue::{Controller, ControllerOptions, DmaMapping, NvmeDevice, VirtualClock};
use nvme_emu::{Emulator, SHARED_DOORBELL_DSTRD};
use tutti::config::{DriveConfig, PciDriveConfig};
use tuttid_proto::message::{DriveFacts, DriveStatus, ForwardingCounters, QueueGrant};
use tuttid_proto::shm::{sealed_memfd, MappedFd, PAGE};

use crate::config::{Allow, DriveEntry, PartitionEntry};
use crate::error::{DaemonError, DriveCause};
use crate::forward::{Forwarder, LeaseEnd, SHADOW_DSTRD};
use crate::mediate::{prp, MediatedQueue, Partition, QueueMemory, Regions, Tenant};

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

/// Most bytes one command moves on a mediated drive (the controller's
/// MDTS if smaller): bounds the daemon's PRP list copies (one 4 KiB list
/// page per command at 2 MiB).
pub const MEDIATED_MAX_TRANSFER: u64 = 2 << 20;

/// Most entries of a mediated queue pair (the controller's MQES if
/// smaller). The daemon keeps PRP list pages for each command slot, mapped
/// (on a `pci` drive pinned) for the controller and counted in no quota:
/// 4 MiB per queue pair here, 256 MiB at MQES 65535.
pub const MEDIATED_MAX_ENTRIES: u32 = crate::mediate::queue::MAX_ENTRIES;

/// A mediated drive's per-client rules.
#[derive(Debug)]
struct Mediation {
    partitions: Vec<PartitionEntry>,
    /// Namespace size in logical blocks.
    blocks: u64,
    /// List pages per command slot.
    pages_per_slot: usize,
}

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
    /// Mediated submission, when on.
    mediation: Option<Mediation>,
}

/// A granted queue pair's rings, as the daemon holds them. Dropping it
/// does not unmap anything from the device: [`Drive::reclaim_memory`] does,
/// after the queue is deleted.
#[derive(Debug)]
pub struct Rings {
    /// Queue id.
    pub qid: u16,
    /// Keeps the controller's SQ ring mapped in the daemon (the device
    /// DMAs from it).
    _sq: Arc<MappedFd>,
    /// Keeps the controller's CQ ring mapped (the forwarder reads it).
    cq: Arc<MappedFd>,
    /// Device mappings: SQ, CQ and, mediated, the PRP list pages.
    maps: Vec<DmaMapping>,
    /// Mediated: the client's rings and the list pages.
    mediated: Option<QueueMemory>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drive {
    /// Starts drive `name`: its device (an emulator whose doorbell pages
    /// are memfds at CAP.DSTRD = 9, or, with forwarded doorbells, a PCI
    /// function or an emulator at CAP.DSTRD = 0), controller bring-up with
    /// as many I/O queue pairs as it grants, and namespace `entry.nsid`.
    /// With `clock`, an emulated drive runs on that virtual clock, stepped
    /// by the waits of its driver and by its forwarding thread (it must
    /// have forwarded doorbells).
    ///
    /// # Errors
    ///
    /// [`DaemonError::Drive`] naming the drive.
    pub fn start(
        name: &str,
        entry: &DriveEntry,
        clock: Option<&Arc<VirtualClock>>,
    ) -> Result<Self, DaemonError> {
        let fail_by = |what: &str, e: DriveCause| DaemonError::Drive {
            drive: name.to_owned(),
            what: what.to_owned(),
            source: Some(e),
        };
        let forwarded = entry.forwarded();
        let (device, emulator, io_queues) = open_device(name, &entry.device, forwarded, clock)?;
        let opts = ControllerOptions { io_queues, ..ControllerOptions::default() };
        let controller = Controller::init(device.clone(), opts).map_err(|e| fail_by("bring-up", e.into()))?;
        let ns = controller.usable_namespace(entry.nsid).map_err(|e| fail_by("namespace", e.into()))?;
        let total = controller.io_queues_granted();
        let doorbells = match (&emulator, forwarded) {
            (Some(emu), false) => Doorbells::Pages(emu.clone()),
            _ => Doorbells::Forwarded(
                Forwarder::start(
                    name,
                    device.clone(),
                    (controller.cap().dstrd(), entry.forward_spin()),
                    clock.cloned(),
                )
                .map_err(|e| fail_by("forwarding thread", e.into()))?,
            ),
        };
        // Forwarded: the client sees the shadow layout (DSTRD 9, one page
        // per queue pair after the register page), never the real BAR0.
        let (dstrd, bar_len) = match doorbells {
            Doorbells::Pages(_) => (controller.cap().dstrd(), device.bar0().len() as u64),
            Doorbells::Forwarded(_) => (SHADOW_DSTRD, nvme_regs_doorbell_page(total) + PAGE as u64),
        };
        let mediation = mediation(name, entry, ns.blocks, controller.page_size())?;
        let max_transfer = match &mediation {
            Some(_) => (controller.max_transfer() as u64).min(MEDIATED_MAX_TRANSFER),
            None => controller.max_transfer() as u64,
        };
        let facts = DriveFacts {
            drive: name.to_owned(),
            nsid: ns.nsid,
            block_size: ns.block_size,
            blocks: ns.blocks,
            max_transfer,
            page_size: controller.page_size() as u32,
            dstrd,
            mqes: match &mediation {
                Some(_) => controller.cap().mqes_z().min(MEDIATED_MAX_ENTRIES as u16 - 1),
                None => controller.cap().mqes_z(),
            },
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
            mediation,
        })
    }

    /// Whether submission on this drive is mediated.
    pub fn mediated(&self) -> bool {
        self.mediation.is_some()
    }

    /// What a peer's commands may reach on a mediated drive (`None` on a
    /// drive without mediation): the served namespace, its partition, the
    /// block size and the mediated maximum transfer.
    ///
    /// # Errors
    ///
    /// [`DaemonError::NoPartition`]: the drive lists partitions, none for
    /// this peer.
    pub fn tenant(&self, uid: u32, gid: u32) -> Result<Option<Tenant>, DaemonError> {
        let Some(m) = &self.mediation else { return Ok(None) };
        let entry = crate::config::partition_of(&m.partitions, uid, gid).ok_or(DaemonError::NoPartition {
            drive: self.name.clone(),
            uid,
            gid,
        })?;
        Ok(Some(Tenant {
            nsid: self.facts.nsid,
            partition: entry.unwrap_or(Partition::whole(m.blocks)),
            block_size: u64::from(self.facts.block_size),
            max_transfer: self.facts.max_transfer,
        }))
    }

    /// The device (for mapping client memory).
    pub fn device(&self) -> &Arc<dyn NvmeDevice> {
        &self.device
    }

    /// Facts for a client that may hold `quota_left` more pairs and whose
    /// commands reach `tenant` (its partition is its namespace: `blocks`
    /// is the partition's length).
    pub fn facts(&self, quota_left: u16, tenant: Option<&Tenant>) -> DriveFacts {
        let blocks = tenant.map_or(self.facts.blocks, |t| t.partition.blocks);
        DriveFacts { quota_left, blocks, ..self.facts.clone() }
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
        tenant: Option<(Tenant, Arc<Regions>)>,
    ) -> Result<(Rings, QueueGrant, [OwnedFd; 3]), DaemonError> {
        // `facts.mqes`: at most MEDIATED_MAX_ENTRIES - 1 on a mediated drive.
        let entries = entries.clamp(2, u32::from(self.facts.mqes) + 1);
        let qid = lock(&self.free).pop().ok_or(DaemonError::PoolEmpty { drive: self.name.clone() })?;
        match self.create(qid, entries, domain, lease_end, tenant) {
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
        tenant: Option<(Tenant, Arc<Regions>)>,
    ) -> Result<(Rings, QueueGrant, [OwnedFd; 3]), DaemonError> {
        let fail = |what: String| DaemonError::Drive { drive: self.name.clone(), what, source: None };
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
        let r = match &self.mediation {
            Some(m) => self.create_mediated_rings(qid, entries, (sq_len, cq_len), m.pages_per_slot),
            None => self.create_rings(qid, entries, (sq_len, cq_len), domain),
        };
        if r.is_err() {
            self.stop_forwarding(qid);
        }
        let (rings, sq_fd, cq_fd) = r?;
        if let Doorbells::Forwarded(f) = &self.doorbells {
            // Cannot fail for a shadow just added, page-aligned rings and
            // list memory sized for the queue; if it did, the queue's
            // doorbells are never forwarded (the client sees no progress).
            let attached = match (tenant, &rings.mediated) {
                (Some((t, regions)), Some(mem)) => {
                    let page = u64::from(self.facts.page_size);
                    MediatedQueue::new((qid, entries, page), t, regions, mem.clone())
                        .and_then(|q| f.attach_mediated(qid, q, lease_end.clone()))
                }
                (None, None) => f.attach(qid, rings.cq.clone(), lease_end.clone()),
                _ => Err("mediation without a tenant".into()),
            };
            if let Err(e) = attached {
                tracing::error!(drive = %self.name, qid, error = %e, "forwarder attach");
            }
        }
        // Mediated: the client's rings are not mapped for the controller
        // (its SQ is never read by it): no device address to give.
        let iova = |i: usize| if rings.mediated.is_some() { 0 } else { rings.maps[i].pages()[0] };
        let grant = QueueGrant {
            qid,
            entries,
            sq_iova: iova(0),
            cq_iova: iova(1),
            sq_len: sq_len as u64,
            cq_len: cq_len as u64,
            doorbell_page: nvme_regs_doorbell_page(qid),
        };
        Ok((rings, grant, [sq_fd, cq_fd, db]))
    }

    /// Mediated: the client's rings (shared with it, never mapped for the
    /// controller), the controller's rings and `pages_per_slot` PRP list
    /// pages per command slot (daemon memory, mapped for the controller in
    /// the drive's one address space), then Create I/O CQ and SQ on the
    /// controller's rings.
    fn create_mediated_rings(
        &self,
        qid: u16,
        entries: u32,
        (sq_len, cq_len): (usize, usize),
        pages_per_slot: usize,
    ) -> Result<(Rings, OwnedFd, OwnedFd), DaemonError> {
        let fail_by = |what: &str, e: DriveCause| DaemonError::Drive {
            drive: self.name.clone(),
            what: what.to_owned(),
            source: Some(e),
        };
        let (client_sq, sq_fd) = self.ring(sq_len)?;
        let (client_cq, cq_fd) = self.ring(cq_len)?;
        let lists_len = (entries as usize - 1).max(1) * pages_per_slot.max(1) * self.facts.page_size as usize;
        let mut mine = Vec::new();
        for len in [sq_len, cq_len, lists_len.next_multiple_of(PAGE)] {
            mine.push(Arc::new(self.ring(len)?.0));
        }
        let mut maps = Vec::new();
        for m in &mine {
            match self.map(m, 0) {
                Ok(map) => maps.push(map),
                Err(e) => {
                    self.unmap_all(qid, &maps);
                    return Err(e);
                }
            }
        }
        let mem = QueueMemory {
            client_sq: Arc::new(client_sq),
            client_cq: Arc::new(client_cq),
            real_sq: mine[0].clone(),
            real_cq: mine[1].clone(),
            lists: mine[2].clone(),
            lists_iova: maps[2].pages()[0],
            pages_per_slot,
        };
        let (sq_iova, cq_iova) = (maps[0].pages()[0], maps[1].pages()[0]);
        if let Err(e) = lock(&self.controller).create_io_queues_at(qid, entries, sq_iova, cq_iova) {
            self.unmap_all(qid, &maps);
            return Err(fail_by(&format!("creating queue {qid}"), e.into()));
        }
        let rings = Rings { qid, _sq: mine[0].clone(), cq: mine[1].clone(), maps, mediated: Some(mem) };
        Ok((rings, sq_fd, cq_fd))
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
        let fail_by = |what: &str, e: DriveCause| DaemonError::Drive {
            drive: self.name.clone(),
            what: what.to_owned(),
            source: Some(e),
        };
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
        let (sq_iova, cq_iova) = (sq_map.pages()[0], cq_map.pages()[0]);
        let rings =
            Rings { qid, _sq: Arc::new(sq), cq: Arc::new(cq), maps: vec![sq_map, cq_map], mediated: None };
        // Before Create I/O SQ: the controller takes the SQ's domain then,
        // so the client's first command is already confined to its memory.
        // Emulated drives only: a real drive's isolation would be the
        // IOMMU's (PASID), not done.
        if let Some(emu) = self.emulator.as_ref().filter(|_| self.mediation.is_none()) {
            if let Err(e) = emu.set_sq_domain(qid, domain) {
                self.unmap_rings(&rings);
                return Err(fail_by(&format!("DMA domain of queue {qid}"), e.into()));
            }
        }
        if let Err(e) = lock(&self.controller).create_io_queues_at(qid, entries, sq_iova, cq_iova) {
            self.unmap_rings(&rings);
            return Err(fail_by(&format!("creating queue {qid}"), e.into()));
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
        let fail_by = |what: &str, e: DriveCause| DaemonError::Drive {
            drive: self.name.clone(),
            what: what.to_owned(),
            source: Some(e),
        };
        let fd = sealed_memfd("tuttid-ring", len).map_err(|e| fail_by("ring memfd", e.into()))?;
        let theirs = fd.try_clone().map_err(|e| fail_by("dup", e.into()))?;
        let m = MappedFd::map(fd, 0, len as u64).map_err(|e| fail_by("ring mmap", e.into()))?;
        Ok((m, theirs))
    }

    /// Maps `m` for the device in DMA domain `domain` (a client's: only
    /// that client's SQs can reach it); refuses a mapping that is not one
    /// run of device addresses (the protocol sends one base address).
    #[allow(unsafe_code)] // dma_map's contract, stated at the call
    pub fn map(&self, m: &MappedFd, domain: u32) -> Result<DmaMapping, DaemonError> {
        let fail = |what: String| DaemonError::Drive { drive: self.name.clone(), what, source: None };
        let fail_by = |what: &str, e: DriveCause| DaemonError::Drive {
            drive: self.name.clone(),
            what: what.to_owned(),
            source: Some(e),
        };
        let ptr = NonNull::new(m.as_ptr()).ok_or_else(|| fail("null mapping".into()))?;
        // SAFETY: `m` stays mapped until after `dma_unmap` of this mapping
        // (its owner, a `Rings` or a registration, is dropped only after
        // `reclaim_memory`/`unregister` unmapped it, or is leaked).
        let map = match &self.emulator {
            // Mediated: one address space for everyone, as a real drive's
            // vfio container (the checks, not domains, isolate clients).
            // SAFETY: as stated above.
            Some(emu) if self.mediation.is_none() => unsafe { emu.dma_map_in_domain(ptr, m.len(), domain) },
            // A real drive (one IOMMU domain for the daemon's container) or
            // a mediated emulated one.
            // SAFETY: as stated above.
            _ => unsafe { self.device.dma_map(ptr, m.len()) },
        }
        .map_err(|e| fail_by("DMA mapping", e.into()))?;
        let contiguous = map.pages().windows(2).all(|w| w[1] == w[0] + PAGE as u64);
        if !contiguous {
            let _ = self.device.dma_unmap(&map);
            return Err(fail("device addresses not contiguous".into()));
        }
        Ok(map)
    }

    fn unmap_rings(&self, r: &Rings) {
        self.unmap_all(r.qid, &r.maps);
    }

    fn unmap_all(&self, qid: u16, maps: &[DmaMapping]) {
        for m in maps {
            if let Err(e) = self.device.dma_unmap(m) {
                tracing::error!(drive = %self.name, qid, error = %e, "ring unmap failed");
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
            forwarding: match &self.doorbells {
                Doorbells::Pages(_) => ForwardingCounters::default(),
                Doorbells::Forwarded(f) => f.stats.snapshot(),
            },
        }
    }

    /// Live I/O queues on the controller (for shutdown).
    pub fn shutdown(&self) {
        if let Doorbells::Forwarded(f) = &self.doorbells {
            f.stop();
            let st = f.stats.snapshot();
            tracing::info!(
                drive = %self.name,
                forwarded = st.doorbells_forwarded,
                invalid = st.doorbells_invalid,
                mediated = st.sqes_mediated,
                refused = st.sqes_refused,
                stray = st.stray_completions,
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

/// Drive `name`'s mediation rules, when its submission is mediated:
/// partitions inside the namespace of `blocks` blocks, a 4 KiB memory
/// page (the list copies are laid out in 4 KiB pages).
fn mediation(
    name: &str,
    entry: &DriveEntry,
    blocks: u64,
    page: usize,
) -> Result<Option<Mediation>, DaemonError> {
    let fail = |what: String| DaemonError::Drive { drive: name.to_owned(), what, source: None };
    if !entry.mediated() {
        if matches!(entry.device, DriveConfig::Pci(_)) {
            tracing::warn!(drive = %name, "mediated: false on a pci drive: its clients' PRPs reach every client's memory");
        }
        return Ok(None);
    }
    if page != PAGE {
        return Err(fail(format!(
            "mediated submission needs a {PAGE}-byte memory page, the controller runs {page}"
        )));
    }
    if let Some(p) = entry.partitions.iter().find(|p| p.range().end() > blocks) {
        return Err(fail(format!(
            "partition {}+{} is past the namespace's {blocks} blocks",
            p.first_lba, p.blocks
        )));
    }
    // Entries of the longest list: PRP1 covers at least 4 bytes.
    let per_cmd = MEDIATED_MAX_TRANSFER.div_ceil(PAGE as u64);
    let pages_per_slot = prp::list_pages(per_cmd, (PAGE / 8) as u64) as usize;
    Ok(Some(Mediation { partitions: entry.partitions.clone(), blocks, pages_per_slot }))
}

/// The drive's device: an emulator (doorbell pages at CAP.DSTRD = 9
/// unless `forwarded`; on `clock` if given, which needs `forwarded`: the
/// forwarding thread steps it) or a vfio-bound PCI function (never on a
/// virtual clock), and how many I/O queue pairs to ask of its controller.
type Opened = (Arc<dyn NvmeDevice>, Option<Arc<Emulator>>, u16);

fn open_device(
    name: &str,
    cfg: &DriveConfig,
    forwarded: bool,
    clock: Option<&Arc<VirtualClock>>,
) -> Result<Opened, DaemonError> {
    let fail = |what: String| DaemonError::Drive { drive: name.to_owned(), what, source: None };
    let fail_by = |what: &str, e: DriveCause| DaemonError::Drive {
        drive: name.to_owned(),
        what: what.to_owned(),
        source: Some(e),
    };
    match cfg {
        DriveConfig::Emulated(e) => {
            let mut ec = tutti::emulator_config(name, e);
            if !forwarded {
                ec.dstrd = SHARED_DOORBELL_DSTRD;
                ec.shared_doorbells = true;
            }
            let emulator = match clock {
                Some(_) if !forwarded => {
                    return Err(fail("a drive on a virtual clock needs forwarded doorbells".into()))
                }
                Some(c) => Emulator::start_on(ec, c.clone()),
                None => Emulator::start(ec),
            }
            .map_err(|e| fail_by("emulator", e.into()))?;
            let device: Arc<dyn NvmeDevice> = emulator.clone();
            Ok((device, Some(emulator), e.io_queues))
        }
        DriveConfig::Pci(_) if clock.is_some() => {
            Err(fail("a pci drive cannot run on a virtual clock".into()))
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
