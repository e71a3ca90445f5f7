//! Forwarded (shadow) doorbells without real drives: `tuttid` with four
//! emulated drives at CAP.DSTRD = 0 (the doorbell layout of real drives:
//! every queue's doorbells in one page) and `doorbells: forwarded`, so the
//! clients never see the emulator's register window: they write shadow
//! pages and the daemon's forwarding threads ring the controller. The same
//! client processes as `daemon.rs` (this binary re-run as `client_role`).

mod common;

use std::time::Duration;

use common::*;
use tuttid_proto::Client;

/// The client process body; a no-op unless run by a test as a client.
#[test]
fn client_role() {
    if std::env::var("TUTTID_TEST_ROLE").as_deref() == Ok("client") {
        std::process::exit(client_main());
    }
}

/// `config_yaml_timed` with every drive's doorbells forwarded.
fn forwarded_yaml(dir: &std::path::Path, emu_extra: &str) -> String {
    config_yaml_timed(&dir.join("tutti.sock"), 3000, "", emu_extra)
        .replace("    allow:", "    doorbells: forwarded\n    allow:")
}

#[test]
fn clients_stripe_through_forwarded_doorbells() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &forwarded_yaml(dir.path(), ""));
    let facts = Client::connect(&d.socket).unwrap().open_drive("d0").unwrap();
    assert_eq!(facts.dstrd, 9, "clients see the shadow layout, not the controller's DSTRD 0");
    stripe_verified(&d.socket, dir.path(), 4, 4);
    let s = assert_all_reclaimed(&d.socket);
    assert!(s.reclaimed >= 4);
}

#[test]
fn sigkilled_clients_of_forwarded_drives_are_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    // As daemon.rs's kill test, 20 rounds: the victims' LBAs never
    // complete, so each kill leaves commands for Delete I/O SQ to abort,
    // after forwarding of the victim's shadow page has stopped.
    let faults = "faults: [ { lba: [64, 128], action: never_complete } ], ";
    let d = Daemon::start(dir.path(), &forwarded_yaml(dir.path(), faults));
    let mut steady = spawn_client(&d.socket, dir.path(), 0, 0);
    assert_eq!(wait_line(&mut steady, "ready").trim(), "ready");
    for round in 0..20u64 {
        let mut victim = spawn_client(&d.socket, dir.path(), 2 + round % 2, 0);
        assert_eq!(wait_line(&mut victim, "ready").trim(), "ready", "victim {round} did not start");
        // Long enough for the forwarder to have passed the victim's SQ
        // tail on (it sleeps between passes when idle), so the kill finds
        // commands the controller holds.
        std::thread::sleep(Duration::from_millis(100 + round % 20));
        victim.kill().unwrap();
        victim.wait().unwrap();
    }
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    let line = wait_line(&mut steady, "verified");
    let st = steady.wait().unwrap();
    assert!(st.success() && !line.is_empty(), "steady client saw an error: {st:?} {line:?}");
    let s = assert_all_reclaimed(&d.socket);
    assert!(s.reclaimed >= 21, "{s:?}");
    assert!(s.drives.iter().map(|d| d.sq_deletion_aborts).sum::<u64>() > 0, "no kill landed mid-I/O: {s:?}");
}

/// A Read of one block at `slba` into `prp1`, command id `cid`, as the
/// 64 bytes of an SQE.
fn read_sqe(cid: u16, slba: u64, prp1: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0] = 0x02;
    b[2..4].copy_from_slice(&cid.to_le_bytes());
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    b[24..32].copy_from_slice(&prp1.to_le_bytes());
    b[40..48].copy_from_slice(&slba.to_le_bytes());
    b
}

/// Whether `c`'s connection ends within a few seconds.
fn lease_ends(c: &Client) -> bool {
    eventually(Duration::from_secs(5), || c.heartbeat().is_err().then_some(())).is_some()
}

#[test]
fn doorbell_values_past_the_rings_end_the_lease() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    // LBAs 64..128 never complete: commands there stay fetched but without
    // a completion, so the SQ head the controller reports stays put.
    let faults = "faults: [ { lba: [64, 128], action: never_complete } ], ";
    let d = Daemon::start(dir.path(), &forwarded_yaml(dir.path(), faults));

    // A CQ head past what the controller posted (nothing).
    let a = Client::connect(&d.socket).unwrap();
    let (_, [_sq, _cq, db]) = a.grant_queue("d0", 16).unwrap();
    std::fs::File::from(db).write_at(&3u32.to_le_bytes(), 2048).unwrap();
    assert!(lease_ends(&a), "a CQ head past the posted completions left the lease alive");

    // An SQ tail adding more entries than the SQ has free: 10 Reads that
    // never complete, then 11 more (21 > 15 usable slots).
    let b = Client::connect(&d.socket).unwrap();
    let shm = tuttid_proto::SharedMemory::new(4096).unwrap();
    let (_, iova, _) = b.register_memory("d0", shm.fd(), 0, 4096).unwrap();
    let (g, [sq, _cq, db]) = b.grant_queue("d0", 16).unwrap();
    assert_eq!(g.entries, 16);
    let (sq, db) = (std::fs::File::from(sq), std::fs::File::from(db));
    for i in 0..16u16 {
        sq.write_at(&read_sqe(i, 64, iova), u64::from(i) * 64).unwrap();
    }
    db.write_at(&10u32.to_le_bytes(), 0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(b.heartbeat().is_ok(), "ten entries of fifteen free are fine");
    db.write_at(&5u32.to_le_bytes(), 0).unwrap();
    assert!(lease_ends(&b), "an overflowing SQ tail left the lease alive");

    // Both were reclaimed (the ten held commands aborted by Delete I/O
    // SQ), and the drive serves verified I/O to the next client.
    let s = assert_all_reclaimed(&d.socket);
    assert!(s.drives[0].sq_deletion_aborts >= 10, "{s:?}");
    let mut k = spawn_client(&d.socket, dir.path(), 0, 1);
    let line = wait_line(&mut k, "verified");
    assert!(k.wait().unwrap().success() && !line.is_empty(), "{line:?}");
}
