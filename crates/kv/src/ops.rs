//! The calls that need no payload I/O (contains, keys, lookup_prefix,
//! remove), the durability barrier (sync), and memory registration.

use crate::error::{ItemStatus, KvError};
use crate::key::Key;
use crate::memory::{KvMemory, MemoryKind};
use crate::store::KvStore;

impl KvStore {
    /// Whether each key has a live object (no I/O).
    pub fn contains(&self, keys: &[Key]) -> Vec<bool> {
        let ix = self.index();
        keys.iter().map(|k| ix.contains(k)).collect()
    }

    /// The keys of every live object, least recently used first (the order
    /// eviction takes them in): a snapshot, no I/O. Objects put, removed
    /// or evicted after the call are not reflected. Copies every key under
    /// the index lock, which puts and gets wait for meanwhile: O(objects),
    /// a few milliseconds per million keys.
    pub fn keys(&self) -> Vec<Key> {
        self.index().keys()
    }

    /// How many of `keys`, from the first, are present without a gap:
    /// given the chained keys of a request's chunks
    /// ([`crate::ChunkKeys::chain`]), the number of leading chunks whose
    /// KV can be loaded. No I/O; a following get can still miss if the
    /// objects are evicted meanwhile.
    pub fn lookup_prefix(&self, keys: &[Key]) -> usize {
        let ix = self.index();
        keys.iter().take_while(|k| ix.contains(k)).count()
    }

    /// Removes each key's object: [`ItemStatus::Ok`], or
    /// [`ItemStatus::Miss`] when there was none. A removed key is gone for
    /// every later call at once, and stays gone after a crash once a
    /// [`KvStore::sync`] has returned.
    pub fn remove(&self, keys: &[Key]) -> Vec<ItemStatus> {
        let mut ix = self.index();
        keys.iter().map(|k| if ix.remove(k) { ItemStatus::Ok } else { ItemStatus::Miss }).collect()
    }

    /// Durability barrier: when it returns `Ok`, every put that returned
    /// `Ok` (they are durable already) and every remove and eviction made
    /// before the call survive a power failure.
    ///
    /// # Errors
    ///
    /// [`KvError::Io`] when writing the records or flushing failed;
    /// [`KvError::ReadOnly`]; [`KvError::LeaseLost`].
    pub fn sync(&self) -> Result<(), KvError> {
        self.writable()?;
        self.reap_orphans();
        // Every slot made stale before this call is cleared by the first
        // round that starts after it (N), which `commit` waits for, except
        // a key's newest stale record when it has older ones: N leaves it
        // for the next round (`index.rs`). That round may already run,
        // led by another thread, when N's own wait returns: the record has
        // left the queue of clears but is not durably cleared yet. So the
        // check counts clears a round in progress has taken
        // (`clears_pending`, not `has_clears`), and the second `commit`
        // returns only once a round that started after N ended has ended:
        // by then the deferred record was cleared, or its round failed and
        // gave it back to that one.
        self.commit_for_sync()?;
        if self.index().clears_pending() {
            self.commit_for_sync()?;
        }
        Ok(())
    }

    /// One commit round without puts, for [`KvStore::sync`].
    fn commit_for_sync(&self) -> Result<(), KvError> {
        self.commit(Vec::new()).map_err(|s| KvError::Io { store: self.media.name(), what: "sync", status: s })
    }

    /// Registers host memory for values.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must stay valid for reads and writes until
    /// [`KvStore::unregister`] returns `Ok` or, when it never does (a drive
    /// failed while a put or get used the memory: the runtime keeps it
    /// mapped until that drive is reset, and refuses with
    /// [`tutti::Error::MemoryBusy`]), until the store and every other
    /// holder of its runtime are dropped. It must not be touched by the
    /// caller while a put or get using it is in flight (the store reads it
    /// to checksum, drives read and write it by DMA).
    ///
    /// # Errors
    ///
    /// The runtime's registration errors.
    pub unsafe fn register_host(&self, ptr: *mut u8, len: usize) -> Result<KvMemory, KvError> {
        // SAFETY: forwarded to the caller (this function's contract is the
        // runtime's, plus the store's own reads).
        let handle = unsafe { self.media.rt().register_memory(ptr, len)? };
        Ok(KvMemory { handle, addr: ptr as u64, len, kind: MemoryKind::Host, store_id: self.id() })
    }

    /// Registers GPU memory (a CUDA device pointer of the runtime's GPU)
    /// for values; its payloads are checksummed by a kernel.
    ///
    /// # Safety
    ///
    /// `dptr..dptr + len` must be device memory of the runtime's GPU that
    /// stays allocated until [`KvStore::unregister`] returns `Ok` (or, when
    /// it never does, as for [`KvStore::register_host`], until the runtime
    /// is dropped), and is not written while a put or get using it is in
    /// flight.
    ///
    /// # Errors
    ///
    /// The runtime's registration errors ([`tutti::Error::Gpu`] without a
    /// GPU).
    pub unsafe fn register_gpu(&self, dptr: u64, len: usize) -> Result<KvMemory, KvError> {
        // SAFETY: forwarded to the caller.
        let handle = unsafe { self.media.rt().register_gpu_memory(dptr, len)? };
        Ok(KvMemory { handle, addr: dptr, len, kind: MemoryKind::Gpu, store_id: self.id() })
    }

    /// Unregisters memory registered with this store.
    ///
    /// # Errors
    ///
    /// [`KvError::ForeignMemory`] for memory of another store;
    /// [`KvError::MemoryInUse`] while a put or get using it has not been
    /// waited on (a dropped one counts until its commands are final); the
    /// runtime's error when a drive may still access it
    /// ([`KvError::Runtime`] with [`tutti::Error::MemoryBusy`]: a drive
    /// failed with the memory in use and has not been reset; the memory
    /// must then outlive the runtime).
    pub fn unregister(&self, mem: KvMemory) -> Result<(), KvError> {
        if mem.store_id != self.id() {
            return Err(KvError::ForeignMemory);
        }
        self.reap_orphans();
        if self.inflight.in_use(mem.handle) {
            return Err(KvError::MemoryInUse);
        }
        self.media.rt().unregister_memory(mem.handle)?;
        Ok(())
    }

    /// CRC32C of GPU ranges (device pointer, bytes), by one kernel launch.
    pub(crate) fn gpu_crcs(&self, ranges: &[(u64, usize)]) -> Result<Vec<u32>, KvError> {
        let gpu = self.media.rt().gpu().ok_or(KvError::NoGpu)?;
        // SAFETY: every range lies inside memory registered with
        // `register_gpu`, whose contract keeps it allocated device memory of
        // the runtime's GPU for the registration's lifetime, and the store
        // reads it only when no load into it is in flight.
        #[allow(unsafe_code)]
        let crcs = unsafe { gpu.crc32c_raw(ranges) };
        crcs.map_err(KvError::Gpu)
    }
}
