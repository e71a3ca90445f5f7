//! The store's API on emulated drives: put, get, contains, keys,
//! lookup_prefix, remove, sync, eviction, persistence across a restart,
//! refusals.

mod common;

use common::*;
use tutti_kv::{ChunkKeys, Create, Get, ItemStatus, KeySize, KvError, KvStore, OpenOptions, Put, Value};

const OBJ: usize = 64 << 10;

#[test]
fn put_then_get_returns_the_bytes_and_every_call_answers_per_item() {
    let rt = ram_runtime(2, 16, "64KiB");
    let kv = open(&rt);
    let mut src = Buf::new(&kv, 4 * OBJ);
    for i in 0..4 {
        fill(&mut src.bytes[i * OBJ..(i + 1) * OBJ], i as u64, 1);
    }
    let puts: Vec<Put> = (0..4)
        .map(|i| Put {
            key: key(i),
            value: Value { memory: src.mem(), offset: i * OBJ as u64, len: OBJ as u64 },
        })
        .collect();
    let st = kv.put_sync(&puts, T).unwrap();
    assert!(st.iter().all(|s| *s == ItemStatus::Ok), "{st:?}");
    assert_eq!(kv.contains(&[key(0), key(9), key(3)]), vec![true, false, true]);
    assert_eq!(kv.lookup_prefix(&[key(0), key(1), key(7), key(2)]), 2);

    let dst = Buf::new(&kv, 4 * OBJ);
    let gets: Vec<Get> = [3u64, 0, 8]
        .iter()
        .enumerate()
        .map(|(j, &k)| Get {
            key: key(k),
            into: Value { memory: dst.mem(), offset: (j * OBJ) as u64, len: OBJ as u64 },
        })
        .collect();
    let st = kv.get_sync(&gets, T).unwrap();
    assert_eq!(
        st,
        vec![ItemStatus::Hit { len: OBJ as u64 }, ItemStatus::Hit { len: OBJ as u64 }, ItemStatus::Miss]
    );
    assert_eq!(dst.bytes[..OBJ], src.bytes[3 * OBJ..4 * OBJ]);
    assert_eq!(dst.bytes[OBJ..2 * OBJ], src.bytes[..OBJ]);

    assert_eq!(kv.remove(&[key(0), key(0)]), vec![ItemStatus::Ok, ItemStatus::Miss]);
    kv.sync().unwrap();
    assert_eq!(kv.contains(&[key(0)]), vec![false]);
    let s = kv.stats();
    assert_eq!((s.objects, s.puts, s.hits, s.misses), (3, 4, 2, 1));
}

#[test]
fn objects_survive_a_restart_and_overwrites_keep_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let uuid;
    {
        let rt = file_runtime(dir.path(), 2, 8, "64KiB");
        let kv = open(&rt);
        uuid = kv.uuid();
        let mut src = Buf::new(&kv, OBJ);
        for version in 1..=3 {
            fill(&mut src.bytes, 5, version);
            let v = Value { memory: src.mem(), offset: 0, len: 1000 + version };
            assert_eq!(kv.put_sync(&[Put { key: key(5), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
        }
        fill(&mut src.bytes, 6, 1);
        let v = Value { memory: src.mem(), offset: 0, len: OBJ as u64 };
        assert_eq!(kv.put_sync(&[Put { key: key(6), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
        kv.remove(&[key(6)]);
        kv.sync().unwrap();
    }
    let rt = file_runtime(dir.path(), 2, 8, "64KiB");
    let kv = open(&rt);
    assert_eq!(kv.uuid(), uuid, "opened, not re-formatted");
    assert_eq!(kv.stats().recovered, 1);
    assert_eq!(kv.contains(&[key(5), key(6)]), vec![true, false]);
    let dst = Buf::new(&kv, OBJ);
    let st =
        kv.get_sync(&[Get { key: key(5), into: Value { memory: dst.mem(), offset: 0, len: OBJ as u64 } }], T);
    assert_eq!(st.unwrap(), vec![ItemStatus::Hit { len: 1003 }]);
    let mut want = vec![0u8; OBJ];
    fill(&mut want, 5, 3);
    assert_eq!(dst.bytes[..1003], want[..1003]);
}

#[test]
fn a_full_store_evicts_the_least_recently_used() {
    let rt = ram_runtime(1, 4, "64KiB");
    let kv = open(&rt);
    let cap = kv.stats().capacity;
    assert!(cap > 10, "{cap}");
    let mut src = Buf::new(&kv, OBJ);
    let dst = Buf::new(&kv, OBJ);
    for i in 0..cap {
        fill(&mut src.bytes, i, 1);
        let v = Value { memory: src.mem(), offset: 0, len: OBJ as u64 };
        assert_eq!(kv.put_sync(&[Put { key: key(i), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
    }
    // Touch key 0 so that key 1 is the least recently used.
    let g = Get { key: key(0), into: Value { memory: dst.mem(), offset: 0, len: OBJ as u64 } };
    assert!(kv.get_sync(&[g], T).unwrap()[0].is_ok());
    let v = Value { memory: src.mem(), offset: 0, len: OBJ as u64 };
    assert_eq!(kv.put_sync(&[Put { key: key(1000), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
    assert_eq!(kv.contains(&[key(0), key(1), key(1000)]), vec![true, false, true]);
    assert!(kv.stats().evictions >= 1);
}

#[test]
fn bad_items_get_their_own_status_and_nothing_else_fails() {
    let rt = ram_runtime(1, 8, "64KiB");
    let kv = open(&rt);
    let src = Buf::new(&kv, 2 * OBJ);
    let ok = Value { memory: src.mem(), offset: 0, len: OBJ as u64 };
    let puts = [
        Put { key: key(1), value: ok },
        Put { key: key(2), value: Value { len: OBJ as u64 + 4096, ..ok } },
        Put { key: key(3), value: Value { offset: OBJ as u64 + 4096, ..ok } },
        Put { key: key16(4), value: ok },
        Put { key: key(5), value: Value { len: 0, ..ok } },
    ];
    let st = kv.put_sync(&puts, T).unwrap();
    assert_eq!(st[0], ItemStatus::Ok);
    assert!(matches!(st[1], ItemStatus::TooLarge { .. }), "{st:?}");
    assert!(matches!(st[2], ItemStatus::BadValue { .. }), "{st:?}");
    assert!(matches!(st[3], ItemStatus::BadValue { .. }), "{st:?}");
    assert!(matches!(st[4], ItemStatus::BadValue { .. }), "{st:?}");
    // A get into a region too small for the object.
    let small = Value { memory: src.mem(), offset: 0, len: 100 };
    let st = kv.get_sync(&[Get { key: key(1), into: small }], T).unwrap();
    assert!(matches!(st[0], ItemStatus::BadValue { .. }), "{st:?}");
    assert_eq!(kv.stats().objects, 1);
}

#[test]
fn a_store_of_another_key_size_or_not_ours_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    {
        let rt = file_runtime(dir.path(), 1, 4, "64KiB");
        let opts = OpenOptions { key_size: Some(KeySize::B16), ..OpenOptions::new("kv") };
        KvStore::open(rt, &opts).unwrap();
    }
    let rt = file_runtime(dir.path(), 1, 4, "64KiB");
    let opts = OpenOptions { key_size: Some(KeySize::B32), ..OpenOptions::new("kv") };
    assert!(matches!(KvStore::open(rt.clone(), &opts), Err(KvError::KeySize { found: 16, asked: 32, .. })));
    let never = OpenOptions { create: Create::Never, ..OpenOptions::new("kv") };
    assert_eq!(KvStore::open(rt.clone(), &never).unwrap().key_size(), KeySize::B16);
    // Another geometry (slots of 128 KiB): refused.
    drop(rt);
    let rt = file_runtime(dir.path(), 1, 4, "128KiB");
    let e = KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap_err();
    assert!(matches!(e, KvError::Superblock { .. }), "{e}");
    assert!(tutti::error_chain(&e).contains("object_size"), "{e}");
    // A blank store with Create::Never is refused too.
    let blank = ram_runtime(1, 4, "64KiB");
    assert!(matches!(KvStore::open(blank, &never), Err(KvError::Superblock { .. })));
}

#[test]
fn chained_keys_find_the_cached_prefix() {
    let rt = ram_runtime(1, 8, "64KiB");
    let kv = open(&rt);
    let ck = ChunkKeys::new(b"model-a", KeySize::B32);
    let conv: Vec<u32> = (0..64).collect();
    let keys = ck.chain(&conv, 16);
    let src = Buf::new(&kv, OBJ);
    let v = Value { memory: src.mem(), offset: 0, len: 4096 };
    let puts: Vec<Put> = keys[..3].iter().map(|&key| Put { key, value: v }).collect();
    assert!(kv.put_sync(&puts, T).unwrap().iter().all(|s| s.is_ok()));
    let mut next_turn = conv.clone();
    next_turn.extend(100..132);
    assert_eq!(kv.lookup_prefix(&ck.chain(&next_turn, 16)), 3);
}

/// Commands the emulated drives of `rt` have executed.
fn commands(rt: &tutti::Runtime) -> u64 {
    rt.drive_names().iter().map(|d| rt.emulator(d).unwrap().stats().commands).sum()
}

#[test]
fn a_commit_round_flushes_only_drives_with_a_volatile_write_cache() {
    for (cache, flushes) in [("", 0), ("\n      write_cache: { seed: 3 }", 2)] {
        let rt = runtime(&yaml(1, 4, "64KiB", &|_| format!("ram{cache}")));
        assert_eq!(rt.store_info("kv").unwrap().volatile_write_cache, !cache.is_empty());
        let kv = open(&rt);
        let src = Buf::new(&kv, OBJ);
        let before = commands(&rt);
        let v = Value { memory: src.mem(), offset: 0, len: 4096 };
        assert_eq!(kv.put_sync(&[Put { key: key(1), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
        // One payload write, one record-block write, and the round's Flushes.
        assert_eq!(commands(&rt) - before, 2 + flushes, "write cache {cache:?}");
    }
}

#[test]
fn keys_lists_the_live_objects_least_recently_used_first_and_evictions_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    {
        // One drive of 16 slots of 64 KiB: 15 objects.
        let rt = file_runtime_sized(dir.path(), 1, "1MiB", "64KiB");
        let kv = open(&rt);
        let cap = kv.stats().capacity;
        assert_eq!(cap, 15);
        assert_eq!(kv.keys(), vec![], "an empty store");
        let mut src = Buf::new(&kv, OBJ);
        let dst = Buf::new(&kv, OBJ);
        let mut put = |k: u64| {
            fill(&mut src.bytes, k, 1);
            let v = Value { memory: src.mem(), offset: 0, len: OBJ as u64 };
            assert_eq!(kv.put_sync(&[Put { key: key(k), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
        };
        for k in 0..cap {
            put(k);
        }
        assert_eq!(kv.keys(), (0..cap).map(key).collect::<Vec<_>>(), "in the order put");
        // A get makes key 0 the most recently used; a remove drops key 5.
        let g = Get { key: key(0), into: Value { memory: dst.mem(), offset: 0, len: OBJ as u64 } };
        assert!(kv.get_sync(&[g], T).unwrap()[0].is_ok());
        assert_eq!(kv.remove(&[key(5)]), vec![ItemStatus::Ok]);
        let mut want: Vec<u64> = (1..cap).filter(|&k| k != 5).chain([0]).collect();
        assert_eq!(kv.keys(), want.iter().map(|&k| key(k)).collect::<Vec<_>>());
        // The store is full again; two more puts evict the two least
        // recently used objects (one slot at a time: 15 / 64 rounds to 1).
        put(100);
        assert_eq!(kv.stats().evictions, 0, "the removed key's slot was reused first");
        put(101);
        put(102);
        assert_eq!(kv.stats().evictions, 2);
        want.retain(|&k| k != 1 && k != 2);
        want.extend([100, 101, 102]);
        assert_eq!(kv.keys(), want.iter().map(|&k| key(k)).collect::<Vec<_>>());
        assert_eq!(kv.stats().objects, kv.keys().len() as u64);
        kv.sync().unwrap();
    }
    // After a restart: the same keys, in the order of their last put (key
    // 0's get is forgotten).
    let rt = file_runtime_sized(dir.path(), 1, "1MiB", "64KiB");
    let kv = open(&rt);
    let want = [0].into_iter().chain((3..15).filter(|&k| k != 5)).chain([100, 101, 102]);
    assert_eq!(kv.keys(), want.map(key).collect::<Vec<_>>());
}
