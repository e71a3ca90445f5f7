//! `tutti.Memory`: a registration of a Python object's bytes with a
//! runtime ([`Held`] keeps them in place until it is unregistered).

use pyo3::prelude::*;
use tutti::Runtime;

use crate::memory::describe;
use crate::registrar::Held;

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
    pub(crate) held: Held<Runtime>,
}

impl Memory {
    /// The runtime's handle as an int.
    pub fn handle_u64(&self) -> u64 {
        self.held.handle().to_u64()
    }
}

#[pymethods]
impl Memory {
    /// The runtime's memory handle (an int; requests may name it).
    #[getter]
    fn handle(&self) -> u64 {
        self.handle_u64()
    }

    /// Length of the region, bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.held.len
    }

    /// "host" or "gpu".
    #[getter]
    fn kind(&self) -> &'static str {
        self.held.location.name()
    }

    /// True when the exporter gave the memory read-only: it may be written
    /// to a drive but not read into.
    #[getter]
    fn readonly(&self) -> bool {
        self.held.readonly
    }

    /// True until unregistered.
    #[getter]
    fn registered(&self) -> bool {
        self.held.export().is_some()
    }

    fn __repr__(&self) -> String {
        match &*self.held.export() {
            Some(e) => format!("Memory(handle={:#x}, {})", self.handle_u64(), describe(e)),
            None => format!("Memory(handle={:#x}, unregistered)", self.handle_u64()),
        }
    }
}
