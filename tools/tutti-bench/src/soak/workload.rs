//! A lane's workload in a cell without faults: the old keys put first,
//! then `rounds` rounds of `inflight` batches (gets, puts, or a put batch
//! of new keys in flight with the get batches of old ones), then every new
//! key read back. Every item is judged and every byte compared.

use super::batches::{
    compare, get_batches, get_round, issue_gets, issue_puts, judge_gets, judge_puts, put_batches, put_round,
    wait_get, wait_put, WaitLimit,
};
use super::cells::Mix;
use super::error::CellError;
use super::run::{Ctx, Lane};
use super::verify::{Tally, Want};

/// Items per put batch when putting the old keys.
const PREFILL_BATCH: usize = 256;

/// The limit of an ordinary wait: the run's deadline, no lateness.
pub fn normal(ctx: &Ctx<'_>) -> WaitLimit {
    WaitLimit { deadline: ctx.s.deadline, late: std::time::Duration::ZERO }
}

/// A verified hit of key `k`'s whole object.
pub fn hit<'a>(ctx: &'a Ctx<'a>) -> impl Fn(u64) -> Want + 'a {
    |k| Want::Hit(ctx.cell.len_of(k))
}

/// Runs the lane's workload, counting into `t`.
pub fn run(ctx: &Ctx<'_>, lane: &mut Lane, t: &mut Tally) -> Result<(), CellError> {
    prefill(ctx, lane, t)?;
    let (c, p) = (ctx.cell, lane.plan);
    match c.mix {
        Mix::Get => {
            let keys: Vec<u64> = (0..p.old).collect();
            let batches = get_batches(&keys, c.batch);
            for _ in 0..c.rounds {
                get_round(ctx, lane, t, &batches, normal(ctx), &hit(ctx))?;
            }
        }
        Mix::Put => {
            let per_round = (c.batch * c.inflight) as u64;
            for r in 0..c.rounds as u64 {
                let keys: Vec<u64> = (p.old + r * per_round..p.old + (r + 1) * per_round).collect();
                let batches = put_batches(&keys, c.batch);
                for (k, st) in put_round(ctx, lane, t, &batches, normal(ctx))? {
                    t.item(&|| format!("round {r} put of key {k}"), &st, Want::Ok);
                }
            }
            read_back(ctx, lane, t)?;
        }
        Mix::Mixed => {
            for r in 0..c.rounds as u64 {
                mixed_round(ctx, lane, t, r)?;
            }
            read_back(ctx, lane, t)?;
        }
    }
    Ok(())
}

/// [`mixed_round`] with one batch in flight at a time: the round's puts,
/// waited on, then its gets.
fn mixed_round_serial(
    ctx: &Ctx<'_>,
    lane: &mut Lane,
    t: &mut Tally,
    puts: &[Vec<u64>],
    gets: &[Vec<(u64, usize)>],
    (smem, dmem): (&tutti_kv::KvMemory, &tutti_kv::KvMemory),
) -> Result<(), CellError> {
    for (i, b) in puts.iter().enumerate() {
        let pp = issue_puts(ctx, lane, smem, std::slice::from_ref(b))?;
        for pp in pp {
            let st = wait_put(ctx, lane, t, i, pp, normal(ctx))?;
            judge_puts(t, i, b, &st, &|_| Want::Ok);
        }
    }
    let mut good = Vec::new();
    for (i, b) in gets.iter().enumerate() {
        for pg in issue_gets(ctx, lane, dmem, std::slice::from_ref(b))? {
            let st = wait_get(ctx, lane, t, i, pg, normal(ctx))?;
            judge_gets(t, i, b, &st, &hit(ctx), &mut good);
        }
    }
    compare(ctx, lane, t, &good)
}

/// Puts the old keys (`0..plan.old`) in batches of [`PREFILL_BATCH`], one
/// at a time, in key order (so that on a fresh store key `k` is in slot
/// `k`).
pub fn prefill(ctx: &Ctx<'_>, lane: &mut Lane, t: &mut Tally) -> Result<(), CellError> {
    let keys: Vec<u64> = (0..lane.plan.old).collect();
    for chunk in put_batches(&keys, PREFILL_BATCH) {
        for (k, st) in put_round(ctx, lane, t, &[chunk], normal(ctx))? {
            t.item(&|| format!("prefill put of key {k}"), &st, Want::Ok);
        }
    }
    Ok(())
}

/// Reads every new key back (`plan.old..plan.old + plan.new`), a round's
/// worth of destination rooms at a time, and compares it.
pub fn read_back(ctx: &Ctx<'_>, lane: &mut Lane, t: &mut Tally) -> Result<(), CellError> {
    let p = lane.plan;
    let keys: Vec<u64> = (p.old..p.old + p.new).collect();
    for chunk in keys.chunks(p.get_rooms.max(1)) {
        get_round(ctx, lane, t, &get_batches(chunk, ctx.cell.batch), normal(ctx), &hit(ctx))?;
    }
    Ok(())
}

/// Round `r` of a mixed cell: a put batch of new keys and the get batches
/// of every old key in flight together (the put issued first in even
/// rounds, last in odd ones); the gets waited first, then the put.
fn mixed_round(ctx: &Ctx<'_>, lane: &mut Lane, t: &mut Tally, r: u64) -> Result<(), CellError> {
    let (c, p) = (ctx.cell, lane.plan);
    let first = p.old + r * c.batch as u64;
    let puts = vec![(first..first + c.batch as u64).collect::<Vec<u64>>()];
    let olds: Vec<u64> = (0..p.old).collect();
    let gets = get_batches(&olds, c.batch);
    ctx.call(lane.index, &|| "zeroing the destinations".to_owned(), || lane.dst.zero())?;
    let (smem, dmem) = (*lane.src.mem(), *lane.dst.mem());
    if c.serial {
        return mixed_round_serial(ctx, lane, t, &puts, &gets, (&smem, &dmem));
    }
    let (put_pending, get_pending) = if r.is_multiple_of(2) {
        let pp = issue_puts(ctx, lane, &smem, &puts)?;
        (pp, issue_gets(ctx, lane, &dmem, &gets)?)
    } else {
        let gp = issue_gets(ctx, lane, &dmem, &gets)?;
        (issue_puts(ctx, lane, &smem, &puts)?, gp)
    };
    let mut good = Vec::new();
    for (i, (pg, b)) in get_pending.into_iter().zip(&gets).enumerate() {
        let st = wait_get(ctx, lane, t, i, pg, normal(ctx))?;
        judge_gets(t, i, b, &st, &hit(ctx), &mut good);
    }
    for (i, (pp, b)) in put_pending.into_iter().zip(&puts).enumerate() {
        let st = wait_put(ctx, lane, t, i, pp, normal(ctx))?;
        judge_puts(t, i, b, &st, &|_| Want::Ok);
    }
    compare(ctx, lane, t, &good)
}
