//! The store against a model, driven by random operation sequences.
//!
//! Each case opens a store on 1 to 4 file-backed emulated drives (striped
//! when more than one) small enough that puts evict (about 15 objects of
//! at most 64 KiB), runs a random sequence of put batches (a batch may name
//! a key twice: the later item wins; some are read while in flight, some
//! abandoned before a restart), gets, contains, lookup_prefix,
//! removes, syncs and restarts (store and runtime dropped, both reopened
//! over the same drive files), and checks every answer against a model
//! that knows, per key, the latest acknowledged version and length.
//! Payload bytes are derived from (key, version), so a get that returns
//! the bytes of another key or of an older version is caught.
//!
//! The model does not know the LRU order, so it lets any key be absent
//! because it was evicted, but:
//!
//! - a present key (get, contains, lookup_prefix, remove) holds exactly
//!   its latest acknowledged version, bytes and length; a key never put,
//!   or removed, is absent;
//! - a key found absent without a remove was evicted: only a put after
//!   its acknowledgement can have evicted it (the eviction counter moved),
//!   and it stays absent until it is put again;
//! - a put in flight is not visible: its keys read back what they held
//!   before until `wait_put` returns; a put never waited for, its store
//!   then restarted (a crash after the payload writes, before the
//!   records), leaves no trace;
//! - after a restart every key present before it still is, with the same
//!   bytes (puts are durable when acknowledged); a removed or evicted key
//!   stays absent if a sync came after the remove or eviction, and
//!   otherwise may only come back as its latest acknowledged version,
//!   never an older one; recovery finds exactly the objects present and
//!   no invalid record.
//!
//! `PROPTEST_CASES` sets the number of cases (default 24, sized for CI on
//! two cores in a debug build).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use common::*;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tutti::Runtime;
use tutti_kv::{Get, ItemStatus, Key, KvStore, Put, Value};

/// Object (slot) size, bytes.
const OBJ: u64 = 64 << 10;
/// Keys are drawn from `0..KEYS`; the store holds about 15 objects.
const KEYS: u64 = 20;

#[derive(Debug, Clone)]
enum Op {
    /// One batch: (key, payload length) per item.
    Put(Vec<(u64, u64)>),
    /// A batch started, the keys read while it is in flight, then either
    /// waited for, or never waited for and the store restarted (a crash
    /// after the payloads were written, before their records were).
    PutInFlight(Vec<(u64, u64)>, bool),
    Get(Vec<u64>),
    Contains(Vec<u64>),
    LookupPrefix(Vec<u64>),
    Remove(Vec<u64>),
    Sync,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let k = || 0..KEYS;
    let len = prop_oneof![1..=OBJ, Just(OBJ), 1..=4096u64];
    prop_oneof![
        8 => vec((k(), len.clone()), 1..=4).prop_map(Op::Put),
        2 => (vec((k(), len), 1..=3), any::<bool>()).prop_map(|(items, abandon)| Op::PutInFlight(items, abandon)),
        4 => vec(k(), 1..=4).prop_map(Op::Get),
        2 => vec(k(), 1..=6).prop_map(Op::Contains),
        2 => vec(k(), 1..=6).prop_map(Op::LookupPrefix),
        3 => vec(k(), 1..=3).prop_map(Op::Remove),
        2 => Just(Op::Sync),
        2 => Just(Op::Restart),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(24)
}

/// What the model knows of one key.
#[derive(Debug, Clone, Copy, Default)]
struct KeyModel {
    /// (version, length) of the latest acknowledged put, while the key has
    /// not been removed or found evicted since.
    latest: Option<(u64, u64)>,
    /// The store's eviction counter when `latest` became live: the key can
    /// only have been evicted once the counter has moved past it.
    evictions_then: u64,
    /// (version, length) of an object removed or evicted since the last
    /// sync: a restart may bring it back.
    ghost: Option<(u64, u64)>,
}

/// The store under test, with its runtime and drive files.
struct Sut {
    dir: tempfile::TempDir,
    drives: usize,
    /// Dropped before `rt`.
    kv: Option<KvStore>,
    rt: Option<Arc<Runtime>>,
    model: HashMap<u64, KeyModel>,
    next_version: u64,
}

/// Per-drive capacity so that the store is about 1 MiB (16 slots of
/// 64 KiB, one of them for the superblock and records) whatever the number
/// of drives: whole stripe units per drive.
fn drive_capacity(drives: usize) -> String {
    let unit_kib = STRIPE_UNIT >> 10;
    let kib = (1024u64 / drives as u64).div_ceil(unit_kib) * unit_kib;
    format!("{kib}KiB")
}

fn open_at(dir: &Path, drives: usize) -> (Arc<Runtime>, KvStore) {
    let rt = file_runtime_sized(dir, drives, &drive_capacity(drives), "64KiB");
    let kv = open(&rt);
    (rt, kv)
}

/// Fails the case with a message, like `prop_assert!`.
macro_rules! check {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(TestCaseError::fail(format!($($fmt)*)));
        }
    };
}

type R = Result<(), TestCaseError>;

impl Sut {
    fn new(drives: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (rt, kv) = open_at(dir.path(), drives);
        assert!(kv.stats().capacity >= 10, "{:?}", kv.stats());
        Self { dir, drives, kv: Some(kv), rt: Some(rt), model: HashMap::new(), next_version: 1 }
    }

    fn kv(&self) -> &KvStore {
        self.kv.as_ref().unwrap()
    }

    fn m(&mut self, k: u64) -> &mut KeyModel {
        self.model.entry(k).or_default()
    }

    /// The store says `k` is absent while the store is open.
    fn absent(&mut self, k: u64, why: &str) -> R {
        let evictions = self.kv().stats().evictions;
        let m = self.m(k);
        if let Some(x) = m.latest {
            check!(
                evictions > m.evictions_then,
                "{why}: key {k} (version {x:?}) is absent, yet nothing was evicted since it was put \
                 (evictions {evictions})"
            );
            m.ghost = Some(x);
            m.latest = None;
        }
        Ok(())
    }

    /// The store says `k` is present (no bytes seen).
    fn present(&mut self, k: u64, why: &str) -> R {
        let m = self.m(k);
        check!(m.latest.is_some(), "{why}: key {k} is present, but the model has it absent: {m:?}");
        Ok(())
    }

    /// Fills `src` with a new version per item; the versions.
    fn payloads(&mut self, items: &[(u64, u64)], src: &mut [u8]) -> Vec<u64> {
        let mut versions = Vec::new();
        for (i, &(k, _)) in items.iter().enumerate() {
            let v = self.next_version;
            self.next_version += 1;
            fill(&mut src[i * OBJ as usize..(i + 1) * OBJ as usize], k, v);
            versions.push(v);
        }
        versions
    }

    fn put(&mut self, items: &[(u64, u64)]) -> R {
        let kv = self.kv.take().unwrap();
        let mut src = Buf::new(&kv, items.len() * OBJ as usize);
        let versions = self.payloads(items, &mut src.bytes);
        let st = kv.put_sync(&batch(items, src.mem()), T).unwrap();
        drop(src);
        self.kv = Some(kv);
        self.acknowledged(items, versions, st)
    }

    /// A put whose keys are read while it is in flight: they show what
    /// they held before. Then it is waited for, or (`abandon`) never
    /// waited for, and the store restarts: its objects must not appear.
    fn put_in_flight(&mut self, items: &[(u64, u64)], abandon: bool) -> R {
        let mut src = vec![0u8; items.len() * OBJ as usize];
        let versions = self.payloads(items, &mut src);
        let kv = self.kv.as_ref().unwrap();
        // SAFETY: `src` lives until after the runtime is dropped (an
        // abandoned put may still be reading it until then) or the put is
        // waited for; it is not touched meanwhile.
        #[allow(unsafe_code)]
        let mem = unsafe { kv.register_host(src.as_mut_ptr(), src.len()) }.unwrap();
        let pending = kv.put(&batch(items, &mem)).unwrap();
        let keys: Vec<u64> = items.iter().map(|&(k, _)| k).collect();
        self.get(&keys)?;
        if abandon {
            drop(pending);
            self.restart()?;
            drop(src);
            return Ok(());
        }
        let kv = self.kv.as_ref().unwrap();
        let st = kv.wait_put(pending, T).unwrap();
        kv.unregister(mem).unwrap();
        drop(src);
        self.acknowledged(items, versions, st)
    }

    /// Applies the statuses of a put batch (each must be `Ok`).
    fn acknowledged(&mut self, items: &[(u64, u64)], versions: Vec<u64>, st: Vec<ItemStatus>) -> R {
        let kv = self.kv();
        // A put that evicts removes other keys from the store: the
        // counter read after the batch is the one each item's key starts
        // from.
        let evictions = kv.stats().evictions;
        for ((&(k, len), v), s) in items.iter().zip(versions).zip(st) {
            check!(s == ItemStatus::Ok, "put of key {k} (version {v}, {len} bytes): {s:?}");
            // In order: the later item of one key wins.
            *self.m(k) = KeyModel { latest: Some((v, len)), evictions_then: evictions, ghost: None };
        }
        Ok(())
    }

    /// Gets `keys` and checks each answer.
    fn get(&mut self, keys: &[u64]) -> R {
        let kv = self.kv.as_ref().unwrap();
        let dst = Buf::new(kv, keys.len() * OBJ as usize);
        let gets: Vec<Get> = keys
            .iter()
            .enumerate()
            .map(|(i, &k)| Get {
                key: key(k),
                into: Value { memory: dst.mem(), offset: i as u64 * OBJ, len: OBJ },
            })
            .collect();
        let st = kv.get_sync(&gets, T).unwrap();
        let bytes = dst.bytes.clone();
        drop(dst);
        let mut want = vec![0u8; OBJ as usize];
        for (i, (&k, s)) in keys.iter().zip(st).enumerate() {
            match s {
                ItemStatus::Miss => self.absent(k, "get")?,
                ItemStatus::Hit { len } => {
                    let m = *self.m(k);
                    let Some((v, want_len)) = m.latest else {
                        return Err(TestCaseError::fail(format!(
                            "get: key {k} hit ({len} bytes), model {m:?}"
                        )));
                    };
                    check!(len == want_len, "get: key {k} has {len} bytes, version {v} had {want_len}");
                    fill(&mut want, k, v);
                    let got = &bytes[i * OBJ as usize..i * OBJ as usize + len as usize];
                    check!(got == &want[..len as usize], "get: key {k}: bytes are not those of version {v}");
                }
                other => return Err(TestCaseError::fail(format!("get: key {k}: {other:?}"))),
            }
        }
        Ok(())
    }

    fn contains(&mut self, keys: &[u64]) -> R {
        let ks: Vec<Key> = keys.iter().map(|&k| key(k)).collect();
        let found = self.kv().contains(&ks);
        check!(found.len() == keys.len(), "contains answered {} of {}", found.len(), keys.len());
        for (&k, f) in keys.iter().zip(found) {
            if f {
                self.present(k, "contains")?;
            } else {
                self.absent(k, "contains")?;
            }
        }
        Ok(())
    }

    fn lookup_prefix(&mut self, keys: &[u64]) -> R {
        let ks: Vec<Key> = keys.iter().map(|&k| key(k)).collect();
        let n = self.kv().lookup_prefix(&ks);
        check!(n <= keys.len(), "lookup_prefix {n} of {}", keys.len());
        for &k in &keys[..n] {
            self.present(k, "lookup_prefix")?;
        }
        if let Some(&k) = keys.get(n) {
            self.absent(k, "lookup_prefix (the first key not found)")?;
        }
        // No I/O and no LRU change in between: contains agrees.
        let all = self.kv().contains(&ks);
        let agree = all.iter().take_while(|&&f| f).count();
        check!(agree == n, "lookup_prefix {n}, contains {all:?}");
        Ok(())
    }

    fn remove(&mut self, keys: &[u64]) -> R {
        let ks: Vec<Key> = keys.iter().map(|&k| key(k)).collect();
        let st = self.kv().remove(&ks);
        check!(st.len() == keys.len(), "remove answered {} of {}", st.len(), keys.len());
        for (&k, s) in keys.iter().zip(st) {
            match s {
                ItemStatus::Ok => {
                    self.present(k, "remove")?;
                    let m = self.m(k);
                    m.ghost = m.latest.take();
                }
                ItemStatus::Miss => self.absent(k, "remove")?,
                other => return Err(TestCaseError::fail(format!("remove of key {k}: {other:?}"))),
            }
        }
        Ok(())
    }

    /// Checks every key (contains, then a get of each present one) and the
    /// object count.
    fn scan(&mut self) -> R {
        let keys: Vec<u64> = (0..KEYS).collect();
        self.contains(&keys)?;
        let present: Vec<u64> = keys.iter().copied().filter(|k| self.model[k].latest.is_some()).collect();
        for chunk in present.chunks(4) {
            self.get(chunk)?;
        }
        let objects = self.kv().stats().objects;
        check!(objects == present.len() as u64, "{objects} objects, {} keys present", present.len());
        Ok(())
    }

    fn sync(&mut self) -> R {
        // Evictions are seen only when looked for: find those made before
        // the sync, which it makes durable.
        self.contains(&(0..KEYS).collect::<Vec<_>>())?;
        self.kv().sync().unwrap();
        for m in self.model.values_mut() {
            m.ghost = None;
        }
        Ok(())
    }

    fn restart(&mut self) -> R {
        self.scan()?;
        let before = self.kv().stats();
        drop(self.kv.take());
        drop(self.rt.take());
        let (rt, kv) = open_at(self.dir.path(), self.drives);
        let s = kv.stats();
        check!(s.invalid_records == 0, "after a restart: {s:?} (before: {before:?})");
        self.kv = Some(kv);
        self.rt = Some(rt);
        // What recovery found: every key that was present before, and
        // perhaps a removed or evicted one not synced since.
        let keys: Vec<Key> = (0..KEYS).map(key).collect();
        let found = self.kv().contains(&keys);
        let mut recovered = 0;
        for (k, f) in (0..KEYS).zip(found) {
            let m = self.m(k);
            match (f, m.latest, m.ghost) {
                (true, Some(x), _) | (true, None, Some(x)) => {
                    *m = KeyModel { latest: Some(x), evictions_then: 0, ghost: None };
                    recovered += 1;
                }
                (false, None, _) => *m = KeyModel::default(),
                (true, None, None) => {
                    return Err(TestCaseError::fail(format!(
                        "after a restart key {k} is back, but it was removed or evicted before a sync"
                    )))
                }
                (false, Some(x), _) => {
                    return Err(TestCaseError::fail(format!(
                        "after a restart key {k} (version {x:?}, acknowledged) is lost"
                    )))
                }
            }
        }
        check!(
            s.recovered == recovered,
            "recovered {} objects, {recovered} keys present: {s:?}",
            s.recovered
        );
        // Their bytes are those of the version the model now expects.
        self.scan()
    }

    fn apply(&mut self, op: &Op) -> R {
        match op {
            Op::Put(items) => self.put(items),
            Op::PutInFlight(items, abandon) => self.put_in_flight(items, *abandon),
            Op::Get(keys) => self.get(keys),
            Op::Contains(keys) => self.contains(keys),
            Op::LookupPrefix(keys) => self.lookup_prefix(keys),
            Op::Remove(keys) => self.remove(keys),
            Op::Sync => self.sync(),
            Op::Restart => self.restart(),
        }
    }
}

/// The puts of `items`, item `i` from `src` at `i * OBJ`.
fn batch<'a>(items: &[(u64, u64)], src: &'a tutti_kv::KvMemory) -> Vec<Put<'a>> {
    items
        .iter()
        .enumerate()
        .map(|(i, &(k, len))| Put { key: key(k), value: Value { memory: src, offset: i as u64 * OBJ, len } })
        .collect()
}

impl Drop for Sut {
    fn drop(&mut self) {
        drop(self.kv.take());
        drop(self.rt.take());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_store_behaves_like_its_model(drives in 1usize..=4, ops in vec(op(), 1..48)) {
        let mut sut = Sut::new(drives);
        for (i, op) in ops.iter().enumerate() {
            sut.apply(op).map_err(|e| TestCaseError::fail(format!("op {i} {op:?}: {e}")))?;
        }
        sut.restart()?;
    }
}
