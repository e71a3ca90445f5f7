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
