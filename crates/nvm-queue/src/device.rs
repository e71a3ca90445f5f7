//! Device access: the trait that a real controller (vfio-pci, a later crate)
//! and the software controller (`nvme-emu`) both serve, so that queues,
//! bring-up and the runtime do not care which one they drive.

use std::fmt;
use std::ptr::NonNull;

use crate::clock::{Clock, RealClock};
use crate::mmio::Mmio;

/// Host page size assumed for DMA mappings, in bytes. DMA buffers are
/// allocated and mapped in units of this size, and [`DmaMapping`] holds one
/// device address per host page.
pub const HOST_PAGE_SIZE: usize = 4096;

/// Errors from device access.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A host range handed to [`NvmeDevice::dma_map`] is not page aligned,
    /// is empty, or wraps the address space.
    #[error("host range {addr:#x}+{len:#x} is not a non-empty, 4 KiB-aligned range")]
    BadRange {
        /// Host virtual address.
        addr: usize,
        /// Length in bytes.
        len: usize,
    },
    /// The host range overlaps one already mapped, where the device access
    /// cannot map a page twice (the no-IOMMU physical mode, whose page
    /// locks are not counted).
    #[error("host range {addr:#x}+{len:#x} overlaps a range already mapped for DMA")]
    Overlapping {
        /// Host virtual address.
        addr: usize,
        /// Length in bytes.
        len: usize,
    },
    /// The device (or the IOMMU) has no device address space left.
    #[error("device address space exhausted mapping {len:#x} bytes")]
    AddressSpaceExhausted {
        /// Length of the mapping that failed, in bytes.
        len: usize,
    },
    /// Unmapping a range the device does not know.
    #[error("no DMA mapping at device address {iova:#x}")]
    NotMapped {
        /// Device address of the mapping.
        iova: u64,
    },
    /// The host range is not in memory that can be shared with the process
    /// that owns the device (a `tuttid` drive reaches only memfd-backed
    /// memory: allocate it with `tuttid_proto::SharedMemory`).
    #[error("host range {addr:#x}+{len:#x} is not in shared (memfd) memory, which a tuttid drive needs")]
    NotShareable {
        /// Host virtual address.
        addr: usize,
        /// Length in bytes.
        len: usize,
    },
    /// The process that owns the device refused or failed the mapping.
    #[error("the owner of device {device} refused the request")]
    Owner {
        /// Device name.
        device: String,
        /// The owner's answer.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A system call failed (vfio, mmap, mlock...).
    #[error("{op} failed")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Device addresses of a mapped host range: one per [`HOST_PAGE_SIZE`] page.
///
/// With an IOMMU the addresses are consecutive IOVAs; without one they are
/// the physical addresses of each (locked) page and need not be
/// consecutive. The PRP builder copes with both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmaMapping {
    pages: Vec<u64>,
}

impl DmaMapping {
    /// A mapping whose host pages sit at consecutive device addresses from
    /// `iova` (page aligned).
    pub fn contiguous(iova: u64, len: usize) -> Self {
        let n = len.div_ceil(HOST_PAGE_SIZE);
        Self { pages: (0..n as u64).map(|i| iova + i * HOST_PAGE_SIZE as u64).collect() }
    }

    /// A mapping from explicit per-page device addresses (each page aligned).
    pub fn from_pages(pages: Vec<u64>) -> Self {
        Self { pages }
    }

    /// Device address of each host page, in order.
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }

    /// Mapped length in bytes (a multiple of [`HOST_PAGE_SIZE`]).
    pub fn len(&self) -> usize {
        self.pages.len() * HOST_PAGE_SIZE
    }

    /// `true` for an empty mapping.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Device address of byte `offset` of the mapped range, or `None` past
    /// its end.
    pub fn addr(&self, offset: usize) -> Option<u64> {
        let page = self.pages.get(offset / HOST_PAGE_SIZE)?;
        Some(page + (offset % HOST_PAGE_SIZE) as u64)
    }
}

/// Host memory a device supplies for its own DMA buffers
/// ([`NvmeDevice::alloc_host`]): `len` bytes at `ptr`, zeroed and page
/// aligned, kept alive by `owner` (dropping it releases the memory).
#[derive(Debug)]
pub struct HostMemory {
    /// First byte, page aligned.
    pub ptr: NonNull<u8>,
    /// Length in bytes (whole pages).
    pub len: usize,
    /// Keeps the memory allocated until dropped.
    pub owner: Box<dyn fmt::Debug + Send + Sync>,
}

/// One NVMe controller as the driver sees it: a BAR0 register window and a
/// DMA address space.
pub trait NvmeDevice: Send + Sync + fmt::Debug {
    /// A human-readable name (PCI address, or `emu:<name>`).
    fn name(&self) -> &str;

    /// The controller's register window (BAR0: registers at 00h..3Fh,
    /// doorbells from 1000h).
    fn bar0(&self) -> &Mmio;

    /// Makes `len` bytes of host memory at `host` reachable by the device's
    /// DMA and returns their device addresses.
    ///
    /// # Safety
    ///
    /// `host..host + len` must stay allocated (and, for a real device,
    /// resident) until [`NvmeDevice::dma_unmap`] is called for the returned
    /// mapping and, if a command touching it timed out, until the controller
    /// has been reset. The device may read and write that memory at any time
    /// in between, so no Rust reference (`&`/`&mut`) to it may be held while
    /// a command that can write it is outstanding.
    unsafe fn dma_map(&self, host: NonNull<u8>, len: usize) -> Result<DmaMapping, DeviceError>;

    /// Removes a mapping made by [`NvmeDevice::dma_map`].
    fn dma_unmap(&self, mapping: &DmaMapping) -> Result<(), DeviceError>;

    /// Memory for the driver's own DMA buffers (queue memory, PRP lists),
    /// when the device needs a particular kind (a `tuttid` drive: memory
    /// shared with the daemon). `Ok(None)`, the default, means the process
    /// heap will do.
    ///
    /// # Errors
    ///
    /// Whatever allocating that memory failed with.
    fn alloc_host(&self, len: usize) -> Result<Option<HostMemory>, DeviceError> {
        let _ = len;
        Ok(None)
    }

    /// A hint that another agent (a GPU kernel just launched) is about to
    /// write this device's doorbells directly in its register window,
    /// where no CPU write reaches [`NvmeDevice::bar0`]'s owner. A real
    /// controller sees every doorbell write as it lands, so the default
    /// does nothing; an emulated controller that naps while idle wakes up
    /// and polls for a while, as a real one would be ready.
    fn expect_doorbells(&self) {}

    /// A hint that the host has just written a doorbell through
    /// [`NvmeDevice::bar0`] and now waits for the answer (the driver's
    /// admin commands). A real controller sees the write as it lands, so
    /// the default does nothing; an emulated controller that naps while
    /// idle wakes up to poll at once instead of at the end of its nap
    /// (unlike [`NvmeDevice::expect_doorbells`], it does not then keep
    /// polling).
    fn doorbell_written(&self) {}

    /// The clock the driver's bounded waits on this device run on (CSTS
    /// transitions in bring-up, reset and shutdown; admin commands). A
    /// real controller, and the default, is on [`RealClock`]; a device
    /// that models time on a [`crate::VirtualClock`] (an emulator started
    /// on one) returns it, so that the waits take virtual time and step
    /// the device.
    fn clock(&self) -> &dyn Clock {
        &RealClock
    }

    /// DMA memory that this device's controller may still write although
    /// the driver is done with it: pages of admin commands that timed out,
    /// on a controller never seen stopped (CSTS.RDY = 0 after CC.EN = 0).
    /// It must stay allocated and mapped for as long as the device may
    /// DMA. The default keeps it for the rest of the process
    /// ([`KeptDma::leak`]); a device that knows when it can no longer DMA
    /// (an emulated one that stopped) may hold it and drop it then. The
    /// buffers hold the device (`Arc`): a device that stores them must
    /// drop them itself to be freed.
    fn keep_dma(&self, kept: KeptDma) {
        kept.leak();
    }
}

/// DMA buffers that a controller may still write although the driver is
/// done with them ([`NvmeDevice::keep_dma`]). Dropping it frees and
/// unmaps them; [`KeptDma::leak`] keeps them for the rest of the process.
/// Opaque here, so that this module (the device contract) does not depend
/// on the DMA buffer type built on it.
pub struct KeptDma {
    buffers: Vec<Box<dyn Send>>,
}

impl KeptDma {
    /// Wraps buffers (`crate::dma::DmaBuffer`s, as boxes).
    pub(crate) fn new(buffers: Vec<Box<dyn Send>>) -> Self {
        Self { buffers }
    }

    /// How many buffers are kept.
    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    /// No buffer kept.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    /// Keeps the buffers allocated and mapped for the rest of the process
    /// (NVMe gives no guarantee that a timed-out command will not write
    /// until the controller is reset).
    pub fn leak(self) {
        std::mem::forget(self);
    }
}

impl std::fmt::Debug for KeptDma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptDma").field("buffers", &self.buffers.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_addresses() {
        let m = DmaMapping::contiguous(0x1_0000_0000, 3 * 4096 - 1);
        assert_eq!(m.len(), 3 * 4096);
        assert_eq!(m.addr(0x200), Some(0x1_0000_0200));
        assert_eq!(m.addr(4096 * 2 + 5), Some(0x1_0000_2005));
        assert_eq!(m.addr(4096 * 3), None);
        let p = DmaMapping::from_pages(vec![0x9000, 0x3000]);
        assert_eq!(p.addr(4097), Some(0x3001));
    }
}
