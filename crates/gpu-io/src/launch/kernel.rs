//! [`IoKernel`]: a [`Gpu`](crate::Gpu)'s I/O kernel: the entry points
//! `tutti_io` and `tutti_ring_probe`, their module and the pool of launch
//! slots.

use std::sync::Arc;

use cudarc::driver::sys;

use crate::cuda::Module;
use crate::launch::slot::SlotPool;

/// The I/O kernel of one `Gpu` and what its launches reuse.
#[derive(Debug)]
pub(crate) struct IoKernel {
    func: sys::CUfunction,
    /// `tutti_ring_probe` from the same module, when the module has it (a
    /// `TUTTI_IO_PTX` override may not).
    probe_func: Option<sys::CUfunction>,
    _module: Module,
    /// Reusable launch buffers (`launch/slot.rs`).
    slots: Arc<SlotPool>,
}

impl IoKernel {
    /// The kernel `func` (and the probe, when found) of the loaded `module`,
    /// with an empty slot pool.
    pub(crate) fn new(module: Module, func: sys::CUfunction, probe_func: Option<sys::CUfunction>) -> Self {
        Self { func, probe_func, _module: module, slots: Arc::new(SlotPool::default()) }
    }

    /// `tutti_io`.
    pub(crate) fn func(&self) -> sys::CUfunction {
        self.func
    }

    /// `tutti_ring_probe`, when the module has it.
    pub(crate) fn probe_func(&self) -> Option<sys::CUfunction> {
        self.probe_func
    }

    /// The pool of free launch slots.
    pub(crate) fn slots(&self) -> &Arc<SlotPool> {
        &self.slots
    }
}
