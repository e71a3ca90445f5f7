//! The in-memory index: which key lives in which slot, what each slot's
//! record on the media says, least-recently-used order, pins, and the slots
//! waiting to be cleared or reused.
//!
//! A slot's life: `Free` -> `Reserved` (payload being written, record not
//! yet written) -> `Live` (record durable, key in the map) -> `Stale` (no
//! longer live: removed, evicted or superseded; its record is still on the
//! media) -> cleared by a commit round (record zeroed and durable) ->
//! `Free`, or `Cleared` until no reader pins it (a round that fails leaves
//! the slot `Stale`, pinned or not, for the next round). A slot is only reused when the media
//! says nothing about it, so a crash can never pair an old record with a
//! new payload.

use std::collections::HashMap;

use crate::format::Record;
use crate::key::Key;

const NIL: u32 = u32::MAX;

/// Lifecycle state of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Media holds no record for it; not pinned: can be reserved.
    Free,
    /// Reserved by a put in progress.
    Reserved,
    /// Holds the live object of its key.
    Live,
    /// Not live; its record (if any) is still on the media, or a round
    /// clearing it has not ended (or failed).
    Stale,
    /// Not live, its record cleared and durable, but still pinned by a
    /// reader: free once unpinned.
    Cleared,
    /// A write to it may still be in flight (timed out): never reused while
    /// the store is open.
    Quarantined,
}

#[derive(Debug, Clone)]
struct Slot {
    state: SlotState,
    /// What the record table holds (or is being made to hold) for it.
    /// Kept while a round clears it, until that round has succeeded.
    media: Option<Record>,
    /// The round in progress writes an empty record for it.
    clearing: bool,
    pins: u32,
    prev: u32,
    next: u32,
}

/// The index of one store. Not thread-safe: the store keeps it under a
/// mutex.
#[derive(Debug)]
pub(crate) struct Index {
    slots: Vec<Slot>,
    map: HashMap<Key, u32>,
    free: Vec<u32>,
    /// Stale slots whose record must be cleared by the next round.
    to_clear: Vec<u32>,
    /// Slots the round in progress is clearing (0 between rounds).
    clearing: usize,
    /// Least recently used live slot (head) ... most recently used (tail).
    lru_head: u32,
    lru_tail: u32,
    pub next_generation: u64,
}

impl Index {
    /// An index of `capacity` free slots.
    pub fn new(capacity: u32) -> Self {
        let slot =
            Slot { state: SlotState::Free, media: None, clearing: false, pins: 0, prev: NIL, next: NIL };
        Self {
            slots: vec![slot; capacity as usize],
            map: HashMap::new(),
            free: (0..capacity).rev().collect(),
            to_clear: Vec::new(),
            clearing: 0,
            lru_head: NIL,
            lru_tail: NIL,
            next_generation: 1,
        }
    }

    /// Live objects.
    pub fn live(&self) -> usize {
        self.map.len()
    }

    /// Slots that can be reserved now.
    #[cfg(test)]
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// The record on the media for `slot`, if any.
    #[cfg(test)]
    pub fn media(&self, slot: u32) -> Option<Record> {
        self.slots[slot as usize].media
    }

    /// The record the round in progress writes for `slot`: none for a slot
    /// it clears.
    pub fn record_to_write(&self, slot: u32) -> Option<Record> {
        let s = &self.slots[slot as usize];
        if s.clearing {
            None
        } else {
            s.media
        }
    }

    /// Recovery: `slot` holds `rec` on the media. The highest generation of
    /// a key wins; the loser is left to be cleared.
    pub fn recover(&mut self, slot: u32, rec: Record) {
        let s = &mut self.slots[slot as usize];
        s.media = Some(rec);
        s.state = SlotState::Stale;
        self.next_generation = self.next_generation.max(rec.generation + 1);
        let old = self.map.get(&rec.key).copied();
        match old {
            Some(o) if self.slots[o as usize].media.is_some_and(|m| m.generation > rec.generation) => {
                self.to_clear.push(slot);
            }
            _ => {
                if let Some(o) = old {
                    self.unlink(o);
                    self.slots[o as usize].state = SlotState::Stale;
                    self.to_clear.push(o);
                }
                self.map.insert(rec.key, slot);
                self.slots[slot as usize].state = SlotState::Live;
            }
        }
    }

    /// After recovery: free slots are those with no record; live ones go
    /// into LRU order by generation (oldest first).
    pub fn finish_recovery(&mut self) {
        self.free = (0..self.slots.len() as u32)
            .rev()
            .filter(|&i| {
                self.slots[i as usize].media.is_none() && self.slots[i as usize].state != SlotState::Live
            })
            .collect();
        for &i in &self.free {
            self.slots[i as usize].state = SlotState::Free;
        }
        let mut live: Vec<u32> = self.map.values().copied().collect();
        live.sort_by_key(|&i| self.slots[i as usize].media.map_or(0, |m| m.generation));
        for i in live {
            self.push_mru(i);
        }
    }

    /// Reserves a free slot for a put.
    pub fn reserve(&mut self) -> Option<u32> {
        let i = self.free.pop()?;
        self.slots[i as usize].state = SlotState::Reserved;
        Some(i)
    }

    /// Gives back a reserved slot whose payload write failed. Its record on
    /// the media is empty, so it is free again; `quarantine` keeps it out
    /// of use (a write may still land).
    pub fn unreserve(&mut self, slot: u32, quarantine: bool) {
        let s = &mut self.slots[slot as usize];
        debug_assert_eq!(s.state, SlotState::Reserved);
        if quarantine {
            s.state = SlotState::Quarantined;
        } else {
            s.state = SlotState::Free;
            self.free.push(slot);
        }
    }

    /// Moves up to `n` least recently used unpinned live objects to stale
    /// (to be cleared by the next round); returns how many.
    pub fn evict(&mut self, n: usize) -> usize {
        let mut done = 0;
        let mut i = self.lru_head;
        while i != NIL && done < n {
            let next = self.slots[i as usize].next;
            if self.slots[i as usize].pins == 0 {
                if let Some(rec) = self.slots[i as usize].media {
                    self.map.remove(&rec.key);
                }
                self.retire(i);
                done += 1;
            }
            i = next;
        }
        done
    }

    /// The live slot of `key` and its record, pinned and made most
    /// recently used.
    pub fn pin(&mut self, key: &Key) -> Option<(u32, Record)> {
        let i = *self.map.get(key)?;
        let rec = self.slots[i as usize].media?;
        self.slots[i as usize].pins += 1;
        self.unlink(i);
        self.push_mru(i);
        Some((i, rec))
    }

    /// Releases a pin taken by [`Index::pin`].
    pub fn unpin(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.pins = s.pins.saturating_sub(1);
        // Only a slot whose clearing round has ended well: a `Stale` slot
        // with no media record may be one whose clearing round failed (or
        // is still running), its old record still on the media and the
        // slot still to be cleared by the next round.
        if s.pins == 0 && s.state == SlotState::Cleared {
            s.state = SlotState::Free;
            self.free.push(slot);
        }
    }

    /// The keys of the live objects, least recently used first.
    pub fn keys(&self) -> Vec<Key> {
        let mut out = Vec::with_capacity(self.map.len());
        let mut i = self.lru_head;
        while i != NIL {
            if let Some(rec) = self.slots[i as usize].media {
                out.push(rec.key);
            }
            i = self.slots[i as usize].next;
        }
        debug_assert_eq!(out.len(), self.map.len(), "every live object is in the LRU order");
        out
    }

    /// `true` when `key` has a live object.
    pub fn contains(&self, key: &Key) -> bool {
        self.map.contains_key(key)
    }

    /// Removes `key`'s object (its record is cleared by the next round);
    /// `false` when there is none.
    pub fn remove(&mut self, key: &Key) -> bool {
        let Some(i) = self.map.remove(key) else { return false };
        self.retire(i);
        true
    }

    fn retire(&mut self, i: u32) {
        self.unlink(i);
        self.slots[i as usize].state = SlotState::Stale;
        self.to_clear.push(i);
    }

    /// A commit round starts: the slots it clears (their media record set
    /// to none) and the record it writes for each put's slot.
    pub fn begin_round(&mut self, puts: &mut [(u32, Record)]) -> Vec<u32> {
        for (slot, rec) in puts.iter_mut() {
            rec.generation = self.next_generation;
            self.next_generation += 1;
            self.slots[*slot as usize].media = Some(*rec);
        }
        let clears = self.clearable();
        for &c in &clears {
            self.slots[c as usize].clearing = true;
        }
        self.clearing = clears.len();
        clears
    }

    /// A commit round ended. On success the puts become live (an older
    /// slot of the same key becomes stale) and cleared slots free; on
    /// failure the puts' slots and the clears wait for the next round.
    pub fn end_round(&mut self, puts: &[(u32, Record)], clears: &[u32], ok: bool) {
        self.clearing = 0;
        for &c in clears {
            self.slots[c as usize].clearing = false;
        }
        if !ok {
            for &(slot, _) in puts {
                self.slots[slot as usize].state = SlotState::Stale;
                self.to_clear.push(slot);
            }
            self.to_clear.extend_from_slice(clears);
            return;
        }
        for &c in clears {
            let s = &mut self.slots[c as usize];
            s.media = None;
            if s.state != SlotState::Stale {
                continue;
            }
            if s.pins == 0 {
                s.state = SlotState::Free;
                self.free.push(c);
            } else {
                s.state = SlotState::Cleared;
            }
        }
        for &(slot, rec) in puts {
            self.slots[slot as usize].state = SlotState::Live;
            if let Some(old) = self.map.insert(rec.key, slot) {
                self.retire(old);
            }
            self.push_mru(slot);
        }
    }

    /// The stale slots this round may clear, leaving the rest in
    /// `to_clear`. A key with no live object whose records wait in several
    /// stale slots keeps its newest record one round longer: clearing it
    /// together with an older one could, torn by a power loss (two record
    /// blocks are not written atomically), leave only the older record on
    /// the media and bring back a version the key no longer had. With a
    /// live object the newest record is the live one, never cleared here.
    fn clearable(&mut self) -> Vec<u32> {
        let candidates = std::mem::take(&mut self.to_clear);
        let mut newest: HashMap<Key, (u64, u32, usize)> = HashMap::new();
        for &c in &candidates {
            let Some(r) = self.slots[c as usize].media else { continue };
            if self.map.contains_key(&r.key) {
                continue;
            }
            let e = newest.entry(r.key).or_insert((r.generation, c, 0));
            if r.generation > e.0 {
                (e.0, e.1) = (r.generation, c);
            }
            e.2 += 1;
        }
        let deferred: Vec<u32> = newest.values().filter(|(_, _, n)| *n > 1).map(|&(_, c, _)| c).collect();
        let (later, now): (Vec<u32>, Vec<u32>) = candidates.into_iter().partition(|c| deferred.contains(c));
        self.to_clear = later;
        now
    }

    /// Stale slots wait for a round to take them. `false` does not mean
    /// their records are cleared: a round in progress may have taken them
    /// and not yet written them ([`Index::clears_pending`]).
    pub fn has_clears(&self) -> bool {
        !self.to_clear.is_empty()
    }

    /// Slots wait to be cleared, or are being cleared by the round in
    /// progress: a commit round will free some (those no reader pins).
    pub fn clears_pending(&self) -> bool {
        self.has_clears() || self.clearing > 0
    }

    /// Test helper: `slot` holds its old record again, stale, waiting to be
    /// cleared (as after a round that failed).
    #[cfg(test)]
    fn recover_stale_for_test(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.media.is_none() {
            s.media =
                Some(Record { key: Key::new(&[2; 16]).unwrap(), len: 10, generation: 1, payload_crc: 1 });
            s.state = SlotState::Stale;
            self.free.retain(|&f| f != slot);
            self.to_clear.push(slot);
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = (self.slots[i as usize].prev, self.slots[i as usize].next);
        let linked = prev != NIL || next != NIL || self.lru_head == i;
        if !linked {
            return;
        }
        match prev {
            NIL => self.lru_head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.lru_tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
        self.slots[i as usize].prev = NIL;
        self.slots[i as usize].next = NIL;
    }

    fn push_mru(&mut self, i: u32) {
        self.slots[i as usize].prev = self.lru_tail;
        self.slots[i as usize].next = NIL;
        match self.lru_tail {
            NIL => self.lru_head = i,
            t => self.slots[t as usize].next = i,
        }
        self.lru_tail = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(k: u8) -> Record {
        Record { key: Key::new(&[k; 16]).unwrap(), len: 10, generation: 0, payload_crc: 1 }
    }

    fn put(ix: &mut Index, k: u8) -> u32 {
        let s = ix.reserve().unwrap();
        let mut puts = [(s, rec(k))];
        let clears = ix.begin_round(&mut puts);
        ix.end_round(&puts, &clears, true);
        s
    }

    #[test]
    fn a_slot_is_reused_only_after_its_record_was_cleared() {
        let mut ix = Index::new(2);
        let a = put(&mut ix, 1);
        let b = put(&mut ix, 1); // supersedes a
        assert_ne!(a, b);
        assert_eq!(ix.free(), 0, "a is stale until a round clears it");
        assert!(ix.reserve().is_none());
        let clears = ix.begin_round(&mut []);
        assert_eq!(clears, vec![a]);
        assert_eq!(ix.record_to_write(a), None, "the round writes an empty record");
        assert!(ix.media(a).is_some(), "until the round succeeded, the media may still hold it");
        ix.end_round(&[], &clears, true);
        assert_eq!(ix.media(a), None);
        assert_eq!(ix.free(), 1);
    }

    #[test]
    fn a_keys_newest_stale_record_is_cleared_a_round_after_its_older_ones() {
        let mut ix = Index::new(4);
        let a = put(&mut ix, 1);
        let b = put(&mut ix, 1); // supersedes a: a stale
        assert!(ix.remove(&rec(1).key)); // b stale too, no live object of the key
        let first = ix.begin_round(&mut []);
        assert_eq!(first, vec![a], "the older record first");
        ix.end_round(&[], &first, true);
        let second = ix.begin_round(&mut []);
        assert_eq!(second, vec![b], "then the newest");
        ix.end_round(&[], &second, true);
        assert!(!ix.has_clears());
        // With a live object (the newest record), older ones go at once.
        let c = put(&mut ix, 2);
        let d = put(&mut ix, 2); // c stale
        ix.recover_stale_for_test(c);
        let _e = put(&mut ix, 2); // d stale; this round cleared c
        ix.recover_stale_for_test(c);
        let mut both = ix.begin_round(&mut []);
        both.sort();
        let mut want = vec![c, d];
        want.sort();
        assert_eq!(both, want, "two older records of a live key in one round");
    }

    #[test]
    fn clears_are_pending_until_the_round_clearing_them_ends() {
        let mut ix = Index::new(1);
        put(&mut ix, 1);
        assert!(!ix.clears_pending());
        assert_eq!(ix.evict(1), 1);
        assert!(ix.clears_pending() && ix.reserve().is_none());
        let clears = ix.begin_round(&mut []);
        assert!(!ix.has_clears() && ix.clears_pending(), "taken by the round in progress");
        ix.end_round(&[], &clears, true);
        assert!(!ix.clears_pending());
        assert!(ix.reserve().is_some());
    }

    #[test]
    fn eviction_skips_pinned_objects_and_pinned_slots_wait_for_unpin() {
        let mut ix = Index::new(3);
        let (a, b) = (put(&mut ix, 1), put(&mut ix, 2));
        let (pa, _) = ix.pin(&rec(1).key).unwrap();
        assert_eq!(pa, a);
        assert_eq!(ix.evict(1), 1);
        assert!(ix.contains(&rec(1).key), "pinned a survives; b was evicted");
        assert!(!ix.contains(&rec(2).key));
        assert!(ix.remove(&rec(1).key));
        let clears = ix.begin_round(&mut []);
        ix.end_round(&[], &clears, true);
        assert_eq!(ix.free(), 2, "b and the third slot; a is still pinned");
        ix.unpin(a);
        assert_eq!(ix.free(), 3);
        let _ = b;
    }

    #[test]
    fn a_pinned_slot_whose_clearing_round_failed_is_not_freed_by_its_unpin() {
        let mut ix = Index::new(2);
        let a = put(&mut ix, 1);
        ix.pin(&rec(1).key).unwrap();
        ix.pin(&rec(1).key).unwrap();
        assert!(ix.remove(&rec(1).key));
        let clears = ix.begin_round(&mut []);
        ix.unpin(a); // one reader, while the round runs
        ix.end_round(&[], &clears, false);
        ix.unpin(a); // the other, after the round failed
        assert_eq!(ix.free(), 1, "a's record may still be on the media");
        let clears = ix.begin_round(&mut []);
        assert_eq!(clears, vec![a]);
        ix.end_round(&[], &clears, true);
        assert_eq!(ix.free(), 2);
    }

    #[test]
    fn recovery_keeps_the_highest_generation() {
        let mut ix = Index::new(3);
        ix.recover(0, Record { generation: 5, ..rec(1) });
        ix.recover(1, Record { generation: 9, ..rec(1) });
        ix.recover(2, Record { generation: 3, ..rec(1) });
        ix.finish_recovery();
        assert_eq!(ix.pin(&rec(1).key).unwrap().0, 1);
        assert_eq!(ix.next_generation, 10);
        assert_eq!(ix.free(), 0);
        let mut clears = ix.begin_round(&mut []);
        clears.sort();
        assert_eq!(clears, vec![0, 2]);
    }
}
