//! The write cache's undo arena: the last durable contents of non-durable
//! logical blocks, one fixed-size slot per block, carved out of large
//! zeroed chunks (never one allocation per block: this is on the write
//! path). Freed slots are reused; chunks are kept until the arena is
//! dropped, so the arena's memory is bounded by the most slots ever used
//! at once (the cache's capacity, plus one command).

use crate::zeroed::zeroed_vec;

/// Bytes per chunk (at least one slot): large enough to hold an aligned
/// 2 MiB transparent huge page, so that filling the arena costs few page
/// faults.
const CHUNK_BYTES: usize = 4 << 20;

/// Fixed-size slots of one logical block size.
#[derive(Debug)]
pub(crate) struct UndoArena {
    /// Bytes per slot: the namespace's logical block size.
    slot: usize,
    /// Slots per chunk.
    per_chunk: usize,
    chunks: Vec<Box<[u8]>>,
    /// Slots freed and ready for reuse.
    free: Vec<u32>,
    /// Slots handed out from the chunks so far (the next fresh one).
    fresh: u32,
}

impl UndoArena {
    /// An empty arena of `slot`-byte slots (`slot` > 0).
    pub(crate) fn new(slot: usize) -> Self {
        let slot = slot.max(1);
        Self { slot, per_chunk: (CHUNK_BYTES / slot).max(1), chunks: Vec::new(), free: Vec::new(), fresh: 0 }
    }

    /// A free slot (its contents are stale), allocating a chunk when every
    /// slot is taken; `None` when the slot index space (2^32 slots) is
    /// exhausted or a chunk cannot be allocated.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        let s = self.fresh;
        if s as usize >= self.chunks.len() * self.per_chunk {
            let bytes = self.per_chunk.checked_mul(self.slot)?;
            self.chunks.push(zeroed_vec(bytes).ok()?.into_boxed_slice());
        }
        self.fresh = s.checked_add(1)?;
        Some(s)
    }

    /// Returns `slot` to the free list.
    pub(crate) fn free(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// Every slot free again (the chunks are kept for reuse).
    pub(crate) fn clear(&mut self) {
        self.free.clear();
        self.fresh = 0;
    }

    /// The bytes of `slot`; `None` for a slot never handed out.
    pub(crate) fn get(&self, slot: u32) -> Option<&[u8]> {
        let (chunk, off) = self.locate(slot)?;
        self.chunks.get(chunk)?.get(off..off + self.slot)
    }

    /// The bytes of `slot`, writable; `None` for a slot never handed out.
    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut [u8]> {
        let (chunk, off) = self.locate(slot)?;
        let len = self.slot;
        self.chunks.get_mut(chunk)?.get_mut(off..off + len)
    }

    fn locate(&self, slot: u32) -> Option<(usize, usize)> {
        if slot >= self.fresh {
            return None;
        }
        let s = slot as usize;
        Some((s / self.per_chunk, (s % self.per_chunk) * self.slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_span_chunks() {
        let mut a = UndoArena::new(4096);
        let n = CHUNK_BYTES / 4096 + 3;
        let slots: Vec<u32> = (0..n).map(|_| a.alloc().unwrap()).collect();
        assert_eq!(a.chunks.len(), 2);
        for (i, &s) in slots.iter().enumerate() {
            a.get_mut(s).unwrap().fill(i as u8);
        }
        assert!(slots.iter().enumerate().all(|(i, &s)| a.get(s).unwrap().iter().all(|&b| b == i as u8)));
        a.free(slots[5]);
        assert_eq!(a.alloc(), Some(slots[5]));
        assert!(a.get(n as u32).is_none(), "never handed out");
        a.clear();
        assert!(a.get(0).is_none());
        assert_eq!(a.alloc(), Some(0));
        assert_eq!(a.chunks.len(), 2, "chunks kept");
    }
}
