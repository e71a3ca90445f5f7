//! The volatile write cache ([`WriteCacheSpec`]; NVMe Base 2.0 5.27.1.4,
//! Identify Controller VWC): which logical blocks are written but not yet
//! durable, and what each held when it last was.
//!
//! Writes go to the backing store in place, so reads need nothing from
//! the cache. What the cache keeps is an undo log: on the first write to a
//! durable block, its contents (the last durable ones) are copied into an
//! [`UndoArena`] slot and the block is indexed as non-durable. A block
//! becomes durable again, and its slot is freed, when:
//!
//! * a Flush covers its namespace ([`WriteCache::flush`]);
//! * a Write with FUA, a Write Zeroes or a deallocation covers it
//!   ([`WriteCache::make_durable`]);
//! * it is the oldest non-durable block while the cache holds more than
//!   its capacity ([`WriteCache::destage`]): first written, first
//!   destaged, as a drive writes back its cache;
//! * a shutdown notification or disabling the cache (WCE = 0) flushes
//!   everything.
//!
//! At a power failure ([`WriteCache::power_loss`]) each non-durable block,
//! oldest first, is kept (its new contents stay) or lost (its undo copy is
//! written back), one draw of a SplitMix64 generator seeded from
//! [`WriteCacheSpec::seed`] each. Sizes here are logical blocks (LBAs)
//! unless named bytes.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::backing::{Backing, MediaError};
use crate::config::{NamespaceSpec, WriteCacheSpec};
use crate::undo::UndoArena;
use crate::PowerFailReport;

/// A multiplicative hasher for LBAs: the index is keyed by plain `u64`s
/// from the controller itself, so SipHash's flooding protection buys
/// nothing on the write path.
#[derive(Debug, Default, Clone, Copy)]
struct LbaHasher(u64);

impl Hasher for LbaHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type LbaMap<V> = HashMap<u64, V, BuildHasherDefault<LbaHasher>>;

/// SplitMix64: the power-loss decisions, reproducible from the seed.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A non-durable block's undo entry: its slot, and when it became
/// non-durable (to tell live queue entries from stale ones).
#[derive(Debug, Clone, Copy)]
struct Undo {
    slot: u32,
    seq: u64,
}

/// A block in the destage queue, oldest first. Stale once its block has
/// become durable another way (the index then has no entry with `seq`).
#[derive(Debug, Clone, Copy)]
struct Dirty {
    seq: u64,
    ns: usize,
    lba: u64,
}

/// One namespace's non-durable blocks.
#[derive(Debug)]
struct NsCache {
    /// Logical block size in bytes.
    block: u64,
    index: LbaMap<Undo>,
    arena: UndoArena,
}

/// The write cache of one controller.
#[derive(Debug)]
pub(crate) struct WriteCache {
    /// Most bytes of non-durable blocks kept before destaging.
    capacity: u64,
    /// WCE (Set Features, Volatile Write Cache): `false` = write-through.
    enabled: bool,
    rng: SplitMix64,
    namespaces: Vec<NsCache>,
    /// Non-durable blocks in the order they became non-durable, with stale
    /// entries mixed in (`stale` of them).
    order: VecDeque<Dirty>,
    stale: usize,
    seq: u64,
    /// Bytes of non-durable blocks.
    dirty_bytes: u64,
    /// Bulk read of a range's old contents (file store).
    scratch: Vec<u8>,
}

impl WriteCache {
    pub(crate) fn new(spec: WriteCacheSpec, namespaces: &[NamespaceSpec]) -> Self {
        let namespaces = namespaces
            .iter()
            .map(|n| NsCache {
                block: u64::from(n.block_size),
                index: LbaMap::default(),
                arena: UndoArena::new(n.block_size as usize),
            })
            .collect();
        Self {
            capacity: spec.capacity_bytes,
            enabled: true,
            rng: SplitMix64(spec.seed),
            namespaces,
            order: VecDeque::new(),
            stale: 0,
            seq: 0,
            dirty_bytes: 0,
            scratch: Vec::new(),
        }
    }

    /// WCE: whether writes are cached (`true`) or written through.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Sets WCE; turning the cache off flushes it first (see
    /// [`WriteCache::flush`]; on error WCE stays on).
    pub(crate) fn set_enabled(&mut self, backing: &mut Backing, on: bool) -> Result<(), MediaError> {
        if !on && self.enabled {
            self.flush(backing, None)?;
        }
        self.enabled = on;
        Ok(())
    }

    /// Before a Write of blocks `slba..slba + nlb` of namespace `ns`:
    /// saves the contents of each block that is durable now. With the
    /// cache off, or the null store, nothing is saved.
    pub(crate) fn before_write(
        &mut self,
        backing: &mut Backing,
        ns: usize,
        slba: u64,
        nlb: u64,
    ) -> Result<(), MediaError> {
        if !self.enabled || backing.is_null() {
            return Ok(());
        }
        let Self { namespaces, order, seq, dirty_bytes, scratch, .. } = self;
        let Some(c) = namespaces.get_mut(ns) else { return Ok(()) };
        let bs = c.block as usize;
        // The file store: one read of the range rather than one per block.
        let bulk = backing.is_file() && nlb > 1 && (slba..slba + nlb).any(|l| !c.index.contains_key(&l));
        if bulk {
            scratch.resize(nlb as usize * bs, 0);
            backing.read_at(ns, slba * c.block, scratch)?;
        }
        for (i, lba) in (slba..slba + nlb).enumerate() {
            let Entry::Vacant(v) = c.index.entry(lba) else { continue };
            let Some(slot) = c.arena.alloc() else {
                // No memory for the undo copy: the block is written through.
                tracing::warn!(ns, lba, "nvme-emu: write cache arena exhausted, block written through");
                continue;
            };
            let Some(dst) = c.arena.get_mut(slot) else { continue };
            let saved = match scratch.get(i * bs..(i + 1) * bs).filter(|_| bulk) {
                Some(src) => {
                    dst.copy_from_slice(src);
                    Ok(())
                }
                None => backing.read_at(ns, lba * c.block, dst),
            };
            if let Err(e) = saved {
                c.arena.free(slot);
                return Err(e);
            }
            v.insert(Undo { slot, seq: *seq });
            order.push_back(Dirty { seq: *seq, ns, lba });
            *seq += 1;
            *dirty_bytes += c.block;
        }
        Ok(())
    }

    /// After a Write of blocks `slba..slba + nlb` of namespace `ns`: with
    /// FUA, or with the cache off (write-through), its blocks are durable
    /// now and the file store is synced; then the oldest blocks are
    /// destaged while the cache is over capacity.
    pub(crate) fn after_write(
        &mut self,
        backing: &mut Backing,
        ns: usize,
        slba: u64,
        nlb: u64,
        fua: bool,
    ) -> Result<(), MediaError> {
        if fua || !self.enabled {
            backing.sync()?;
            self.make_durable(ns, slba, nlb);
        }
        self.destage();
        Ok(())
    }

    /// Blocks `slba..slba + nlb` of namespace `ns` are durable as they are
    /// now (FUA, Write Zeroes, deallocation, or written through).
    pub(crate) fn make_durable(&mut self, ns: usize, slba: u64, nlb: u64) {
        let Some(NsCache { block, index, arena }) = self.namespaces.get_mut(ns) else { return };
        let before = index.len();
        if nlb >= before as u64 {
            index.retain(|lba, u| {
                let keep = !(slba..slba.saturating_add(nlb)).contains(lba);
                if !keep {
                    arena.free(u.slot);
                }
                keep
            });
        } else {
            for lba in slba..slba + nlb {
                if let Some(u) = index.remove(&lba) {
                    arena.free(u.slot);
                }
            }
        }
        let removed = before - index.len();
        self.dirty_bytes -= removed as u64 * *block;
        self.stale += removed;
        self.compact();
    }

    /// Destages the oldest non-durable blocks (they become durable) while
    /// the cache holds more than its capacity.
    fn destage(&mut self) {
        while self.dirty_bytes > self.capacity {
            let Some(d) = self.order.pop_front() else { break };
            let Some(c) = self.namespaces.get_mut(d.ns) else { continue };
            match c.index.get(&d.lba) {
                Some(u) if u.seq == d.seq => {
                    c.arena.free(u.slot);
                    c.index.remove(&d.lba);
                    self.dirty_bytes -= c.block;
                }
                _ => self.stale = self.stale.saturating_sub(1),
            }
        }
    }

    /// Drops stale destage-queue entries once they are most of it.
    fn compact(&mut self) {
        if self.stale < 1024 || self.stale < self.order.len() / 2 {
            return;
        }
        let namespaces = &self.namespaces;
        self.order.retain(|d| {
            namespaces.get(d.ns).and_then(|c| c.index.get(&d.lba)).is_some_and(|u| u.seq == d.seq)
        });
        self.stale = 0;
    }

    /// Flush (NVM Command Set 1.0, 3.2.2) of namespace `ns`, or of all
    /// (`None`, NSID FFFFFFFFh): the file store is synced (`sync_data`),
    /// then every non-durable block of the namespace(s) is durable. A
    /// failed sync is a Write Fault and leaves the blocks non-durable.
    pub(crate) fn flush(&mut self, backing: &mut Backing, ns: Option<usize>) -> Result<(), MediaError> {
        backing.sync()?;
        match ns {
            None => {
                for c in &mut self.namespaces {
                    c.index.clear();
                    c.arena.clear();
                }
                self.order.clear();
                self.stale = 0;
                self.dirty_bytes = 0;
            }
            Some(i) => {
                let Some(c) = self.namespaces.get_mut(i) else { return Ok(()) };
                let n = c.index.len();
                c.index.clear();
                c.arena.clear();
                self.dirty_bytes -= n as u64 * c.block;
                self.stale += n;
                self.compact();
            }
        }
        Ok(())
    }

    /// The last durable contents of block `lba` of namespace `ns` while it
    /// is non-durable; `None` when it is durable.
    pub(crate) fn undo_mut(&mut self, ns: usize, lba: u64) -> Option<&mut [u8]> {
        let c = self.namespaces.get_mut(ns)?;
        let slot = c.index.get(&lba)?.slot;
        c.arena.get_mut(slot)
    }

    /// Whether namespace `ns` has a non-durable block.
    pub(crate) fn has_dirty(&self, ns: usize) -> bool {
        self.namespaces.get(ns).is_some_and(|c| !c.index.is_empty())
    }

    /// The power fails: each non-durable block, oldest first, is kept or
    /// lost (its undo copy written back) by one draw of the generator;
    /// then the cache is empty.
    pub(crate) fn power_loss(&mut self, backing: &mut Backing) -> PowerFailReport {
        let mut r = PowerFailReport::default();
        while let Some(d) = self.order.pop_front() {
            let Some(c) = self.namespaces.get_mut(d.ns) else { continue };
            let Some(u) = c.index.get(&d.lba).copied().filter(|u| u.seq == d.seq) else { continue };
            c.index.remove(&d.lba);
            if self.rng.next() & 1 == 1 {
                r.kept_blocks += 1;
                continue;
            }
            r.lost_blocks += 1;
            let restored = c.arena.get(u.slot).map(|old| backing.write_at(d.ns, d.lba * c.block, old));
            if !matches!(restored, Some(Ok(()))) {
                r.restore_errors += 1;
            }
        }
        for c in &mut self.namespaces {
            c.index.clear();
            c.arena.clear();
        }
        self.stale = 0;
        self.dirty_bytes = 0;
        r
    }
}
