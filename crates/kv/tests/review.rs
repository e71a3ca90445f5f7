//! A first-time user's review of tutti-kv: the documented claims checked
//! against the store (format offsets decoded by hand from a drive file,
//! eviction, pins), hostile or careless use, injected device failures,
//! power loss across two record blocks, and concurrency.
//!
//! Tests that fail show a problem (their names and comments say which);
//! tests that pass are claims that held up.

mod common;

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::*;
use nvme_emu::{FaultAction, FaultMatch, FaultRule};
use tutti::{NvmeStatus, Runtime};
use tutti_kv::format::Layout;
use tutti_kv::{Get, ItemStatus, KeySize, KvError, KvStore, OpenOptions, Put, Value};

const WRITE: u8 = 0x01;
const READ: u8 = 0x02;
const FLUSH: u8 = 0x00;

/// Payload of (key, version): word `i` is `key << 40 | version << 20 | i`,
/// so every 8 bytes name the key and the version they belong to.
fn named_fill(buf: &mut [u8], k: u64, v: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&((k << 40) | (v << 20) | (i as u64 & 0xF_FFFF)).to_le_bytes());
    }
}

/// The (key, version) of the first `len` bytes of `bytes`, checking that
/// every whole word agrees (bytes of two objects or versions fail here).
fn named(bytes: &[u8], len: u64) -> (u64, u64) {
    let words = (len / 8) as usize;
    assert!(words > 0);
    let w0 = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let (k, v) = (w0 >> 40, (w0 >> 20) & 0xF_FFFF);
    for i in 0..words {
        let w = u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(
            w,
            (k << 40) | (v << 20) | (i as u64 & 0xF_FFFF),
            "word {i} of an object that starts as key {k} version {v} names key {} version {}",
            w >> 40,
            (w >> 20) & 0xF_FFFF
        );
    }
    (k, v)
}

fn fail_status() -> NvmeStatus {
    NvmeStatus::new(2, 0x81).with_dnr(true)
}

/// A rule for I/O commands of `opcode` overlapping `lba` (any LBA when
/// `None`).
fn rule(opcode: u8, lba: Option<Range<u64>>, action: FaultAction, times: Option<u64>) -> FaultRule {
    FaultRule {
        matches: FaultMatch { opcode: Some(opcode), lba, io_only: true, ..FaultMatch::default() },
        action,
        times,
        skip: 0,
    }
}

/// The LBAs of the record table of a one-drive store.
fn record_lbas(l: &Layout) -> Range<u64> {
    let bs = u64::from(l.block_size);
    l.record_offset / bs..(l.record_offset + l.record_table_bytes()) / bs
}

/// The LBAs of the object slots of a one-drive store.
fn data_lbas(l: &Layout) -> Range<u64> {
    let bs = u64::from(l.block_size);
    l.data_offset / bs..l.store_bytes / bs
}

fn put1(kv: &KvStore, src: &mut Buf<'_>, k: u64, v: u64, len: u64) -> ItemStatus {
    named_fill(&mut src.bytes, k, v);
    let value = Value { memory: src.mem(), offset: 0, len };
    kv.put_sync(&[Put { key: key(k), value }], T).unwrap().remove(0)
}

/// Gets `k` into `dst`; `Some(version)` on a hit (its bytes checked).
fn get1(kv: &KvStore, dst: &mut Buf<'_>, k: u64) -> Result<Option<u64>, ItemStatus> {
    dst.bytes.fill(0);
    let into = Value { memory: dst.mem(), offset: 0, len: dst.bytes.len() as u64 };
    match kv.get_sync(&[Get { key: key(k), into }], T).unwrap().remove(0) {
        ItemStatus::Hit { len } => {
            let (nk, v) = named(&dst.bytes, len);
            assert_eq!(nk, k, "a get of key {k} returned bytes of key {nk}");
            Ok(Some(v))
        }
        ItemStatus::Miss => Ok(None),
        other => Err(other),
    }
}

// ---------------------------------------------------------------------------
// Docs against behaviour
// ---------------------------------------------------------------------------

/// docs/kv-store.md, "On-media format": the superblock, a record and a
/// payload decoded by hand from the drive file at the documented offsets.
/// Holds.
#[test]
fn the_on_media_format_is_at_the_documented_byte_offsets() {
    const OBJ: usize = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let (uuid, layout);
    let src_bytes;
    {
        let rt = file_runtime(dir.path(), 1, 4, "64KiB");
        let opts = OpenOptions { key_size: Some(KeySize::B16), ..OpenOptions::new("kv") };
        let kv = KvStore::open(rt, &opts).unwrap();
        uuid = kv.uuid();
        layout = kv.layout();
        let mut src = Buf::new(&kv, OBJ);
        for (i, b) in src.bytes.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let value = Value { memory: src.mem(), offset: 0, len: 1000 };
        assert_eq!(kv.put_sync(&[Put { key: key16(7), value }], T).unwrap(), vec![ItemStatus::Ok]);
        // A second version of the same key: a newer generation, in slot 1;
        // after a sync slot 0's record is zero again.
        src.bytes[..5].copy_from_slice(b"hello");
        src_bytes = src.bytes.clone();
        let value = Value { memory: src.mem(), offset: 0, len: 5000 };
        assert_eq!(kv.put_sync(&[Put { key: key16(7), value }], T).unwrap(), vec![ItemStatus::Ok]);
        kv.sync().unwrap();
    }
    let f = std::fs::File::open(drive_file(dir.path(), 0)).unwrap();
    let read = |off: u64, n: usize| {
        let mut b = vec![0u8; n];
        f.read_exact_at(&mut b, off).unwrap();
        b
    };
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let bs = layout.block_size as usize;
    assert_eq!(bs, 4096);
    let sb = read(0, bs);
    assert_eq!(&sb[0..8], b"TUTTIKV\0");
    assert_eq!(u32_at(&sb, 8), 2, "format version");
    assert_eq!(u32_at(&sb, 12), 16, "key size");
    assert_eq!(&sb[16..32], &uuid);
    assert_eq!(u32_at(&sb, 32), 4096, "block size");
    assert_eq!(u32_at(&sb, 36), 64, "record size");
    assert_eq!(u64_at(&sb, 40), 64 << 10, "object size");
    assert_eq!(u64_at(&sb, 48), 4 << 20, "store size");
    let slots = (4u64 << 20) / (64 << 10);
    let capacity = u64_at(&sb, 56);
    assert_eq!(u64_at(&sb, 64), 8192, "record table offset = 2 * bs (after the lease block)");
    assert_eq!(&read(4096, 8)[..], b"TUTTILSE", "the lease block is block 1");
    let data_offset = u64_at(&sb, 72);
    assert_eq!(data_offset % (64 << 10), 0);
    let m = data_offset / (64 << 10);
    assert!(m >= 1);
    assert_eq!(capacity, slots - m);
    // M is the smallest that holds the superblock, the lease and the records.
    assert!(m * (64 << 10) >= 8192 + capacity * 64);
    assert!((m - 1) * (64 << 10) < 8192 + (capacity + 1) * 64);
    assert_eq!(u32_at(&sb, 80), crc32c::crc32c(&sb[..80]));
    assert!(sb[84..].iter().all(|&b| b == 0));

    // Slot 0: the first version, superseded and cleared by the sync.
    let rec0 = read(8192, 64);
    assert!(rec0.iter().all(|&b| b == 0), "slot 0's record was cleared: {rec0:?}");
    // Slot 1: the second version.
    let rec = read(8192 + 64, 64);
    assert_eq!(&rec[0..4], b"TKVR");
    assert_eq!(u32_at(&rec, 4), crc32c::crc32c(&src_bytes[..5000]), "payload CRC");
    assert!(u64_at(&rec, 8) >= 2, "generation of the second put");
    assert_eq!(u64_at(&rec, 16), 5000, "length");
    assert_eq!(&rec[24..40], key16(7).as_bytes());
    assert!(rec[40..56].iter().all(|&b| b == 0), "a 16-byte key is followed by 16 zero bytes");
    assert_eq!(u32_at(&rec, 56), 1, "slot index");
    let mut c = uuid.to_vec();
    c.extend_from_slice(&rec[..60]);
    assert_eq!(u32_at(&rec, 60), crc32c::crc32c(&c), "record CRC over UUID || bytes 0..60");
    // The payload at data_offset + 1 * S, padding written up to the block.
    let payload = read(data_offset + (64 << 10), 8192);
    assert_eq!(&payload[..5000], &src_bytes[..5000]);
    assert_eq!(&payload[5000..8192], &src_bytes[5000..8192], "the padding after length is written");
}

/// docs/kv-store.md said: "With 1 MiB slots and 4 KiB blocks one metadata
/// slot holds 16,320 records, so a 16 GiB store of 1 MiB objects loses one
/// slot to metadata." A 16 GiB store has 16,384 slots; 16,383 records do
/// not fit in one slot, so it loses two. Fixed in the docs, which this
/// checks; since format version 2 (the lease block) one slot holds 16,256
/// records: up to 16,257 slots lose one, 16 GiB loses two.
#[test]
fn doc_metadata_slots_of_1_mib_objects() {
    assert_eq!(((1u64 << 20) - 2 * 4096) / 64, 16_256);
    let l = Layout::new(4096, 1 << 20, 16_257 << 20).unwrap();
    assert_eq!(l.capacity, 16_256, "{l:?}");
    let l = Layout::new(4096, 1 << 20, 16_258 << 20).unwrap();
    assert_eq!(l.capacity, 16_256, "{l:?}");
    let l = Layout::new(4096, 1 << 20, 16 << 30).unwrap();
    assert_eq!(l.capacity, 16_382, "{l:?}");
}

/// "it evicts at least 1/64 of the capacity at a time", least recently
/// used first, and a get makes an object recently used. Holds.
#[test]
fn eviction_takes_one_sixty_fourth_of_the_capacity_least_recently_used_first() {
    let rt = runtime(&yaml_sized(1, "528KiB", "4KiB", &|_| "ram".to_owned()));
    let kv = open(&rt);
    let cap = kv.stats().capacity;
    assert_eq!(cap, 128);
    let mut src = Buf::new(&kv, 4096);
    let mut dst = Buf::new(&kv, 4096);
    for k in 0..cap {
        assert_eq!(put1(&kv, &mut src, k, 1, 4096), ItemStatus::Ok);
    }
    assert_eq!(get1(&kv, &mut dst, 0), Ok(Some(1)));
    assert_eq!(put1(&kv, &mut src, 1000, 1, 4096), ItemStatus::Ok);
    let s = kv.stats();
    assert_eq!(s.evictions, cap / 64, "{s:?}");
    assert_eq!(s.objects, cap - cap / 64 + 1);
    let present = kv.contains(&(0..cap).map(key).collect::<Vec<_>>());
    assert!(present[0], "key 0 was read: most recently used");
    assert_eq!(present.iter().filter(|p| !**p).count(), 2);
    assert!(!present[1] && !present[2], "keys 1 and 2 were the least recently used");
}

/// "a get pins its object's slot from get to wait_get": a pending get's
/// object is neither evicted nor reused while the store churns, even after
/// it is removed and synced. Holds.
#[test]
fn a_pending_get_pins_its_object_through_evictions_and_a_remove() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let cap = kv.stats().capacity;
    let mut src = Buf::new(&kv, 64 << 10);
    let dst = Buf::new(&kv, 64 << 10);
    for k in 0..cap {
        assert_eq!(put1(&kv, &mut src, k, 1, 64 << 10), ItemStatus::Ok);
    }
    let into = Value { memory: dst.mem(), offset: 0, len: 64 << 10 };
    let p = kv.get(&[Get { key: key(0), into }]).unwrap();
    assert_eq!(kv.remove(&[key(0)]), vec![ItemStatus::Ok]);
    kv.sync().unwrap();
    for k in 100..100 + 2 * cap {
        assert_eq!(put1(&kv, &mut src, k, 2, 64 << 10), ItemStatus::Ok, "key {k}");
    }
    assert_eq!(kv.wait_get(p, T).unwrap(), vec![ItemStatus::Hit { len: 64 << 10 }]);
    assert_eq!(named(&dst.bytes, 64 << 10), (0, 1));
}

// ---------------------------------------------------------------------------
// Lost or wrong data
// ---------------------------------------------------------------------------

/// FAILED before the fix on this branch (index.rs: a pinned slot is freed
/// at its unpin only from the new `Cleared` state): a slot pinned by a
/// get, removed, whose clearing round fails, is
/// put on the free list when the get is waited on (`Index::unpin` frees a
/// stale slot whose `media` is `None`, which `begin_round` set before the
/// failed write). It is still in `to_clear`: the next put reuses it, and
/// that put's own round zeroes the record it has just written. The put is
/// acknowledged `Ok`, `contains` says yes, a get misses, and after a
/// restart the object is gone.
#[test]
fn a_pinned_slot_whose_clear_failed_is_reused_and_the_put_reusing_it_is_lost() {
    const OBJ: u64 = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    {
        let rt = file_runtime(dir.path(), 1, 4, "64KiB");
        let kv = open(&rt);
        let mut src = Buf::new(&kv, OBJ as usize);
        let mut dst = Buf::new(&kv, OBJ as usize);
        let pin_dst = Buf::new(&kv, OBJ as usize);
        assert_eq!(put1(&kv, &mut src, 1, 1, OBJ), ItemStatus::Ok);
        let into = Value { memory: pin_dst.mem(), offset: 0, len: OBJ };
        let pending = kv.get(&[Get { key: key(1), into }]).unwrap();
        assert_eq!(kv.remove(&[key(1)]), vec![ItemStatus::Ok]);
        let emu = rt.emulator("d0").unwrap();
        emu.add_fault(rule(WRITE, Some(record_lbas(&kv.layout())), FaultAction::Fail(fail_status()), None));
        assert!(kv.sync().is_err(), "the record write fails");
        emu.clear_faults();
        assert_eq!(kv.wait_get(pending, T).unwrap(), vec![ItemStatus::Hit { len: OBJ }]);
        assert_eq!(put1(&kv, &mut src, 2, 1, OBJ), ItemStatus::Ok);
        assert_eq!(kv.contains(&[key(2)]), vec![true]);
        assert_eq!(get1(&kv, &mut dst, 2), Ok(Some(1)), "key 2 was acknowledged");
    }
    let rt = file_runtime(dir.path(), 1, 4, "64KiB");
    let kv = open(&rt);
    let mut dst = Buf::new(&kv, OBJ as usize);
    assert_eq!(get1(&kv, &mut dst, 2), Ok(Some(1)), "key 2 was acknowledged before the restart");
    assert_eq!(get1(&kv, &mut dst, 1), Ok(None), "key 1 was removed and synced");
}

/// YAML for one 64 KiB drive of 512-byte blocks over RAM disk `disk`, with
/// a write cache seeded `seed`, 4 KiB slots (15 objects, 8 records per
/// record block), one queue (commands run in submission order).
fn small_block_yaml(disk: &str, seed: u64) -> String {
    format!(
        "drives:\n  d0:\n    emulated:\n      namespaces: [{{ capacity: 64KiB, block_size: 512 }}]\n      \
         backing: {{ ram_disk: {disk} }}\n      write_cache: {{ seed: {seed} }}\n\
         resolvers:\n  kv:\n    slab: {{ slot_size: 4KiB }}\n\
         datapaths:\n  dp:\n    local_nvme: {{ drive: d0, queues: 1 }}\n\
         stores:\n  kv: {{ resolver: kv, datapath: dp }}\n"
    )
}

/// Found in review, fixed: an acknowledged overwrite is undone by a power failure. Key K is
/// put (v1, slot 8, record block 1), then put again (v2, slot 3, record
/// block 0): v1's record is stale, waiting for the next round. Other keys
/// are read, so K is the least recently used; a put of a new key evicts K,
/// and its round clears both of K's records at once: block 0 (v2's) and
/// block 1 (v1's). The power fails during that round; the drive keeps
/// block 0's new contents and loses block 1's. After the restart K reads
/// back v1, a version older than one acknowledged: the docs' "power loss
/// after `wait_put` returned Ok: the object is there (that version or a
/// later one)" (absent would be fine: K was evicted). The user never
/// removed K. (The same with `remove(K)` then a `sync` the power cuts.)
/// The crash harness (crash.rs) never sees it: its stores have one record
/// block. A fix: do not clear a key's newest record in the round that
/// clears an older record of the same key (clear the older first).
#[test]
fn power_loss_while_evicting_an_overwritten_key_brings_back_its_older_version() {
    let mut older = Vec::new();
    for seed in 1..=16u64 {
        let disk = format!("review-resurrect-{seed}");
        let y = small_block_yaml(&disk, seed);
        {
            let rt = runtime(&y);
            let kv = open(&rt);
            let l = kv.layout();
            assert_eq!((l.capacity, l.records_per_block(), l.record_offset), (15, 8, 1024));
            let mut src = Buf::new(&kv, 4096);
            let mut dst = Buf::new(&kv, 4096);
            // Slot i holds key 100 + i, slot 8 key 1 (K) version 1.
            for s in 0..15 {
                let k = if s == 8 { 1 } else { 100 + s };
                assert_eq!(put1(&kv, &mut src, k, 1, 4096), ItemStatus::Ok);
            }
            assert_eq!(kv.remove(&[key(103)]), vec![ItemStatus::Ok]);
            kv.sync().unwrap();
            // K version 2 takes the slot just freed, 3 (record block 0).
            assert_eq!(put1(&kv, &mut src, 1, 2, 4096), ItemStatus::Ok);
            for s in (0..15).filter(|&s| s != 3 && s != 8) {
                assert_eq!(get1(&kv, &mut dst, 100 + s), Ok(Some(1)));
            }
            // The power fails on the write of record block 1 (LBA 3: the
            // superblock is LBA 0, the lease LBA 1, record block 0 LBA 2).
            rt.emulator("d0").unwrap().add_fault(rule(WRITE, Some(3..4), FaultAction::PowerFail, Some(1)));
            let st = put1(&kv, &mut src, 200, 1, 4096);
            assert_ne!(st, ItemStatus::Ok, "the power failed");
        }
        {
            let rt = runtime(&small_block_yaml(&disk, seed));
            let kv = open(&rt);
            let mut dst = Buf::new(&kv, 4096);
            match get1(&kv, &mut dst, 1) {
                Ok(Some(1)) => older.push(seed),
                Ok(Some(2) | None) => {}
                other => panic!("seed {seed}: key 1: {other:?}"),
            }
        }
        nvme_emu::remove_ram_disk(&disk).unwrap();
    }
    assert!(older.is_empty(), "seeds {older:?}: key 1 read back version 1 after version 2 was acknowledged");
}

/// Found in review, fixed: two `KvStore::open` of one store on one runtime
/// both succeeded and kept separate indexes: each reused slots the other
/// filled, and an acknowledged put was lost. The second open is refused
/// now (`KvError::AlreadyOpen`), and the store opens again once the first
/// is dropped, with everything acknowledged.
#[test]
fn a_store_opened_twice_on_one_runtime_is_refused() {
    let rt = ram_runtime(1, 4, "64KiB");
    let a = open(&rt);
    let e = KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap_err();
    assert!(matches!(e, KvError::AlreadyOpen(ref s) if s == "kv"), "{e}");
    let mut sa = Buf::new(&a, 4096);
    for k in 1..=3 {
        assert_eq!(put1(&a, &mut sa, k, 1, 4096), ItemStatus::Ok);
    }
    drop(sa);
    drop(a);
    let kv = open(&rt);
    let mut dst = Buf::new(&kv, 4096);
    let got: Vec<_> = [1, 2, 3].iter().map(|&k| get1(&kv, &mut dst, k)).collect();
    assert_eq!(got, vec![Ok(Some(1)); 3], "keys 1, 2, 3 were all acknowledged");
}

// ---------------------------------------------------------------------------
// Careless use: leaks and timeouts
// ---------------------------------------------------------------------------

/// Found in review, fixed: a `PendingPuts` dropped without `wait_put` keeps its slots
/// reserved until the store is reopened (no `Drop`; not documented: the
/// `must_use` text only says the put is not durable). After `capacity`
/// dropped puts the store holds no object and refuses every put `Full`;
/// `stats()` shows nothing wrong. Waiting a batch on the wrong store
/// (`KvError::ForeignMemory`, "memory registered with another store",
/// a misleading name for it) drops it the same way.
#[test]
fn dropped_pending_puts_leak_their_slots_until_reopen() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let other_rt = ram_runtime(1, 1, "64KiB");
    let other = open(&other_rt);
    let cap = kv.stats().capacity;
    let mut src = Buf::new(&kv, 4096);
    named_fill(&mut src.bytes, 0, 1);
    let value = Value { memory: src.mem(), offset: 0, len: 4096 };
    for k in 0..cap - 1 {
        drop(kv.put(&[Put { key: key(k), value }]).unwrap());
    }
    let p = kv.put(&[Put { key: key(cap), value }]).unwrap();
    assert!(matches!(other.wait_put(p, T), Err(KvError::ForeignBatch)));
    std::thread::sleep(Duration::from_millis(50));
    let s = kv.stats();
    assert_eq!(s.objects, 0, "{s:?}");
    let st = kv.put_sync(&[Put { key: key(1000), value }], T).unwrap();
    assert_eq!(st, vec![ItemStatus::Ok], "an empty store refuses a put: {:?}", kv.stats());
}

/// Found in review, fixed: a `PendingGets` dropped without `wait_get` pins its objects for
/// as long as the store is open; removing them and syncing does not free
/// their slots. With every object pinned that way the store is `Full`
/// forever. (The `must_use` text says the slots stay pinned until waited
/// on; it does not say that dropping it pins them for good, and there is
/// no way to release them.)
#[test]
fn dropped_pending_gets_pin_their_objects_until_reopen() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let cap = kv.stats().capacity;
    let mut src = Buf::new(&kv, 4096);
    let dst = Buf::new(&kv, 4096);
    for k in 0..cap {
        assert_eq!(put1(&kv, &mut src, k, 1, 4096), ItemStatus::Ok);
    }
    let into = Value { memory: dst.mem(), offset: 0, len: 4096 };
    for k in 0..cap {
        drop(kv.get(&[Get { key: key(k), into }]).unwrap());
    }
    let keys: Vec<_> = (0..cap).map(key).collect();
    assert!(kv.remove(&keys).iter().all(|s| *s == ItemStatus::Ok));
    kv.sync().unwrap();
    assert_eq!(kv.stats().objects, 0);
    assert_eq!(put1(&kv, &mut src, 1000, 1, 4096), ItemStatus::Ok, "an empty store refuses a put");
}

/// Polling a put (`try_wait_put`, the zero-timeout use of the runtime's
/// API) gives back the pending batch until its writes are final and loses
/// no slot: every slot of the store can be filled that way. A `wait_put`
/// whose timeout passes is final instead (documented on `wait_put`): its
/// slot is set aside until the store is reopened.
#[test]
fn polling_puts_loses_no_slot_and_a_timed_out_wait_is_final() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let cap = kv.stats().capacity;
    let emu = rt.emulator("d0").unwrap();
    // Payload writes complete 20 ms late (the data is written at once).
    emu.add_fault(rule(
        WRITE,
        Some(data_lbas(&kv.layout())),
        FaultAction::Delay(Duration::from_millis(20)),
        None,
    ));
    let mut src = Buf::new(&kv, 4096);
    named_fill(&mut src.bytes, 0, 1);
    let value = Value { memory: src.mem(), offset: 0, len: 4096 };
    let mut polls = 0;
    for k in 0..cap {
        let mut p = kv.put(&[Put { key: key(k), value }]).unwrap();
        let st = loop {
            match kv.try_wait_put(p).unwrap() {
                Ok(st) => break st,
                Err(again) => {
                    polls += 1;
                    p = again;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        assert_eq!(st, vec![ItemStatus::Ok], "key {k}");
    }
    assert!(polls > 0, "the delayed writes were polled at least once");
    assert_eq!(kv.stats().objects, cap);
    let p = kv.put(&[Put { key: key(1000), value }]).unwrap();
    assert_eq!(kv.wait_put(p, Duration::ZERO).unwrap(), vec![ItemStatus::Timeout]);
    emu.clear_faults();
}

/// Known limitation (slow, ignored: 30 s): `wait_put(p, 500 ms)` does not return by
/// its deadline when a record write of the commit round never completes:
/// the round waits `META_TIMEOUT` (30 s) whatever the caller asked, and
/// `sync` (no timeout parameter) does too.
#[test]
#[ignore = "takes 30 s (the store's META_TIMEOUT); run with --ignored"]
fn wait_put_returns_by_its_deadline_when_a_record_write_never_completes() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let emu = rt.emulator("d0").unwrap();
    emu.add_fault(rule(WRITE, Some(record_lbas(&kv.layout())), FaultAction::NeverComplete, Some(1)));
    let mut src = Buf::new(&kv, 4096);
    let t0 = Instant::now();
    named_fill(&mut src.bytes, 1, 1);
    let value = Value { memory: src.mem(), offset: 0, len: 4096 };
    let st = kv.put_sync(&[Put { key: key(1), value }], Duration::from_millis(500)).unwrap();
    let took = t0.elapsed();
    assert_ne!(st[0], ItemStatus::Ok);
    assert!(took < Duration::from_secs(3), "wait_put(500 ms) took {took:?}: {st:?}");
}

/// Found in review, fixed: memory could be unregistered (and so, by
/// `register_host`'s contract, freed or reused) while `wait_get` still read
/// it to checksum the payload: the runtime lets go of the memory when its
/// `wait` returns, before the store computes the CRC32C. `KvMemory` is
/// `Copy`, so another thread can hold the handle. Here that thread reuses
/// the buffer (overwrites it) the moment `unregister` succeeds: were the
/// store still checksumming, the get would not be a `Hit`. Tried 50 times
/// (a race: the other thread must run while the store checksums).
#[test]
fn memory_cannot_be_unregistered_while_wait_get_still_reads_it() {
    const OBJ: u64 = 4 << 20;
    let rt = ram_runtime(1, 16, "4MiB");
    let kv = open(&rt);
    let mut src = Buf::new(&kv, OBJ as usize);
    assert_eq!(put1(&kv, &mut src, 1, 1, OBJ), ItemStatus::Ok);
    let mut dst = vec![0u8; OBJ as usize];
    let (ptr, len) = (dst.as_mut_ptr() as usize, dst.len());
    for round in 0..50 {
        // SAFETY: `dst` outlives the registration (it is freed at the end
        // of the test, after every use) and is not touched while I/O runs.
        #[allow(unsafe_code)]
        let mem = unsafe { kv.register_host(ptr as *mut u8, len).unwrap() };
        let copy = mem;
        let go = AtomicBool::new(false);
        let st = std::thread::scope(|s| {
            s.spawn(|| {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs(5) {
                    if kv.unregister(copy).is_ok() {
                        // SAFETY: unregistered: neither a drive nor the store
                        // may use the buffer any more, so its owner may.
                        #[allow(unsafe_code)]
                        unsafe {
                            std::ptr::write_bytes(ptr as *mut u8, 0xA5, len)
                        };
                        return;
                    }
                }
                panic!("not unregistered within 5 s");
            });
            let into = Value { memory: &mem, offset: 0, len: OBJ };
            let p = kv.get(&[Get { key: key(1), into }]).unwrap();
            go.store(true, Ordering::Release);
            kv.wait_get(p, T).unwrap()
        });
        assert_eq!(
            st,
            vec![ItemStatus::Hit { len: OBJ }],
            "round {round}: the buffer was reused while checksummed"
        );
    }
    drop(dst);
}

/// Found in review, fixed: `Get::into`'s docs say `len` is the room, at least the object's
/// length rounded up to whole blocks, but a get whose room is the exact
/// (unrounded) length is accepted and writes up to the next block boundary,
/// past the room it was given (`Value::len`'s docs do say a get overwrites
/// the padding; one of the two docs is wrong, or the check is).
#[test]
fn a_get_writes_nothing_past_the_room_it_was_given() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let mut src = Buf::new(&kv, 4096);
    assert_eq!(put1(&kv, &mut src, 1, 1, 1000), ItemStatus::Ok);
    let mut dst = Buf::new(&kv, 8192);
    dst.bytes.fill(0xEE);
    let into = Value { memory: dst.mem(), offset: 0, len: 1000 };
    let st = kv.get_sync(&[Get { key: key(1), into }], T).unwrap().remove(0);
    match st {
        ItemStatus::BadValue { .. } => {}
        ItemStatus::Hit { len: 1000 } => {
            let past = dst.bytes[1000..].iter().filter(|&&b| b != 0xEE).count();
            assert_eq!(past, 0, "{past} bytes past the 1000-byte room were overwritten");
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Hostile values and batches
// ---------------------------------------------------------------------------

/// Values outside, overlapping the end of, or misaligned in their
/// registration, zero lengths, keys of the other size, memory of another
/// store, 65,537 items: each its own status or `BatchTooLarge`, nothing
/// else in the batch fails, no panic. Holds, except for the misaligned
/// offset (see the assertion).
#[test]
fn hostile_values_get_their_own_status_and_nothing_else_fails() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let other_rt = ram_runtime(1, 1, "64KiB");
    let other = open(&other_rt);
    let mut src = Buf::new(&kv, 16384);
    named_fill(&mut src.bytes, 9, 1);
    let foreign = Buf::new(&other, 4096);
    let m = src.mem();
    let v = |offset: u64, len: u64| Value { memory: m, offset, len };
    let good = Put { key: key(9), value: v(0, 4096) };
    let bad = |st: &ItemStatus| matches!(st, ItemStatus::BadValue { .. });
    let cases: Vec<(&str, Put<'_>)> = vec![
        ("past the end", Put { key: key(1), value: v(16384, 1) }),
        ("padding past the end", Put { key: key(2), value: v(12288 + 8, 4088) }),
        ("offset u64::MAX", Put { key: key(3), value: v(u64::MAX, 8) }),
        ("zero length", Put { key: key(4), value: v(0, 0) }),
        ("16-byte key", Put { key: key16(5), value: v(0, 8) }),
        ("foreign memory", Put { key: key(6), value: Value { memory: foreign.mem(), offset: 0, len: 8 } }),
    ];
    for (what, p) in &cases {
        let st = kv.put_sync(&[good, *p, good], T).unwrap();
        assert_eq!(st[0], ItemStatus::Ok, "{what}");
        assert_eq!(st[2], ItemStatus::Ok, "{what}");
        assert!(bad(&st[1]), "{what}: {:?}", st[1]);
    }
    let st = kv.put_sync(&[Put { key: key(7), value: v(0, u64::MAX) }], T).unwrap();
    assert!(matches!(st[0], ItemStatus::TooLarge { .. }), "{st:?}");
    // Gets: the same refusals, and a miss for an absent key is a miss.
    let g = |key, into| Get { key, into };
    let st = kv
        .get_sync(
            &[
                g(key(9), v(16384 - 4096 + 8, 4096)),
                g(key16(9), v(0, 4096)),
                g(key(9), Value { memory: foreign.mem(), offset: 0, len: 4096 }),
                g(key(9), v(0, 0)),
                g(key(9), v(0, 4096)),
            ],
            T,
        )
        .unwrap();
    assert!(st[..4].iter().all(bad), "{st:?}");
    assert_eq!(st[4], ItemStatus::Hit { len: 4096 });
    assert_eq!(kv.remove(&[key16(9)]), vec![ItemStatus::Miss]);
    assert_eq!(kv.contains(&[key16(9)]), vec![false]);
    // 65,537 items are refused whole.
    let many = vec![good; (1 << 16) + 1];
    assert!(matches!(kv.put(&many), Err(KvError::BatchTooLarge { .. })));
    let gets = vec![g(key(9), v(0, 4096)); (1 << 16) + 1];
    assert!(matches!(kv.get(&gets), Err(KvError::BatchTooLarge { .. })));
    // Value::offset is documented "4-byte aligned": a misaligned one is
    // this item's BadValue, not a device error or a panic.
    let st = kv.put_sync(&[good, Put { key: key(8), value: v(2, 4096) }], T).unwrap();
    assert_eq!(st[0], ItemStatus::Ok);
    assert!(bad(&st[1]), "misaligned offset: {:?}", st[1]);
}

/// 65,536 items in one batch (the documented maximum), far more than the
/// store holds: puts past the capacity are `Full`, the rest `Ok`; 65,536
/// gets answer each. Holds.
#[test]
fn a_batch_of_65536_items_answers_each() {
    let rt = ram_runtime(1, 4, "4KiB");
    let kv = open(&rt);
    let cap = kv.stats().capacity as usize;
    let mut src = Buf::new(&kv, 4096);
    named_fill(&mut src.bytes, 0, 1);
    let value = Value { memory: src.mem(), offset: 0, len: 4096 };
    let puts: Vec<Put<'_>> = (0..1u64 << 16).map(|k| Put { key: key(k), value }).collect();
    let st = kv.put_sync(&puts, T).unwrap();
    assert_eq!(st.len(), 1 << 16);
    let ok = st.iter().filter(|s| **s == ItemStatus::Ok).count();
    let full = st.iter().filter(|s| **s == ItemStatus::Full).count();
    assert_eq!((ok, full), (cap, (1 << 16) - cap));
    let dst = Buf::new(&kv, 4096);
    let into = Value { memory: dst.mem(), offset: 0, len: 4096 };
    let gets: Vec<Get<'_>> = (0..1u64 << 16).map(|k| Get { key: key(k), into }).collect();
    // Only one destination: gets of the same range race, so only count.
    let st = kv.get_sync(&gets, T).unwrap();
    let hits = st.iter().filter(|s| matches!(s, ItemStatus::Hit { .. })).count();
    let miss = st.iter().filter(|s| **s == ItemStatus::Miss).count();
    assert_eq!(hits + miss, 1 << 16);
    assert_eq!(hits, cap);
}

/// The same key many times in one batch: the last item that got a slot
/// wins, now and after a restart; the batch's other versions leave no
/// record behind. Holds.
#[test]
fn the_same_key_many_times_in_one_batch_keeps_the_last() {
    let dir = tempfile::tempdir().unwrap();
    {
        let rt = file_runtime(dir.path(), 1, 4, "64KiB");
        let kv = open(&rt);
        let mut src = Buf::new(&kv, 40 * 4096);
        for v in 0..40u64 {
            named_fill(&mut src.bytes[(v * 4096) as usize..((v + 1) * 4096) as usize], 1, v + 1);
        }
        let m = src.mem();
        let puts: Vec<Put<'_>> = (0..40u64)
            .map(|v| Put { key: key(1), value: Value { memory: m, offset: v * 4096, len: 4096 } })
            .collect();
        assert!(kv.put_sync(&puts, T).unwrap().iter().all(|s| *s == ItemStatus::Ok));
        let mut dst = Buf::new(&kv, 4096);
        assert_eq!(get1(&kv, &mut dst, 1), Ok(Some(40)));
        assert_eq!(kv.stats().objects, 1);
        kv.sync().unwrap();
    }
    let rt = file_runtime(dir.path(), 1, 4, "64KiB");
    let kv = open(&rt);
    let s = kv.stats();
    assert_eq!((s.recovered, s.invalid_records), (1, 0), "{s:?}");
    let mut dst = Buf::new(&kv, 4096);
    assert_eq!(get1(&kv, &mut dst, 1), Ok(Some(40)));
}

// ---------------------------------------------------------------------------
// Device failures
// ---------------------------------------------------------------------------

fn assert_typed_device_error(st: &ItemStatus, what: &str) {
    match st {
        ItemStatus::Device { status: Some(s), drive: Some(d), .. } => {
            assert_eq!((s.sct, s.sc), (2, 0x81), "{what}: {st:?}");
            assert_eq!(d, "d0", "{what}");
        }
        other => panic!("{what}: {other:?}"),
    }
}

/// Writes and reads failed by the drive (SCT 2h, SC 81h, DNR) during
/// puts, gets and commit rounds: per-item, typed `Device` statuses, the
/// other items unaffected, no panic, and after a restart every key reads
/// back a version that was put for it (or is absent when its put failed).
/// Holds.
#[test]
fn failed_writes_and_reads_are_per_item_typed_and_leave_no_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let rt = file_runtime(dir.path(), 1, 4, "64KiB");
        let kv = open(&rt);
        let l = kv.layout();
        let emu = rt.emulator("d0").unwrap();
        let mut src = Buf::new(&kv, 3 * 4096);
        let m = *src.mem();
        let m = &m;
        let batch = |src: &mut Buf<'_>, v: u64| {
            for k in 0..3u64 {
                named_fill(&mut src.bytes[(k * 4096) as usize..((k + 1) * 4096) as usize], k, v);
            }
            (0..3u64)
                .map(|k| Put { key: key(k), value: Value { memory: m, offset: k * 4096, len: 4096 } })
                .collect::<Vec<_>>()
        };
        // A payload write fails: that item only.
        emu.add_fault(rule(WRITE, Some(data_lbas(&l)), FaultAction::Fail(fail_status()), Some(1)));
        let puts = batch(&mut src, 1);
        let st = kv.put_sync(&puts, T).unwrap();
        assert_eq!(st.iter().filter(|s| **s == ItemStatus::Ok).count(), 2, "{st:?}");
        let failed = st.iter().position(|s| *s != ItemStatus::Ok).unwrap();
        assert_typed_device_error(&st[failed], "payload write");
        assert_eq!(kv.contains(&[key(failed as u64)]), vec![false]);
        // A record write fails: the round's items, typed.
        emu.add_fault(rule(WRITE, Some(record_lbas(&l)), FaultAction::Fail(fail_status()), Some(1)));
        let puts = batch(&mut src, 2);
        let st = kv.put_sync(&puts, T).unwrap();
        for s in &st {
            assert_typed_device_error(s, "record write");
        }
        // The old versions are still there.
        let mut dst = Buf::new(&kv, 4096);
        for k in 0..3u64 {
            let want = if k as usize == failed { None } else { Some(1) };
            assert_eq!(get1(&kv, &mut dst, k), Ok(want), "key {k}");
        }
        // A payload read fails: that get only.
        emu.add_fault(rule(READ, Some(data_lbas(&l)), FaultAction::Fail(fail_status()), Some(1)));
        let dsts = Buf::new(&kv, 3 * 4096);
        let gets: Vec<Get<'_>> = (0..3u64)
            .map(|k| Get { key: key(k), into: Value { memory: dsts.mem(), offset: k * 4096, len: 4096 } })
            .collect();
        let st = kv.get_sync(&gets, T).unwrap();
        let hits = st.iter().filter(|s| matches!(s, ItemStatus::Hit { .. })).count();
        let present = 3 - 1;
        assert_eq!(hits, present - 1, "{st:?}");
        let dev = st.iter().find(|s| matches!(s, ItemStatus::Device { .. })).unwrap();
        assert_typed_device_error(dev, "payload read");
        // The next round clears what the failed round left; a sync whose
        // record write fails is an error, the next one succeeds.
        emu.add_fault(rule(WRITE, Some(record_lbas(&l)), FaultAction::Fail(fail_status()), Some(1)));
        assert_eq!(kv.remove(&[key((failed as u64 + 1) % 3)]), vec![ItemStatus::Ok]);
        let e = kv.sync().unwrap_err();
        // A caller matches the failed I/O's typed status, not a string.
        match &e {
            KvError::Io { what: "sync", status, .. } => assert_typed_device_error(status, "sync"),
            other => panic!("{other:?}"),
        }
        kv.sync().unwrap();
        let puts = batch(&mut src, 3);
        assert!(kv.put_sync(&puts, T).unwrap().iter().all(|s| *s == ItemStatus::Ok));
        assert_eq!(kv.stats().checksum_mismatches, 0);
    }
    let rt = file_runtime(dir.path(), 1, 4, "64KiB");
    let kv = open(&rt);
    let s = kv.stats();
    assert_eq!((s.recovered, s.invalid_records), (3, 0), "{s:?}");
    let mut dst = Buf::new(&kv, 4096);
    for k in 0..3 {
        assert_eq!(get1(&kv, &mut dst, k), Ok(Some(3)));
    }
}

/// With a volatile write cache, a Flush of a commit round failing fails
/// the round's puts (typed, naming the drive), the previous versions stay
/// readable, and after a restart nothing wrong is read. Holds.
#[test]
fn a_failed_flush_fails_the_round_and_leaves_no_wrong_bytes() {
    let disk = "review-flush-fail";
    let y = small_block_yaml(disk, 3);
    {
        let rt = runtime(&y);
        let kv = open(&rt);
        let mut src = Buf::new(&kv, 4096);
        let mut dst = Buf::new(&kv, 4096);
        assert_eq!(put1(&kv, &mut src, 1, 1, 4096), ItemStatus::Ok);
        let emu = rt.emulator("d0").unwrap();
        emu.add_fault(rule(FLUSH, None, FaultAction::Fail(fail_status()), Some(1)));
        let st = put1(&kv, &mut src, 1, 2, 4096);
        assert_typed_device_error(&st, "flush");
        assert_eq!(get1(&kv, &mut dst, 1), Ok(Some(1)));
        // The second Flush of the round (after the records) fails.
        let mut r = rule(FLUSH, None, FaultAction::Fail(fail_status()), Some(1));
        r.skip = 1;
        emu.add_fault(r);
        let st = put1(&kv, &mut src, 2, 1, 4096);
        assert_typed_device_error(&st, "second flush");
        assert_eq!(get1(&kv, &mut dst, 2), Ok(None));
        assert_eq!(put1(&kv, &mut src, 3, 1, 4096), ItemStatus::Ok);
        rt.emulator("d0").unwrap().power_fail();
    }
    {
        let rt = runtime(&y);
        let kv = open(&rt);
        let mut dst = Buf::new(&kv, 4096);
        assert_eq!(get1(&kv, &mut dst, 1), Ok(Some(1)));
        assert!(matches!(get1(&kv, &mut dst, 2), Ok(Some(1) | None)));
        assert_eq!(get1(&kv, &mut dst, 3), Ok(Some(1)));
    }
    nvme_emu::remove_ram_disk(disk).unwrap();
}

/// A payload write or read that never completes: the wait times out by
/// its deadline (`Timeout`), the rest of the store keeps working, and a
/// restart over the same drive file finds the acknowledged objects only.
/// Holds.
#[test]
fn a_payload_command_that_never_completes_times_out_and_the_store_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    {
        let rt = file_runtime(dir.path(), 1, 4, "64KiB");
        let kv = open(&rt);
        let l = kv.layout();
        let emu = rt.emulator("d0").unwrap();
        let mut src = Buf::new(&kv, 4096);
        let mut dst = Buf::new(&kv, 4096);
        assert_eq!(put1(&kv, &mut src, 1, 1, 4096), ItemStatus::Ok);
        emu.add_fault(rule(WRITE, Some(data_lbas(&l)), FaultAction::NeverComplete, Some(1)));
        named_fill(&mut src.bytes, 2, 1);
        let value = Value { memory: src.mem(), offset: 0, len: 4096 };
        let t0 = Instant::now();
        let st = kv.put_sync(&[Put { key: key(2), value }], Duration::from_millis(300)).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert_eq!(st, vec![ItemStatus::Timeout]);
        emu.add_fault(rule(READ, Some(data_lbas(&l)), FaultAction::NeverComplete, Some(1)));
        let dst2 = Buf::new(&kv, 4096);
        let into = Value { memory: dst2.mem(), offset: 0, len: 4096 };
        let st = kv.get_sync(&[Get { key: key(1), into }], Duration::from_millis(300)).unwrap();
        assert_eq!(st, vec![ItemStatus::Timeout]);
        // The store goes on.
        let mut src2 = Buf::new(&kv, 4096);
        assert_eq!(put1(&kv, &mut src2, 3, 1, 4096), ItemStatus::Ok);
        assert_eq!(get1(&kv, &mut dst, 1), Ok(Some(1)));
        assert_eq!(get1(&kv, &mut dst, 2), Ok(None));
        assert_eq!(get1(&kv, &mut dst, 3), Ok(Some(1)));
        kv.sync().unwrap();
        // The memory of the commands still outstanding stays busy.
        assert!(kv.unregister(*dst2.mem()).is_err());
    }
    let rt = file_runtime(dir.path(), 1, 4, "64KiB");
    let kv = open(&rt);
    let mut dst = Buf::new(&kv, 4096);
    assert_eq!(get1(&kv, &mut dst, 1), Ok(Some(1)));
    assert_eq!(get1(&kv, &mut dst, 2), Ok(None));
    assert_eq!(get1(&kv, &mut dst, 3), Ok(Some(1)));
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

/// Four threads put (batches of two, sometimes the same key twice), get,
/// remove and sync overlapping keys on a full store (15 objects, 24 keys):
/// every hit names, in every 8 bytes, the key asked for and a version put
/// for it; after a restart every object present is such a version. Holds.
#[test]
fn concurrent_puts_gets_removes_and_syncs_on_a_full_store_never_return_wrong_bytes() {
    const THREADS: u64 = 4;
    const OPS: u64 = 40;
    const KEYS: u64 = 24;
    const OBJ: u64 = 16 << 10;
    let dir = tempfile::tempdir().unwrap();
    let attempted: Mutex<std::collections::HashSet<(u64, u64)>> = Mutex::default();
    {
        let rt = file_runtime_sized(dir.path(), 2, "128KiB", "16KiB");
        let kv = open(&rt);
        assert!(kv.stats().capacity < KEYS, "{:?}", kv.stats());
        let start = Barrier::new(THREADS as usize);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (kv, start, attempted) = (&kv, &start, &attempted);
                s.spawn(move || {
                    let mut src = Buf::new(kv, 2 * OBJ as usize);
                    let mut dst = Buf::new(kv, OBJ as usize);
                    start.wait();
                    for i in 0..OPS {
                        let v = t * OPS + i + 1;
                        let k1 = (t * 5 + i * 7) % KEYS;
                        let k2 = if i % 5 == 0 { k1 } else { (k1 + 1 + t) % KEYS };
                        let len = |x: u64| 8 + (x * 104_729) % (OBJ - 8) / 8 * 8;
                        named_fill(&mut src.bytes[..OBJ as usize], k1, v);
                        named_fill(&mut src.bytes[OBJ as usize..], k2, v);
                        attempted.lock().unwrap().extend([(k1, v), (k2, v)]);
                        let m = src.mem();
                        let puts = [
                            Put { key: key(k1), value: Value { memory: m, offset: 0, len: len(v) } },
                            Put { key: key(k2), value: Value { memory: m, offset: OBJ, len: len(v + 1) } },
                        ];
                        for st in kv.put_sync(&puts, T).unwrap() {
                            assert!(matches!(st, ItemStatus::Ok | ItemStatus::Full), "thread {t}: {st:?}");
                        }
                        for r in [k1, (k1 + 3) % KEYS, (k2 + 11) % KEYS] {
                            match get1(kv, &mut dst, r) {
                                Ok(Some(v)) => {
                                    assert!(attempted.lock().unwrap().contains(&(r, v)), "{r} v{v}")
                                }
                                Ok(None) => {}
                                Err(st) => panic!("thread {t}: get {r}: {st:?}"),
                            }
                        }
                        match i % 6 {
                            2 => drop(kv.remove(&[key((k1 + 2) % KEYS)])),
                            4 => kv.sync().unwrap(),
                            _ => {}
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
    let attempted = attempted.into_inner().unwrap();
    let rt = file_runtime_sized(dir.path(), 2, "128KiB", "16KiB");
    let kv = open(&rt);
    let s = kv.stats();
    assert_eq!(s.invalid_records, 0, "{s:?}");
    let mut dst = Buf::new(&kv, OBJ as usize);
    for k in 0..KEYS {
        match get1(&kv, &mut dst, k) {
            Ok(Some(v)) => assert!(attempted.contains(&(k, v)), "key {k} version {v}"),
            Ok(None) => {}
            Err(st) => panic!("after a restart, key {k}: {st:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Registration and drives in use
// ---------------------------------------------------------------------------

/// Memory of a put or a get not yet waited on cannot be unregistered
/// (`KvError::MemoryInUse`); once waited on, it can. Holds (for the window
/// inside `wait_get`, see
/// `memory_cannot_be_unregistered_while_wait_get_still_reads_it`).
#[test]
fn memory_in_flight_cannot_be_unregistered() {
    let rt = ram_runtime(1, 1, "64KiB");
    let kv = open(&rt);
    let emu = rt.emulator("d0").unwrap();
    emu.add_fault(rule(
        WRITE,
        Some(data_lbas(&kv.layout())),
        FaultAction::Delay(Duration::from_millis(50)),
        None,
    ));
    emu.add_fault(rule(
        READ,
        Some(data_lbas(&kv.layout())),
        FaultAction::Delay(Duration::from_millis(50)),
        None,
    ));
    let mut src = Buf::new(&kv, 4096);
    named_fill(&mut src.bytes, 1, 1);
    let m = *src.mem();
    let p = kv.put(&[Put { key: key(1), value: Value { memory: &m, offset: 0, len: 4096 } }]).unwrap();
    assert!(matches!(kv.unregister(m), Err(KvError::MemoryInUse)), "the store refuses first");
    assert_eq!(kv.wait_put(p, T).unwrap(), vec![ItemStatus::Ok]);
    let p = kv.get(&[Get { key: key(1), into: Value { memory: &m, offset: 0, len: 4096 } }]).unwrap();
    assert!(kv.unregister(m).is_err());
    assert_eq!(kv.wait_get(p, T).unwrap(), vec![ItemStatus::Hit { len: 4096 }]);
    kv.unregister(m).unwrap();
    src.mem = None;
    // Unregistered twice, or with another store: refused.
    assert!(kv.unregister(m).is_err());
}

/// A RAM disk held by one runtime cannot be opened by another
/// (`RamDiskInUse`), so a store on it cannot be opened twice that way.
/// (File-backed emulated drives are not locked: docs/kv-store.md says so,
/// and two runtimes on one file then behave like
/// `a_store_opened_twice_on_one_runtime_is_refused`.) Holds.
#[test]
fn a_ram_disk_in_use_by_another_runtime_is_refused() {
    let disk = "review-in-use";
    let y = small_block_yaml(disk, 1);
    let rt = runtime(&y);
    let _kv = open(&rt);
    let second = Runtime::from_config(tutti::Config::from_yaml_str(&y).unwrap());
    assert!(second.is_err());
    drop(_kv);
    drop(rt);
    nvme_emu::remove_ram_disk(disk).unwrap();
}

/// After the runtime shuts down, puts and gets fail as device errors naming
/// the shutdown (the store cannot do I/O), not as bad values, and their
/// text (what `sync`'s error carries too) is a sentence, not a debug dump.
#[test]
fn after_shutdown_items_are_device_errors_and_sync_says_why() {
    let rt = ram_runtime(1, 64, "64KiB");
    let kv = open(&rt);
    let mut src = Buf::new(&kv, 64 << 10);
    let mut dst = Buf::new(&kv, 64 << 10);
    assert_eq!(put1(&kv, &mut src, 1, 1, 4096), ItemStatus::Ok);
    let _ = rt.shutdown(Duration::from_secs(5));
    let shut =
        |s: &ItemStatus| matches!(s, ItemStatus::Device { message, .. } if message.contains("shutting down"));
    let st = put1(&kv, &mut src, 2, 1, 4096);
    assert!(shut(&st), "{st:?}");
    let st = get1(&kv, &mut dst, 1).unwrap_err();
    assert!(shut(&st), "{st:?}");
    assert_eq!(st.to_string(), "the runtime is shutting down");
}
