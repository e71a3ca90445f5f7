//! A daemon started in-process on a virtual clock (`Server::start_on`, as
//! the `tuttid_session` fuzz target runs it): its emulated drives have no
//! controller thread, the driver's waits (bring-up, queue create and
//! delete) step them, and each drive's forwarding thread steps its drive
//! after every pass. Clients (this binary re-run as `client_role`) still
//! get verified striped I/O, and everything is reclaimed after them.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use nvm_queue::VirtualClock;

/// The client process body; a no-op unless run by a test as a client.
#[test]
fn client_role() {
    if std::env::var("TUTTID_TEST_ROLE").as_deref() == Ok("client") {
        std::process::exit(client_main());
    }
}

/// A daemon in this process, on a virtual clock, until dropped.
struct InProcess {
    server: Arc<tuttid::Server>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcess {
    fn start(yaml: &str, clock: Arc<VirtualClock>) -> Self {
        let cfg = tuttid::DaemonConfig::from_yaml(yaml).unwrap();
        let server = tuttid::Server::start_on(&cfg, clock).unwrap();
        let listener = tuttid::bind(&cfg.socket, 0o600, None).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (server.clone(), stop.clone());
        let thread = Some(std::thread::spawn(move || s.run(&listener, &st)));
        InProcess { server, stop, thread }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Four clients of the four drives of `yaml` (emulated, on a virtual
/// clock) each verify 4 rounds of striped I/O; then everything is
/// reclaimed, no DMA fault, and the drives' time was virtual.
fn clients_are_served(dir: &Path, yaml: &str) {
    let clock = VirtualClock::new();
    let d = InProcess::start(yaml, clock.clone());
    let socket = dir.join("tutti.sock");
    stripe_verified(&socket, dir, 4, 4);
    let s = assert_all_reclaimed(&socket);
    assert!(s.reclaimed >= 4, "{s:?}");
    for r in &s.drives {
        assert!(r.forwarding.doorbells_forwarded > 0, "{r:?}");
    }
    assert_eq!(d.server.status().drives.len(), 4);
    assert!(clock.elapsed() > Duration::ZERO, "the drives ran on the virtual clock");
}

#[test]
fn forwarded_drives_on_a_virtual_clock_serve_clients() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config_yaml(&dir.path().join("tutti.sock"), 3000, "")
        .replace("    allow:", "    doorbells: forwarded\n    allow:");
    clients_are_served(dir.path(), &yaml);
}

#[test]
fn mediated_drives_on_a_virtual_clock_serve_clients() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config_yaml(&dir.path().join("tutti.sock"), 3000, "")
        .replace("    allow:", "    mediated: true\n    allow:");
    clients_are_served(dir.path(), &yaml);
}

#[test]
fn only_emulated_drives_with_forwarded_doorbells_run_on_a_virtual_clock() {
    let dir = tempfile::tempdir().unwrap();
    // Doorbell pages written by clients straight into the emulator: no
    // forwarding thread would step it.
    let yaml = config_yaml(&dir.path().join("tutti.sock"), 3000, "");
    let cfg = tuttid::DaemonConfig::from_yaml(&yaml).unwrap();
    let e = tuttid::Server::start_on(&cfg, VirtualClock::new()).expect_err("nothing would step the drive");
    assert!(e.to_string().contains("virtual clock"), "{e}");
}
