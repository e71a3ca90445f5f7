//! A drive owned by `tuttid`, as a client process sees it: an
//! [`NvmeDevice`] whose register window holds only the doorbell pages of
//! the queue pairs granted to this client (every other page is a private
//! placeholder that reaches no device), whose `dma_map` registers
//! memfd-backed memory with the daemon, and whose own DMA buffers (PRP
//! lists) are shared memory. Queue pairs are built on the rings the
//! daemon created ([`DaemonDevice::grant_queue_pair`]).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use nvm_queue::{
    DeviceError, DmaBuffer, DmaMapping, HostMemory, Mmio, NvmeDevice, QueueError, QueuePair, QueuePairConfig,
};

use crate::client::Client;
use crate::error::ClientError;
use crate::message::DriveFacts;
use crate::shm::{lookup, MappedFd, SharedMemory, ShmError, Window, PAGE};

/// Errors setting up a daemon drive or one of its queue pairs.
#[derive(Debug, thiserror::Error)]
pub enum DaemonDriveError {
    /// The daemon refused or the connection failed.
    #[error("tuttid")]
    Client(#[from] ClientError),
    /// Mapping shared memory failed.
    #[error("shared memory")]
    Shm(#[from] ShmError),
    /// Building the queue pair failed.
    #[error("queue pair")]
    Queue(#[from] QueueError),
    /// The daemon's answer does not fit together (doorbells outside the
    /// granted page, rings too small).
    #[error("inconsistent grant from tuttid: {0}")]
    Inconsistent(&'static str),
}

/// One daemon-owned drive, opened by this client.
#[derive(Debug)]
pub struct DaemonDevice {
    name: String,
    drive: String,
    client: Arc<Client>,
    facts: DriveFacts,
    mmio: Mmio,
    // Declared after `mmio`: the window outlives the Mmio over it.
    _window: Window,
    /// Registration id of each mapping made by `dma_map`, by its first
    /// device address.
    registrations: Mutex<HashMap<u64, u64>>,
}

impl DaemonDevice {
    /// Opens `drive` on `client`'s daemon: asks for its facts and reserves
    /// a register window of its size (placeholders only).
    ///
    /// # Errors
    ///
    /// [`DaemonDriveError::Client`] (rules `unknown-drive`, `allow-list`);
    /// [`DaemonDriveError::Shm`].
    pub fn open(client: Arc<Client>, drive: &str) -> Result<Arc<Self>, DaemonDriveError> {
        let facts = client.open_drive(drive)?;
        let len = usize::try_from(facts.bar_len).map_err(|_| DaemonDriveError::Inconsistent("bar_len"))?;
        if !(0x2000..=(64 << 20)).contains(&len) {
            return Err(DaemonDriveError::Inconsistent("bar_len"));
        }
        let window = Window::new(len)?;
        // SAFETY: the window is mapped read-write for as long as `self`
        // (field order drops `mmio` first) and is only accessed through the
        // Mmio's atomic 32-bit operations.
        let mmio = unsafe { Mmio::new(window.as_ptr(), window.len()) }
            .map_err(|_| DaemonDriveError::Inconsistent("register window"))?;
        Ok(Arc::new(Self {
            name: format!("tuttid:{}:{drive}", client.socket()),
            drive: drive.to_owned(),
            client,
            facts,
            mmio,
            _window: window,
            registrations: Mutex::new(HashMap::new()),
        }))
    }

    /// What the daemon said about the drive.
    pub fn facts(&self) -> &DriveFacts {
        &self.facts
    }

    /// The connection (its liveness is the drive's).
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Asks for a queue pair of up to `entries` entries per ring, maps its
    /// doorbell page into the register window and its rings into this
    /// process, and returns the CPU queue pair on them (`max_outstanding`
    /// commands at once).
    ///
    /// # Errors
    ///
    /// [`DaemonDriveError`]: refusals (quota, pool empty), mapping
    /// failures, a grant whose doorbells or rings do not fit.
    pub fn grant_queue_pair(
        self: &Arc<Self>,
        entries: u32,
        max_outstanding: u16,
    ) -> Result<QueuePair, DaemonDriveError> {
        let (g, [sq_fd, cq_fd, db_fd]) = self.client.grant_queue(&self.drive, entries)?;
        let dstrd = self.facts.dstrd;
        let page =
            usize::try_from(g.doorbell_page).map_err(|_| DaemonDriveError::Inconsistent("doorbell page"))?;
        let inside = |off: usize| off >= page && off + 4 <= page + PAGE;
        let (sq_db, cq_db) = (
            nvme_regs::registers::doorbell_offset(g.qid, false, dstrd),
            nvme_regs::registers::doorbell_offset(g.qid, true, dstrd),
        );
        if !inside(sq_db) || !inside(cq_db) {
            return Err(DaemonDriveError::Inconsistent("doorbells outside the granted page"));
        }
        self._window.map_page(page, db_fd.as_fd())?;
        let sq = MappedFd::map(sq_fd, 0, g.sq_len)?;
        let cq = MappedFd::map(cq_fd, 0, g.cq_len)?;
        let dev: Arc<dyn NvmeDevice> = self.clone();
        let ring = |m: MappedFd, iova: u64| {
            let (ptr, len) = (NonNull::new(m.as_ptr()).ok_or(QueueError::BadConfig("ring"))?, m.len());
            // SAFETY: `m` (moved into the buffer as its keeper) keeps the
            // ring mapped; the daemon mapped it for the device at `iova`
            // and unmaps it only after deleting the queue.
            unsafe { DmaBuffer::from_foreign(&dev, ptr, len, DmaMapping::contiguous(iova, len), Box::new(m)) }
                .map_err(QueueError::from)
        };
        let cfg = QueuePairConfig {
            qid: g.qid,
            sq_entries: g.entries,
            cq_entries: g.entries,
            max_outstanding,
            max_transfer: usize::try_from(self.facts.max_transfer).unwrap_or(usize::MAX),
            page_size: self.facts.page_size as usize,
            dstrd,
        };
        let (sq, cq) = (ring(sq, g.sq_iova)?, ring(cq, g.cq_iova)?);
        Ok(QueuePair::from_rings(&dev, cfg, sq, cq)?)
    }
}

impl NvmeDevice for DaemonDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn bar0(&self) -> &Mmio {
        &self.mmio
    }

    unsafe fn dma_map(&self, host: NonNull<u8>, len: usize) -> Result<DmaMapping, DeviceError> {
        let addr = host.as_ptr() as usize;
        let Some((shm, offset)) = lookup(addr, len) else {
            return Err(DeviceError::NotShareable { addr, len });
        };
        let (id, iova, mapped) = self
            .client
            .register_memory(&self.drive, shm.fd(), offset, len as u64)
            .map_err(|e| DeviceError::Owner { device: self.name.clone(), source: Box::new(e) })?;
        if mapped != len as u64 {
            let _ = self.client.unregister_memory(id);
            return Err(DeviceError::BadRange { addr, len });
        }
        self.registrations.lock().unwrap_or_else(|p| p.into_inner()).insert(iova, id);
        Ok(DmaMapping::contiguous(iova, len))
    }

    fn dma_unmap(&self, mapping: &DmaMapping) -> Result<(), DeviceError> {
        let iova = mapping.pages().first().copied().unwrap_or(0);
        let id = self.registrations.lock().unwrap_or_else(|p| p.into_inner()).remove(&iova);
        let Some(id) = id else {
            return Err(DeviceError::NotMapped { iova });
        };
        if self.client.is_dead() {
            // The daemon reclaimed the connection (queues deleted first);
            // the memfd stays alive in its mapping until it unmaps it.
            return Ok(());
        }
        self.client
            .unregister_memory(id)
            .map_err(|e| DeviceError::Owner { device: self.name.clone(), source: Box::new(e) })
    }

    fn alloc_host(&self, len: usize) -> Result<Option<HostMemory>, DeviceError> {
        let shm = SharedMemory::new(len)
            .map_err(|e| DeviceError::Owner { device: self.name.clone(), source: Box::new(e) })?;
        let ptr = NonNull::new(shm.as_ptr()).ok_or(DeviceError::BadRange { addr: 0, len })?;
        Ok(Some(HostMemory { ptr, len: shm.len(), owner: Box::new(shm) }))
    }
}
