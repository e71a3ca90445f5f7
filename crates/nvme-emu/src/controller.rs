//! The controller thread: the CC state machine (NVMe Base 2.0, 3.5
//! "Controller Initialization" and 3.6 "Shutdown"), doorbell polling,
//! command fetch and completion posting.
//!
//! One poll iteration: read CC and act on EN/SHN changes; if enabled, lock
//! the IOVA table for reading, read every CQ head doorbell and post waiting
//! completions, post due completions of the timing model, then fetch and
//! execute up to [`BATCH`] commands from each SQ (admin first), reading each
//! tail doorbell once. The thread polls without pause while it finds work
//! and backs off when idle: it spins for `EmulatorConfig::idle_spin` (30 us
//! by default), then sleeps 50 us at a time, 200 us after 5 ms and 1 ms
//! after 50 ms without work (no `sched_yield` phase; see [`run`]). A kick
//! (`NvmeDevice::expect_doorbells`: a GPU kernel is about to ring) wakes it
//! and keeps it polling for [`KICK_SPIN`], then counts as work done.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvme_regs::registers::offset;
use nvme_regs::{Aqa, Cc, Csts, ShutdownNotification, ShutdownStatus, Sqe, Status};

use crate::config::{EmulatorConfig, NamespaceSpec};
use crate::dma::{DmaFault, DmaView, IovaSpace};
use crate::fault::{FaultAction, Faults};
use crate::in_transfer::InTransfer;
use crate::media::Media;
use crate::prp::Segment;
use crate::queues::{CompQueue, Completion, CqeQuirk, SqDoorbell, SubQueue};
use crate::regs::{RegisterPage, MPSMAX, MPSMIN};
use crate::timing::Timing;

/// Most SQEs fetched from one SQ per poll iteration.
pub(crate) const BATCH: u32 = 256;
/// Sleep of a briefly idle controller.
const SLEEP: Duration = Duration::from_micros(50);
/// How early the thread wakes before a scheduled completion.
const WAKE_MARGIN: Duration = Duration::from_micros(60);
/// Idle time after which the controller sleeps 200 us at a time.
const DEEP_IDLE: Duration = Duration::from_millis(5);
/// Idle time after which the controller sleeps 1 ms at a time.
const DEEPER_IDLE: Duration = Duration::from_millis(50);
/// How often a gone controller restores its all-ones register page.
const GONE_REFILL: Duration = Duration::from_millis(1);
/// How long the thread polls without pause after a kick
/// ([`Shared::kick`]): longer than a kernel takes to start and write its
/// first doorbell.
pub(crate) const KICK_SPIN: Duration = Duration::from_micros(200);

/// State shared between the [`crate::Emulator`] handle and its thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub regs: RegisterPage,
    pub iova: IovaSpace,
    /// DMA domain of each qid's next I/O SQ, by qid (index 0 unused:
    /// the admin SQ is always [`crate::SHARED_DOMAIN`]);
    /// [`crate::Emulator::set_sq_domain`] writes, Create I/O SQ reads.
    pub sq_domains: Box<[std::sync::atomic::AtomicU32]>,
    pub stats: StatsAtomics,
    pub stop: AtomicBool,
    /// Fault-injection rules ([`crate::FaultRule`]).
    pub faults: Faults,
    /// The device is gone ([`crate::Emulator::set_gone`],
    /// [`EmulatorConfig::registers_all_ones`]): the thread only keeps the
    /// register page all ones.
    pub gone: AtomicBool,
    /// What the register page of a gone device reads: `u32::MAX` (gone) or
    /// 0 (memory space disabled, [`crate::Emulator::disable_memory_space`]).
    pub gone_fill: std::sync::atomic::AtomicU32,
    /// Set by the thread once it has seen `gone` and stopped working.
    pub gone_ack: AtomicBool,
    /// Set by [`nvm_queue::NvmeDevice::expect_doorbells`]: another agent is
    /// about to ring doorbells; the thread polls for [`KICK_SPIN`] before
    /// it naps again.
    pub kick: AtomicBool,
    /// The backing store and write cache. The thread holds the lock for a
    /// poll iteration; the handle takes it for direct media access and a
    /// power failure.
    pub media: Mutex<Media>,
}

impl Shared {
    /// Locks the media (a panic while it was held leaves it usable).
    pub(crate) fn lock_media(&self) -> MutexGuard<'_, Media> {
        self.media.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The device stops answering: the register page reads all ones from
    /// now on and the thread stops working (see [`run`]).
    pub(crate) fn go_away(&self) {
        self.gone_fill.store(u32::MAX, Ordering::SeqCst);
        self.gone.store(true, Ordering::SeqCst);
        self.regs.fill(u32::MAX);
    }
}

/// Counters behind [`crate::EmuStats`].
#[derive(Debug, Default)]
pub(crate) struct StatsAtomics {
    pub commands: AtomicU64,
    pub admin_commands: AtomicU64,
    pub media_bytes_read: AtomicU64,
    pub media_bytes_written: AtomicU64,
    pub doorbell_violations: AtomicU64,
    pub dma_faults: AtomicU64,
    pub dma_domain_faults: AtomicU64,
    pub sq_tail_backwards: AtomicU64,
    pub sqe_overwritten: AtomicU64,
    pub cq_full_stalls: AtomicU64,
    pub sq_deletion_aborts: AtomicU64,
    pub sq_tail_updates: AtomicU64,
}

/// Hot counters, accumulated by the thread and added to [`StatsAtomics`]
/// once per poll iteration.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LocalStats {
    pub media_bytes_read: u64,
    pub media_bytes_written: u64,
    pub host_reads: u64,
    pub host_writes: u64,
}

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
        }
    }

    /// Namespace `nsid` (1-based) as (index, spec).
    pub(crate) fn namespace(&self, nsid: u32) -> Option<(usize, NamespaceSpec)> {
        let i = usize::try_from(nsid).ok()?.checked_sub(1)?;
        self.config.namespaces.get(i).map(|ns| (i, *ns))
    }

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
    fn injected_fatal(&mut self, sh: &Shared) {
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

    fn handle_cc(&mut self, sh: &Shared) {
        let cc = sh.regs.cc();
        match self.state {
            // `never_ready`: CC.EN = 1 is never acted on (CSTS.RDY stays 0).
            State::Disabled if cc.en() && !self.config.never_ready => self.enable(sh, cc),
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

    /// One poll iteration. Returns whether any work was done and the next
    /// due time of the timing model.
    pub(crate) fn poll(&mut self, sh: &Shared, now: Instant) -> (bool, Option<Instant>) {
        self.handle_cc(sh);
        if self.state != State::Enabled {
            return (false, None);
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
    fn post_pending(&mut self, sh: &Shared, dma: &DmaView<'_>, cqid: u16) -> Result<bool, Fatal> {
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

    /// Counts a DMA fault on a data transfer: a refused access to another
    /// DMA domain's memory, or one outside every mapping.
    pub(crate) fn data_fault(&self, sh: &Shared, dma: &DmaView<'_>) {
        if dma.take_foreign() {
            sh.stats.dma_domain_faults.fetch_add(1, Ordering::Relaxed);
        } else {
            sh.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads a command's data (PRP1/PRP2, `len` bytes) into `self.scratch`
    /// (resized to `len`).
    pub(crate) fn read_data(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        sqe: &Sqe,
        len: usize,
    ) -> Result<(), Status> {
        self.walk(sh, dma, sqe, len as u64)?;
        self.scratch.resize(len.max(4096), 0);
        let mut off = 0usize;
        for s in &self.segs {
            let l = s.len as usize;
            let Some(dst) = self.scratch.get_mut(off..off + l) else {
                break;
            };
            if dma.read(s.iova, dst).is_err() {
                self.data_fault(sh, dma);
                return Err(crate::prp::PrpError::Fault(DmaFault { iova: s.iova, len: l }).status());
            }
            off += l;
        }
        Ok(())
    }

    /// Writes `data` followed by zeroes up to `len` bytes to the command's
    /// data buffer (Identify, Get Log Page).
    pub(crate) fn write_data(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        sqe: &Sqe,
        data: &[u8],
        len: usize,
    ) -> Result<(), Status> {
        self.walk(sh, dma, sqe, len as u64)?;
        let mut off = 0usize;
        for s in &self.segs {
            let l = s.len as usize;
            let from_data = data.len().saturating_sub(off).min(l);
            let r = dma
                .write(s.iova, data.get(off..off + from_data).unwrap_or(&[]))
                .and_then(|()| dma.zero(s.iova + from_data as u64, l - from_data));
            if r.is_err() {
                self.data_fault(sh, dma);
                return Err(crate::prp::PrpError::Fault(DmaFault { iova: s.iova, len: l }).status());
            }
            off += l;
        }
        Ok(())
    }

    /// Walks the command's PRPs for `len` bytes into `self.segs`.
    pub(crate) fn walk(&mut self, sh: &Shared, dma: &DmaView<'_>, sqe: &Sqe, len: u64) -> Result<(), Status> {
        crate::prp::walk(dma, sqe.prp1, sqe.prp2, len, self.page, &mut self.segs).map_err(|e| {
            if matches!(e, crate::prp::PrpError::Fault(_)) {
                self.data_fault(sh, dma);
            }
            e.status()
        })
    }
}

/// The controller thread's body: poll until `stop`, backing off when idle
/// (sleeps are `park_timeout`s, so the handle can wake the thread with
/// `unpark`), or only keep the register page all ones once `gone`.
pub(crate) fn run(shared: Arc<Shared>, mut ctrl: Controller) {
    let mut idle_since = Instant::now();
    // Until when a kick keeps the thread polling without pause.
    let mut kicked_until: Option<Instant> = None;
    while !shared.stop.load(Ordering::Acquire) {
        if shared.kick.load(Ordering::Relaxed) && shared.kick.swap(false, Ordering::Acquire) {
            // Awake, as after work: short naps once the kick's spin ends.
            idle_since = Instant::now();
            kicked_until = Some(idle_since + KICK_SPIN);
        }
        if shared.gone.load(Ordering::Acquire) {
            // The device is gone: no more work (copies in flight end first,
            // so that the media can be released); keep the register page
            // all ones, or all zeros (host writes land in the page, undo
            // them).
            ctrl.settle_transfers();
            shared.regs.fill(shared.gone_fill.load(Ordering::Acquire));
            shared.gone_ack.store(true, Ordering::Release);
            std::thread::park_timeout(GONE_REFILL);
            continue;
        }
        let now = Instant::now();
        let (work, next_due) = ctrl.poll(&shared, now);
        if work {
            idle_since = now;
            continue;
        }
        if kicked_until.is_some_and(|t| now < t) {
            std::hint::spin_loop();
            continue;
        }
        let idle = now.saturating_duration_since(idle_since);
        let until_due = next_due.map(|d| d.saturating_duration_since(now));
        // Completions are scheduled and the media channel is busy until
        // then: sleep through most of the wait instead of spinning, leaving
        // the CPU to the host and to other emulated drives (the timer
        // oversleeps by tens of microseconds, hence the margin). At most a
        // deep-idle nap at a time: doorbells (a Delete I/O SQ, new commands)
        // must still be seen while a long Delay is pending.
        if let Some(d) = until_due.filter(|d| *d > WAKE_MARGIN * 2) {
            std::thread::park_timeout((d - WAKE_MARGIN).min(SLEEP * 20));
            continue;
        }
        // No sched_yield phase: on small (virtual) machines a yield is a
        // costly system call that mostly returns at once.
        if idle < ctrl.config.idle_spin || until_due.is_some_and(|d| d < WAKE_MARGIN * 2) {
            std::hint::spin_loop();
        } else {
            // Deeper sleeps the longer the controller has been idle, so idle
            // emulators cost little CPU on small machines; the first command
            // after a long idle period waits at most one such sleep.
            let nap = if idle < DEEP_IDLE {
                SLEEP
            } else if idle < DEEPER_IDLE {
                SLEEP * 4
            } else {
                SLEEP * 20
            };
            std::thread::park_timeout(until_due.map_or(nap, |d| d.min(nap)));
        }
    }
    // Stopped: the media and the mapped memories may go once this returns.
    ctrl.settle_transfers();
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
