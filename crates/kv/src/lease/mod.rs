//! One writer per store, across processes: the lease block on the media
//! (`format/lease.rs`; docs/kv-store.md, "One writer per store").
//!
//! A store opened for writing takes the lease ([`acquire`](acquire::acquire)),
//! renews it from a thread of its own ([`renew`]), and frees it when it is
//! dropped. An opener that finds the lease held refuses
//! ([`crate::KvError::Leased`]) unless the holder is gone: on this host and
//! PID namespace it asks `/proc` (the PID and its start time); elsewhere it
//! watches the lease for `expiry` and takes it over only if no renewal
//! came. The scheme follows the delta leases of disk-based lock managers
//! (write, wait `settle`, read back), with the host check in front.

mod acquire;
mod identity;
mod io;
mod renew;

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tutti::{Runtime, ShutdownHookId};

pub(crate) use acquire::acquire;
pub(crate) use io::LeaseIo;

use crate::format::LeaseRecord;

/// Timing of a store's lease. The defaults suit local NVMe drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOptions {
    /// How often the holder rewrites its lease (`None`: never; then only a
    /// holder on this host and PID namespace can be found gone, and one
    /// elsewhere holds the store until it closes it). Default 1 s.
    pub renew: Option<Duration>,
    /// How long an opener watches a lease whose holder it cannot check
    /// (another PID namespace or host) for a renewal before taking it
    /// over. At least 4 renewal intervals of the holder. Default 8 s.
    pub expiry: Duration,
    /// How long a new holder waits between writing its lease and reading
    /// it back, to see a writer that took it at the same moment; it must
    /// exceed the time from an opener's read of the block to its write
    /// landing. An opener whose own read-to-write took longer waits that
    /// much more. Default 50 ms.
    pub settle: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            renew: Some(Duration::from_secs(1)),
            expiry: Duration::from_secs(8),
            settle: Duration::from_millis(50),
        }
    }
}

/// Owners of the leases this process holds now: a lease of this process
/// whose owner is not here was left by a store that is gone (dropped, or
/// lost in a simulated power failure).
static LIVE: Mutex<Vec<[u8; 16]>> = Mutex::new(Vec::new());

/// How long one lease-block command may take before the store reports it
/// (and retires the block's buffer).
fn io_timeout() -> Duration {
    Duration::from_secs(5)
}

fn live() -> std::sync::MutexGuard<'static, Vec<[u8; 16]>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// State shared by a held lease, its renewal thread and the runtime's
/// shutdown hook.
#[derive(Debug)]
struct Shared {
    owner: [u8; 16],
    /// The renewal found another writer's lease.
    lost: std::sync::atomic::AtomicBool,
    /// Set to stop the renewal thread.
    stop: Mutex<bool>,
    wake: Condvar,
    /// The block's I/O and the record while no thread renews it.
    idle: Mutex<Option<(LeaseIo, LeaseRecord)>>,
    /// Set once the lease is freed (or found another's).
    done: Mutex<bool>,
    done_cv: Condvar,
}

impl Shared {
    fn new(owner: [u8; 16], idle: Option<(LeaseIo, LeaseRecord)>) -> Self {
        Self {
            owner,
            lost: std::sync::atomic::AtomicBool::new(false),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            idle: Mutex::new(idle),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
        }
    }

    fn mark_done(&self) {
        *self.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.done_cv.notify_all();
    }

    /// Stops renewing and frees the lease, waiting (at most 2 s) for the
    /// renewal thread to do it. Idempotent; runs at drop and at the
    /// runtime's shutdown, whichever comes first.
    fn finish(&self) {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_all();
        if let Some((mut io, record)) = self.idle.lock().unwrap_or_else(|p| p.into_inner()).take() {
            renew::release(&mut io, &record);
            self.mark_done();
        }
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.done_cv.wait_timeout_while(done, Duration::from_secs(2), |d| !*d);
        live().retain(|o| *o != self.owner);
    }
}

/// A lease this store holds; freed when dropped, or when its runtime
/// shuts down, whichever comes first.
#[derive(Debug)]
pub(crate) struct Lease {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    hook: Option<(Arc<Runtime>, ShutdownHookId)>,
}

impl Lease {
    /// Starts holding `record` (just acquired through `io` on `rt`),
    /// renewing it every `opts.renew`.
    pub fn hold(
        rt: &Arc<Runtime>,
        io: LeaseIo,
        record: LeaseRecord,
        opts: &LeaseOptions,
        store: &str,
    ) -> Self {
        let (shared, thread) = match opts.renew {
            None => (Arc::new(Shared::new(record.owner, Some((io, record)))), None),
            Some(every) => {
                let shared = Arc::new(Shared::new(record.owner, None));
                let (s, name) = (shared.clone(), store.to_owned());
                let spawned =
                    std::thread::Builder::new().name(format!("tutti-kv-lease-{store}")).spawn(move || {
                        renew::run(io, record, every, &s, &name);
                        s.mark_done();
                    });
                match spawned {
                    Ok(t) => (shared, Some(t)),
                    Err(e) => {
                        // The closure, and the block's I/O with it, is gone:
                        // the lease stays, unrenewed, until this process
                        // ends (an opener here then finds the owner gone).
                        tracing::warn!(error = %e, store, "tutti-kv: no lease renewal thread");
                        shared.mark_done();
                        (shared, None)
                    }
                }
            }
        };
        let weak = Arc::downgrade(&shared);
        let id = rt.on_shutdown(move || {
            if let Some(s) = weak.upgrade() {
                s.finish();
            }
        });
        Self { shared, thread, hook: Some((rt.clone(), id)) }
    }

    /// Whether another writer took the lease.
    pub fn lost(&self) -> bool {
        self.shared.lost.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shared.finish();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some((rt, id)) = self.hook.take() {
            rt.remove_shutdown_hook(id);
        }
    }
}
