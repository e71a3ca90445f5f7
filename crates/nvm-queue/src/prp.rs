//! The PRP builder (NVMe Base 2.0 section 4.1.1, "Physical Region Page
//! Entry and List").
//!
//! Rules it follows, for a memory page size `P = 2^(12 + CC.MPS)`:
//!
//! - PRP1 is the device address of the first byte; it may sit anywhere in
//!   its page but must be dword aligned.
//! - If the transfer ends inside PRP1's page, PRP2 is 0 (unused).
//! - If it needs exactly one more page, PRP2 is that page's address.
//! - Otherwise PRP2 points to a PRP list: page-aligned data entries, `P / 8`
//!   per list page; when more entries are needed than fit, the last entry of
//!   a list page points to the next list page.
//!
//! Every data entry after PRP1 must be page aligned, and the bytes of each
//! memory page must be contiguous in device address space; a buffer whose
//! device layout breaks that (possible when `P` is larger than the host page
//! and pages were mapped one by one) cannot be described and is refused.

use std::sync::atomic::Ordering;

use crate::device::{DmaMapping, HOST_PAGE_SIZE};
use crate::dma::DmaBuffer;

/// Why a transfer cannot be described with PRPs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrpError {
    /// A zero-length transfer has no data pointer.
    #[error("zero-length transfer")]
    ZeroLength,
    /// The transfer runs past the end of the registered buffer.
    #[error("transfer {offset:#x}+{len:#x} is outside the {buffer_len:#x}-byte buffer")]
    OutOfBuffer {
        /// Offset of the transfer in the buffer, bytes.
        offset: usize,
        /// Length of the transfer, bytes.
        len: usize,
        /// Length of the buffer, bytes.
        buffer_len: usize,
    },
    /// PRP1 must be dword (4-byte) aligned.
    #[error("data address {addr:#x} is not dword aligned")]
    Misaligned {
        /// Device address of the first byte.
        addr: u64,
    },
    /// A memory page of the transfer is not contiguous, or a page after the
    /// first does not start on a memory-page boundary, in device addresses.
    #[error("transfer byte {offset:#x} at device address {addr:#x} breaks the PRP page layout")]
    NotDescribable {
        /// Offset in the transfer, bytes.
        offset: usize,
        /// Device address found there.
        addr: u64,
    },
    /// The PRP list memory given to the builder has too few pages.
    #[error("transfer needs {needed} PRP list pages, {available} available")]
    ListTooSmall {
        /// List pages needed.
        needed: usize,
        /// List pages available.
        available: usize,
    },
    /// Memory page size not a power of two in 4 KiB..=128 MiB.
    #[error("memory page size {0} is not a power of two in 4 KiB..=128 MiB")]
    BadPageSize(usize),
}

/// The data pointer of one command: the SQE's PRP1 and PRP2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prp {
    /// PRP Entry 1 (SQE bytes 24..32).
    pub prp1: u64,
    /// PRP Entry 2 (SQE bytes 32..40): 0, a data page, or a PRP list pointer.
    pub prp2: u64,
    /// List pages written (0 when PRP2 is unused or a data pointer).
    pub list_pages: usize,
}

/// Memory that PRP lists are written into: page-aligned list pages with
/// device addresses.
pub trait PrpListMemory {
    /// Number of list pages available.
    fn list_pages(&self) -> usize;
    /// Device address of list page `index` (memory-page aligned).
    fn list_page_addr(&self, index: usize) -> u64;
    /// Writes entry `slot` of list page `index`.
    fn write_entry(&mut self, index: usize, slot: usize, value: u64);
}

/// A window of a [`DmaBuffer`] used as PRP list pages: `pages` list pages of
/// `page_size` bytes starting at byte `offset` (page aligned).
#[derive(Debug)]
pub struct DmaListPages<'a> {
    buf: &'a DmaBuffer,
    offset: usize,
    pages: usize,
    page_size: usize,
}

impl<'a> DmaListPages<'a> {
    /// A window already validated by [`DmaListPages::new`] over a larger
    /// range of the same buffer (the queue pair checks its whole list area
    /// once at creation, then takes per-command windows on the hot path).
    pub(crate) fn prevalidated(buf: &'a DmaBuffer, offset: usize, pages: usize, page_size: usize) -> Self {
        Self { buf, offset, pages, page_size }
    }

    /// Uses `pages` pages of `page_size` bytes of `buf` from byte `offset`.
    /// Returns `None` when the window does not fit in the buffer or is not
    /// page aligned in device addresses.
    pub fn new(buf: &'a DmaBuffer, offset: usize, pages: usize, page_size: usize) -> Option<Self> {
        let end = pages.checked_mul(page_size)?.checked_add(offset)?;
        if end > buf.len() || !offset.is_multiple_of(page_size) {
            return None;
        }
        for i in 0..pages {
            let at = offset + i * page_size;
            let base = buf.device_addr(at).ok()?;
            if base % page_size as u64 != 0 {
                return None;
            }
            // Each list page must also be contiguous in device space.
            let mut o = HOST_PAGE_SIZE;
            while o < page_size {
                if buf.device_addr(at + o).ok()? != base + o as u64 {
                    return None;
                }
                o += HOST_PAGE_SIZE;
            }
        }
        Some(Self { buf, offset, pages, page_size })
    }
}

impl PrpListMemory for DmaListPages<'_> {
    fn list_pages(&self) -> usize {
        self.pages
    }
    fn list_page_addr(&self, index: usize) -> u64 {
        // In bounds by construction (checked in `new`); 0 is never used as
        // a list address by the builder for an out-of-range index.
        self.buf.device_addr(self.offset + index * self.page_size).unwrap_or(0)
    }
    fn write_entry(&mut self, index: usize, slot: usize, value: u64) {
        let at = self.offset + index * self.page_size + slot * 8;
        // Relaxed: the doorbell's Release store publishes the list together
        // with the SQE.
        let _ = self.buf.store_u64(at, value, Ordering::Relaxed);
    }
}

/// Builds PRP1/PRP2 (and lists) for a memory page size chosen in CC.MPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrpBuilder {
    page_size: usize,
}

impl PrpBuilder {
    /// A builder for memory pages of `page_size` bytes (`2^(12 + CC.MPS)`).
    pub fn new(page_size: usize) -> Result<Self, PrpError> {
        if !page_size.is_power_of_two() || !(4096..=1 << 27).contains(&page_size) {
            return Err(PrpError::BadPageSize(page_size));
        }
        Ok(Self { page_size })
    }

    /// Memory page size in bytes.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Number of PRP list pages a transfer of `len` bytes starting at device
    /// address `first_addr` needs (0 when PRP2 is unused or a data pointer).
    pub fn list_pages_needed(&self, first_addr: u64, len: usize) -> usize {
        let entries = self.entries_after_first(first_addr, len);
        let per_page = self.page_size / 8;
        if entries <= 1 {
            0
        } else if entries <= per_page {
            1
        } else {
            // Every list page but the last gives one slot to the chain
            // pointer: (per_page - 1) data entries each, the last up to
            // per_page.
            (entries - 1).div_ceil(per_page - 1)
        }
    }

    /// Memory pages after PRP1's page that the transfer touches.
    fn entries_after_first(&self, first_addr: u64, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        let in_first = self.page_size - (first_addr as usize & (self.page_size - 1));
        // page_size is a power of two (`new`): a shift, not a division, on
        // every command.
        let shift = self.page_size.trailing_zeros();
        (len.saturating_sub(in_first) + self.page_size - 1) >> shift
    }

    /// Describes `len` bytes at byte `offset` of the mapped buffer
    /// `mapping`, writing any PRP list into `list`.
    ///
    /// Errors: [`PrpError::ZeroLength`], [`PrpError::OutOfBuffer`],
    /// [`PrpError::Misaligned`] (PRP1 not dword aligned),
    /// [`PrpError::NotDescribable`], [`PrpError::ListTooSmall`].
    pub fn build(
        &self,
        mapping: &DmaMapping,
        offset: usize,
        len: usize,
        list: &mut dyn PrpListMemory,
    ) -> Result<Prp, PrpError> {
        if len == 0 {
            return Err(PrpError::ZeroLength);
        }
        let buffer_len = mapping.len();
        let oob = PrpError::OutOfBuffer { offset, len, buffer_len };
        match offset.checked_add(len) {
            Some(end) if end <= buffer_len => {}
            _ => return Err(oob),
        }
        let addr = |off: usize| mapping.addr(off).ok_or(oob.clone());
        let prp1 = addr(offset)?;
        if prp1 % 4 != 0 {
            return Err(PrpError::Misaligned { addr: prp1 });
        }
        let page = self.page_size;
        let mask = page as u64 - 1;
        let in_first = page - (prp1 & mask) as usize;
        self.check_contiguous(mapping, offset, prp1, in_first.min(len))?;

        let entries = self.entries_after_first(prp1, len);
        // Device address of data entry `i` (0-based, after PRP1), checked.
        let entry = |i: usize| -> Result<u64, PrpError> {
            let t = in_first + i * page;
            let a = addr(offset + t)?;
            if a & mask != 0 {
                return Err(PrpError::NotDescribable { offset: t, addr: a });
            }
            self.check_contiguous(mapping, offset + t, a, page.min(len - t))?;
            Ok(a)
        };

        match entries {
            0 => Ok(Prp { prp1, prp2: 0, list_pages: 0 }),
            1 => Ok(Prp { prp1, prp2: entry(0)?, list_pages: 0 }),
            _ => {
                let needed = self.list_pages_needed(prp1, len);
                if needed > list.list_pages() {
                    return Err(PrpError::ListTooSmall { needed, available: list.list_pages() });
                }
                let per_page = page / 8;
                let (mut lp, mut slot) = (0usize, 0usize);
                for i in 0..entries {
                    let remaining = entries - i;
                    if slot == per_page - 1 && remaining > 1 {
                        // Last slot of a full list page with more than one
                        // entry still to go: chain to the next list page.
                        list.write_entry(lp, slot, list.list_page_addr(lp + 1));
                        lp += 1;
                        slot = 0;
                    }
                    list.write_entry(lp, slot, entry(i)?);
                    slot += 1;
                }
                Ok(Prp { prp1, prp2: list.list_page_addr(0), list_pages: needed })
            }
        }
    }

    /// Checks that `len` bytes from transfer byte `offset` (device address
    /// `start`) are contiguous in device space. Host pages are 4 KiB, so
    /// only memory pages larger than that need the walk.
    fn check_contiguous(
        &self,
        mapping: &DmaMapping,
        offset: usize,
        start: u64,
        len: usize,
    ) -> Result<(), PrpError> {
        if self.page_size == HOST_PAGE_SIZE {
            return Ok(());
        }
        let mut o = HOST_PAGE_SIZE - (offset % HOST_PAGE_SIZE);
        while o < len {
            let a = mapping.addr(offset + o).unwrap_or(u64::MAX);
            if a != start + o as u64 {
                return Err(PrpError::NotDescribable { offset: offset + o, addr: a });
            }
            o += HOST_PAGE_SIZE;
        }
        Ok(())
    }
}

/// No PRP list memory: for queues whose largest transfer never needs a
/// list (two memory pages or less).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoListPages;

impl PrpListMemory for NoListPages {
    fn list_pages(&self) -> usize {
        0
    }
    fn list_page_addr(&self, _index: usize) -> u64 {
        0
    }
    fn write_entry(&mut self, _index: usize, _slot: usize, _value: u64) {}
}

/// PRP list memory in a plain `Vec`, for tests and for computing lists
/// before copying them into DMA memory.
#[derive(Debug, Clone)]
pub struct VecListPages {
    /// Device address of each list page.
    pub addrs: Vec<u64>,
    /// Entries of each list page.
    pub pages: Vec<Vec<u64>>,
}

impl VecListPages {
    /// `count` list pages of `page_size` bytes at consecutive device
    /// addresses from `base`.
    pub fn new(base: u64, count: usize, page_size: usize) -> Self {
        Self {
            addrs: (0..count as u64).map(|i| base + i * page_size as u64).collect(),
            pages: vec![vec![0; page_size / 8]; count],
        }
    }
}

impl PrpListMemory for VecListPages {
    fn list_pages(&self) -> usize {
        self.addrs.len()
    }
    fn list_page_addr(&self, index: usize) -> u64 {
        self.addrs.get(index).copied().unwrap_or(0)
    }
    fn write_entry(&mut self, index: usize, slot: usize, value: u64) {
        if let Some(e) = self.pages.get_mut(index).and_then(|p| p.get_mut(slot)) {
            *e = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BASE: u64 = 0x1_0000_0000;
    const LIST: u64 = 0x2_0000_0000;

    fn build(addr_off: usize, len: usize) -> (Prp, VecListPages) {
        let mapping = DmaMapping::contiguous(BASE, 4 << 20);
        let mut list = VecListPages::new(LIST, 4, 4096);
        let prp = PrpBuilder::new(4096).unwrap().build(&mapping, addr_off, len, &mut list).unwrap();
        (prp, list)
    }

    #[test]
    fn worked_12k_from_offset_0x200_uses_a_list() {
        let (prp, list) = build(0x200, 12 * 1024);
        assert_eq!(prp.prp1, 0x1_0000_0200);
        assert_eq!(prp.prp2, LIST);
        assert_eq!(prp.list_pages, 1);
        assert_eq!(&list.pages[0][..4], &[0x1_0000_1000, 0x1_0000_2000, 0x1_0000_3000, 0]);
    }

    #[test]
    fn worked_4k_from_offset_0x200_uses_prp2_as_data() {
        let (prp, list) = build(0x200, 4096);
        assert_eq!(prp, Prp { prp1: 0x1_0000_0200, prp2: 0x1_0000_1000, list_pages: 0 });
        assert!(list.pages[0].iter().all(|&e| e == 0));
    }

    #[test]
    fn worked_3584_from_offset_0x200_fits_prp1() {
        let (prp, _) = build(0x200, 3584);
        assert_eq!(prp, Prp { prp1: 0x1_0000_0200, prp2: 0, list_pages: 0 });
        // One more byte crosses into the next page.
        let (prp, _) = build(0x200, 3585);
        assert_eq!(prp.prp2, 0x1_0000_1000);
    }

    #[test]
    fn worked_2mib_plus_8k_chains_two_list_pages() {
        let (prp, list) = build(0, (2 << 20) + 8192);
        assert_eq!(prp.prp1, BASE);
        assert_eq!(prp.prp2, LIST);
        assert_eq!(prp.list_pages, 2);
        let p0 = &list.pages[0];
        for (i, &e) in p0[..511].iter().enumerate() {
            assert_eq!(e, BASE + (i as u64 + 1) * 4096);
        }
        assert_eq!(p0[511], LIST + 4096, "last slot chains to the second list page");
        assert_eq!(&list.pages[1][..3], &[BASE + 512 * 4096, BASE + 513 * 4096, 0]);
    }

    #[test]
    fn exactly_one_full_list_page_has_no_chain() {
        // PRP1 + 512 entries: 513 pages, the list page is full of data.
        let (prp, list) = build(0, 513 * 4096);
        assert_eq!(prp.list_pages, 1);
        assert_eq!(list.pages[0][511], BASE + 512 * 4096);
    }

    #[test]
    fn errors() {
        let mapping = DmaMapping::contiguous(BASE, 8192);
        let b = PrpBuilder::new(4096).unwrap();
        let mut list = VecListPages::new(LIST, 1, 4096);
        assert_eq!(b.build(&mapping, 0, 0, &mut list), Err(PrpError::ZeroLength));
        assert!(matches!(b.build(&mapping, 4096, 4097, &mut list), Err(PrpError::OutOfBuffer { .. })));
        assert!(matches!(b.build(&mapping, usize::MAX, 2, &mut list), Err(PrpError::OutOfBuffer { .. })));
        assert_eq!(b.build(&mapping, 2, 8, &mut list), Err(PrpError::Misaligned { addr: BASE + 2 }));
        let big = DmaMapping::contiguous(BASE, 4 << 20);
        let mut empty = VecListPages::new(LIST, 0, 4096);
        assert_eq!(
            b.build(&big, 0, 3 * 4096, &mut empty),
            Err(PrpError::ListTooSmall { needed: 1, available: 0 })
        );
        assert!(PrpBuilder::new(2048).is_err());
        assert!(PrpBuilder::new(12288).is_err());
    }

    #[test]
    fn non_contiguous_pages_with_large_memory_pages_are_refused() {
        // 8 KiB memory pages over host pages mapped one by one out of order.
        let mapping = DmaMapping::from_pages(vec![0x10000, 0x30000, 0x20000, 0x22000]);
        let b = PrpBuilder::new(8192).unwrap();
        let mut list = VecListPages::new(LIST, 1, 8192);
        assert!(matches!(b.build(&mapping, 0, 8192, &mut list), Err(PrpError::NotDescribable { .. })));
        // Host pages with per-page addresses are fine at 4 KiB.
        let b4 = PrpBuilder::new(4096).unwrap();
        let prp = b4.build(&mapping, 0, 3 * 4096, &mut list).unwrap();
        assert_eq!(prp.prp1, 0x10000);
        assert_eq!(&list.pages[0][..2], &[0x30000, 0x20000]);
    }

    proptest! {
        /// Walking the built PRPs the way a controller does yields exactly
        /// the device addresses of the transfer, in order.
        #[test]
        fn walk_matches_transfer(dw_off in 0usize..2048, len in 1usize..(3 << 20), shift in 0u32..3) {
            let page = 4096usize << shift;
            let offset = dw_off * 4;
            let mapping = DmaMapping::contiguous(BASE, 4 << 20);
            prop_assume!(offset + len <= mapping.len());
            let b = PrpBuilder::new(page).unwrap();
            let mut list = VecListPages::new(LIST, 8, page);
            let prp = b.build(&mapping, offset, len, &mut list).unwrap();
            prop_assert_eq!(prp.list_pages, b.list_pages_needed(prp.prp1, len));
            // Controller-side walk.
            let per = page / 8;
            let mut pages = vec![prp.prp1];
            let in_first = page - (prp.prp1 as usize % page);
            let n = len.saturating_sub(in_first).div_ceil(page);
            if n == 1 { pages.push(prp.prp2); }
            if n > 1 {
                let (mut lp, mut slot, mut got) = (0usize, 0usize, 0usize);
                prop_assert_eq!(prp.prp2, LIST);
                while got < n {
                    let e = list.pages[lp][slot];
                    if slot == per - 1 && n - got > 1 {
                        prop_assert_eq!(e, list.addrs[lp + 1]);
                        lp += 1; slot = 0; continue;
                    }
                    pages.push(e); got += 1; slot += 1;
                }
            }
            for (i, &p) in pages.iter().enumerate().skip(1) {
                prop_assert_eq!(p, BASE + (offset + in_first + (i - 1) * page) as u64);
                prop_assert_eq!(p % page as u64, 0);
            }
        }
    }
}
