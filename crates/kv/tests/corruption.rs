//! Media corruption: bits flipped directly in the backing files of
//! file-backed emulated drives while no runtime has them open.
//!
//! - A flipped payload bit (first, a middle, the last byte of an object)
//!   makes a get of that object [`ItemStatus::ChecksumMismatch`], never a
//!   hit, and every other object still reads back exactly.
//! - A flipped record bit (magic, key, record CRC) makes that object
//!   absent after the reopen (a miss; counted in `invalid_records`), every
//!   other object intact; the invalid record never becomes an object
//!   again, and the key can be put again.
//! - A flipped superblock bit (one in each of its fields), a
//!   superblock of another format version (with a correct CRC32C), and a
//!   reopen with another geometry (slot size, drive size) make open fail
//!   with [`KvError::Superblock`] and leave the drive files byte for byte
//!   as they were; undoing the change, the store opens with every object.
//!
//! Each runs on one drive and on three striped drives; [`locate`] maps a
//! byte of the store to a drive file and offset, and each fixture checks
//! that mapping against the objects it wrote before it relies on it.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use common::*;
use tutti::Runtime;
use tutti_kv::format::{Layout, Record, RecordDecode, SuperblockError, FORMAT_VERSION, RECORD_BYTES};
use tutti_kv::{Get, ItemStatus, Key, KvError, KvStore, Put, Value};

const OBJ: u64 = 64 << 10;
/// Each drive's size, MiB.
const DRIVE_MIB: u64 = 4;
/// Lengths of the fixture's objects (key i has `LENS[i]` bytes).
const LENS: [u64; 6] = [OBJ, 1000, 40_000, 4096, 12_345, OBJ - 1];

/// Where byte `x` of the store (the byte space `Layout` offsets count in:
/// slab slot `i` is bytes `i * slot_size..`) lies in the drive files of
/// [`file_runtime`]: (drive index, byte offset in `d<index>.img`).
///
/// Each emulated drive has one namespace, at byte 0 of its file (nvme-emu
/// lays a drive's namespaces end to end in its file). With one drive the
/// datapath is `local_nvme`: store byte `x` is drive byte `x`. With more it
/// is `striped_local_nvme` over `d0, d1, ...` in that order, in
/// [`STRIPE_UNIT`]-byte units round robin (RAID-0): byte `x` is on drive
/// `(x / unit) % drives` at byte `(x / (unit * drives)) * unit + x % unit`.
fn locate(drives: usize, x: u64) -> (usize, u64) {
    if drives == 1 {
        return (0, x);
    }
    let (unit, n) = (STRIPE_UNIT, drives as u64);
    (((x / unit) % n) as usize, (x / (unit * n)) * unit + x % unit)
}

/// Calls `f(drive, drive_offset, range)` for each piece of store bytes
/// `x..x + len` that is contiguous in one drive file (`range` indexes the
/// `len` bytes).
fn pieces(drives: usize, x: u64, len: u64, mut f: impl FnMut(usize, u64, std::ops::Range<usize>)) {
    let mut done = 0;
    while done < len {
        let at = x + done;
        let n = if drives == 1 { len - done } else { (STRIPE_UNIT - at % STRIPE_UNIT).min(len - done) };
        let (d, off) = locate(drives, at);
        f(d, off, done as usize..(done + n) as usize);
        done += n;
    }
}

/// Bytes `x..x + len` of the store, read from the drive files.
fn read_store(dir: &Path, drives: usize, x: u64, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    pieces(drives, x, len, |d, off, r| {
        let f = std::fs::File::open(drive_file(dir, d)).unwrap();
        f.read_exact_at(&mut out[r], off).unwrap();
    });
    out
}

/// Overwrites store bytes `x..` with `bytes` in the drive files.
fn write_store(dir: &Path, drives: usize, x: u64, bytes: &[u8]) {
    pieces(drives, x, bytes.len() as u64, |d, off, r| {
        let f = std::fs::OpenOptions::new().write(true).open(drive_file(dir, d)).unwrap();
        f.write_all_at(&bytes[r], off).unwrap();
        f.sync_all().unwrap();
    });
}

/// Flips bit `bit` (0..8) of store byte `x` in its drive file.
fn flip_bit(dir: &Path, drives: usize, x: u64, bit: u32) {
    let mut b = read_store(dir, drives, x, 1);
    b[0] ^= 1 << bit;
    write_store(dir, drives, x, &b);
}

/// The whole contents of every drive file.
fn files(dir: &Path, drives: usize) -> Vec<Vec<u8>> {
    (0..drives).map(|d| std::fs::read(drive_file(dir, d)).unwrap()).collect()
}

/// BLAKE3 of every drive file.
fn digests(dir: &Path, drives: usize) -> Vec<blake3::Hash> {
    files(dir, drives).iter().map(|f| blake3::hash(f)).collect()
}

/// A store on `drives` file-backed drives holding key `i` with `LENS[i]`
/// bytes `fill(i, 1)`, closed.
struct Fixture {
    dir: tempfile::TempDir,
    drives: usize,
    layout: Layout,
    uuid: [u8; 16],
    /// The slot of each object, from the record table on the files.
    slots: Vec<u64>,
}

fn payload(k: u64) -> Vec<u8> {
    let mut b = vec![0u8; OBJ as usize];
    fill(&mut b, k, 1);
    b.truncate(LENS[k as usize] as usize);
    b
}

impl Fixture {
    fn new(drives: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (layout, uuid) = {
            let rt = file_runtime(dir.path(), drives, DRIVE_MIB, "64KiB");
            let kv = open(&rt);
            let mut src = Buf::new(&kv, LENS.len() * OBJ as usize);
            for k in 0..LENS.len() {
                fill(&mut src.bytes[k * OBJ as usize..(k + 1) * OBJ as usize], k as u64, 1);
            }
            let puts: Vec<Put> = LENS
                .iter()
                .enumerate()
                .map(|(k, &len)| Put {
                    key: key(k as u64),
                    value: Value { memory: src.mem(), offset: k as u64 * OBJ, len },
                })
                .collect();
            let st = kv.put_sync(&puts, T).unwrap();
            assert!(st.iter().all(|s| *s == ItemStatus::Ok), "{st:?}");
            (kv.layout(), kv.uuid())
        };
        let mut fx = Self { dir, drives, layout, uuid, slots: Vec::new() };
        // The mapping is right: the record table on the files names each
        // key once, and its slot on the files holds the key's bytes.
        fx.slots = (0..LENS.len() as u64).map(|k| fx.slot_of(&key(k))).collect();
        for (k, &slot) in fx.slots.iter().enumerate() {
            let on_media = read_store(fx.dir.path(), drives, layout.object_offset(slot), LENS[k]);
            assert!(on_media == payload(k as u64), "key {k}: slot {slot} on the files has other bytes");
        }
        fx
    }

    /// The slot whose record on the files is `key`'s.
    fn slot_of(&self, key: &Key) -> u64 {
        let l = self.layout;
        let table =
            read_store(self.dir.path(), self.drives, l.record_offset, l.capacity * RECORD_BYTES as u64);
        let found: Vec<u64> = (0..l.capacity)
            .filter(|&s| {
                let r: &[u8; RECORD_BYTES] =
                    table[s as usize * RECORD_BYTES..][..RECORD_BYTES].try_into().unwrap();
                matches!(Record::decode(r, &self.uuid, s as u32, key.len(), l.object_size),
                    RecordDecode::Valid(rec) if rec.key == *key)
            })
            .collect();
        assert_eq!(found.len(), 1, "records of {key:?}: slots {found:?}");
        found[0]
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn runtime(&self) -> Arc<Runtime> {
        file_runtime(self.path(), self.drives, DRIVE_MIB, "64KiB")
    }

    fn open(&self) -> (Arc<Runtime>, KvStore) {
        let rt = self.runtime();
        let kv = open(&rt);
        (rt, kv)
    }
}

/// Gets key `k` into a fresh buffer: its status and the bytes.
fn get(kv: &KvStore, k: u64) -> (ItemStatus, Vec<u8>) {
    let dst = Buf::new(kv, OBJ as usize);
    let g = Get { key: key(k), into: Value { memory: dst.mem(), offset: 0, len: OBJ } };
    let st = kv.get_sync(&[g], T).unwrap().remove(0);
    (st, dst.bytes.clone())
}

/// Every fixture object except those in `except` reads back exactly.
fn intact_except(kv: &KvStore, except: &[u64]) {
    for k in (0..LENS.len() as u64).filter(|k| !except.contains(k)) {
        let (st, bytes) = get(kv, k);
        assert_eq!(st, ItemStatus::Hit { len: LENS[k as usize] }, "key {k}");
        assert!(bytes[..LENS[k as usize] as usize] == payload(k), "key {k}: other bytes");
    }
}

#[test]
fn a_flipped_payload_bit_is_a_checksum_mismatch_and_nothing_else_changes() {
    for drives in [1, 3] {
        // (object, byte of its payload): the first, one in its second
        // stripe unit, the last.
        for (victim, at) in [(0u64, 0u64), (2, 20_000), (5, LENS[5] - 1)] {
            let fx = Fixture::new(drives);
            let x = fx.layout.object_offset(fx.slots[victim as usize]) + at;
            flip_bit(fx.path(), drives, x, (at % 8) as u32);
            let (_rt, kv) = fx.open();
            assert_eq!(kv.stats().invalid_records, 0);
            assert_eq!(kv.contains(&[key(victim)]), vec![true], "the record is intact");
            for _ in 0..2 {
                let (st, _) = get(&kv, victim);
                assert!(
                    matches!(st, ItemStatus::ChecksumMismatch { stored, computed } if stored != computed),
                    "{drives} drives, key {victim} byte {at}: {st:?}"
                );
            }
            intact_except(&kv, &[victim]);
            let s = kv.stats();
            assert_eq!((s.checksum_mismatches, s.hits), (2, LENS.len() as u64 - 1), "{s:?}");
        }
    }
}

#[test]
fn a_flipped_record_bit_makes_that_object_absent_and_nothing_else_changes() {
    for drives in [1, 3] {
        // (object, byte of its record): magic, key, the record's CRC.
        for (victim, byte) in [(1u64, 0u64), (3, 30), (4, 63)] {
            let fx = Fixture::new(drives);
            let l = fx.layout;
            let x = l.record_offset + fx.slots[victim as usize] * RECORD_BYTES as u64 + byte;
            flip_bit(fx.path(), drives, x, (byte % 8) as u32);
            {
                let (_rt, kv) = fx.open();
                let s = kv.stats();
                assert_eq!((s.invalid_records, s.recovered), (1, LENS.len() as u64 - 1), "{s:?}");
                assert_eq!(kv.contains(&[key(victim)]), vec![false]);
                assert_eq!(get(&kv, victim).0, ItemStatus::Miss);
                intact_except(&kv, &[victim]);
                // A put rewrites the record block that held the invalid
                // record.
                let mut src = Buf::new(&kv, OBJ as usize);
                fill(&mut src.bytes, 100, 1);
                let v = Value { memory: src.mem(), offset: 0, len: 5000 };
                assert_eq!(kv.put_sync(&[Put { key: key(100), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
            }
            let (_rt, kv) = fx.open();
            let s = kv.stats();
            assert_eq!((s.invalid_records, s.recovered), (0, LENS.len() as u64), "{s:?}");
            assert_eq!(get(&kv, victim).0, ItemStatus::Miss, "the invalid record stays gone");
            intact_except(&kv, &[victim]);
            // The key can be stored again.
            let mut src = Buf::new(&kv, OBJ as usize);
            fill(&mut src.bytes, victim, 2);
            let v = Value { memory: src.mem(), offset: 0, len: 777 };
            assert_eq!(kv.put_sync(&[Put { key: key(victim), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
            let (st, bytes) = get(&kv, victim);
            assert_eq!(st, ItemStatus::Hit { len: 777 });
            assert!(bytes[..777] == src.bytes[..777]);
        }
    }
}

/// Opening the fixture's drives as `rt` fails with a superblock error;
/// the files are what they were before.
fn refused(fx: &Fixture, rt: Arc<Runtime>) -> SuperblockError {
    let before = digests(fx.path(), fx.drives);
    let e = KvStore::open(rt.clone(), &tutti_kv::OpenOptions::new("kv")).unwrap_err();
    drop(rt);
    assert_eq!(digests(fx.path(), fx.drives), before, "open wrote to the drives: {e}");
    match e {
        KvError::Superblock { source, .. } => source,
        other => panic!("not a superblock error: {other}"),
    }
}

#[test]
fn a_flipped_superblock_bit_is_refused_and_nothing_is_written() {
    for drives in [1, 3] {
        let fx = Fixture::new(drives);
        let original = files(fx.path(), drives);
        // A bit in each field: magic, version, key size, UUID, block size,
        // record size, object size, store size, capacity, record offset,
        // data offset, CRC32C (first and last byte of each, in turn).
        let fields =
            [0..8u64, 8..12, 12..16, 16..32, 32..36, 36..40, 40..48, 48..56, 56..64, 64..72, 72..80, 80..84];
        for (i, field) in fields.into_iter().enumerate() {
            let byte = if i % 2 == 0 { field.start } else { field.end - 1 };
            let bit = (i % 8) as u32;
            flip_bit(fx.path(), drives, byte, bit);
            let e = refused(&fx, fx.runtime());
            if byte < 8 {
                assert_eq!(e, SuperblockError::NotAStore, "byte {byte}");
            } else {
                assert!(matches!(e, SuperblockError::Corrupt { .. }), "byte {byte}: {e:?}");
            }
            flip_bit(fx.path(), drives, byte, bit);
        }
        assert!(files(fx.path(), drives) == original);
        let (_rt, kv) = fx.open();
        assert_eq!(kv.uuid(), fx.uuid);
        intact_except(&kv, &[]);
    }
}

#[test]
fn another_format_version_is_refused_and_nothing_is_written() {
    for drives in [1, 3] {
        let fx = Fixture::new(drives);
        let sb = read_store(fx.path(), drives, 0, 84);
        let mut other = sb.clone();
        other[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let crc = crc32c::crc32c(&other[..80]);
        other[80..84].copy_from_slice(&crc.to_le_bytes());
        write_store(fx.path(), drives, 0, &other);
        assert_eq!(
            refused(&fx, fx.runtime()),
            SuperblockError::Version { found: FORMAT_VERSION + 1, supported: FORMAT_VERSION }
        );
        write_store(fx.path(), drives, 0, &sb);
        let (_rt, kv) = fx.open();
        assert_eq!(kv.uuid(), fx.uuid);
        intact_except(&kv, &[]);
    }
}

#[test]
fn another_geometry_is_refused_and_nothing_is_written() {
    for drives in [1, 3] {
        let fx = Fixture::new(drives);
        let original = files(fx.path(), drives);
        // Slots of 128 KiB.
        let rt = file_runtime(fx.path(), drives, DRIVE_MIB, "128KiB");
        let e = refused(&fx, rt);
        assert!(matches!(e, SuperblockError::Geometry { field: "object_size", .. }), "{e:?}");
        // Drives twice as large: the emulator extends each file with zeros
        // when it opens it; the store must not write.
        let rt = file_runtime(fx.path(), drives, 2 * DRIVE_MIB, "64KiB");
        let e = refused(&fx, rt);
        assert!(matches!(e, SuperblockError::Geometry { field: "store_bytes", .. }), "{e:?}");
        for (now, then) in files(fx.path(), drives).iter().zip(&original) {
            assert!(now[..then.len()] == then[..], "the old bytes changed");
            assert!(now[then.len()..].iter().all(|&b| b == 0), "the new bytes are not zero");
        }
        // The old geometry again (the emulator cuts the files back).
        let rt = fx.runtime();
        assert!(files(fx.path(), drives) == original);
        let kv = open(&rt);
        assert_eq!(kv.uuid(), fx.uuid);
        intact_except(&kv, &[]);
    }
}
