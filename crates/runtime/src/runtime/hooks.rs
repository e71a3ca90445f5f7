//! Work a layer above runs when the runtime shuts down, while the runtime
//! still accepts I/O: tutti-kv frees its stores' leases there (a store
//! kept alive past its runtime's shutdown would otherwise hold its lease
//! until the process exits).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::{lock, Runtime};

/// Identifies a hook given to [`Runtime::on_shutdown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownHookId(u64);

type Hook = Box<dyn FnOnce() + Send>;

/// The hooks not yet run.
#[derive(Default)]
pub(crate) struct ShutdownHooks {
    next: AtomicU64,
    list: Mutex<Vec<(u64, Hook)>>,
}

impl std::fmt::Debug for ShutdownHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownHooks").field("pending", &lock(&self.list).len()).finish()
    }
}

impl ShutdownHooks {
    /// Runs every hook once, in the order given, outside the lock.
    pub(crate) fn run_all(&self) {
        let hooks = std::mem::take(&mut *lock(&self.list));
        for (_, h) in hooks {
            h();
        }
    }
}

impl Runtime {
    /// Runs `f` once, at the start of the first [`Runtime::shutdown`]
    /// (also the one of `Drop`), before the runtime stops accepting work:
    /// `f` may still submit and wait. Hooks run in the order given, on the
    /// thread that shuts down; one added after the shutdown began never
    /// runs. `f` must not call `shutdown`.
    pub fn on_shutdown(&self, f: impl FnOnce() + Send + 'static) -> ShutdownHookId {
        let id = self.shutdown_hooks.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.shutdown_hooks.list).push((id, Box::new(f)));
        ShutdownHookId(id)
    }

    /// Drops hook `id` unrun (nothing when it ran or was removed already).
    pub fn remove_shutdown_hook(&self, id: ShutdownHookId) {
        lock(&self.shutdown_hooks.list).retain(|(i, _)| *i != id.0);
    }
}
