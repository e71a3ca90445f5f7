//! Several threads putting, getting and removing at once.
//!
//! - Group commit: 8 threads x 50 single-item puts, on private and shared
//!   keys, with a get after each put, take fewer commit rounds than put
//!   batches; every get that hits returns, byte for byte, a version that
//!   was put for that key (the bytes name their key and version); a
//!   thread reading back its own private key gets exactly its latest
//!   version, and a key a thread has seen acknowledged never misses (the
//!   store is large enough not to evict). After a restart each private
//!   key holds its last version and each shared key one of its versions.
//! - Eviction under concurrency: 4 threads on a store of 15 objects,
//!   putting, getting and removing 24 shared keys, so objects are
//!   evicted, superseded and removed while others read them: no get ever
//!   fails its checksum (a slot reused under a reader would), every hit is
//!   a version whose put was acknowledged, and after a sync and a restart
//!   every object present is such a version, with no invalid record.
//!   No put fails [`ItemStatus::Full`]: each thread pins or reserves at
//!   most one slot at a time, so there is always an object to evict.
//! - Without readers, 8 threads putting into a full store of 15 objects
//!   never get [`ItemStatus::Full`] (at most 7 slots are being put by the
//!   others; every other object can be evicted): a slot one put frees by
//!   evicting may be taken by another put, and the first must then evict
//!   again rather than give up.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Barrier, Mutex};

use common::*;
use tutti_kv::{Get, ItemStatus, KvStore, Put, Value};

const OBJ: u64 = 64 << 10;

/// (key, version) -> length of that put.
type Plan = HashMap<(u64, u64), u64>;

/// The (key, version) the bytes were filled with ([`fill`]: word 0 is
/// `key << 40 ^ version << 20`), for keys below 2^24 and versions below
/// 2^20.
fn named(bytes: &[u8]) -> (u64, u64) {
    let w = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    (w >> 40, (w >> 20) & 0xF_FFFF)
}

/// Checks that a hit of `len` bytes for key `k` holds a planned version,
/// byte for byte; returns that version.
fn check_hit(plan: &Plan, k: u64, len: u64, bytes: &[u8]) -> u64 {
    let (nk, v) = named(bytes);
    assert_eq!(nk, k, "a get of key {k} returned the bytes of key {nk}");
    let planned = plan.get(&(k, v)).copied();
    assert_eq!(planned, Some(len), "key {k}: version {v} with {len} bytes was never put");
    let mut want = vec![0u8; OBJ as usize];
    fill(&mut want, k, v);
    assert!(bytes[..len as usize] == want[..len as usize], "key {k} version {v}: other bytes");
    v
}

/// Puts (k, v) with `len` bytes from `src`; its status.
fn put(kv: &KvStore, src: &mut Buf<'_>, k: u64, v: u64, len: u64) -> ItemStatus {
    fill(&mut src.bytes, k, v);
    let value = Value { memory: src.mem(), offset: 0, len };
    kv.put_sync(&[Put { key: key(k), value }], T).unwrap().remove(0)
}

/// Gets `k` into `dst`.
fn get(kv: &KvStore, dst: &Buf<'_>, k: u64) -> ItemStatus {
    let into = Value { memory: dst.mem(), offset: 0, len: OBJ };
    kv.get_sync(&[Get { key: key(k), into }], T).unwrap().remove(0)
}

const THREADS: u64 = 8;
const PUTS: u64 = 50;
const SHARED: u64 = 8;
const PRIVATE: u64 = 10;

/// Thread `t`'s `i`th put: (key, version, length). Every third is of a
/// shared key (0..SHARED), the others of one of the thread's own keys.
fn step(t: u64, i: u64) -> (u64, u64, u64) {
    let k = if i.is_multiple_of(3) { (i / 3 + t) % SHARED } else { 1000 + t * PRIVATE + i % PRIVATE };
    let v = t * PUTS + i + 1;
    let len = 1 + (t * PUTS + i) * 7919 % OBJ;
    (k, v, len)
}

#[test]
fn group_commit_shares_rounds_and_every_hit_is_a_version_that_was_put() {
    let dir = tempfile::tempdir().unwrap();
    let plan: Plan = (0..THREADS)
        .flat_map(|t| (0..PUTS).map(move |i| step(t, i)))
        .map(|(k, v, len)| ((k, v), len))
        .collect();
    {
        let rt = file_runtime(dir.path(), 2, 8, "64KiB");
        let kv = open(&rt);
        assert!(kv.stats().capacity >= SHARED + THREADS * PRIVATE + THREADS, "no eviction in this test");
        let start = Barrier::new(THREADS as usize);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (kv, plan, start) = (&kv, &plan, &start);
                s.spawn(move || {
                    let mut src = Buf::new(kv, OBJ as usize);
                    let dst = Buf::new(kv, OBJ as usize);
                    let mut acked = HashSet::new();
                    start.wait();
                    for i in 0..PUTS {
                        let (k, v, len) = step(t, i);
                        assert_eq!(put(kv, &mut src, k, v, len), ItemStatus::Ok, "thread {t} put {i}");
                        acked.insert(k);
                        // Read back: an own key holds exactly this version.
                        match get(kv, &dst, k) {
                            ItemStatus::Hit { len } => {
                                let got = check_hit(plan, k, len, &dst.bytes);
                                assert!(
                                    k < SHARED || got == v,
                                    "thread {t}: own key {k} has version {got}, not {v}"
                                );
                            }
                            other => panic!("thread {t}: key {k} just put: {other:?}"),
                        }
                        // And a key others write.
                        let other = if i % 2 == 0 {
                            i % SHARED
                        } else {
                            1000 + ((t + 1) % THREADS) * PRIVATE + i % PRIVATE
                        };
                        match get(kv, &dst, other) {
                            ItemStatus::Hit { len } => {
                                check_hit(plan, other, len, &dst.bytes);
                            }
                            ItemStatus::Miss => {
                                assert!(
                                    !acked.contains(&other),
                                    "thread {t}: key {other} was put, yet misses"
                                )
                            }
                            st => panic!("thread {t}: key {other}: {st:?}"),
                        }
                    }
                });
            }
        });
        let s = kv.stats();
        assert_eq!((s.puts, s.evictions, s.checksum_mismatches), (THREADS * PUTS, 0, 0), "{s:?}");
        assert!(s.commit_rounds < THREADS * PUTS, "no round was shared: {s:?}");
        assert_eq!(s.objects, SHARED + THREADS * PRIVATE, "{s:?}");
    }
    let rt = file_runtime(dir.path(), 2, 8, "64KiB");
    let kv = open(&rt);
    let s = kv.stats();
    assert_eq!((s.recovered, s.invalid_records), (SHARED + THREADS * PRIVATE, 0), "{s:?}");
    let dst = Buf::new(&kv, OBJ as usize);
    for k in 0..SHARED {
        let ItemStatus::Hit { len } = get(&kv, &dst, k) else { panic!("shared key {k} lost") };
        check_hit(&plan, k, len, &dst.bytes);
    }
    for t in 0..THREADS {
        // The last version each private key got from its thread.
        let mut last = HashMap::new();
        for i in 0..PUTS {
            let (k, v, _) = step(t, i);
            if k >= SHARED {
                last.insert(k, v);
            }
        }
        for (k, v) in last {
            let ItemStatus::Hit { len } = get(&kv, &dst, k) else { panic!("key {k} lost") };
            assert_eq!(check_hit(&plan, k, len, &dst.bytes), v, "key {k}");
        }
    }
}

#[test]
fn eviction_under_concurrent_readers_never_returns_bytes_of_another_object() {
    const THREADS: u64 = 4;
    const OPS: u64 = 40;
    const KEYS: u64 = 24;
    let dir = tempfile::tempdir().unwrap();
    // Thread t's i-th put is (key, version t * OPS + i + 1).
    let op = |t: u64, i: u64| ((t * 7 + i * 5) % KEYS, t * OPS + i + 1, 1 + (t * OPS + i) * 104_729 % OBJ);
    let plan: Plan =
        (0..THREADS).flat_map(|t| (0..OPS).map(move |i| op(t, i))).map(|(k, v, len)| ((k, v), len)).collect();
    let acked: Mutex<HashSet<(u64, u64)>> = Mutex::default();
    let hits: Mutex<Vec<(u64, u64)>> = Mutex::default();
    {
        let rt = file_runtime_sized(dir.path(), 2, "512KiB", "64KiB");
        let kv = open(&rt);
        assert!(kv.stats().capacity < KEYS, "{:?}", kv.stats());
        let start = Barrier::new(THREADS as usize);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (kv, plan, start, acked, hits) = (&kv, &plan, &start, &acked, &hits);
                s.spawn(move || {
                    let mut src = Buf::new(kv, OBJ as usize);
                    let dst = Buf::new(kv, OBJ as usize);
                    start.wait();
                    for i in 0..OPS {
                        let (k, v, len) = op(t, i);
                        // At most 2 * (THREADS - 1) slots are pinned or
                        // reserved by the others: never full.
                        assert_eq!(put(kv, &mut src, k, v, len), ItemStatus::Ok, "thread {t}: key {k}");
                        acked.lock().unwrap().insert((k, v));
                        for r in [k, (k + 1 + i) % KEYS, (k + 3 * t) % KEYS] {
                            match get(kv, &dst, r) {
                                ItemStatus::Hit { len } => {
                                    let got = check_hit(plan, r, len, &dst.bytes);
                                    hits.lock().unwrap().push((r, got));
                                }
                                ItemStatus::Miss => {}
                                st => panic!("thread {t}: get of key {r}: {st:?}"),
                            }
                        }
                        if i % 7 == 3 {
                            let _ = kv.remove(&[key((k + 2) % KEYS)]);
                        }
                    }
                });
            }
        });
        let s = kv.stats();
        assert!(s.evictions > 0, "{s:?}");
        assert_eq!(s.checksum_mismatches, 0, "{s:?}");
        kv.sync().unwrap();
    }
    let acked = acked.into_inner().unwrap();
    for h in hits.into_inner().unwrap() {
        assert!(
            acked.contains(&h),
            "a get returned key {} version {}, whose put was not acknowledged",
            h.0,
            h.1
        );
    }
    let rt = file_runtime_sized(dir.path(), 2, "512KiB", "64KiB");
    let kv = open(&rt);
    let s = kv.stats();
    assert_eq!(s.invalid_records, 0, "{s:?}");
    let dst = Buf::new(&kv, OBJ as usize);
    let mut present = 0;
    for k in 0..KEYS {
        match get(&kv, &dst, k) {
            ItemStatus::Hit { len } => {
                let v = check_hit(&plan, k, len, &dst.bytes);
                assert!(acked.contains(&(k, v)), "key {k}: version {v} was not acknowledged");
                present += 1;
            }
            ItemStatus::Miss => {}
            st => panic!("after a restart, key {k}: {st:?}"),
        }
    }
    assert_eq!(s.recovered, present, "{s:?}");
}

#[test]
fn puts_racing_for_evicted_slots_never_fail_full() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let cap = kv.stats().capacity;
    assert!(cap > THREADS, "{cap}");
    let start = Barrier::new(THREADS as usize);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (kv, start) = (&kv, &start);
            s.spawn(move || {
                let mut src = Buf::new(kv, OBJ as usize);
                start.wait();
                for i in 0..PUTS {
                    let k = t * PUTS + i;
                    assert_eq!(put(kv, &mut src, k, 1, 4096), ItemStatus::Ok, "thread {t} put {i}");
                }
            });
        }
    });
    let s = kv.stats();
    // Distinct keys: every object put and not evicted is there.
    assert_eq!(s.puts, THREADS * PUTS, "{s:?}");
    assert!(s.objects <= cap && s.evictions == s.puts - s.objects, "{s:?}");
}
