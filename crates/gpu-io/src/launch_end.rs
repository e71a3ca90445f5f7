//! Waiting for a launch's end with a deadline: [`LaunchEnd`].
//!
//! CUDA has no timed wait on an event: `cuEventSynchronize` sleeps until
//! the work before the event has ended, however long, and an I/O kernel
//! runs until every command has completed or used its whole budget (10 s
//! in the runtime). A caller's wait must return by its own deadline, so
//! [`LaunchEnd::wait_until`] polls the event for a short spin (most
//! launches end within it), then lets a helper thread sleep in
//! `cuEventSynchronize` and waits for its signal with the deadline as a
//! timeout. The helper lives until the kernel ends, never longer: a
//! deadline that passes first leaves it to finish on its own, holding only
//! the event.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::cuda::KernelEvent;

/// How long [`GpuLaunch::wait`](crate::GpuLaunch::wait) polls before it sleeps on the event, for a
/// launch of at most [`SHORT_LAUNCH_BYTES`] ([`wait_spin`]). Long enough
/// for a load of a few blocks (reads of up to a few MiB): a wake from
/// `cuEventSynchronize` cost about 30 us on the H200 machine (an 896 KiB
/// GPU read 131 -> 102 us p50 with a 2 ms spin; docs/benchmarks.md,
/// "Launch waits").
const WAIT_SPIN: Duration = Duration::from_micros(300);

/// How long the wait polls for a larger launch, which runs for
/// milliseconds: a short poll, then the sleep (its wake costs little
/// against the launch, and the host CPU stays free).
const WAIT_SPIN_LONG: Duration = Duration::from_micros(20);

/// Launches that move at most this many bytes poll for [`WAIT_SPIN`].
const SHORT_LAUNCH_BYTES: u64 = 8 << 20;

/// How long to poll before sleeping, for a launch that moves `bytes`:
/// `TUTTI_GPU_WAIT_SPIN_US` (microseconds, any launch) when set to a
/// number, a tuning knob for latency against host CPU; otherwise
/// [`WAIT_SPIN`] up to [`SHORT_LAUNCH_BYTES`] and [`WAIT_SPIN_LONG`] above.
pub(crate) fn wait_spin(bytes: u64) -> Duration {
    static SPIN: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    let set = *SPIN.get_or_init(|| {
        std::env::var("TUTTI_GPU_WAIT_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_micros)
    });
    set.unwrap_or(if bytes <= SHORT_LAUNCH_BYTES { WAIT_SPIN } else { WAIT_SPIN_LONG })
}

/// The end of one launch ([`crate::GpuLaunch::end`]): a handle that can be
/// waited on with a deadline while the launch itself stays where it is
/// (for example in the runtime's table of operations). Cloning is cheap.
#[derive(Debug, Clone)]
pub struct LaunchEnd {
    pub(crate) event: Arc<KernelEvent>,
    /// Bytes the launch moves (sets the first spin, as for
    /// [`crate::GpuLaunch::wait`]).
    pub(crate) bytes: u64,
}

/// How long each poll sleeps when no helper thread can be started.
const NAP: Duration = Duration::from_micros(50);

impl LaunchEnd {
    /// `true` once the kernel has ended; never blocks.
    pub fn is_done(&self) -> bool {
        self.event.is_done()
    }

    /// Waits until the kernel has ended or `deadline` has passed (`None`:
    /// no deadline) and says whether it has ended. Returns within a few
    /// tens of microseconds after the deadline (a condition variable's
    /// wake-up); docs/gpu.md, "Waits and deadlines", has the measured
    /// bound. A CUDA error on the event counts as ended: the launch's own
    /// wait then reports it.
    pub fn wait_until(&self, deadline: Option<Instant>) -> bool {
        let spin_until = Instant::now() + wait_spin(self.bytes);
        let spin_until = deadline.map_or(spin_until, |d| d.min(spin_until));
        while Instant::now() < spin_until {
            if self.is_done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if self.is_done() {
            return true;
        }
        let Some(deadline) = deadline else {
            let _ = self.event.synchronize();
            return true;
        };
        if Instant::now() >= deadline {
            return false;
        }
        self.sleep_until(deadline)
    }

    /// Sleeps until the kernel ends (a helper thread in
    /// `cuEventSynchronize`) or `deadline` passes.
    fn sleep_until(&self, deadline: Instant) -> bool {
        let signal = Arc::new((Mutex::new(false), Condvar::new()));
        let (event, theirs) = (self.event.clone(), signal.clone());
        let helper = std::thread::Builder::new().name("tutti-gpu-wait".into()).spawn(move || {
            let _ = event.synchronize();
            let (ended, cv) = &*theirs;
            *ended.lock().unwrap_or_else(|p| p.into_inner()) = true;
            cv.notify_all();
        });
        if helper.is_err() {
            // No thread to be had: poll with naps.
            while Instant::now() < deadline {
                if self.is_done() {
                    return true;
                }
                std::thread::sleep(NAP.min(deadline.saturating_duration_since(Instant::now())));
            }
            return self.is_done();
        }
        let (ended, cv) = &*signal;
        let mut done = ended.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            done = cv.wait_timeout(done, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        *done || self.is_done()
    }
}
