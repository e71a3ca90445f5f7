//! The runtime's `daemon` drive checks who serves the socket before it
//! sends anything (SO_PEERCRED against `daemon_uid`; issue 24).

mod common;

use common::*;

#[test]
fn a_daemon_drive_refuses_a_socket_served_by_another_uid_and_accepts_the_configured_one() {
    let me = rustix::process::geteuid().as_raw();
    let other = if me == 4242 { 4343 } else { 4242 };
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &config_yaml(&dir.path().join("tutti.sock"), 3000, ""));
    // The real daemon runs as this test's uid; a client pinned to another
    // uid takes it for an impostor and sends it nothing.
    let pinned = client_yaml(&d.socket).replace(", drive: d", &format!(", daemon_uid: {other}, drive: d"));
    assert!(pinned.contains("daemon_uid"), "{pinned}");
    let e = tutti::Runtime::from_config(tutti::Config::from_yaml_str(&pinned).unwrap())
        .expect_err("a daemon of another uid must be refused");
    let chain = tutti::error_chain(&e);
    assert!(chain.contains("impostor") && chain.contains(&format!("not uid {other}")), "{chain}");
    // Pinned to the uid it really runs as: accepted.
    let right = client_yaml(&d.socket).replace(", drive: d", &format!(", daemon_uid: {me}, drive: d"));
    let rt =
        tutti::Runtime::from_config(tutti::Config::from_yaml_str(&right).unwrap()).expect("the right uid");
    drop(rt);
}
