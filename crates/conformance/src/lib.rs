//! Driver conformance checks that run against any [`NvmeDevice`].
//!
//! The same checks run in three places: against the software controller
//! (`nvme-emu`) in `cargo test`, against QEMU's NVMe controller through
//! vfio-pci inside the VM harness (`tests/vm`), and against a real drive
//! with `tutti-probe conformance`. They therefore use only what every
//! controller offers: registers, admin commands and I/O through the
//! project's own queues. Checks that need to look inside the controller
//! (doorbell values, fetch counts) stay in the emulator-only tests.
//!
//! **Destructive:** the checks write to the logical blocks of
//! [`Options::scratch`] on namespace [`Options::nsid`]. Nothing outside that
//! range is written; one check reads one block past the namespace's end to
//! see the controller refuse it.
//!
//! Each check brings its own queue pair (QID 1 unless it says otherwise),
//! and deletes it again whether it passes or fails, so one failing check
//! does not poison the next.

use std::cell::RefCell;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvm_queue::{
    plan_io, Completion, Controller, ControllerError, ControllerOptions, DataRef, DmaBuffer, IoChunk, IoOp,
    NamespaceInfo, NvmeDevice, QueuePair, SubmitError,
};
use nvme_regs::{Nlb, Status};

/// What to run the checks on.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace to do I/O on (NSID, 1-based).
    pub nsid: u32,
    /// Scratch range in **logical blocks** of `nsid`, end exclusive. Its
    /// contents are destroyed. It must hold at least [`MIN_SCRATCH_BYTES`].
    pub scratch: Range<u64>,
    /// I/O queue pairs to ask for with Set Features (Number of Queues); the
    /// controller may grant fewer and the checks use what it grants.
    pub ask_queues: u16,
    /// Bound on every wait for a completion.
    pub timeout: Duration,
    /// Upper bound on one command's transfer in bytes, on top of MDTS
    /// (see [`ControllerOptions::max_transfer_cap`]).
    pub max_transfer_cap: usize,
    /// Stop request, checked before each check (a tool sets it from a
    /// signal handler). Once it is `true`, the checks left are skipped and
    /// the report marked [`Report::interrupted`], except `shutdown`, which
    /// still runs: every check deletes its queues before it returns, so the
    /// controller is left shut down (CC.SHN) with no I/O queue.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Options {
    /// Defaults for namespace `nsid` with scratch blocks `scratch`: ask for
    /// 8 queue pairs, 10 s per wait, 1 MiB transfer cap.
    pub fn new(nsid: u32, scratch: Range<u64>) -> Self {
        Self {
            nsid,
            scratch,
            ask_queues: 8,
            timeout: Duration::from_secs(10),
            max_transfer_cap: 1 << 20,
            stop: None,
        }
    }
}

/// Smallest scratch range the checks need, in bytes (enough for the
/// MDTS-splitting check on a controller whose transfer limit is the 1 MiB
/// cap).
pub const MIN_SCRATCH_BYTES: u64 = 4 << 20;

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    /// The controller and the driver behaved as the check expects; the text
    /// says what was seen.
    Pass(String),
    /// They did not; the text says what went wrong.
    Fail(String),
    /// The check could not run here (the text says why); not a failure.
    Skip(String),
}

/// One check's name and outcome.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CheckResult {
    /// Short snake_case name of the check.
    pub name: &'static str,
    /// What happened.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// The results of [`run`] on one device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// The device's name (PCI address or `emu:<name>`).
    pub device: String,
    /// One entry per check, in the order they ran.
    pub results: Vec<CheckResult>,
    /// Set when the [`Options`] do not fit the device (namespace not
    /// active or formatted with metadata, scratch range outside it or too
    /// small): a mistake of the caller, not of the controller. The checks
    /// that need the range are then skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options_error: Option<String>,
    /// Set when [`Options::stop`] cut the run short: checks were skipped.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

impl Report {
    /// Number of checks that passed.
    pub fn passed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Pass(_)))
    }

    /// Number of checks that failed.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Fail(_)))
    }

    /// Number of checks that were skipped.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Skip(_)))
    }

    /// `true` when no check failed, at least one passed, the options fit
    /// the device, and the run was not interrupted.
    pub fn is_ok(&self) -> bool {
        self.failed() == 0 && self.passed() > 0 && self.options_error.is_none() && !self.interrupted
    }

    /// The outcome of the check named `name`, if it ran.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.results.iter().find(|r| r.name == name).map(|r| &r.outcome)
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.results.iter().filter(|r| f(&r.outcome)).count()
    }
}

impl fmt::Display for Report {
    /// One line per check (`pass  name: detail`), then the summary line
    /// `conformance <device>: <n> passed, <m> failed, <k> skipped`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            let (word, text) = match &r.outcome {
                Outcome::Pass(t) => ("pass", t),
                Outcome::Fail(t) => ("FAIL", t),
                Outcome::Skip(t) => ("skip", t),
            };
            writeln!(f, "{word}  {}: {text}", r.name)?;
        }
        if let Some(why) = &self.options_error {
            writeln!(f, "options: {why}")?;
        }
        if self.interrupted {
            writeln!(f, "interrupted: a stop request skipped the checks left")?;
        }
        write!(
            f,
            "conformance {}: {} passed, {} failed, {} skipped",
            self.device,
            self.passed(),
            self.failed(),
            self.skipped()
        )
    }
}

/// The checks, in the order [`run`] runs them after bring-up.
pub const CHECKS: &[&str] = &[
    "bring_up",
    "identify",
    "queue_grant",
    "phase_wrap",
    "cq_head_doorbell",
    "slba_nlb",
    "mdts_split",
    "lba_out_of_range_in_batch",
    "many_outstanding",
    "delete_recreate",
    "shutdown",
];

type CheckFn = fn(&mut Ctx) -> Result<Outcome, String>;

/// Brings the controller up on `device` and runs every check of [`CHECKS`].
///
/// Never panics on what the device does: every failure is an
/// [`Outcome::Fail`] with the reason. If bring-up fails, the other checks
/// are reported as skipped.
pub fn run(device: Arc<dyn NvmeDevice>, opts: &Options) -> Report {
    let mut report = Report {
        device: device.name().to_owned(),
        results: Vec::new(),
        options_error: None,
        interrupted: false,
    };
    let copts = ControllerOptions {
        io_queues: opts.ask_queues.max(1),
        max_transfer_cap: opts.max_transfer_cap,
        ..ControllerOptions::default()
    };
    let ctrl = match Controller::init(device.clone(), copts) {
        Ok(c) => c,
        Err(e) => {
            report.results.push(CheckResult { name: "bring_up", outcome: Outcome::Fail(chain(&e)) });
            for name in &CHECKS[1..] {
                report.results.push(CheckResult { name, outcome: Outcome::Skip("bring-up failed".into()) });
            }
            return report;
        }
    };
    let cap = ctrl.cap();
    let info = ctrl.info().clone();
    report.results.push(CheckResult {
        name: "bring_up",
        outcome: Outcome::Pass(format!(
            "CSTS.RDY=1; VS {}.{}, CAP.MQES+1={} entries, CAP.DSTRD={}, CAP.TO={} ms, MDTS={} -> {} bytes per \
             command, {} of {} I/O queue pairs granted",
            info.ver >> 16,
            (info.ver >> 8) & 0xFF,
            cap.max_queue_entries(),
            cap.dstrd(),
            cap.timeout_ms(),
            info.mdts,
            ctrl.max_transfer(),
            ctrl.io_queues_granted(),
            opts.ask_queues.max(1),
        )),
    });
    let mut ctx = Ctx {
        ctrl,
        opts: opts.clone(),
        ns: None,
        options_error: None,
        broken: None,
        buffers: RefCell::default(),
    };
    let checks: [(&'static str, CheckFn); 10] = [
        ("identify", check_identify),
        ("queue_grant", check_queue_grant),
        ("phase_wrap", check_phase_wrap),
        ("cq_head_doorbell", check_cq_head_doorbell),
        ("slba_nlb", check_slba_nlb),
        ("mdts_split", check_mdts_split),
        ("lba_out_of_range_in_batch", check_lba_out_of_range_in_batch),
        ("many_outstanding", check_many_outstanding),
        ("delete_recreate", check_delete_recreate),
        ("shutdown", check_shutdown),
    ];
    for (name, f) in checks {
        // A stop request skips every check left but the shutdown.
        let stopping = name != "shutdown" && opts.stop.as_deref().is_some_and(|s| s.load(Ordering::SeqCst));
        report.interrupted |= stopping;
        let outcome = if let Some(why) = &ctx.broken {
            Outcome::Skip(format!("not run: {why}"))
        } else if stopping {
            Outcome::Skip("not run: interrupted".into())
        } else if name != "identify" && ctx.ns.is_none() && !(name == "shutdown" && report.interrupted) {
            Outcome::Skip("no usable namespace and scratch range (see identify)".into())
        } else {
            f(&mut ctx).unwrap_or_else(Outcome::Fail)
        };
        let buffers = std::mem::take(&mut *ctx.buffers.borrow_mut());
        if ctx.broken.is_some() {
            // A queue could not be deleted: its commands may still write
            // these, so they stay allocated and mapped for good.
            buffers.into_iter().for_each(std::mem::forget);
        }
        report.results.push(CheckResult { name, outcome });
    }
    report.options_error = ctx.options_error;
    report
}

/// State shared by the checks.
struct Ctx {
    ctrl: Controller,
    opts: Options,
    /// The namespace, once `identify` accepted it and the scratch range.
    ns: Option<NamespaceInfo>,
    /// Why the options do not fit the device (see [`Report::options_error`]).
    options_error: Option<String>,
    /// Set when a check could not give its queue pair back (the Delete
    /// failed, e.g. after a timeout): the later checks need QID 1 and are
    /// skipped with this reason instead of failing for it.
    broken: Option<String>,
    /// Every DMA buffer the current check allocated ([`Ctx::dma`]). They
    /// live until the check's queues are deleted (which ends every command
    /// that could still write them), and are leaked if a Delete failed.
    buffers: RefCell<Vec<Arc<DmaBuffer>>>,
}

impl Ctx {
    fn ns(&self) -> Result<NamespaceInfo, String> {
        self.ns.ok_or_else(|| "no namespace".to_owned())
    }

    fn dev(&self) -> Arc<dyn NvmeDevice> {
        self.ctrl.device().clone()
    }

    /// A zeroed DMA buffer of `len` bytes that stays allocated until the
    /// current check's queues are deleted (see [`Ctx::buffers`]), even if
    /// the check returns early on a timeout.
    fn dma(&self, len: usize) -> Result<Arc<DmaBuffer>, String> {
        let b = Arc::new(DmaBuffer::new(&self.dev(), len).map_err(|e| chain(&e))?);
        self.buffers.borrow_mut().push(b.clone());
        Ok(b)
    }

    /// Byte offset of scratch block `i`.
    fn scratch_byte(&self, i: u64) -> Result<u64, String> {
        let ns = self.ns()?;
        Ok(self.opts.scratch.start.saturating_add(i).saturating_mul(u64::from(ns.block_size)))
    }

    /// Creates I/O queue pair `qid` with `entries` entries (clamped to
    /// CAP.MQES + 1), runs `body` on it, and deletes it again.
    fn with_queue<T>(
        &mut self,
        qid: u16,
        entries: u32,
        body: impl FnOnce(&mut Self, &mut QueuePair) -> Result<T, String>,
    ) -> Result<T, String> {
        let entries = entries.min(self.ctrl.cap().max_queue_entries()).max(2);
        let mut qp = self
            .ctrl
            .create_io_queue_pair(qid, entries, (entries - 1) as u16)
            .map_err(|e| format!("creating I/O queue pair {qid}: {}", chain(&e)))?;
        let out = body(self, &mut qp);
        // Deleting the SQ also ends (aborts) any command a failed or
        // timed-out body left outstanding.
        if let Err(e) = self.give_back(qid) {
            // The queue is still live on the controller: its memory must
            // stay. Report the body's error first; it is usually the cause.
            std::mem::forget(qp);
            return Err(match out {
                Err(body) => format!("{body}; then {e}"),
                Ok(_) => e,
            });
        }
        out
    }

    /// Deletes I/O queue pair `qid`; if that fails, marks the run broken so
    /// the later checks are skipped rather than failed for it.
    fn give_back(&mut self, qid: u16) -> Result<(), String> {
        self.ctrl.delete_io_queue_pair(qid).map_err(|e| {
            let why = format!("deleting I/O queue pair {qid} failed: {}", chain(&e));
            self.broken = Some(why.clone());
            why
        })
    }
}

/// Formats an error with its sources.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// The pattern written to logical block `lba`: every 8-byte word holds
/// `lba << 20 | word index` xor `seed`, so a block read from the wrong LBA
/// (wrong SLBA or NLB arithmetic) or a torn transfer is caught.
fn block_pattern(lba: u64, block_size: u32, seed: u64) -> Vec<u8> {
    (0..u64::from(block_size) / 8).flat_map(|w| ((lba << 20 | w) ^ seed).to_le_bytes()).collect()
}

/// Submits the commands of `len` bytes at byte `offset` (data at
/// `buf[buf_off..]`), rings once, and waits for all of them.
#[allow(clippy::too_many_arguments)]
fn transfer(
    ctx: &Ctx,
    qp: &mut QueuePair,
    op: IoOp,
    offset: u64,
    len: u64,
    buf: &DmaBuffer,
    buf_off: usize,
) -> Result<Vec<Completion>, String> {
    let ns = ctx.ns()?;
    let plan = plan_io(&ns, offset, len, ctx.ctrl.max_transfer()).map_err(|e| chain(&e))?;
    let chunks: Vec<IoChunk> = plan.collect();
    submit_chunks(ctx, qp, op, &chunks, buf, buf_off)
}

/// Submits `chunks` (their `offset` is relative to `buf_off`), polling
/// whenever the queue is full, and waits for every completion. Completions
/// come back sorted by tag (the chunk index).
fn submit_chunks(
    ctx: &Ctx,
    qp: &mut QueuePair,
    op: IoOp,
    chunks: &[IoChunk],
    buf: &DmaBuffer,
    buf_off: usize,
) -> Result<Vec<Completion>, String> {
    let ns = ctx.ns()?;
    let mapping = buf.mapping().clone();
    let deadline = Instant::now() + ctx.opts.timeout;
    let mut done = Vec::with_capacity(chunks.len());
    for (i, c) in chunks.iter().enumerate() {
        let data = DataRef { mapping: &mapping, offset: buf_off + c.offset, len: c.len };
        loop {
            match qp.submit(op.sqe(ns.nsid, c), Some(data), i as u64) {
                Ok(_) => break,
                Err(SubmitError::QueueFull { .. }) => {
                    qp.ring();
                    qp.poll(|c| done.push(c));
                    if Instant::now() > deadline {
                        return Err(format!("queue stayed full for {:?}: {}", ctx.opts.timeout, qp.dump()));
                    }
                }
                Err(e) => return Err(format!("submit: {}", chain(&e))),
            }
        }
    }
    qp.ring();
    while done.len() < chunks.len() {
        qp.poll(|c| done.push(c));
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {} completions within {:?}: {}",
                done.len(),
                chunks.len(),
                ctx.opts.timeout,
                qp.dump()
            ));
        }
        std::hint::spin_loop();
    }
    done.sort_by_key(|c| c.tag);
    let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    if tags != (0..chunks.len() as u64).collect::<Vec<_>>() {
        return Err(format!("completion tags {tags:?}: each command must complete exactly once"));
    }
    Ok(done)
}

fn all_success(done: &[Completion], what: &str) -> Result<(), String> {
    match done.iter().find(|c| !c.status.is_success()) {
        None => Ok(()),
        Some(c) => Err(format!("{what}: command {} failed with {}", c.tag, c.status)),
    }
}

/// Writes the pattern of scratch blocks `first..first + n` with one
/// command per block.
fn write_blocks(ctx: &Ctx, qp: &mut QueuePair, first: u64, n: u64, seed: u64) -> Result<(), String> {
    let ns = ctx.ns()?;
    let bs = ns.block_size as usize;
    let buf = ctx.dma(n as usize * bs)?;
    let mut chunks = Vec::new();
    for i in 0..n {
        let lba = ctx.opts.scratch.start + first + i;
        buf.write_bytes(i as usize * bs, &block_pattern(lba, ns.block_size, seed)).map_err(|e| chain(&e))?;
        chunks.push(IoChunk { slba: lba, nlb: Nlb::ONE, offset: i as usize * bs, len: bs });
    }
    let done = submit_chunks(ctx, qp, IoOp::Write, &chunks, &buf, 0)?;
    all_success(&done, "write")
}

/// Compares `n` blocks read into `buf` at `buf_off` with the pattern of
/// scratch blocks `first..`.
fn verify_blocks(
    ctx: &Ctx,
    buf: &DmaBuffer,
    buf_off: usize,
    first: u64,
    n: u64,
    seed: u64,
) -> Result<(), String> {
    let ns = ctx.ns()?;
    let bs = ns.block_size as usize;
    let mut got = vec![0u8; bs];
    for i in 0..n {
        let lba = ctx.opts.scratch.start + first + i;
        buf.read_bytes(buf_off + i as usize * bs, &mut got).map_err(|e| chain(&e))?;
        if got != block_pattern(lba, ns.block_size, seed) {
            let word = u64::from_le_bytes(got[..8].try_into().unwrap_or_default()) ^ seed;
            return Err(format!(
                "block at LBA {lba} holds the wrong bytes (its first word names LBA {} word {})",
                word >> 20,
                word & 0xF_FFFF
            ));
        }
    }
    Ok(())
}

/// Records that the options do not fit the device; the check is skipped.
fn options_error(ctx: &mut Ctx, why: String) -> Result<Outcome, String> {
    ctx.options_error = Some(why.clone());
    Ok(Outcome::Skip(format!("options do not fit the device: {why}")))
}

fn check_identify(ctx: &mut Ctx) -> Result<Outcome, String> {
    let info = ctx.ctrl.info().clone();
    if info.model.is_empty() {
        return Err("Identify Controller reports an empty model number".into());
    }
    if info.nn == 0 {
        return Err("Identify Controller reports NN = 0 namespaces".into());
    }
    let nsid = ctx.opts.nsid;
    // Not active, or formatted with metadata: the message says which and
    // what to do.
    let ns = match ctx.ctrl.usable_namespace(nsid) {
        Ok(ns) => ns,
        Err(e) => return options_error(ctx, e.to_string()),
    };
    if !ns.block_size.is_power_of_two() || !(512..=65536).contains(&ns.block_size) || ns.blocks == 0 {
        return Err(format!("namespace {nsid}: LBA size {} bytes x {} blocks", ns.block_size, ns.blocks));
    }
    let s = ctx.opts.scratch.clone();
    if s.start >= s.end || s.end > ns.blocks {
        return options_error(
            ctx,
            format!("scratch range {}..{} is not inside namespace {nsid} (0..{})", s.start, s.end, ns.blocks),
        );
    }
    let bytes = (s.end - s.start).saturating_mul(u64::from(ns.block_size));
    if bytes < MIN_SCRATCH_BYTES {
        return options_error(
            ctx,
            format!(
                "scratch range {}..{} is {bytes} bytes of {}-byte blocks; the checks need at least \
                 {MIN_SCRATCH_BYTES} ({} blocks)",
                s.start,
                s.end,
                ns.block_size,
                MIN_SCRATCH_BYTES / u64::from(ns.block_size)
            ),
        );
    }
    ctx.ns = Some(ns);
    Ok(Outcome::Pass(format!(
        "model {:?}, serial {:?}, firmware {:?}, VID {:#06x}, {} namespace(s); NSID {nsid}: {} x {}-byte blocks",
        info.model, info.serial, info.firmware, info.vid, info.nn, ns.blocks, ns.block_size
    )))
}

/// Uses every queue pair the controller granted, and no more.
fn check_queue_grant(ctx: &mut Ctx) -> Result<Outcome, String> {
    let granted = ctx.ctrl.io_queues_granted();
    let asked = ctx.opts.ask_queues.max(1);
    if granted == 0 || granted > asked {
        return Err(format!("{granted} I/O queue pairs granted for {asked} asked"));
    }
    let ns = ctx.ns()?;
    let mut qps = Vec::new();
    let mut result = Ok(());
    for qid in 1..=granted {
        match ctx.ctrl.create_io_queue_pair(qid, 8, 7) {
            Ok(q) => qps.push(q),
            Err(e) => {
                result = Err(format!("creating granted queue {qid}: {}", chain(&e)));
                break;
            }
        }
    }
    if result.is_ok() {
        result = match ctx.ctrl.create_io_queue_pair(granted + 1, 8, 7) {
            Err(ControllerError::NoQueue { .. }) => Ok(()),
            Err(e) => Err(format!("queue {} beyond the grant: wrong error {}", granted + 1, chain(&e))),
            Ok(_) => Err(format!("queue {} beyond the grant of {granted} was created", granted + 1)),
        };
    }
    if result.is_ok() {
        result = (|| {
            let buf = ctx.dma(ns.block_size as usize)?;
            for qp in &mut qps {
                let off = ctx.scratch_byte(0)?;
                let done = transfer(ctx, qp, IoOp::Read, off, u64::from(ns.block_size), &buf, 0)
                    .map_err(|e| format!("queue {}: {e}", qp.qid()))?;
                all_success(&done, "read").map_err(|e| format!("queue {}: {e}", qp.qid()))?;
            }
            Ok(())
        })();
    }
    // Every queue goes back, whatever happened above.
    let mut gave_back = Ok(());
    for qp in qps {
        if let Err(e) = ctx.give_back(qp.qid()) {
            // Still live on the controller: its memory must stay.
            std::mem::forget(qp);
            gave_back = gave_back.and(Err(e));
        }
    }
    result?;
    gave_back?;
    Ok(Outcome::Pass(format!(
        "asked {asked}, granted {granted}; a 1-block read on each of queues 1..={granted}; queue {} refused",
        granted + 1
    )))
}

/// A 2-entry queue wraps many times: the phase tag must flip on every pass.
fn check_phase_wrap(ctx: &mut Ctx) -> Result<Outcome, String> {
    const ROUNDS: u64 = 300;
    ctx.with_queue(1, 2, |ctx, qp| {
        let ns = ctx.ns()?;
        let bs = ns.block_size as usize;
        let buf = ctx.dma(bs)?;
        for k in 0..ROUNDS {
            let lba = ctx.opts.scratch.start + k % 8;
            buf.write_bytes(0, &block_pattern(lba, ns.block_size, k)).map_err(|e| chain(&e))?;
            let done = transfer(ctx, qp, IoOp::Write, ctx.scratch_byte(k % 8)?, bs as u64, &buf, 0)?;
            all_success(&done, &format!("round trip {k}"))?;
        }
        // Each of the 8 blocks holds the pattern of the last round that
        // wrote it.
        for b in 0..8 {
            let last = (0..ROUNDS).rev().find(|k| k % 8 == b).unwrap_or(b);
            buf.fill(0);
            let done = transfer(ctx, qp, IoOp::Read, ctx.scratch_byte(b)?, bs as u64, &buf, 0)?;
            all_success(&done, "read back")?;
            verify_blocks(ctx, &buf, 0, b, 1, last)?;
        }
        let st = qp.stats();
        if st.protocol_errors != 0 {
            return Err(format!("{} protocol errors", st.protocol_errors));
        }
        Ok(Outcome::Pass(format!("{ROUNDS} round trips on a 2-entry queue; {} completions", st.completed)))
    })
}

/// 64-entry queue: more completions than entries, in full batches and one
/// by one; each needs the CQ head doorbell to have followed.
fn check_cq_head_doorbell(ctx: &mut Ctx) -> Result<Outcome, String> {
    ctx.with_queue(1, 64, |ctx, qp| {
        let ns = ctx.ns()?;
        let bs = ns.block_size as usize;
        let entries = qp.sq().size() as u64;
        let batch = entries - 1;
        let buf = ctx.dma(batch as usize * bs)?;
        for _ in 0..3 {
            let chunks: Vec<IoChunk> = (0..batch)
                .map(|i| IoChunk {
                    slba: ctx.opts.scratch.start + i % 16,
                    nlb: Nlb::ONE,
                    offset: i as usize * bs,
                    len: bs,
                })
                .collect();
            let done = submit_chunks(ctx, qp, IoOp::Read, &chunks, &buf, 0)?;
            all_success(&done, "batch read")?;
        }
        for _ in 0..entries * 2 + 2 {
            let done = transfer(ctx, qp, IoOp::Read, ctx.scratch_byte(0)?, bs as u64, &buf, 0)?;
            all_success(&done, "sequential read")?;
        }
        Ok(Outcome::Pass(format!(
            "{entries}-entry queue: 3 batches of {batch} and {} sequential round trips, {} completions",
            entries * 2 + 2,
            qp.stats().completed
        )))
    })
}

/// Byte offsets become SLBA and zero-based NLB in units of the namespace's
/// LBA size: blocks written one by one come back in place from one
/// multi-block read at an LBA that is not a multiple of 8.
fn check_slba_nlb(ctx: &mut Ctx) -> Result<Outcome, String> {
    ctx.with_queue(1, 32, |ctx, qp| {
        let ns = ctx.ns()?;
        let bs = u64::from(ns.block_size);
        let seed = 0x5eed_0001;
        write_blocks(ctx, qp, 0, 24, seed)?;
        let (first, n) = (3u64, 13u64);
        let offset = ctx.scratch_byte(first)?;
        let mut plan = plan_io(&ns, offset, n * bs, ctx.ctrl.max_transfer()).map_err(|e| chain(&e))?;
        let c0 = plan.next().ok_or("empty plan")?;
        let want_slba = ctx.opts.scratch.start + first;
        if c0.slba != want_slba {
            return Err(format!("byte offset {offset} planned as SLBA {} (want {want_slba})", c0.slba));
        }
        let buf = ctx.dma((n * bs) as usize)?;
        let done = transfer(ctx, qp, IoOp::Read, offset, n * bs, &buf, 0)?;
        all_success(&done, "read")?;
        verify_blocks(ctx, &buf, 0, first, n, seed)?;
        Ok(Outcome::Pass(format!(
            "{}-byte LBAs: 24 single-block writes, then {n} blocks read from SLBA {want_slba} as {} command(s) \
             (first NLB {} zero-based) came back in place",
            bs,
            done.len(),
            c0.nlb.zero_based()
        )))
    })
}

/// A transfer of three and a bit times MDTS is split, at an in-page buffer
/// offset (PRP lists), and reassembled.
fn check_mdts_split(ctx: &mut Ctx) -> Result<Outcome, String> {
    ctx.with_queue(1, 64, |ctx, qp| {
        let ns = ctx.ns()?;
        let bs = u64::from(ns.block_size);
        let max = ctx.ctrl.max_transfer() as u64;
        let len = 3 * max + bs;
        let scratch_bytes = (ctx.opts.scratch.end - ctx.opts.scratch.start).saturating_mul(bs);
        if len + 32 * bs > scratch_bytes {
            return Ok(Outcome::Skip(format!("needs {len} bytes of scratch, have {scratch_bytes}")));
        }
        let first = 32;
        let data: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let src = ctx.dma(len as usize + 4096)?;
        src.write_bytes(0x200, &data).map_err(|e| chain(&e))?;
        let done = transfer(ctx, qp, IoOp::Write, ctx.scratch_byte(first)?, len, &src, 0x200)?;
        all_success(&done, "write")?;
        let commands = done.len();
        if commands < 4 {
            return Err(format!(
                "{len} bytes with a {max}-byte limit went as {commands} commands (want >= 4)"
            ));
        }
        let dst = ctx.dma(len as usize + 8192)?;
        dst.fill(0xA5);
        let done = transfer(ctx, qp, IoOp::Read, ctx.scratch_byte(first)?, len, &dst, 0x1008)?;
        all_success(&done, "read")?;
        let mut got = vec![0u8; len as usize];
        dst.read_bytes(0x1008, &mut got).map_err(|e| chain(&e))?;
        if got != data {
            let at = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("read back differs at byte {at} of {len}"));
        }
        Ok(Outcome::Pass(format!(
            "{len} bytes with a {max}-byte transfer limit: {commands} commands each way, buffers at in-page \
             offsets 0x200 and 0x1008, bytes equal"
        )))
    })
}

/// A batch where one command reads past the namespace's end: that command
/// gets the controller's status, every other command of the batch succeeds
/// with the right data.
fn check_lba_out_of_range_in_batch(ctx: &mut Ctx) -> Result<Outcome, String> {
    ctx.with_queue(1, 16, |ctx, qp| {
        let ns = ctx.ns()?;
        let bs = ns.block_size as usize;
        let seed = 0x5eed_0002;
        write_blocks(ctx, qp, 40, 4, seed)?;
        let mut chunks: Vec<IoChunk> = (0..4)
            .map(|i| IoChunk {
                slba: ctx.opts.scratch.start + 40 + i,
                nlb: Nlb::ONE,
                offset: i as usize * bs,
                len: bs,
            })
            .collect();
        // The bad one sits in the middle of the batch.
        chunks.insert(2, IoChunk { slba: ns.blocks, nlb: Nlb::ONE, offset: 4 * bs, len: bs });
        let buf = ctx.dma(5 * bs)?;
        let done = submit_chunks(ctx, qp, IoOp::Read, &chunks, &buf, 0)?;
        let bad = done[2].status;
        let lba_out_of_range = Status::generic(nvme_regs::status::generic::LBA_OUT_OF_RANGE);
        if (bad.sct, bad.sc) != (lba_out_of_range.sct, lba_out_of_range.sc) {
            return Err(format!("read at LBA {} (past the end) completed with {bad}", ns.blocks));
        }
        for (i, c) in done.iter().enumerate().filter(|(i, _)| *i != 2) {
            if !c.status.is_success() {
                return Err(format!("good command {i} of the batch failed with {}", c.status));
            }
        }
        for c in chunks.iter().filter(|c| c.slba != ns.blocks) {
            let i = c.slba - ctx.opts.scratch.start - 40;
            verify_blocks(ctx, &buf, c.offset, 40 + i, 1, seed)?;
        }
        Ok(Outcome::Pass(format!(
            "the read at LBA {} came back {bad}; the other 4 of the batch succeeded with their data",
            ns.blocks
        )))
    })
}

/// A full queue of distinct reads: every command completes exactly once,
/// with its own data, whatever order the controller chooses.
fn check_many_outstanding(ctx: &mut Ctx) -> Result<Outcome, String> {
    ctx.with_queue(1, 32, |ctx, qp| {
        let ns = ctx.ns()?;
        let bs = ns.block_size as usize;
        let seed = 0x5eed_0003;
        let n = u64::from(qp.sq().size() - 1);
        write_blocks(ctx, qp, 64, n, seed)?;
        // Reverse order, so the data position differs from the LBA order.
        let chunks: Vec<IoChunk> = (0..n)
            .map(|i| IoChunk {
                slba: ctx.opts.scratch.start + 64 + (n - 1 - i),
                nlb: Nlb::ONE,
                offset: i as usize * bs,
                len: bs,
            })
            .collect();
        let buf = ctx.dma(n as usize * bs)?;
        let done = submit_chunks(ctx, qp, IoOp::Read, &chunks, &buf, 0)?;
        all_success(&done, "read")?;
        for i in 0..n {
            verify_blocks(ctx, &buf, i as usize * bs, 64 + (n - 1 - i), 1, seed)?;
        }
        let mut order: Vec<u16> = done.iter().map(|c| c.cid).collect();
        order.sort_unstable();
        order.dedup();
        if order.len() != done.len() {
            return Err("two outstanding commands shared a CID".into());
        }
        let st = qp.stats();
        if st.protocol_errors != 0 {
            return Err(format!("{} protocol errors", st.protocol_errors));
        }
        Ok(Outcome::Pass(format!("{n} reads outstanding at once, each completed once with its own block")))
    })
}

/// Delete and re-create a queue pair whose CQ memory was poisoned with
/// 0xFF: no phantom completion, and I/O works on the new queue.
fn check_delete_recreate(ctx: &mut Ctx) -> Result<Outcome, String> {
    let ns = ctx.ns()?;
    let mut qp = ctx.ctrl.create_io_queue_pair(1, 16, 15).map_err(|e| chain(&e))?;
    if let Err(e) = ctx.give_back(1) {
        std::mem::forget(qp);
        return Err(e);
    }
    qp.cq().memory().fill(0xFF);
    ctx.ctrl.recreate_io_queue_pair(&mut qp).map_err(|e| format!("re-create: {}", chain(&e)))?;
    let result = (|| {
        let mut phantom = 0;
        qp.poll(|_| phantom += 1);
        if phantom != 0 {
            return Err(format!("{phantom} completions seen before any command"));
        }
        let buf = ctx.dma(ns.block_size as usize)?;
        let done =
            transfer(ctx, &mut qp, IoOp::Read, ctx.scratch_byte(0)?, u64::from(ns.block_size), &buf, 0)?;
        all_success(&done, "read after re-create")?;
        Ok(())
    })();
    let del = ctx.give_back(1);
    if del.is_err() {
        std::mem::forget(qp);
    }
    result?;
    del?;
    Ok(Outcome::Pass("CQ memory poisoned with 0xFF before Create: no phantom completion; I/O works".into()))
}

fn check_shutdown(ctx: &mut Ctx) -> Result<Outcome, String> {
    ctx.ctrl.shutdown().map_err(|e| chain(&e))?;
    Ok(Outcome::Pass("CC.SHN=01b reached CSTS.SHST=10b (shutdown complete)".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_names_its_block_and_word() {
        let p = block_pattern(7, 512, 0);
        assert_eq!(p.len(), 512);
        assert_eq!(u64::from_le_bytes(p[8..16].try_into().unwrap()), 7 << 20 | 1);
        assert_ne!(block_pattern(7, 512, 1), p);
        assert_ne!(block_pattern(8, 512, 0), p);
    }

    #[test]
    fn report_counts_and_prints_a_summary_line() {
        let r = Report {
            device: "emu:x".into(),
            results: vec![
                CheckResult { name: "a", outcome: Outcome::Pass("ok".into()) },
                CheckResult { name: "b", outcome: Outcome::Fail("bad".into()) },
                CheckResult { name: "c", outcome: Outcome::Skip("n/a".into()) },
            ],
            options_error: None,
            interrupted: false,
        };
        assert_eq!((r.passed(), r.failed(), r.skipped(), r.is_ok()), (1, 1, 1, false));
        let text = r.to_string();
        assert!(text.contains("FAIL  b: bad"));
        assert!(text.ends_with("conformance emu:x: 1 passed, 1 failed, 1 skipped"));
    }
}
