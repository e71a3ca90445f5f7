//! Time for the driver's bounded waits (CSTS transitions, admin commands)
//! and for devices that model time: the real monotonic clock, or a virtual
//! one that tests and fuzzing drive.
//!
//! A device names the clock its waits run on ([`crate::NvmeDevice::clock`];
//! [`RealClock`] unless it says otherwise). With a [`VirtualClock`] nothing
//! waits in real time: each [`Clock::sleep`] lets every device registered
//! on the clock act ([`VirtualClock::add_ticker`]) at the instant the wait
//! starts, moves virtual time on by the wait, and lets them act again at
//! the new instant. A device on a virtual clock is therefore played by the
//! threads that wait on it, one step per wait, with no thread of its own.
//! A polling wait ([`Clock::poll_sleep`]) moves on at once to the next
//! instant at which a device has something of its own to do, or to the
//! wait's deadline: a bring-up that waits 10 s for CSTS.RDY takes 10 s of
//! virtual time, a handful of polls and microseconds of real time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A source of monotonic time that can be waited on.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> Instant;
    /// Waits `d` (at least; a real sleep may overshoot).
    fn sleep(&self, d: Duration);
    /// The sleep between two looks of a polling loop at what a device
    /// changes (a register, a completion queue), in a wait that gives up
    /// at `deadline`: [`Clock::sleep`] of `d` on the real clock. A virtual
    /// clock moves on to the later of `now + d` and the earlier of
    /// `deadline` and the next instant a device on it has something of its
    /// own to do (what its ticker returned): nothing the waiter looks at
    /// can change before then, as long as the waiting thread is the only
    /// one acting on those devices.
    fn poll_sleep(&self, d: Duration, deadline: Instant);
    /// One turn of a busy-wait loop that re-reads memory a device writes:
    /// a CPU hint on the real clock; on a virtual clock a sleep of
    /// [`SPIN_TIME`], so that such a loop bounded by [`Clock::now`] ends.
    fn spin(&self);
}

/// The virtual time one [`Clock::spin`] takes on a [`VirtualClock`].
pub const SPIN_TIME: Duration = Duration::from_micros(1);

/// The real monotonic clock: [`Instant::now`] and [`std::thread::sleep`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RealClock;

impl Clock for RealClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }

    fn poll_sleep(&self, d: Duration, _deadline: Instant) {
        std::thread::sleep(d);
    }

    fn spin(&self) {
        std::hint::spin_loop();
    }
}

/// What a device does when virtual time passes: it is given the current
/// virtual instant and acts on it (polls its registers and queues, posts
/// what is due), and returns the next instant at which it has something of
/// its own to do (a modelled delay ending, a scheduled completion); `None`
/// when it only reacts to the host.
pub type Ticker = Arc<dyn Fn(Instant) -> Option<Instant> + Send + Sync>;

/// Names a ticker for [`VirtualClock::remove_ticker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickerId(u64);

/// Virtual time: it starts at the instant the clock was made and moves
/// only when something sleeps on it, by exactly the time slept, at once.
/// Every sleep runs the registered tickers before and after moving time
/// on (see the module documentation). Virtual time is one for all
/// threads: two threads sleeping at once both move it.
pub struct VirtualClock {
    epoch: Instant,
    elapsed_ns: AtomicU64,
    next_id: AtomicU64,
    tickers: Mutex<Vec<(TickerId, Ticker)>>,
}

impl fmt::Debug for VirtualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtualClock").field("elapsed", &self.elapsed()).finish_non_exhaustive()
    }
}

impl VirtualClock {
    /// A virtual clock at its epoch (elapsed zero), with no ticker.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            elapsed_ns: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            tickers: Mutex::new(Vec::new()),
        })
    }

    /// Virtual time slept on this clock since it was made.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_ns.load(Ordering::Acquire))
    }

    /// Registers `ticker`, run on every sleep from now on until removed.
    pub fn add_ticker(&self, ticker: Ticker) -> TickerId {
        let id = TickerId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.lock().push((id, ticker));
        id
    }

    /// Removes a ticker; once this returns it does not run again.
    pub fn remove_ticker(&self, id: TickerId) {
        self.lock().retain(|(i, _)| *i != id);
    }

    /// Runs every ticker once at the current virtual instant and returns
    /// the earliest next instant they asked for. The list is locked
    /// meanwhile, so a ticker being removed finishes its run first; a
    /// ticker must not sleep on this clock.
    pub fn tick(&self) -> Option<Instant> {
        let now = self.now();
        self.lock().iter().filter_map(|(_, t)| t(now)).min()
    }

    /// Moves virtual time on to `to` (never back).
    fn advance_to(&self, to: Instant) {
        let ns = u64::try_from(to.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_ns.fetch_max(ns, Ordering::AcqRel);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(TickerId, Ticker)>> {
        // A ticker that panicked (a bug it reports to its caller) leaves
        // the list itself intact.
        self.tickers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.epoch + self.elapsed()
    }

    fn sleep(&self, d: Duration) {
        self.tick();
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_ns.fetch_add(ns, Ordering::AcqRel);
        self.tick();
    }

    fn poll_sleep(&self, d: Duration, deadline: Instant) {
        let next = self.tick().map_or(deadline, |n| n.min(deadline));
        self.advance_to(next.max(self.now() + d));
        self.tick();
    }

    fn spin(&self) {
        self.sleep(SPIN_TIME);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn virtual_time_moves_only_by_what_is_slept() {
        let clock = VirtualClock::new();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        clock.sleep(Duration::from_secs(10));
        assert_eq!(clock.elapsed(), Duration::from_secs(10));
        assert_eq!(clock.now() - t0, Duration::from_secs(10));
    }

    #[test]
    fn tickers_run_before_and_after_each_sleep_until_removed() {
        let clock = VirtualClock::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let epoch = clock.now();
        let id = clock.add_ticker(Arc::new(move |now| {
            s.lock().unwrap().push(now - epoch);
            None
        }));
        clock.sleep(Duration::from_millis(3));
        assert_eq!(*seen.lock().unwrap(), [Duration::ZERO, Duration::from_millis(3)]);
        clock.remove_ticker(id);
        clock.sleep(Duration::from_millis(3));
        assert_eq!(seen.lock().unwrap().len(), 2);
        let n = Arc::new(AtomicU32::new(0));
        let m = n.clone();
        clock.add_ticker(Arc::new(move |_| {
            m.fetch_add(1, Ordering::Relaxed);
            None
        }));
        assert_eq!(clock.tick(), None);
        assert_eq!(n.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_polling_sleep_moves_on_to_the_next_event_or_the_deadline() {
        let clock = VirtualClock::new();
        let t0 = clock.now();
        let event = t0 + Duration::from_secs(3);
        let id = clock.add_ticker(Arc::new(move |now| (now < event).then_some(event)));
        // The device's next event comes first.
        clock.poll_sleep(Duration::from_micros(50), t0 + Duration::from_secs(5));
        assert_eq!(clock.elapsed(), Duration::from_secs(3));
        // Nothing more due: on to the deadline.
        clock.poll_sleep(Duration::from_micros(50), t0 + Duration::from_secs(5));
        assert_eq!(clock.elapsed(), Duration::from_secs(5));
        // Never less than the sleep asked for, also past the deadline.
        clock.poll_sleep(Duration::from_micros(50), t0);
        assert_eq!(clock.elapsed(), Duration::from_secs(5) + Duration::from_micros(50));
        clock.remove_ticker(id);
    }
}
