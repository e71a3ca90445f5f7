//! Group commit: puts whose payloads are written wait here; one thread at
//! a time leads a round that commits every waiting put together.
//!
//! A round: Flush (the payloads are durable) -> write the record blocks
//! of the round's puts and of the slots being cleared -> Flush (the
//! records are durable) -> publish. The Flushes are left out when no drive
//! of the store has a volatile write cache: a completed write is durable
//! then. So a record never reaches the media
//! before its payload is durable, and a slot is reused only after the
//! round that zeroed its record (`index.rs`). A put superseding an older
//! object of its key makes the old slot stale when its round publishes;
//! the old record is cleared by a later round, never by the same one (two
//! record blocks are not written atomically together).
//!
//! Locks: the commit queue, then (while leading, with the queue let go)
//! the index and the staging buffer, one at a time.

use std::collections::BTreeSet;

use crate::committer::PendingPut;
use crate::error::ItemStatus;
use crate::io::run;
use crate::store::KvStore;

impl KvStore {
    /// Commits `puts` (possibly none: then the round only clears stale
    /// records, a durability barrier for removes), together with whatever
    /// other threads are committing; returns when they are durable or the
    /// round failed.
    pub(crate) fn commit(&self, puts: Vec<PendingPut>) -> Result<(), ItemStatus> {
        self.committer.join(puts, |puts| self.round(puts))
    }

    /// One round (see the module docs).
    fn round(&self, mut puts: Vec<PendingPut>) -> Result<(), ItemStatus> {
        if self.committer.stuck() {
            self.index().end_round(&puts, &[], false);
            return Err(ItemStatus::Device {
                status: None,
                drive: None,
                message: "a record-block write timed out earlier: the store commits nothing more; \
                          reset the drive and reopen the store"
                    .into(),
            });
        }
        if self.lease_lost() {
            self.index().end_round(&puts, &[], false);
            return Err(ItemStatus::Device {
                status: None,
                drive: None,
                message: "the store's lease was taken by another writer: it commits nothing more; reopen it"
                    .into(),
            });
        }
        let rt = self.media.rt();
        let flush = [self.media.flush().map_err(ItemStatus::from_runtime)?];
        // Without a volatile write cache on any drive a completed write is
        // durable already (NVMe Base 2.0 §5.17.2.1, VWC) and a Flush would
        // only cost a round trip.
        let flush_needed = self.media.volatile_write_cache();
        if !puts.is_empty() && flush_needed {
            if let Err(e) = run(rt, &flush) {
                self.index().end_round(&puts, &[], false);
                return Err(e);
            }
        }
        let (clears, blocks) = {
            let mut ix = self.index();
            if puts.is_empty() && !ix.has_clears() {
                return Ok(());
            }
            let clears = ix.begin_round(&mut puts);
            let blocks: BTreeSet<u64> = puts
                .iter()
                .map(|(s, _)| *s)
                .chain(clears.iter().copied())
                .map(|s| self.media.record_block_of(s))
                .collect();
            (clears, blocks)
        };
        let r =
            self.write_record_blocks(&blocks)
                .and_then(|()| if flush_needed { run(rt, &flush) } else { Ok(()) });
        self.index().end_round(&puts, &clears, r.is_ok());
        self.stats.count_round(puts.len(), clears.len(), r.is_ok());
        r
    }

    /// Writes record blocks `blocks` (indices in the record table) as the
    /// index says they are now, through the staging buffer
    /// (`media.rs`).
    fn write_record_blocks(&self, blocks: &BTreeSet<u64>) -> Result<(), ItemStatus> {
        let r = self.media.write_record_blocks(blocks, || self.index());
        if r == Err(ItemStatus::Timeout) {
            // The drive may still write these blocks later, with the
            // records of this round: no later round may run, or that late
            // write could undo it (bring back a cleared record).
            self.committer.set_stuck();
        }
        r
    }
}
