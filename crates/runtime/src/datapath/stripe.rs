//! The striping math: a linear byte space laid over `drives` drives in
//! `unit`-byte stripe units, round robin (RAID-0 layout).
//!
//! Byte `x` of the space lives on drive `(x / unit) % drives` at drive byte
//! `(x / (unit * drives)) * unit + x % unit`.

/// One piece of a request on one drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index of the drive in the datapath's drive list.
    pub drive: usize,
    /// Byte offset on that drive's namespace.
    pub drive_offset: u64,
    /// Length, bytes.
    pub len: u64,
    /// Offset of this piece within the request, bytes.
    pub request_offset: u64,
}

/// A stripe layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeMap {
    unit: u64,
    drives: u64,
}

impl StripeMap {
    /// `drives` (>= 1) drives with stripe units of `unit` (> 0) bytes.
    pub fn new(unit: u64, drives: usize) -> Option<Self> {
        (unit > 0 && drives > 0).then_some(Self { unit, drives: drives as u64 })
    }

    /// Capacity of the striped space over drives of `per_drive` bytes each:
    /// whole stripe rows only.
    pub fn capacity(&self, per_drive: u64) -> u64 {
        (per_drive / self.unit) * self.unit * self.drives
    }

    /// Calls `f` for each piece of `len` bytes at `offset`, in request
    /// order. A piece never crosses a stripe unit.
    pub fn for_each_piece(&self, offset: u64, len: u64, mut f: impl FnMut(Piece)) {
        let mut done = 0;
        while done < len {
            let x = offset + done;
            let unit_index = x / self.unit;
            let within = x % self.unit;
            let n = (self.unit - within).min(len - done);
            f(Piece {
                drive: (unit_index % self.drives) as usize,
                drive_offset: (unit_index / self.drives) * self.unit + within,
                len: n,
                request_offset: done,
            });
            done += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pieces(m: &StripeMap, off: u64, len: u64) -> Vec<Piece> {
        let mut v = Vec::new();
        m.for_each_piece(off, len, |p| v.push(p));
        v
    }

    #[test]
    fn worked_example_100k_plus_300k_over_four_drives() {
        // 128 KiB unit, 512-byte blocks: drive 0 SLBA 200 x 56 blocks,
        // drives 1 and 2 SLBA 0 x 256, drive 3 SLBA 0 x 32.
        let m = StripeMap::new(128 << 10, 4).unwrap();
        let p = pieces(&m, 100 << 10, 300 << 10);
        let lba: Vec<_> = p.iter().map(|p| (p.drive, p.drive_offset / 512, p.len / 512)).collect();
        assert_eq!(lba, vec![(0, 200, 56), (1, 0, 256), (2, 0, 256), (3, 0, 32)]);
        // Offset 896 KiB, 384 KiB: drives 3, 0, 1 only.
        let p = pieces(&m, 896 << 10, 384 << 10);
        let d: Vec<_> = p.iter().map(|p| (p.drive, p.drive_offset >> 10, p.len >> 10)).collect();
        assert_eq!(d, vec![(3, 128, 128), (0, 256, 128), (1, 256, 128)]);
    }

    proptest! {
        /// Pieces tile the request exactly and land where the formula says.
        #[test]
        fn pieces_tile_the_request(unit_k in 1u64..64, drives in 1usize..=4, off in 0u64..(1<<22), len in 1u64..(1<<22)) {
            let unit = unit_k * 4096;
            let m = StripeMap::new(unit, drives).unwrap();
            let mut next = 0;
            for p in pieces(&m, off, len) {
                prop_assert_eq!(p.request_offset, next);
                let x = off + p.request_offset;
                prop_assert_eq!(p.drive as u64, (x / unit) % drives as u64);
                prop_assert_eq!(p.drive_offset, (x / (unit * drives as u64)) * unit + x % unit);
                prop_assert!(p.len > 0 && (x % unit) + p.len <= unit);
                next += p.len;
            }
            prop_assert_eq!(next, len);
        }
    }
}
