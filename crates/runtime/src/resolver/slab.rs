//! The `slab` resolver: the datapath's byte space divided into fixed-size
//! slots; the URI key is the slot number (`tutti://<store>/<slot>`).

use crate::binding::{Binding, Extent, ResolveError, Resolver, EXTENT_V1};

/// Fixed-size slots over a linear byte space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slab {
    slot_size: u64,
}

impl Slab {
    /// Slots of `slot_size` bytes (> 0).
    pub fn new(slot_size: u64) -> Option<Self> {
        (slot_size > 0).then_some(Self { slot_size })
    }

    /// Number of whole slots in `capacity` bytes.
    pub fn slots(&self, capacity: u64) -> u64 {
        capacity / self.slot_size
    }
}

impl Resolver for Slab {
    fn binding(&self) -> Binding {
        Binding::of::<Extent>(EXTENT_V1)
    }

    fn resolve(&self, key: &str, capacity: u64) -> Result<Extent, ResolveError> {
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ResolveError::NotASlotNumber { key: key.to_owned() });
        }
        let slot: u64 = key.parse().map_err(|_| ResolveError::SlotTooLarge { key: key.to_owned() })?;
        let slots = self.slots(capacity);
        if slot >= slots {
            return Err(ResolveError::SlotOutOfRange { slot, slots });
        }
        Ok(Extent { offset: slot * self.slot_size, len: self.slot_size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_map_to_extents() {
        let s = Slab::new(1 << 20).unwrap();
        assert_eq!(s.resolve("3", 10 << 20), Ok(Extent { offset: 3 << 20, len: 1 << 20 }));
        assert_eq!(s.resolve("10", 10 << 20), Err(ResolveError::SlotOutOfRange { slot: 10, slots: 10 }));
        assert!(matches!(s.resolve("-1", 10 << 20), Err(ResolveError::NotASlotNumber { .. })));
        assert!(matches!(s.resolve("+1", 10 << 20), Err(ResolveError::NotASlotNumber { .. })));
        assert!(matches!(s.resolve("", 10 << 20), Err(ResolveError::NotASlotNumber { .. })));
        assert!(matches!(
            s.resolve("99999999999999999999999", 10 << 20),
            Err(ResolveError::SlotTooLarge { .. })
        ));
        assert!(Slab::new(0).is_none());
    }
}
