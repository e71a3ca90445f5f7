//! `tutti.Memory`: a registration of a Python object's bytes with a
//! runtime, holding the [`Export`] that keeps them in place until it is
//! unregistered.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use tutti::{MemoryHandle, Runtime};

use crate::deferred;
use crate::memory::{describe, Export, Location};

/// Memory registered with a runtime: a byte range of a Python object (a
/// buffer such as a numpy array, bytearray or memoryview; a CUDA array; a
/// DLPack tensor) that requests name by `handle` and a byte offset.
///
/// It keeps the object alive (and, for buffers, its buffer view, so a
/// bytearray cannot be resized) until `Runtime.unregister` succeeds. Do not
/// read or write the bytes while an operation using them is in flight.
#[pyclass(frozen, module = "tutti", name = "Memory")]
#[derive(Debug)]
pub struct Memory {
    pub(crate) rt: Arc<Runtime>,
    pub(crate) handle: MemoryHandle,
    pub(crate) nbytes: usize,
    pub(crate) location: Location,
    pub(crate) readonly: bool,
    pub(crate) export: Mutex<Option<Export>>,
}

impl Memory {
    /// The runtime's handle as an int.
    pub fn handle_u64(&self) -> u64 {
        self.handle.to_u64()
    }

    pub(crate) fn export(&self) -> MutexGuard<'_, Option<Export>> {
        self.export.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl Memory {
    /// The runtime's memory handle (an int; requests may name it).
    #[getter]
    fn handle(&self) -> u64 {
        self.handle.to_u64()
    }

    /// Length of the region, bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// "host" or "gpu".
    #[getter]
    fn kind(&self) -> &'static str {
        self.location.name()
    }

    /// True when the exporter gave the memory read-only: it may be written
    /// to a drive but not read into.
    #[getter]
    fn readonly(&self) -> bool {
        self.readonly
    }

    /// True until unregistered.
    #[getter]
    fn registered(&self) -> bool {
        self.export().is_some()
    }

    fn __repr__(&self) -> String {
        match &*self.export() {
            Some(e) => format!("Memory(handle={:#x}, {})", self.handle.to_u64(), describe(e)),
            None => format!("Memory(handle={:#x}, unregistered)", self.handle.to_u64()),
        }
    }
}

impl Drop for Memory {
    /// A registration dropped without `unregister` is ended here; if the
    /// runtime refuses (an operation may still use it), the memory is kept
    /// alive until a later call finds the drives done with it
    /// (`deferred.rs`), rather than freed under a drive.
    fn drop(&mut self) {
        let export = self.export.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(e) = export {
            match self.rt.unregister_memory(self.handle) {
                Ok(()) => drop(e),
                Err(_) => {
                    let (rt, handle) = (self.rt.clone(), self.handle);
                    deferred::defer(move || rt.unregister_memory(handle).is_ok(), e);
                }
            }
        }
    }
}
