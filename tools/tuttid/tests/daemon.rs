//! The daemon end to end: `tuttid` with four emulated drives, client
//! processes (this binary re-run as `client_role`) doing verified striped
//! I/O on granted queues, SIGKILLed clients reclaimed, a restarted daemon.

mod common;

use std::time::Duration;

use common::*;

/// The client process body; a no-op unless run by a test as a client.
#[test]
fn client_role() {
    if std::env::var("TUTTID_TEST_ROLE").as_deref() == Ok("client") {
        std::process::exit(client_main());
    }
}

#[test]
fn four_clients_stripe_concurrently_on_disjoint_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &config_yaml(&dir.path().join("tutti.sock"), 3000, ""));
    stripe_verified(&d.socket, dir.path(), 4, 6);
    let s = assert_all_reclaimed(&d.socket);
    assert!(s.reclaimed >= 4);
}

#[test]
fn sigkilled_clients_are_reclaimed_and_others_never_notice() {
    let dir = tempfile::tempdir().unwrap();
    // The victims' range (regions 2 and 3: slots 8..16, bytes 1..2 MiB of
    // the stripe, LBAs 64..128 of each drive) never completes, so a killed
    // victim always leaves commands in flight, which Delete I/O SQ must
    // abort before its memory is unmapped.
    let faults = "faults: [ { lba: [64, 128], action: never_complete } ], ";
    let yaml = config_yaml_timed(&dir.path().join("tutti.sock"), 3000, "", faults);
    let d = Daemon::start(dir.path(), &yaml);
    let mut steady: Vec<_> = (0..2).map(|r| spawn_client(&d.socket, dir.path(), r, 0)).collect();
    for k in &mut steady {
        assert_eq!(wait_line(k, "ready").trim(), "ready");
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..100u64 {
        let mut victim = spawn_client(&d.socket, dir.path(), 2 + round % 2, 0);
        assert_eq!(wait_line(&mut victim, "ready").trim(), "ready", "victim {round} did not start");
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_micros(10_000 + seed % 30_000));
        victim.kill().unwrap(); // SIGKILL, mid-I/O
        victim.wait().unwrap();
    }
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    for (r, k) in steady.iter_mut().enumerate() {
        let line = wait_line(k, "verified");
        let st = k.wait().unwrap();
        assert!(st.success() && !line.is_empty(), "steady client {r} saw an error: {st:?} {line:?}");
    }
    let s = assert_all_reclaimed(&d.socket);
    assert!(s.reclaimed >= 102, "{s:?}");
    let aborted: u64 = s.drives.iter().map(|d| d.sq_deletion_aborts).sum();
    assert!(aborted > 0, "no kill landed mid-I/O: {s:?}");
    eprintln!(
        "100 kills: commands aborted by SQ deletion per drive: {:?}",
        s.drives.iter().map(|d| d.sq_deletion_aborts).collect::<Vec<_>>()
    );
}

#[test]
fn restarted_daemon_fails_clients_closed_and_they_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config_yaml(&dir.path().join("tutti.sock"), 600, "");
    let mut d = Daemon::start(dir.path(), &yaml);
    let mut live = spawn_client(&d.socket, dir.path(), 0, 0);
    assert_eq!(wait_line(&mut live, "ready").trim(), "ready");
    std::thread::sleep(Duration::from_millis(200));
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let line = wait_line(&mut live, "failed");
    let st = live.wait().unwrap();
    assert_eq!(
        st.code(),
        Some(EXIT_ERROR),
        "a client of a dead daemon must fail with an error, not wrong data: {line}"
    );
    drop(d);
    let d = Daemon::start(dir.path(), &yaml);
    let mut again = spawn_client(&d.socket, dir.path(), 0, 2);
    let line = wait_line(&mut again, "verified");
    assert!(again.wait().unwrap().success(), "reconnect failed: {line}");
    assert_all_reclaimed(&d.socket);
}
