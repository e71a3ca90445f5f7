//! Controller bring-up, admin commands and orderly shutdown (NVMe Base 2.0
//! sections 3.5.1 "Memory-based Controller Initialization", 3.6
//! "Shutdown", 5 "Admin Command Set").

use std::sync::Arc;
use std::time::Duration;

use nvme_regs::opcode::{Cns, Identify, SetFeatures};
use nvme_regs::registers::offset;
use nvme_regs::{
    identify, Cap, Cc, Csts, DecodeError, IdentifyController, IdentifyNamespace, NumberOfQueues,
};

use crate::device::NvmeDevice;
use crate::dma::DmaBuffer;
use crate::io::NamespaceInfo;
use crate::namespace::{ActiveNamespace, NamespaceError};
use crate::queue::{QueuePair, QueuePairConfig};

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

mod admin;
mod error;
mod io_queues;
mod lifecycle;

pub use error::ControllerError;
use lifecycle::{enable, wait_csts};

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
    /// Scratch pages of admin commands that timed out, with their CIDs:
    /// the controller may still write them. Each is freed when its command
    /// completes late, when a reset sees CSTS.RDY = 0, or when the drop
    /// sees it (after CC.EN = 0 and CSTS.RDY = 0 the controller no longer
    /// touches host memory); only a controller that never reports RDY = 0
    /// gets them handed to [`NvmeDevice::keep_dma`]. Bounded by the admin
    /// queue's CIDs: a timed-out command keeps its CID until it completes.
    timed_out: Vec<(u16, DmaBuffer)>,
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
            timed_out: Vec::new(),
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
}

#[cfg(test)]
mod tests;
