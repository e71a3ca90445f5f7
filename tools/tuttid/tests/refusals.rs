//! Every refusal rule of the daemon, each named in its error: a uid not in
//! the allow list, a quota exceeded, a wrong protocol version, malformed
//! messages, queues and memory the client does not own, memory that is
//! not a sealed memfd, an unknown drive.

mod common;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use common::*;
use tuttid_proto::frame::{recv_frame, send_frame};
use tuttid_proto::{Client, ClientError, Request, Response, Rule, SharedMemory};

/// A drive only uid/gid 4242 may use (the test runs as another uid), and
/// a drive `q` with a quota of 2 queue pairs per uid.
fn locked_drive() -> String {
    let uid = rustix::process::getuid().as_raw();
    format!("  locked:\n    device: {{ emulated: {{ namespaces: [ {{ capacity: 4MiB, block_size: 4096 }} ] }} }}\n    allow: {{ uids: [4242], gids: [4242] }}\n  q:\n    device: {{ emulated: {{ namespaces: [ {{ capacity: 4MiB, block_size: 4096 }} ] }} }}\n    allow: {{ uids: [{uid}] }}\n    queues_per_client: 2\n")
}

fn rule_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Rule {
    match r {
        Err(ClientError::Refused { rule, detail }) => {
            assert!(!detail.is_empty());
            rule
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn refusals_name_their_rule() {
    assert_ne!(rustix::process::getuid().as_raw(), 4242, "the test needs a uid other than 4242");
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &config_yaml(&dir.path().join("tutti.sock"), 3000, &locked_drive()));
    let c = Client::connect(&d.socket).unwrap();

    // Allow list.
    assert_eq!(rule_of(c.open_drive("locked")), Rule::NotAllowed);
    assert_eq!(rule_of(c.grant_queue("locked", 16)), Rule::NotAllowed);
    // Unknown drive.
    assert_eq!(rule_of(c.open_drive("nope")), Rule::UnknownDrive);
    // Quota: 2 queue pairs per uid on q.
    let facts = c.open_drive("q").unwrap();
    assert_eq!((facts.quota_left, facts.dstrd), (2, 9));
    let (g1, _fds1) = c.grant_queue("q", 16).unwrap();
    let (g2, _fds2) = c.grant_queue("q", 16).unwrap();
    assert_ne!(g1.qid, g2.qid);
    assert_eq!(g1.doorbell_page, 0x1000 + u64::from(g1.qid) * 4096);
    assert_eq!(rule_of(c.grant_queue("q", 16)), Rule::Quota);
    // Queues and memory of someone else, or of nobody.
    let other = Client::connect(&d.socket).unwrap();
    // The quota is the uid's, not the connection's.
    assert_eq!(other.open_drive("q").unwrap().quota_left, 0);
    assert_eq!(rule_of(other.grant_queue("q", 16)), Rule::Quota);
    assert_eq!(rule_of(other.release_queue("q", g1.qid)), Rule::NotOwned);
    assert_eq!(rule_of(other.release_queue("q", 63)), Rule::NotOwned);
    let shm = SharedMemory::new(8192).unwrap();
    let (id, _, len) = c.register_memory("d1", shm.fd(), 0, 8192).unwrap();
    assert_eq!(len, 8192);
    assert_eq!(rule_of(other.unregister_memory(id)), Rule::NotOwned);
    assert_eq!(rule_of(other.unregister_memory(u64::MAX)), Rule::NotOwned);
    c.unregister_memory(id).unwrap();
    assert_eq!(rule_of(c.unregister_memory(id)), Rule::NotOwned);
    // Memory that is not a sealed memfd, or past its end, or misaligned.
    let unsealed = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&unsealed, 8192).unwrap();
    assert_eq!(rule_of(c.register_memory("d1", unsealed.as_fd(), 0, 8192)), Rule::BadMemory);
    assert_eq!(rule_of(c.register_memory("d1", shm.fd(), 4096, 8192)), Rule::BadMemory);
    assert_eq!(rule_of(c.register_memory("d1", shm.fd(), 1, 4096)), Rule::BadMemory);
    assert_eq!(rule_of(c.register_memory("locked", shm.fd(), 0, 4096)), Rule::NotAllowed);
    // Giving a queue back frees the quota.
    c.release_queue("q", g1.qid).unwrap();
    c.grant_queue("q", 16).unwrap();
    // The operator view shows both clients and their queues.
    let s = c.status().unwrap();
    assert!(s.clients.iter().any(|cl| cl.queues.len() == 2));
    assert!(s.clients.iter().all(|cl| cl.pid == std::process::id()));
}

#[test]
fn wrong_version_and_malformed_messages_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &config_yaml(&dir.path().join("tutti.sock"), 3000, ""));
    assert_eq!(rule_of(Client::connect_with_version(&d.socket, 99)), Rule::Version);

    let raw = |payload: &[u8]| {
        let s = UnixStream::connect(&d.socket).unwrap();
        send_frame(&s, payload, &[]).unwrap();
        (Response::decode(&recv_frame(&s).unwrap().payload).unwrap(), s)
    };
    // A request before Hello.
    let (r, _) = raw(&Request::Status.encode());
    assert!(matches!(r, Response::Refused { rule: Rule::HandshakeFirst, .. }), "{r:?}");
    // Garbage after a good Hello: refused, the connection stays usable.
    let (r, s) = raw(&Request::Hello { version: tuttid_proto::PROTOCOL_VERSION }.encode());
    assert!(matches!(r, Response::HelloOk { .. }));
    for bad in [&[0xFFu8, 1, 2][..], &[0x02, 0xFF, 0xFF], &[0x07, 0]] {
        send_frame(&s, bad, &[]).unwrap();
        let r = Response::decode(&recv_frame(&s).unwrap().payload).unwrap();
        assert!(matches!(r, Response::Refused { rule: Rule::Malformed, .. }), "{bad:?}: {r:?}");
    }
    // A descriptor on a message that takes none.
    let shm = SharedMemory::new(4096).unwrap();
    send_frame(&s, &Request::Heartbeat.encode(), &[shm.fd()]).unwrap();
    let r = Response::decode(&recv_frame(&s).unwrap().payload).unwrap();
    assert!(matches!(r, Response::Refused { rule: Rule::Malformed, .. }), "{r:?}");
    send_frame(&s, &Request::Heartbeat.encode(), &[]).unwrap();
    assert_eq!(Response::decode(&recv_frame(&s).unwrap().payload).unwrap(), Response::Done);
    // A broken frame header: refused, then the connection is closed.
    use std::io::Write;
    (&s).write_all(b"JUNKJUNK").unwrap();
    let r = Response::decode(&recv_frame(&s).unwrap().payload).unwrap();
    assert!(matches!(r, Response::Refused { rule: Rule::Malformed, .. }), "{r:?}");
    assert!(recv_frame(&s).is_err());
    // The daemon still serves others.
    assert!(Client::connect(&d.socket).unwrap().status().is_ok());
}

#[test]
fn socket_file_mode_follows_the_config() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &config_yaml(&dir.path().join("tutti.sock"), 3000, ""));
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
}

#[test]
fn sparse_memfds_are_refused_fast_and_others_are_still_served() {
    use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &config_yaml(&dir.path().join("tutti.sock"), 3000, ""));
    let attacker = Client::connect(&d.socket).unwrap();
    let victim = Client::connect(&d.socket).unwrap();
    let t = std::time::Instant::now();
    for _ in 0..4 {
        let big = memfd_create("sparse", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        ftruncate(&big, 1 << 40).unwrap();
        fcntl_add_seals(&big, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        match attacker.register_memory("d0", big.as_fd(), 0, 1 << 40) {
            Err(ClientError::Refused { rule: Rule::BadMemory, detail }) => {
                assert!(detail.contains("sparse"), "{detail}")
            }
            other => panic!("a sparse 1 TiB memfd must be refused, got {other:?}"),
        }
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(2), "refusals took {:?}", t.elapsed());
    // Sealed against shrinking only: refused too (F_SEAL_GROW required).
    let loose = memfd_create("loose", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    ftruncate(&loose, 4096).unwrap();
    fcntl_add_seals(&loose, SealFlags::SHRINK).unwrap();
    assert_eq!(rule_of(attacker.register_memory("d0", loose.as_fd(), 0, 4096)), Rule::BadMemory);
    // The other client is served at once, and nothing stayed registered.
    let t = std::time::Instant::now();
    let shm = SharedMemory::new(1 << 20).unwrap();
    let (id, _, _) = victim.register_memory("d0", shm.fd(), 0, 1 << 20).unwrap();
    victim.grant_queue("d0", 16).unwrap();
    assert!(t.elapsed() < std::time::Duration::from_secs(1), "victim waited {:?}", t.elapsed());
    let s = victim.status().unwrap();
    assert_eq!(s.drives.iter().map(|x| x.registrations).sum::<u32>(), 1, "{s:?}");
    victim.unregister_memory(id).unwrap();
}
