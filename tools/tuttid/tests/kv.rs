//! tutti-kv over drives that `tuttid` owns: the store formats, puts, gets
//! (every byte and checksum verified) and recovers after a restart of the
//! client, all on granted queues, with its object memory in shared memory.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tutti::{Config, Runtime, SharedMemory};
use tutti_kv::{ChunkKeys, Get, KeySize, KvStore, OpenOptions, Put, Value};

const OBJ: usize = 64 << 10;
const N: usize = 8;

fn store(socket: &std::path::Path) -> KvStore {
    let rt = Arc::new(Runtime::from_config(Config::from_yaml_str(&client_yaml(socket)).unwrap()).unwrap());
    KvStore::open(rt, &OpenOptions::new("kv")).unwrap()
}

#[test]
fn a_kv_store_on_daemon_drives_round_trips_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    round_trip_and_recover(dir.path(), &config_yaml(&dir.path().join("tutti.sock"), 3000, ""));
}

#[test]
fn a_kv_store_on_mediated_drives_round_trips_and_recovers() {
    // Every SQE tutti-kv issues (Read, Write, Flush, Write Zeroes) passes
    // the daemon's checks.
    let dir = tempfile::tempdir().unwrap();
    let yaml = config_yaml(&dir.path().join("tutti.sock"), 3000, "")
        .replace("    allow:", "    mediated: true\n    allow:");
    round_trip_and_recover(dir.path(), &yaml);
}

#[test]
fn a_kv_store_in_an_lba_partition_round_trips_and_recovers() {
    // The uid's partition (LBAs 512..2048 of each drive) is the namespace
    // the runtime and the store see: the superblock at its LBA 0.
    let dir = tempfile::tempdir().unwrap();
    let uid = rustix::process::getuid().as_raw();
    let part = format!(
        "    mediated: true\n    partitions: [ {{ uids: [{uid}], first_lba: 512, blocks: 1536 }} ]\n    allow:"
    );
    let yaml = config_yaml(&dir.path().join("tutti.sock"), 3000, "").replace("    allow:", &part);
    round_trip_and_recover(dir.path(), &yaml);
}

fn round_trip_and_recover(dir: &std::path::Path, yaml: &str) {
    let daemon = Daemon::start(dir, yaml);
    let keys = ChunkKeys::new(b"model", KeySize::B32).chain(&(0..N as u32 * 4).collect::<Vec<_>>(), 4);
    let t = Duration::from_secs(10);
    let data: Vec<u8> = (0..N * OBJ).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    {
        let kv = store(&daemon.socket);
        let src = SharedMemory::new(2 * N * OBJ).unwrap();
        src.write(0, &data).unwrap();
        // SAFETY: `src` outlives the registration (unregistered below) and
        // is not touched while I/O is in flight.
        #[allow(unsafe_code)]
        let mem = unsafe { kv.register_host(src.as_ptr(), src.len()) }.unwrap();
        let puts: Vec<Put<'_>> = (0..N)
            .map(|i| Put {
                key: keys[i],
                value: Value { memory: &mem, offset: (i * OBJ) as u64, len: OBJ as u64 },
            })
            .collect();
        kv.put_sync(&puts, t).unwrap();
        assert_eq!(kv.lookup_prefix(&keys), N);
        let gets: Vec<Get<'_>> = (0..N)
            .map(|i| Get {
                key: keys[i],
                into: Value { memory: &mem, offset: ((N + i) * OBJ) as u64, len: OBJ as u64 },
            })
            .collect();
        let st = kv.get_sync(&gets, t).unwrap();
        assert!(st.iter().all(|s| s.is_ok()), "{st:?}");
        let mut back = vec![0u8; N * OBJ];
        src.read(N * OBJ, &mut back).unwrap();
        assert!(back == data, "bytes read back through granted queues differ");
        kv.sync().unwrap();
        kv.unregister(mem).unwrap();
    }
    // A new client process-equivalent (new runtime, new connections):
    // the store is recovered from the daemon's drives.
    let kv = store(&daemon.socket);
    assert_eq!(kv.lookup_prefix(&keys), N, "objects put by the first client are found");
    let dst = SharedMemory::new(OBJ).unwrap();
    // SAFETY: as above.
    #[allow(unsafe_code)]
    let mem = unsafe { kv.register_host(dst.as_ptr(), dst.len()) }.unwrap();
    let st =
        kv.get_sync(&[Get { key: keys[N - 1], into: Value { memory: &mem, offset: 0, len: OBJ as u64 } }], t);
    assert!(st.unwrap()[0].is_ok());
    let mut back = vec![0u8; OBJ];
    dst.read(0, &mut back).unwrap();
    assert!(back == data[(N - 1) * OBJ..], "a recovered object's bytes differ");
    kv.unregister(mem).unwrap();
}
