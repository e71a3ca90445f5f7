//! The CC state machine (NVMe Base 2.0, 3.5 "Controller Initialization"
//! and 3.6 "Shutdown"): enable after the modelled ready delay, controller
//! reset, normal and abrupt shutdown, and the fatal status (CSTS.CFS).

use std::sync::atomic::Ordering;
use std::time::Instant;

use nvme_regs::registers::offset;
use nvme_regs::{Aqa, Cc, Csts, ShutdownNotification, ShutdownStatus};

use crate::controller::{Controller, State};
use crate::queues::{CompQueue, SubQueue};
use crate::regs::{MPSMAX, MPSMIN};
use crate::shared::Shared;

impl Controller {
    fn set_csts(&mut self, sh: &Shared, csts: Csts) {
        self.csts = csts;
        sh.regs.set_csts(csts);
    }

    /// Controller reset (CC.EN 1 -> 0): drops every queue, scheduled and
    /// pending completion, and clears CSTS (RDY, CFS, SHST).
    fn reset(&mut self, sh: &Shared) {
        self.settle_transfers();
        for q in &mut self.sqs {
            *q = None;
        }
        for q in &mut self.cqs {
            *q = None;
        }
        self.active_sqs.clear();
        self.active_cqs.clear();
        if let Some(t) = &mut self.timing {
            t.reset();
        }
        self.granted_sqs = self.config.io_queues;
        self.granted_cqs = self.config.io_queues;
        self.io_queue_created = false;
        self.aer_outstanding = 0;
        sh.regs.clear_all_doorbells();
        self.state = State::Disabled;
        self.set_csts(sh, Csts(0));
    }

    /// CC.EN 0 -> 1: validates CC and the admin queue registers, then sets
    /// up the admin queue pair and CSTS.RDY, or CSTS.CFS on invalid values.
    fn enable(&mut self, sh: &Shared, cc: Cc) {
        let aqa = Aqa(sh.regs.aqa());
        let asq = sh.regs.read64(offset::ASQ);
        let acq = sh.regs.read64(offset::ACQ);
        let mps_ok = (MPSMIN..=MPSMAX).contains(&cc.mps());
        let page = 1u64 << (12 + u32::from(cc.mps().min(MPSMAX)));
        let valid = cc.iosqes() == 6
            && cc.iocqes() == 4
            && cc.css() == Cc::CSS_NVM
            && mps_ok
            && aqa.asqs_z() >= 1
            && aqa.acqs_z() >= 1
            && asq & (page - 1) == 0
            && acq & (page - 1) == 0;
        if !valid {
            tracing::debug!(cc = cc.0, aqa = aqa.0, asq, acq, "nvme-emu: invalid enable, setting CSTS.CFS");
            self.state = State::Fatal;
            self.set_csts(sh, Csts(0).with_cfs(true));
            return;
        }
        self.page = page;
        sh.regs.clear_all_doorbells();
        let mut cq = CompQueue::new(acq, u32::from(aqa.acqs_z()) + 1);
        cq.sq_count = 1;
        self.cqs[0] = Some(cq);
        self.sqs[0] = Some(SubQueue::new(asq, u32::from(aqa.asqs_z()) + 1, 0));
        self.state = State::Enabled;
        self.set_csts(sh, Csts(0).with_rdy(true));
    }

    /// CC.SHN while enabled: stop fetching; for a normal shutdown post
    /// every scheduled and waiting completion that fits in its CQ (the rest
    /// are dropped), for an abrupt one drop them; either way the write
    /// cache is flushed (made durable); then CSTS.SHST = 10b.
    fn shutdown(&mut self, sh: &Shared, shn: ShutdownNotification) {
        if let Err(e) = sh.lock_media().flush(None) {
            tracing::warn!(error = ?e, "nvme-emu: write cache flush at shutdown failed");
        }
        if shn == ShutdownNotification::Normal {
            let dma = sh.iova.view();
            if self.finish_transfers_now(sh, &dma).is_err() {
                self.settle_transfers();
            }
            if let Some(t) = &mut self.timing {
                while let Some(s) = t.heap.pop() {
                    if let Some(cq) = self.cqs.get_mut(usize::from(s.cqid)).and_then(Option::as_mut) {
                        cq.in_flight = cq.in_flight.saturating_sub(1);
                        cq.pending.push_back(s.completion);
                    }
                }
            }
            let cqids: Vec<u16> = std::iter::once(0).chain(self.active_cqs.iter().copied()).collect();
            for cqid in cqids {
                if self.post_pending(sh, &dma, cqid).is_err() {
                    break;
                }
            }
            drop(dma);
            self.flush_stats(sh);
        }
        self.settle_transfers();
        self.state = State::ShutDown;
        self.set_csts(sh, self.csts.with_shst(ShutdownStatus::Complete));
    }

    /// [`FaultAction::ControllerFatal`]: CSTS.CFS = 1, nothing processed
    /// until a reset.
    pub(crate) fn injected_fatal(&mut self, sh: &Shared) {
        tracing::debug!("nvme-emu: fault injection, setting CSTS.CFS");
        self.state = State::Fatal;
        self.set_csts(sh, self.csts.with_cfs(true));
    }

    /// Moves a fatal controller to CSTS.CFS = 1.
    pub(crate) fn fatal(&mut self, sh: &Shared) {
        tracing::warn!("nvme-emu: queue memory not accessible, setting CSTS.CFS");
        sh.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
        self.state = State::Fatal;
        self.set_csts(sh, self.csts.with_cfs(true));
    }

    /// Acts on CC as read at `now`: EN and SHN changes.
    pub(crate) fn handle_cc(&mut self, sh: &Shared, now: Instant) {
        let cc = sh.regs.cc();
        match self.state {
            // `never_ready`: CC.EN = 1 is never acted on (CSTS.RDY stays 0).
            // Otherwise the enable acts once `ready_delay` has passed since
            // EN was first seen (EN cleared meanwhile cancels it).
            State::Disabled if cc.en() && !self.config.never_ready => {
                let at = *self.ready_at.get_or_insert(now + self.config.ready_delay);
                if now >= at {
                    self.ready_at = None;
                    self.enable(sh, cc);
                }
            }
            State::Disabled => self.ready_at = None,
            State::Enabled if !cc.en() => self.reset(sh),
            State::Enabled => {
                if let s @ (ShutdownNotification::Normal | ShutdownNotification::Abrupt) = cc.shn() {
                    self.shutdown(sh, s);
                }
            }
            State::Fatal | State::ShutDown if !cc.en() => self.reset(sh),
            _ => {}
        }
    }
}
