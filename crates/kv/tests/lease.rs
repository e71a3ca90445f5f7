//! One writer per store across runtimes and processes: the lease block on
//! the media (docs/kv-store.md, "One writer per store").

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{drive_file, file_runtime, fill, key, Buf, T};
use tutti_kv::{
    Access, Get, HolderPlace, ItemStatus, KvError, KvStore, LeaseOptions, OpenOptions, Put, Value,
};

/// Byte offset of the lease block in drive 0's file (logical block 1 of
/// the store, which starts at the drive's LBA 0).
const LEASE_AT: u64 = 4096;

fn rt(dir: &Path) -> Arc<tutti::Runtime> {
    file_runtime(dir, 1, 8, "64KiB")
}

fn opts(access: Access) -> OpenOptions {
    OpenOptions { access, ..OpenOptions::new("kv") }
}

fn put(kv: &KvStore, k: u64) -> Result<Vec<ItemStatus>, KvError> {
    let mut b = Buf::new(kv, 4096);
    fill(&mut b.bytes, k, 1);
    kv.put_sync(&[Put { key: key(k), value: Value { memory: b.mem(), offset: 0, len: 4096 } }], T)
}

fn get_ok(kv: &KvStore, k: u64) -> bool {
    let b = Buf::new(kv, 4096);
    let into = Value { memory: b.mem(), offset: 0, len: 4096 };
    let st = kv.get_sync(&[Get { key: key(k), into }], T).unwrap().remove(0);
    let mut want = vec![0u8; 4096];
    fill(&mut want, k, 1);
    st == ItemStatus::Hit { len: 4096 } && b.bytes == want
}

fn lease_block(dir: &Path) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    std::fs::File::open(drive_file(dir, 0)).unwrap().read_exact_at(&mut b, LEASE_AT).unwrap();
    b
}

fn write_lease_block(dir: &Path, b: &[u8]) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(drive_file(dir, 0))
        .unwrap()
        .write_all_at(b, LEASE_AT)
        .unwrap();
}

/// A lease block as another writer would write it (format/lease.rs).
fn foreign_lease(owner: u8, generation: u64, pid_ns: u64, renew_ms: u32) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[0..8].copy_from_slice(b"TUTTILSE");
    b[8..24].copy_from_slice(&[owner; 16]);
    b[24..32].copy_from_slice(&generation.to_le_bytes());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let hex: Vec<u8> = boot.bytes().filter(u8::is_ascii_hexdigit).collect();
    for (i, p) in hex.chunks_exact(2).enumerate() {
        b[32 + i] = u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap();
    }
    b[48..56].copy_from_slice(&pid_ns.to_le_bytes());
    b[56..60].copy_from_slice(&4242u32.to_le_bytes());
    b[60..68].copy_from_slice(&1u64.to_le_bytes());
    b[68..72].copy_from_slice(&renew_ms.to_le_bytes());
    let crc = crc32c::crc32c(&b[..72]);
    b[72..76].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Another PID namespace than this process's.
fn other_ns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").unwrap().ino() ^ 1
}

#[test]
fn a_second_runtime_is_refused_a_reader_reads_beside_the_writer_and_a_closed_store_opens_again() {
    let dir = tempfile::tempdir().unwrap();
    let (ra, rb) = (rt(dir.path()), rt(dir.path()));
    let a = KvStore::open(ra.clone(), &OpenOptions::new("kv")).unwrap();
    let lb = lease_block(dir.path());
    assert_eq!(&lb[0..8], b"TUTTILSE", "the lease is in logical block 1");
    assert_eq!(u32::from_le_bytes(lb[56..60].try_into().unwrap()), std::process::id());
    assert_eq!(put(&a, 1).unwrap(), vec![ItemStatus::Ok]);
    match KvStore::open(rb.clone(), &OpenOptions::new("kv")) {
        Err(KvError::Leased { store, holder }) => {
            assert_eq!(store, "kv");
            assert_eq!(holder.pid, std::process::id());
            assert_eq!(holder.place, HolderPlace::ThisProcess);
        }
        other => panic!("a second writer: {other:?}"),
    }
    let r = KvStore::open(rb.clone(), &opts(Access::ReadOnly)).unwrap();
    assert_eq!(r.access(), Access::ReadOnly);
    assert!(get_ok(&r, 1), "a reader sees what the writer put before it opened");
    assert!(matches!(put(&r, 2), Err(KvError::ReadOnly(ref s)) if s == "kv"));
    assert!(matches!(r.sync(), Err(KvError::ReadOnly(_))));
    drop(r);
    drop(a);
    assert_eq!(&lease_block(dir.path())[8..24], &[0u8; 16], "a closed store frees its lease");
    let b = KvStore::open(rb, &OpenOptions::new("kv")).unwrap();
    assert!(get_ok(&b, 1));
    assert_eq!(put(&b, 2).unwrap(), vec![ItemStatus::Ok]);
}

#[test]
fn a_reader_never_formats_a_blank_store() {
    let dir = tempfile::tempdir().unwrap();
    let e = KvStore::open(rt(dir.path()), &opts(Access::ReadOnly)).unwrap_err();
    assert!(matches!(e, KvError::Superblock { .. }), "{e}");
    assert!(lease_block(dir.path()).iter().all(|&x| x == 0), "a reader wrote the lease block");
}

#[test]
fn a_lease_this_process_left_behind_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let a = KvStore::open(rt(dir.path()), &OpenOptions::new("kv")).unwrap();
    assert_eq!(put(&a, 7).unwrap(), vec![ItemStatus::Ok]);
    let held = lease_block(dir.path());
    drop(a);
    // As if the store had vanished without freeing it (a power cut): this
    // process's lease, of an owner no store here holds.
    write_lease_block(dir.path(), &held);
    let b = KvStore::open(rt(dir.path()), &OpenOptions::new("kv")).unwrap();
    assert!(get_ok(&b, 7));
    assert_ne!(lease_block(dir.path())[8..24], held[8..24], "a new owner");
}

#[test]
fn a_holder_elsewhere_is_refused_while_it_renews_and_taken_over_after_expiry() {
    let dir = tempfile::tempdir().unwrap();
    drop(KvStore::open(rt(dir.path()), &OpenOptions::new("kv")).unwrap());
    let quick = LeaseOptions { expiry: Duration::from_millis(300), ..LeaseOptions::default() };
    let o = OpenOptions { lease: quick, ..OpenOptions::new("kv") };
    // Renewing every 50 ms from another PID namespace: refused.
    write_lease_block(dir.path(), &foreign_lease(9, 1, other_ns(), 50));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewer = {
        let (d, stop) = (dir.path().to_owned(), stop.clone());
        std::thread::spawn(move || {
            let mut g = 2;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                write_lease_block(&d, &foreign_lease(9, g, other_ns(), 50));
                g += 1;
            }
        })
    };
    let e = KvStore::open(rt(dir.path()), &o).unwrap_err();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    renewer.join().unwrap();
    match e {
        KvError::Leased { holder, .. } => {
            assert_eq!(holder.pid, 4242);
            assert_eq!(holder.place, HolderPlace::Elsewhere);
        }
        other => panic!("{other:?}"),
    }
    // The same holder, silent: taken over, not before the expiry.
    let t0 = Instant::now();
    let kv = KvStore::open(rt(dir.path()), &o).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(300), "taken over after {:?}", t0.elapsed());
    assert_eq!(put(&kv, 3).unwrap(), vec![ItemStatus::Ok]);
    // A holder elsewhere that never renews cannot be judged: refused.
    drop(kv);
    write_lease_block(dir.path(), &foreign_lease(9, 1, other_ns(), 0));
    assert!(matches!(KvStore::open(rt(dir.path()), &o), Err(KvError::Leased { .. })));
}

#[test]
fn a_writer_whose_lease_was_taken_over_writes_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let o = OpenOptions {
        lease: LeaseOptions { renew: Some(Duration::from_millis(50)), ..LeaseOptions::default() },
        ..OpenOptions::new("kv")
    };
    let kv = KvStore::open(rt(dir.path()), &o).unwrap();
    assert_eq!(put(&kv, 1).unwrap(), vec![ItemStatus::Ok]);
    write_lease_block(dir.path(), &foreign_lease(5, 1, other_ns(), 1000));
    let t0 = Instant::now();
    loop {
        match put(&kv, 2) {
            Err(KvError::LeaseLost(s)) => {
                assert_eq!(s, "kv");
                break;
            }
            Ok(_) if t0.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("after the takeover: {other:?}"),
        }
    }
    assert!(matches!(kv.sync(), Err(KvError::LeaseLost(_))));
    drop(kv);
    assert_eq!(
        lease_block(dir.path()),
        foreign_lease(5, 1, other_ns(), 1000),
        "the new holder's lease is left alone"
    );
}

#[test]
fn of_writers_opening_at_once_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    drop(KvStore::open(rt(dir.path()), &OpenOptions::new("kv")).unwrap());
    let mut rounds_won = 0;
    for round in 0..8 {
        let n = 4;
        let runtimes: Vec<_> = (0..n).map(|_| rt(dir.path())).collect();
        let go = Arc::new(Barrier::new(n));
        let handles: Vec<_> = runtimes
            .into_iter()
            .map(|r| {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    KvStore::open(r, &OpenOptions::new("kv"))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let won = results.iter().filter(|r| r.is_ok()).count();
        for r in &results {
            if let Err(e) = r {
                assert!(
                    matches!(e, KvError::Leased { .. } | KvError::LeaseContended(_)),
                    "round {round}: {e}"
                );
            }
        }
        assert!(won <= 1, "round {round}: {won} writers hold the store at once");
        // A round where every opener backed off (contended) is allowed;
        // none where two won.
        rounds_won += won;
    }
    assert!(rounds_won > 0, "no opener ever won");
}

/// Run by `a_writer_in_another_process_is_refused_until_it_dies` in a
/// child process: holds the store until killed.
#[test]
#[ignore = "a child process of another test"]
fn child_holds_the_store() {
    let Ok(dir) = std::env::var("TUTTI_KV_LEASE_CHILD_DIR") else { return };
    let kv = KvStore::open(rt(Path::new(&dir)), &OpenOptions::new("kv")).unwrap();
    assert_eq!(put(&kv, 11).unwrap(), vec![ItemStatus::Ok]);
    println!("\nLEASE-HELD");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_writer_in_another_process_is_refused_until_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_holds_the_store", "--ignored", "--nocapture", "--test-threads=1"])
        .env("TUTTI_KV_LEASE_CHILD_DIR", dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "LEASE-HELD" {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended before holding the store");
    }
    match KvStore::open(rt(dir.path()), &OpenOptions::new("kv")) {
        Err(KvError::Leased { holder, .. }) => {
            assert_eq!(holder.pid, child.id());
            assert_eq!(holder.place, HolderPlace::ThisHost);
        }
        other => panic!("while the child holds it: {other:?}"),
    }
    let r = KvStore::open(rt(dir.path()), &opts(Access::ReadOnly)).unwrap();
    assert!(get_ok(&r, 11), "a reader here sees the child's put");
    drop(r);
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = out.read_to_string(&mut String::new());
    let kv = KvStore::open(rt(dir.path()), &OpenOptions::new("kv")).expect("the holder died");
    assert!(get_ok(&kv, 11));
}

#[test]
fn a_store_that_outlives_its_runtimes_shutdown_frees_its_lease_at_the_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let ra = rt(dir.path());
    let a = KvStore::open(ra.clone(), &OpenOptions::new("kv")).unwrap();
    assert_eq!(put(&a, 4).unwrap(), vec![ItemStatus::Ok]);
    ra.shutdown(Duration::from_secs(1));
    assert_eq!(&lease_block(dir.path())[8..24], &[0u8; 16], "freed at the shutdown, the store still alive");
    let b = KvStore::open(rt(dir.path()), &OpenOptions::new("kv")).expect("the first runtime is shut down");
    assert!(get_ok(&b, 4));
    drop(a);
    assert_ne!(
        &lease_block(dir.path())[8..24],
        &[0u8; 16],
        "dropping the old store leaves the new lease alone"
    );
    assert_eq!(put(&b, 5).unwrap(), vec![ItemStatus::Ok]);
}
