//! [`Ctx`], the state the checks share, and the I/O helpers they use:
//! block patterns, batched transfers, writes and verified reads.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use nvm_queue::{
    plan_io, Completion, Controller, DataRef, DmaBuffer, IoChunk, IoOp, NamespaceInfo, NvmeDevice, QueuePair,
    SubmitError,
};
use nvme_regs::Nlb;

use crate::{Options, Outcome};

/// State shared by the checks.
pub(crate) struct Ctx {
    pub(crate) ctrl: Controller,
    pub(crate) opts: Options,
    /// The namespace, once `identify` accepted it and the scratch range.
    pub(crate) ns: Option<NamespaceInfo>,
    /// Why the options do not fit the device (see [`Report::options_error`]).
    pub(crate) options_error: Option<String>,
    /// Set when a check could not give its queue pair back (the Delete
    /// failed, e.g. after a timeout): the later checks need QID 1 and are
    /// skipped with this reason instead of failing for it.
    pub(crate) broken: Option<String>,
    /// Every DMA buffer the current check allocated ([`Ctx::dma`]). They
    /// live until the check's queues are deleted (which ends every command
    /// that could still write them), and are leaked if a Delete failed.
    pub(crate) buffers: RefCell<Vec<Arc<DmaBuffer>>>,
}

impl Ctx {
    pub(crate) fn ns(&self) -> Result<NamespaceInfo, String> {
        self.ns.ok_or_else(|| "no namespace".to_owned())
    }

    pub(crate) fn dev(&self) -> Arc<dyn NvmeDevice> {
        self.ctrl.device().clone()
    }

    /// A zeroed DMA buffer of `len` bytes that stays allocated until the
    /// current check's queues are deleted (see [`Ctx::buffers`]), even if
    /// the check returns early on a timeout.
    pub(crate) fn dma(&self, len: usize) -> Result<Arc<DmaBuffer>, String> {
        let b = Arc::new(DmaBuffer::new(&self.dev(), len).map_err(|e| chain(&e))?);
        self.buffers.borrow_mut().push(b.clone());
        Ok(b)
    }

    /// Byte offset of scratch block `i`.
    pub(crate) fn scratch_byte(&self, i: u64) -> Result<u64, String> {
        let ns = self.ns()?;
        Ok(self.opts.scratch.start.saturating_add(i).saturating_mul(u64::from(ns.block_size)))
    }

    /// Creates I/O queue pair `qid` with `entries` entries (clamped to
    /// CAP.MQES + 1), runs `body` on it, and deletes it again.
    pub(crate) fn with_queue<T>(
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
    pub(crate) fn give_back(&mut self, qid: u16) -> Result<(), String> {
        self.ctrl.delete_io_queue_pair(qid).map_err(|e| {
            let why = format!("deleting I/O queue pair {qid} failed: {}", chain(&e));
            self.broken = Some(why.clone());
            why
        })
    }
}

/// Formats an error with its sources.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
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
pub(crate) fn block_pattern(lba: u64, block_size: u32, seed: u64) -> Vec<u8> {
    (0..u64::from(block_size) / 8).flat_map(|w| ((lba << 20 | w) ^ seed).to_le_bytes()).collect()
}

/// Submits the commands of `len` bytes at byte `offset` (data at
/// `buf[buf_off..]`), rings once, and waits for all of them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn transfer(
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
pub(crate) fn submit_chunks(
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

pub(crate) fn all_success(done: &[Completion], what: &str) -> Result<(), String> {
    match done.iter().find(|c| !c.status.is_success()) {
        None => Ok(()),
        Some(c) => Err(format!("{what}: command {} failed with {}", c.tag, c.status)),
    }
}

/// Writes the pattern of scratch blocks `first..first + n` with one
/// command per block.
pub(crate) fn write_blocks(
    ctx: &Ctx,
    qp: &mut QueuePair,
    first: u64,
    n: u64,
    seed: u64,
) -> Result<(), String> {
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
pub(crate) fn verify_blocks(
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
pub(crate) fn options_error(ctx: &mut Ctx, why: String) -> Result<Outcome, String> {
    ctx.options_error = Some(why.clone());
    Ok(Outcome::Skip(format!("options do not fit the device: {why}")))
}
