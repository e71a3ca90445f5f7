//! What runs the controller's poll iterations: its own thread, in real
//! time (production), or the waits on a virtual clock ([`Clocked`], tests
//! and fuzzing).
//!
//! The thread polls without pause while it finds work and backs off when
//! idle: it spins for `EmulatorConfig::idle_spin` (30 us by default), then
//! sleeps 50 us at a time, 200 us after 5 ms and 1 ms after 50 ms without
//! work (no `sched_yield` phase; see [`run`]). A kick
//! (`NvmeDevice::expect_doorbells`: a GPU kernel is about to ring) wakes it
//! and keeps it polling for [`KICK_SPIN`], then counts as work done.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvm_queue::{Ticker, TickerId, VirtualClock};

use crate::controller::Controller;
use crate::shared::Shared;

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
            stay_gone(&shared, &mut ctrl);
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

/// The device is gone: no more work (copies in flight end first, so that
/// the media can be released); keep the register page all ones, or all
/// zeros (host writes land in the page, undo them).
fn stay_gone(shared: &Shared, ctrl: &mut Controller) {
    ctrl.settle_transfers();
    shared.regs.fill(shared.gone_fill.load(Ordering::Acquire));
    shared.gone_ack.store(true, Ordering::Release);
}

/// Most poll iterations in one step on a virtual clock while they keep
/// finding work (time does not move within a step).
const STEP_POLLS: u32 = 64;

/// A controller with no thread, polled on a virtual clock: a ticker on the
/// clock runs one step (poll iterations while they find work, at the
/// clock's instant) every time something sleeps on it.
pub(crate) struct Clocked {
    clock: Arc<VirtualClock>,
    ticker: TickerId,
    ctrl: Arc<Mutex<Controller>>,
}

impl Clocked {
    /// Registers `ctrl`'s step on `clock`.
    pub(crate) fn start(shared: Arc<Shared>, ctrl: Controller, clock: Arc<VirtualClock>) -> Self {
        let ctrl = Arc::new(Mutex::new(ctrl));
        let c = ctrl.clone();
        let ticker: Ticker = Arc::new(move |now| step(&shared, &c, now));
        let ticker = clock.add_ticker(ticker);
        Self { clock, ticker, ctrl }
    }

    pub(crate) fn clock(&self) -> &VirtualClock {
        &self.clock
    }

    /// Runs one step now (the handle's fault injection: a device that goes
    /// away stops at once, as the thread acknowledges it).
    pub(crate) fn step_now(&self, shared: &Shared) {
        step(shared, &self.ctrl, nvm_queue::Clock::now(&*self.clock));
    }

    /// `false` once a step panicked.
    pub(crate) fn is_running(&self) -> bool {
        !self.ctrl.is_poisoned()
    }

    /// Leaves the clock; copies in flight end, as when the thread stops.
    pub(crate) fn stop(self) {
        self.clock.remove_ticker(self.ticker);
        if let Ok(mut c) = self.ctrl.lock() {
            c.settle_transfers();
        }
    }
}

/// One step at virtual instant `now`: nothing once stopped or after a
/// panic (the mutex is poisoned: the controller is dead, as a thread that
/// panicked), the gone device's chores, or poll iterations while they find
/// work. Returns `now` when the step changed what the host sees (CSTS, a
/// completion posted) or did work, so that a polling waiter looks before
/// time moves on; otherwise when the controller next has something of its
/// own to do (the end of a ready delay, a scheduled completion), if ever.
fn step(shared: &Shared, ctrl: &Mutex<Controller>, now: Instant) -> Option<Instant> {
    let Ok(mut ctrl) = ctrl.lock() else { return None };
    if shared.stop.load(Ordering::Acquire) {
        return None;
    }
    if shared.gone.load(Ordering::Acquire) {
        stay_gone(shared, &mut ctrl);
        return None;
    }
    let before = (ctrl.csts, shared.stats.commands.load(Ordering::Relaxed));
    let mut next = Some(now);
    for _ in 0..STEP_POLLS {
        let (work, next_due) = ctrl.poll(shared, now);
        if !work {
            next = next_due;
            break;
        }
    }
    let after = (ctrl.csts, shared.stats.commands.load(Ordering::Relaxed));
    if after != before {
        return Some(now);
    }
    next
}
