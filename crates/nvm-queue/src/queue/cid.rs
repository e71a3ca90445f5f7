//! Command identifiers: slot index plus generation, so that a completion can
//! never finish the wrong request.
//!
//! A CID (CDW0 bits 31:16, NVMe Base 2.0 4.2) is 16 bits: the low
//! `index_bits` name a slot of the outstanding-command table, the rest carry
//! that slot's generation, bumped on every allocation. A completion whose
//! slot is free, or whose generation differs, is a protocol error (a
//! duplicate, stale or invented CID), never a completion of whatever
//! command holds the slot now. Slots are independent of SQ slots: the SQ
//! head can move past commands that are still outstanding (SQHD reports
//! fetches, not completions).

/// A command-ID table for up to `capacity` outstanding commands.
#[derive(Debug)]
pub struct CidTable<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u16>,
    index_bits: u32,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u16,
    value: Option<T>,
}

/// Why a CID from a completion does not match an outstanding command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CidError {
    /// The CID's slot index is beyond the table.
    #[error("CID {cid:#06x} names no command slot")]
    Unknown {
        /// The CID from the CQE.
        cid: u16,
    },
    /// The slot is free or holds a later command: a duplicate or stale CID.
    #[error("CID {cid:#06x} does not match an outstanding command (duplicate or stale)")]
    Stale {
        /// The CID from the CQE.
        cid: u16,
    },
}

impl<T> CidTable<T> {
    /// A table for `capacity` (1..=32768) outstanding commands.
    pub fn new(capacity: u16) -> Option<Self> {
        if capacity == 0 || capacity > 32768 {
            return None;
        }
        let index_bits = u32::from(capacity).next_power_of_two().trailing_zeros();
        Some(Self {
            slots: (0..capacity).map(|_| Slot { generation: 0, value: None }).collect(),
            // Pop from the end: hand out low slots first.
            free: (0..capacity).rev().collect(),
            index_bits,
        })
    }

    /// Maximum number of outstanding commands.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Number of outstanding commands.
    pub fn outstanding(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// `true` when no CID is free.
    pub fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    fn generation_mask(&self) -> u16 {
        (u32::from(u16::MAX) >> self.index_bits) as u16
    }

    /// Allocates a CID for a new command carrying `value`; `None` when full.
    pub fn alloc(&mut self, value: T) -> Option<u16> {
        let index = self.free.pop()?;
        let mask = self.generation_mask();
        let index_bits = self.index_bits;
        let slot = &mut self.slots[usize::from(index)];
        slot.generation = slot.generation.wrapping_add(1) & mask;
        // CID FFFFh is reserved (the Error Information log uses it for
        // "no command"): skip the generation that would produce it.
        if ((u32::from(slot.generation) << index_bits) | u32::from(index)) as u16 == u16::MAX {
            slot.generation = slot.generation.wrapping_add(1) & mask;
        }
        slot.value = Some(value);
        let generation = slot.generation;
        Some(self.cid(index, generation))
    }

    fn cid(&self, index: u16, generation: u16) -> u16 {
        ((u32::from(generation) << self.index_bits) | u32::from(index)) as u16
    }

    fn lookup(&self, cid: u16) -> Result<usize, CidError> {
        let index = usize::from(cid) & ((1usize << self.index_bits) - 1);
        let generation = (u32::from(cid) >> self.index_bits) as u16;
        let slot = self.slots.get(index).ok_or(CidError::Unknown { cid })?;
        if slot.value.is_none() || slot.generation != generation {
            return Err(CidError::Stale { cid });
        }
        Ok(index)
    }

    /// The value of the outstanding command `cid`.
    pub fn get(&self, cid: u16) -> Result<&T, CidError> {
        let i = self.lookup(cid)?;
        self.slots[i].value.as_ref().ok_or(CidError::Stale { cid })
    }

    /// Finishes command `cid`, returning its value; the CID becomes stale.
    pub fn release(&mut self, cid: u16) -> Result<T, CidError> {
        let i = self.lookup(cid)?;
        let v = self.slots[i].value.take().ok_or(CidError::Stale { cid })?;
        self.free.push(i as u16);
        Ok(v)
    }

    /// Slot index of `cid` (for per-command resources such as PRP lists),
    /// checked.
    pub fn slot_of(&self, cid: u16) -> Result<usize, CidError> {
        self.lookup(cid)
    }

    /// Iterates over `(cid, value)` of outstanding commands.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &T)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_ref().map(|v| (self.cid(i as u16, s.generation), v)))
    }

    /// Removes every outstanding command (after a controller reset).
    pub fn drain(&mut self) -> Vec<(u16, T)> {
        let mut out = Vec::new();
        for i in 0..self.slots.len() {
            if let Some(v) = self.slots[i].value.take() {
                out.push((self.cid(i as u16, self.slots[i].generation), v));
                self.free.push(i as u16);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stale_and_duplicate_cids_are_caught() {
        let mut t = CidTable::new(4).unwrap();
        let a = t.alloc("a").unwrap();
        assert_eq!(t.release(a), Ok("a"));
        assert_eq!(t.release(a), Err(CidError::Stale { cid: a }), "duplicate completion");
        let b = t.alloc("b").unwrap();
        assert_eq!(a & 3, b & 3, "same slot reused");
        assert_ne!(a, b, "with a new generation");
        assert_eq!(t.get(a), Err(CidError::Stale { cid: a }));
        assert_eq!(t.get(b), Ok(&"b"));
    }

    #[test]
    fn cid_ffff_is_never_issued() {
        let mut t = CidTable::new(32).unwrap();
        for _ in 0..100_000 {
            let c = t.alloc(()).unwrap();
            assert_ne!(c, 0xFFFF);
            t.release(c).unwrap();
        }
        // Exhaust slots so the top slot (31) is used too.
        let cids: Vec<_> = (0..32).map(|_| t.alloc(()).unwrap()).collect();
        for _ in 0..5000 {
            for &c in &cids {
                let _ = t.release(c);
            }
            for _ in 0..32 {
                assert_ne!(t.alloc(()).unwrap(), 0xFFFF);
            }
            let all: Vec<_> = t.iter().map(|(c, _)| c).collect();
            for c in all {
                t.release(c).unwrap();
            }
        }
    }

    #[test]
    fn capacity_limits() {
        assert!(CidTable::<()>::new(0).is_none());
        let mut t = CidTable::new(3).unwrap();
        let cids: Vec<_> = (0..3).map(|i| t.alloc(i).unwrap()).collect();
        assert!(t.alloc(9).is_none());
        assert!(t.is_full());
        // Index bits = 2; slot 3 does not exist.
        assert_eq!(t.get(3 | (1 << 2)), Err(CidError::Unknown { cid: 3 | (1 << 2) }));
        assert_eq!(t.drain().len(), 3);
        assert!(cids.iter().all(|&c| t.get(c).is_err()));
    }

    proptest! {
        /// Whatever the sequence, a CID resolves only to the command it was
        /// minted for, and only while that command is outstanding.
        #[test]
        fn cids_never_alias(ops in proptest::collection::vec(any::<(bool, u8)>(), 1..2000)) {
            let mut t = CidTable::new(8).unwrap();
            let mut live: Vec<(u16, u32)> = Vec::new();
            let mut dead: Vec<u16> = Vec::new();
            for (n, (alloc, pick)) in ops.into_iter().enumerate() {
                if alloc {
                    if let Some(c) = t.alloc(n as u32) { live.push((c, n as u32)); }
                } else if !live.is_empty() {
                    let (c, v) = live.remove(usize::from(pick) % live.len());
                    prop_assert_eq!(t.release(c), Ok(v));
                    dead.push(c);
                }
                for &(c, v) in &live { prop_assert_eq!(t.get(c), Ok(&v)); }
                for &d in dead.iter().rev().take(16) {
                    if !live.iter().any(|&(c, _)| c == d) { prop_assert!(t.get(d).is_err()); }
                }
            }
        }
    }
}
