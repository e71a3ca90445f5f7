//! The KV block cache index kept by the replay.
//!
//! The store on NVMe has a fixed number of block-sized *slots*. The index
//! maps a block's hash id to the slot holding it and evicts the least
//! recently used block when a new block needs a slot and none is free.
//!
//! # Requests and protection
//!
//! A request touches all its blocks (loads of cached ones, saves of new
//! ones); its own blocks must not evict each other. The cache keeps a
//! *request epoch*: call [`BlockCache::begin_request`] before handling a
//! request, and every [`lookup`](BlockCache::lookup) hit or
//! [`insert`](BlockCache::insert) stamps the block with the current epoch.
//! A stamped block is never evicted during the same request. If every
//! resident block belongs to the current request (the request needs more
//! blocks than there are slots), `insert` returns [`Uncacheable`] instead of
//! evicting: the caller reports the block as not cacheable (it is neither
//! saved nor loaded).
//!
//! Because a touch moves a block to the most-recently-used end, the blocks
//! of the current request are always the most recent ones; so the LRU tail
//! is evictable exactly when it is not stamped, and every operation is O(1)
//! (a `HashMap` plus a doubly-linked list threaded through a `Vec`).
//!
//! # Versions
//!
//! Every slot has a write counter: each (re)write of a slot — an insert of a
//! new block or a rewrite of a resident one — increments it, starting from 1
//! for the first write. The pair (slot, version) is unique over the life of
//! the cache, so keying block contents by (hash, version) (see
//! [`crate::pattern`]) lets a load detect a stale or misdirected read.

use std::collections::HashMap;

const NIL: u32 = u32::MAX;

/// Where a block lives: the slot index and the version written there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Slot index in the store, `0..slots`. The byte offset of the block in
    /// the store is `index * block_bytes`.
    pub index: u32,
    /// The slot's write counter at the time of the block's last write
    /// (1 for the first write of the slot).
    pub version: u64,
}

/// The result of a successful [`BlockCache::insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insert {
    /// The slot the block must now be written to, with the new version.
    pub slot: Slot,
    /// The hash id of the block evicted to make room, if any (its slot is
    /// `slot.index`).
    pub evicted: Option<u64>,
}

/// [`BlockCache::insert`] found no slot: every slot holds a block of the
/// current request (or the cache has no slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("block {hash:#x} is not cacheable: all {slots} slots hold blocks of the current request")]
pub struct Uncacheable {
    /// The block that could not be placed.
    pub hash: u64,
    /// The cache capacity in slots.
    pub slots: u32,
}

#[derive(Debug, Clone)]
struct Node {
    hash: u64,
    version: u64,
    epoch: u64,
    prev: u32,
    next: u32,
    resident: bool,
}

/// Hash id -> slot index with LRU eviction over a fixed number of slots.
///
/// See the [module documentation](self) for request protection and versions.
#[derive(Debug, Clone)]
pub struct BlockCache {
    slots: u32,
    map: HashMap<u64, u32>,
    /// Slots ever used, indexed by slot (grows up to `slots`).
    nodes: Vec<Node>,
    /// Slots freed by [`BlockCache::remove`], reused first (LIFO).
    free: Vec<u32>,
    /// Most recently used resident slot.
    head: u32,
    /// Least recently used resident slot.
    tail: u32,
    epoch: u64,
}

impl BlockCache {
    /// An empty cache over `slots` slots. Memory grows with the slots used,
    /// not with `slots`.
    pub fn new(slots: u32) -> Self {
        Self {
            slots,
            map: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            epoch: 1,
        }
    }

    /// Capacity in slots.
    pub fn capacity(&self) -> u32 {
        self.slots
    }

    /// Resident blocks.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no block is resident.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Starts a new request: blocks touched from now on are protected from
    /// eviction until the next call. Returns the new epoch number.
    pub fn begin_request(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }

    /// Where `hash` lives, without touching the LRU order or the epoch.
    pub fn peek(&self, hash: u64) -> Option<Slot> {
        self.map.get(&hash).map(|&i| self.slot(i))
    }

    /// Whether `hash` is resident (no LRU touch).
    pub fn contains(&self, hash: u64) -> bool {
        self.map.contains_key(&hash)
    }

    /// Looks `hash` up. A hit makes the block most recently used and
    /// protects it for the current request.
    pub fn lookup(&mut self, hash: u64) -> Option<Slot> {
        let i = *self.map.get(&hash)?;
        self.touch(i);
        Some(self.slot(i))
    }

    /// Places `hash` in a slot to be written, incrementing that slot's
    /// version, making it most recently used and protecting it for the
    /// current request.
    ///
    /// - If `hash` is already resident, it is rewritten in place (no
    ///   eviction).
    /// - Otherwise it takes a free slot, or evicts the least recently used
    ///   block not touched in the current request.
    /// - If neither is possible, returns [`Uncacheable`] and changes nothing.
    pub fn insert(&mut self, hash: u64) -> Result<Insert, Uncacheable> {
        if let Some(&i) = self.map.get(&hash) {
            self.touch(i);
            let node = &mut self.nodes[i as usize];
            node.version += 1;
            return Ok(Insert { slot: self.slot(i), evicted: None });
        }
        let (index, evicted) = if let Some(i) = self.free.pop() {
            (i, None)
        } else if (self.nodes.len() as u64) < u64::from(self.slots) {
            let i = self.nodes.len() as u32;
            self.nodes.push(Node { hash, version: 0, epoch: 0, prev: NIL, next: NIL, resident: false });
            (i, None)
        } else {
            let t = self.tail;
            if t == NIL || self.nodes[t as usize].epoch == self.epoch {
                return Err(Uncacheable { hash, slots: self.slots });
            }
            let old = self.nodes[t as usize].hash;
            self.unlink(t);
            self.map.remove(&old);
            self.nodes[t as usize].resident = false;
            (t, Some(old))
        };
        let epoch = self.epoch;
        let node = &mut self.nodes[index as usize];
        node.hash = hash;
        node.version += 1;
        node.epoch = epoch;
        node.resident = true;
        self.push_front(index);
        self.map.insert(hash, index);
        Ok(Insert { slot: self.slot(index), evicted })
    }

    /// Drops `hash` from the cache (e.g. after a failed write), freeing its
    /// slot. Returns where it was. The slot keeps its version counter.
    pub fn remove(&mut self, hash: u64) -> Option<Slot> {
        let i = self.map.remove(&hash)?;
        let slot = self.slot(i);
        self.unlink(i);
        self.nodes[i as usize].resident = false;
        self.free.push(i);
        Some(slot)
    }

    /// Resident hash ids from most to least recently used (O(len)).
    pub fn iter_mru(&self) -> impl Iterator<Item = (u64, Slot)> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = cur;
            cur = self.nodes[i as usize].next;
            Some((self.nodes[i as usize].hash, self.slot(i)))
        })
    }

    fn slot(&self, i: u32) -> Slot {
        Slot { index: i, version: self.nodes[i as usize].version }
    }

    fn touch(&mut self, i: u32) {
        self.nodes[i as usize].epoch = self.epoch;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let n = &self.nodes[i as usize];
            (n.prev, n.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        let n = &mut self.nodes[i as usize];
        n.prev = NIL;
        n.next = NIL;
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = NIL;
            n.next = old;
        }
        if old == NIL {
            self.tail = i;
        } else {
            self.nodes[old as usize].prev = i;
        }
        self.head = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    #[test]
    fn fills_then_evicts_lru() {
        let mut c = BlockCache::new(3);
        c.begin_request();
        for h in [10, 11, 12] {
            let ins = c.insert(h).unwrap();
            assert_eq!(ins.evicted, None);
            assert_eq!(ins.slot.version, 1);
        }
        assert_eq!(c.len(), 3);
        c.begin_request();
        assert_eq!(c.lookup(10).map(|s| s.index), Some(0)); // 11 is now LRU
        let ins = c.insert(13).unwrap();
        assert_eq!(ins.evicted, Some(11));
        assert_eq!(ins.slot, Slot { index: 1, version: 2 });
        assert_eq!(c.lookup(11), None);
        assert_eq!(c.iter_mru().map(|(h, _)| h).collect::<Vec<_>>(), vec![13, 10, 12]);
    }

    #[test]
    fn current_request_blocks_are_protected() {
        let mut c = BlockCache::new(2);
        c.begin_request();
        assert!(c.insert(1).is_ok());
        assert!(c.insert(2).is_ok());
        assert_eq!(c.insert(3), Err(Uncacheable { hash: 3, slots: 2 }));
        assert_eq!(c.len(), 2);
        assert!(c.contains(1) && c.contains(2) && !c.contains(3));

        c.begin_request();
        assert!(c.lookup(2).is_some());
        // 1 is not part of this request: evictable.
        assert_eq!(c.insert(3).unwrap().evicted, Some(1));
        // now 2 and 3 both belong to this request.
        assert!(c.insert(4).is_err());
    }

    #[test]
    fn rewrite_bumps_version_in_place() {
        let mut c = BlockCache::new(2);
        let a = c.insert(7).unwrap().slot;
        let b = c.insert(7).unwrap();
        assert_eq!(b.evicted, None);
        assert_eq!(b.slot.index, a.index);
        assert_eq!(b.slot.version, a.version + 1);
        assert_eq!(c.peek(7), Some(b.slot));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn zero_slots_and_remove() {
        let mut c = BlockCache::new(0);
        assert!(c.insert(1).is_err());
        assert!(c.is_empty());

        let mut c = BlockCache::new(2);
        let s = c.insert(1).unwrap().slot;
        c.insert(2).unwrap();
        assert_eq!(c.remove(1), Some(s));
        assert_eq!(c.remove(1), None);
        let s2 = c.insert(3).unwrap();
        assert_eq!(s2.evicted, None);
        assert_eq!(s2.slot.index, s.index);
        assert_eq!(s2.slot.version, s.version + 1);
    }

    /// The naive semantics: a Vec ordered most recently used first.
    #[derive(Default)]
    struct Reference {
        cap: usize,
        /// (hash, epoch of last touch)
        lru: Vec<(u64, u64)>,
        epoch: u64,
    }

    impl Reference {
        fn touch(&mut self, pos: usize) {
            let (h, _) = self.lru.remove(pos);
            self.lru.insert(0, (h, self.epoch));
        }
        fn lookup(&mut self, h: u64) -> bool {
            match self.lru.iter().position(|e| e.0 == h) {
                Some(p) => {
                    self.touch(p);
                    true
                }
                None => false,
            }
        }
        /// Ok(evicted) or Err(()) when uncacheable.
        fn insert(&mut self, h: u64) -> Result<Option<u64>, ()> {
            if let Some(p) = self.lru.iter().position(|e| e.0 == h) {
                self.touch(p);
                return Ok(None);
            }
            let mut evicted = None;
            if self.lru.len() >= self.cap {
                // least recently used entry not touched in this request
                let victim = self.lru.iter().rposition(|e| e.1 != self.epoch).ok_or(())?;
                evicted = Some(self.lru.remove(victim).0);
            }
            self.lru.insert(0, (h, self.epoch));
            Ok(evicted)
        }
        fn remove(&mut self, h: u64) -> bool {
            match self.lru.iter().position(|e| e.0 == h) {
                Some(p) => {
                    self.lru.remove(p);
                    true
                }
                None => false,
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Begin,
        Lookup(u64),
        Insert(u64),
        Remove(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => Just(Op::Begin),
            4 => (0u64..24).prop_map(Op::Lookup),
            5 => (0u64..24).prop_map(Op::Insert),
            1 => (0u64..24).prop_map(Op::Remove),
        ]
    }

    proptest! {
        #[test]
        fn matches_reference_lru(cap in 0u32..10, ops in proptest::collection::vec(op(), 0..300)) {
            let mut c = BlockCache::new(cap);
            let mut r = Reference { cap: cap as usize, ..Default::default() };
            // slot index -> last version written there
            let mut versions: HashMap<u32, u64> = HashMap::new();
            // hash -> slot it was placed in
            let mut placed: HashMap<u64, Slot> = HashMap::new();
            for op in ops {
                match op {
                    Op::Begin => {
                        c.begin_request();
                        r.epoch += 1;
                    }
                    Op::Lookup(h) => {
                        let got = c.lookup(h);
                        prop_assert_eq!(got.is_some(), r.lookup(h));
                        if let Some(s) = got {
                            prop_assert_eq!(Some(&s), placed.get(&h));
                        }
                    }
                    Op::Insert(h) => {
                        let got = c.insert(h);
                        let want = r.insert(h);
                        match (got, want) {
                            (Ok(ins), Ok(ev)) => {
                                prop_assert_eq!(ins.evicted, ev);
                                prop_assert!(ins.slot.index < cap);
                                let prev = versions.insert(ins.slot.index, ins.slot.version).unwrap_or(0);
                                prop_assert_eq!(ins.slot.version, prev + 1);
                                if let Some(e) = ev {
                                    let old = placed.remove(&e).unwrap();
                                    prop_assert_eq!(old.index, ins.slot.index);
                                }
                                if let Some(old) = placed.insert(h, ins.slot) {
                                    prop_assert_eq!(old.index, ins.slot.index);
                                }
                            }
                            (Err(e), Err(())) => prop_assert_eq!(e.hash, h),
                            (got, want) => prop_assert!(false, "insert({}): {:?} vs {:?}", h, got, want),
                        }
                    }
                    Op::Remove(h) => {
                        let got = c.remove(h);
                        prop_assert_eq!(got.is_some(), r.remove(h));
                        if got.is_some() {
                            prop_assert_eq!(got, placed.remove(&h));
                        }
                    }
                }
                prop_assert_eq!(c.len(), r.lru.len());
                let order: Vec<u64> = c.iter_mru().map(|(h, _)| h).collect();
                let want: Vec<u64> = r.lru.iter().map(|e| e.0).collect();
                prop_assert_eq!(order, want);
                let used: HashSet<u32> = c.iter_mru().map(|(_, s)| s.index).collect();
                prop_assert_eq!(used.len(), c.len());
            }
        }
    }
}
