//! The checks themselves, one function each, in the order of [`crate::CHECKS`].

use nvm_queue::{plan_io, ControllerError, IoChunk, IoOp};
use nvme_regs::{Nlb, Status};

use crate::ctx::{
    all_success, block_pattern, chain, options_error, submit_chunks, transfer, verify_blocks, write_blocks,
    Ctx,
};
use crate::{Outcome, MIN_SCRATCH_BYTES};

pub(crate) fn check_identify(ctx: &mut Ctx) -> Result<Outcome, String> {
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
pub(crate) fn check_queue_grant(ctx: &mut Ctx) -> Result<Outcome, String> {
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
pub(crate) fn check_phase_wrap(ctx: &mut Ctx) -> Result<Outcome, String> {
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
pub(crate) fn check_cq_head_doorbell(ctx: &mut Ctx) -> Result<Outcome, String> {
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
pub(crate) fn check_slba_nlb(ctx: &mut Ctx) -> Result<Outcome, String> {
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
pub(crate) fn check_mdts_split(ctx: &mut Ctx) -> Result<Outcome, String> {
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
pub(crate) fn check_lba_out_of_range_in_batch(ctx: &mut Ctx) -> Result<Outcome, String> {
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
pub(crate) fn check_many_outstanding(ctx: &mut Ctx) -> Result<Outcome, String> {
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
pub(crate) fn check_delete_recreate(ctx: &mut Ctx) -> Result<Outcome, String> {
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

pub(crate) fn check_shutdown(ctx: &mut Ctx) -> Result<Outcome, String> {
    ctx.ctrl.shutdown().map_err(|e| chain(&e))?;
    Ok(Outcome::Pass("CC.SHN=01b reached CSTS.SHST=10b (shutdown complete)".into()))
}
