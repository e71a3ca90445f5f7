//! `tutti.KvStore`, `tutti.KvMemory`, `tutti.KvBatch` and `tutti.ChunkKeys`:
//! tutti-kv with keys as bytes, memory exported by Python objects, and
//! per-item statuses.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tutti::error_chain;
use tutti_kv::{
    Access, ChunkKeys as RsChunkKeys, Create, Get, Key, KeySize, KvMemory as RsKvMemory,
    KvStore as RsKvStore, OpenOptions, PendingGets, PendingPuts, Put, Value,
};

use crate::deferred;
use crate::errors::{IntoPyResult, MemoryRegistrationError, TuttiError};
use crate::memory::describe;
use crate::registrar::Held;
use crate::request::{still_waited_on, wait_for_other};
use crate::runtime::{seconds, PyRuntime};
use crate::status::ItemStatus;

/// A key from bytes (16 or 32 of them), or `ValueError`.
fn key(b: &[u8]) -> PyResult<Key> {
    Key::new(b).map_err(|e| PyValueError::new_err(format!("a key has 16 or 32 bytes, not {}", e.0)))
}

fn key_size(n: usize) -> PyResult<KeySize> {
    KeySize::from_bytes(n).ok_or_else(|| PyValueError::new_err(format!("key_size is 16 or 32, not {n}")))
}

/// Memory registered with a `KvStore` (from `KvStore.register`); values are
/// byte ranges of it. Same rules as `tutti.Memory`: it keeps its object
/// alive until `KvStore.unregister` succeeds; do not touch the bytes while
/// a put or get using them is in flight; read-only memory can be saved
/// from, not loaded into.
#[pyclass(frozen, module = "tutti", name = "KvMemory")]
#[derive(Debug)]
pub struct KvMemory {
    held: Held<RsKvStore>,
    /// The registration, at a stable address that a `GetBatch` borrows.
    mem: Arc<RsKvMemory>,
}

#[pymethods]
impl KvMemory {
    /// The runtime's memory handle (an int).
    #[getter]
    fn handle(&self) -> u64 {
        self.mem.handle().to_u64()
    }

    /// Length of the region, bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.mem.len()
    }

    /// "host" or "gpu".
    #[getter]
    fn kind(&self) -> &'static str {
        match self.mem.kind() {
            tutti_kv::MemoryKind::Host => "host",
            tutti_kv::MemoryKind::Gpu => "gpu",
        }
    }

    /// True when the exporter gave the memory read-only.
    #[getter]
    fn readonly(&self) -> bool {
        self.held.readonly
    }

    fn __repr__(&self) -> String {
        match &*self.held.export() {
            Some(e) => format!("KvMemory(handle={:#x}, {})", self.handle(), describe(e)),
            None => format!("KvMemory(handle={:#x}, unregistered)", self.handle()),
        }
    }
}

/// One `(key, memory, offset, length)` item: key bytes, a `KvMemory`,
/// offset and length in bytes.
type Item<'py> = (Vec<u8>, Bound<'py, KvMemory>, u64, u64);

/// A checked item: key, registration, offset and length (bytes).
type Parsed = (Key, Arc<RsKvMemory>, u64, u64);

/// The items' keys, memories and ranges, checked (key size, store,
/// registration, read-only for loads).
fn parse_items(kv: &Arc<RsKvStore>, items: &[Item<'_>], load: bool) -> PyResult<Vec<Parsed>> {
    items
        .iter()
        .enumerate()
        .map(|(i, (k, m, off, len))| {
            let m = m.get();
            if !Arc::ptr_eq(m.held.owner(), kv) || m.held.export().is_none() {
                return Err(MemoryRegistrationError::new_err(format!(
                    "items[{i}]: memory registered with another store or already unregistered"
                )));
            }
            if load && m.held.readonly {
                return Err(MemoryRegistrationError::new_err(format!(
                    "items[{i}]: a get cannot load into read-only memory; nothing was submitted"
                )));
            }
            Ok((key(k)?, m.mem.clone(), *off, *len))
        })
        .collect()
}

/// What a `KvBatch` waits on.
#[derive(Debug)]
enum Batch {
    Puts(PendingPuts),
    Gets(GetBatch),
    Waiting,
    Done(Vec<ItemStatus>),
    /// A wait failed (the batch is gone): the error's text, raised again.
    Failed(String),
}

/// Gets in flight and the registrations their `Value`s borrow.
#[derive(Debug)]
struct GetBatch {
    // Declared before `mems`: dropped first, while what it borrows lives.
    pending: PendingGets<'static>,
    mems: Vec<Arc<RsKvMemory>>,
}

impl GetBatch {
    fn start(kv: &RsKvStore, parsed: Vec<Parsed>) -> PyResult<Self> {
        let mems: Vec<Arc<RsKvMemory>> = parsed.iter().map(|p| p.1.clone()).collect();
        let gets: Vec<Get<'static>> = parsed
            .iter()
            .map(|(k, m, off, len)| {
                // SAFETY: the KvMemory lives in an `Arc` allocation that
                // `mems` keeps alive (and never mutates) for as long as the
                // `PendingGets` borrowing it: both live in this `GetBatch`,
                // whose `pending` field is dropped before `mems`.
                let memory: &'static RsKvMemory = unsafe { &*Arc::as_ptr(m) };
                Get { key: *k, into: Value { memory, offset: *off, len: *len } }
            })
            .collect();
        let pending = kv.get(&gets).py()?;
        Ok(Self { pending, mems })
    }
}

/// A batch of puts or gets in flight. `wait` (or `done`/`try_wait` until
/// they say it is final) gives one `ItemStatus` per item, in order; the
/// result is kept for later calls. A put is durable, and visible, only once
/// its status is "ok".
#[pyclass(frozen, module = "tutti", name = "KvBatch")]
#[derive(Debug)]
pub struct KvBatch {
    kv: Arc<RsKvStore>,
    state: Mutex<Batch>,
    /// Signalled when a thread's wait leaves `Batch::Waiting`.
    waited: Condvar,
    /// The `KvMemory` objects its items named, alive until it is final, so
    /// a temporary registration (`kv.put([(k, kv.register(a), 0, n)])`) is
    /// unregistered once the batch is done instead of being refused while
    /// in flight and then kept forever.
    keep: Mutex<Vec<Py<KvMemory>>>,
}

/// The distinct `KvMemory` objects of `items`, for their batch to keep.
fn distinct_memory(items: &[Item<'_>]) -> Vec<Py<KvMemory>> {
    let mut keep: Vec<Py<KvMemory>> = Vec::with_capacity(1);
    for (_, m, _, _) in items {
        if !keep.iter().any(|k| k.is(m)) {
            keep.push(m.clone().unbind());
        }
    }
    keep
}

fn item_statuses(v: &[tutti_kv::ItemStatus]) -> Vec<ItemStatus> {
    v.iter().map(ItemStatus::from_item).collect()
}

impl KvBatch {
    fn new(kv: Arc<RsKvStore>, batch: Batch, keep: Vec<Py<KvMemory>>) -> Self {
        Self { kv, state: Mutex::new(batch), waited: Condvar::new(), keep: Mutex::new(keep) }
    }

    fn lock(&self) -> MutexGuard<'_, Batch> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets go of the batch's `KvMemory` objects (it is final: the store no
    /// longer uses their memory). Called with the GIL held.
    fn release_memory(&self, py: Python<'_>) {
        std::mem::take(&mut *self.keep.lock().unwrap_or_else(|p| p.into_inner()));
        deferred::retry(py);
    }

    fn poll(&self, batch: Batch) -> PyResult<Batch> {
        Ok(match batch {
            Batch::Puts(p) => match self.kv.try_wait_put(p).py()? {
                Ok(s) => Batch::Done(item_statuses(&s)),
                Err(p) => Batch::Puts(p),
            },
            Batch::Gets(GetBatch { pending, mems }) => match self.kv.try_wait_get(pending).py()? {
                Ok(s) => {
                    drop(mems);
                    Batch::Done(item_statuses(&s))
                }
                Err(pending) => Batch::Gets(GetBatch { pending, mems }),
            },
            other => other,
        })
    }
}

#[pymethods]
impl KvBatch {
    /// Waits (GIL released) until every item is final or `timeout` seconds
    /// pass; one ItemStatus per item. Items not final by then are
    /// "timeout" (final: the store releases them when the drives finish).
    /// A thread that calls `wait` while another thread's wait runs waits
    /// for that one and returns its result (or raises `tutti.TimeoutError`
    /// if its own deadline passes first).
    #[pyo3(signature = (timeout = 5.0))]
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<ItemStatus>> {
        let timeout = seconds(timeout)?;
        let deadline = Instant::now().checked_add(timeout);
        let kv = self.kv.clone();
        let result = loop {
            let mut st = self.lock();
            match std::mem::replace(&mut *st, Batch::Waiting) {
                Batch::Puts(p) => {
                    drop(st);
                    break py.detach(move || kv.wait_put(p, timeout));
                }
                Batch::Gets(GetBatch { pending, mems }) => {
                    drop(st);
                    break py.detach(move || {
                        let r = kv.wait_get(pending, timeout);
                        drop(mems);
                        r
                    });
                }
                Batch::Waiting => {
                    drop(st);
                    let busy = |b: &Batch| matches!(b, Batch::Waiting);
                    if py.detach(|| wait_for_other(&self.state, &self.waited, busy, deadline)) {
                        return Err(still_waited_on(py, "batch"));
                    }
                }
                Batch::Done(s) => {
                    *st = Batch::Done(s.clone());
                    return Ok(s);
                }
                Batch::Failed(m) => {
                    *st = Batch::Failed(m.clone());
                    return Err(TuttiError::new_err(m));
                }
            }
        };
        let out = result.map(|s| item_statuses(&s));
        *self.lock() = match &out {
            Ok(s) => Batch::Done(s.clone()),
            Err(e) => Batch::Failed(format!("an earlier wait on this batch failed: {}", error_chain(e))),
        };
        self.waited.notify_all();
        self.release_memory(py);
        out.py()
    }

    /// Polls once without blocking: the statuses when every item is final
    /// (kept), else None.
    fn try_wait(&self, py: Python<'_>) -> PyResult<Option<Vec<ItemStatus>>> {
        let mut st = self.lock();
        let batch = std::mem::replace(&mut *st, Batch::Waiting);
        let was_waiting = matches!(batch, Batch::Waiting);
        let out = match self.poll(batch) {
            Ok(next) => {
                *st = next;
                match &*st {
                    Batch::Done(s) if !was_waiting => Some(s.clone()),
                    Batch::Failed(m) => return Err(TuttiError::new_err(m.clone())),
                    _ => None,
                }
            }
            Err(e) => {
                // The batch is gone: later calls raise this again.
                *st = Batch::Failed(format!("an earlier poll of this batch failed: {e}"));
                return Err(e);
            }
        };
        drop(st);
        if out.is_some() {
            self.release_memory(py);
        }
        Ok(out)
    }

    /// Whether every item is final (polls once; the statuses are kept).
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.try_wait(py)?.is_some())
    }
}

/// A persistent, crash-consistent store of KV-cache blocks over one runtime
/// store (a `slab` resolver: one object per slot, the slot size being the
/// largest object). Keys are 16- or 32-byte `bytes` (see `ChunkKeys`);
/// values are byte ranges of registered memory. A restarted process finds
/// what an earlier one saved; a get reports "hit" only when the bytes match
/// their stored CRC32C.
#[pyclass(frozen, module = "tutti", name = "KvStore")]
#[derive(Debug)]
pub struct KvStore {
    kv: Arc<RsKvStore>,
    /// The runtime object, kept alive as long as the store.
    #[allow(dead_code)]
    runtime: Py<PyRuntime>,
}

#[pymethods]
impl KvStore {
    /// Opens runtime store `store` of `runtime` (formatting it as `create`
    /// says: "if_blank" formats a blank store, "never" refuses one,
    /// "always" erases whatever it holds) and rebuilds its index from the
    /// media. `key_size` (16 or 32) is checked against the store, or used
    /// when formatting (32 when None). A writer (the default) takes the
    /// store's lease on the media; `read_only=True` takes none, never
    /// formats, and refuses puts and syncs. Raises `tutti.KvError`,
    /// `tutti.StoreLeasedError` when another writer holds the store.
    #[staticmethod]
    #[pyo3(signature = (runtime, store = "kv", key_size = None, create = "if_blank", read_only = false))]
    fn open(
        py: Python<'_>,
        runtime: Bound<'_, PyRuntime>,
        store: &str,
        key_size: Option<usize>,
        create: &str,
        read_only: bool,
    ) -> PyResult<Self> {
        let mut opts = OpenOptions::new(store);
        if read_only {
            opts.access = Access::ReadOnly;
        }
        opts.key_size = key_size.map(self::key_size).transpose()?;
        opts.create = match create {
            "if_blank" => Create::IfBlank,
            "never" => Create::Never,
            "always" => Create::Always,
            other => {
                return Err(PyValueError::new_err(format!(
                    "create is if_blank, never or always, not {other:?}"
                )))
            }
        };
        let rt = runtime.get().rt.clone();
        let kv = py.detach(move || RsKvStore::open(rt, &opts)).py()?;
        Ok(Self { kv: Arc::new(kv), runtime: runtime.unbind() })
    }

    /// Registers `obj`'s memory for values (the objects `Runtime.register`
    /// takes); returns a `KvMemory`.
    fn register(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<KvMemory> {
        deferred::retry(py);
        let held = Held::register(py, &self.kv, obj)?;
        Ok(KvMemory { mem: Arc::new(held.handle()), held })
    }

    /// Unregisters memory and lets go of its object. Raises
    /// `tutti.MemoryRegistrationError` while a put or get not yet waited on
    /// uses it, or for memory of another store, and `tutti.HandleError`
    /// for memory already unregistered.
    fn unregister(&self, py: Python<'_>, memory: &Bound<'_, KvMemory>) -> PyResult<()> {
        deferred::retry(py);
        let m = memory.get();
        if !Arc::ptr_eq(m.held.owner(), &self.kv) {
            return Err(MemoryRegistrationError::new_err("memory registered with another store"));
        }
        m.held.unregister(py, &self.kv)
    }

    /// Starts saving `items`, each `(key, memory, offset, length)`: `length`
    /// bytes at byte `offset` of a `KvMemory` stored under `key`. Returns a
    /// `KvBatch`; nothing is durable or visible until its status is "ok".
    fn put(&self, py: Python<'_>, items: Vec<Item<'_>>) -> PyResult<KvBatch> {
        deferred::retry(py);
        let parsed = parse_items(&self.kv, &items, false)?;
        let keep = distinct_memory(&items);
        let kv = self.kv.clone();
        let pending = py.detach(move || {
            let puts: Vec<Put<'_>> = parsed
                .iter()
                .map(|(k, m, off, len)| Put { key: *k, value: Value { memory: m, offset: *off, len: *len } })
                .collect();
            kv.put(&puts)
        });
        Ok(KvBatch::new(self.kv.clone(), Batch::Puts(pending.py()?), keep))
    }

    /// Starts loading `items`, each `(key, memory, offset, length)`: the
    /// object of `key` into byte `offset` of a `KvMemory` with room for
    /// `length` bytes (at least the object's length rounded up to the
    /// logical block size). Returns a `KvBatch` whose statuses are "hit"
    /// (with `.length`), "miss", "checksum_mismatch"...
    fn get(&self, py: Python<'_>, items: Vec<Item<'_>>) -> PyResult<KvBatch> {
        deferred::retry(py);
        let parsed = parse_items(&self.kv, &items, true)?;
        let batch = GetBatch::start(&self.kv, parsed)?;
        Ok(KvBatch::new(self.kv.clone(), Batch::Gets(batch), distinct_memory(&items)))
    }

    /// `put(items).wait(timeout)`.
    #[pyo3(signature = (items, timeout = 5.0))]
    fn put_sync(&self, py: Python<'_>, items: Vec<Item<'_>>, timeout: f64) -> PyResult<Vec<ItemStatus>> {
        self.put(py, items)?.wait(py, timeout)
    }

    /// `get(items).wait(timeout)`.
    #[pyo3(signature = (items, timeout = 5.0))]
    fn get_sync(&self, py: Python<'_>, items: Vec<Item<'_>>, timeout: f64) -> PyResult<Vec<ItemStatus>> {
        self.get(py, items)?.wait(py, timeout)
    }

    /// For each key, whether the store holds an object of it.
    fn contains(&self, keys: Vec<Vec<u8>>) -> PyResult<Vec<bool>> {
        let keys = keys.iter().map(|k| key(k)).collect::<PyResult<Vec<_>>>()?;
        Ok(self.kv.contains(&keys))
    }

    /// The keys of every object the store holds, least recently used first
    /// (a snapshot, no I/O), as bytes.
    fn keys<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.kv.keys().iter().map(|k| PyBytes::new(py, k.as_bytes())).collect()
    }

    /// How many of `keys`, from the first, the store holds (a chain of
    /// `ChunkKeys` keys: the number of leading chunks that can be loaded).
    fn lookup_prefix(&self, keys: Vec<Vec<u8>>) -> PyResult<usize> {
        let keys = keys.iter().map(|k| key(k)).collect::<PyResult<Vec<_>>>()?;
        Ok(self.kv.lookup_prefix(&keys))
    }

    /// Removes objects; one ItemStatus per key ("ok" or "miss"). Durable
    /// after the next `sync`.
    fn remove(&self, py: Python<'_>, keys: Vec<Vec<u8>>) -> PyResult<Vec<ItemStatus>> {
        let keys = keys.iter().map(|k| key(k)).collect::<PyResult<Vec<_>>>()?;
        let kv = self.kv.clone();
        Ok(item_statuses(&py.detach(move || kv.remove(&keys))))
    }

    /// Makes removals durable (a commit round).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let kv = self.kv.clone();
        py.detach(move || kv.sync()).py()
    }

    /// Counters and sizes of the store as a dict of ints (capacity in
    /// objects, object_size in bytes, objects, puts, hits, misses,
    /// checksum_mismatches, evictions, commit_rounds, records_cleared,
    /// device_errors, recovered, invalid_records, recovery_ns,
    /// orphaned_batches).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.kv.stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("capacity", s.capacity),
            ("object_size", s.object_size),
            ("objects", s.objects),
            ("puts", s.puts),
            ("hits", s.hits),
            ("misses", s.misses),
            ("checksum_mismatches", s.checksum_mismatches),
            ("evictions", s.evictions),
            ("commit_rounds", s.commit_rounds),
            ("records_cleared", s.records_cleared),
            ("device_errors", s.device_errors),
            ("recovered", s.recovered),
            ("invalid_records", s.invalid_records),
            ("recovery_ns", s.recovery_ns),
            ("orphaned_batches", s.orphaned_batches),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Key size of the store, bytes (16 or 32).
    #[getter]
    fn key_size(&self) -> usize {
        self.kv.key_size().bytes()
    }

    /// The runtime the store runs on.
    #[getter]
    fn runtime(&self, py: Python<'_>) -> Py<PyRuntime> {
        self.runtime.clone_ref(py)
    }
}

/// Chained keys for token chunks: the key of chunk `i` names the whole
/// prefix up to and including chunk `i` under `namespace` (model, dtype...),
/// so two prompts share keys exactly as long as they share tokens.
/// Identical to tutti-kv's `ChunkKeys` (BLAKE3).
#[pyclass(frozen, module = "tutti", name = "ChunkKeys")]
#[derive(Debug)]
pub struct ChunkKeys {
    inner: RsChunkKeys,
    size: usize,
}

#[pymethods]
impl ChunkKeys {
    /// Keys of `key_size` bytes (16 or 32) for KV produced under
    /// `namespace`.
    #[new]
    #[pyo3(signature = (namespace, key_size = 32))]
    fn new(namespace: &[u8], key_size: usize) -> PyResult<Self> {
        Ok(Self { inner: RsChunkKeys::new(namespace, self::key_size(key_size)?), size: key_size })
    }

    /// The keys of every whole chunk of `chunk_tokens` token ids (uint32)
    /// in `tokens`; a trailing partial chunk has no key.
    fn chain<'py>(&self, py: Python<'py>, tokens: Vec<u32>, chunk_tokens: usize) -> Vec<Bound<'py, PyBytes>> {
        self.inner.chain(&tokens, chunk_tokens).iter().map(|k| PyBytes::new(py, k.as_bytes())).collect()
    }

    /// The key after `prev` (the previous chunk's key, None for the first
    /// chunk) of a chunk holding `tokens`.
    #[pyo3(signature = (prev, tokens))]
    fn next<'py>(
        &self,
        py: Python<'py>,
        prev: Option<Vec<u8>>,
        tokens: Vec<u32>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let prev = prev.map(|p| key(&p)).transpose()?;
        Ok(PyBytes::new(py, self.inner.next(prev.as_ref(), &tokens).as_bytes()))
    }

    /// Key size, bytes.
    #[getter]
    fn key_size(&self) -> usize {
        self.size
    }
}

/// Adds the kv classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<KvStore>()?;
    m.add_class::<KvMemory>()?;
    m.add_class::<KvBatch>()?;
    m.add_class::<ChunkKeys>()?;
    Ok(())
}
