//! The restart hit ratio: how much of a run's working set an earlier run
//! had already saved in a persisted store.
//!
//! Every distinct block (hash id) a run asks for counts once, at the first
//! request of this run that asks for it. At that moment this run has not
//! saved it yet, so if it is in the prefix the request loads, an earlier
//! run (or whoever wrote the store before this process opened it) saved
//! it:
//!
//! ```text
//! restart_hit_ratio = restart_hits / restart_lookups
//! restart_lookups   = distinct blocks this run looked up
//! restart_hits      = of those, blocks loaded at their first lookup
//! ```
//!
//! Later lookups of a block, and loads of blocks this run saved itself,
//! do not count. A run on a fresh store has a ratio of 0.

use std::collections::HashSet;

/// Counts restart hits over a run (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct RestartHits {
    seen: HashSet<u64>,
    lookups: u64,
    hits: u64,
}

impl RestartHits {
    /// No block looked up yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Block `hash` was looked up by a request; `loaded`: it was in the
    /// prefix that request loaded.
    pub fn looked_up(&mut self, hash: u64, loaded: bool) {
        if self.seen.insert(hash) {
            self.lookups += 1;
            self.hits += u64::from(loaded);
        }
    }

    /// Distinct blocks looked up.
    pub fn lookups(&self) -> u64 {
        self.lookups
    }

    /// Distinct blocks loaded at their first lookup.
    pub fn hits(&self) -> u64 {
        self.hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_lookup_of_a_block_counts() {
        let mut r = RestartHits::new();
        r.looked_up(1, true); // from an earlier run
        r.looked_up(2, false); // saved by this run...
        r.looked_up(2, true); // ...and loaded later: not a restart hit
        r.looked_up(1, true);
        r.looked_up(3, false);
        assert_eq!((r.hits(), r.lookups()), (1, 3));
    }
}
