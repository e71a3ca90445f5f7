//! The CPU queue pair: one SQ, its CQ, the command-ID table and per-command
//! PRP list pages.

use std::fmt::Write as _;
use std::sync::Arc;

use nvme_regs::registers::doorbell_offset;
use nvme_regs::{Sqe, Status};

use super::cid::{CidError, CidTable};
use super::cq::{CompletionQueue, CQE_SIZE};
use super::ring::Ring;
use super::sq::{SubmissionQueue, SQE_SIZE};
use crate::device::{DmaMapping, NvmeDevice};
use crate::dma::{DmaBuffer, DmaError};
use crate::mmio::MmioError;
use crate::prp::{DmaListPages, NoListPages, PrpBuilder, PrpError};

/// How long a CQ entry whose phase tag is set but whose body names another
/// SQ is left in place (re-read at each poll) before it is consumed as a
/// protocol error: long enough for a device that writes DW3 before the body
/// to finish, short enough that a truly foreign entry cannot stall the queue.
/// Measured on the device's clock ([`NvmeDevice::clock`]).
pub const UNSETTLED_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

/// Shape of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePairConfig {
    /// Queue identifier: 0 for the admin pair, 1.. for I/O pairs.
    pub qid: u16,
    /// SQ entries (QSIZE + 1), 2..=CAP.MQES + 1.
    pub sq_entries: u32,
    /// CQ entries (QSIZE + 1), 2..=CAP.MQES + 1.
    pub cq_entries: u32,
    /// Command IDs available, i.e. commands that may be outstanding at once
    /// (1..=32768). May exceed `sq_entries - 1`: SQ slots free up when the
    /// controller fetches a command (SQHD), not when it completes it.
    pub max_outstanding: u16,
    /// Largest data transfer of one command in bytes (from MDTS); sizes the
    /// per-command PRP list pages.
    pub max_transfer: usize,
    /// Memory page size in bytes (`2^(12 + CC.MPS)`).
    pub page_size: usize,
    /// CAP.DSTRD, for the doorbell offsets.
    pub dstrd: u8,
}

/// Errors creating a queue pair.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Entries, outstanding count or page size out of range.
    #[error("invalid queue pair shape: {0}")]
    BadConfig(&'static str),
    /// Allocating or mapping queue memory failed.
    #[error("queue memory")]
    Dma(#[from] DmaError),
    /// Queue memory is not one contiguous, page-aligned range of device
    /// addresses (required for PC = 1 and for ASQ/ACQ).
    #[error("{what} is not contiguous and memory-page aligned in device address space")]
    NotContiguous {
        /// Which memory.
        what: &'static str,
    },
    /// A doorbell lies outside BAR0.
    #[error("doorbell for queue {qid} is outside BAR0")]
    Doorbell {
        /// Queue identifier.
        qid: u16,
        /// The failed access.
        #[source]
        source: MmioError,
    },
}

/// Why a command was not queued. Nothing was written to the SQ.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// No SQ slot or no command ID free: poll completions and retry.
    #[error("queue {qid} is full")]
    QueueFull {
        /// Queue identifier.
        qid: u16,
    },
    /// The data buffer cannot be described with PRPs.
    #[error("data buffer")]
    Prp(#[from] PrpError),
    /// The controller deleted this queue's SQ (orderly shutdown): no more
    /// submissions until it is created again.
    #[error("submission queue {qid} was deleted")]
    SqDeleted {
        /// Queue identifier.
        qid: u16,
    },
}

/// A finished command, as reported by the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The caller's tag given at submission.
    pub tag: u64,
    /// Command identifier it ran under.
    pub cid: u16,
    /// NVMe status (success or SCT/SC/DNR).
    pub status: Status,
    /// Command-specific DW0 of the CQE.
    pub dw0: u32,
}

/// Counters of one queue pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Commands written to the SQ.
    pub submitted: u64,
    /// Completions matched to an outstanding command.
    pub completed: u64,
    /// CQEs whose CID matched no outstanding command (duplicate, stale or
    /// invented): counted and dropped, never completing another request.
    pub protocol_errors: u64,
    /// CQEs with an SQHD outside the ring or ahead of the tail (ignored).
    pub bad_sqhd: u64,
    /// CQEs naming another SQ than this pair's.
    pub wrong_sqid: u64,
    /// SQ tail doorbell writes ([`QueuePair::ring`] writes one only when
    /// entries were queued since the last write, so a batch costs one).
    pub sq_doorbell_writes: u64,
}

/// Data pointer input for [`QueuePair::submit`]: `len` bytes at byte
/// `offset` of a mapped buffer.
#[derive(Debug, Clone, Copy)]
pub struct DataRef<'a> {
    /// Device addresses of the buffer.
    pub mapping: &'a DmaMapping,
    /// Offset of the transfer in the buffer, bytes.
    pub offset: usize,
    /// Transfer length, bytes.
    pub len: usize,
}

/// An SQ/CQ pair driven by one CPU thread at a time (`&mut self`).
#[derive(Debug)]
pub struct QueuePair {
    sq: SubmissionQueue,
    cq: CompletionQueue,
    cids: CidTable<u64>,
    prp: PrpBuilder,
    lists: Option<DmaBuffer>,
    lists_offset: usize,
    list_pages_per_cmd: usize,
    stats: QueueStats,
    /// When the entry at the CQ head was first seen with a body naming
    /// another SQ (see `poll`).
    unsettled_since: Option<std::time::Instant>,
    /// The SQ was deleted on the controller: no submissions; SQHD in later
    /// CQEs means nothing.
    sq_deleted: bool,
    /// Keeps the device, and so the BAR0 window the doorbells point into,
    /// alive as long as the pair.
    device: Arc<dyn NvmeDevice>,
}

impl QueuePair {
    /// Allocates zeroed SQ, CQ and PRP list memory for `device` and takes
    /// the pair's doorbells from its BAR0. Creating the queues on the
    /// controller (AQA/ASQ/ACQ or Create I/O CQ/SQ) is the controller's job.
    pub fn new(device: &Arc<dyn NvmeDevice>, cfg: QueuePairConfig) -> Result<Self, QueueError> {
        if Ring::new(cfg.sq_entries).is_none() || Ring::new(cfg.cq_entries).is_none() {
            return Err(QueueError::BadConfig("SQ or CQ entries"));
        }
        // Queue memory must be one physically contiguous range (PC = 1)
        // whose base is aligned to the memory page size (ASQ/ACQ and the
        // PRP1 of Create I/O SQ/CQ, NVMe Base 2.0 3.1.4.10-11, 5.4/5.5).
        let sq_mem = DmaBuffer::new_aligned(device, cfg.sq_entries as usize * SQE_SIZE, cfg.page_size)?;
        let cq_mem = DmaBuffer::new_aligned(device, cfg.cq_entries as usize * CQE_SIZE, cfg.page_size)?;
        Self::from_rings(device, cfg, sq_mem, cq_mem)
    }

    /// A pair on ring memory that exists already (rings a daemon created on
    /// the controller and shared with this process): `sq_mem` holds
    /// `cfg.sq_entries` SQEs, `cq_mem` `cfg.cq_entries` CQEs, both zeroed
    /// when the queues were created. Takes the doorbells from the device's
    /// register window and allocates the PRP list pages.
    ///
    /// # Errors
    ///
    /// [`QueueError::BadConfig`] for a bad shape or rings too small;
    /// [`QueueError::NotContiguous`]; [`QueueError::Doorbell`];
    /// [`QueueError::Dma`] when the PRP list memory cannot be had.
    pub fn from_rings(
        device: &Arc<dyn NvmeDevice>,
        cfg: QueuePairConfig,
        sq_mem: DmaBuffer,
        cq_mem: DmaBuffer,
    ) -> Result<Self, QueueError> {
        let sq_ring = Ring::new(cfg.sq_entries).ok_or(QueueError::BadConfig("SQ entries"))?;
        let cq_ring = Ring::new(cfg.cq_entries).ok_or(QueueError::BadConfig("CQ entries"))?;
        let cids = CidTable::new(cfg.max_outstanding).ok_or(QueueError::BadConfig("max_outstanding"))?;
        let prp = PrpBuilder::new(cfg.page_size).map_err(|_| QueueError::BadConfig("page size"))?;
        if cfg.max_transfer == 0 {
            return Err(QueueError::BadConfig("max_transfer"));
        }
        if sq_mem.len() < cfg.sq_entries as usize * SQE_SIZE
            || cq_mem.len() < cfg.cq_entries as usize * CQE_SIZE
        {
            return Err(QueueError::BadConfig("ring memory smaller than its entries"));
        }
        let bar = device.bar0();
        let db = |is_cq| {
            // SAFETY: the doorbells live in `self.sq`/`self.cq`, and `self`
            // holds `device` (field `device`), which keeps its BAR0 window
            // mapped for as long as the pair exists.
            unsafe { bar.doorbell(doorbell_offset(cfg.qid, is_cq, cfg.dstrd)) }
                .map_err(|source| QueueError::Doorbell { qid: cfg.qid, source })
        };
        let (sq_db, cq_db) = (db(false)?, db(true)?);
        for (what, m) in [("SQ memory", &sq_mem), ("CQ memory", &cq_mem)] {
            let pages = m.mapping().pages();
            let contiguous = pages.windows(2).all(|w| w[1] == w[0] + crate::HOST_PAGE_SIZE as u64);
            if !contiguous || pages.first().is_none_or(|a| a % cfg.page_size as u64 != 0) {
                return Err(QueueError::NotContiguous { what });
            }
        }
        // Worst case: PRP1 one dword before a page boundary.
        let list_pages_per_cmd = prp.list_pages_needed(cfg.page_size as u64 - 4, cfg.max_transfer);
        let (lists, lists_offset) = if list_pages_per_cmd == 0 {
            (None, 0)
        } else {
            let bytes = list_pages_per_cmd * cfg.page_size * usize::from(cfg.max_outstanding);
            let buf = DmaBuffer::new(device, bytes + cfg.page_size)?;
            let base = buf.device_addr(0)?;
            let ps = cfg.page_size as u64;
            let offset = ((ps - base % ps) % ps) as usize;
            // Check the whole list area once (page aligned and contiguous in
            // device space, page by page), so submit can skip the check.
            let total = list_pages_per_cmd * usize::from(cfg.max_outstanding);
            if DmaListPages::new(&buf, offset, total, cfg.page_size).is_none() {
                return Err(QueueError::BadConfig("PRP list memory is not page aligned in device space"));
            }
            (Some(buf), offset)
        };
        Ok(Self {
            sq: SubmissionQueue::new(sq_mem, sq_ring, cfg.qid, sq_db),
            cq: CompletionQueue::new(cq_mem, cq_ring, cfg.qid, cq_db),
            cids,
            prp,
            lists,
            lists_offset,
            list_pages_per_cmd,
            stats: QueueStats::default(),
            unsettled_since: None,
            sq_deleted: false,
            device: device.clone(),
        })
    }

    /// Queue identifier.
    pub fn qid(&self) -> u16 {
        self.sq.qid()
    }

    /// The submission queue.
    pub fn sq(&self) -> &SubmissionQueue {
        &self.sq
    }

    /// The completion queue.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        QueueStats { sq_doorbell_writes: self.sq.doorbell_writes(), ..self.stats }
    }

    /// Commands submitted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.cids.outstanding()
    }

    /// `true` when one more command can be queued right now.
    pub fn can_submit(&self) -> bool {
        !self.sq_deleted && !self.sq.is_full() && !self.cids.is_full()
    }

    /// Records that the controller deleted this pair's SQ (called by
    /// [`crate::Controller::delete_io_sq`], the one place that deletes an
    /// I/O SQ): submissions fail with
    /// [`SubmitError::SqDeleted`] from now on, and the SQHD of the CQEs
    /// still to come (aborted commands; a controller reports SQHD 0 or
    /// anything once the SQ is gone) is ignored. [`QueuePair::poll`] keeps
    /// matching completions, each outstanding command at most once, until
    /// the CQ is deleted. Cleared by [`QueuePair::prepare_for_create`] and
    /// [`QueuePair::reset_after_controller_reset`].
    pub(crate) fn sq_was_deleted(&mut self) {
        self.sq_deleted = true;
    }

    /// `true` once [`crate::Controller::delete_io_sq`] deleted this SQ (until
    /// the queue is created again).
    pub fn is_sq_deleted(&self) -> bool {
        self.sq_deleted
    }

    /// Queues `sqe` with a fresh CID and, when `data` is given, PRP1/PRP2
    /// (and a PRP list in this command's list pages). `tag` comes back in
    /// the [`Completion`]. The controller sees the command after
    /// [`QueuePair::ring`].
    pub fn submit(&mut self, mut sqe: Sqe, data: Option<DataRef<'_>>, tag: u64) -> Result<u16, SubmitError> {
        if self.sq_deleted {
            return Err(SubmitError::SqDeleted { qid: self.qid() });
        }
        if !self.can_submit() {
            return Err(SubmitError::QueueFull { qid: self.qid() });
        }
        let Some(cid) = self.cids.alloc(tag) else {
            return Err(SubmitError::QueueFull { qid: self.qid() });
        };
        if let Some(d) = data {
            match self.build_prp(cid, d) {
                Ok((p1, p2)) => sqe.set_prp(p1, p2),
                Err(e) => {
                    let _ = self.cids.release(cid);
                    return Err(e.into());
                }
            }
        }
        sqe.set_cid(cid);
        // Fullness was checked above, so this only fails if the queue memory
        // could not be written; never report such a command as queued.
        if !self.sq.push(&sqe) {
            let _ = self.cids.release(cid);
            return Err(SubmitError::QueueFull { qid: self.qid() });
        }
        self.stats.submitted += 1;
        Ok(cid)
    }

    fn build_prp(&mut self, cid: u16, d: DataRef<'_>) -> Result<(u64, u64), PrpError> {
        let page = self.prp.page_size();
        // Transfers of one or two memory pages (the common 4 KiB case) need
        // no list: skip taking a list window.
        let first = d.mapping.addr(d.offset).unwrap_or(0);
        // PRP1 and PRP2 cover the rest of PRP1's page and one more page
        // (list_pages_needed(first, len) == 0), computed without a division.
        let in_first = page - (first as usize & (page - 1));
        let needs_list = d.len > in_first.saturating_add(page);
        let prp = match &self.lists {
            Some(buf) if needs_list => {
                let slot = self.cids.slot_of(cid).unwrap_or(0);
                let off = self.lists_offset + slot * self.list_pages_per_cmd * page;
                let mut window = DmaListPages::prevalidated(buf, off, self.list_pages_per_cmd, page);
                self.prp.build(d.mapping, d.offset, d.len, &mut window)?
            }
            _ => self.prp.build(d.mapping, d.offset, d.len, &mut NoListPages)?,
        };
        Ok((prp.prp1, prp.prp2))
    }

    /// Rings the SQ tail doorbell once for everything queued since the last
    /// ring.
    pub fn ring(&mut self) {
        self.sq.ring();
    }

    /// Consumes the posted completions (at most one ring's worth, so a
    /// device that never stops posting cannot hold the caller), calls `f`
    /// for each that matches an outstanding command, then writes the CQ head
    /// doorbell once. Returns how many CQEs were consumed.
    pub fn poll(&mut self, mut f: impl FnMut(Completion)) -> usize {
        let mut n = 0;
        while n < self.cq.size() as usize {
            let index = self.cq.head();
            let Some(mut cqe) = self.cq.peek() else { break };
            if cqe.sqid != self.sq.qid() {
                // The phase dword may have become visible before the body (a
                // device that writes DW3 first): give the body a moment, and
                // if it still names another SQ, leave the entry for the next
                // poll, up to UNSETTLED_GRACE, before calling it foreign.
                cqe = self.settle_body(index, cqe);
                if cqe.sqid != self.sq.qid() {
                    let now = self.device.clock().now();
                    let since = *self.unsettled_since.get_or_insert(now);
                    if now.saturating_duration_since(since) < UNSETTLED_GRACE {
                        break;
                    }
                }
            }
            self.unsettled_since = None;
            self.cq.advance();
            n += 1;
            if cqe.sqid != self.sq.qid() {
                // Not ours: its SQHD and CID mean nothing for this SQ.
                self.stats.wrong_sqid += 1;
                self.stats.protocol_errors += 1;
                continue;
            }
            if !self.sq_deleted && !self.sq.update_head(cqe.sqhd) {
                self.stats.bad_sqhd += 1;
            }
            match self.cids.release(cqe.cid) {
                Ok(tag) => {
                    self.stats.completed += 1;
                    f(Completion { tag, cid: cqe.cid, status: cqe.status(), dw0: cqe.dw0 });
                }
                Err(e) => {
                    self.stats.protocol_errors += 1;
                    let (CidError::Unknown { cid } | CidError::Stale { cid }) = e;
                    tracing::warn!(qid = self.qid(), cid, error = %e, "completion dropped");
                }
            }
        }
        self.cq.ring();
        n
    }

    /// Re-reads the body of CQ entry `index` for up to 50 µs of the
    /// device's clock until it names this SQ; returns the last version
    /// read.
    fn settle_body(&self, index: u32, mut cqe: nvme_regs::Cqe) -> nvme_regs::Cqe {
        let clock = self.device.clock();
        let start = clock.now();
        while clock.now().saturating_duration_since(start) < std::time::Duration::from_micros(50) {
            clock.spin();
            if let Some([dw0, dw1, dw2]) = self.cq.reread_body(index) {
                cqe = nvme_regs::Cqe::from_dwords([dw0, dw1, dw2, cqe.dw3()]);
                if cqe.sqid == self.sq.qid() {
                    break;
                }
            }
        }
        cqe
    }

    /// Tags of the outstanding commands, oldest slot first.
    pub fn outstanding_tags(&self) -> Vec<(u16, u64)> {
        self.cids.iter().map(|(c, &t)| (c, t)).collect()
    }

    /// Forgets every outstanding command and resets the rings, after the
    /// controller was reset (its queues no longer exist). Returns the
    /// forgotten `(cid, tag)` pairs so the caller can fail them.
    pub fn reset_after_controller_reset(&mut self) -> Vec<(u16, u64)> {
        self.sq.reset();
        self.cq.reset();
        self.sq_deleted = false;
        self.cids.drain()
    }

    /// Readies the rings for Create I/O CQ/SQ: zeroes the CQ memory (so no
    /// stale entry, whatever its bytes, carries the phase tag of the first
    /// pass) and restarts the indexes. Refused (`false`) while commands are
    /// outstanding.
    pub fn prepare_for_create(&mut self) -> bool {
        if self.outstanding() != 0 {
            return false;
        }
        self.sq.reset();
        self.cq.reset();
        self.unsettled_since = None;
        self.sq_deleted = false;
        true
    }

    /// A one-paragraph state dump for diagnosing a stalled queue.
    pub fn dump(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "qid {}: SQ size {} head {} tail {}; CQ size {} head {} phase {}; outstanding {}; {:?}",
            self.qid(),
            self.sq.size(),
            self.sq.head(),
            self.sq.tail(),
            self.cq.size(),
            self.cq.head(),
            u8::from(self.cq.phase()),
            self.outstanding(),
            self.stats
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_device::DeadDevice;
    use nvme_regs::opcode::Flush;
    use nvme_regs::{Cap, Cqe};
    use std::sync::atomic::Ordering;

    /// A queue pair on a device that never answers: the test posts CQEs
    /// itself, as a hostile or buggy controller would.
    fn pair() -> QueuePair {
        let dev = DeadDevice::start(Cap(0).with_mqes_z(63).with_css_nvm(true), 0);
        let cfg = QueuePairConfig {
            qid: 1,
            sq_entries: 8,
            cq_entries: 8,
            max_outstanding: 16,
            max_transfer: 4096,
            page_size: 4096,
            dstrd: 0,
        };
        QueuePair::new(&dev, cfg).unwrap()
    }

    fn post(qp: &QueuePair, index: u32, cqe: Cqe) {
        let m = qp.cq().memory();
        let dw = cqe.to_dwords();
        for (i, d) in dw.iter().enumerate() {
            m.store_u32(index as usize * CQE_SIZE + i * 4, *d, Ordering::Release).unwrap();
        }
    }

    #[test]
    fn unknown_duplicate_and_foreign_cqes_never_complete_a_request() {
        let mut qp = pair();
        let a = qp.submit(Flush::new(1).build(), None, 100).unwrap();
        let b = qp.submit(Flush::new(1).build(), None, 200).unwrap();
        qp.ring();
        let mut done = Vec::new();
        // Entry 0: A completes. Entry 1: A again (duplicate). Entry 2: an
        // invented CID. Entry 3: B's CID but naming SQ 2. Entry 4: B.
        post(&qp, 0, Cqe::new(0, 1, 1, a, Status::SUCCESS, true));
        post(&qp, 1, Cqe::new(0, 2, 1, a, Status::SUCCESS, true));
        post(&qp, 2, Cqe::new(0, 2, 1, 0x0777, Status::SUCCESS, true));
        post(&qp, 3, Cqe::new(0, 7, 2, b, Status::SUCCESS, true));
        qp.poll(|c| done.push(c.tag));
        assert_eq!(done, vec![100]);
        let s = qp.stats();
        // The foreign entry is left in place for a grace period (its body
        // might still be on its way), then consumed as a protocol error.
        assert_eq!((s.completed, s.protocol_errors, s.wrong_sqid), (1, 2, 0));
        std::thread::sleep(UNSETTLED_GRACE + std::time::Duration::from_millis(10));
        post(&qp, 4, Cqe::new(0, 2, 1, b, Status::SUCCESS, true));
        qp.poll(|c| done.push(c.tag));
        let s = qp.stats();
        assert_eq!((s.completed, s.protocol_errors, s.wrong_sqid), (2, 3, 1));
        assert_eq!(qp.sq().head(), 2, "the foreign CQE's SQHD 7 was not taken");
        assert_eq!(done, vec![100, 200]);
        assert_eq!(qp.outstanding(), 0);
    }

    #[test]
    fn sq_head_comes_from_sqhd_and_slots_are_reused_before_completion() {
        // MQES = 3 case on an 8-entry ring: the controller fetches everything
        // but completes one command, reporting SQHD = tail. SQ slots free up
        // while commands stay outstanding; CIDs are tracked per command.
        let mut qp = pair();
        let cids: Vec<u16> = (0..7).map(|i| qp.submit(Flush::new(1).build(), None, i).unwrap()).collect();
        assert!(qp.submit(Flush::new(1).build(), None, 99).is_err(), "one SQ slot stays empty");
        qp.ring();
        post(&qp, 0, Cqe::new(0, 7, 1, cids[3], Status::SUCCESS, true));
        let mut done = Vec::new();
        qp.poll(|c| done.push(c.tag));
        assert_eq!(done, vec![3]);
        assert_eq!(qp.sq().head(), 7);
        assert_eq!(qp.outstanding(), 6);
        // Seven SQ slots are free again; 16 CIDs allow 10 more outstanding.
        for i in 10..17 {
            qp.submit(Flush::new(1).build(), None, i).unwrap();
        }
        assert_eq!(qp.outstanding(), 13);
    }
}
