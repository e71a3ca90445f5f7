//! Registrations whose `Memory` / `KvMemory` was dropped while the runtime
//! (or the kv store) still used them: an operation dropped before it was
//! final, or a wait whose deadline passed while a drive still held a
//! command. Their objects must stay alive (a drive may still write them),
//! but only until the drives are done: every later call of the binding that
//! submits, waits, registers or unregisters retries them, unregisters those
//! the runtime lets go and releases their objects.
//!
//! One process-wide list: the entries keep what they need to unregister
//! (the runtime or the store), so they outlive the Python objects that made
//! them.

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;

use crate::memory::Export;

/// An attempt to end a registration: true once it is ended.
type Unregister = Box<dyn FnMut() -> bool + Send>;

/// The pending registrations and the objects they keep alive.
static PENDING: Mutex<Vec<(Unregister, Export)>> = Mutex::new(Vec::new());

fn pending() -> MutexGuard<'static, Vec<(Unregister, Export)>> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keeps `export` alive until `unregister` succeeds (tried again by
/// [`retry`]).
pub fn defer(unregister: impl FnMut() -> bool + Send + 'static, export: Export) {
    pending().push((Box::new(unregister), export));
}

/// Retries every deferred unregistration; releases the objects of those that
/// succeed. The list is not locked while objects are released (releasing
/// one may run Python code that drops another registration).
pub fn retry(py: Python<'_>) {
    let taken = {
        let mut p = pending();
        if p.is_empty() {
            return;
        }
        std::mem::take(&mut *p)
    };
    let mut still = Vec::new();
    for (mut unregister, export) in taken {
        if unregister() {
            export.release(py);
        } else {
            still.push((unregister, export));
        }
    }
    pending().append(&mut still);
}
