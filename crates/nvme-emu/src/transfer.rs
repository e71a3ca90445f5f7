//! Completions waiting for the emulated DMA engine.
//!
//! A command whose data moves by asynchronous copies (external memory with
//! [`crate::ExternalMemory::start_read`]/`start_write`, i.e. GPU memory
//! copied by `gpu-io`) is executed when it is fetched, as every command is,
//! but its CQE is posted only once a fence recorded after its copies has
//! completed: a completion still means that the data is there, as on a real
//! device. The fence is per burst: the commands one poll iteration executes
//! from all I/O SQs (or from the admin SQ) share one fence per memory, made
//! after the last of them (one fence per memory per burst, not per command
//! or per SQ: with `gpu-io`, the burst's copies go in one batched call and
//! the fence is a word the GPU writes after them, or a CUDA event). The
//! timing model applies on top: a modelled command's due time
//! is fixed at fetch, and its CQE is posted at the later of that time and
//! the end of its copies.
//!
//! The controller waits for every copy in flight before it resets, loses
//! power, stops, deletes the commands' SQ or releases its media
//! ([`Controller::settle_transfers`]), so the RAM media and the external
//! memory outlive every copy that touches them.

use std::sync::Arc;
use std::time::Instant;

use nvme_regs::status::generic;
use nvme_regs::Status;

use crate::controller::{Controller, Fatal};
use crate::dma::DmaView;
use crate::external::{FenceState, PendingCopies};
use crate::in_transfer::InTransfer;
use crate::queues::Completion;
use crate::shared::Shared;
use crate::timing::Timing;

impl Controller {
    /// Holds `c` for CQ `cqid` until the copies of the current burst have
    /// ended (attached by [`Controller::attach_burst`]). `due` is the
    /// timing model's (or a delay's) due time, fixed now at fetch.
    pub(crate) fn defer_completion(&mut self, cqid: u16, c: Completion, due: Option<Instant>, times: u32) {
        if let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) {
            cq.in_flight += 1;
        }
        self.transfers.push(InTransfer { copies: None, cqid, completion: c, due, times });
    }

    /// Ends a burst: its fences go to every completion deferred since the
    /// last burst. Copies no completion waits for (a command that ends
    /// without one) are waited for here.
    pub(crate) fn attach_burst(&mut self, copies: PendingCopies) {
        let copies = Arc::new(copies);
        let mut used = false;
        for t in self.transfers.iter_mut().rev() {
            if t.copies.is_some() {
                break;
            }
            t.copies = Some(copies.clone());
            used = true;
        }
        if !used {
            copies.wait();
        }
    }

    /// The fence state of entry `t` (an entry still without its burst's
    /// fences has started copies that cannot have been waited for).
    fn state_of(t: &InTransfer) -> FenceState {
        t.copies.as_ref().map_or(FenceState::Pending, |c| c.state())
    }

    /// Posts (or schedules, when due later) the completions whose copies
    /// have ended, oldest first. A failed copy turns a successful status
    /// into Data Transfer Error. Returns whether any ended.
    pub(crate) fn finish_transfers(&mut self, sh: &Shared, dma: &DmaView<'_>) -> Result<bool, Fatal> {
        let mut any = false;
        let mut i = 0;
        // The burst last found pending: its other commands (next to it in
        // the list) are skipped without asking its fences again.
        let mut pending: Option<Arc<PendingCopies>> = None;
        while i < self.transfers.len() {
            let t = &self.transfers[i];
            let same = matches!((&pending, &t.copies), (Some(p), Some(c)) if Arc::ptr_eq(p, c));
            let state = if same { FenceState::Pending } else { Self::state_of(t) };
            if state == FenceState::Pending {
                pending = t.copies.clone();
                i += 1;
                continue;
            }
            let t = self.transfers.remove(i);
            any = true;
            self.post_transferred(sh, dma, t, state)?;
        }
        Ok(any)
    }

    fn post_transferred(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        t: InTransfer,
        state: FenceState,
    ) -> Result<(), Fatal> {
        let InTransfer { cqid, mut completion, due, times, .. } = t;
        if let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) {
            cq.in_flight = cq.in_flight.saturating_sub(1);
        }
        if state != FenceState::Done && completion.status.is_success() {
            self.data_fault(sh, dma);
            completion.status = Status::generic(generic::DATA_TRANSFER_ERROR);
        }
        match due {
            Some(due) => {
                let t = self.timing.get_or_insert_with(|| Timing::new(None));
                for _ in 0..times {
                    t.push(due, cqid, completion);
                }
                if let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) {
                    cq.in_flight += times;
                }
            }
            None => {
                for _ in 0..times {
                    self.complete_now(sh, dma, cqid, completion)?;
                }
            }
        }
        Ok(())
    }

    /// Waits for every copy in flight and forgets the completions waiting
    /// for them (a reset, a power loss, the thread's end: nothing will be
    /// posted).
    pub(crate) fn settle_transfers(&mut self) {
        for t in self.transfers.drain(..) {
            if let Some(c) = &t.copies {
                c.wait();
            }
            if let Some(cq) = self.cqs.get_mut(usize::from(t.cqid)).and_then(Option::as_mut) {
                cq.in_flight = cq.in_flight.saturating_sub(1);
            }
        }
    }

    /// Waits for the copies of SQ `sqid`'s commands and returns their
    /// CIDs, removed (Delete I/O SQ aborts them).
    pub(crate) fn take_transfers_of(&mut self, sqid: u16) -> Vec<u16> {
        let mut cids = Vec::new();
        let mut i = 0;
        while i < self.transfers.len() {
            if self.transfers[i].completion.sqid != sqid {
                i += 1;
                continue;
            }
            let t = self.transfers.remove(i);
            if let Some(c) = &t.copies {
                c.wait();
            }
            if let Some(cq) = self.cqs.get_mut(usize::from(t.cqid)).and_then(Option::as_mut) {
                cq.in_flight = cq.in_flight.saturating_sub(1);
            }
            cids.push(t.completion.cid);
        }
        cids
    }

    /// Waits for every copy in flight, then posts or schedules its
    /// completion as if it had ended in a poll (a normal shutdown).
    pub(crate) fn finish_transfers_now(&mut self, sh: &Shared, dma: &DmaView<'_>) -> Result<(), Fatal> {
        while !self.transfers.is_empty() {
            let t = self.transfers.remove(0);
            let state = t.copies.as_ref().map_or(FenceState::Failed, |c| c.wait());
            self.post_transferred(sh, dma, t, state)?;
        }
        Ok(())
    }
}
