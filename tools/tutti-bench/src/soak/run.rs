//! Running one cell on the worker thread: its runtime, one lane per store
//! (a pair of lanes driven at once on two threads), the workload or the
//! fault's flow, then the drives' own protocol counters and an orderly
//! shutdown with nothing left in flight.

use std::sync::Arc;
use std::time::Duration;

use tutti::{Config, Runtime};
use tutti_kv::{Key, KvStore, OpenOptions};

use super::cells::{Cell, Fault, Mix};
use super::config::{self, store_name};
use super::error::CellError;
use super::memory::Values;
use super::verify::Tally;
use super::watch::Watch;
use super::{faults, workload, Exec, Settings};

/// What one lane's code needs besides the lane itself.
pub struct Ctx<'a> {
    /// The cell.
    pub cell: &'a Cell,
    /// The run's limits.
    pub s: &'a Settings,
    /// Where waits are marked for the watchdog.
    pub watch: &'a Watch,
    /// The runtime.
    pub rt: &'a Arc<Runtime>,
}

/// How many keys a lane puts, and how many objects one round reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Keys put before the timed part (numbered `0..old`).
    pub old: u64,
    /// Keys put during it (numbered `old..old + new`).
    pub new: u64,
    /// Destination rooms: the gets of one round.
    pub get_rooms: usize,
}

impl Plan {
    /// The plan of `cell`.
    pub fn of(cell: &Cell) -> Self {
        let round = (cell.batch * cell.inflight) as u64;
        let (old, new) = match (cell.fault, cell.mix) {
            (Some(Fault::WriteError), _) => (0, round),
            (Some(_), _) | (None, Mix::Get) => (round, 0),
            (None, Mix::Put) => (0, round * cell.rounds as u64),
            (None, Mix::Mixed) => (round, (cell.batch * cell.rounds) as u64),
        };
        Self { old, new, get_rooms: round as usize }
    }

    /// Every key of the lane.
    pub fn keys(&self) -> u64 {
        self.old + self.new
    }
}

/// One store of the cell and its memory: a source room per key (filled
/// once with the key's pattern) and a destination room per get of a round.
/// Fields drop in order: the store first, then the memory (which
/// unregisters itself if still registered).
pub struct Lane {
    /// The store.
    pub kv: KvStore,
    /// Source rooms, one per key.
    pub src: Values,
    /// Destination rooms, one per get of a round.
    pub dst: Values,
    /// Lane number (0, or 1 for the second store of a pair).
    pub index: usize,
    /// Who executes its commands.
    pub exec: Exec,
    /// Its keys.
    pub plan: Plan,
    /// Pattern version of its objects.
    pub version: u64,
}

impl Lane {
    /// Opens lane `index`'s store and fills its sources.
    fn open(ctx: &Ctx<'_>, index: usize, exec: Exec, plan: Plan) -> Result<Self, CellError> {
        let kv = KvStore::open(ctx.rt.clone(), &OpenOptions::new(&store_name(index)))?;
        let gpu = match exec {
            Exec::Gpu => ctx.rt.gpu(),
            Exec::Cpu => None,
        };
        let room = ctx.cell.object as usize;
        let mut src = Values::new(&kv, gpu, plan.keys() as usize, room)?;
        let dst = Values::new(&kv, gpu, plan.get_rooms, room)?;
        let version = ctx.s.version;
        for k in 0..plan.keys() {
            src.fill(k as usize, ctx.cell.len_of(k) as usize, pattern_hash(index, k), version);
        }
        src.upload()?;
        Ok(Self { kv, src, dst, index, exec, plan, version })
    }

    /// Key number `k` of this lane: 32 bytes naming the key, the lane and
    /// the version.
    pub fn key(&self, k: u64) -> Result<Key, CellError> {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&k.to_le_bytes());
        b[8..16].copy_from_slice(&(self.index as u64).to_le_bytes());
        b[16..24].copy_from_slice(&self.version.to_le_bytes());
        b[31] = 0x5A;
        Ok(Key::new(&b)?)
    }

    /// Unregisters both regions.
    fn release(&mut self) -> Result<(), CellError> {
        self.src.release(&self.kv)?;
        self.dst.release(&self.kv)
    }
}

/// The pattern's block hash of key `k` of lane `lane`.
pub fn pattern_hash(lane: usize, k: u64) -> u64 {
    k | (lane as u64) << 48
}

/// Runs `cell` to its tally (on the worker thread).
pub fn run_cell(cell: &Cell, s: &Settings, watch: &Watch) -> Result<Tally, CellError> {
    let execs: Vec<Exec> = if cell.pair { vec![s.exec, Exec::Cpu] } else { vec![s.exec] };
    let plan = Plan::of(cell);
    let rt =
        Arc::new(Runtime::from_config(Config::from_yaml_str(&config::yaml(cell, &execs, plan.keys()))?)?);
    let ctx = Ctx { cell, s, watch, rt: &rt };
    let mut lanes = Vec::with_capacity(execs.len());
    for (i, e) in execs.iter().enumerate() {
        lanes.push(Lane::open(&ctx, i, *e, plan)?);
    }
    let mut tally = Tally::default();
    match (cell.fault, lanes.as_mut_slice()) {
        (Some(f), [lane, ..]) => tally.merge(faults::run(f, &ctx, lane)?),
        _ => {
            let results: Vec<Result<Tally, CellError>> = std::thread::scope(|sc| {
                let ctx = &ctx;
                let running: Vec<_> =
                    lanes.iter_mut().map(|lane| sc.spawn(move || workload::run(ctx, lane))).collect();
                running.into_iter().map(join_lane).collect()
            });
            for r in results {
                tally.merge(r?);
            }
        }
    }
    for lane in &mut lanes {
        lane.release()?;
    }
    drop(lanes);
    check_drives(&rt, &mut tally);
    let report = rt.shutdown(s.hang.max(Duration::from_secs(1)));
    if report.ops_in_flight > 0 || report.commands_in_flight > 0 || report.commands_lost > 0 {
        tally.fail(crate::interrupt::shutdown_summary(&report));
    }
    Ok(tally)
}

/// A lane thread's result; a panic becomes [`CellError::Panicked`].
fn join_lane(h: std::thread::ScopedJoinHandle<'_, Result<Tally, CellError>>) -> Result<Tally, CellError> {
    h.join().unwrap_or_else(|p| Err(CellError::Panicked(panic_text(&p))))
}

/// The text of a panic payload.
pub fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Fails the tally for every protocol violation a drive counted: doorbell
/// writes outside the queue's window, DMA outside the mapped memory, SQ
/// slots overwritten while the controller owned them.
fn check_drives(rt: &Runtime, tally: &mut Tally) {
    for d in rt.drive_names() {
        let Some(emu) = rt.emulator(&d) else { continue };
        let st = emu.stats();
        let counts = [
            ("doorbell violations", st.doorbell_violations),
            ("DMA faults", st.dma_faults),
            ("DMA domain faults", st.dma_domain_faults),
            ("SQEs overwritten", st.sqe_overwritten),
        ];
        for (what, n) in counts {
            if n > 0 {
                tally.fail(format!("drive {d}: {n} {what}"));
            }
        }
    }
}
