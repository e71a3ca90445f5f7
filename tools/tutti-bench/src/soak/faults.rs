//! The fault cells' flows on one store. Each injects an emulator fault
//! rule (the same [`FaultRule`] a drive's YAML `faults:` list makes) aimed
//! at one object or one command, checks that exactly the items it hits
//! fail as they must and every other item succeeds with every byte right,
//! then removes it and checks that the same store serves the same keys
//! normally.

use std::ops::Range;
use std::time::{Duration, Instant};

use nvme_emu::{FaultAction, FaultMatch, FaultRule};
use nvme_regs::status::media;
use nvme_regs::Status;

use super::batches::{get_batches, get_round, put_round, WaitLimit};
use super::cells::Fault;
use super::config::{store_name, BLOCK};
use super::error::CellError;
use super::run::{Ctx, Lane};
use super::verify::{judge, Tally, Verdict, Want};
use super::workload::{hit, normal, prefill};
use super::Exec;

/// NVM opcode Write (NVMe NVM Command Set 1.0, 3.3).
const WRITE: u8 = 0x01;
/// NVM opcode Read.
const READ: u8 = 0x02;

/// Runs fault `f`'s flow on `lane`, counting into `t`.
pub fn run(f: Fault, ctx: &Ctx<'_>, lane: &mut Lane, t: &mut Tally) -> Result<(), CellError> {
    match f {
        Fault::ReadError => read_error(ctx, lane, t),
        Fault::WriteError => write_error(ctx, lane, t),
        Fault::ReadDelay => read_delay(ctx, lane, t),
    }
}

/// A rule for I/O commands of `opcode` on namespace 1 overlapping `lba`.
fn rule(opcode: u8, lba: Range<u64>, action: FaultAction, times: Option<u64>, skip: u64) -> FaultRule {
    let matches =
        FaultMatch { opcode: Some(opcode), nsid: Some(1), lba: Some(lba), io_only: true, qid: None };
    FaultRule { matches, action, times, skip }
}

/// The emulator of drive `drive`.
fn emulator<'a>(ctx: &'a Ctx<'_>, drive: &str) -> Result<&'a std::sync::Arc<nvme_emu::Emulator>, CellError> {
    ctx.rt
        .emulator(drive)
        .ok_or_else(|| CellError::Media { drive: drive.to_owned(), reason: "not an emulated drive".into() })
}

/// Drive index and drive byte offset of store byte `x` (the striping of
/// docs/config.md: round robin in stripe units).
fn place(ctx: &Ctx<'_>, x: u64) -> (usize, u64) {
    let c = ctx.cell;
    if c.drives == 1 {
        return (0, x);
    }
    let (u, n) = (c.stripe_unit, c.drives as u64);
    (((x / u) % n) as usize, (x / (u * n)) * u + x % u)
}

/// The drive and LBA of the first logical block of key `k`'s object,
/// checked against the media: on a fresh store whose keys were put in
/// order from one thread, key `k` is in slot `k`; where the block there
/// does not hold the key's first bytes, every slot is searched.
fn locate(ctx: &Ctx<'_>, lane: &Lane, k: u64) -> Result<(String, u64), CellError> {
    let layout = lane.kv.layout();
    let name = store_name(lane.index);
    let drives = ctx.rt.store_info(&name).map(|i| i.drives).unwrap_or_default();
    let want = &lane.src.room_bytes(k as usize)[..BLOCK as usize];
    let mut block = vec![0u8; BLOCK as usize];
    let slots = std::iter::once(k).chain((0..layout.capacity).filter(|&s| s != k));
    for slot in slots {
        let (d, off) = place(ctx, layout.object_offset(slot));
        let drive = drives.get(d).cloned().unwrap_or_default();
        emulator(ctx, &drive)?
            .read_media(1, off, &mut block)
            .map_err(|e| CellError::Media { drive: drive.clone(), reason: e.to_string() })?;
        if block == want {
            return Ok((drive, off / BLOCK));
        }
    }
    Err(CellError::NotFound { key: k, slot: k })
}

/// The key a fault is aimed at: the middle one of the round.
fn target(lane: &Lane) -> u64 {
    lane.plan.old / 2
}

/// Reads of one object's first block fail with Unrecovered Read Error:
/// exactly its get is a device error carrying that status; with the rule
/// removed, every object reads back whole.
fn read_error(ctx: &Ctx<'_>, lane: &mut Lane, t: &mut Tally) -> Result<(), CellError> {
    prefill(ctx, lane, t)?;
    let k = target(lane);
    let (drive, lba) = locate(ctx, lane, k)?;
    let emu = emulator(ctx, &drive)?;
    let status = Status::media(media::UNRECOVERED_READ_ERROR);
    let injected = emu.stats().faults_injected;
    emu.add_fault(rule(READ, lba..lba + 1, FaultAction::Fail(status.with_dnr(true)), None, 0));
    let keys: Vec<u64> = (0..lane.plan.old).collect();
    let batches = get_batches(&keys, ctx.cell.batch);
    let want = |x| if x == k { Want::DeviceError(status) } else { Want::Hit(ctx.cell.len_of(x)) };
    get_round(ctx, lane, t, &batches, normal(ctx), &want)?;
    emu.clear_faults();
    if emu.stats().faults_injected == injected {
        t.fail(format!("the read error rule on drive {drive} LBA {lba} never fired"));
    }
    get_round(ctx, lane, t, &batches, normal(ctx), &hit(ctx))
}

/// One payload write command on the store's first drive fails with Write
/// Fault: exactly one put is a device error carrying it, its key is absent
/// (a get misses), every other put is durable and reads back whole; the
/// failed key put again reads back whole.
fn write_error(ctx: &Ctx<'_>, lane: &mut Lane, t: &mut Tally) -> Result<(), CellError> {
    let (c, p) = (ctx.cell, lane.plan);
    let drive = ctx
        .rt
        .store_info(&store_name(lane.index))
        .and_then(|i| i.drives.first().cloned())
        .unwrap_or_default();
    let emu = emulator(ctx, &drive)?;
    // The first data byte on that drive: records lie below it.
    let layout = lane.kv.layout();
    let first = (layout.data_offset..layout.data_offset + c.stripe_unit.max(BLOCK) * c.drives as u64)
        .step_by(BLOCK as usize)
        .map(|x| place(ctx, x))
        .find(|(d, _)| *d == 0)
        .map_or(0, |(_, off)| off / BLOCK);
    let status = Status::media(media::WRITE_FAULT);
    let skip = p.new / (2 * c.drives as u64);
    emu.add_fault(rule(WRITE, first..u64::MAX, FaultAction::Fail(status.with_dnr(true)), Some(1), skip));
    let keys: Vec<u64> = (p.old..p.old + p.new).collect();
    let batches: Vec<Vec<u64>> = keys.chunks(c.batch).map(<[_]>::to_vec).collect();
    let mut failed = Vec::new();
    for (k, st) in put_round(ctx, lane, t, &batches, normal(ctx))? {
        let want = if judge(&st, Want::DeviceError(status)) == Verdict::Injected {
            failed.push(k);
            Want::DeviceError(status)
        } else {
            Want::Ok
        };
        t.item(&|| format!("put of key {k}"), &st, want);
    }
    emu.clear_faults();
    let [k] = failed[..] else {
        t.fail(format!("{} puts failed by the injected write fault, expected exactly 1", failed.len()));
        return Ok(());
    };
    let key = lane.key(k)?;
    if lane.kv.contains(&[key]) != [false] {
        t.fail(format!("key {k}, whose put failed, is present"));
    }
    let all = get_batches(&keys, c.batch);
    get_round(ctx, lane, t, &all, normal(ctx), &|x| {
        if x == k {
            Want::Miss
        } else {
            Want::Hit(c.len_of(x))
        }
    })?;
    for (x, st) in put_round(ctx, lane, t, &[vec![k]], normal(ctx))? {
        t.item(&|| format!("second put of key {x}"), &st, Want::Ok);
    }
    get_round(ctx, lane, t, &all, normal(ctx), &hit(ctx))
}

/// The read of one object's first block completes `fault_late` past the
/// wait's `fault_deadline`: its wait returns by the deadline, CPU- or
/// GPU-executed, with that get `Timeout` (CPU-executed: that get alone;
/// GPU-executed: every get of its batch, one kernel launch whose statuses
/// come at its end, docs/gpu.md "Waits and deadlines"); once the late
/// command has completed, the same gets all hit.
fn read_delay(ctx: &Ctx<'_>, lane: &mut Lane, t: &mut Tally) -> Result<(), CellError> {
    prefill(ctx, lane, t)?;
    let k = target(lane);
    let (drive, lba) = locate(ctx, lane, k)?;
    let emu = emulator(ctx, &drive)?;
    let (deadline, late) = (ctx.s.fault_deadline, ctx.s.fault_late);
    let injected = emu.stats().faults_injected;
    emu.add_fault(rule(READ, lba..lba + 1, FaultAction::Delay(deadline + late), Some(1), 0));
    let lim = WaitLimit { deadline, late: Duration::ZERO };
    let keys: Vec<u64> = (0..lane.plan.old).collect();
    let batches = get_batches(&keys, ctx.cell.batch);
    // Keys whose get shares a kernel launch with the late one (GPU).
    let with_late: Vec<u64> = match lane.exec == Exec::Gpu {
        true => batches
            .iter()
            .find(|b| b.iter().any(|&(x, _)| x == k))
            .map_or_else(Vec::new, |b| b.iter().map(|&(x, _)| x).collect()),
        false => vec![k],
    };
    let want = |x| {
        if with_late.contains(&x) {
            Want::Late { len: ctx.cell.len_of(x), late_hit_allowed: false }
        } else {
            Want::Hit(ctx.cell.len_of(x))
        }
    };
    let issued = Instant::now();
    get_round(ctx, lane, t, &batches, lim, &want)?;
    if emu.stats().faults_injected != injected + 1 {
        t.fail(format!(
            "the delay rule on drive {drive} LBA {lba} fired {} times, not once",
            emu.stats().faults_injected - injected
        ));
    }
    // Until the late completion has arrived (and been reaped), its memory
    // is busy; after it, the store is as before.
    let done = issued + deadline + late + ctx.s.overrun_bound;
    std::thread::sleep(done.saturating_duration_since(Instant::now()));
    ctx.rt.reap();
    emu.clear_faults();
    get_round(ctx, lane, t, &batches, normal(ctx), &hit(ctx))?;
    let objects = lane.kv.stats().objects;
    if objects != lane.plan.old {
        t.fail(format!("{objects} objects in the store after the late read, expected {}", lane.plan.old));
    }
    Ok(())
}
