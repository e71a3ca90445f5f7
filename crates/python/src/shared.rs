//! `tutti.SharedBuffer`: host memory another process can map (a memfd,
//! `tutti::SharedMemory`), the only host memory a drive owned by `tuttid`
//! (a runtime `daemon` drive) can reach. Python reads and writes it through
//! `.buffer`, an `mmap.mmap` of the same memfd (its own mapping of the same
//! pages, which owns itself the way any `mmap` does, so a numpy array over
//! it can outlive this object safely); the runtime registers this object's
//! own mapping.

use pyo3::prelude::*;
use tutti::SharedMemory;

use crate::errors::MemoryRegistrationError;

/// Shared host memory for I/O: `SharedBuffer(nbytes)` (rounded up to whole
/// 4 KiB pages, zeroed). Register the object itself (`Runtime.register`,
/// `KvStore.register`); read and write its bytes through `.buffer` (an
/// `mmap.mmap`: `numpy.frombuffer(sb.buffer, dtype=numpy.uint8)`, or
/// `memoryview(sb.buffer)`). Needed for drives owned by `tuttid`; usable
/// with any runtime.
#[pyclass(frozen, module = "tutti", name = "SharedBuffer")]
#[derive(Debug)]
pub struct SharedBuffer {
    mem: SharedMemory,
    buffer: Py<PyAny>,
}

#[pymethods]
impl SharedBuffer {
    /// Allocates `nbytes` (> 0). Raises `tutti.MemoryRegistrationError`
    /// when the memfd cannot be made or mapped.
    #[new]
    fn new(py: Python<'_>, nbytes: usize) -> PyResult<Self> {
        let mem = SharedMemory::new(nbytes)
            .map_err(|e| MemoryRegistrationError::new_err(format!("shared memory of {nbytes} bytes: {e}")))?;
        let fd = {
            use std::os::fd::AsRawFd;
            mem.fd().as_raw_fd()
        };
        // `mmap.mmap` duplicates the descriptor and maps it on its own.
        let buffer = py.import("mmap")?.getattr("mmap")?.call1((fd, mem.len()))?.unbind();
        Ok(Self { mem, buffer })
    }

    /// Length in bytes (whole pages).
    #[getter]
    fn nbytes(&self) -> usize {
        self.mem.len()
    }

    /// The bytes, as an `mmap.mmap` of the same shared memory.
    #[getter]
    fn buffer(&self, py: Python<'_>) -> Py<PyAny> {
        self.buffer.clone_ref(py)
    }

    fn __len__(&self) -> usize {
        self.mem.len()
    }

    fn __repr__(&self) -> String {
        format!("SharedBuffer({} bytes)", self.mem.len())
    }
}

impl SharedBuffer {
    /// Host address of this object's own mapping.
    pub fn ptr(&self) -> u64 {
        self.mem.as_ptr() as usize as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }
}
