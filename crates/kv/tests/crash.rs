//! Crash consistency under power loss.
//!
//! Each crash point: 1 to 4 emulated drives with a volatile write cache
//! (seeded) over named RAM disks, with 4096-byte or (odd points) 512-byte
//! logical blocks (8 records per block: the record table spans blocks), a random workload of puts (payloads
//! derived from key and version), overwrites, removes, gets and syncs, and
//! a power failure at a random command of a random drive (the emulator's
//! `power_fail` fault rule, then every other drive's power as soon as the
//! workload sees the first failure; a workload that finishes first loses
//! power at its end). Unflushed blocks are each kept or lost, so payloads
//! and record blocks tear at block boundaries. Then a new runtime and store
//! over the same RAM disks, and for every key:
//!
//! - a key the store reports must read back, verified (`Hit`), exactly one
//!   version that was put for it (acknowledged or in flight): never a
//!   checksum miss, never bytes of two versions or of another key;
//! - a put acknowledged before the crash (and so before the last completed
//!   `sync` or not: an acknowledged put is durable) must be there, with that
//!   version or one put after it, unless a remove of the key was issued
//!   after it;
//! - a remove followed by a completed `sync` must stay removed, unless the
//!   key was put again afterwards.
//!
//! The harness prints points tried, wrong bytes returned and acknowledged
//! puts lost; both must be zero. `TUTTI_CRASH_POINTS` sets the number of
//! points (default 1,000).

mod common;

use std::collections::HashMap;

use common::{fill, key, runtime, yaml, T};
use tutti_kv::{Get, ItemStatus, KvStore, OpenOptions, Put, Value};

const KEYS: u64 = 12;
const SLOT: u64 = 16 << 10;
const OPS: usize = 40;

/// A tiny deterministic generator (SplitMix64), so each point replays
/// from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What happened to one key, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// A put of this version: acknowledged (`true`) or not (in flight at
    /// the crash, or failed).
    Put(u64, bool),
    /// A remove; `true` once a `sync` issued after it completed.
    Remove(bool),
}

#[derive(Debug, Default)]
struct Tally {
    points: u64,
    wrong_bytes: u64,
    acked_lost: u64,
    removes_resurrected: u64,
    crashed_in_workload: u64,
}

/// The point's config: `drives` drives over its RAM disks, each with a
/// write cache seeded from the point, and the power-fail rule `(drive,
/// skip)` on one of them.
fn drive_yaml(point: u64, drives: usize, crash: Option<(usize, u64)>) -> String {
    let y = yaml(drives, 1, "16KiB", &|d| {
        let mut b = format!(
            "{{ ram_disk: crash-{point}-d{d} }}\n      write_cache: {{ seed: {} }}",
            point * 7 + d as u64
        );
        if let Some((_, skip)) = crash.filter(|c| c.0 == d) {
            b += &format!("\n      faults: [{{ action: power_fail, skip: {skip} }}]");
        }
        b
    });
    // Odd points use 512-byte blocks: 8 records per block, so a store's
    // records span several blocks and a round's record writes can tear.
    if point % 2 == 1 {
        y.replace("block_size: 4096", "block_size: 512")
    } else {
        y
    }
}

/// Payload length of (key, version): 1 byte to a whole slot, often not a
/// multiple of the block size.
fn len_of(k: u64, v: u64) -> u64 {
    1 + (k * 7919 + v * 104_729) % SLOT
}

struct Workload<'a> {
    kv: &'a KvStore,
    mem: &'a tutti_kv::KvMemory,
    buf: &'a mut Vec<u8>,
    history: HashMap<u64, Vec<Event>>,
    version: u64,
}

impl Workload<'_> {
    /// One random operation; `false` once the store failed (the crash).
    fn step(&mut self, rng: &mut Rng) -> bool {
        match rng.below(10) {
            0..=4 => self.put(rng),
            5 | 6 => self.get(rng),
            7 | 8 => {
                let k = rng.below(KEYS);
                self.kv.remove(&[key(k)]);
                self.history.entry(k).or_default().push(Event::Remove(false));
                true
            }
            _ => self.sync(),
        }
    }

    fn put(&mut self, rng: &mut Rng) -> bool {
        let n = 1 + rng.below(3) as usize;
        let mut items = Vec::with_capacity(n);
        for j in 0..n {
            self.version += 1;
            let k = rng.below(KEYS);
            let off = j * SLOT as usize;
            fill(&mut self.buf[off..off + SLOT as usize], k, self.version);
            items.push((k, self.version));
        }
        // The memory was filled before registration's first use; the store
        // reads it only inside put (to checksum) and by DMA.
        let puts: Vec<Put> = items
            .iter()
            .enumerate()
            .map(|(j, &(k, v))| Put {
                key: key(k),
                value: Value { memory: self.mem, offset: (j as u64) * SLOT, len: len_of(k, v) },
            })
            .collect();
        let st = self.kv.put_sync(&puts, T);
        let ok: Vec<bool> = match &st {
            Ok(s) => s.iter().map(|s| *s == ItemStatus::Ok).collect(),
            Err(_) => vec![false; n],
        };
        for (&(k, v), &acked) in items.iter().zip(&ok) {
            self.history.entry(k).or_default().push(Event::Put(v, acked));
        }
        ok.iter().all(|&a| a)
    }

    fn get(&mut self, rng: &mut Rng) -> bool {
        let k = rng.below(KEYS);
        let into = Value { memory: self.mem, offset: 3 * SLOT, len: SLOT };
        match self.kv.get_sync(&[Get { key: key(k), into }], T) {
            Ok(s) => !matches!(s[0], ItemStatus::Device { .. } | ItemStatus::Timeout),
            Err(_) => false,
        }
    }

    fn sync(&mut self) -> bool {
        if self.kv.sync().is_err() {
            return false;
        }
        for events in self.history.values_mut() {
            for e in events.iter_mut() {
                if let Event::Remove(synced) = e {
                    *synced = true;
                }
            }
        }
        true
    }
}

/// The version whose bytes `got` holds, if every word names key `k` and
/// one version.
fn version_of(got: &[u8], k: u64, len: u64, candidates: &[u64]) -> Option<u64> {
    candidates.iter().copied().find(|&v| {
        if len_of(k, v) != len {
            return false;
        }
        let mut want = vec![0u8; SLOT as usize];
        fill(&mut want, k, v);
        got[..len as usize] == want[..len as usize]
    })
}

/// Checks key `k` after the restart against its history.
fn check_key(kv: &KvStore, mem: &tutti_kv::KvMemory, buf: &[u8], k: u64, events: &[Event], t: &mut Tally) {
    let into = Value { memory: mem, offset: 0, len: SLOT };
    let st = kv.get_sync(&[Get { key: key(k), into }], T).expect("get after restart");
    let attempted: Vec<u64> =
        events.iter().filter_map(|e| if let Event::Put(v, _) = e { Some(*v) } else { None }).collect();
    let found = match st[0] {
        ItemStatus::Hit { len } => match version_of(buf, k, len, &attempted) {
            Some(v) => Some(v),
            None => {
                t.wrong_bytes += 1;
                eprintln!("key {k}: {len} bytes of no version put for it ({events:?})");
                return;
            }
        },
        ItemStatus::Miss => None,
        ref other => {
            t.wrong_bytes += 1;
            eprintln!("key {k}: {other:?} after restart ({events:?})");
            return;
        }
    };
    // The last event that must be durable: an acknowledged put, or a remove
    // a completed sync followed.
    let Some(i) = events.iter().rposition(|e| matches!(e, Event::Put(_, true) | Event::Remove(true))) else {
        return;
    };
    let later_puts: Vec<u64> =
        events[i..].iter().filter_map(|e| if let Event::Put(v, _) = e { Some(*v) } else { None }).collect();
    let removed_later = events[i + 1..].iter().any(|e| matches!(e, Event::Remove(_)));
    match (events[i], found) {
        (Event::Put(..), Some(v)) if later_puts.contains(&v) => {}
        (Event::Put(..), None) if removed_later => {}
        (Event::Put(v, _), _) => {
            t.acked_lost += 1;
            eprintln!("key {k}: acknowledged put of version {v} lost, found {found:?} ({events:?})");
        }
        (Event::Remove(_), None) => {}
        (Event::Remove(_), Some(v)) if later_puts.contains(&v) => {}
        (Event::Remove(_), Some(v)) => {
            t.removes_resurrected += 1;
            eprintln!("key {k}: removed and synced, but version {v} is back ({events:?})");
        }
    }
}

fn one_point(point: u64, t: &mut Tally) {
    let mut rng = Rng(point.wrapping_mul(0xA24B_AED4_963E_E407) ^ 0x5EED);
    let drives = 1 + (point % 4) as usize;
    let crash = (rng.below(drives as u64) as usize, rng.below(70));
    let mut buf = vec![0u8; 4 * SLOT as usize];
    let history = {
        let rt = runtime(&drive_yaml(point, drives, Some(crash)));
        let kv = match KvStore::open(rt.clone(), &OpenOptions::new("kv")) {
            Ok(kv) => kv,
            Err(_) => {
                // The power failed while formatting.
                power_off(&rt);
                return finish(point, drives, HashMap::new(), t);
            }
        };
        // SAFETY: `buf` outlives the store's use of it (unregistered below,
        // before the runtime is dropped) and is touched only between calls.
        #[allow(unsafe_code)]
        let mem = unsafe { kv.register_host(buf.as_mut_ptr(), buf.len()).unwrap() };
        let mut w = Workload { kv: &kv, mem: &mem, buf: &mut buf, history: HashMap::new(), version: 0 };
        let mut crashed = false;
        for _ in 0..OPS {
            if !w.step(&mut rng) {
                crashed = true;
                break;
            }
        }
        t.crashed_in_workload += u64::from(crashed);
        assert_eq!(kv.stats().evictions, 0, "the harness sizes the store so nothing is evicted");
        let history = std::mem::take(&mut w.history);
        power_off(&rt);
        let _ = kv.unregister(mem);
        history
    };
    finish(point, drives, history, t);
}

fn power_off(rt: &tutti::Runtime) {
    for d in rt.drive_names() {
        rt.emulator(&d).unwrap().power_fail();
    }
}

/// Reopens the point's RAM disks in a new runtime and checks every key.
fn finish(point: u64, drives: usize, history: HashMap<u64, Vec<Event>>, t: &mut Tally) {
    t.points += 1;
    {
        let rt = runtime(&drive_yaml(point, drives, None));
        let kv = KvStore::open(rt, &OpenOptions::new("kv")).expect("reopen after the power failure");
        let mut buf = vec![0u8; SLOT as usize];
        // SAFETY: as in `one_point`.
        #[allow(unsafe_code)]
        let mem = unsafe { kv.register_host(buf.as_mut_ptr(), buf.len()).unwrap() };
        for k in 0..KEYS {
            let events = history.get(&k).map_or(&[][..], |v| &v[..]);
            check_key(&kv, &mem, &buf, k, events, t);
        }
        kv.unregister(mem).unwrap();
    }
    for d in 0..drives {
        nvme_emu::remove_ram_disk(&format!("crash-{point}-d{d}"))
            .expect("the runtime let go of its RAM disks");
    }
}

#[test]
fn no_wrong_bytes_and_no_lost_acknowledged_puts_across_power_failures() {
    let points: u64 = std::env::var("TUTTI_CRASH_POINTS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let mut t = Tally::default();
    let t0 = std::time::Instant::now();
    for p in 0..points {
        one_point(p, &mut t);
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "crash harness: {} points tried ({} crashed inside the workload), {} wrong bytes returned, \
         {} acknowledged puts lost, {} synced removes undone; {:.1} points/s",
        t.points,
        t.crashed_in_workload,
        t.wrong_bytes,
        t.acked_lost,
        t.removes_resurrected,
        t.points as f64 / secs
    );
    assert_eq!(t.points, points);
    assert_eq!((t.wrong_bytes, t.acked_lost, t.removes_resurrected), (0, 0, 0));
    assert!(t.crashed_in_workload > points / 4, "most power failures should hit the workload: {t:?}");
}
