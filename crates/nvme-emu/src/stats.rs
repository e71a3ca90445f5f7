//! The emulator's counters: the snapshot handed out ([`EmuStats`]), the
//! atomics behind it, and the controller's hot counters published once per
//! poll iteration.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of an emulator's counters.
///
/// The hot counters (`commands`, `media_bytes_*`) are published by the
/// controller thread once per poll iteration, so they may trail the CQEs
/// the host has already seen by a few microseconds; the others are updated
/// before the corresponding CQE is posted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmuStats {
    /// Completions posted (admin and I/O), counted before each CQE is
    /// written: a host that has seen a completion sees it counted.
    pub commands: u64,
    /// Admin completions posted.
    pub admin_commands: u64,
    /// Bytes read from the media by successful Read commands (also counted
    /// for the null store).
    pub media_bytes_read: u64,
    /// Bytes written to the media by successful Write commands.
    pub media_bytes_written: u64,
    /// Invalid doorbell writes seen and ignored (value outside the queue,
    /// or a CQ head beyond the posted entries).
    pub doorbell_violations: u64,
    /// Accesses to device addresses outside every mapped region (data,
    /// PRP lists, queue memory).
    pub dma_faults: u64,
    /// Commands refused because a data buffer or PRP list page lay in a
    /// mapping of another DMA domain than their SQ's
    /// ([`Emulator::set_sq_domain`], [`Emulator::dma_map_in_domain`]):
    /// what an IOMMU fault would be on a real host. Not counted in
    /// `dma_faults`; the foreign memory was not touched.
    pub dma_domain_faults: u64,
    /// Commands a fault-injection rule applied to ([`FaultRule`]), counted
    /// when the command is fetched.
    pub faults_injected: u64,
    /// SQ tail doorbell writes outside the window the host may fill: the
    /// tail moved backwards, or past the oldest slot not yet reported free
    /// by a CQE's SQHD (also counted in `doorbell_violations`; ignored).
    pub sq_tail_backwards: u64,
    /// SQ slots whose SQE changed between its fetch and the CQE that
    /// released the slot to the host (SQHD past it): the host overwrote a
    /// slot the controller still owned.
    pub sqe_overwritten: u64,
    /// Times a CQ filled up with completions waiting for the host to move
    /// its CQ head doorbell (one per episode; the controller stalls, as
    /// real hardware does, until the head moves).
    pub cq_full_stalls: u64,
    /// Commands completed with "Command Aborted due to SQ Deletion" by a
    /// Delete I/O SQ.
    pub sq_deletion_aborts: u64,
    /// New SQ tail doorbell values the controller read (admin and I/O
    /// queues). The controller polls the doorbell page, so two writes that
    /// land between two of its reads are seen once: this is at most the
    /// number of SQ tail doorbell writes, and at least one per write that
    /// was followed by a pause.
    pub sq_tail_updates: u64,
}

/// Counters behind [`crate::EmuStats`].
#[derive(Debug, Default)]
pub(crate) struct StatsAtomics {
    pub commands: AtomicU64,
    pub admin_commands: AtomicU64,
    pub media_bytes_read: AtomicU64,
    pub media_bytes_written: AtomicU64,
    pub doorbell_violations: AtomicU64,
    pub dma_faults: AtomicU64,
    pub dma_domain_faults: AtomicU64,
    pub sq_tail_backwards: AtomicU64,
    pub sqe_overwritten: AtomicU64,
    pub cq_full_stalls: AtomicU64,
    pub sq_deletion_aborts: AtomicU64,
    pub sq_tail_updates: AtomicU64,
}

/// Hot counters, accumulated by the thread and added to [`StatsAtomics`]
/// once per poll iteration.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LocalStats {
    pub media_bytes_read: u64,
    pub media_bytes_written: u64,
    pub host_reads: u64,
    pub host_writes: u64,
}

impl StatsAtomics {
    /// The counters now; `faults_injected` is kept by the fault rules.
    pub(crate) fn snapshot(&self, faults_injected: u64) -> EmuStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EmuStats {
            commands: l(&self.commands),
            admin_commands: l(&self.admin_commands),
            media_bytes_read: l(&self.media_bytes_read),
            media_bytes_written: l(&self.media_bytes_written),
            doorbell_violations: l(&self.doorbell_violations),
            dma_faults: l(&self.dma_faults),
            dma_domain_faults: l(&self.dma_domain_faults),
            faults_injected,
            sq_tail_backwards: l(&self.sq_tail_backwards),
            sqe_overwritten: l(&self.sqe_overwritten),
            cq_full_stalls: l(&self.cq_full_stalls),
            sq_deletion_aborts: l(&self.sq_deletion_aborts),
            sq_tail_updates: l(&self.sq_tail_updates),
        }
    }
}
