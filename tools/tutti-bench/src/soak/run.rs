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
        let what = || format!("allocating and registering lane {index}'s memory");
        let (src, dst) = ctx.call(index, &what, || {
            Ok::<_, CellError>((
                Values::new(&kv, gpu, plan.keys() as usize, room)?,
                Values::new(&kv, gpu, plan.get_rooms, room)?,
            ))
        })?;
        let mut lane = Self { kv, src, dst, index, exec, plan, version: ctx.s.version };
        for k in 0..plan.keys() {
            lane.src.fill(k as usize, ctx.cell.len_of(k) as usize, pattern_hash(index, k), lane.version);
        }
        ctx.call(index, &|| "copying the sources to GPU memory".to_owned(), || lane.src.upload())?;
        Ok(lane)
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

impl Ctx<'_> {
    /// Runs `f`, a blocking call that is not a wait (a submission, a copy,
    /// a registration), under the watchdog with the wait deadline as its
    /// limit.
    pub fn call<T>(&self, lane: usize, what: &dyn Fn() -> String, f: impl FnOnce() -> T) -> T {
        self.watch.within(lane, what, self.s.deadline, f).0
    }
}

/// The pattern's block hash of key `k` of lane `lane`.
pub fn pattern_hash(lane: usize, k: u64) -> u64 {
    k | (lane as u64) << 48
}

/// Runs `cell` to its tally (on the worker thread). An error that stops
/// the cell is one of the tally's problems; what was counted before it
/// stays.
pub fn run_cell(cell: &Cell, s: &Settings, watch: &Watch) -> Tally {
    let mut t = Tally::default();
    if let Err(e) = run_in(cell, s, watch, &mut t) {
        t.fail(format!("stopped: {}", tutti::error_chain(&e)));
    }
    t
}

/// [`run_cell`]'s body.
fn run_in(cell: &Cell, s: &Settings, watch: &Watch, t: &mut Tally) -> Result<(), CellError> {
    let execs: Vec<Exec> = if cell.pair { vec![s.exec, Exec::Cpu] } else { vec![s.exec] };
    let plan = Plan::of(cell);
    let config = Config::from_yaml_str(&config::yaml(cell, &execs, plan.keys()))?;
    let what = || "starting the runtime".to_owned();
    let rt = Arc::new(watch.within(0, &what, s.cell_limit / 4, || Runtime::from_config(config)).0?);
    rt.set_gpu_command_budget(s.gpu_budget);
    let ctx = Ctx { cell, s, watch, rt: &rt };
    let mut lanes = Vec::with_capacity(execs.len());
    for (i, e) in execs.iter().enumerate() {
        lanes.push(Lane::open(&ctx, i, *e, plan)?);
    }
    match (cell.fault, lanes.as_mut_slice()) {
        (Some(f), [lane, ..]) => {
            if let Err(e) = faults::run(f, &ctx, lane, t) {
                t.fail(format!("stopped: {}", tutti::error_chain(&e)));
            }
        }
        _ => {
            let tallies: Vec<Tally> = std::thread::scope(|sc| {
                let ctx = &ctx;
                let running: Vec<_> =
                    lanes.iter_mut().map(|lane| sc.spawn(move || lane_tally(ctx, lane))).collect();
                running.into_iter().map(join_lane).collect()
            });
            for lt in tallies {
                t.merge(lt);
            }
        }
    }
    for lane in &mut lanes {
        if let Err(e) = lane.release() {
            t.fail(format!("lane {}: unregistering its memory: {}", lane.index, tutti::error_chain(&e)));
        }
    }
    drop(lanes);
    check_drives(&rt, t);
    let what = || "shutting the runtime down".to_owned();
    let limit = s.gpu_budget + s.hang;
    let report = watch.within(0, &what, limit, || rt.shutdown(s.hang.max(Duration::from_secs(1)))).0;
    if report.ops_in_flight > 0 || report.commands_in_flight > 0 || report.commands_lost > 0 {
        t.fail(crate::interrupt::shutdown_summary(&report));
    }
    Ok(())
}

/// A lane's workload and its tally, an error that stopped it included.
fn lane_tally(ctx: &Ctx<'_>, lane: &mut Lane) -> Tally {
    let mut t = Tally::default();
    if let Err(e) = workload::run(ctx, lane, &mut t) {
        t.fail(format!("lane {} stopped: {}", lane.index, tutti::error_chain(&e)));
    }
    t
}

/// A lane thread's tally; a panic is a problem in it.
fn join_lane(h: std::thread::ScopedJoinHandle<'_, Tally>) -> Tally {
    h.join().unwrap_or_else(|p| {
        let mut t = Tally::default();
        t.fail(format!("lane panicked: {}", panic_text(&p)));
        t
    })
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
