//! Registering a Python object's bytes and letting them go, for both
//! owners of registrations: the runtime (`tutti.Memory`) and a kv store
//! (`tutti.KvMemory`). [`Registrar`] is what differs between the two;
//! [`Held`] is what they share: the [`Export`] kept until unregistration
//! succeeds, the GIL released around registration, the GPU device check,
//! and a dropped registration's unregistration deferred while the owner
//! still uses it (`deferred.rs`).

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use tutti::Runtime;
use tutti_kv::{KvError as RsKvError, KvMemory as RsKvMemory, KvStore as RsKvStore};

use crate::deferred;
use crate::errors::{kv_error, runtime_error, HandleError};
use crate::memory::{Export, Location};

/// What registers memory and unregisters it again.
pub trait Registrar: Send + Sync + 'static {
    /// What registration returns and unregistration takes.
    type Handle: Copy + Send + Sync + std::fmt::Debug + 'static;
    /// The owner's error.
    type Error: Send;

    /// Registers `len` bytes at `ptr`: a host address for
    /// [`Location::Host`], a device pointer of the owner's GPU for
    /// [`Location::Gpu`].
    ///
    /// # Safety
    ///
    /// The bytes stay allocated and in place until [`Registrar::unregister`]
    /// of the handle returns `Ok` (the runtime's `register_memory`
    /// contract).
    unsafe fn register(&self, ptr: u64, len: usize, location: Location) -> Result<Self::Handle, Self::Error>;

    /// Ends a registration; an error leaves it registered.
    fn unregister(&self, handle: Self::Handle) -> Result<(), Self::Error>;

    /// The handle as the int Python sees.
    fn handle_u64(handle: Self::Handle) -> u64;

    /// The ordinal of the GPU that GPU memory must be on.
    fn gpu(&self) -> i64;

    /// The error as a Python exception.
    fn py_err(e: &Self::Error) -> PyErr;
}

impl Registrar for Runtime {
    type Handle = tutti::MemoryHandle;
    type Error = tutti::Error;

    unsafe fn register(&self, ptr: u64, len: usize, location: Location) -> Result<Self::Handle, Self::Error> {
        match location {
            // SAFETY: forwarded to the caller.
            Location::Host => unsafe { self.register_memory(ptr as usize as *mut u8, len) },
            // SAFETY: forwarded to the caller.
            Location::Gpu => unsafe { self.register_gpu_memory(ptr, len) },
        }
    }

    fn unregister(&self, handle: Self::Handle) -> Result<(), Self::Error> {
        self.unregister_memory(handle)
    }

    fn handle_u64(handle: Self::Handle) -> u64 {
        handle.to_u64()
    }

    fn gpu(&self) -> i64 {
        self.gpu_ordinal().map_or(0, i64::from)
    }

    fn py_err(e: &Self::Error) -> PyErr {
        runtime_error(e)
    }
}

impl Registrar for RsKvStore {
    type Handle = RsKvMemory;
    type Error = RsKvError;

    unsafe fn register(&self, ptr: u64, len: usize, location: Location) -> Result<Self::Handle, Self::Error> {
        match location {
            // SAFETY: forwarded to the caller.
            Location::Host => unsafe { self.register_host(ptr as usize as *mut u8, len) },
            // SAFETY: forwarded to the caller.
            Location::Gpu => unsafe { self.register_gpu(ptr, len) },
        }
    }

    fn unregister(&self, handle: Self::Handle) -> Result<(), Self::Error> {
        RsKvStore::unregister(self, handle)
    }

    fn handle_u64(handle: Self::Handle) -> u64 {
        handle.handle().to_u64()
    }

    fn gpu(&self) -> i64 {
        self.runtime().gpu_ordinal().map_or(0, i64::from)
    }

    fn py_err(e: &Self::Error) -> PyErr {
        kv_error(e)
    }
}

/// A Python object's bytes registered with `owner`: the export that keeps
/// them in place until [`Held::unregister`] succeeds. Dropped while still
/// registered, it unregisters them, or, if the owner refuses (an operation
/// may still use them), hands the export to `deferred.rs` rather than free
/// the bytes under a drive.
#[derive(Debug)]
pub struct Held<R: Registrar> {
    owner: Arc<R>,
    handle: R::Handle,
    /// Length in bytes.
    pub len: usize,
    /// Host or GPU memory.
    pub location: Location,
    /// The exporter gave the bytes read-only: they may be written to a
    /// drive, not read into.
    pub readonly: bool,
    export: Mutex<Option<Export>>,
}

impl<R: Registrar> Held<R> {
    /// Exports `obj` (buffer protocol, CUDA array interface or DLPack),
    /// checks that GPU memory is on the owner's GPU, and registers the
    /// bytes with the GIL released.
    pub fn register(py: Python<'_>, owner: &Arc<R>, obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let export = Export::from_object(obj)?;
        if export.location == Location::Gpu {
            Export::check_gpu_device(obj, owner.gpu())?;
        }
        let (ptr, len, location) = (export.ptr, export.len, export.location);
        let o = owner.clone();
        // SAFETY: `export` keeps the memory allocated and in place (a strong
        // reference to the exporter and its buffer view or DLPack tensor)
        // until `unregister` succeeds; dropped while the owner refuses to let
        // it go, it passes the export to `deferred.rs`, which keeps it until
        // a retried unregistration succeeds. GPU memory is on the owner's
        // GPU where the object says (`check_gpu_device`). Python code must
        // not touch the bytes while an operation on them runs (documented).
        let handle =
            py.detach(move || unsafe { o.register(ptr, len, location) }).map_err(|e| R::py_err(&e))?;
        Ok(Self {
            owner: owner.clone(),
            handle,
            len,
            location,
            readonly: export.readonly,
            export: Mutex::new(Some(export)),
        })
    }

    /// The owner.
    pub fn owner(&self) -> &Arc<R> {
        &self.owner
    }

    /// The owner's handle.
    pub fn handle(&self) -> R::Handle {
        self.handle
    }

    /// The export, `None` once unregistered.
    pub fn export(&self) -> MutexGuard<'_, Option<Export>> {
        self.export.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unregisters the bytes through `via`, the runtime or store the
    /// Python call was made on (one that is not the owner refuses the
    /// handle as foreign, and nothing changes), and lets go of their object.
    /// `HandleError` when already unregistered; the owner's error (nothing
    /// changes) while it still uses them.
    pub fn unregister(&self, py: Python<'_>, via: &R) -> PyResult<()> {
        let mut export = self.export();
        if export.is_none() {
            return Err(HandleError::new_err(format!(
                "memory {:#x} is already unregistered",
                R::handle_u64(self.handle)
            )));
        }
        via.unregister(self.handle).map_err(|e| R::py_err(&e))?;
        if let Some(e) = export.take() {
            e.release(py);
        }
        Ok(())
    }
}

impl<R: Registrar> Drop for Held<R> {
    fn drop(&mut self) {
        let export = self.export.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(e) = export {
            match self.owner.unregister(self.handle) {
                Ok(()) => drop(e),
                Err(_) => {
                    let (owner, handle) = (self.owner.clone(), self.handle);
                    deferred::defer(move || owner.unregister(handle).is_ok(), e);
                }
            }
        }
    }
}
