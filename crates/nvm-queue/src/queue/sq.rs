//! The submission queue ring (NVMe Base 2.0 sections 3.3.1, 4.2).

use std::sync::atomic::Ordering;

use nvme_regs::Sqe;
use zerocopy::IntoBytes;

use super::ring::Ring;
use crate::dma::DmaBuffer;
use crate::mmio::Doorbell;

/// SQE size in bytes (CC.IOSQES = 6).
pub const SQE_SIZE: usize = 64;

/// A submission queue: 64-byte entries in DMA memory, a tail owned by the
/// host, a head learned from each CQE's SQHD, and the SQ tail doorbell.
///
/// Writing an entry ([`SubmissionQueue::push`]) and publishing it
/// ([`SubmissionQueue::ring`]) are separate steps, so a batch costs one
/// doorbell write.
#[derive(Debug)]
pub struct SubmissionQueue {
    mem: DmaBuffer,
    ring: Ring,
    qid: u16,
    tail: u32,
    head: u32,
    rung_tail: u32,
    doorbell: Doorbell,
    /// SQ tail doorbell writes made so far.
    doorbell_writes: u64,
}

impl SubmissionQueue {
    /// Wraps zeroed queue memory of at least `size * 64` bytes.
    pub(crate) fn new(mem: DmaBuffer, ring: Ring, qid: u16, doorbell: Doorbell) -> Self {
        Self { mem, ring, qid, tail: 0, head: 0, rung_tail: 0, doorbell, doorbell_writes: 0 }
    }

    /// SQ tail doorbell writes made by [`SubmissionQueue::ring`] so far
    /// (a ring with nothing new to publish writes nothing).
    pub fn doorbell_writes(&self) -> u64 {
        self.doorbell_writes
    }

    /// Byte offset in BAR0 of this queue's SQ tail doorbell.
    pub fn doorbell_offset(&self) -> usize {
        self.doorbell.offset()
    }

    /// Queue identifier (0 = admin).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Entries in the ring (QSIZE + 1).
    pub fn size(&self) -> u32 {
        self.ring.size()
    }

    /// The queue memory (its device address goes into ASQ or Create I/O SQ).
    pub fn memory(&self) -> &DmaBuffer {
        &self.mem
    }

    /// Host-side tail (next slot to fill).
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Head as last reported by the controller in a CQE's SQHD.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Free slots, keeping one slot empty.
    pub fn free_slots(&self) -> u32 {
        self.ring.free(self.head, self.tail)
    }

    /// `true` when no slot is free.
    pub fn is_full(&self) -> bool {
        self.ring.is_full(self.head, self.tail)
    }

    /// Copies `sqe` into the tail slot and advances the tail; the controller
    /// sees it only after [`SubmissionQueue::ring`]. Returns `false` (and
    /// writes nothing) when the queue is full.
    #[inline]
    pub fn push(&mut self, sqe: &Sqe) -> bool {
        if self.is_full() {
            return false;
        }
        let off = self.tail as usize * SQE_SIZE;
        // In bounds: the buffer holds `size` entries and tail < size.
        if self.mem.write_bytes(off, sqe.as_bytes()).is_err() {
            return false;
        }
        self.tail = self.ring.next(self.tail);
        true
    }

    /// Publishes every pushed entry with one SQ tail doorbell write, and
    /// only if the tail moved since the last one. The doorbell store is a
    /// Release store: the SQE (and PRP list) stores above are visible to
    /// the controller before it sees the new tail.
    #[inline]
    pub fn ring(&mut self) {
        if self.tail != self.rung_tail {
            self.doorbell.ring(self.tail);
            self.rung_tail = self.tail;
            self.doorbell_writes += 1;
        }
    }

    /// Records the SQ head the controller reported (CQE SQHD). Returns
    /// `false`, changing nothing, for a value outside the ring or one that
    /// would put the head past the tail.
    pub fn update_head(&mut self, sqhd: u16) -> bool {
        let sqhd = u32::from(sqhd);
        if !self.ring.contains(sqhd) {
            return false;
        }
        // The new head must lie in [head, tail]: the controller cannot have
        // fetched entries the host has not published.
        let fetched = self.ring.used(self.head, sqhd);
        if fetched > self.ring.used(self.head, self.rung_tail) {
            return false;
        }
        self.head = sqhd;
        true
    }

    /// Reads back SQE slot `index` (diagnostics and tests).
    pub fn entry(&self, index: u32) -> Option<Sqe> {
        let mut dw = [0u32; 16];
        for (i, d) in dw.iter_mut().enumerate() {
            *d = self.mem.load_u32(index as usize * SQE_SIZE + i * 4, Ordering::Relaxed).ok()?;
        }
        Some(Sqe::from_dwords(dw))
    }

    /// Resets indexes after the controller forgot the queue (reset).
    pub(crate) fn reset(&mut self) {
        self.tail = 0;
        self.head = 0;
        self.rung_tail = 0;
    }
}
