//! Ring index arithmetic shared by submission and completion queues
//! (NVMe Base 2.0 section 3.3.1, "Circular Queues").
//!
//! A queue of `size` entries (`size` = QSIZE + 1, 2..=65536) is full when
//! `(tail + 1) % size == head`: one slot always stays empty, so at most
//! `size - 1` entries are in it at once.

/// Index arithmetic of one circular queue of `size` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    size: u32,
}

impl Ring {
    /// A ring of `size` entries; `None` unless `2 <= size <= 65536`.
    pub const fn new(size: u32) -> Option<Self> {
        if size >= 2 && size <= 65536 {
            Some(Self { size })
        } else {
            None
        }
    }

    /// Number of entries (1-based; the spec's QSIZE + 1).
    pub const fn size(&self) -> u32 {
        self.size
    }

    /// The index after `i`.
    #[inline]
    pub const fn next(&self, i: u32) -> u32 {
        if i + 1 == self.size {
            0
        } else {
            i + 1
        }
    }

    /// Entries between `head` (inclusive) and `tail` (exclusive).
    #[inline]
    pub const fn used(&self, head: u32, tail: u32) -> u32 {
        if tail >= head {
            tail - head
        } else {
            self.size - head + tail
        }
    }

    /// Entries that can still be added: `size - 1 - used`.
    #[inline]
    pub const fn free(&self, head: u32, tail: u32) -> u32 {
        self.size - 1 - self.used(head, tail)
    }

    /// `true` when `(tail + 1) % size == head`.
    #[inline]
    pub const fn is_full(&self, head: u32, tail: u32) -> bool {
        self.next(tail) == head
    }

    /// `true` when `i` is a valid index of this ring.
    #[inline]
    pub const fn contains(&self, i: u32) -> bool {
        i < self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounds() {
        assert!(Ring::new(1).is_none());
        assert!(Ring::new(65537).is_none());
        let r = Ring::new(2).unwrap();
        assert_eq!(r.free(0, 0), 1);
        assert!(r.is_full(0, 1));
        assert!(r.is_full(1, 0));
        assert_eq!(r.next(1), 0);
    }

    proptest! {
        #[test]
        fn used_plus_free_is_size_minus_one(size in 2u32..=65536, h in any::<u32>(), n in any::<u32>()) {
            let r = Ring::new(size).unwrap();
            let head = h % size;
            let count = n % size; // 0..size-1 entries
            let mut tail = head;
            for _ in 0..count.min(300) { tail = r.next(tail); }
            let count = count.min(300);
            prop_assert_eq!(r.used(head, tail), count);
            prop_assert_eq!(r.used(head, tail) + r.free(head, tail), size - 1);
            prop_assert_eq!(r.is_full(head, tail), count == size - 1);
        }
    }
}
