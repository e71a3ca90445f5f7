//! [`GpuRegion`]: a data region's page addresses, as the I/O kernel reads
//! them.

use std::sync::Arc;

use nvm_queue::DmaMapping;

use crate::cuda::{DeviceMem, Quiesce};
use crate::error::GpuError;
use crate::gpu::Gpu;

/// A data region as one drive sees it: the bus address of each 4 KiB page,
/// in device memory for the kernel (PRPs are built from it on the GPU).
#[derive(Debug)]
pub struct GpuRegion {
    /// Always `Some` until dropped (freed inside the gate).
    pages: Option<DeviceMem>,
    pub(crate) len: usize,
    quiet: Arc<Quiesce>,
}

impl GpuRegion {
    /// Uploads `mapping`'s page addresses; `len` bytes of it are usable.
    /// Waits for running I/O kernels first (`Quiesce`).
    pub fn new(gpu: &Gpu, mapping: &DmaMapping, len: usize) -> Result<Self, GpuError> {
        if len > mapping.len() || mapping.pages().is_empty() {
            return Err(GpuError::RegionOutsideMapping { len, mapping_len: mapping.len() });
        }
        let _quiet = gpu.quiet.enter()?;
        let pages = DeviceMem::from_slice(&gpu.ctx, mapping.pages())?;
        Ok(Self { pages: Some(pages), len, quiet: gpu.quiet.clone() })
    }

    /// Device pointer of the page address table.
    pub(crate) fn pages_ptr(&self) -> u64 {
        self.pages.as_ref().map_or(0, |p| p.ptr)
    }
}

impl Drop for GpuRegion {
    /// Frees the page table with no I/O kernel running (`Quiesce`).
    fn drop(&mut self) {
        let Some(pages) = self.pages.take() else { return };
        let _quiet = self.quiet.enter();
        drop(pages);
    }
}
