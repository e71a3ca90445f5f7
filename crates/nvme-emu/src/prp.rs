//! PRP walking with the specification's validation (NVMe Base 2.0, 4.1.1
//! "Physical Region Page Entry and List"; Base 1.4 4.3).
//!
//! * PRP1 may carry an offset into its memory page, which must be dword
//!   aligned (bits 1:0 = 0), else PRP Offset Invalid.
//! * When the transfer fits in PRP1's page, PRP2 is not used. When it needs
//!   exactly one more page, PRP2 is a data pointer with offset 0.
//!   Otherwise PRP2 points to a PRP list (qword-aligned offset allowed).
//! * List entries are data pointers with offset 0. When more entries are
//!   needed than fit before the end of the list page, the last entry of
//!   that page points to the next list page (also offset 0).
//! * Any address (data or list) outside a mapped region is a Data Transfer
//!   Error.
//!
//! The walk is bounded by the transfer length: every list page after the
//! first is page aligned and so yields at least `page / 8 - 1` data
//! entries, and the walk stops once the length is covered.

use nvme_regs::status::generic;
use nvme_regs::Status;

use crate::dma::{DmaFault, DmaView};

/// One contiguous piece of a transfer: device address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub iova: u64,
    pub len: u32,
}

/// Why a PRP walk failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrpError {
    /// A PRP entry with a forbidden offset (Base 2.0 4.1.1).
    OffsetInvalid,
    /// A data page or list page outside every mapped region.
    Fault(DmaFault),
}

impl PrpError {
    /// The completion status for this error.
    pub(crate) fn status(self) -> Status {
        match self {
            PrpError::OffsetInvalid => Status::generic(generic::PRP_OFFSET_INVALID).with_dnr(true),
            PrpError::Fault(_) => Status::generic(generic::DATA_TRANSFER_ERROR).with_dnr(true),
        }
    }
}

impl From<DmaFault> for PrpError {
    fn from(f: DmaFault) -> Self {
        PrpError::Fault(f)
    }
}

/// Entries read from a list page at a time.
const LIST_CHUNK: usize = 64;

/// Walks `prp1`/`prp2` for a transfer of `len` bytes (`len > 0`) with
/// memory page size `page` (a power of two, at least 4 KiB), checks every
/// segment against the mapped regions, and stores the segments in `out`
/// (cleared first). No data is moved.
pub(crate) fn walk(
    dma: &DmaView<'_>,
    prp1: u64,
    prp2: u64,
    len: u64,
    page: u64,
    out: &mut Vec<Segment>,
) -> Result<(), PrpError> {
    out.clear();
    if len == 0 {
        return Ok(());
    }
    let mask = page - 1;
    if prp1 & 3 != 0 {
        return Err(PrpError::OffsetInvalid);
    }
    let first = len.min(page - (prp1 & mask));
    push(dma, out, prp1, first)?;
    let mut remaining = len - first;
    if remaining == 0 {
        return Ok(());
    }
    if remaining <= page {
        if prp2 & mask != 0 {
            return Err(PrpError::OffsetInvalid);
        }
        return push(dma, out, prp2, remaining);
    }
    // PRP2 is a list pointer.
    if prp2 & 7 != 0 {
        return Err(PrpError::OffsetInvalid);
    }
    let mut list = prp2;
    let mut chunk = [0u64; LIST_CHUNK];
    // Every list page yields at least one data entry or (only the first,
    // unaligned one) a chain pointer; bound the number of pages anyway.
    let max_pages = remaining.div_ceil(page) + 2;
    for _ in 0..max_pages {
        // Entries available in this list page.
        let slots = (page - (list & mask)) / 8;
        let needed = remaining.div_ceil(page);
        // Data entries in this page; if more are needed than slots, the
        // last slot is the pointer to the next list page.
        let (data, chained) = if needed <= slots { (needed, false) } else { (slots - 1, true) };
        let mut i = 0;
        while i < data {
            let n = (data - i).min(LIST_CHUNK as u64) as usize;
            let bytes = zerocopy::IntoBytes::as_mut_bytes(&mut chunk[..n]);
            dma.read(list + i * 8, bytes)?;
            for &e in &chunk[..n] {
                let e = u64::from_le(e);
                if e & mask != 0 {
                    return Err(PrpError::OffsetInvalid);
                }
                let l = remaining.min(page);
                push(dma, out, e, l)?;
                remaining -= l;
            }
            i += n as u64;
        }
        if !chained {
            return Ok(());
        }
        let mut next = [0u8; 8];
        dma.read(list + (slots - 1) * 8, &mut next)?;
        list = u64::from_le_bytes(next);
        if list & mask != 0 {
            return Err(PrpError::OffsetInvalid);
        }
    }
    // Unreachable for page >= 16 bytes; fail closed rather than loop.
    Err(PrpError::OffsetInvalid)
}

fn push(dma: &DmaView<'_>, out: &mut Vec<Segment>, iova: u64, len: u64) -> Result<(), PrpError> {
    dma.check(iova, len as usize)?;
    // Merge with the previous segment when contiguous (fewer copies).
    if let Some(last) = out.last_mut() {
        if last.iova.checked_add(u64::from(last.len)) == Some(iova)
            && u64::from(last.len) + len <= u64::from(u32::MAX)
        {
            last.len += len as u32;
            return Ok(());
        }
    }
    out.push(Segment { iova, len: len as u32 });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::{IovaSpace, IOVA_BASE};
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::ptr::NonNull;

    struct Mem {
        space: IovaSpace,
        p: NonNull<u8>,
        layout: Layout,
    }
    impl Mem {
        fn new(pages: usize) -> Self {
            let layout = Layout::from_size_align(pages * 4096, 4096).unwrap();
            // SAFETY: non-zero size.
            let p = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            let space = IovaSpace::new();
            space.map(p, pages * 4096, crate::SHARED_DOMAIN).unwrap();
            Mem { space, p, layout }
        }
        fn set_u64(&self, iova: u64, v: u64) {
            self.space.view().write(iova, &v.to_le_bytes()).unwrap();
        }
    }
    impl Drop for Mem {
        fn drop(&mut self) {
            // SAFETY: allocated in `new`; the space is dropped with us and is
            // not used afterwards.
            unsafe { dealloc(self.p.as_ptr(), self.layout) };
        }
    }
    const B: u64 = IOVA_BASE;
    const P: u64 = 4096;

    #[test]
    fn single_page_and_two_pages() {
        let m = Mem::new(8);
        let v = m.space.view();
        let mut out = Vec::new();
        walk(&v, B + 0x200, 0, 512, P, &mut out).unwrap();
        assert_eq!(out, [Segment { iova: B + 0x200, len: 512 }]);
        walk(&v, B + 0x200, B + 5 * P, P, P, &mut out).unwrap();
        assert_eq!(out, [Segment { iova: B + 0x200, len: 0xE00 }, Segment { iova: B + 5 * P, len: 0x200 }]);
        assert_eq!(walk(&v, B + 2, 0, 4, P, &mut out), Err(PrpError::OffsetInvalid));
        assert_eq!(walk(&v, B, B + 5 * P + 8, 2 * P, P, &mut out), Err(PrpError::OffsetInvalid));
        assert!(matches!(walk(&v, B + 8 * P, 0, 4, P, &mut out), Err(PrpError::Fault(_))));
    }

    #[test]
    fn list_and_chain() {
        let m = Mem::new(16);
        // List at page 1 offset 0xFF0: only 2 slots, so slot 2 chains to
        // page 2.
        let list = B + P + 0xFF0;
        m.set_u64(list, B + 8 * P);
        m.set_u64(list + 8, B + 2 * P);
        m.set_u64(B + 2 * P, B + 9 * P);
        m.set_u64(B + 2 * P + 8, B + 11 * P);
        let v = m.space.view();
        let mut out = Vec::new();
        walk(&v, B + 7 * P, list, 4 * P, P, &mut out).unwrap();
        assert_eq!(
            out,
            [Segment { iova: B + 7 * P, len: 3 * P as u32 }, Segment { iova: B + 11 * P, len: P as u32 }]
        );
        // Misaligned list pointer, unaligned data entry, unmapped entry.
        assert_eq!(walk(&v, B, B + P + 4, 3 * P, P, &mut out), Err(PrpError::OffsetInvalid));
        drop(v);
        m.set_u64(B + 3 * P, B + 4 * P + 0x10);
        let v = m.space.view();
        assert_eq!(walk(&v, B, B + 3 * P, 3 * P, P, &mut out), Err(PrpError::OffsetInvalid));
        drop(v);
        m.set_u64(B + 3 * P, B + 100 * P);
        let v = m.space.view();
        assert!(matches!(walk(&v, B, B + 3 * P, 3 * P, P, &mut out), Err(PrpError::Fault(_))));
    }

    #[test]
    fn self_referencing_chain_terminates() {
        let m = Mem::new(4);
        // Every entry of page 1 points to page 1 itself: the last one chains
        // back to the same list forever; entries are valid data pointers.
        for i in 0..512 {
            m.set_u64(B + P + i * 8, B + P);
        }
        let v = m.space.view();
        let mut out = Vec::new();
        let r = walk(&v, B, B + P, 4096 * P, P, &mut out);
        assert!(r.is_ok());
        assert_eq!(out.iter().map(|s| u64::from(s.len)).sum::<u64>(), 4096 * P);
    }
}
