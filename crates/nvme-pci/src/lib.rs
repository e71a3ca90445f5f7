//! Device access for real NVMe controllers on Linux: finding NVMe
//! functions in sysfs, moving them between the kernel `nvme` driver and
//! `vfio-pci`, and serving them to the driver as an
//! [`nvm_queue::NvmeDevice`] through VFIO type1 (BAR0 mapped with `mmap`,
//! DMA through the IOMMU).
//!
//! Sources: Linux `Documentation/driver-api/vfio.rst` and
//! `include/uapi/linux/vfio.h` (VFIO), `Documentation/ABI/testing/sysfs-bus-pci`
//! (binding), `Documentation/admin-guide/mm/pagemap.rst` (no-IOMMU
//! fallback), PCI Local Bus 3.0 (Command register), NVM Express Base 2.0
//! (class code 010802h, BAR0 layout).
//!
//! Layout: [`addr`] (PCI addresses), [`sysfs`] (a rooted view of sysfs and
//! procfs, so tests run on a fake tree), [`enumerate`](mod@enumerate) (what is there and
//! who uses it), [`bind`] (vfio-pci and back), [`iova`] (the IOVA
//! allocator), [`phys`] (pagemap decoding), [`vfio`] ([`VfioNvme`]).
//!
//! Unsafe code is denied everywhere but in the private `sys` module,
//! which holds every ioctl, `mmap` and `mlock` call, each with its SAFETY
//! argument, and in the implementation of the unsafe trait method
//! `NvmeDevice::dma_map` for [`VfioNvme`], which forwards its contract.
#![cfg(target_os = "linux")]

pub mod addr;
pub mod bind;
pub mod enumerate;
pub mod error;
pub mod fake;
pub mod iova;
pub mod phys;
mod sys;
pub mod sysfs;
pub mod vfio;

pub use addr::{PciAddr, PciAddrParseError};
pub use bind::{bind_vfio, unbind_to_kernel, vfio_status, BindOutcome, VfioStatus, NVME, VFIO_PCI};
pub use enumerate::{
    enumerate, function, BlockDevice, DeviceUse, Holder, KernelController, NvmeFunction, NVME_CLASS,
};
pub use error::PciError;
pub use iova::{IovaAllocator, IovaError};
pub use sysfs::Sysfs;
pub use vfio::{open, AccessMode, OpenOptions, VfioNvme, NO_IOMMU_WARNING, UIO_PCI_GENERIC};

/// `access(path, R_OK | W_OK)`: whether this process may open `path`
/// read/write (for `/dev/vfio/<group>` in `tutti-probe status`).
pub fn can_read_write(path: &std::path::Path) -> bool {
    sys::can_read_write(path)
}
