//! Controller bring-up, admin commands and orderly shutdown (NVMe Base 2.0
//! sections 3.5.1 "Memory-based Controller Initialization", 3.6
//! "Shutdown", 5 "Admin Command Set").

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme_regs::opcode::{Cns, CreateIoCq, CreateIoSq, DeleteIoCq, DeleteIoSq, Identify, SetFeatures};
use nvme_regs::registers::offset;
use nvme_regs::{
    identify, Aqa, Cap, Cc, Csts, DecodeError, IdentifyController, IdentifyNamespace, NumberOfQueues,
    ShutdownNotification, ShutdownStatus, Sqe, Status,
};

use crate::device::NvmeDevice;
use crate::dma::{DmaBuffer, DmaError};
use crate::io::NamespaceInfo;
use crate::mmio::MmioError;
use crate::namespace::{ActiveNamespace, NamespaceError};
use crate::queue::{Completion, DataRef, QueueError, QueuePair, QueuePairConfig, SubmitError};

/// Floor for the CAP.TO-derived wait when a controller reports CAP.TO = 0.
pub const MIN_READY_TIMEOUT: Duration = Duration::from_millis(500);

/// Least time given to a normal shutdown (CC.SHN) to reach CSTS.SHST =
/// complete (Linux's default `shutdown_timeout`).
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Options for [`Controller::init`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerOptions {
    /// Admin SQ and CQ entries (clamped to CAP.MQES + 1 and to 4096).
    pub admin_entries: u32,
    /// I/O queue pairs to ask for with Set Features (Number of Queues).
    pub io_queues: u16,
    /// Memory page size in bytes (CC.MPS); `None` = the controller's
    /// minimum (CAP.MPSMIN), normally 4 KiB.
    pub page_size: Option<usize>,
    /// Upper bound on one command's transfer in bytes, applied on top of
    /// MDTS (and used when MDTS = 0, "no limit").
    pub max_transfer_cap: usize,
    /// Bound on each admin command.
    pub admin_timeout: Duration,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            admin_entries: 32,
            io_queues: 8,
            page_size: None,
            max_transfer_cap: 1 << 20,
            admin_timeout: Duration::from_secs(5),
        }
    }
}

/// Errors of bring-up, admin commands and shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// A register read all ones: the device is gone (surprise removal,
    /// dead link).
    #[error("{register} read all ones: the device is gone")]
    DeviceGone {
        /// The register read.
        register: &'static str,
    },
    /// CSTS.CFS is set: the controller hit a fatal error.
    #[error("controller fatal status (CSTS.CFS) during {during}")]
    Fatal {
        /// What the driver was doing.
        during: &'static str,
    },
    /// A bounded wait ran out.
    #[error("timed out after {waited:?} waiting for {what}; {state}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        waited: Duration,
        /// Queue/register state for diagnosis.
        state: String,
    },
    /// An admin command completed with an error status.
    #[error("{command} failed: {status}")]
    Command {
        /// Command name.
        command: &'static str,
        /// NVMe status.
        status: Status,
    },
    /// The controller returned data that does not decode.
    #[error("malformed {what} data from the controller")]
    Decode {
        /// What was decoded.
        what: &'static str,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// The controller lacks something this driver needs.
    #[error("unsupported controller: {0}")]
    Unsupported(String),
    /// A register access left BAR0.
    #[error("register access")]
    Mmio(#[from] MmioError),
    /// Queue creation failed on the host side.
    #[error("queue setup")]
    Queue(#[from] QueueError),
    /// DMA memory allocation or mapping failed.
    #[error("DMA memory")]
    Dma(#[from] DmaError),
    /// An admin command could not be queued.
    #[error("admin submission")]
    Submit(#[from] SubmitError),
    /// An I/O queue was asked beyond what the controller granted.
    #[error("I/O queue {qid} not available: the controller granted {granted}")]
    NoQueue {
        /// Queue asked for.
        qid: u16,
        /// Number granted by Set Features (Number of Queues).
        granted: u16,
    },
}

/// What Identify Controller told us, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    /// PCI Vendor ID.
    pub vid: u16,
    /// Serial number (trimmed ASCII).
    pub serial: String,
    /// Model number (trimmed ASCII).
    pub model: String,
    /// Firmware revision (trimmed ASCII).
    pub firmware: String,
    /// MDTS as reported (0 = no limit).
    pub mdts: u8,
    /// Number of namespaces (NN).
    pub nn: u32,
    /// Optional NVM Command Support (ONCS) bits.
    pub oncs: u16,
    /// Version (VER) as reported by Identify.
    pub ver: u32,
    /// Controller ID.
    pub cntlid: u16,
    /// Volatile Write Cache (VWC, byte 525): bit 0 set when the controller
    /// has a volatile write cache, so a completed write is durable only
    /// after a Flush (or FUA). NVMe Base 2.0 §5.17.2.1.
    pub vwc: u8,
}

impl ControllerInfo {
    /// `true` when the controller reports a volatile write cache (VWC bit 0).
    pub fn has_volatile_write_cache(&self) -> bool {
        self.vwc & 1 != 0
    }
}

/// A controller brought up by this driver: enabled, identified, with its
/// admin queue pair. I/O queue pairs are created with
/// [`Controller::create_io_queue_pair`] and handed to their user.
#[derive(Debug)]
pub struct Controller {
    device: Arc<dyn NvmeDevice>,
    cap: Cap,
    page_size: usize,
    ready_timeout: Duration,
    admin: QueuePair,
    scratch: DmaBuffer,
    info: ControllerInfo,
    /// Every active namespace, usable or not, in NSID order.
    active: Vec<ActiveNamespace>,
    /// The usable ones (no metadata), in NSID order.
    namespaces: Vec<NamespaceInfo>,
    max_transfer: usize,
    io_queues_granted: u16,
    /// I/O queue pairs whose CQ exists on the controller.
    live_queues: Vec<u16>,
    /// Of those, the ones whose SQ was already deleted
    /// ([`Controller::delete_io_sq`]).
    sq_deleted: Vec<u16>,
    opts: ControllerOptions,
    shut_down: bool,
}

impl Controller {
    /// Resets and enables the controller, creates the admin queues,
    /// identifies the controller and its active namespaces, and asks for
    /// `opts.io_queues` I/O queue pairs.
    ///
    /// Every wait is bounded by CAP.TO (floored at [`MIN_READY_TIMEOUT`]); a
    /// set CSTS.CFS ends a wait at once with [`ControllerError::Fatal`];
    /// all-ones registers give [`ControllerError::DeviceGone`].
    pub fn init(device: Arc<dyn NvmeDevice>, opts: ControllerOptions) -> Result<Self, ControllerError> {
        let bar = device.bar0();
        let cap = Cap(bar.read64(offset::CAP)?);
        if cap.is_all_ones() {
            return Err(ControllerError::DeviceGone { register: "CAP" });
        }
        if !cap.css_nvm() {
            return Err(ControllerError::Unsupported("no NVM command set (CAP.CSS bit 37)".into()));
        }
        let ready_timeout = Duration::from_millis(cap.timeout_ms()).max(MIN_READY_TIMEOUT);
        let page_size = opts.page_size.unwrap_or(cap.min_page_size());
        if !page_size.is_power_of_two() || page_size < cap.min_page_size() || page_size > cap.max_page_size()
        {
            return Err(ControllerError::Unsupported(format!(
                "memory page size {page_size} outside CAP.MPSMIN..MPSMAX ({}..={})",
                cap.min_page_size(),
                cap.max_page_size()
            )));
        }

        // 1. Disable and wait for CSTS.RDY = 0 (a fatal status is cleared by
        //    the reset, so CFS is not an error here).
        let cc = Cc(bar.read32(offset::CC)?);
        if cc.en() {
            // A controller caught mid-enable (EN = 1, RDY = 0) may not
            // handle EN going to 0 before RDY reaches 1 (SPDK waits too);
            // a fatal status ends that wait, the reset clears it.
            if !Csts(bar.read32(offset::CSTS)?).rdy() {
                let _ = wait_csts(&*device, ready_timeout, "CSTS.RDY = 1 before reset", false, |c| {
                    c.rdy() || c.cfs()
                });
            }
            bar.write32(offset::CC, cc.with_en(false).0)?;
        }
        wait_csts(&*device, ready_timeout, "CSTS.RDY = 0 after CC.EN = 0", false, |c| !c.rdy())?;

        // 2. Admin queues, AQA/ASQ/ACQ (64-bit registers as two halves).
        let admin_entries = opts.admin_entries.min(4096).min(cap.max_queue_entries()).max(2);
        let admin = QueuePair::new(
            &device,
            QueuePairConfig {
                qid: 0,
                sq_entries: admin_entries,
                cq_entries: admin_entries,
                max_outstanding: (admin_entries - 1) as u16,
                max_transfer: 4096,
                page_size,
                dstrd: cap.dstrd(),
            },
        )?;
        // 3. AQA/ASQ/ACQ, enable, wait for CSTS.RDY = 1.
        enable(&*device, &admin, page_size, ready_timeout)?;

        let scratch = DmaBuffer::new(&device, 4096)?;
        let mut ctrl = Self {
            device,
            cap,
            page_size,
            ready_timeout,
            admin,
            scratch,
            info: ControllerInfo {
                vid: 0,
                serial: String::new(),
                model: String::new(),
                firmware: String::new(),
                mdts: 0,
                nn: 0,
                oncs: 0,
                ver: 0,
                cntlid: 0,
                vwc: 0,
            },
            active: Vec::new(),
            namespaces: Vec::new(),
            max_transfer: 0,
            io_queues_granted: 0,
            live_queues: Vec::new(),
            sq_deleted: Vec::new(),
            opts,
            shut_down: false,
        };
        ctrl.identify()?;
        ctrl.set_number_of_queues()?;
        Ok(ctrl)
    }

    fn identify(&mut self) -> Result<(), ControllerError> {
        let mut page = [0u8; 4096];
        self.admin_with_data(Identify::new(Cns::Controller).build(), "Identify Controller", &mut page)?;
        let idc = IdentifyController::parse(&page)
            .map_err(|source| ControllerError::Decode { what: "Identify Controller", source })?;
        let text = |r: Result<&str, DecodeError>| {
            r.map(str::to_owned)
                .map_err(|source| ControllerError::Decode { what: "Identify Controller", source })
        };
        self.info = ControllerInfo {
            vid: idc.vid(),
            serial: text(idc.sn())?,
            model: text(idc.mn())?,
            firmware: text(idc.fr())?,
            mdts: idc.mdts(),
            nn: idc.nn(),
            oncs: idc.oncs(),
            ver: idc.ver(),
            cntlid: idc.cntlid(),
            vwc: idc.vwc(),
        };
        let mdts_limit = idc.max_transfer_bytes(self.cap.min_page_size());
        let cap = self.opts.max_transfer_cap.max(self.page_size);
        self.max_transfer = match mdts_limit {
            Some(m) => (m.min(cap as u64)) as usize,
            None => cap,
        };
        if self.max_transfer < self.page_size {
            return Err(ControllerError::Unsupported("MDTS below one memory page".into()));
        }

        // Active namespaces (CNS 02h), then each namespace (CNS 00h).
        self.admin_with_data(
            Identify::new(Cns::ActiveNamespaceList).nsid(0).build(),
            "Identify Active Namespace List",
            &mut page,
        )?;
        let nsids: Vec<u32> = identify::parse_active_namespace_list(&page)
            .map_err(|source| ControllerError::Decode { what: "Active Namespace List", source })?
            .collect();
        let mut active = Vec::with_capacity(nsids.len());
        for nsid in nsids {
            self.admin_with_data(
                Identify::new(Cns::Namespace).nsid(nsid).build(),
                "Identify Namespace",
                &mut page,
            )?;
            let ns = IdentifyNamespace::parse(&page)
                .and_then(|id| ActiveNamespace::from_identify(nsid, id))
                .map_err(|source| ControllerError::Decode { what: "Identify Namespace", source })?;
            if ns.format.has_metadata() {
                tracing::warn!(
                    nsid,
                    metadata_bytes = ns.format.metadata_size,
                    layout = ns.format.metadata_layout(),
                    lbaf = ns.format.lbaf_index,
                    "namespace formatted with metadata: listed, but not usable by tutti"
                );
            }
            active.push(ns);
        }
        self.namespaces = active.iter().filter_map(|ns| ns.usable().ok()).collect();
        self.active = active;
        Ok(())
    }

    fn set_number_of_queues(&mut self) -> Result<(), ControllerError> {
        let want = self.opts.io_queues.max(1);
        let sqe = SetFeatures::number_of_queues(want, want)
            .ok_or_else(|| ControllerError::Unsupported("zero I/O queues requested".into()))?
            .build();
        let c = self.admin_command(sqe, "Set Features (Number of Queues)")?;
        let granted = NumberOfQueues::from_dw0(c.dw0);
        self.io_queues_granted = granted.sq_count.min(granted.cq_count).min(u32::from(want)) as u16;
        Ok(())
    }

    /// The device this controller drives.
    pub fn device(&self) -> &Arc<dyn NvmeDevice> {
        &self.device
    }

    /// CAP as read at bring-up.
    pub fn cap(&self) -> Cap {
        self.cap
    }

    /// Memory page size in use (CC.MPS), bytes.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Largest transfer of one command in bytes (MDTS, capped by
    /// [`ControllerOptions::max_transfer_cap`]).
    pub fn max_transfer(&self) -> usize {
        self.max_transfer
    }

    /// Identify Controller facts.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// The usable active namespaces (formatted without metadata), in NSID
    /// order. [`Controller::active_namespaces`] lists all of them.
    pub fn namespaces(&self) -> &[NamespaceInfo] {
        &self.namespaces
    }

    /// Namespace `nsid`, if active and usable (formatted without metadata);
    /// [`Controller::usable_namespace`] says why not.
    pub fn namespace(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }

    /// Every active namespace (Identify CNS 02h), usable or not, with its
    /// formatted LBA format and the formats it supports, in NSID order.
    pub fn active_namespaces(&self) -> &[ActiveNamespace] {
        &self.active
    }

    /// Active namespace `nsid`, usable or not; `None` if it is not active.
    pub fn namespace_status(&self, nsid: u32) -> Option<&ActiveNamespace> {
        self.active.iter().find(|n| n.nsid == nsid)
    }

    /// Namespace `nsid` for I/O, or why it cannot be used:
    /// [`NamespaceError::NotActive`] (with the active NSIDs) or
    /// [`NamespaceError::Metadata`] (formatted with metadata, with what to
    /// do about it).
    pub fn usable_namespace(&self, nsid: u32) -> Result<NamespaceInfo, NamespaceError> {
        self.namespace_status(nsid)
            .ok_or_else(|| NamespaceError::NotActive {
                nsid,
                active: self.active.iter().map(|n| n.nsid).collect(),
            })?
            .usable()
    }

    /// Changes the bound on each later admin command.
    pub fn set_admin_timeout(&mut self, timeout: Duration) {
        self.opts.admin_timeout = timeout;
    }

    /// I/O queue pairs granted by Set Features (Number of Queues).
    pub fn io_queues_granted(&self) -> u16 {
        self.io_queues_granted
    }

    /// Current CSTS.
    pub fn csts(&self) -> Result<Csts, ControllerError> {
        let csts = Csts(self.device.bar0().read32(offset::CSTS)?);
        if csts.is_all_ones() {
            return Err(ControllerError::DeviceGone { register: "CSTS" });
        }
        Ok(csts)
    }

    /// Runs one admin command without data and waits (bounded) for it.
    pub fn admin_command(&mut self, sqe: Sqe, name: &'static str) -> Result<Completion, ControllerError> {
        self.admin_submit(sqe, None, name)
    }

    /// Runs one admin command that transfers up to 4096 bytes from the
    /// controller into `out` (Identify, Get Log Page).
    pub fn admin_with_data(
        &mut self,
        sqe: Sqe,
        name: &'static str,
        out: &mut [u8],
    ) -> Result<Completion, ControllerError> {
        let len = out.len().min(4096);
        self.scratch.fill(0);
        let mapping = self.scratch.mapping().clone();
        let c =
            self.admin_submit(sqe, Some(DataRef { mapping: &mapping, offset: 0, len: len.max(4) }), name)?;
        self.scratch.read_bytes(0, &mut out[..len])?;
        Ok(c)
    }

    fn admin_submit(
        &mut self,
        sqe: Sqe,
        data: Option<DataRef<'_>>,
        name: &'static str,
    ) -> Result<Completion, ControllerError> {
        let cid = self.admin.submit(sqe, data, 0)?;
        self.admin.ring();
        let deadline = Instant::now() + self.opts.admin_timeout;
        let mut done = None;
        let mut spins = 0u32;
        loop {
            self.admin.poll(|c| {
                if c.cid == cid {
                    done = Some(c);
                }
            });
            if let Some(c) = done {
                if !c.status.is_success() {
                    return Err(ControllerError::Command { command: name, status: c.status });
                }
                return Ok(c);
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                let csts = self.csts()?;
                if csts.cfs() {
                    return Err(ControllerError::Fatal { during: name });
                }
                if Instant::now() >= deadline {
                    // The controller may still write this command's data:
                    // never hand the scratch page to another command.
                    if data.is_some() {
                        if let Ok(fresh) = DmaBuffer::new(&self.device, 4096) {
                            std::mem::replace(&mut self.scratch, fresh).leak_until_reset();
                        }
                    }
                    return Err(ControllerError::Timeout {
                        what: name,
                        waited: self.opts.admin_timeout,
                        state: self.admin.dump(),
                    });
                }
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Creates I/O queue pair `qid` (1..=granted): allocates its memory,
    /// then Create I/O CQ before Create I/O SQ. `entries` is clamped to
    /// CAP.MQES + 1. `max_outstanding` command IDs are available on it.
    pub fn create_io_queue_pair(
        &mut self,
        qid: u16,
        entries: u32,
        max_outstanding: u16,
    ) -> Result<QueuePair, ControllerError> {
        if qid == 0 || qid > self.io_queues_granted || self.live_queues.contains(&qid) {
            return Err(ControllerError::NoQueue { qid, granted: self.io_queues_granted });
        }
        let entries = entries.min(self.cap.max_queue_entries()).max(2);
        let mut qp = QueuePair::new(
            &self.device,
            QueuePairConfig {
                qid,
                sq_entries: entries,
                cq_entries: entries,
                max_outstanding,
                max_transfer: self.max_transfer,
                page_size: self.page_size,
                dstrd: self.cap.dstrd(),
            },
        )?;
        self.recreate_io_queue_pair(&mut qp)?;
        Ok(qp)
    }

    /// Controller-level reset (NVMe Base 2.0 3.7.2): CC.EN = 0 and wait for
    /// CSTS.RDY = 0 (which also clears CSTS.CFS and deletes every queue on
    /// the controller), then the admin queue is re-programmed on the same
    /// memory, the controller re-enabled, re-identified, and the I/O queue
    /// count asked for again.
    ///
    /// Every command outstanding on any queue is gone: the owners of I/O
    /// queue pairs must call [`QueuePair::reset_after_controller_reset`]
    /// (failing what it returns) and then
    /// [`Controller::recreate_io_queue_pair`]. After the reset the
    /// controller no longer touches memory of the old commands.
    pub fn reset(&mut self) -> Result<(), ControllerError> {
        let bar = self.device.bar0();
        let cc = Cc(bar.read32(offset::CC)?);
        if Cc(u32::MAX) == cc {
            return Err(ControllerError::DeviceGone { register: "CC" });
        }
        bar.write32(offset::CC, cc.with_en(false).with_shn(ShutdownNotification::None).0)?;
        wait_csts(&*self.device, self.ready_timeout, "CSTS.RDY = 0 for reset", false, |c| !c.rdy())?;
        self.live_queues.clear();
        self.sq_deleted.clear();
        // Nothing on the admin queue can complete any more.
        let lost = self.admin.reset_after_controller_reset();
        if !lost.is_empty() {
            // The scratch page may have belonged to one of them; the reset
            // ended its DMA, so it can be reused.
            tracing::warn!(commands = lost.len(), "admin commands lost in the reset");
        }
        enable(&*self.device, &self.admin, self.page_size, self.ready_timeout)?;
        self.shut_down = false;
        self.identify()?;
        self.set_number_of_queues()
    }

    /// Creates I/O queue pair `qp` on the controller, on the pair's memory:
    /// Create I/O CQ, then Create I/O SQ. [`Controller::create_io_queue_pair`]
    /// uses it; after [`Controller::reset`] and
    /// [`QueuePair::reset_after_controller_reset`] it creates the queue again.
    pub fn recreate_io_queue_pair(&mut self, qp: &mut QueuePair) -> Result<(), ControllerError> {
        let qid = qp.qid();
        if qid == 0 || qid > self.io_queues_granted || self.live_queues.contains(&qid) {
            return Err(ControllerError::NoQueue { qid, granted: self.io_queues_granted });
        }
        if !qp.prepare_for_create() {
            return Err(ControllerError::Unsupported(format!(
                "queue {qid} still has {} commands outstanding",
                qp.outstanding()
            )));
        }
        let entries = qp.sq().size();
        let (sq_base, cq_base) = (qp.sq().memory().device_addr(0)?, qp.cq().memory().device_addr(0)?);
        self.create_io_queues_at(qid, entries, sq_base, cq_base)
    }

    /// Creates I/O queue pair `qid` of `entries` entries per ring on ring
    /// memory at device addresses `sq_base` and `cq_base` (each physically
    /// contiguous, memory-page aligned, zeroed, and mapped for the device
    /// by the caller): Create I/O CQ, then Create I/O SQ (NVMe Base 2.0
    /// 5.4, 5.5). For rings that no [`QueuePair`] of this process drives
    /// (a daemon granting them to another process).
    ///
    /// # Errors
    ///
    /// [`ControllerError::NoQueue`] for a qid outside the granted range or
    /// live already; the admin commands' errors (a failed Create I/O SQ
    /// deletes the CQ again).
    pub fn create_io_queues_at(
        &mut self,
        qid: u16,
        entries: u32,
        sq_base: u64,
        cq_base: u64,
    ) -> Result<(), ControllerError> {
        if qid == 0 || qid > self.io_queues_granted || self.live_queues.contains(&qid) {
            return Err(ControllerError::NoQueue { qid, granted: self.io_queues_granted });
        }
        let mut cq = CreateIoCq::new(qid, entries).build();
        cq.set_prp(cq_base, 0);
        self.admin_command(cq, "Create I/O Completion Queue")?;
        let mut sq = CreateIoSq::new(qid, entries, qid).build();
        sq.set_prp(sq_base, 0);
        if let Err(e) = self.admin_command(sq, "Create I/O Submission Queue") {
            let _ = self.admin_command(DeleteIoCq::new(qid).build(), "Delete I/O Completion Queue");
            return Err(e);
        }
        self.live_queues.push(qid);
        Ok(())
    }

    /// Deletes the SQ of I/O queue `qid` that no [`QueuePair`] of this
    /// process drives (Delete I/O SQ, NVMe Base 2.0 5.7): the controller
    /// aborts what it had fetched. [`Controller::delete_io_cq`] follows.
    ///
    /// # Errors
    ///
    /// [`ControllerError::NoQueue`]; the admin command's errors.
    pub fn delete_io_sq_of(&mut self, qid: u16) -> Result<(), ControllerError> {
        self.delete_sq(qid)
    }

    /// Deletes the SQ of I/O queue pair `qp` (Delete I/O SQ, NVMe Base 2.0
    /// 5.7) and marks the pair's SQ deleted ([`QueuePair::is_sq_deleted`]):
    /// one call records the deletion on both sides. The controller
    /// completes each command of it that was fetched but not finished, on
    /// the pair's CQ, normally or with "Command Aborted due to SQ Deletion"
    /// (SCT 0h, SC 08h), and drops entries it had not fetched. The owner of
    /// the pair then reaps the CQ (so every outstanding command gets its one
    /// completion) before [`Controller::delete_io_cq`].
    ///
    /// # Errors
    ///
    /// [`ControllerError::NoQueue`] when the queue does not exist on the
    /// controller or its SQ is already deleted; the admin command's errors.
    pub fn delete_io_sq(&mut self, qp: &mut QueuePair) -> Result<(), ControllerError> {
        self.delete_sq(qp.qid())?;
        qp.sq_was_deleted();
        Ok(())
    }

    /// Delete I/O SQ `qid` on the controller; the pair, if any, is marked by
    /// the caller.
    fn delete_sq(&mut self, qid: u16) -> Result<(), ControllerError> {
        if !self.live_queues.contains(&qid) || self.sq_deleted.contains(&qid) {
            return Err(ControllerError::NoQueue { qid, granted: self.io_queues_granted });
        }
        self.admin_command(DeleteIoSq::new(qid).build(), "Delete I/O Submission Queue")?;
        self.sq_deleted.push(qid);
        Ok(())
    }

    /// Deletes the CQ of I/O queue pair `qid` (Delete I/O CQ), deleting its
    /// SQ first if [`Controller::delete_io_sq`] has not. Completions not
    /// reaped by then are lost. The caller keeps the [`QueuePair`]'s memory
    /// alive until this returns.
    pub fn delete_io_cq(&mut self, qid: u16) -> Result<(), ControllerError> {
        if !self.live_queues.contains(&qid) {
            return Err(ControllerError::NoQueue { qid, granted: self.io_queues_granted });
        }
        if !self.sq_deleted.contains(&qid) {
            self.delete_sq(qid)?;
        }
        self.admin_command(DeleteIoCq::new(qid).build(), "Delete I/O Completion Queue")?;
        self.live_queues.retain(|&q| q != qid);
        self.sq_deleted.retain(|&q| q != qid);
        Ok(())
    }

    /// Deletes I/O queue pair `qid` on the controller: the SQ first, then
    /// its CQ, with nothing reaped in between (use [`Controller::delete_io_sq`]
    /// and [`Controller::delete_io_cq`] to reap the aborted commands). The
    /// caller keeps the [`QueuePair`]'s memory alive until this returns.
    pub fn delete_io_queue_pair(&mut self, qid: u16) -> Result<(), ControllerError> {
        self.delete_io_cq(qid)
    }

    /// I/O queue pairs that exist on the controller (their CQ at least).
    pub fn live_io_queues(&self) -> &[u16] {
        &self.live_queues
    }

    /// Orderly shutdown: deletes every remaining I/O SQ, then every
    /// remaining I/O CQ, then sets CC.SHN = 01b (normal) and waits (bounded
    /// by CAP.TO, at least [`SHUTDOWN_TIMEOUT`]) for CSTS.SHST = 10b
    /// (complete). The caller stops submitting and drains I/O first, and to
    /// match aborted commands to their requests deletes each SQ itself and
    /// reaps its CQ ([`Controller::delete_io_sq`]) before calling this.
    pub fn shutdown(&mut self) -> Result<(), ControllerError> {
        let qids = self.live_queues.clone();
        let mut first_err = None;
        for &q in &qids {
            if self.sq_deleted.contains(&q) {
                continue;
            }
            if let Err(e) = self.delete_sq(q) {
                first_err.get_or_insert(e);
            }
        }
        for &q in &qids {
            if let Err(e) = self.admin_command(DeleteIoCq::new(q).build(), "Delete I/O Completion Queue") {
                first_err.get_or_insert(e);
            }
        }
        self.live_queues.clear();
        self.sq_deleted.clear();
        let bar = self.device.bar0();
        let cc = Cc(bar.read32(offset::CC)?);
        bar.write32(offset::CC, cc.with_shn(ShutdownNotification::Normal).0)?;
        // CAP.TO bounds ready transitions, not shutdown (RTD3E does); like
        // Linux, allow at least SHUTDOWN_TIMEOUT.
        let t = self.ready_timeout.max(SHUTDOWN_TIMEOUT);
        wait_csts(&*self.device, t, "CSTS.SHST = complete", true, |c| c.shst() == ShutdownStatus::Complete)?;
        self.shut_down = true;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Controller {
    /// A controller dropped without [`Controller::shutdown`] (an error path,
    /// a panic) is disabled (CC.EN = 0, bounded wait for CSTS.RDY = 0)
    /// before its admin queue memory is freed, so it cannot DMA into memory
    /// that is about to be reused.
    fn drop(&mut self) {
        if self.shut_down {
            return;
        }
        let bar = self.device.bar0();
        if let Ok(cc) = bar.read32(offset::CC).map(Cc) {
            if cc.en() && bar.write32(offset::CC, cc.with_en(false).0).is_ok() {
                let _ =
                    wait_csts(&*self.device, self.ready_timeout, "CSTS.RDY = 0 on drop", false, |c| !c.rdy());
            }
        }
    }
}

/// Programs AQA/ASQ/ACQ for `admin` (64-bit registers as two halves, low
/// first), writes CC with EN = 1 (IOSQES 6, IOCQES 4, MPS from `page_size`,
/// NVM command set), and waits for CSTS.RDY = 1, failing at once on
/// CSTS.CFS (NVMe Base 2.0 3.5.1).
fn enable(
    device: &dyn NvmeDevice,
    admin: &QueuePair,
    page_size: usize,
    ready_timeout: Duration,
) -> Result<(), ControllerError> {
    let bar = device.bar0();
    let entries = admin.sq().size();
    bar.write32(offset::AQA, Aqa::new((entries - 1) as u16, (admin.cq().size() - 1) as u16).0)?;
    bar.write64(offset::ASQ, admin.sq().memory().device_addr(0)?)?;
    bar.write64(offset::ACQ, admin.cq().memory().device_addr(0)?)?;
    let mps = page_size.trailing_zeros().saturating_sub(12);
    let cc = Cc(0)
        .with_iosqes(6)
        .with_iocqes(4)
        .with_mps(mps as u8)
        .with_css(0)
        .with_ams(0)
        .with_shn(ShutdownNotification::None)
        .with_en(true);
    bar.write32(offset::CC, cc.0)?;
    wait_csts(device, ready_timeout, "CSTS.RDY = 1 after CC.EN = 1", true, |c| c.rdy())
}

/// Polls CSTS until `done` holds, `timeout` passes, CSTS reads all ones, or
/// (when `fail_on_cfs`) CSTS.CFS is set.
fn wait_csts(
    device: &dyn NvmeDevice,
    timeout: Duration,
    what: &'static str,
    fail_on_cfs: bool,
    mut done: impl FnMut(Csts) -> bool,
) -> Result<(), ControllerError> {
    let start = Instant::now();
    loop {
        let csts = Csts(device.bar0().read32(offset::CSTS)?);
        if csts.is_all_ones() {
            return Err(ControllerError::DeviceGone { register: "CSTS" });
        }
        if fail_on_cfs && csts.cfs() {
            return Err(ControllerError::Fatal { during: what });
        }
        if done(csts) {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(ControllerError::Timeout {
                what,
                waited: timeout,
                state: format!("CSTS = {:#010x}", csts.0),
            });
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_device::DeadDevice;

    fn cap(to_500ms: u8) -> Cap {
        Cap(0).with_mqes_z(63).with_css_nvm(true).with_to_500ms(to_500ms)
    }

    #[test]
    fn csts_cfs_ends_the_enable_wait_at_once() {
        // CAP.TO = 60 s; CFS must not wait for it.
        let dev = DeadDevice::start(cap(120), 0b10);
        let t = Instant::now();
        let e = Controller::init(dev, ControllerOptions::default()).unwrap_err();
        assert!(matches!(e, ControllerError::Fatal { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn ready_that_never_comes_times_out_at_cap_to() {
        // CAP.TO = 1 (500 ms): RDY stays 0 after CC.EN = 1.
        let dev = DeadDevice::start(cap(1), 0);
        let t = Instant::now();
        let e = Controller::init(dev, ControllerOptions::default()).unwrap_err();
        assert!(matches!(e, ControllerError::Timeout { what: "CSTS.RDY = 1 after CC.EN = 1", .. }), "{e}");
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(500) && waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn cap_to_zero_gets_the_documented_floor() {
        let dev = DeadDevice::start(cap(0), 0);
        let t = Instant::now();
        assert!(matches!(
            Controller::init(dev, ControllerOptions::default()),
            Err(ControllerError::Timeout { .. })
        ));
        assert!(t.elapsed() >= MIN_READY_TIMEOUT);
    }

    #[test]
    fn all_ones_registers_mean_the_device_is_gone() {
        let dev = DeadDevice::start(Cap(u64::MAX), u32::MAX);
        assert!(matches!(
            Controller::init(dev, ControllerOptions::default()),
            Err(ControllerError::DeviceGone { register: "CAP" })
        ));
        // CAP fine, CSTS all ones (surprise removal during bring-up).
        let dev = DeadDevice::start(cap(1), u32::MAX);
        assert!(matches!(
            Controller::init(dev, ControllerOptions::default()),
            Err(ControllerError::DeviceGone { register: "CSTS" })
        ));
    }

    #[test]
    fn aqa_asq_acq_are_programmed_before_enable() {
        let dev = DeadDevice::start(cap(1), 0);
        let _ = Controller::init(dev.clone(), ControllerOptions { admin_entries: 16, ..Default::default() });
        let bar = dev.bar0();
        let aqa = Aqa(bar.read32(offset::AQA).unwrap());
        assert_eq!((aqa.asqs_z(), aqa.acqs_z()), (15, 15));
        let (asq, acq) = (bar.read64(offset::ASQ).unwrap(), bar.read64(offset::ACQ).unwrap());
        assert!(asq >= 0x1_0000_0000 && asq % 4096 == 0 && acq % 4096 == 0 && asq != acq);
        let cc = Cc(bar.read32(offset::CC).unwrap());
        assert!(cc.en());
        assert_eq!((cc.iosqes(), cc.iocqes(), cc.mps(), cc.css()), (6, 4, 0, 0));
    }
}
