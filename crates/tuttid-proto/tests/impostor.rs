//! A client checks who serves the daemon's socket (SO_PEERCRED) before it
//! sends anything: an impostor bound at the path while the daemon is down
//! gets no byte and no memfd (issue 24).

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::time::Duration;

use tuttid_proto::{Client, ClientError, DaemonUid};

/// A listener at a fresh path that records what the connecting client sent
/// before closing; returns the path and a handle yielding those bytes.
fn listener() -> (tempfile::TempDir, std::path::PathBuf, std::thread::JoinHandle<Vec<u8>>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tutti.sock");
    let l = UnixListener::bind(&path).expect("bind");
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    });
    (dir, path, h)
}

#[test]
fn a_socket_served_by_another_uid_is_refused_before_anything_is_sent() {
    let me = rustix_uid();
    let other = if me == 4242 { 4343 } else { 4242 };
    let (_dir, path, h) = listener();
    let e = Client::connect_trusting(&path, DaemonUid::Is(other)).expect_err("an impostor must be refused");
    match &e {
        ClientError::Impostor { uid, expected, .. } => {
            assert_eq!(*uid, me);
            assert!(expected.contains(&other.to_string()), "{expected}");
        }
        other => panic!("expected Impostor, got {other:?}"),
    }
    assert!(e.to_string().contains("impostor"), "{e}");
    // The client closed without a single byte: no Hello, no memfd.
    assert!(h.join().expect("listener").is_empty());
}

#[test]
fn the_default_trusts_root_or_the_clients_own_uid() {
    // Our own listener runs as our uid: the default lets the client talk
    // (it then fails on the reply, since this is not a daemon).
    let (_dir, path, h) = listener();
    let e = Client::connect_trusting(&path, DaemonUid::RootOrSelf).expect_err("not a daemon");
    assert!(!matches!(e, ClientError::Impostor { .. }), "{e:?}");
    assert!(!h.join().expect("listener").is_empty(), "the Hello was sent");
}

fn rustix_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}
