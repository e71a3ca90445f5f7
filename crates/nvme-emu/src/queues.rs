//! Submission and completion queue state as the controller keeps it (NVMe
//! Base 2.0, 3.3.1 "Memory-based Transport Queue Model").
//!
//! The controller owns each SQ's head and each CQ's tail and phase; the
//! host owns each SQ's tail and CQ's head and publishes them through the
//! doorbells. A doorbell value outside the queue (or a CQ head that would
//! consume entries not yet posted) is an invalid doorbell write: it is
//! counted and ignored.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use nvme_regs::{Cqe, Sqe};
use zerocopy::FromBytes;

use crate::dma::{DmaFault, DmaView};

/// Size of an SQE / CQE in bytes.
const SQE_SIZE: u64 = 64;
const CQE_SIZE: u64 = 16;

/// A completion waiting to be posted: everything of the CQE except the
/// phase tag and SQHD, which are fixed when it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    pub dw0: u32,
    pub sqid: u16,
    pub cid: u16,
    /// Status field (CQE DW3 bits 31:17).
    pub status: nvme_regs::Status,
    /// How the CQE is misreported (fault injection), normally
    /// [`CqeQuirk::None`].
    pub quirk: CqeQuirk,
}

/// A protocol-breaking way of writing one CQE ([`crate::FaultAction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum CqeQuirk {
    /// Written correctly.
    #[default]
    None,
    /// SQHD one entry behind the SQ head ([`crate::FaultAction::LaggingSqhd`]).
    LagSqhd,
    /// DW3 first, the body [`PHASE_FIRST_DELAY`] later
    /// ([`crate::FaultAction::PhaseBeforeBody`]).
    PhaseFirst,
}

/// Time between a [`CqeQuirk::PhaseFirst`] CQE's DW3 and its body.
pub(crate) const PHASE_FIRST_DELAY: std::time::Duration = std::time::Duration::from_micros(200);

/// One submission queue.
#[derive(Debug)]
pub(crate) struct SubQueue {
    pub base: u64,
    /// Entries (1-based).
    pub size: u32,
    /// Next entry the controller fetches.
    pub head: u32,
    /// Last valid tail the host published.
    pub tail: u32,
    /// Last raw doorbell value seen (to notice changes and count each
    /// invalid write once).
    pub last_db: u32,
    pub cqid: u16,
}

impl SubQueue {
    pub(crate) fn new(base: u64, size: u32, cqid: u16) -> Self {
        Self { base, size, head: 0, tail: 0, last_db: 0, cqid }
    }

    /// Applies a raw tail doorbell value. Returns `false` for an invalid
    /// write (ignored).
    pub(crate) fn doorbell(&mut self, raw: u32) -> bool {
        if raw == self.last_db {
            return true;
        }
        self.last_db = raw;
        if raw >= self.size {
            return false;
        }
        self.tail = raw;
        true
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Copies the SQE at the head and advances the head.
    pub(crate) fn fetch(&mut self, dma: &DmaView<'_>) -> Result<Sqe, DmaFault> {
        let mut bytes = [0u8; SQE_SIZE as usize];
        let iova = self.base.wrapping_add(u64::from(self.head) * SQE_SIZE);
        dma.read(iova, &mut bytes)?;
        self.head = if self.head + 1 >= self.size { 0 } else { self.head + 1 };
        Ok(Sqe::read_from_bytes(&bytes).unwrap_or_default())
    }
}

/// One completion queue.
#[derive(Debug)]
pub(crate) struct CompQueue {
    pub base: u64,
    /// Entries (1-based).
    pub size: u32,
    /// Next entry the controller writes.
    pub tail: u32,
    /// Head published by the host.
    pub head: u32,
    pub last_db: u32,
    /// Phase tag of the entries written in the current pass.
    pub phase: bool,
    /// Completions waiting for a free slot (CQ full).
    pub pending: VecDeque<Completion>,
    /// Completions of this CQ scheduled in the timing model.
    pub in_flight: u32,
    /// SQs attached to this CQ.
    pub sq_count: u32,
}

impl CompQueue {
    pub(crate) fn new(base: u64, size: u32) -> Self {
        Self {
            base,
            size,
            tail: 0,
            head: 0,
            last_db: 0,
            phase: true,
            pending: VecDeque::new(),
            in_flight: 0,
            sq_count: 0,
        }
    }

    /// Applies a raw head doorbell value. Returns `false` for an invalid
    /// write (ignored): outside the queue, or beyond the entries posted.
    pub(crate) fn doorbell(&mut self, raw: u32) -> bool {
        if raw == self.last_db {
            return true;
        }
        self.last_db = raw;
        if raw >= self.size {
            return false;
        }
        // Entries the host may consume: head .. tail (circular).
        let posted = (self.tail + self.size - self.head) % self.size;
        let advance = (raw + self.size - self.head) % self.size;
        if advance > posted {
            return false;
        }
        self.head = raw;
        true
    }

    pub(crate) fn is_full(&self) -> bool {
        (self.tail + 1) % self.size == self.head
    }

    /// Completions not yet visible to the host (pending + scheduled).
    pub(crate) fn backlog(&self) -> u32 {
        self.pending.len() as u32 + self.in_flight
    }

    /// Writes one CQE at the tail: DW0..DW2 first, then DW3 (CID, phase,
    /// status) with a Release store so that a host seeing the new phase tag
    /// (Acquire) sees the whole entry; in the reverse order, with a delay,
    /// for [`CqeQuirk::PhaseFirst`]. The caller checks `is_full` first.
    pub(crate) fn post(&mut self, dma: &DmaView<'_>, c: &Completion, sqhd: u16) -> Result<(), DmaFault> {
        let cqe = Cqe::new(c.dw0, sqhd, c.sqid, c.cid, c.status, self.phase);
        let d = cqe.to_dwords();
        let iova = self.base.wrapping_add(u64::from(self.tail) * CQE_SIZE);
        let mut body = [0u8; 12];
        body[0..4].copy_from_slice(&d[0].to_le_bytes());
        body[4..8].copy_from_slice(&d[1].to_le_bytes());
        body[8..12].copy_from_slice(&d[2].to_le_bytes());
        // Check the whole entry first so that nothing is written on a fault.
        dma.check(iova, CQE_SIZE as usize)?;
        if c.quirk == CqeQuirk::PhaseFirst {
            // Fault injection: phase tag first, body later. The host may read
            // the body while it is written, so write it with atomic stores.
            dma.store_u32(iova + 12, d[3], Ordering::Release)?;
            let until = std::time::Instant::now() + PHASE_FIRST_DELAY;
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
            for (i, dw) in d[..3].iter().enumerate() {
                dma.store_u32(iova + 4 * i as u64, *dw, Ordering::Release)?;
            }
        } else {
            dma.write(iova, &body)?;
            // Release: orders the body stores above before the phase tag.
            dma.store_u32(iova + 12, d[3], Ordering::Release)?;
        }
        self.tail += 1;
        if self.tail >= self.size {
            self.tail = 0;
            self.phase = !self.phase;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sq_doorbell_validation() {
        let mut sq = SubQueue::new(0, 4, 0);
        assert!(sq.doorbell(3));
        assert_eq!(sq.tail, 3);
        assert!(!sq.doorbell(4));
        assert_eq!(sq.tail, 3);
        assert!(sq.doorbell(4), "same invalid value is not counted twice");
        assert!(sq.doorbell(0));
        assert_eq!(sq.tail, 0);
    }

    #[test]
    fn cq_doorbell_validation() {
        let mut cq = CompQueue::new(0, 4);
        cq.tail = 2;
        assert!(!cq.doorbell(3), "beyond posted entries");
        assert_eq!(cq.head, 0);
        assert!(cq.doorbell(2));
        assert_eq!(cq.head, 2);
        assert!(!cq.doorbell(9));
        cq.tail = 1; // wrapped: entries 2, 3, 0 posted
        assert!(cq.doorbell(1));
        assert_eq!(cq.head, 1);
        assert!(!cq.is_full());
        cq.tail = 0;
        assert!(cq.is_full());
    }
}
