//! The controller's state and one poll iteration: doorbell polling,
//! command fetch and completion posting. The CC state machine is in
//! `cc.rs`, data buffer access in `data.rs`, the loop that runs poll
//! iterations (a thread, or the waits on a virtual clock) in `run.rs`.
//!
//! One poll iteration: read CC and act on EN/SHN changes; if enabled, lock
//! the IOVA table for reading, read every CQ head doorbell and post waiting
//! completions, post due completions of the timing model, then fetch and
//! execute up to [`BATCH`] commands from each SQ (admin first), reading each
//! tail doorbell once.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvme_regs::{Csts, Sqe, Status};

use crate::config::{EmulatorConfig, NamespaceSpec};
use crate::dma::{DmaFault, DmaView};
use crate::fault::FaultAction;
use crate::in_transfer::InTransfer;
use crate::media::Media;
use crate::prp::Segment;
use crate::queues::{CompQueue, Completion, CqeQuirk, SqDoorbell, SubQueue};
use crate::shared::Shared;
use crate::stats::LocalStats;
use crate::timing::Timing;

/// Most SQEs fetched from one SQ per poll iteration.
pub(crate) const BATCH: u32 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// CC.EN = 0 (or waiting for it after a reset).
    Disabled,
    /// CSTS.RDY = 1, processing commands.
    Enabled,
    /// CSTS.CFS = 1: a failed enable, an unrecoverable fault or
    /// [`FaultAction::ControllerFatal`]; waits for CC.EN = 0.
    Fatal,
    /// CSTS.SHST = complete; waits for CC.EN = 0.
    ShutDown,
    /// The power failed ([`FaultAction::PowerFail`]): nothing more happens.
    PoweredOff,
}

/// What a command produced.
pub(crate) enum Outcome {
    /// Post a completion now (or when the timing model says, if
    /// `media_bytes` is `Some`).
    Complete { status: Status, dw0: u32, media_bytes: Option<u64> },
    /// No completion (Asynchronous Event Request).
    Deferred,
}

impl Outcome {
    pub(crate) fn status(status: Status) -> Self {
        Outcome::Complete { status, dw0: 0, media_bytes: None }
    }
    pub(crate) fn ok(dw0: u32) -> Self {
        Outcome::Complete { status: Status::SUCCESS, dw0, media_bytes: None }
    }
}

/// What a fault rule changes about one command's completion
/// ([`Controller::drain_sq`]); without a rule, nothing.
#[derive(Debug, Clone, Copy)]
struct Injected {
    /// Extra time before it is posted ([`FaultAction::Delay`]).
    delay: Option<Duration>,
    /// The CID it carries ([`FaultAction::UnknownCid`] changes it).
    cid: u16,
    /// How its CQE is misreported.
    quirk: CqeQuirk,
    /// How many times it is posted ([`FaultAction::CompleteTwice`]: 2).
    copies: u32,
}

/// An unrecoverable error: queue memory could not be accessed.
#[derive(Debug)]
pub(crate) struct Fatal;

impl From<DmaFault> for Fatal {
    fn from(_: DmaFault) -> Self {
        Fatal
    }
}

/// The controller's private state, owned by its thread.
pub(crate) struct Controller {
    pub config: EmulatorConfig,
    pub state: State,
    pub csts: Csts,
    /// Memory page size from CC.MPS at enable, in bytes.
    pub page: u64,
    pub sqs: Vec<Option<SubQueue>>,
    pub cqs: Vec<Option<CompQueue>>,
    /// QIDs of existing I/O SQs / CQs (admin excluded), in creation order.
    pub active_sqs: Vec<u16>,
    pub active_cqs: Vec<u16>,
    pub timing: Option<Timing>,
    pub segs: Vec<Segment>,
    pub scratch: Vec<u8>,
    pub identify_ctrl: Vec<u8>,
    /// Granted I/O SQ / CQ counts (1-based, Set Features Number of Queues).
    pub granted_sqs: u16,
    pub granted_cqs: u16,
    /// An I/O queue was created since the last reset (Number of Queues can
    /// no longer be set).
    pub io_queue_created: bool,
    pub aer_outstanding: u32,
    pub local: LocalStats,
    /// Host read/write command totals (SMART log).
    pub totals: LocalStats,
    pub max_transfer: Option<u64>,
    /// Completions waiting for their asynchronous copies
    /// (`crate::transfer`).
    pub transfers: Vec<InTransfer>,
    /// When CSTS.RDY goes to 1 after the CC.EN = 1 being acted on
    /// ([`EmulatorConfig::ready_delay`]); `None` when no enable waits.
    pub ready_at: Option<Instant>,
}

impl Controller {
    pub(crate) fn new(config: EmulatorConfig) -> Self {
        let n = usize::from(config.io_queues) + 1;
        let identify_ctrl = crate::identify::identify_controller(&config);
        Self {
            timing: config.timing.map(|m| Timing::new(Some(m))),
            max_transfer: config.max_transfer(),
            granted_sqs: config.io_queues,
            granted_cqs: config.io_queues,
            config,
            state: State::Disabled,
            csts: Csts(0),
            page: 4096,
            sqs: (0..n).map(|_| None).collect(),
            cqs: (0..n).map(|_| None).collect(),
            active_sqs: Vec::new(),
            active_cqs: Vec::new(),
            segs: Vec::with_capacity(64),
            scratch: vec![0u8; 4096],
            identify_ctrl,
            io_queue_created: false,
            aer_outstanding: 0,
            local: LocalStats::default(),
            totals: LocalStats::default(),
            transfers: Vec::new(),
            ready_at: None,
        }
    }

    /// Namespace `nsid` (1-based) as (index, spec).
    pub(crate) fn namespace(&self, nsid: u32) -> Option<(usize, NamespaceSpec)> {
        let i = usize::try_from(nsid).ok()?.checked_sub(1)?;
        self.config.namespaces.get(i).map(|ns| (i, *ns))
    }

    pub(crate) fn flush_stats(&mut self, sh: &Shared) {
        let l = std::mem::take(&mut self.local);
        if l.media_bytes_read != 0 {
            sh.stats.media_bytes_read.fetch_add(l.media_bytes_read, Ordering::Relaxed);
        }
        if l.media_bytes_written != 0 {
            sh.stats.media_bytes_written.fetch_add(l.media_bytes_written, Ordering::Relaxed);
        }
        self.totals.host_reads += l.host_reads;
        self.totals.host_writes += l.host_writes;
    }

    /// One poll iteration at `now`. Returns whether any work was done and
    /// when something is due next (a completion of the timing model, the
    /// end of an enable's ready delay).
    pub(crate) fn poll(&mut self, sh: &Shared, now: Instant) -> (bool, Option<Instant>) {
        self.handle_cc(sh, now);
        if self.state != State::Enabled {
            return (false, self.ready_at);
        }
        let dma = sh.iova.view();
        let mut media = sh.lock_media();
        let r = self.poll_enabled(sh, &dma, &mut media, now);
        drop(media);
        drop(dma);
        self.flush_stats(sh);
        match r {
            // Copies in flight: poll again at once for their fences.
            Ok(work) if !self.transfers.is_empty() => (work, Some(now)),
            Ok(work) => (work, self.timing.as_ref().and_then(|t| t.next_wake(now))),
            Err(Fatal) => {
                self.fatal(sh);
                (true, None)
            }
        }
    }

    fn poll_enabled(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        media: &mut Media,
        now: Instant,
    ) -> Result<bool, Fatal> {
        let mut work = false;
        // Detached I/O queues belong to another agent: the admin queue only.
        let io_cqs = if self.config.io_queues_detached { 0 } else { self.active_cqs.len() };
        // CQ head doorbells, then completions that were waiting for room.
        for i in 0..=io_cqs {
            let cqid = if i == 0 { 0 } else { self.active_cqs[i - 1] };
            let raw = sh.regs.doorbell(cqid, true);
            let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) else {
                continue;
            };
            if raw != cq.last_db && !cq.doorbell(raw) {
                sh.stats.doorbell_violations.fetch_add(1, Ordering::Relaxed);
            }
            if !cq.pending.is_empty() {
                work |= self.post_pending(sh, dma, cqid)?;
            }
        }
        // Completions whose copies have ended.
        if !self.transfers.is_empty() {
            work |= self.finish_transfers(sh, dma)?;
        }
        // Due completions of the timing model.
        for _ in 0..4096 {
            let Some(s) = self.timing.as_mut().and_then(|t| t.pop_due(now)) else {
                break;
            };
            work = true;
            if let Some(cq) = self.cqs.get_mut(usize::from(s.cqid)).and_then(Option::as_mut) {
                cq.in_flight = cq.in_flight.saturating_sub(1);
            }
            self.complete_now(sh, dma, s.cqid, s.completion)?;
        }
        // Admin SQ first, then I/O SQs.
        work |= self.drain_sq(sh, dma, media, 0, now)?;
        if self.state != State::Enabled {
            return Ok(work);
        }
        // The I/O SQs together are one burst: the commands this iteration
        // fetches from all of them share one fence per memory (one batched
        // copy call and one fence call per memory, not per SQ: a load whose
        // commands go round-robin over a drive's queues would otherwise pay
        // the driver's calls once per queue).
        let io_sqs = if self.config.io_queues_detached { 0 } else { self.active_sqs.len() };
        let mut r = Ok(());
        for i in 0..io_sqs {
            let Some(&qid) = self.active_sqs.get(i) else {
                break;
            };
            match self.drain_sq_burst(sh, dma, media, qid, now) {
                Ok(w) => work |= w,
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
            if self.state != State::Enabled {
                break;
            }
        }
        self.end_burst(dma);
        r.map(|()| work)
    }

    /// Reads SQ `qid`'s tail doorbell and executes up to [`BATCH`] commands
    /// (one burst: their asynchronous copies get their fences at the end).
    /// The admin SQ's; the I/O SQs share one burst per poll iteration
    /// ([`Controller::poll_enabled`]).
    fn drain_sq(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        media: &mut Media,
        qid: u16,
        now: Instant,
    ) -> Result<bool, Fatal> {
        let r = self.drain_sq_burst(sh, dma, media, qid, now);
        self.end_burst(dma);
        r
    }

    /// Gives the copies started since the last burst their fences.
    fn end_burst(&mut self, dma: &DmaView<'_>) {
        if let Some(p) = dma.take_copies() {
            self.attach_burst(p);
        }
    }

    fn drain_sq_burst(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        media: &mut Media,
        qid: u16,
        now: Instant,
    ) -> Result<bool, Fatal> {
        if !self.take_sq_doorbell(sh, qid) {
            return Ok(false);
        }
        let mut n = 0;
        while n < BATCH {
            let Some(sq) = self.sqs.get_mut(usize::from(qid)).and_then(Option::as_mut) else {
                break;
            };
            if sq.is_empty() {
                break;
            }
            let cqid = sq.cqid;
            // A CQ with as many completions waiting as it has entries stalls
            // its SQs (bounds memory against a host that never consumes).
            match self.cqs.get(usize::from(cqid)).and_then(Option::as_ref) {
                Some(cq) if cq.backlog() < cq.size => {}
                _ => break,
            }
            let sqe = sq.fetch(dma)?;
            // The command's data and PRP lists must lie in its SQ's domain.
            let domain = sq.domain;
            n += 1;
            let before = dma.copies_started();
            dma.set_domain(domain);
            let (outcome, injected) = self.execute_with_faults(sh, dma, media, qid, &sqe);
            dma.set_domain(crate::SHARED_DOMAIN);
            if let Outcome::Complete { status, dw0, media_bytes } = outcome {
                let c = Completion { dw0, sqid: qid, cid: injected.cid, status, quirk: injected.quirk };
                if dma.copies_started() == before {
                    self.post_completion(sh, dma, cqid, c, media_bytes, injected, now)?;
                } else {
                    // Posted once the burst's copies have ended.
                    let due = self.due_time(&c, media_bytes, injected.delay, now);
                    self.defer_completion(cqid, c, due, injected.copies);
                }
            }
            if self.state != State::Enabled {
                break;
            }
        }
        Ok(n > 0)
    }

    /// Takes a new value of SQ `qid`'s tail doorbell, counting a value out
    /// of range or moving backwards as a doorbell violation (and ignoring
    /// it). `false` when the SQ does not exist.
    #[inline]
    fn take_sq_doorbell(&mut self, sh: &Shared, qid: u16) -> bool {
        let raw = sh.regs.doorbell(qid, false);
        let Some(sq) = self.sqs.get_mut(usize::from(qid)).and_then(Option::as_mut) else {
            return false;
        };
        if raw != sq.last_db {
            sh.stats.sq_tail_updates.fetch_add(1, Ordering::Relaxed);
            let (old, released) = (sq.tail, sq.released);
            match sq.doorbell(raw) {
                SqDoorbell::Ok => {}
                SqDoorbell::OutOfRange => {
                    sh.stats.doorbell_violations.fetch_add(1, Ordering::Relaxed);
                }
                SqDoorbell::Backwards => {
                    sh.stats.doorbell_violations.fetch_add(1, Ordering::Relaxed);
                    sh.stats.sq_tail_backwards.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        qid,
                        tail = old,
                        new_tail = raw,
                        sq_head_reported = released,
                        "nvme-emu: SQ tail doorbell moved backwards (ignored)"
                    );
                }
            }
        }
        true
    }

    /// Executes one fetched command of SQ `qid` unless a fault rule says
    /// otherwise, and returns its outcome with what the rule changes about
    /// its completion.
    #[inline]
    fn execute_with_faults(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        media: &mut Media,
        qid: u16,
        sqe: &Sqe,
    ) -> (Outcome, Injected) {
        // Fault injection: one relaxed load when no rule is installed.
        let mut inj = Injected { delay: None, cid: sqe.cid(), quirk: CqeQuirk::None, copies: 1 };
        let outcome = match sh.faults.check(qid, sqe) {
            None => self.execute(sh, dma, media, qid, sqe),
            Some(FaultAction::Fail(status)) => Outcome::status(status),
            Some(FaultAction::NeverComplete) => {
                // Held: Delete I/O SQ aborts it.
                if let Some(sq) = self.sqs.get_mut(usize::from(qid)).and_then(Option::as_mut) {
                    sq.held.push(inj.cid);
                }
                Outcome::Deferred
            }
            Some(FaultAction::ControllerFatal) => {
                self.injected_fatal(sh);
                Outcome::Deferred
            }
            Some(FaultAction::PowerFail) => {
                // Executed into the cache; the power fails before its CQE
                // (after its copies and every other copy in flight end).
                let _ = self.execute(sh, dma, media, qid, sqe);
                self.end_burst(dma);
                self.settle_transfers();
                self.power_fail(sh, media);
                Outcome::Deferred
            }
            Some(action) => {
                match action {
                    FaultAction::Delay(d) => inj.delay = Some(d),
                    FaultAction::CompleteTwice => inj.copies = 2,
                    FaultAction::UnknownCid(c) => inj.cid = c,
                    FaultAction::LaggingSqhd => inj.quirk = CqeQuirk::LagSqhd,
                    FaultAction::PhaseBeforeBody => inj.quirk = CqeQuirk::PhaseFirst,
                    FaultAction::Fail(_)
                    | FaultAction::NeverComplete
                    | FaultAction::ControllerFatal
                    | FaultAction::PowerFail => {}
                }
                self.execute(sh, dma, media, qid, sqe)
            }
        };
        (outcome, inj)
    }

    /// Posts `c` (`injected.copies` times) to CQ `cqid`: now, or through
    /// the timing model's heap when a model covers this I/O command
    /// (`media_bytes` moved) or a fault rule delays it.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn post_completion(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        cqid: u16,
        c: Completion,
        media_bytes: Option<u64>,
        injected: Injected,
        now: Instant,
    ) -> Result<(), Fatal> {
        let Injected { delay, copies, .. } = injected;
        if let Some(due) = self.due_time(&c, media_bytes, delay, now) {
            let Some(t) = self.timing.as_mut() else { return Ok(()) };
            for _ in 0..copies {
                t.push(due, cqid, c);
            }
            if let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) {
                cq.in_flight += copies;
            }
        } else {
            for _ in 0..copies {
                self.complete_now(sh, dma, cqid, c)?;
            }
        }
        Ok(())
    }

    /// When the timing model (an I/O command that moved `media_bytes`) or
    /// an injected delay says `c` is due, fixed at fetch time `now`; `None`
    /// to post it at once. The model's channel is taken here.
    #[inline]
    fn due_time(
        &mut self,
        c: &Completion,
        media_bytes: Option<u64>,
        delay: Option<Duration>,
        now: Instant,
    ) -> Option<Instant> {
        let modelled =
            c.sqid != 0 && media_bytes.is_some() && self.timing.as_ref().is_some_and(Timing::has_model);
        if !modelled && delay.is_none() {
            return None;
        }
        // The timing model's heap also holds delayed completions; without a
        // model it is created for the first delay.
        let t = self.timing.get_or_insert_with(|| Timing::new(None));
        let due = match media_bytes {
            Some(bytes) if modelled => t.schedule(now, bytes),
            _ => now,
        };
        Some(due + delay.unwrap_or_default())
    }

    /// Executes one fetched command of SQ `qid`.
    #[inline]
    fn execute(&mut self, sh: &Shared, dma: &DmaView<'_>, media: &mut Media, qid: u16, sqe: &Sqe) -> Outcome {
        if qid == 0 {
            self.admin(sh, dma, media, sqe)
        } else {
            self.io(sh, dma, media, sqe)
        }
    }

    /// [`FaultAction::PowerFail`], from the controller thread: the device
    /// stops answering at once (registers all ones, no more fetches or
    /// completions, those scheduled or waiting included), the write cache
    /// loses or keeps each non-durable block, and the backing store is
    /// released. [`crate::Emulator::power_fail_report`] has the outcome.
    fn power_fail(&mut self, sh: &Shared, media: &mut Media) {
        sh.go_away();
        let r = media.power_loss();
        tracing::debug!(?r, "nvme-emu: fault injection, power failed");
        self.state = State::PoweredOff;
    }

    /// Posts `c` to CQ `cqid` now, or queues it behind earlier waiting
    /// completions when the CQ is full (counting a "CQ full" stall when it
    /// starts). A missing CQ drops it.
    pub(crate) fn complete_now(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        cqid: u16,
        c: Completion,
    ) -> Result<(), Fatal> {
        let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) else {
            return Ok(());
        };
        if cq.is_full() {
            // The head doorbell was read at the start of this poll
            // iteration; the host may have returned entries since (a real
            // controller sees the doorbell write at once). Without this,
            // a host that frees a slot and submits at once meets a false
            // "CQ full" stall whenever the SQ is drained after the read.
            let raw = sh.regs.doorbell(cqid, true);
            if raw != cq.last_db && !cq.doorbell(raw) {
                sh.stats.doorbell_violations.fetch_add(1, Ordering::Relaxed);
            }
        }
        if cq.pending.is_empty() && !cq.is_full() {
            let sqhd = self.release_sqhd(sh, dma, &c);
            let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) else {
                return Ok(());
            };
            count_posted(sh, &c);
            cq.post(dma, &c, sqhd)?;
        } else {
            if cq.is_full() && !cq.stalled {
                // The host has not returned CQ entries (CQ head doorbell):
                // completions wait, and the SQs feeding this CQ stop being
                // fetched once its backlog reaches its size, as on real
                // hardware.
                cq.stalled = true;
                sh.stats.cq_full_stalls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    cqid,
                    head = cq.head,
                    tail = cq.tail,
                    "nvme-emu: CQ full, completions wait for the CQ head doorbell"
                );
            }
            cq.pending.push_back(c);
        }
        Ok(())
    }

    /// Posts waiting completions of CQ `cqid` while it has room.
    pub(crate) fn post_pending(&mut self, sh: &Shared, dma: &DmaView<'_>, cqid: u16) -> Result<bool, Fatal> {
        let mut posted = false;
        while let Some(cq) = self.cqs.get(usize::from(cqid)).and_then(Option::as_ref) {
            if cq.is_full() {
                break;
            }
            let Some(&c) = cq.pending.front() else { break };
            let sqhd = self.release_sqhd(sh, dma, &c);
            let Some(cq) = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut) else {
                break;
            };
            count_posted(sh, &c);
            cq.post(dma, &c, sqhd)?;
            cq.pending.pop_front();
            cq.stalled = false;
            posted = true;
        }
        Ok(posted)
    }

    /// SQHD for the CQE `c`, about to be posted: its SQ's current head
    /// (entries before it may be reused), one entry less for
    /// [`CqeQuirk::LagSqhd`], or 0 for a deleted SQ. The slots this releases
    /// to the host are checked first: an SQE that changed since its fetch
    /// was overwritten while the controller owned it (counted, warned).
    /// With a lagging SQHD the host may still infer from the completion
    /// itself that the command was fetched, so the real head is released.
    fn release_sqhd(&mut self, sh: &Shared, dma: &DmaView<'_>, c: &Completion) -> u16 {
        let Some(s) = self.sqs.get_mut(usize::from(c.sqid)).and_then(Option::as_mut) else {
            return 0;
        };
        let from = s.released;
        let changed = s.release(dma);
        if changed > 0 {
            sh.stats.sqe_overwritten.fetch_add(u64::from(changed), Ordering::Relaxed);
            tracing::warn!(
                sqid = c.sqid,
                slots = changed,
                from,
                to = s.head,
                "nvme-emu: SQE overwritten while the controller owned its slot"
            );
        }
        if c.quirk == CqeQuirk::LagSqhd {
            ((s.head + s.size - 1) % s.size) as u16
        } else {
            s.head as u16
        }
    }
}

/// Counts a completion about to be posted, before its CQE is written: the
/// CQE's phase-tag store (Release) orders this count before it, so a host
/// that has seen the completion (Acquire) sees the count too.
fn count_posted(sh: &Shared, c: &Completion) {
    sh.stats.commands.fetch_add(1, Ordering::Relaxed);
    if c.sqid == 0 {
        sh.stats.admin_commands.fetch_add(1, Ordering::Relaxed);
    }
}
