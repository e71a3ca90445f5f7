//! Submission and completion queue state as the controller keeps it (NVMe
//! Base 2.0, 3.3.1 "Memory-based Transport Queue Model").
//!
//! The controller owns each SQ's head and each CQ's tail and phase; the
//! host owns each SQ's tail and CQ's head and publishes them through the
//! doorbells. A doorbell value outside the queue (or a CQ head that would
//! consume entries not yet posted) is an invalid doorbell write: it is
//! counted and ignored.
//!
//! The controller also checks the host's side of the SQ protocol:
//!
//! * A new SQ tail must lie in the window the host may fill: from the last
//!   tail forward by at most the free entries, counted from the oldest slot
//!   the host has not yet been told is free (the SQ head as last reported
//!   in a CQE's SQHD, `released`). Anything else moves the tail backwards
//!   (or laps the head) and is ignored ([`SqDoorbell::Backwards`]).
//! * An SQE must not change while the controller owns its slot. This
//!   controller fetches (copies) an SQE in the same poll iteration in which
//!   it reads the tail doorbell that made the SQE visible, so a snapshot at
//!   doorbell time and one at fetch time are the same copy (the window
//!   between them is microseconds and not checked). What a host can get
//!   wrong for longer is reusing a slot too early: a slot stays the
//!   controller's until a CQE reports an SQHD past it, because only then
//!   may the host know it was fetched. So the fetch keeps a 64-bit hash of
//!   the SQE, and before a CQE releases slots (by reporting a new SQHD) the
//!   controller reads those slots again and compares
//!   ([`SubQueue::release`]); a difference means the host overwrote a slot
//!   the controller still owned (a real controller might have fetched the
//!   new bytes, or half of them).

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

/// What an SQ tail doorbell write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqDoorbell {
    /// Accepted (or the same value as before).
    Ok,
    /// A value not below the queue size: ignored.
    OutOfRange,
    /// A tail outside the window the host may fill (it moved backwards or
    /// lapped the head): ignored.
    Backwards,
}

/// A 64-bit hash of an SQE (FNV-style over its eight quadwords), kept per
/// fetched slot to notice a host that overwrites it too early.
fn sqe_hash(bytes: &[u8; SQE_SIZE as usize]) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for q in bytes.chunks_exact(8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(q);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

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
    /// `last_db` was refused; the same value is judged again (quietly) on
    /// the next poll, since it may have become legal meanwhile.
    last_rejected: bool,
    pub cqid: u16,
    /// SQ head as last reported to the host in a CQE (slots before it are
    /// the host's again); the slots `released..head` were fetched but are
    /// still the controller's.
    pub released: u32,
    /// Hash of the SQE fetched from each slot, valid for `released..head`.
    snapshots: Vec<u64>,
    /// CIDs of commands fetched and held without a completion
    /// ([`crate::FaultAction::NeverComplete`]); Delete I/O SQ aborts them.
    pub held: Vec<u16>,
    /// DMA domain of its commands' data buffers and PRP lists
    /// ([`crate::SHARED_DOMAIN`]: any mapping).
    pub domain: u32,
}

impl SubQueue {
    pub(crate) fn new(base: u64, size: u32, cqid: u16) -> Self {
        Self {
            base,
            size,
            head: 0,
            tail: 0,
            last_db: 0,
            last_rejected: false,
            cqid,
            released: 0,
            snapshots: vec![0; size as usize],
            held: Vec::new(),
            domain: crate::SHARED_DOMAIN,
        }
    }

    /// Applies a raw tail doorbell value; anything but [`SqDoorbell::Ok`]
    /// is ignored (the tail stays).
    pub(crate) fn doorbell(&mut self, raw: u32) -> SqDoorbell {
        let repeat = raw == self.last_db;
        if repeat && !self.last_rejected {
            return SqDoorbell::Ok;
        }
        self.last_db = raw;
        let verdict = self.judge_tail(raw);
        if verdict == SqDoorbell::Ok {
            self.tail = raw;
        }
        self.last_rejected = verdict != SqDoorbell::Ok;
        // A refused value is reported (and counted) once, when written.
        if repeat {
            SqDoorbell::Ok
        } else {
            verdict
        }
    }

    fn judge_tail(&self, raw: u32) -> SqDoorbell {
        if raw >= self.size {
            return SqDoorbell::OutOfRange;
        }
        // Entries between the released head and the tail are the
        // controller's (fetched or not); the host may add at most the rest,
        // less the one slot that always stays empty.
        let owned = (self.tail + self.size - self.released) % self.size;
        let free = self.size - 1 - owned;
        let advance = (raw + self.size - self.tail) % self.size;
        if advance > free {
            return SqDoorbell::Backwards;
        }
        SqDoorbell::Ok
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Copies the SQE at the head, remembers its hash, and advances the
    /// head.
    pub(crate) fn fetch(&mut self, dma: &DmaView<'_>) -> Result<Sqe, DmaFault> {
        let mut bytes = [0u8; SQE_SIZE as usize];
        let iova = self.base.wrapping_add(u64::from(self.head) * SQE_SIZE);
        dma.read(iova, &mut bytes)?;
        if let Some(s) = self.snapshots.get_mut(self.head as usize) {
            *s = sqe_hash(&bytes);
        }
        self.head = if self.head + 1 >= self.size { 0 } else { self.head + 1 };
        Ok(Sqe::read_from_bytes(&bytes).unwrap_or_default())
    }

    /// Called before a CQE reports SQHD = `head` to the host: the fetched
    /// slots `released..head` become the host's. Each is read again and
    /// compared with its hash from the fetch; returns how many changed
    /// while the controller owned them (a slot that cannot be read is not
    /// counted: queue memory faults are caught at fetch).
    pub(crate) fn release(&mut self, dma: &DmaView<'_>) -> u32 {
        let mut changed = 0;
        let mut i = self.released;
        while i != self.head {
            let mut bytes = [0u8; SQE_SIZE as usize];
            let iova = self.base.wrapping_add(u64::from(i) * SQE_SIZE);
            if dma.read(iova, &mut bytes).is_ok()
                && self.snapshots.get(i as usize).is_some_and(|&h| h != sqe_hash(&bytes))
            {
                changed += 1;
            }
            i = if i + 1 >= self.size { 0 } else { i + 1 };
        }
        self.released = self.head;
        changed
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
    /// The CQ is full and completions wait for the host to move its head
    /// (a "CQ full" stall, counted once per episode).
    pub stalled: bool,
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
            stalled: false,
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
        assert_eq!(sq.doorbell(3), SqDoorbell::Ok);
        assert_eq!(sq.tail, 3);
        assert_eq!(sq.doorbell(4), SqDoorbell::OutOfRange);
        assert_eq!(sq.tail, 3);
        assert_eq!(sq.doorbell(4), SqDoorbell::Ok, "same invalid value is not counted twice");
        // Nothing released yet: slots 0..3 are the controller's, so 0 would
        // lap the head.
        assert_eq!(sq.doorbell(0), SqDoorbell::Backwards);
        assert_eq!(sq.tail, 3);
        // Fetched and reported (SQHD = 3): the host may wrap to 1. (A value
        // repeated right after it was refused is not looked at again: the
        // controller sees doorbell values, not writes.)
        sq.head = 3;
        sq.released = 3;
        assert_eq!(sq.doorbell(1), SqDoorbell::Ok);
        assert_eq!(sq.tail, 1);
    }

    #[test]
    fn a_refused_tail_is_counted_once_and_taken_when_it_becomes_legal() {
        // 8 entries, tail 5, slots 2..5 still the controller's: tail 3 would
        // lap them. The register keeps 3; once the controller has handed
        // slots 2..5 back, the same 3 is a legal tail and must be taken (or
        // the queue would hang with the host's commands never fetched).
        let mut sq = SubQueue::new(0, 8, 0);
        (sq.tail, sq.last_db, sq.head, sq.released) = (5, 5, 5, 2);
        assert_eq!(sq.doorbell(3), SqDoorbell::Backwards);
        assert_eq!(sq.doorbell(3), SqDoorbell::Ok, "not counted twice");
        assert_eq!(sq.tail, 5, "still refused");
        sq.released = 5;
        assert_eq!(sq.doorbell(3), SqDoorbell::Ok);
        assert_eq!(sq.tail, 3);
    }

    #[test]
    fn sq_tail_window_is_relative_to_the_released_head() {
        // 8 entries, tail 5, head reported at 2: slots 2..5 are the
        // controller's, so 5 -> 7 and 5 -> 0 and 5 -> 1 are fine (1 keeps
        // one slot empty before 2), 5 -> 2 and 5 -> 4 are not.
        let fresh = || {
            let mut sq = SubQueue::new(0, 8, 0);
            sq.tail = 5;
            sq.last_db = 5;
            sq.head = 5;
            sq.released = 2;
            sq
        };
        for (raw, want) in [
            (7, SqDoorbell::Ok),
            (0, SqDoorbell::Ok),
            (1, SqDoorbell::Ok),
            (2, SqDoorbell::Backwards),
            (4, SqDoorbell::Backwards),
            (3, SqDoorbell::Backwards),
        ] {
            assert_eq!(fresh().doorbell(raw), want, "5 -> {raw}");
        }
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
