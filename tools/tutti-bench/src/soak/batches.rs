//! Batches of puts and gets on a lane: issued all at once (in flight
//! together), each waited with a deadline under the watchdog, every item
//! judged, every byte of every good get compared with its source.

use std::time::Duration;

use tutti_kv::{Get, ItemStatus, KvMemory, PendingGets, PendingPuts, Put, Value};

use super::error::CellError;
use super::memory::wrong_bytes;
use super::run::{Ctx, Lane};
use super::verify::{Tally, Verdict, Want};

/// A get batch: (key, destination room) per item.
pub type GetBatch = Vec<(u64, usize)>;

/// A put batch: its keys (each from its own source room).
pub type PutBatch = Vec<u64>;

/// `keys` cut into get batches of `batch`, into destination rooms 0, 1, ...
/// in order.
pub fn get_batches(keys: &[u64], batch: usize) -> Vec<GetBatch> {
    let rooms: Vec<(u64, usize)> = keys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    rooms.chunks(batch.max(1)).map(<[_]>::to_vec).collect()
}

/// `keys` cut into put batches of `batch`.
pub fn put_batches(keys: &[u64], batch: usize) -> Vec<PutBatch> {
    keys.chunks(batch.max(1)).map(<[_]>::to_vec).collect()
}

/// Issues every get batch (none waited yet) into the rooms of `mem` (the
/// lane's destination region).
pub fn issue_gets<'m>(
    ctx: &Ctx<'_>,
    lane: &Lane,
    mem: &'m KvMemory,
    batches: &[GetBatch],
) -> Result<Vec<PendingGets<'m>>, CellError> {
    let room = lane.dst.room() as u64;
    let mut pending = Vec::with_capacity(batches.len());
    for b in batches {
        let mut items = Vec::with_capacity(b.len());
        for &(k, r) in b {
            items.push(Get {
                key: lane.key(k)?,
                into: Value { memory: mem, offset: r as u64 * room, len: room },
            });
        }
        let what = || format!("lane {}: get of {} items (submission)", lane.index, items.len());
        pending.push(ctx.call(lane.index, &what, || lane.kv.get(&items))?);
    }
    Ok(pending)
}

/// Issues every put batch (none waited yet) from the rooms of `mem` (the
/// lane's source region: key `k` in room `k`).
pub fn issue_puts(
    ctx: &Ctx<'_>,
    lane: &Lane,
    mem: &KvMemory,
    batches: &[PutBatch],
) -> Result<Vec<PendingPuts>, CellError> {
    let room = lane.src.room() as u64;
    let mut pending = Vec::with_capacity(batches.len());
    for b in batches {
        let mut items = Vec::with_capacity(b.len());
        for &k in b {
            let value = Value { memory: mem, offset: k * room, len: ctx.cell.len_of(k) };
            items.push(Put { key: lane.key(k)?, value });
        }
        let what = || format!("lane {}: put of {} items (checksums and submission)", lane.index, items.len());
        pending.push(ctx.call(lane.index, &what, || lane.kv.put(&items))?);
    }
    Ok(pending)
}

/// How long a wait may take: its deadline, and how far past it the wait
/// may return by design (GPU-executed waits end with their kernel).
#[derive(Debug, Clone, Copy)]
pub struct WaitLimit {
    /// The deadline given to the wait.
    pub deadline: Duration,
    /// Lateness past the deadline that is the documented behaviour.
    pub late: Duration,
}

/// Waits for get batch `i`, marked for the watchdog, and accounts for its
/// overrun; its statuses, one per item.
pub fn wait_get(
    ctx: &Ctx<'_>,
    lane: &Lane,
    t: &mut Tally,
    i: usize,
    p: PendingGets<'_>,
    lim: WaitLimit,
) -> Result<Vec<ItemStatus>, CellError> {
    let what = || format!("lane {}: wait_get of get batch {i}", lane.index);
    let (r, took) =
        ctx.watch.within(lane.index, &what, lim.deadline + lim.late, || lane.kv.wait_get(p, lim.deadline));
    account(ctx, t, took, lim, &what());
    Ok(r?)
}

/// Waits for put batch `i`, as [`wait_get`].
pub fn wait_put(
    ctx: &Ctx<'_>,
    lane: &Lane,
    t: &mut Tally,
    i: usize,
    p: PendingPuts,
    lim: WaitLimit,
) -> Result<Vec<ItemStatus>, CellError> {
    let what = || format!("lane {}: wait_put of put batch {i}", lane.index);
    let (r, took) =
        ctx.watch.within(lane.index, &what, lim.deadline + lim.late, || lane.kv.wait_put(p, lim.deadline));
    account(ctx, t, took, lim, &what());
    Ok(r?)
}

/// Records how far past its deadline a wait returned; fails the tally when
/// that is beyond its allowed lateness plus the run's overrun bound.
fn account(ctx: &Ctx<'_>, t: &mut Tally, took: Duration, lim: WaitLimit, what: &str) {
    let over = took.saturating_sub(lim.deadline);
    if lim.late.is_zero() {
        t.worst_overrun = t.worst_overrun.max(over);
    } else {
        t.kernel_bound = t.kernel_bound.max(over);
    }
    if over > lim.late + ctx.s.overrun_bound {
        t.fail(format!(
            "{what} returned {} ms past its {} ms deadline (bound {} ms)",
            over.as_millis(),
            lim.deadline.as_millis(),
            (lim.late + ctx.s.overrun_bound).as_millis()
        ));
    }
}

/// Judges get batch `i`'s statuses against `want(key)`; the items to
/// compare (the good ones) are appended to `good`.
pub fn judge_gets(
    t: &mut Tally,
    i: usize,
    batch: &GetBatch,
    st: &[ItemStatus],
    want: &dyn Fn(u64) -> Want,
    good: &mut Vec<(u64, usize)>,
) {
    if st.len() != batch.len() {
        t.fail(format!("get batch {i}: {} statuses for {} items", st.len(), batch.len()));
    }
    for (j, (&(k, r), s)) in batch.iter().zip(st).enumerate() {
        if t.item(&|| format!("get batch {i} item {j} (key {k})"), s, want(k)) == Verdict::Good {
            good.push((k, r));
        }
    }
}

/// Judges put batch `i`'s statuses against `want(key)`.
pub fn judge_puts(t: &mut Tally, i: usize, batch: &PutBatch, st: &[ItemStatus], want: &dyn Fn(u64) -> Want) {
    if st.len() != batch.len() {
        t.fail(format!("put batch {i}: {} statuses for {} items", st.len(), batch.len()));
    }
    for (j, (&k, s)) in batch.iter().zip(st).enumerate() {
        t.item(&|| format!("put batch {i} item {j} (key {k})"), s, want(k));
    }
}

/// Compares every byte of each good get's destination room with its key's
/// source room (the pattern over the object's length, zero after it).
pub fn compare(
    ctx: &Ctx<'_>,
    lane: &mut Lane,
    t: &mut Tally,
    good: &[(u64, usize)],
) -> Result<(), CellError> {
    ctx.call(lane.index, &|| "copying the destinations back".to_owned(), || lane.dst.download())?;
    for &(k, r) in good {
        let n = wrong_bytes(lane.dst.room_bytes(r), lane.src.room_bytes(k as usize));
        t.bytes(&|| format!("key {k} in room {r}"), n);
    }
    Ok(())
}

/// One round of gets: destinations zeroed, every batch issued, each waited
/// in order, judged and its good items' bytes compared.
pub fn get_round(
    ctx: &Ctx<'_>,
    lane: &mut Lane,
    t: &mut Tally,
    batches: &[GetBatch],
    lim: WaitLimit,
    want: &dyn Fn(u64) -> Want,
) -> Result<(), CellError> {
    ctx.call(lane.index, &|| "zeroing the destinations".to_owned(), || lane.dst.zero())?;
    let mem = *lane.dst.mem();
    let pending = issue_gets(ctx, lane, &mem, batches)?;
    let mut good = Vec::new();
    for (i, (p, b)) in pending.into_iter().zip(batches).enumerate() {
        let st = wait_get(ctx, lane, t, i, p, lim)?;
        judge_gets(t, i, b, &st, want, &mut good);
    }
    compare(ctx, lane, t, &good)
}

/// One round of puts: every batch issued, each waited in order and judged
/// against `want`; returns every item's (key, status).
pub fn put_round(
    ctx: &Ctx<'_>,
    lane: &mut Lane,
    t: &mut Tally,
    batches: &[PutBatch],
    lim: WaitLimit,
) -> Result<Vec<(u64, ItemStatus)>, CellError> {
    let mem = *lane.src.mem();
    let pending = issue_puts(ctx, lane, &mem, batches)?;
    let mut all = Vec::new();
    for (i, (p, b)) in pending.into_iter().zip(batches).enumerate() {
        let st = wait_put(ctx, lane, t, i, p, lim)?;
        if st.len() != b.len() {
            t.fail(format!("put batch {i}: {} statuses for {} items", st.len(), b.len()));
        }
        all.extend(b.iter().copied().zip(st));
    }
    Ok(all)
}
