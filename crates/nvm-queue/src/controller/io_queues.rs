//! I/O queue pairs on the controller: creation, re-creation after a reset,
//! deletion of SQs and CQs (NVMe Base 2.0, 5.4-5.7).

use nvme_regs::opcode::{CreateIoCq, CreateIoSq, DeleteIoCq, DeleteIoSq};

use super::{Controller, ControllerError};
use crate::queue::{QueuePair, QueuePairConfig};

impl Controller {
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
    pub(super) fn delete_sq(&mut self, qid: u16) -> Result<(), ControllerError> {
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
}
