//! The IOVA allocator: hands out device (I/O virtual) addresses for DMA
//! mappings inside the ranges the IOMMU accepts, and reuses freed space.
//!
//! Pure logic, no system calls. The valid ranges come from
//! `VFIO_IOMMU_GET_INFO`'s `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`
//! capability (Linux `include/uapi/linux/vfio.h`, kernel 5.4+), which
//! already excludes reserved regions such as the x86 MSI window; without
//! it, [`fallback_ranges`] is used.

use std::collections::BTreeMap;

/// Allocation granule and minimum alignment, bytes (the IOMMU page).
pub const IOVA_PAGE: u64 = 4096;

/// Largest alignment given to an allocation, bytes: allocations are
/// aligned to their size rounded up to a power of two, up to this, so that
/// the IOMMU can use large pages and queue memory is aligned to any NVMe
/// memory page size up to 2 MiB.
pub const MAX_NATURAL_ALIGN: u64 = 2 << 20;

/// Lowest IOVA handed out: the first 1 MiB is left unused so that a zero
/// or small bogus address in a command can never reach mapped memory.
pub const IOVA_FLOOR: u64 = 1 << 20;

/// The x86 interrupt (MSI) window, 0xFEE0_0000..=0xFEEF_FFFF: DMA writes
/// there are interrupts, never memory.
pub const MSI_WINDOW: (u64, u64) = (0xFEE0_0000, 0xFEEF_FFFF);

/// Ranges used when the kernel reports none: [`IOVA_FLOOR`] up to 2^39
/// (the smallest address width of common IOMMUs, e.g. VT-d with 3-level
/// tables and QEMU's default `aw-bits=39`), without [`MSI_WINDOW`].
/// Inclusive (start, end) pairs.
pub fn fallback_ranges() -> Vec<(u64, u64)> {
    vec![(IOVA_FLOOR, MSI_WINDOW.0 - 1), (MSI_WINDOW.1 + 1, (1u64 << 39) - 1)]
}

/// Why an allocation or free failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IovaError {
    /// No free range is large enough.
    #[error("no free IOVA range of {len:#x} bytes")]
    Exhausted {
        /// Requested length in bytes.
        len: u64,
    },
    /// Zero length.
    #[error("zero-length IOVA allocation")]
    ZeroLength,
    /// Freeing an address that is not the start of an allocation.
    #[error("no IOVA allocation starts at {iova:#x}")]
    NotAllocated {
        /// The address.
        iova: u64,
    },
}

/// A first-fit allocator over a set of inclusive address ranges.
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    /// Free extents: start -> length (bytes), non-overlapping, coalesced
    /// only within one source range.
    free: BTreeMap<u64, u64>,
    /// Live allocations: start -> length (bytes).
    used: BTreeMap<u64, u64>,
    /// The usable ranges (page-aligned, inclusive ends), for coalescing.
    ranges: Vec<(u64, u64)>,
}

impl IovaAllocator {
    /// An allocator over `ranges` (inclusive `(start, end)` pairs, as VFIO
    /// reports them). Each range is clipped to start at [`IOVA_FLOOR`] and
    /// shrunk to whole [`IOVA_PAGE`]s; overlapping input is merged; ranges
    /// left empty are dropped.
    pub fn new(ranges: &[(u64, u64)]) -> Self {
        let mut rs: Vec<(u64, u64)> = ranges
            .iter()
            .filter_map(|&(s, e)| {
                let s = s.max(IOVA_FLOOR).checked_next_multiple_of(IOVA_PAGE)?;
                // Last byte of the last whole page inside the range.
                let e_excl = e.checked_add(1).map_or(u64::MAX - (IOVA_PAGE - 1), |x| x - x % IOVA_PAGE);
                (e_excl > s).then(|| (s, e_excl - 1))
            })
            .collect();
        rs.sort();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in rs {
            match merged.last_mut() {
                Some(last) if s <= last.1.saturating_add(1) => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let free = merged.iter().map(|&(s, e)| (s, e - s + 1)).collect();
        Self { free, used: BTreeMap::new(), ranges: merged }
    }

    /// The usable ranges after clipping, inclusive.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Allocates `len` bytes (rounded up to [`IOVA_PAGE`]) aligned to their
    /// size's next power of two, at most [`MAX_NATURAL_ALIGN`]. Returns the
    /// start address.
    pub fn alloc(&mut self, len: u64) -> Result<u64, IovaError> {
        if len == 0 {
            return Err(IovaError::ZeroLength);
        }
        let len = len.checked_next_multiple_of(IOVA_PAGE).ok_or(IovaError::Exhausted { len })?;
        let align =
            len.checked_next_power_of_two().unwrap_or(MAX_NATURAL_ALIGN).clamp(IOVA_PAGE, MAX_NATURAL_ALIGN);
        let mut found = None;
        for (&start, &flen) in &self.free {
            let Some(a) = start.checked_next_multiple_of(align) else { continue };
            let pad = a - start;
            if flen >= pad && flen - pad >= len {
                found = Some((start, flen, a));
                break;
            }
        }
        let (start, flen, a) = found.ok_or(IovaError::Exhausted { len })?;
        self.free.remove(&start);
        if a > start {
            self.free.insert(start, a - start);
        }
        let end = a + len;
        let fend = start + flen;
        if fend > end {
            self.free.insert(end, fend - end);
        }
        self.used.insert(a, len);
        Ok(a)
    }

    /// Length in bytes of the allocation starting at `iova`.
    pub fn len_of(&self, iova: u64) -> Option<u64> {
        self.used.get(&iova).copied()
    }

    /// Frees the allocation starting at `iova`, merging it with free
    /// neighbours in the same range. Returns its length in bytes.
    pub fn free(&mut self, iova: u64) -> Result<u64, IovaError> {
        let len = self.used.remove(&iova).ok_or(IovaError::NotAllocated { iova })?;
        let (mut s, mut e) = (iova, iova + len);
        let range = self.ranges.iter().find(|r| r.0 <= iova && iova <= r.1).copied();
        let same_range = |a: u64| range.is_some_and(|r| r.0 <= a && a <= r.1);
        if let Some((&ps, &pl)) = self.free.range(..s).next_back() {
            if ps + pl == s && same_range(ps) {
                self.free.remove(&ps);
                s = ps;
            }
        }
        if let Some(&nl) = self.free.get(&e) {
            if same_range(e) {
                self.free.remove(&e);
                e += nl;
            }
        }
        self.free.insert(s, e - s);
        Ok(len)
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// Live allocations, (start, length) in address order.
    pub fn allocations(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.used.iter().map(|(&s, &l)| (s, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fallback_avoids_msi_window_and_floor() {
        let a = IovaAllocator::new(&fallback_ranges());
        assert_eq!(a.ranges()[0], (IOVA_FLOOR, 0xFEDF_FFFF));
        assert_eq!(a.ranges()[1].0, 0xFEF0_0000);
        assert_eq!(a.ranges()[1].1, (1 << 39) - 1);
    }

    #[test]
    fn alignment_and_reuse() {
        let mut a = IovaAllocator::new(&[(0, 0xFFFF_FFFF)]);
        let x = a.alloc(4096).unwrap();
        assert_eq!(x, IOVA_FLOOR);
        let y = a.alloc(64 << 10).unwrap();
        assert_eq!(y % (64 << 10), 0);
        let z = a.alloc(5 << 20).unwrap();
        assert_eq!(z % MAX_NATURAL_ALIGN, 0);
        assert_eq!(a.len_of(z), Some(5 << 20));
        assert_eq!(a.free(y).unwrap(), 64 << 10);
        assert_eq!(a.alloc(64 << 10).unwrap(), y, "freed space is reused");
        assert!(matches!(a.free(y + 4096), Err(IovaError::NotAllocated { .. })));
        assert_eq!(a.alloc(0), Err(IovaError::ZeroLength));
    }

    #[test]
    fn exhaustion_and_unaligned_ranges() {
        // A range of 3 whole pages once clipped (start rounded up, end down).
        let mut a = IovaAllocator::new(&[(IOVA_FLOOR + 1, IOVA_FLOOR + 4 * 4096 + 100)]);
        assert_eq!(a.ranges(), &[(IOVA_FLOOR + 4096, IOVA_FLOOR + 4 * 4096 - 1)]);
        assert!(a.alloc(4 * 4096).is_err());
        let p = [a.alloc(4096).unwrap(), a.alloc(4096).unwrap(), a.alloc(4096).unwrap()];
        assert_eq!(a.alloc(4096), Err(IovaError::Exhausted { len: 4096 }));
        for x in p {
            a.free(x).unwrap();
        }
        assert_eq!(a.free_bytes(), 3 * 4096);
        // Below the floor only: nothing usable.
        assert!(IovaAllocator::new(&[(0, 0xFFFF)]).ranges().is_empty());
        // A range reaching u64::MAX does not overflow.
        let mut b = IovaAllocator::new(&[(u64::MAX - (1 << 30), u64::MAX)]);
        assert!(b.alloc(1 << 20).is_ok());
    }

    /// The model: a set of live (start, len) allocations.
    fn check(
        a: &IovaAllocator,
        ranges: &[(u64, u64)],
        live: &BTreeMap<u64, u64>,
    ) -> Result<(), TestCaseError> {
        let got: BTreeMap<u64, u64> = a.allocations().collect();
        prop_assert_eq!(&got, live);
        let mut prev_end = 0u64;
        for (&s, &l) in live {
            prop_assert!(s >= prev_end, "overlap at {:#x}", s);
            prev_end = s + l;
            prop_assert!(s % IOVA_PAGE == 0 && l % IOVA_PAGE == 0);
            prop_assert!(
                ranges.iter().any(|&(rs, re)| rs <= s && s + l - 1 <= re),
                "outside ranges: {:#x}",
                s
            );
        }
        let total: u64 = a.ranges().iter().map(|&(s, e)| e - s + 1).sum();
        let used: u64 = live.values().sum();
        prop_assert_eq!(a.free_bytes() + used, total);
        Ok(())
    }

    proptest! {
        #[test]
        fn allocator_matches_model(
            ops in proptest::collection::vec((any::<bool>(), 1u64..(3 << 20), any::<prop::sample::Index>()), 1..200),
            gap in 0u64..(1 << 24),
        ) {
            let input = vec![(0, 0x7FF_FFFF), (0x800_0000 + gap, 0x800_0000 + gap + (16 << 20))];
            let mut a = IovaAllocator::new(&input);
            let ranges = a.ranges().to_vec();
            let mut live: BTreeMap<u64, u64> = BTreeMap::new();
            for (is_alloc, len, idx) in ops {
                if is_alloc || live.is_empty() {
                    match a.alloc(len) {
                        Ok(s) => { live.insert(s, len.next_multiple_of(IOVA_PAGE)); }
                        Err(IovaError::Exhausted { .. }) => {
                            // The model agrees: no gap between live
                            // allocations has room for an aligned fit.
                            let l = len.next_multiple_of(IOVA_PAGE);
                            let align = l.next_power_of_two().clamp(IOVA_PAGE, MAX_NATURAL_ALIGN);
                            for &(rs, re) in &ranges {
                                let mut cur = rs;
                                let mut ends: Vec<(u64, u64)> = live.range(rs..=re).map(|(&s, &l)| (s, s + l)).collect();
                                ends.push((re + 1, re + 1));
                                for (s, e) in ends {
                                    let a = cur.next_multiple_of(align);
                                    prop_assert!(a + l > s, "a fit at {:#x} was refused", a);
                                    cur = e;
                                }
                            }
                        }
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                } else {
                    let s = *live.keys().nth(idx.index(live.len())).unwrap();
                    prop_assert_eq!(a.free(s).unwrap(), live.remove(&s).unwrap());
                }
                check(&a, &ranges, &live)?;
            }
            // Everything freed: the whole space is one extent per range again,
            // so the largest allocation that fits the first range succeeds.
            for s in live.keys().copied().collect::<Vec<_>>() { a.free(s).unwrap(); }
            let total: u64 = ranges.iter().map(|&(s, e)| e - s + 1).sum();
            prop_assert_eq!(a.free_bytes(), total);
            prop_assert_eq!(a.free.len(), ranges.len());
            let first = ranges[0].1 - ranges[0].0 + 1;
            prop_assert!(a.alloc(first - MAX_NATURAL_ALIGN).is_ok());
        }
    }
}
