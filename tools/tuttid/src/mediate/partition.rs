//! A tenant's LBA partition: the blocks of the drive's namespace its
//! commands reach (SLBA .. SLBA + NLB + 1, NLB zero-based as on the wire,
//! NVMe NVM Command Set 2.0, 3.2.4). The tenant sees its partition as a
//! namespace of its own: LBAs `0 .. blocks` (what `DriveFacts` reports),
//! which the daemon moves by `first` in the controller's copy of each
//! command.

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

    /// The namespace LBA of the tenant's LBA `slba` when `count` blocks
    /// from it lie inside the partition (`None` otherwise; a range that
    /// wraps past `u64::MAX` is outside).
    pub fn translate(&self, slba: u64, count: u64) -> Option<u64> {
        slba.checked_add(count).filter(|e| *e <= self.blocks)?;
        self.first.checked_add(slba)
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
        assert_eq!(
            (p.translate(0, 50), p.translate(49, 1), p.translate(20, 0)),
            (Some(100), Some(149), Some(120))
        );
        assert_eq!((p.translate(49, 2), p.translate(50, 1), p.translate(u64::MAX, 2)), (None, None, None));
        assert_eq!(
            (Partition::whole(8).translate(0, 8), Partition::whole(8).translate(0, 9)),
            (Some(0), None)
        );
        assert!(p.overlaps(&Partition { first: 149, blocks: 1 }));
        assert!(!p.overlaps(&Partition { first: 150, blocks: 10 }));
        assert!(!p.overlaps(&Partition { first: 0, blocks: 100 }));
    }
}
