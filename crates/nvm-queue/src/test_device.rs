//! A register page with no controller behind it, for unit tests of the
//! driver's bounded waits and of hostile completions.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvme_regs::registers::offset;
use nvme_regs::Cap;

use crate::device::{DeviceError, DmaMapping, NvmeDevice};
use crate::mmio::Mmio;

/// A register page that never changes by itself: no controller behind it.
/// DMA "mappings" hand out fake IOVAs for real host memory, so queue memory
/// can be written by the test as a hostile device would.
#[derive(Debug)]
pub(crate) struct DeadDevice {
    _page: Box<[u32]>,
    mmio: Mmio,
    next_iova: AtomicU64,
}

impl DeadDevice {
    pub(crate) fn start(cap: Cap, csts: u32) -> Arc<dyn NvmeDevice> {
        let mut page = vec![0u32; 0x2000 / 4].into_boxed_slice();
        page[0] = cap.lo();
        page[1] = cap.hi();
        page[offset::CSTS / 4] = csts;
        // SAFETY: the boxed page lives as long as the device (moved into
        // it; a boxed slice's heap memory does not move) and is only
        // accessed through `mmio` afterwards.
        let mmio = unsafe { Mmio::new(page.as_mut_ptr().cast(), 0x2000) }.expect("aligned page");
        Arc::new(Self { _page: page, mmio, next_iova: AtomicU64::new(0x1_0000_0000) })
    }
}

impl NvmeDevice for DeadDevice {
    fn name(&self) -> &str {
        "dead"
    }
    fn bar0(&self) -> &Mmio {
        &self.mmio
    }
    unsafe fn dma_map(&self, _host: NonNull<u8>, len: usize) -> Result<DmaMapping, DeviceError> {
        let iova = self.next_iova.fetch_add((len as u64).next_multiple_of(4096) + 4096, Ordering::Relaxed);
        Ok(DmaMapping::contiguous(iova, len))
    }
    fn dma_unmap(&self, _mapping: &DmaMapping) -> Result<(), DeviceError> {
        Ok(())
    }
}
