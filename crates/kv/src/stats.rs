//! Counters of a store.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What a store has done since it was opened, and what it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Object slots.
    pub capacity: u64,
    /// Largest object, bytes.
    pub object_size: u64,
    /// Live objects.
    pub objects: u64,
    /// Puts made durable.
    pub puts: u64,
    /// Gets that returned verified bytes.
    pub hits: u64,
    /// Gets of absent keys.
    pub misses: u64,
    /// Gets whose payload failed its checksum.
    pub checksum_mismatches: u64,
    /// Objects evicted to make room.
    pub evictions: u64,
    /// Group-commit rounds (each two Flushes when it commits puts).
    pub commit_rounds: u64,
    /// Records cleared (removed, evicted or superseded objects).
    pub records_cleared: u64,
    /// Items that failed on a device error or timeout.
    pub device_errors: u64,
    /// Objects found at open.
    pub recovered: u64,
    /// Records found invalid at open (treated as absent).
    pub invalid_records: u64,
    /// Time spent recovering at open, nanoseconds.
    pub recovery_ns: u64,
    /// Batches dropped without a wait whose commands are not final yet
    /// (their slots and memory are released when they are).
    pub orphaned_batches: u64,
}

/// What recovery found at open.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Recovered {
    /// Live objects.
    pub live: u64,
    /// Records found invalid.
    pub invalid: u64,
    /// Time taken, nanoseconds.
    pub ns: u64,
}

/// The counters of a store, and what recovery found at open.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    puts: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    checksum_mismatches: AtomicU64,
    evictions: AtomicU64,
    commit_rounds: AtomicU64,
    records_cleared: AtomicU64,
    device_errors: AtomicU64,
    recovered: Recovered,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

impl Counters {
    /// A get of an absent key.
    pub fn miss(&self) {
        add(&self.misses, 1);
    }

    /// A get that returned verified bytes.
    pub fn hit(&self) {
        add(&self.hits, 1);
    }

    /// A get whose payload failed its checksum.
    pub fn checksum_mismatch(&self) {
        add(&self.checksum_mismatches, 1);
    }

    /// An item that failed on a device error or timeout.
    pub fn device_error(&self) {
        add(&self.device_errors, 1);
    }

    /// `n` objects evicted.
    pub fn evicted(&self, n: u64) {
        add(&self.evictions, n);
    }

    /// A commit round of `puts` puts and `clears` cleared records, which
    /// committed them when `ok`.
    pub fn count_round(&self, puts: usize, clears: usize, ok: bool) {
        add(&self.commit_rounds, 1);
        if ok {
            add(&self.puts, puts as u64);
            add(&self.records_cleared, clears as u64);
        }
    }

    /// What recovery found (at open).
    pub fn set_recovered(&mut self, r: Recovered) {
        self.recovered = r;
    }

    /// The counters and recovery's findings into `s`.
    pub fn snapshot(&self, s: &mut KvStats) {
        s.puts = self.puts.load(Relaxed);
        s.hits = self.hits.load(Relaxed);
        s.misses = self.misses.load(Relaxed);
        s.checksum_mismatches = self.checksum_mismatches.load(Relaxed);
        s.evictions = self.evictions.load(Relaxed);
        s.commit_rounds = self.commit_rounds.load(Relaxed);
        s.records_cleared = self.records_cleared.load(Relaxed);
        s.device_errors = self.device_errors.load(Relaxed);
        s.recovered = self.recovered.live;
        s.invalid_records = self.recovered.invalid;
        s.recovery_ns = self.recovered.ns;
    }
}
