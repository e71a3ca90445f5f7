//! [`GpuDrive`]: a drive's register window mapped into the GPU.

use std::sync::Arc;

use cudarc::driver::sys;
use nvm_queue::NvmeDevice;

use crate::cuda::HostMapping;
use crate::error::GpuError;
use crate::gpu::Gpu;

/// A drive's register window mapped into the GPU, for its doorbells.
#[derive(Debug)]
pub struct GpuDrive {
    /// The register window as the GPU sees it (doorbells).
    pub(crate) bar: HostMapping,
    device: Arc<dyn NvmeDevice>,
}

impl GpuDrive {
    /// Maps `device`'s register window (the emulator's register page: host
    /// memory) into the GPU.
    pub fn map(gpu: &Gpu, device: Arc<dyn NvmeDevice>) -> Result<Self, GpuError> {
        let _quiet = gpu.quiet.enter()?;
        let bar = device.bar0();
        // SAFETY: the window stays allocated while `device` lives, and this
        // struct keeps `device` alive longer than the mapping (field order:
        // `bar` drops first).
        let bar = unsafe { HostMapping::new(&gpu.ctx, bar.base_ptr(), bar.len()) }?;
        Ok(Self { bar, device })
    }

    /// Maps a real controller's BAR0 (an MMIO window, e.g. mmapped from
    /// vfio-pci) into the GPU with `CU_MEMHOSTREGISTER_IOMEMORY`, so GPU
    /// threads store to its doorbells directly over PCIe. Written for real
    /// drives (issue 3's device access); not yet run on hardware: see
    /// docs/gpu.md. Emulated drives use [`GpuDrive::map`].
    pub fn map_mmio(gpu: &Gpu, device: Arc<dyn NvmeDevice>) -> Result<Self, GpuError> {
        let _quiet = gpu.quiet.enter()?;
        let bar = device.bar0();
        // SAFETY: the window stays mapped while `device` lives, which this
        // struct keeps alive longer than the registration.
        let bar = unsafe {
            HostMapping::with_flags(&gpu.ctx, bar.base_ptr(), bar.len(), sys::CU_MEMHOSTREGISTER_IOMEMORY)
        }?;
        Ok(Self { bar, device })
    }

    /// The drive.
    pub fn device(&self) -> &Arc<dyn NvmeDevice> {
        &self.device
    }
}
