//! Physical addresses of locked host pages, for the no-IOMMU fallback:
//! `/proc/self/pagemap` holds one 64-bit entry per virtual page
//! (Linux `Documentation/admin-guide/mm/pagemap.rst`): bit 63 page present,
//! bit 62 swapped, bits 0-54 the page frame number (PFN). Since Linux 4.2
//! the PFN reads as zero without CAP_SYS_ADMIN.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Page size the pagemap is indexed by, bytes (x86-64 base pages).
pub const PAGEMAP_PAGE: u64 = 4096;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const PFN_MASK: u64 = (1 << 55) - 1;

/// Why a pagemap entry gives no physical address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PagemapError {
    /// The page is not resident (bit 63 clear).
    #[error("page not present in RAM")]
    NotPresent,
    /// The page is swapped out (bit 62).
    #[error("page swapped out")]
    Swapped,
    /// Present, but the PFN reads as zero: the process lacks CAP_SYS_ADMIN.
    #[error("page frame number hidden: reading physical addresses needs CAP_SYS_ADMIN (run as root)")]
    PfnHidden,
    /// The PFN is beyond a 64-bit physical address.
    #[error("page frame number {0:#x} is out of range")]
    PfnOutOfRange(u64),
}

/// Decodes one pagemap entry to the physical address of the page's first
/// byte (`PFN * 4096`).
pub fn decode_pagemap_entry(entry: u64) -> Result<u64, PagemapError> {
    if entry & SWAPPED != 0 {
        return Err(PagemapError::Swapped);
    }
    if entry & PRESENT == 0 {
        return Err(PagemapError::NotPresent);
    }
    let pfn = entry & PFN_MASK;
    if pfn == 0 {
        return Err(PagemapError::PfnHidden);
    }
    pfn.checked_mul(PAGEMAP_PAGE).ok_or(PagemapError::PfnOutOfRange(pfn))
}

/// Reads the physical address of each 4 KiB page of `vaddr..vaddr + len`
/// from an open pagemap file (`vaddr` page aligned).
pub fn physical_pages(pagemap: &File, vaddr: usize, len: usize) -> io::Result<Vec<u64>> {
    let first = vaddr as u64 / PAGEMAP_PAGE;
    let n = (len as u64).div_ceil(PAGEMAP_PAGE) as usize;
    let mut raw = vec![0u8; n * 8];
    pagemap.read_exact_at(&mut raw, first * 8)?;
    raw.chunks_exact(8)
        .map(|c| {
            let e = u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]));
            decode_pagemap_entry(e).map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pagemap_entries() {
        // Present, exclusive (bit 56), PFN 0x12345.
        assert_eq!(decode_pagemap_entry(PRESENT | 1 << 56 | 0x12345), Ok(0x12345 * 4096));
        // Soft-dirty (bit 55) is not part of the PFN.
        assert_eq!(decode_pagemap_entry(PRESENT | 1 << 55 | 7), Ok(7 * 4096));
        assert_eq!(decode_pagemap_entry(PRESENT), Err(PagemapError::PfnHidden));
        assert_eq!(decode_pagemap_entry(0x12345), Err(PagemapError::NotPresent));
        assert_eq!(decode_pagemap_entry(PRESENT | SWAPPED | 0x55), Err(PagemapError::Swapped));
        // Largest PFN that fits a 64-bit address, and one past it.
        assert_eq!(decode_pagemap_entry(PRESENT | (u64::MAX >> 12)), Ok((u64::MAX >> 12) * 4096));
        assert_eq!(decode_pagemap_entry(PRESENT | PFN_MASK), Err(PagemapError::PfnOutOfRange(PFN_MASK)));
    }

    #[test]
    fn own_pages_read_from_procfs() {
        // Without CAP_SYS_ADMIN the PFN is hidden; either way the read works.
        let Ok(f) = File::open("/proc/self/pagemap") else { return };
        let page = vec![1u8; 8192];
        let addr = (page.as_ptr() as usize) & !4095;
        match physical_pages(&f, addr, 4096) {
            Ok(p) => assert!(p[0] % 4096 == 0 && p[0] != 0),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied),
        }
    }
}
