//! In-order SQ tail publication for several submitters sharing one SQ
//! (NVMe Base 2.0 3.3.1: the tail doorbell says "every entry before this
//! one is valid").
//!
//! The CPU [`super::QueuePair`] has one owner at a time (`&mut self`), so it
//! needs none of this. Submitters that fill SQ slots concurrently (the GPU
//! kernel's threads, `kernels/tutti_io.cu`, or CPU threads sharing a ring)
//! do it in four steps:
//!
//! 1. reserve a ticket ([`TailPublisher::reserve`]): slot = ticket mod size;
//! 2. write the SQE into the slot;
//! 3. mark the ticket ready ([`TailPublisher::mark_ready`], Release);
//! 4. publish ([`TailPublisher::publish`]): under a try-lock, advance the
//!    published tail over the contiguous prefix of ready tickets and ring
//!    the doorbell once with it.
//!
//! So the tail only moves forward, only over written SQEs, and a submitter
//! that finishes early (slot 5) waits for the one before it (slot 4): with
//! 4 published, the doorbell goes 4 -> 6 once both are written, never
//! 4 -> 6 -> 5 and never 5 before 4. The doorbell store happens inside the
//! lock, so two publishers cannot write tails out of order. A submitter
//! that finds the lock taken leaves the work to its holder, which looks
//! again after unlocking (the SeqCst ready-store / lock / re-check order
//! makes sure one of the two sees the new ticket).
//!
//! This is the CPU model of the kernel's `publish()`; its tests pin the
//! ordering the kernel relies on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Multi-producer tail publisher for an SQ of `size` entries.
#[derive(Debug)]
pub struct TailPublisher {
    size: u32,
    /// Next ticket to hand out (monotonic).
    reserve: AtomicU64,
    /// Tickets published (monotonic; the tail is this mod size).
    published: AtomicU64,
    /// Tickets the controller has fetched (monotonic, from SQHD); a ticket
    /// is handed out only if its slot's previous ticket was fetched.
    head: AtomicU64,
    /// Per slot: ticket + 1 once that ticket's SQE is written.
    ready: Box<[AtomicU64]>,
    lock: AtomicBool,
}

impl TailPublisher {
    /// A publisher for an SQ of `size` entries (2..=65536, like
    /// [`super::Ring`]).
    pub fn new(size: u32) -> Option<Self> {
        super::Ring::new(size)?;
        Some(Self {
            size,
            reserve: AtomicU64::new(0),
            published: AtomicU64::new(0),
            head: AtomicU64::new(0),
            ready: (0..size).map(|_| AtomicU64::new(0)).collect(),
            lock: AtomicBool::new(false),
        })
    }

    /// Entries in the SQ.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// SQ slot of `ticket`.
    pub fn slot(&self, ticket: u64) -> u32 {
        (ticket % u64::from(self.size)) as u32
    }

    /// Reserves the next ticket, or `None` when `size - 1` tickets are
    /// reserved and not yet fetched (one slot always stays empty).
    pub fn reserve(&self) -> Option<u64> {
        let mut t = self.reserve.load(Ordering::Relaxed);
        loop {
            if t >= self.head.load(Ordering::Acquire) + u64::from(self.size) - 1 {
                return None;
            }
            match self.reserve.compare_exchange_weak(t, t + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(t),
                Err(now) => t = now,
            }
        }
    }

    /// Marks `ticket`'s SQE as written. SeqCst (a Release at least): the
    /// SQE stores before it are visible to whoever publishes the ticket.
    pub fn mark_ready(&self, ticket: u64) {
        self.ready[self.slot(ticket) as usize].store(ticket + 1, Ordering::SeqCst);
    }

    /// Tickets published so far (the SQ tail is this mod size).
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Records that the controller fetched every ticket before `ticket`
    /// (from a CQE's SQHD); only moves forward.
    pub fn set_head(&self, ticket: u64) {
        self.head.fetch_max(ticket.min(self.published()), Ordering::AcqRel);
    }

    /// Publishes the contiguous ready tickets after the published tail,
    /// calling `ring` with the new tail (mod size) once per advance. Returns
    /// the published ticket count afterwards, or `None` if another
    /// submitter holds the lock (it publishes for everyone).
    pub fn publish(&self, mut ring: impl FnMut(u32)) -> Option<u64> {
        let mut p = None;
        loop {
            if self.lock.compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed).is_err() {
                return p;
            }
            let start = self.published.load(Ordering::Acquire);
            let mut end = start;
            while self.is_ready(end) {
                end += 1;
            }
            if end != start {
                self.published.store(end, Ordering::Release);
                // Inside the lock: doorbell values leave in ticket order.
                ring(self.slot(end));
            }
            self.lock.store(false, Ordering::SeqCst);
            p = Some(end);
            // A ticket marked ready while we held the lock (its submitter's
            // try-lock failed) is ours to publish.
            if !self.is_ready(end) {
                return p;
            }
        }
    }

    fn is_ready(&self, ticket: u64) -> bool {
        self.ready[self.slot(ticket) as usize].load(Ordering::SeqCst) == ticket + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::{Arc, Barrier, Mutex};

    #[test]
    fn two_submitters_finishing_out_of_order_on_an_8_entry_queue() {
        let p = TailPublisher::new(8).unwrap();
        let mut rung = Vec::new();
        for t in 0..4 {
            assert_eq!(p.reserve(), Some(t));
            p.mark_ready(t);
        }
        p.publish(|v| rung.push(v));
        assert_eq!(rung, [4]);
        let (a, b) = (p.reserve().unwrap(), p.reserve().unwrap());
        assert_eq!((p.slot(a), p.slot(b)), (4, 5));
        // The holder of slot 5 finishes first: nothing is published.
        p.mark_ready(b);
        assert_eq!(p.publish(|v| rung.push(v)), Some(4));
        assert_eq!(rung, [4]);
        // Slot 4 done: 4 -> 6 in one doorbell write.
        p.mark_ready(a);
        assert_eq!(p.publish(|v| rung.push(v)), Some(6));
        assert_eq!(rung, [4, 6]);
    }

    #[test]
    fn the_same_with_two_threads_in_that_order() {
        let p = Arc::new(TailPublisher::new(8).unwrap());
        let rung = Arc::new(Mutex::new(Vec::new()));
        for t in 0..4 {
            p.reserve().unwrap();
            p.mark_ready(t);
        }
        p.publish(|v| rung.lock().unwrap().push(v));
        let (t4, t5) = (p.reserve().unwrap(), p.reserve().unwrap());
        let first_done = Arc::new(Barrier::new(2));
        let spawn = |t: u64, wait_first: bool| {
            let (p, rung, first_done) = (p.clone(), rung.clone(), first_done.clone());
            std::thread::spawn(move || {
                if wait_first {
                    first_done.wait();
                }
                p.mark_ready(t);
                p.publish(|v| rung.lock().unwrap().push(v));
                if !wait_first {
                    first_done.wait();
                }
            })
        };
        let h5 = spawn(t5, false);
        let h4 = spawn(t4, true);
        h5.join().unwrap();
        h4.join().unwrap();
        assert_eq!(*rung.lock().unwrap(), [4, 6]);
    }

    #[test]
    fn many_threads_publish_every_ticket_in_order() {
        let p = Arc::new(TailPublisher::new(16).unwrap());
        let rung = Arc::new(Mutex::new(vec![0u64]));
        let per = 5000u64;
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (p, rung) = (p.clone(), rung.clone());
                std::thread::spawn(move || {
                    let mut n = 0;
                    while n < per {
                        let Some(t) = p.reserve() else {
                            // The "controller" fetches what is published.
                            p.set_head(p.published());
                            std::hint::spin_loop();
                            continue;
                        };
                        p.mark_ready(t);
                        p.publish(|_| {
                            let pubd = p.published.load(Ordering::Relaxed);
                            rung.lock().unwrap().push(pubd);
                        });
                        n += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        // Stragglers: whoever marked last may have lost the lock race to a
        // holder that then re-checked; either way all is published.
        p.publish(|_| {});
        assert_eq!(p.published(), 4 * per);
        let r = rung.lock().unwrap();
        assert!(r.windows(2).all(|w| w[0] < w[1]), "doorbell values in ticket order");
        assert_eq!(*r.last().unwrap(), 4 * per);
    }

    proptest! {
        /// Any interleaving of reserve / write / publish steps of several
        /// submitters: each doorbell value is the contiguous ready prefix at
        /// that moment (never past an unwritten slot), values move forward
        /// only, and everything is published at the end.
        #[test]
        fn random_interleavings_match_the_model(
            size in 2u32..12,
            steps in proptest::collection::vec((0usize..4, any::<bool>()), 1..200),
        ) {
            let p = TailPublisher::new(size).unwrap();
            // Per submitter: the ticket it holds, not yet marked.
            let mut holding: [Option<u64>; 4] = [None; 4];
            let mut written = std::collections::BTreeSet::new();
            let mut last = 0u64;
            for (who, fetch) in steps {
                match holding[who].take() {
                    None => holding[who] = p.reserve(),
                    Some(t) => {
                        p.mark_ready(t);
                        written.insert(t);
                    }
                }
                let mut rung = Vec::new();
                let r = p.publish(|v| rung.push(v));
                let model = (last..).find(|t| !written.contains(t)).unwrap();
                prop_assert_eq!(r, Some(model));
                if model != last {
                    prop_assert_eq!(rung, vec![(model % u64::from(size)) as u32]);
                } else {
                    prop_assert!(rung.is_empty());
                }
                last = model;
                if fetch {
                    p.set_head(last);
                }
            }
            for t in holding.into_iter().flatten() {
                p.mark_ready(t);
            }
            p.publish(|_| {});
            prop_assert_eq!(p.published(), p.reserve.load(Ordering::Relaxed));
        }
    }
}
