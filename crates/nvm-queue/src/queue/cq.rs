//! The completion queue ring (NVMe Base 2.0 sections 3.3.1, 4.2.1, 4.2.4
//! "Phase Tag").

use std::sync::atomic::Ordering;

use nvme_regs::Cqe;

use super::ring::Ring;
use crate::dma::DmaBuffer;
use crate::mmio::Doorbell;

/// CQE size in bytes (CC.IOCQES = 4).
pub const CQE_SIZE: usize = 16;

/// A completion queue: 16-byte entries the controller writes, recognised as
/// new by the phase tag only; the head is the host's and is returned to the
/// controller through the CQ head doorbell after entries are consumed.
#[derive(Debug)]
pub struct CompletionQueue {
    mem: DmaBuffer,
    ring: Ring,
    qid: u16,
    head: u32,
    phase: bool,
    rung_head: u32,
    doorbell: Doorbell,
}

impl CompletionQueue {
    /// Wraps zeroed queue memory of at least `size * 16` bytes. The first
    /// pass of the controller writes phase 1.
    pub(crate) fn new(mem: DmaBuffer, ring: Ring, qid: u16, doorbell: Doorbell) -> Self {
        Self { mem, ring, qid, head: 0, phase: true, rung_head: 0, doorbell }
    }

    /// Byte offset in BAR0 of this queue's CQ head doorbell.
    pub fn doorbell_offset(&self) -> usize {
        self.doorbell.offset()
    }

    /// Queue identifier (0 = admin).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Entries in the ring.
    pub fn size(&self) -> u32 {
        self.ring.size()
    }

    /// The queue memory.
    pub fn memory(&self) -> &DmaBuffer {
        &self.mem
    }

    /// Next entry to consume.
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Phase tag value that marks a new entry at `head`.
    pub fn phase(&self) -> bool {
        self.phase
    }

    /// The entry at the head if the controller has posted it (phase tag
    /// match), without consuming it.
    ///
    /// The dword holding the phase tag (DW3) is loaded first with Acquire,
    /// so the rest of the entry, which the controller writes before DW3, is
    /// read after it.
    #[inline]
    pub fn peek(&self) -> Option<Cqe> {
        let [w0, w1, w2, w3] = self.mem.atomic_words::<4>(self.head as usize * CQE_SIZE).ok()?;
        // DW3 (phase tag) first, with Acquire: the body loads below cannot
        // be satisfied before it, so a new entry is never read half old.
        let dw3 = w3.load(Ordering::Acquire);
        if (dw3 >> 16) & 1 != u32::from(self.phase) {
            return None;
        }
        let [dw0, dw1, dw2] = [w0, w1, w2].map(|w| w.load(Ordering::Relaxed));
        Some(Cqe::from_dwords([dw0, dw1, dw2, dw3]))
    }

    /// Consumes the entry at the head (after [`CompletionQueue::peek`]
    /// returned it), flipping the expected phase on wrap.
    #[inline]
    pub fn advance(&mut self) {
        self.head = self.ring.next(self.head);
        if self.head == 0 {
            self.phase = !self.phase;
        }
    }

    /// Takes the entry at the head if the controller has posted it.
    #[inline]
    pub fn pop(&mut self) -> Option<Cqe> {
        let cqe = self.peek()?;
        self.advance();
        Some(cqe)
    }

    /// Reads again the body (DW0-DW2) of the entry at `index`, for an entry
    /// whose phase dword was seen before its body was visible.
    pub(crate) fn reread_body(&self, index: u32) -> Option<[u32; 3]> {
        let base = index as usize * CQE_SIZE;
        Some([
            self.mem.load_u32(base, Ordering::Acquire).ok()?,
            self.mem.load_u32(base + 4, Ordering::Acquire).ok()?,
            self.mem.load_u32(base + 8, Ordering::Acquire).ok()?,
        ])
    }

    /// Tells the controller, with one CQ head doorbell write, that every
    /// entry popped so far may be reused; skipped if nothing was popped.
    #[inline]
    pub fn ring(&mut self) {
        if self.head != self.rung_head {
            self.doorbell.ring(self.head);
            self.rung_head = self.head;
        }
    }

    /// Resets indexes and clears the memory after a controller reset.
    pub(crate) fn reset(&mut self) {
        self.mem.fill(0);
        self.head = 0;
        self.rung_head = 0;
        self.phase = true;
    }
}
