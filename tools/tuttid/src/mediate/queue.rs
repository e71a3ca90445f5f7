//! One mediated queue pair. Four rings of `entries` entries each:
//!
//! - the **shadow SQ** (the client's SQ ring): the client writes SQEs
//!   here; the controller never reads it;
//! - the **real SQ** (daemon memory, mapped for the controller): the
//!   forwarder copies each checked entry here, with its CID replaced by a
//!   slot of the daemon's and the slot's generation (so a client's
//!   duplicate CIDs cannot confuse it, nor a controller's stale or
//!   duplicated completion complete the slot's next command);
//! - the **real CQ** (daemon memory): the controller posts here;
//! - the **client CQ** (the client's CQ ring): only the daemon writes it,
//!   copying each controller completion (the client's CID restored, SQHD
//!   in shadow SQ terms, the client CQ's phase) and posting a completion
//!   of its own for each refused entry.
//!
//! Why the CQ is shadowed too: a refused entry must complete in the
//! client's CQ, and an entry in a ring the controller also posts to
//! would race the controller for the same slot (it owns the CQ tail and
//! never learns of entries it did not write). With the daemon as the only
//! writer of the client's CQ its entries interleave in one order, and the
//! forwarder no longer has to trust a CQ the client can write.
//!
//! Flow control: an entry is taken from the shadow SQ only while the
//! commands in flight plus the completions the client has not consumed
//! leave room in its CQ, a slot is free and the real SQ has room, so every
//! completion, the daemon's included, always has a CQ slot. A client that
//! never consumes completions stalls only itself. An honest client (at
//! most `entries - 1` commands outstanding) never waits on this.

use std::sync::Arc;

use nvm_queue::Mmio;
use nvme_regs::opcode::nvm_opcode;
use nvme_regs::Sqe;
use tuttid_proto::shm::MappedFd;

use super::prp::{self, ListOut};
use super::sqe::{self, Tenant};
use super::{Refusal, Regions, Violation};

/// The memory of a mediated queue pair; the owner (the drive's `Rings`)
/// keeps these alive until the queues are deleted and unmapped.
#[derive(Debug, Clone)]
pub struct QueueMemory {
    /// The client's SQ ring (shadow SQ).
    pub client_sq: Arc<MappedFd>,
    /// The client's CQ ring.
    pub client_cq: Arc<MappedFd>,
    /// The controller's SQ ring.
    pub real_sq: Arc<MappedFd>,
    /// The controller's CQ ring.
    pub real_cq: Arc<MappedFd>,
    /// PRP list copies: `pages_per_slot` pages per slot, slot-major.
    pub lists: Arc<MappedFd>,
    /// Device address of `lists`.
    pub lists_iova: u64,
    /// List pages per command.
    pub pages_per_slot: usize,
}

/// Most entries of a mediated queue pair: slots fit in the low
/// [`SLOT_BITS`] bits of the controller's CID, a generation in the rest.
pub const MAX_ENTRIES: u32 = 1 << SLOT_BITS;
/// CID bits that name the slot.
const SLOT_BITS: u32 = 10;

/// What one [`MediatedQueue::pass`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// New real SQ tail to write to the controller's doorbell.
    pub sq_tail: Option<u32>,
    /// New real CQ head to write to the controller's doorbell.
    pub cq_head: Option<u32>,
    /// Entries forwarded to the controller.
    pub forwarded: u64,
    /// Entries refused (completed by the daemon).
    pub refused: u64,
    /// Controller completions with a CID of no outstanding command.
    pub stray: u64,
}

impl Progress {
    /// Whether anything moved.
    pub fn moved(&self) -> bool {
        self.sq_tail.is_some() || self.cq_head.is_some() || self.refused > 0
    }
}

/// A forwarded command: the client's CID and the epoch it was issued in
/// ([`Regions::issue`]).
#[derive(Debug, Clone, Copy)]
struct Slot {
    cid: u16,
    epoch: u64,
}

/// Shadow SQ entries one pass takes from one queue at most. The forwarding
/// thread visits every tenant's queues in turn, so a tenant with a full
/// 1024-entry SQ of maximum-length PRP lists holds the others back by at
/// most this many entries' checks per pass (each walks at most one
/// MDTS-long list), not by its whole ring. The rest waits for the next
/// pass, which follows at once while there is work.
pub const SQES_PER_PASS: u32 = 32;

/// One mediated queue pair's rings and indices (module docs).
pub struct MediatedQueue {
    qid: u16,
    entries: u32,
    page: u64,
    tenant: Tenant,
    regions: Arc<Regions>,
    shadow_sq: Mmio,
    client_cq: Mmio,
    real_sq: Mmio,
    real_cq: Mmio,
    lists: Mmio,
    /// Declared after the Mmio views: dropped after them.
    mem: QueueMemory,
    /// Shadow SQ entries taken (the SQHD the client sees).
    sq_head: u32,
    real_tail: u32,
    /// Real SQ head: SQHD of the newest controller completion.
    real_head: u32,
    real_cq_head: u32,
    real_phase: bool,
    cq_tail: u32,
    cq_head: u32,
    cq_phase: bool,
    slots: Vec<Option<Slot>>,
    /// Generation of each slot (CID bits 15:10), advanced when its
    /// command completes.
    gens: Vec<u16>,
    free: Vec<u16>,
    /// Shadow SQ entries taken per pass at most ([`SQES_PER_PASS`]).
    per_pass: u32,
}

impl std::fmt::Debug for MediatedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediatedQueue")
            .field("qid", &self.qid)
            .field("sq_head", &self.sq_head)
            .field("real_tail", &self.real_tail)
            .field("cq_tail", &self.cq_tail)
            .field("in_flight", &(self.slots.len() - self.free.len()))
            .finish()
    }
}

#[allow(unsafe_code)] // Mmio::new's contract, stated at the call
fn view(m: &Arc<MappedFd>) -> Result<Mmio, String> {
    // SAFETY: the mapping is kept alive by the `QueueMemory` stored in the
    // same `MediatedQueue`, declared after the views (dropped later); the
    // daemon touches these rings only through the Mmio's atomic accesses.
    unsafe { Mmio::new(m.as_ptr(), m.len()) }.map_err(|e| format!("ring view: {e}"))
}

impl MediatedQueue {
    /// Queue pair `qid` of `entries` entries per ring, memory page size
    /// `page`, for `tenant`, whose registrations are `regions`.
    ///
    /// # Errors
    ///
    /// A ring smaller than its entries, or list memory smaller than
    /// `entries - 1` slots (a message).
    pub fn new(
        (qid, entries, page): (u16, u32, u64),
        tenant: Tenant,
        regions: Arc<Regions>,
        mem: QueueMemory,
    ) -> Result<Self, String> {
        let n = entries as usize;
        let slots = n.saturating_sub(1);
        if n < 2
            || entries > MAX_ENTRIES
            || !page.is_power_of_two()
            || page < 4096
            || mem.client_sq.len() < n * 64
            || mem.real_sq.len() < n * 64
            || mem.client_cq.len() < n * 16
            || mem.real_cq.len() < n * 16
            || mem.lists.len() < slots * mem.pages_per_slot * page as usize
        {
            return Err(format!("queue {qid}: ring or list memory too small for {entries} entries"));
        }
        Ok(Self {
            qid,
            entries,
            page,
            tenant,
            regions,
            shadow_sq: view(&mem.client_sq)?,
            client_cq: view(&mem.client_cq)?,
            real_sq: view(&mem.real_sq)?,
            real_cq: view(&mem.real_cq)?,
            lists: view(&mem.lists)?,
            mem,
            sq_head: 0,
            real_tail: 0,
            real_head: 0,
            real_cq_head: 0,
            real_phase: true,
            cq_tail: 0,
            cq_head: 0,
            cq_phase: true,
            slots: vec![None; slots],
            gens: vec![0; slots],
            free: (0..slots as u16).rev().collect(),
            per_pass: SQES_PER_PASS,
        })
    }

    fn dist(&self, a: u32, b: u32) -> u32 {
        (b + self.entries - a) % self.entries
    }

    fn next(&self, i: u32) -> u32 {
        (i + 1) % self.entries
    }

    /// One pass: takes the client's CQ head `cq_head` (its shadow word),
    /// copies the controller's new completions into the client's CQ, then
    /// checks and forwards the shadow SQ entries up to `sq_tail`.
    ///
    /// # Errors
    ///
    /// [`Violation`]: a shadow word that is not an index, or a CQ head
    /// past the completions posted; the caller ends the client's lease.
    pub fn pass(&mut self, sq_tail: u32, cq_head: u32) -> Result<Progress, Violation> {
        let (head, tail) = (self.cq_head, self.cq_tail);
        if cq_head >= self.entries || self.dist(head, cq_head) > self.dist(head, tail) {
            return Err(Violation::CqHead { value: cq_head, head, tail });
        }
        self.cq_head = cq_head;
        if sq_tail >= self.entries {
            return Err(Violation::SqTail { value: sq_tail, entries: self.entries });
        }
        let mut p = Progress::default();
        self.drain(&mut p);
        self.consume(sq_tail, &mut p);
        Ok(p)
    }

    /// Completions in the client's CQ that it has not consumed.
    fn unconsumed(&self) -> u32 {
        self.dist(self.cq_head, self.cq_tail)
    }

    /// Copies controller completions into the client's CQ while it has room.
    fn drain(&mut self, p: &mut Progress) {
        while self.unconsumed() < self.entries - 1 {
            let off = self.real_cq_head as usize * 16;
            // Phase tag first (Acquire): the rest of the entry is visible.
            let Ok(dw3) = self.real_cq.read32(off + 12) else { return };
            if (dw3 >> 16) & 1 != u32::from(self.real_phase) {
                return;
            }
            let dw = [0, 4, 8].map(|o| self.real_cq.read32(off + o).unwrap_or(0));
            self.real_cq_head = self.next(self.real_cq_head);
            if self.real_cq_head == 0 {
                self.real_phase = !self.real_phase;
            }
            p.cq_head = Some(self.real_cq_head);
            let sqhd = dw[2] & 0xffff;
            if sqhd < self.entries {
                self.real_head = sqhd;
            }
            let Some((index, slot)) = self.take_slot(dw3 as u16) else {
                p.stray += 1;
                continue;
            };
            self.regions.done(slot.epoch);
            self.free.push(index);
            let client_dw2 = self.sq_head | (u32::from(self.qid) << 16);
            self.post([dw[0], dw[1], client_dw2, u32::from(slot.cid) | (dw3 & 0xfffe_0000)]);
        }
    }

    /// The controller's CID of slot `index` now.
    fn cid_of(&self, index: u16) -> u16 {
        index | self.gens[usize::from(index)] << SLOT_BITS
    }

    /// The outstanding command that controller CID `cid` names (slot and
    /// generation), taken out of its slot, whose generation moves on.
    /// `None` for a CID of no outstanding command, or a stale one.
    fn take_slot(&mut self, cid: u16) -> Option<(u16, Slot)> {
        let index = cid & ((1 << SLOT_BITS) - 1);
        let i = usize::from(index);
        if self.slots.get(i)?.is_none() || self.cid_of(index) != cid {
            return None;
        }
        self.gens[i] = (self.gens[i] + 1) & ((1 << (16 - SLOT_BITS)) - 1);
        Some((index, self.slots[i].take()?))
    }

    /// Takes shadow SQ entries up to `tail`, at most `per_pass` of them:
    /// each checked, then copied to the real SQ or completed with its
    /// refusal's status.
    fn consume(&mut self, tail: u32, p: &mut Progress) {
        let start = self.real_tail;
        let mut taken = 0;
        while self.sq_head != tail && taken < self.per_pass {
            taken += 1;
            let in_flight = (self.slots.len() - self.free.len()) as u32;
            let real_used = self.dist(self.real_head, self.real_tail);
            if in_flight + self.unconsumed() >= self.entries - 1 || real_used >= self.entries - 1 {
                break;
            }
            let Some(slot) = self.free.pop() else { break };
            let sqe = self.read_shadow(self.sq_head);
            self.sq_head = self.next(self.sq_head);
            let epoch = self.regions.issue();
            match self.mediate(&sqe, slot) {
                Ok(out) => {
                    self.write_real(&out);
                    self.slots[usize::from(slot)] = Some(Slot { cid: sqe.cid(), epoch });
                    p.forwarded += 1;
                }
                Err(r) => {
                    self.regions.done(epoch);
                    self.free.push(slot);
                    self.refuse(&sqe, r);
                    p.refused += 1;
                }
            }
        }
        if self.real_tail != start {
            p.sq_tail = Some(self.real_tail);
        }
    }

    /// The controller's copy of `sqe` (CID = `slot` and its generation,
    /// PRPs checked, list copied into the slot's daemon pages).
    fn mediate(&self, sqe: &Sqe, slot: u16) -> Result<Sqe, Refusal> {
        let sqe::Checked { bytes, slba } = sqe::check(sqe, &self.tenant)?;
        // Built from the checked fields only, never copied: OPC, the
        // tenant's NSID, CID = the daemon's slot; FUSE, PSDT, MPTR, CDW2,
        // CDW3 and CDW13..15 zero.
        let mut out = Sqe::new(sqe.opcode(), self.tenant.nsid);
        out.set_cid(self.cid_of(slot));
        if let Some(slba) = slba {
            // CDW10/11: SLBA on the namespace (the partition's LBA 0 is its first).
            (out.cdw10, out.cdw11) = (slba as u32, (slba >> 32) as u32);
            let mask = if sqe.opcode() == nvm_opcode::WRITE_ZEROES { sqe::WZ_CDW12 } else { sqe::RW_CDW12 };
            out.cdw12 = sqe.cdw12 & mask;
        }
        (out.prp1, out.prp2) = if bytes == 0 {
            (0, 0)
        } else {
            let bytes_per_slot = self.mem.pages_per_slot * self.page as usize;
            let offset = usize::from(slot) * bytes_per_slot;
            let out_list = ListOut {
                mmio: &self.lists,
                offset,
                iova: self.mem.lists_iova + offset as u64,
                pages: self.mem.pages_per_slot,
            };
            prp::check(sqe.prp1, sqe.prp2, bytes, self.page, &self.regions.view(), &out_list)?
        };
        Ok(out)
    }

    fn read_shadow(&self, index: u32) -> Sqe {
        let base = index as usize * 64;
        let mut d = [0u32; 16];
        for (i, w) in d.iter_mut().enumerate() {
            *w = self.shadow_sq.read32(base + i * 4).unwrap_or(0);
        }
        Sqe::from_dwords(d)
    }

    fn write_real(&mut self, sqe: &Sqe) {
        let base = self.real_tail as usize * 64;
        for (i, w) in sqe.as_dwords().iter().enumerate() {
            // In bounds: the ring holds `entries` SQEs (checked in `new`).
            let _ = self.real_sq.write32(base + i * 4, *w);
        }
        self.real_tail = self.next(self.real_tail);
    }

    /// Completes a refused entry in the client's CQ.
    fn refuse(&mut self, sqe: &Sqe, r: Refusal) {
        tracing::debug!(qid = self.qid, cid = sqe.cid(), refusal = %r, "SQE refused");
        let status = u32::from(r.status().to_field(false)) << 16;
        let dw2 = self.sq_head | (u32::from(self.qid) << 16);
        self.post([0, 0, dw2, u32::from(sqe.cid()) | status]);
    }

    /// Posts one entry at the client CQ's tail: DW0..DW2 first, then DW3
    /// with the phase tag (Release: the client, which loads DW3 with
    /// Acquire, sees the whole entry once it sees the new phase).
    fn post(&mut self, dw: [u32; 4]) {
        let off = self.cq_tail as usize * 16;
        for (i, w) in dw[..3].iter().enumerate() {
            let _ = self.client_cq.write32(off + i * 4, *w);
        }
        let dw3 = (dw[3] & !(1 << 16)) | (u32::from(self.cq_phase) << 16);
        let _ = self.client_cq.write32(off + 12, dw3);
        self.cq_tail = self.next(self.cq_tail);
        if self.cq_tail == 0 {
            self.cq_phase = !self.cq_phase;
        }
    }
}

impl Drop for MediatedQueue {
    /// Forwarding stopped (the queue is about to be deleted, which ends
    /// every command the controller holds): the commands in flight no
    /// longer hold back an unregistration of this connection.
    fn drop(&mut self) {
        for s in self.slots.iter_mut().filter_map(Option::take) {
            self.regions.done(s.epoch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mediate::Partition;
    use nvme_regs::opcode::nvm_opcode;
    use nvme_regs::status::generic;
    use nvme_regs::{Cqe, Status};
    use tuttid_proto::shm::{sealed_memfd, PAGE};

    const E: u32 = 4;
    const DATA: u64 = 0x10_0000;
    const LISTS: u64 = 0x90_0000;

    fn mapped(len: usize) -> Arc<MappedFd> {
        Arc::new(MappedFd::map(sealed_memfd("q", len).unwrap(), 0, len as u64).unwrap())
    }

    #[allow(unsafe_code)]
    fn mmio(m: &Arc<MappedFd>) -> Mmio {
        // SAFETY: the test keeps `m` (in the queue's memory) alive longer.
        unsafe { Mmio::new(m.as_ptr(), m.len()) }.unwrap()
    }

    /// A queue of 4 entries, a client registration of 4 pages at DATA, and
    /// Mmio views of its four rings (client SQ, client CQ, real SQ, real CQ).
    fn queue() -> (MediatedQueue, [Mmio; 4]) {
        let (q, views, _) = queue_with_memory();
        (q, views)
    }

    /// As [`queue`], with views of the client's registration and of the
    /// daemon's list pages.
    fn queue_with_memory() -> (MediatedQueue, [Mmio; 4], [Mmio; 2]) {
        let mem = QueueMemory {
            client_sq: mapped(PAGE),
            client_cq: mapped(PAGE),
            real_sq: mapped(PAGE),
            real_cq: mapped(PAGE),
            lists: mapped(3 * PAGE),
            lists_iova: LISTS,
            pages_per_slot: 1,
        };
        let regions = Arc::new(Regions::default());
        let client = mapped(4 * PAGE);
        regions.insert(DATA, client.clone());
        let tenant =
            Tenant { nsid: 1, partition: Partition::whole(1024), block_size: 4096, max_transfer: 1 << 20 };
        let views = [&mem.client_sq, &mem.client_cq, &mem.real_sq, &mem.real_cq].map(mmio);
        let extra = [mmio(&client), mmio(&mem.lists)];
        // The registration stays mapped: `regions` (in the queue) holds it.
        (MediatedQueue::new((3, E, PAGE as u64), tenant, regions, mem).unwrap(), views, extra)
    }

    fn put_sqe(ring: &Mmio, i: u32, sqe: &Sqe) {
        for (k, w) in sqe.as_dwords().iter().enumerate() {
            ring.write32(i as usize * 64 + k * 4, *w).unwrap();
        }
    }

    fn sqe_at(ring: &Mmio, i: u32) -> Sqe {
        Sqe::from_dwords(std::array::from_fn(|k| ring.read32(i as usize * 64 + k * 4).unwrap()))
    }

    fn cqe_at(ring: &Mmio, i: u32) -> Cqe {
        Cqe::from_dwords(std::array::from_fn(|k| ring.read32(i as usize * 16 + k * 4).unwrap()))
    }

    fn read(cid: u16, prp1: u64) -> Sqe {
        let mut s = Sqe::new(nvm_opcode::READ, 1);
        s.set_cid(cid);
        s.prp1 = prp1;
        s
    }

    /// The controller completes the command in real SQ slot `cid` at real
    /// CQ slot `slot` with phase `phase`, reporting SQ head `sqhd`.
    fn complete(real_cq: &Mmio, slot: u32, cid: u16, sqhd: u16, phase: bool) {
        let c = Cqe::new(0xabcd, sqhd, 3, cid, Status::SUCCESS, phase);
        for (k, w) in c.to_dwords().iter().enumerate() {
            real_cq.write32(slot as usize * 16 + k * 4, *w).unwrap();
        }
    }

    #[test]
    fn entries_are_copied_refusals_and_completions_interleave_in_order() {
        let (mut q, [csq, ccq, rsq, rcq]) = queue();
        // Two Reads with the same client CID (a duplicate the controller
        // never sees), and an admin opcode between them.
        put_sqe(&csq, 0, &read(7, DATA));
        put_sqe(&csq, 1, &Sqe::new(0x80, 1));
        put_sqe(&csq, 2, &read(7, DATA + 4096));
        let p = q.pass(3, 0).unwrap();
        assert_eq!((p.forwarded, p.refused, p.sq_tail), (2, 1, Some(2)));
        let (a, b) = (sqe_at(&rsq, 0), sqe_at(&rsq, 1));
        assert_ne!(a.cid(), b.cid(), "the controller sees the daemon's slots as CIDs");
        assert_eq!((a.prp1, b.prp1, a.prp2), (DATA, DATA + 4096, 0));
        // The refusal is already in the client's CQ: CID 0 of the admin
        // entry (Sqe::new), SQHD 2 (entries 0 and 1 taken then), phase 1.
        let r = cqe_at(&ccq, 0);
        assert_eq!((r.cid, r.sqhd, r.sqid, r.phase()), (0, 2, 3, true));
        assert_eq!(r.status(), Status::generic(generic::INVALID_OPCODE).with_dnr(true));
        // The controller completes the second command first.
        complete(&rcq, 0, b.cid(), 2, true);
        let p = q.pass(3, 0).unwrap();
        assert_eq!(p.cq_head, Some(1));
        let c = cqe_at(&ccq, 1);
        assert_eq!((c.cid, c.sqhd, c.dw0, c.phase(), c.status()), (7, 3, 0xabcd, true, Status::SUCCESS));
        // The client has consumed nothing: its CQ holds 2 of 3 usable
        // entries, one command is in flight, so nothing more is taken.
        put_sqe(&csq, 3, &read(9, DATA));
        assert_eq!(q.pass(0, 0).unwrap().forwarded, 0, "no CQ room for another completion");
        // It consumes both: the new entry goes; the next completion lands
        // in client CQ slot 2.
        let p = q.pass(0, 2).unwrap();
        assert_eq!((p.forwarded, p.sq_tail), (1, Some(3)));
        complete(&rcq, 1, a.cid(), 3, true);
        q.pass(0, 2).unwrap();
        assert_eq!(cqe_at(&ccq, 2).cid, 7);
        complete(&rcq, 2, 999, 3, true);
        assert_eq!(q.pass(0, 2).unwrap().stray, 1, "a CID of no command is dropped");
    }

    #[test]
    fn a_pass_takes_at_most_its_budget_of_entries_and_the_next_the_rest() {
        let (mut q, [csq, _, rsq, _]) = queue();
        q.per_pass = 2;
        for i in 0..3 {
            put_sqe(&csq, i, &read(i as u16, DATA));
        }
        let p = q.pass(3, 0).unwrap();
        assert_eq!((p.forwarded, p.sq_tail), (2, Some(2)), "two of three this pass");
        assert!(p.moved(), "the forwarder comes back at once");
        let p = q.pass(3, 0).unwrap();
        assert_eq!((p.forwarded, p.sq_tail), (1, Some(3)), "the third on the next");
        assert_eq!(sqe_at(&rsq, 2).prp1, DATA);
        assert_eq!(q.pass(3, 0).unwrap().forwarded, 0);
    }

    #[test]
    fn a_stale_completion_does_not_complete_the_slots_next_command() {
        // A controller that posts a completion twice (or late, after a
        // timeout): by then the slot may carry a new command. Completing
        // that one early would free its list pages and release it from
        // the unregistration wait while the controller still runs it.
        let (mut q, [csq, ccq, rsq, rcq]) = queue();
        put_sqe(&csq, 0, &read(1, DATA));
        q.pass(1, 0).unwrap();
        let a = sqe_at(&rsq, 0).cid();
        complete(&rcq, 0, a, 1, true);
        put_sqe(&csq, 1, &read(2, DATA));
        let p = q.pass(2, 0).unwrap();
        assert_eq!((p.forwarded, cqe_at(&ccq, 0).cid), (1, 1));
        let b = sqe_at(&rsq, 1).cid();
        // The duplicate of A's completion arrives while B is in flight.
        complete(&rcq, 1, a, 2, true);
        let p = q.pass(2, 1).unwrap();
        assert_eq!(p.stray, 1, "A's CID again is no outstanding command");
        assert!(!cqe_at(&ccq, 1).phase(), "nothing posted for B yet");
        complete(&rcq, 2, b, 2, true);
        q.pass(2, 1).unwrap();
        assert_eq!((cqe_at(&ccq, 1).cid, cqe_at(&ccq, 1).phase()), (2, true));
    }

    #[test]
    fn bad_shadow_words_are_violations() {
        let (mut q, _) = queue();
        assert!(matches!(q.pass(E, 0), Err(Violation::SqTail { .. })));
        assert!(matches!(q.pass(0, 1), Err(Violation::CqHead { .. })), "nothing posted");
        assert!(matches!(q.pass(0, E), Err(Violation::CqHead { .. })));
    }

    /// A PRP-ish value: inside the registration (page aligned or not),
    /// just past it, in the daemon's list pages, or anything.
    fn pointer() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![
            (0u64..4, 0u64..4096).prop_map(|(p, o)| DATA + p * 4096 + (o & !3)),
            (0u64..4).prop_map(|p| DATA + p * 4096),
            Just(DATA + 4 * 4096),
            (0u64..3).prop_map(|p| LISTS + p * 4096),
            any::<u64>(),
        ]
    }

    /// Mostly allowed opcodes, sometimes anything.
    fn opcode() -> impl proptest::strategy::Strategy<Value = u8> {
        use proptest::prelude::*;
        prop_oneof![3 => 0u8..3, 1 => Just(8u8), 1 => any::<u8>()]
    }

    /// Mostly the served namespace.
    fn nsid() -> impl proptest::strategy::Strategy<Value = u32> {
        use proptest::prelude::*;
        prop_oneof![3 => Just(1u32), 1 => any::<u32>()]
    }

    /// CDW0 bits past OPC: mostly a CID alone, sometimes FUSE/PSDT set.
    fn cdw0_high() -> impl proptest::strategy::Strategy<Value = u32> {
        use proptest::prelude::*;
        prop_oneof![3 => any::<u16>().prop_map(|c| u32::from(c) << 16), 1 => any::<u32>()]
    }

    /// NLB 0..40, mostly without flags, sometimes any CDW12 bits 31:16.
    fn cdw12() -> impl proptest::strategy::Strategy<Value = u32> {
        use proptest::prelude::*;
        (0u32..40, prop_oneof![3 => Just(0u32), 1 => any::<u32>()]).prop_map(|(n, hi)| n | (hi & 0xffff_0000))
    }

    /// Whether `addr .. addr + len` lies inside the client's registration.
    fn owned(addr: u64, len: u64) -> bool {
        addr >= DATA && addr.checked_add(len).is_some_and(|e| e <= DATA + 4 * 4096)
    }

    proptest::proptest! {
        /// Whatever a client writes (SQEs, PRP list bytes, shadow words),
        /// nothing panics, and every entry the controller gets has PRPs
        /// (and, for a list, every entry of the daemon's copy) inside the
        /// client's own registration.
        #[test]
        fn client_input_never_panics_nor_escapes_the_registration(
            sqes in proptest::collection::vec((opcode(), nsid(), cdw12(), pointer(), pointer(), cdw0_high()), 1..4),
            list in proptest::collection::vec(pointer(), 512),
            list_at in 0usize..4,
            words in (0u32..6, 0u32..6),
        ) {
            let (mut q, [csq, _ccq, rsq, _rcq], [client, lists]) = queue_with_memory();
            for (i, e) in list.iter().enumerate() {
                client.write64(list_at * PAGE + (i % 512) * 8, *e).unwrap();
            }
            for (i, (opc, nsid, nlb, prp1, prp2, cdw0_hi)) in sqes.iter().enumerate() {
                let mut s = Sqe::new(*opc, *nsid);
                s.cdw0 |= cdw0_hi & 0xffff_c300; // CID, PSDT, FUSE bits
                (s.prp1, s.prp2, s.cdw12) = (*prp1, *prp2, *nlb);
                put_sqe(&csq, i as u32, &s);
            }
            let n = sqes.len() as u32;
            let _ = q.pass(words.0, words.1);
            let p = match q.pass(n, 0) {
                Ok(p) => p,
                Err(_) => return Ok(()),
            };
            for i in 0..p.forwarded as u32 {
                let s = sqe_at(&rsq, i);
                // Only checked fields reach the controller.
                proptest::prop_assert_eq!((s.nsid, s.fuse(), s.psdt(), s.mptr), (1, 0, 0, 0));
                proptest::prop_assert_eq!([s.cdw2, s.cdw3, s.cdw13, s.cdw14, s.cdw15], [0; 5]);
                proptest::prop_assert_eq!(s.cdw12 & !sqe::WZ_CDW12, 0);
                let bytes = (u64::from(s.cdw12 & 0xffff) + 1) * 4096;
                if matches!(s.opcode(), 0x00 | 0x08) {
                    proptest::prop_assert_eq!((s.prp1, s.prp2), (0, 0));
                    continue;
                }
                let first = bytes.min(4096 - s.prp1 % 4096);
                proptest::prop_assert!(owned(s.prp1, first), "PRP1 {:#x}", s.prp1);
                let rest = bytes - first;
                if rest > 4096 {
                    let slot = u64::from(s.cid() & 0x3ff);
                    proptest::prop_assert_eq!(s.prp2, LISTS + slot * 4096);
                    for k in 0..rest.div_ceil(4096) as usize {
                        let e = lists.read64(slot as usize * PAGE + k * 8).unwrap();
                        proptest::prop_assert!(owned(e, 4096.min(rest - k as u64 * 4096)) && e.is_multiple_of(4096));
                    }
                } else if rest > 0 {
                    proptest::prop_assert!(owned(s.prp2, rest) && s.prp2.is_multiple_of(4096), "PRP2 {:#x}", s.prp2);
                }
            }
        }
    }
}
