//! GPU-resident objects (`execution: gpu`, values in GPU memory): puts are
//! checksummed by the CRC32C kernel, gets verified by it, and the two
//! checksums agree with the CPU's (an object put from GPU memory and read
//! into host memory is a hit). Needs a CUDA GPU; elsewhere each test prints
//! why it skipped and passes.

mod common;

use std::sync::Arc;

use common::{fill, key, T};
use gpu_io::GpuBuffer;
use tutti::config::{DataPathConfig, DriveConfig, Execution, WriteCacheConfig};
use tutti::{Config, Runtime};
use tutti_kv::{Get, ItemStatus, KvStore, OpenOptions, Put, Value};

const OBJ: usize = 1 << 20;

fn gpu_runtime(drives: usize) -> Option<Arc<Runtime>> {
    gpu_runtime_with(drives, false)
}

/// `drives` emulated drives under GPU execution; `write_cache`: each with
/// a volatile write cache, so commit rounds send Flushes (CPU-executed, on
/// the queue pair a GPU-executed drive keeps for them).
fn gpu_runtime_with(drives: usize, write_cache: bool) -> Option<Arc<Runtime>> {
    let mut cfg = Config::builtin_striped_ram(drives, 64 << 20, OBJ as u64);
    for d in cfg.drives.values_mut() {
        if let (true, DriveConfig::Emulated(e)) = (write_cache, d) {
            e.write_cache = Some(WriteCacheConfig::default());
        }
    }
    for dp in cfg.datapaths.values_mut() {
        match dp {
            DataPathConfig::LocalNvme(l) => l.execution = Execution::Gpu,
            DataPathConfig::StripedLocalNvme(s) => s.execution = Execution::Gpu,
            _ => {}
        }
    }
    match Runtime::from_config(cfg) {
        Ok(rt) => Some(Arc::new(rt)),
        Err(e @ tutti::Error::Gpu { .. }) => {
            eprintln!("skipped: {}", tutti::error_chain(&e));
            None
        }
        Err(e) => panic!("{}", tutti::error_chain(&e)),
    }
}

#[test]
fn objects_in_gpu_memory_round_trip_verified_by_the_kernel() {
    let Some(rt) = gpu_runtime(2) else { return };
    round_trip(rt);
}

#[test]
fn commit_rounds_flush_gpu_executed_drives_with_a_write_cache() {
    let Some(rt) = gpu_runtime_with(2, true) else { return };
    assert!(rt.store_info("kv").unwrap().volatile_write_cache);
    let commands = |rt: &Runtime| -> u64 {
        rt.drive_names().iter().map(|d| rt.emulator(d).unwrap().stats().commands).sum()
    };
    let before = commands(&rt);
    round_trip(rt.clone());
    // 8 puts in one round: 2 Flushes per drive, besides the data.
    assert!(commands(&rt) - before > 4, "the round's Flushes reached the drives");
    for d in rt.drive_names() {
        let r = rt.emulator(&d).unwrap().power_fail();
        assert_eq!(r.lost_blocks, 0, "drive {d}: everything acknowledged was flushed: {r:?}");
    }
}

/// A payload byte flipped on the media: the get into GPU memory (whose
/// checksum kernel runs once the load has ended) reports a mismatch
/// with the stored and the computed CRC, and the CPU's CRC of the bytes
/// that arrived is the computed one.
#[test]
fn a_flipped_payload_byte_loaded_into_gpu_memory_is_a_checksum_mismatch() {
    let Some(rt) = gpu_runtime(1) else { return };
    let gpu = rt.gpu().expect("a GPU runtime has a GPU").clone();
    let kv = KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap();
    let buf = GpuBuffer::zeroed(&gpu, OBJ).unwrap();
    let mut data = vec![0u8; OBJ];
    fill(&mut data, 77, 1);
    buf.copy_in(0, &data).unwrap();
    // SAFETY: `buf` outlives the registration and is written only by the
    // store's I/O while registered.
    #[allow(unsafe_code)]
    let m = unsafe { kv.register_gpu(buf.device_ptr(), OBJ).unwrap() };
    let v = Value { memory: &m, offset: 0, len: OBJ as u64 };
    assert_eq!(kv.put_sync(&[Put { key: key(77), value: v }], T).unwrap(), vec![ItemStatus::Ok]);
    // The payload on the one drive: the 4 KiB-aligned block that starts
    // with its first bytes (the pattern does not repeat).
    let emu = rt.emulator(&rt.drive_names()[0]).unwrap();
    let mut media = vec![0u8; 64 << 20];
    emu.read_media(1, 0, &mut media).unwrap();
    let at = (0..media.len() / 4096)
        .map(|b| b * 4096)
        .find(|&o| media[o..o + 4096] == data[..4096])
        .expect("the payload is on the media");
    let flip = at + OBJ / 2 + 3;
    emu.write_media(1, flip as u64, &[media[flip] ^ 0x10]).unwrap();
    buf.copy_in(0, &vec![0u8; OBJ]).unwrap();
    let st = kv.get_sync(&[Get { key: key(77), into: v }], T).unwrap();
    let mut back = vec![0u8; OBJ];
    buf.copy_out(0, &mut back).unwrap();
    assert_eq!(back[OBJ / 2 + 3], data[OBJ / 2 + 3] ^ 0x10, "the flipped byte arrived");
    let want =
        ItemStatus::ChecksumMismatch { stored: crc32c::crc32c(&data), computed: crc32c::crc32c(&back) };
    assert_eq!(st, vec![want]);
    kv.unregister(m).unwrap();
}

/// A get into GPU memory dropped without a wait (its checksum queued behind
/// its load): the store lets the memory go once the load has ended, and
/// the next get of the same object is a verified hit.
#[test]
fn a_dropped_get_into_gpu_memory_releases_it_after_its_load() {
    let Some(rt) = gpu_runtime(2) else { return };
    let gpu = rt.gpu().expect("a GPU runtime has a GPU").clone();
    let kv = KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap();
    let (src, dst) = (GpuBuffer::zeroed(&gpu, OBJ).unwrap(), GpuBuffer::zeroed(&gpu, OBJ).unwrap());
    let mut data = vec![0u8; OBJ];
    fill(&mut data, 5, 2);
    src.copy_in(0, &data).unwrap();
    // SAFETY: both buffers outlive their registrations.
    #[allow(unsafe_code)]
    let (ms, md) = unsafe {
        (kv.register_gpu(src.device_ptr(), OBJ).unwrap(), kv.register_gpu(dst.device_ptr(), OBJ).unwrap())
    };
    let put = Put { key: key(5), value: Value { memory: &ms, offset: 0, len: OBJ as u64 } };
    assert_eq!(kv.put_sync(&[put], T).unwrap(), vec![ItemStatus::Ok]);
    let get = Get { key: key(5), into: Value { memory: &md, offset: 0, len: OBJ as u64 } };
    drop(kv.get(&[get]).unwrap());
    let st = kv.get_sync(&[get], T).unwrap();
    assert_eq!(st, vec![ItemStatus::Hit { len: OBJ as u64 }]);
    let mut back = vec![0u8; OBJ];
    dst.copy_out(0, &mut back).unwrap();
    assert!(back == data);
    // The orphan's load has ended: its memory is free within the bound.
    let end = std::time::Instant::now() + BOUND;
    let mut md = Some(md);
    while let Some(m) = md.take() {
        match kv.unregister(m) {
            Ok(()) => {}
            Err(tutti_kv::KvError::MemoryInUse) if std::time::Instant::now() < end => {
                std::thread::sleep(std::time::Duration::from_millis(1));
                md = Some(m);
            }
            Err(e) => panic!("{e}"),
        }
    }
    kv.unregister(ms).unwrap();
}

/// Puts 8 objects from GPU memory, gets them back into GPU and host memory.
fn round_trip(rt: Arc<Runtime>) {
    let gpu = rt.gpu().expect("a GPU runtime has a GPU").clone();
    let kv = KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap();
    let (src, dst) = (GpuBuffer::zeroed(&gpu, 8 * OBJ).unwrap(), GpuBuffer::zeroed(&gpu, 8 * OBJ).unwrap());
    let mut host = vec![0u8; 8 * OBJ];
    for i in 0..8 {
        fill(&mut host[i * OBJ..(i + 1) * OBJ], i as u64, 1);
    }
    src.copy_in(0, &host).unwrap();
    // SAFETY: both buffers outlive their registrations (unregistered at the
    // end of the test) and are not written while I/O runs.
    #[allow(unsafe_code)]
    let (ms, md) = unsafe {
        (
            kv.register_gpu(src.device_ptr(), 8 * OBJ).unwrap(),
            kv.register_gpu(dst.device_ptr(), 8 * OBJ).unwrap(),
        )
    };
    // Lengths that are not multiples of 8 or of the block size too.
    let len = |i: usize| (OBJ - i * 4099) as u64;
    let puts: Vec<Put> = (0..8)
        .map(|i| Put {
            key: key(i as u64),
            value: Value { memory: &ms, offset: (i * OBJ) as u64, len: len(i) },
        })
        .collect();
    assert!(kv.put_sync(&puts, T).unwrap().iter().all(|s| *s == ItemStatus::Ok));
    let gets: Vec<Get> = (0..8)
        .map(|i| Get {
            key: key(i as u64),
            into: Value { memory: &md, offset: ((7 - i) * OBJ) as u64, len: OBJ as u64 },
        })
        .collect();
    let st = kv.get_sync(&gets, T).unwrap();
    assert!(st.iter().enumerate().all(|(i, s)| *s == ItemStatus::Hit { len: len(i) }), "{st:?}");
    let mut back = vec![0u8; 8 * OBJ];
    dst.copy_out(0, &mut back).unwrap();
    for i in 0..8 {
        let n = len(i) as usize;
        assert!(back[(7 - i) * OBJ..(7 - i) * OBJ + n] == host[i * OBJ..i * OBJ + n], "object {i}");
    }
    // Put from GPU memory (kernel CRC), get into host memory (CPU CRC).
    let mut hbuf = vec![0u8; OBJ];
    // SAFETY: `hbuf` outlives the registration and is untouched during I/O.
    #[allow(unsafe_code)]
    let mh = unsafe { kv.register_host(hbuf.as_mut_ptr(), OBJ).unwrap() };
    let st = kv.get_sync(&[Get { key: key(3), into: Value { memory: &mh, offset: 0, len: OBJ as u64 } }], T);
    assert_eq!(st.unwrap(), vec![ItemStatus::Hit { len: len(3) }]);
    assert!(hbuf[..len(3) as usize] == host[3 * OBJ..3 * OBJ + len(3) as usize]);
    for m in [ms, md, mh] {
        kv.unregister(m).unwrap();
    }
}

// Put batches of GPU memory in flight together, as the engine's save does
// (`KvCacheClient.save`: one batch per layer and tensor, 4 layers, none
// waited before the last is issued). On the H200 (2026-12-01) every item
// of such a save came back Timeout after 30 s and its memory stayed
// pinned: a batch's checksum and launch (CUDA allocations and frees) made
// while the previous batch's I/O kernel ran stalled the emulator's copies
// that kernel waited on, until each command's 10 s budget ended.

/// Everything of one test must be done within this (far under the 10 s
/// GPU command budget: a stall fails instead of passing slowly).
const BOUND: std::time::Duration = std::time::Duration::from_secs(5);
/// Layers x tensors: one GPU region (and one put batch) each.
const BATCHES: usize = 8;
/// Items per batch (40 objects in all: the 64 MiB drive has 1 MiB slots).
const ITEMS: usize = 5;
/// Bytes of room per item (the engine's paged blocks are 8-16 KiB).
const ROOM: usize = 16 << 10;

/// Length of item `j` of a batch: 8-16 KiB, not all block multiples.
fn item_len(j: usize) -> u64 {
    (8 << 10) + (j as u64) * 1021
}

#[test]
fn gpu_put_batches_in_flight_together_then_each_waited_finish_within_the_bound() {
    let Some(rt) = gpu_runtime(1) else { return };
    puts_and_gets_in_flight(rt);
}

#[test]
fn gpu_put_batches_in_flight_together_with_flushing_commit_rounds() {
    let Some(rt) = gpu_runtime_with(1, true) else { return };
    puts_and_gets_in_flight(rt);
}

/// `BATCHES` put batches in flight, each waited on; then as many get
/// batches into other GPU buffers, waited last first; bytes compared; every
/// registration let go.
fn puts_and_gets_in_flight(rt: Arc<Runtime>) {
    let gpu = rt.gpu().expect("a GPU runtime has a GPU").clone();
    let kv = KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap();
    let bufs = |n| (0..n).map(|_| GpuBuffer::zeroed(&gpu, ITEMS * ROOM).unwrap()).collect::<Vec<_>>();
    let (src, dst) = (bufs(BATCHES), bufs(BATCHES));
    let mut host = vec![vec![0u8; ITEMS * ROOM]; BATCHES];
    for (b, h) in host.iter_mut().enumerate() {
        fill(h, b as u64, 7);
        src[b].copy_in(0, h).unwrap();
    }
    // SAFETY: the buffers outlive their registrations (unregistered at the
    // end) and are written only by the store's gets while I/O runs.
    #[allow(unsafe_code)]
    let reg = |b: &GpuBuffer| unsafe { kv.register_gpu(b.device_ptr(), b.len()).unwrap() };
    let (ms, md): (Vec<_>, Vec<_>) = (src.iter().map(reg).collect(), dst.iter().map(reg).collect());
    let key_of = |b: usize, j: usize| key((b * ITEMS + j) as u64);
    let start = std::time::Instant::now();
    let puts: Vec<_> = (0..BATCHES)
        .map(|b| {
            let items: Vec<Put> = (0..ITEMS)
                .map(|j| Put {
                    key: key_of(b, j),
                    value: Value { memory: &ms[b], offset: (j * ROOM) as u64, len: item_len(j) },
                })
                .collect();
            kv.put(&items).unwrap()
        })
        .collect();
    for (b, p) in puts.into_iter().enumerate() {
        let st = kv.wait_put(p, BOUND).unwrap();
        assert!(st.iter().all(|s| *s == ItemStatus::Ok), "put batch {b}: {st:?}");
    }
    let gets: Vec<_> = (0..BATCHES)
        .map(|b| {
            let items: Vec<Get> = (0..ITEMS)
                .map(|j| Get {
                    key: key_of(b, j),
                    into: Value { memory: &md[b], offset: (j * ROOM) as u64, len: ROOM as u64 },
                })
                .collect();
            kv.get(&items).unwrap()
        })
        .collect();
    for (b, g) in gets.into_iter().enumerate().rev() {
        let st = kv.wait_get(g, BOUND).unwrap();
        let want: Vec<_> = (0..ITEMS).map(|j| ItemStatus::Hit { len: item_len(j) }).collect();
        assert_eq!(st, want, "get batch {b}");
    }
    assert!(start.elapsed() < BOUND, "{BATCHES} put and get batches took {:?}", start.elapsed());
    for (b, h) in host.iter().enumerate() {
        let mut back = vec![0u8; ITEMS * ROOM];
        dst[b].copy_out(0, &mut back).unwrap();
        for j in 0..ITEMS {
            let r = j * ROOM..j * ROOM + item_len(j) as usize;
            assert!(back[r.clone()] == h[r], "batch {b} item {j}: bytes differ");
        }
    }
    // The engine's symptom: its memory was still in use after the save.
    for m in ms.into_iter().chain(md) {
        kv.unregister(m).unwrap();
    }
}
