//! Opening a store: its geometry from the runtime, the superblock (format
//! a blank store, refuse anything else that is not ours), and recovery of
//! the index from the record table.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tutti::{OpHandle, RequestStatus, Runtime};

use crate::committer::Committer;
use crate::error::KvError;
use crate::format::{Layout, RecordDecode, SuperblockError};
use crate::index::Index;
use crate::inflight::{Held, Inflight};
use crate::key::KeySize;
use crate::lease::{acquire, Lease, LeaseIo, LeaseOptions};
use crate::media::Media;
use crate::stats::{Counters, KvStats, Recovered};

/// What to do with a store that is not formatted yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Create {
    /// Format it when its first block is all zero (a new drive); refuse
    /// anything else that is not a tutti-kv superblock.
    #[default]
    IfBlank,
    /// Never format: a blank store is an error.
    Never,
    /// Format it whatever it holds (destroys its contents).
    Always,
}

/// Whether an open may write the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Puts, removes and syncs: takes the store's lease (one writer per
    /// store, across processes; [`KvError::Leased`] when held).
    #[default]
    ReadWrite,
    /// Lookups and gets only, beside a writer of another process: takes no
    /// lease and writes nothing (never formats: a blank store is
    /// [`KvError::Superblock`]); [`KvStore::put`] and [`KvStore::sync`]
    /// return [`KvError::ReadOnly`]. Its index is the media's at open: a
    /// writer's later puts are misses and its later evictions are
    /// `ChecksumMismatch` or `Miss`, never wrong bytes; reopen to refresh.
    ReadOnly,
}

/// How to open a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOptions {
    /// Name of the runtime store (one with a `slab` resolver: one object
    /// per slot, the slot size being the object size).
    pub store: String,
    /// Key size: checked against the superblock, used when formatting.
    /// `None`: whatever the superblock says, 32 bytes when formatting.
    pub key_size: Option<KeySize>,
    /// Formatting policy.
    pub create: Create,
    /// Writer or reader.
    pub access: Access,
    /// Timing of the lease a writer takes.
    pub lease: LeaseOptions,
}

impl OpenOptions {
    /// Opens runtime store `store`, formatting it if blank.
    pub fn new(store: &str) -> Self {
        Self {
            store: store.to_owned(),
            key_size: None,
            create: Create::IfBlank,
            access: Access::ReadWrite,
            lease: LeaseOptions::default(),
        }
    }
}

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

/// Stores open in this process, by (runtime, store name): two `KvStore`s
/// over one store would keep two indexes and reuse each other's slots.
static OPEN: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());

/// This process's claim on one runtime store; released when dropped.
#[derive(Debug)]
struct OpenClaim(usize, String);

impl OpenClaim {
    fn take(rt: &Arc<Runtime>, store: &str) -> Result<Self, KvError> {
        let key = (Arc::as_ptr(rt) as usize, store.to_owned());
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        if open.contains(&key) {
            return Err(KvError::AlreadyOpen(store.to_owned()));
        }
        open.push(key.clone());
        Ok(Self(key.0, key.1))
    }
}

impl Drop for OpenClaim {
    fn drop(&mut self) {
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|(r, s)| !(*r == self.0 && *s == self.1));
    }
}

/// A persistent, crash-consistent KV-cache block store over one runtime
/// store. `Send + Sync`.
///
/// Each part owns one concern: `media` where bytes live (slots, geometry,
/// superblock, the staging buffer), `index` what is where, `committer`
/// the group-commit queue, `stats` the counters, `inflight` what pending
/// batches hold.
#[derive(Debug)]
pub struct KvStore {
    pub(crate) media: Media,
    index: Mutex<Index>,
    pub(crate) committer: Committer,
    pub(crate) stats: Counters,
    pub(crate) inflight: Arc<Inflight>,
    id: u64,
    _open: OpenClaim,
    /// The store's lease (`None`: opened read-only).
    lease: Option<Lease>,
}

impl KvStore {
    /// Opens (and if asked, formats) the store `opts.store` of `rt`, and
    /// rebuilds its index from the media.
    ///
    /// # Errors
    ///
    /// [`KvError::UnknownStore`], [`KvError::AlreadyOpen`] (one `KvStore`
    /// per runtime store in a process), [`KvError::Leased`] (a writer of
    /// another runtime or process holds the store: nothing written),
    /// [`KvError::LeaseContended`], [`KvError::NotASlab`],
    /// [`KvError::Geometry`]; [`KvError::Superblock`] when block 0 is not a
    /// usable superblock (another format version, another geometry, not
    /// ours, corrupt; nothing is written then); [`KvError::KeySize`];
    /// [`KvError::Io`] when reading or formatting fails.
    pub fn open(rt: Arc<Runtime>, opts: &OpenOptions) -> Result<Self, KvError> {
        let name = opts.store.clone();
        let info = rt.store_info(&name).ok_or_else(|| KvError::UnknownStore(name.clone()))?;
        let claim = OpenClaim::take(&rt, &name)?;
        let (Some(slot_size), Some(slots)) = (info.slot_size, info.slots) else {
            return Err(KvError::NotASlab(name));
        };
        let layout = Layout::new(info.block_size, slot_size, slots * slot_size).ok_or(KvError::Geometry {
            store: name.clone(),
            slots,
            slot_size,
            block_size: info.block_size,
        })?;
        let media = Media::new(rt, &name, layout, (slot_size, slots), info.volatile_write_cache)?;
        let mut store = Self {
            media,
            index: Mutex::new(Index::new(layout.capacity as u32)),
            committer: Committer::default(),
            stats: Counters::default(),
            inflight: Arc::default(),
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            _open: claim,
            lease: None,
        };
        if opts.access == Access::ReadWrite {
            let mut io = LeaseIo::new(store.media.rt(), &name, &layout, slots)?;
            let record = acquire(&mut io, &opts.lease, &name)?;
            store.lease = Some(Lease::hold(store.media.rt(), io, record, &opts.lease, &name));
        }
        store.load_superblock(opts)?;
        store.recover()?;
        Ok(store)
    }

    /// Reads block 0; formats when the policy says so.
    fn load_superblock(&mut self, opts: &OpenOptions) -> Result<(), KvError> {
        let decoded = self.media.read_superblock()?;
        let store = opts.store.clone();
        // A reader never writes: it formats nothing.
        let create = if opts.access == Access::ReadOnly { Create::Never } else { opts.create };
        match (decoded, create) {
            (Ok(sb), Create::IfBlank | Create::Never) => {
                if let Some(k) = opts.key_size.filter(|k| *k != sb.key_size) {
                    return Err(KvError::KeySize { store, found: sb.key_size.bytes(), asked: k.bytes() });
                }
                self.media.adopt(sb);
                Ok(())
            }
            (Err(SuperblockError::Blank), Create::IfBlank) | (_, Create::Always) => {
                self.media.format(opts.key_size.unwrap_or_default())
            }
            (Err(source), _) => Err(KvError::Superblock { store, source }),
        }
    }

    /// Reads the whole record table and rebuilds the index.
    fn recover(&mut self) -> Result<(), KvError> {
        let t0 = Instant::now();
        let mut ix = Index::new(self.media.layout().capacity as u32);
        let (mut found, mut invalid) = (0u64, 0u64);
        self.media.read_record_table(|slot, decoded| match decoded {
            RecordDecode::Empty => {}
            RecordDecode::Valid(rec) => {
                ix.recover(slot, rec);
                found += 1;
            }
            RecordDecode::Invalid => invalid += 1,
        })?;
        ix.finish_recovery();
        let live = ix.live() as u64;
        *self.index.get_mut().unwrap_or_else(|p| p.into_inner()) = ix;
        self.stats.set_recovered(Recovered { live, invalid, ns: t0.elapsed().as_nanos() as u64 });
        tracing::debug!(records = found, live, invalid, "tutti-kv: recovered");
        Ok(())
    }

    /// The index, locked.
    pub(crate) fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store's identity in this process: memory and batches carry it.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    fn name(&self) -> String {
        self.media.name()
    }

    /// Whether this open may write: `Ok` for a writer still holding its
    /// lease.
    ///
    /// # Errors
    ///
    /// [`KvError::ReadOnly`], [`KvError::LeaseLost`].
    pub(crate) fn writable(&self) -> Result<(), KvError> {
        match &self.lease {
            None => Err(KvError::ReadOnly(self.name())),
            Some(l) if l.lost() => Err(KvError::LeaseLost(self.name())),
            Some(_) => Ok(()),
        }
    }

    /// Whether another writer took this store's lease.
    pub(crate) fn lease_lost(&self) -> bool {
        self.lease.as_ref().is_some_and(Lease::lost)
    }

    /// How it was opened.
    pub fn access(&self) -> Access {
        if self.lease.is_some() {
            Access::ReadWrite
        } else {
            Access::ReadOnly
        }
    }

    /// Counters and occupancy (after releasing what dropped batches held,
    /// where their commands are final).
    pub fn stats(&self) -> KvStats {
        self.reap_orphans();
        let layout = self.media.layout();
        let mut s = KvStats {
            capacity: layout.capacity,
            object_size: layout.object_size,
            objects: self.index().live() as u64,
            orphaned_batches: self.inflight.orphans() as u64,
            ..KvStats::default()
        };
        self.stats.snapshot(&mut s);
        s
    }

    /// The store's UUID (drawn when it was formatted).
    pub fn uuid(&self) -> [u8; 16] {
        self.media.uuid()
    }

    /// Its key size.
    pub fn key_size(&self) -> KeySize {
        self.media.key_size()
    }

    /// Its geometry.
    pub fn layout(&self) -> Layout {
        self.media.layout()
    }

    /// The runtime it runs on.
    pub fn runtime(&self) -> &Arc<Runtime> {
        self.media.rt()
    }
}

impl Drop for KvStore {
    fn drop(&mut self) {
        self.media.close();
    }
}

impl KvStore {
    /// The statuses of a batch's operation once final (none for a batch
    /// that submitted nothing), or `None` while it is in flight; the
    /// operation is consumed only when final.
    pub(crate) fn poll_op(&self, op: Option<OpHandle>) -> Result<Option<Vec<RequestStatus>>, tutti::Error> {
        match op {
            Some(op) => self.media.rt().try_wait(op),
            None => Ok(Some(Vec::new())),
        }
    }

    /// Releases what dropped batches held (`inflight.rs`), for those whose
    /// commands are final. A stale handle (someone else consumed it) is
    /// final too.
    pub(crate) fn reap_orphans(&self) {
        self.inflight.reap(
            |op| !matches!(self.poll_op(op), Ok(None)),
            |held| {
                let mut ix = self.index();
                for h in held {
                    match *h {
                        Held::Reserved(s) => ix.unreserve(s, false),
                        Held::Pinned(s) => ix.unpin(s),
                    }
                }
            },
        );
    }
}
