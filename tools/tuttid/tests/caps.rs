//! Caps per uid, not per connection: one uid's queue quota holds across
//! all its connections and its connections are capped, so more
//! connections do not drain a drive's queue pool; a peer on no allow list
//! gets one refusal and is closed, `Heartbeat` included.

mod common;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use tuttid_proto::frame::{recv_frame, send_frame};
use tuttid_proto::{Client, ClientError, Request, Response, Rule, PROTOCOL_VERSION};

/// The uid a child process runs as to be a stranger (on no list, not the
/// daemon's uid, not root).
const STRANGER: u32 = 4243;

/// A daemon config with one emulated drive `p` of `io_queues` queue pairs
/// that `allow_uid` may use, `quota` per uid, and `top` keys added.
fn yaml(socket: &Path, allow_uid: u32, io_queues: u16, quota: u16, top: &str) -> String {
    format!(
        "socket: {}\nsocket_mode: \"0666\"\n{top}drives:\n  p:\n    device: {{ emulated: {{ namespaces: [ {{ capacity: 4MiB, block_size: 4096 }} ], io_queues: {io_queues} }} }}\n    allow: {{ uids: [{allow_uid}] }}\n    queues_per_client: {quota}\n",
        socket.display()
    )
}

fn refused_rule<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Rule {
    match r {
        Err(ClientError::Refused { rule, .. }) => rule,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn more_connections_of_one_uid_get_no_more_queues() {
    let dir = tempfile::tempdir().unwrap();
    let uid = rustix::process::getuid().as_raw();
    let (total, quota) = (8u16, 2u16);
    let conns = total.div_ceil(quota);
    let top = format!("connections_per_uid: {conns}\n");
    let d = Daemon::start(dir.path(), &yaml(&dir.path().join("tutti.sock"), uid, total, quota, &top));
    // ceil(total / quota) connections: admitted; one more: refused.
    let clients: Vec<_> = (0..conns).map(|_| Client::connect(&d.socket).unwrap()).collect();
    assert_eq!(refused_rule(Client::connect(&d.socket)), Rule::Quota);
    // Together they get the uid's quota of queues, not quota each.
    let mut granted = Vec::new();
    for c in &clients {
        for _ in 0..quota {
            match c.grant_queue("p", 16) {
                Ok(g) => granted.push(g),
                Err(e) => assert_eq!(refused_rule::<()>(Err(e)), Rule::Quota),
            }
        }
    }
    assert_eq!(granted.len(), usize::from(quota));
    let s = clients[0].status().unwrap();
    assert_eq!((s.drives[0].queues_free, s.drives[0].queues_total), (total - quota, total));
    // A connection that ends gives its place back.
    drop(clients);
    let t = Instant::now();
    let c = loop {
        match Client::connect(&d.socket) {
            Ok(c) => break c,
            Err(_) if t.elapsed() < Duration::from_secs(5) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no connection after the others ended: {e}"),
        }
    };
    // And their queues went back to the pool with them.
    let t = Instant::now();
    while c.status().unwrap().drives[0].queues_free != total {
        assert!(t.elapsed() < Duration::from_secs(5), "queues not reclaimed");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.grant_queue("p", 16).unwrap();
}

#[test]
fn memory_quotas_and_an_empty_pool_are_refused_by_rule_and_leak_nothing() {
    // Per uid across its connections: 3 registrations and 64 KiB. The
    // drive has 2 queue pairs and a quota of 4 per uid, so the third grant
    // finds the pool empty (not the quota).
    use tuttid_proto::SharedMemory;
    let dir = tempfile::tempdir().unwrap();
    let uid = rustix::process::getuid().as_raw();
    let top = "registrations_per_client: 3\nmemory_per_uid: 65536\n";
    let d = Daemon::start(dir.path(), &yaml(&dir.path().join("tutti.sock"), uid, 2, 4, top));
    let (a, b) = (Client::connect(&d.socket).unwrap(), Client::connect(&d.socket).unwrap());
    let shm = SharedMemory::new(64 << 10).unwrap();
    let reg = |c: &Client, len: u64| c.register_memory("p", shm.fd(), 0, len).map(|(id, _, _)| id);
    // Bytes: 48 KiB on one connection, 32 more on the other is past 64.
    let big = reg(&a, 48 << 10).unwrap();
    assert_eq!(refused_rule(reg(&b, 32 << 10)), Rule::MemoryQuota, "bytes, across connections");
    let small = reg(&b, 16 << 10).unwrap();
    // 64 KiB held: even 4 KiB more is refused.
    assert_eq!(refused_rule(reg(&a, 4096)), Rule::MemoryQuota, "bytes: 64 KiB held");
    a.unregister_memory(big).unwrap();
    let r3 = reg(&a, 4096).unwrap();
    let r4 = reg(&b, 4096).unwrap();
    assert_eq!(refused_rule(reg(&a, 4096)), Rule::MemoryQuota, "count: 3 held");
    // A refusal took nothing: giving one back makes room for exactly one.
    b.unregister_memory(r4).unwrap();
    let r5 = reg(&a, 4096).unwrap();
    assert_eq!(refused_rule(reg(&b, 4096)), Rule::MemoryQuota);
    for (c, id) in [(&b, small), (&a, r3), (&a, r5)] {
        c.unregister_memory(id).unwrap();
    }
    assert_eq!(a.status().unwrap().drives[0].registrations, 0);
    // The pool: two grants, then PoolEmpty (quota 4 not reached), again on
    // the other connection; a release refills it.
    let (g1, _f1) = a.grant_queue("p", 16).unwrap();
    let _g2 = b.grant_queue("p", 16).unwrap();
    assert_eq!(refused_rule(a.grant_queue("p", 16)), Rule::PoolEmpty);
    assert_eq!(refused_rule(b.grant_queue("p", 16)), Rule::PoolEmpty);
    let s = a.status().unwrap();
    assert_eq!((s.drives[0].queues_free, s.drives[0].queues_total), (0, 2));
    a.release_queue("p", g1.qid).unwrap();
    let _g3 = b.grant_queue("p", 16).unwrap();
    assert_eq!(refused_rule(a.grant_queue("p", 16)), Rule::PoolEmpty);
    // After both connections end, everything is back.
    drop((a, b));
    let back = eventually(Duration::from_secs(5), || {
        let s = Client::connect(&d.socket).ok()?.status().ok()?;
        (s.drives[0].queues_free == 2 && s.drives[0].registrations == 0).then_some(())
    });
    assert!(back.is_some(), "queues and registrations reclaimed");
    let c = Client::connect(&d.socket).unwrap();
    let ids: Vec<_> = (0..3).map(|_| reg(&c, 16 << 10).unwrap()).collect();
    assert_eq!(ids.len(), 3, "the uid's memory quota is whole again");
}

/// `Hello`, then `Heartbeat`, on a raw connection: the replies, and
/// whether the daemon closed the connection afterwards.
fn hello_heartbeat(socket: &Path) -> (Response, Option<Response>, bool) {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let rx = |s: &UnixStream| recv_frame(s).ok().map(|f| Response::decode(&f.payload).unwrap());
    let _ = send_frame(&s, &Request::Hello { version: PROTOCOL_VERSION }.encode(), &[]);
    let first = rx(&s).expect("a reply to Hello");
    let _ = send_frame(&s, &Request::Heartbeat.encode(), &[]);
    let second = rx(&s);
    let closed = recv_frame(&s).is_err();
    (first, second, closed)
}

#[test]
fn peers_on_no_allow_list_get_one_refusal_and_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tutti.sock");
    // Only uid 4242 is listed: this process (the daemon's uid, the
    // operator) is served the status and nothing else.
    let d = Daemon::start(dir.path(), &yaml(&socket, 4242, 8, 2, "connections_per_uid: 8\n"));
    let t = Instant::now();
    for _ in 0..500 {
        let (first, second, closed) = hello_heartbeat(&socket);
        assert!(matches!(first, Response::HelloOk { .. }), "{first:?}");
        assert!(matches!(second, Some(Response::Refused { rule: Rule::NotAllowed, .. })), "{second:?}");
        assert!(closed, "an unlisted peer's connection stays open");
    }
    eprintln!("500 heartbeat-only connections refused in {:?}", t.elapsed());
    let c = Client::connect(&socket).unwrap();
    assert!(c.status().is_ok());
    assert_eq!(refused_rule(c.open_drive("p")), Rule::NotAllowed);
    assert!(c.status().is_err(), "closed after its refusal");
    // A stranger (not the operator: another uid) is refused at accept,
    // before it says anything. Needs root to run a process as that uid.
    if rustix::process::getuid().as_raw() != 0 {
        eprintln!("not root: the stranger part is skipped");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let threads_before = daemon_threads(&d);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "stranger_role", "--nocapture", "--test-threads=1"])
        .env("TUTTID_TEST_ROLE", "stranger")
        .env("TUTTID_TEST_SOCKET", &socket)
        .uid(STRANGER)
        .gid(STRANGER)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("stranger refused 200"), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("stranger burst {STRANGER_BURST}")), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines().filter(|l| l.contains("stranger connections")).for_each(|l| eprintln!("{l}"));
    // No thread of the daemon's outlived them (one accept thread, the
    // forwarders, the drives' emulators: what it had before).
    let threads = eventually(Duration::from_secs(5), || {
        let n = daemon_threads(&d);
        (n <= threads_before).then_some(n)
    });
    assert!(
        threads.is_some(),
        "daemon threads {} after the burst, {threads_before} before",
        daemon_threads(&d)
    );
    // The daemon holds nothing of them and still serves.
    let c = Client::connect(&socket).unwrap();
    assert!(c.status().unwrap().clients.iter().all(|cl| cl.uid != STRANGER));
    drop(d);
}

use std::os::unix::process::CommandExt;

/// The stranger: 200 connections held at once, each sending `Hello` and
/// `Heartbeat`: every one gets one `NotAllowed` refusal and is closed.
#[test]
fn stranger_role() {
    if std::env::var("TUTTID_TEST_ROLE").as_deref() != Ok("stranger") {
        return;
    }
    let socket = std::path::PathBuf::from(std::env::var("TUTTID_TEST_SOCKET").unwrap());
    let socks: Vec<_> = (0..200).map(|_| UnixStream::connect(&socket).unwrap()).collect();
    let mut refused = 0;
    for s in &socks {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = send_frame(s, &Request::Hello { version: PROTOCOL_VERSION }.encode(), &[]);
        let _ = send_frame(s, &Request::Heartbeat.encode(), &[]);
        let first = recv_frame(s).map(|f| Response::decode(&f.payload).unwrap());
        let ok = matches!(first, Ok(Response::Refused { rule: Rule::NotAllowed, .. }));
        if ok && recv_frame(s).is_err() {
            refused += 1;
        }
    }
    assert_eq!(refused_rule(Client::connect(&socket)), Rule::NotAllowed);
    println!("stranger refused {refused}");
    drop(socks);
    // A burst, one after another: each refused at accept and closed.
    let t = Instant::now();
    let mut burst = 0;
    for _ in 0..STRANGER_BURST {
        let s = UnixStream::connect(&socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = send_frame(&s, &Request::Hello { version: PROTOCOL_VERSION }.encode(), &[]);
        let _ = send_frame(&s, &Request::Heartbeat.encode(), &[]);
        let first = recv_frame(&s).map(|f| Response::decode(&f.payload).unwrap());
        if matches!(first, Ok(Response::Refused { rule: Rule::NotAllowed, .. })) && recv_frame(&s).is_err() {
            burst += 1;
        }
    }
    eprintln!("{burst} heartbeat-only stranger connections refused and closed in {:?}", t.elapsed());
    println!("stranger burst {burst}");
}

/// Heartbeat-only connections of the stranger's burst (one after another).
const STRANGER_BURST: usize = 5000;

/// Threads of the daemon process now.
fn daemon_threads(d: &Daemon) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
}
