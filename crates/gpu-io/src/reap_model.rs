//! A CPU model of the kernel's block-cooperative completion reaping
//! (`block_reap`, `take_cqe` and the CQ head update of the rounds in
//! `kernels/tutti_io.cu`), thread for thread, checked against a sequential
//! reaper (the one-CQE-at-a-time loop of an earlier kernel), so that the
//! reaping arithmetic (the run before the first gap, the window across the
//! ring's wrap, phase tags, SQHD, per-CID delivery and the counters) is
//! tested on machines without a GPU. A change to the kernel's reaping must
//! be mirrored here.

#![cfg(test)]

/// `WAITING` in the kernel: a command waits on this CID's cell.
const WAITING: u32 = 1;

/// `ABANDONED` in the kernel: its command timed out; the drive may still
/// complete it.
const ABANDONED: u32 = 2;

/// One CQE as the reaper reads it: DW2 (SQID 31:16, SQHD 15:0) and DW3
/// (status 31:17, phase tag 16, CID 15:0), NVMe Base 2.0 4.2.1.
#[derive(Debug, Clone, Copy, Default)]
struct Cqe {
    dw2: u32,
    dw3: u32,
}

/// A queue's reaping state (the kernel's `TuttiQueueState` fields it uses)
/// and the per-CID cells.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reaper {
    size: u32,
    qid: u32,
    cq_head: u64,
    phase: u32,
    sq_head: u64,
    published: u64,
    /// SQ entries known fetched (`BlockQueue::fetched`): slots below
    /// `fetched + size - 1` may be written.
    fetched: u64,
    /// The CID written into each SQ slot (`slot_cid` in the kernel).
    slot_cid: Vec<u32>,
    stale: u32,
    bad_sqid: u32,
    bad_sqhd: u32,
    done: Vec<u32>,
    /// Values written to the CQ head doorbell, in order.
    doorbells: Vec<u32>,
}

/// What one thread's CQE did (`take_cqe`).
#[derive(Default, Clone, Copy)]
struct Taken {
    stale: bool,
    foreign: bool,
    ok_sqhd: bool,
    ahead: u32,
}

impl Reaper {
    /// `take_cqe`: SQID, SQHD against `sq_head`, CID delivery.
    fn take(&mut self, c: Cqe, sq_head: u64, published: u64) -> Taken {
        let mut t = Taken::default();
        if c.dw2 >> 16 != self.qid {
            t.foreign = true;
            t.stale = true;
            return t;
        }
        let sqhd = c.dw2 & 0xFFFF;
        t.ahead = (sqhd + self.size - (sq_head % u64::from(self.size)) as u32) % self.size;
        t.ok_sqhd = sqhd < self.size && sq_head + u64::from(t.ahead) <= published;
        let cid = (c.dw3 & 0xFFFF) as usize;
        let value = (c.dw3 & 0xFFFE_0000) | 0x1_0000 | cid as u32;
        if self.done[cid] == WAITING {
            self.done[cid] = value;
        } else {
            t.stale = true;
            // A late CQE gives back the CID of a command that timed out,
            // and says its entry was fetched (`late_fetched`).
            if self.done[cid] == ABANDONED {
                self.late_fetched(cid as u32, published);
                self.done[cid] = 0;
            }
        }
        t
    }

    /// `late_fetched`: the entry of the timed-out command holding `cid`,
    /// among those not yet known fetched, and every one before it, were
    /// fetched.
    fn late_fetched(&mut self, cid: u32, tail: u64) {
        let size = u64::from(self.size);
        if let Some(p) = (self.fetched..tail).find(|&p| self.slot_cid[(p % size) as usize] == cid) {
            self.fetched = self.fetched.max(p + 1);
        }
    }

    /// SQ slots a round may write (`free_slots` in the kernel).
    fn free_slots(&self) -> u64 {
        self.fetched + u64::from(self.size) - 1 - self.published
    }

    /// One round's `block_reap` with `window` threads (thread t tests CQ
    /// slot `cq_head + t`), then thread 0's update: the CQ head doorbell,
    /// the head, the phase, the SQ head moved by the furthest valid SQHD.
    /// Returns how many entries the block took.
    fn pass(&mut self, cq: &[Cqe], window: u32) -> u32 {
        let (head, phase) = (self.cq_head, self.phase);
        let mut read = Vec::with_capacity(window as usize);
        // `gap` is the atomicMin of the threads that found their slot
        // unposted (the window when none did).
        let mut gap = window;
        for t in 0..window {
            let pos = (head % u64::from(self.size)) as u32 + t;
            let expected = if pos >= self.size { phase ^ 1 } else { phase };
            let c = cq[(pos % self.size) as usize];
            if (c.dw3 >> 16) & 1 != expected {
                gap = gap.min(t);
            }
            read.push(c);
        }
        let take = gap;
        let (sq_head, published) = (self.sq_head, self.published);
        let mut ahead = 0;
        for c in read.into_iter().take(take as usize) {
            let r = self.take(c, sq_head, published);
            self.stale += u32::from(r.stale);
            self.bad_sqid += u32::from(r.foreign);
            if !r.foreign && !r.ok_sqhd {
                self.bad_sqhd += 1;
            }
            if r.ok_sqhd {
                ahead = ahead.max(r.ahead);
            }
        }
        if take != 0 {
            self.doorbells.push(((head + u64::from(take)) % u64::from(self.size)) as u32);
            if (head % u64::from(self.size)) as u32 + take >= self.size {
                self.phase ^= 1;
            }
            self.cq_head = head + u64::from(take);
            self.sq_head += u64::from(ahead);
        }
        take
    }

    /// Rounds of a block of `n` reaping threads, with no new CQE posted
    /// meanwhile, until a round takes fewer than its window (at most one
    /// lap of the ring).
    fn block_reap(&mut self, cq: &[Cqe], n: u32) {
        let mut consumed = 0u32;
        while consumed < self.size {
            let window = n.min(self.size - consumed);
            let take = self.pass(cq, window);
            consumed += take;
            if take < window {
                break;
            }
        }
    }

    /// The previous kernel's `reap`: one CQE at a time, the SQ head moved
    /// by each valid SQHD in turn, one doorbell at the end.
    fn sequential_reap(&mut self, cq: &[Cqe]) {
        let (mut head, mut phase, mut consumed) = (self.cq_head, self.phase, 0u32);
        while consumed < self.size {
            let c = cq[(head % u64::from(self.size)) as usize];
            if (c.dw3 >> 16) & 1 != phase {
                break;
            }
            let r = self.take(c, self.sq_head, self.published);
            self.stale += u32::from(r.stale);
            self.bad_sqid += u32::from(r.foreign);
            if !r.foreign {
                if r.ok_sqhd {
                    self.sq_head += u64::from(r.ahead);
                } else {
                    self.bad_sqhd += 1;
                }
            }
            head += 1;
            consumed += 1;
            if head % u64::from(self.size) == 0 {
                phase ^= 1;
            }
        }
        if consumed != 0 {
            self.cq_head = head;
            self.phase = phase;
            self.doorbells.push((head % u64::from(self.size)) as u32);
        }
    }
}

/// xorshift64*: deterministic cases without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A random reaping situation: a CQ of `size` entries whose head is at
/// `cq_head`, `k` entries posted in order from it (each with the phase tag
/// of its pass), possibly some later slots seen posted after an unposted
/// one (written while the lanes read), commands waiting on most CIDs, and
/// some unknown, duplicate and foreign-SQID entries. SQHDs never go
/// backwards unless `lagging`.
fn situation(rng: &mut Rng, lagging: bool) -> (Reaper, Vec<Cqe>) {
    let size = [2u32, 3, 4, 5, 16, 31, 32, 33, 64, 100][rng.below(10) as usize];
    let cq_head = rng.below(10_000);
    let phase_at = |pos: u64| u32::from((pos / u64::from(size)).is_multiple_of(2));
    let outstanding = rng.below(u64::from(size)); // at most size - 1 in flight
    let sq_head = rng.below(10_000);
    let published = sq_head + outstanding;
    let mut r = Reaper {
        size,
        qid: 1,
        cq_head,
        phase: phase_at(cq_head),
        sq_head,
        published,
        fetched: sq_head,
        slot_cid: (0..size).map(|slot| (u64::from(slot) + 0x8000) as u32 & 0xFFFF).collect(),
        stale: 0,
        bad_sqid: 0,
        bad_sqhd: 0,
        done: vec![0; 65536],
        doorbells: Vec::new(),
    };
    // Every slot first holds an entry of the previous pass.
    let sz = u64::from(size);
    let mut cq: Vec<Cqe> = (0..sz)
        .map(|slot| {
            // The position in [cq_head, cq_head + size) that lands on `slot`.
            let pos = cq_head + (slot + sz - cq_head % sz) % sz;
            Cqe { dw2: 0x0001_0000, dw3: (phase_at(pos) ^ 1) << 16 }
        })
        .collect();
    let k = rng.below(u64::from(size)); // posted, in order
    let mut sqhd = sq_head;
    for i in 0..k {
        let pos = cq_head + i;
        let cid = (pos & 0xFFFF) as u32;
        let mut sqid = 1u32;
        let mut cid_used = cid;
        match rng.below(11) {
            10 => r.done[cid as usize] = ABANDONED, // late, after its timeout
            0 => cid_used = 0xFFF0,                 // unknown
            1 if i > 0 => cid_used = ((pos - 1) & 0xFFFF) as u32, // duplicate of the previous
            2 => sqid = 2,
            _ => r.done[cid as usize] = WAITING,
        }
        if cid_used != cid && cid_used != 0xFFF0 {
            r.done[cid as usize] = WAITING;
        }
        sqhd = (sqhd + rng.below(2)).min(published);
        let mut shown = sqhd;
        if lagging && rng.below(4) == 0 {
            shown = sqhd.saturating_sub(1 + rng.below(2));
        }
        let status = if rng.below(8) == 0 { 0x0281u32 } else { 0 };
        cq[(pos % u64::from(size)) as usize] = Cqe {
            dw2: sqid << 16 | (shown % u64::from(size)) as u32,
            dw3: status << 17 | phase_at(pos) << 16 | cid_used,
        };
    }
    // A slot after the first unposted one, seen already written.
    if k + 2 < u64::from(size) && rng.below(3) == 0 {
        let pos = cq_head + k + 1;
        r.done[(pos & 0xFFFF) as usize] = WAITING;
        cq[(pos % u64::from(size)) as usize] =
            Cqe { dw2: 1 << 16, dw3: phase_at(pos) << 16 | (pos & 0xFFFF) as u32 };
    }
    (r, cq)
}

/// Reaping threads of a block (its window's upper bound): one, a warp
/// and around it, two warps, 100, the largest block, or random.
fn threads(rng: &mut Rng) -> u32 {
    match rng.below(8) {
        0 => 1,
        1 => 31,
        2 => 32,
        3 => 33,
        4 => 64,
        5 => 100,
        6 => 1024,
        _ => 1 + rng.below(1024) as u32,
    }
}

#[test]
fn block_reaping_takes_what_the_sequential_reaper_takes() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for case in 0..5_000 {
        let (start, cq) = situation(&mut rng, false);
        let n = threads(&mut rng);
        let (mut block, mut seq) = (start.clone(), start.clone());
        block.block_reap(&cq, n);
        seq.sequential_reap(&cq);
        // One doorbell per round instead of one per reap: the last is the same.
        assert_eq!(block.doorbells.last(), seq.doorbells.last(), "case {case}, {n} threads");
        block.doorbells.clear();
        seq.doorbells.clear();
        assert_eq!(
            block,
            seq,
            "case {case}, {n} threads, start {:?}",
            (start.size, start.cq_head, start.phase)
        );
    }
}

#[test]
fn with_lagging_sqhds_the_sq_head_never_passes_what_was_published() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for case in 0..5_000 {
        let (start, cq) = situation(&mut rng, true);
        let n = threads(&mut rng);
        let (mut block, mut seq) = (start.clone(), start.clone());
        block.block_reap(&cq, n);
        seq.sequential_reap(&cq);
        // Everything but the SQ head and its counter matches the
        // sequential reaper; the head stays within what was submitted and
        // never moves back.
        assert_eq!(
            (block.cq_head, block.phase, block.stale, block.bad_sqid),
            (seq.cq_head, seq.phase, seq.stale, seq.bad_sqid),
            "case {case}"
        );
        assert_eq!(block.done, seq.done, "case {case}");
        assert!(start.sq_head <= block.sq_head && block.sq_head <= start.published, "case {case}");
    }
}

#[test]
fn a_full_ring_is_reaped_in_one_call_and_wraps_its_phase() {
    // 31 posted entries on a 32-entry CQ from head 0 (phase 1), a block of
    // 8 reaping threads: four rounds of 8, 8, 8, 7, the doorbell after each.
    let (mut r, _) = situation(&mut Rng(1), false);
    r.size = 32;
    r.cq_head = 0;
    r.phase = 1;
    r.sq_head = 0;
    r.published = 31;
    r.done.iter_mut().for_each(|c| *c = 0);
    let mut cq: Vec<Cqe> = (0..32u32)
        .map(|i| Cqe { dw2: (1 << 16) | ((i + 1) % 32), dw3: if i < 31 { (1 << 16) | i } else { 0 } })
        .collect();
    for cid in 0..31 {
        r.done[cid] = WAITING;
    }
    r.block_reap(&cq, 8);
    assert_eq!(r.doorbells, [8, 16, 24, 31]);
    assert_eq!((r.cq_head, r.phase, r.sq_head, r.stale), (31, 1, 31, 0));
    assert!((0..31u32).all(|cid| r.done[cid as usize] == 0x1_0000 | cid));
    // One more entry completes the lap: the phase flips.
    cq[31] = Cqe { dw2: 1 << 16, dw3: 1 << 16 | 31 };
    r.done[31] = WAITING;
    r.published = 32;
    r.block_reap(&cq, 8);
    assert_eq!((r.cq_head, r.phase, r.sq_head), (32, 0, 32));
}

#[test]
fn a_ring_of_timed_out_commands_frees_its_slots_when_they_complete_late() {
    // An 8-entry ring: 7 commands (CIDs 40..47) written at positions 0..6,
    // none fetched yet, all timed out (ABANDONED). The ring is full.
    let (mut r, _) = situation(&mut Rng(2), false);
    r.size = 8;
    (r.cq_head, r.phase, r.sq_head, r.published, r.fetched) = (0, 1, 0, 7, 0);
    r.done.iter_mut().for_each(|c| *c = 0);
    r.slot_cid = vec![0; 8];
    for p in 0..7u32 {
        r.slot_cid[p as usize] = 40 + p;
        r.done[(40 + p) as usize] = ABANDONED;
    }
    assert_eq!(r.free_slots(), 0, "a full ring");
    // The drive completes them late, the fourth first (its SQHD says 4),
    // then the rest in order.
    let late = |cid: u32, sqhd: u32, slot: u32| (slot, Cqe { dw2: (1 << 16) | sqhd, dw3: (1 << 16) | cid });
    let mut cq = vec![Cqe::default(); 8];
    let (slot, c) = late(43, 4, 0);
    cq[slot as usize] = c;
    r.block_reap(&cq, 8);
    assert_eq!(r.fetched, 4, "entries 0..=3 were fetched");
    assert_eq!(r.free_slots(), 4);
    for (i, cid) in [40, 41, 42, 44, 45, 46].into_iter().enumerate() {
        let (slot, c) = late(cid, 7, i as u32 + 1);
        cq[slot as usize] = c;
    }
    r.block_reap(&cq, 8);
    assert_eq!((r.cq_head, r.stale), (7, 7), "every late CQE counted stale");
    assert_eq!(r.fetched, 7, "the whole ring is known fetched");
    assert_eq!(r.free_slots(), 7, "the ring takes commands again");
    assert!((40..47).all(|cid| r.done[cid] == 0), "every CID given back");
}
