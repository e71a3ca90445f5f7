//! A tenant's LBA partition: the blocks of the drive's namespace its
//! commands may name (SLBA .. SLBA + NLB + 1, NLB zero-based as on the
//! wire, NVMe NVM Command Set 2.0, 3.2.4).

/// A run of logical blocks `[first, first + blocks)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// First LBA.
    pub first: u64,
    /// Length in logical blocks.
    pub blocks: u64,
}

impl Partition {
    /// The whole namespace of `blocks` blocks.
    pub fn whole(blocks: u64) -> Self {
        Self { first: 0, blocks }
    }

    /// One past the last LBA (saturating: a partition is never past
    /// `u64::MAX`).
    pub fn end(&self) -> u64 {
        self.first.saturating_add(self.blocks)
    }

    /// Whether `count` blocks from `slba` lie inside (no overflow: a
    /// range that wraps past `u64::MAX` is outside).
    pub fn contains(&self, slba: u64, count: u64) -> bool {
        slba >= self.first && slba.checked_add(count).is_some_and(|e| e <= self.end())
    }

    /// Whether two partitions share a block.
    pub fn overlaps(&self, other: &Partition) -> bool {
        self.first < other.end() && other.first < self.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_stay_inside_without_overflow() {
        let p = Partition { first: 100, blocks: 50 };
        assert!(p.contains(100, 50) && p.contains(149, 1) && p.contains(120, 0));
        assert!(!p.contains(99, 1) && !p.contains(149, 2) && !p.contains(150, 1));
        assert!(!p.contains(u64::MAX, 2), "wraps");
        assert!(Partition::whole(8).contains(0, 8) && !Partition::whole(8).contains(0, 9));
        assert!(p.overlaps(&Partition { first: 149, blocks: 1 }));
        assert!(!p.overlaps(&Partition { first: 150, blocks: 10 }));
        assert!(!p.overlaps(&Partition { first: 0, blocks: 100 }));
    }
}
