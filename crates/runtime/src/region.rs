//! A registered memory range and its DMA mapping on every drive: held by
//! the operations that use it and by the drives whose abandoned commands
//! may still write it (`runtime/memory.rs` makes them, `drive.rs` pins
//! them until a controller reset); unmapped when the last holder lets go.

use std::sync::Arc;

use gpu_io::GpuRegion;
use nvm_queue::{DmaMapping, NvmeDevice};

/// A registered memory range and its DMA mapping on every drive.
#[derive(Debug)]
pub(crate) struct Region {
    /// Bytes from the page-aligned start of the mapping to the caller's
    /// pointer.
    pub lead: usize,
    /// The caller's length, bytes.
    pub len: usize,
    /// One mapping per drive, by drive index.
    pub mappings: Vec<DmaMapping>,
    /// The drive each mapping was made on (unmapped there on drop).
    pub devices: Vec<Arc<dyn NvmeDevice>>,
    /// Per drive with GPU-driven queues: the region's page addresses as
    /// that drive sees them, uploaded to the GPU once at registration (the
    /// kernel builds each command's PRPs from it).
    pub gpu_regions: Vec<Option<GpuRegion>>,
}

impl Drop for Region {
    fn drop(&mut self) {
        for (dev, m) in self.devices.iter().zip(&self.mappings) {
            if let Err(e) = dev.dma_unmap(m) {
                tracing::error!(device = dev.name(), error = %e, "DMA unmap failed");
            }
        }
    }
}
