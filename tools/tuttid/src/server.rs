//! The listening socket, one thread per connection (reused for a later
//! one once its connection is reclaimed), the table of live
//! clients for the operator view, and the connection loop: handshake,
//! requests checked against what the connection owns, the lease (a read
//! timeout), and reclaim when the connection ends for any reason.

use std::collections::HashMap;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvm_queue::VirtualClock;
use tuttid_proto::frame::{borrow_all, recv_frame, send_frame, FrameError};
use tuttid_proto::message::{ClientStatus, Request, Response, StatusReport};
use tuttid_proto::{Rule, MAX_FRAME};

use crate::accounts::{Accounts, Limits};
use crate::config::DaemonConfig;
use crate::drive::Drive;
use crate::error::DaemonError;
use crate::session::{Peer, Reply, Session};

/// A live client as the operator view shows it.
#[derive(Debug, Clone)]
struct Row {
    peer: Peer,
    connected: Instant,
    last: Instant,
    queues: Vec<(String, u16)>,
    memory_bytes: u64,
}

/// The daemon's shared state.
#[derive(Debug)]
pub struct Server {
    drives: Arc<Vec<Drive>>,
    clients: Mutex<HashMap<u64, Row>>,
    next_client: AtomicU64,
    /// Connections reclaimed (changed under `clients`' lock, so a waiter
    /// on `departed` never misses one).
    reclaimed: AtomicU64,
    /// Notified after each reclaim ([`Server::wait_reclaimed`]).
    departed: Condvar,
    lease: Duration,
    lease_ms: u32,
    /// Per-uid quotas and the connection caps.
    accounts: Arc<Accounts>,
    own_uid: u32,
    /// Connection threads that finished a connection and wait for another.
    idle: Arc<Idle>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Server {
    /// Starts every drive of `cfg`.
    ///
    /// # Errors
    ///
    /// The first drive that fails to start.
    pub fn start(cfg: &DaemonConfig) -> Result<Arc<Self>, DaemonError> {
        Self::start_with(cfg, None)
    }

    /// As [`Server::start`], with every drive's emulator on virtual time
    /// (`clock`) instead of a controller thread of its own: the driver's
    /// bounded waits (bring-up, each queue's create and delete) step it
    /// and take no real time, and the drive's forwarding thread steps it
    /// after each pass (so I/O is served as before). For tests and
    /// fuzzing; the daemon's checks and limits are the same.
    ///
    /// # Errors
    ///
    /// As [`Server::start`]; a drive that is not emulated with forwarded
    /// doorbells (nothing would step it) is refused.
    pub fn start_on(cfg: &DaemonConfig, clock: Arc<VirtualClock>) -> Result<Arc<Self>, DaemonError> {
        Self::start_with(cfg, Some(&clock))
    }

    fn start_with(cfg: &DaemonConfig, clock: Option<&Arc<VirtualClock>>) -> Result<Arc<Self>, DaemonError> {
        let drives =
            cfg.drives.iter().map(|(n, e)| Drive::start(n, e, clock)).collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Self {
            drives: Arc::new(drives),
            clients: Mutex::new(HashMap::new()),
            next_client: AtomicU64::new(1),
            reclaimed: AtomicU64::new(0),
            departed: Condvar::new(),
            lease: Duration::from_millis(u64::from(cfg.lease_ms)),
            lease_ms: cfg.lease_ms,
            accounts: Arc::new(Accounts::new(Limits {
                connections_per_uid: cfg.connections_per_uid,
                max_connections: cfg.max_connections,
                registrations_per_uid: cfg.registrations_per_client,
                memory_per_uid: cfg.memory_per_uid,
            })),
            own_uid: rustix::process::getuid().as_raw(),
            idle: Arc::default(),
        }))
    }

    /// Accepts connections until `stop` is set, one thread each.
    pub fn run(self: &Arc<Self>, listener: &UnixListener, stop: &AtomicBool) {
        if let Err(e) = listener.set_nonblocking(true) {
            tracing::error!(error = %e, "listener cannot be made non-blocking");
            return;
        }
        while !stop.load(Ordering::Acquire) {
            match listener.accept() {
                Ok((sock, _)) => self.admit(sock),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait_for_connection(listener),
                Err(e) => {
                    tracing::warn!(error = %e, "accept");
                    std::thread::sleep(ACCEPT_PAUSE);
                }
            }
        }
        for d in self.drives.iter() {
            d.shutdown();
        }
    }

    /// A new connection, on the accepting thread: a peer on no drive's
    /// allow list (and not the operator: root or the daemon's uid), or one
    /// past its uid's or the daemon's cap of connections, gets one refusal
    /// and is closed here, with no thread and nothing read from it; any
    /// other gets its thread.
    fn admit(self: &Arc<Self>, sock: UnixStream) {
        let Ok(cred) = rustix::net::sockopt::socket_peercred(&sock) else {
            tracing::warn!("SO_PEERCRED failed; connection dropped");
            return;
        };
        let peer = Peer {
            pid: cred.pid.as_raw_nonzero().get() as u32,
            uid: cred.uid.as_raw(),
            gid: cred.gid.as_raw(),
        };
        let listed = self.drives.iter().any(|d| d.allow.permits(peer.uid, peer.gid));
        let operator = peer.uid == 0 || peer.uid == self.own_uid;
        let admitted = if listed || operator {
            self.accounts.connect(peer.uid)
        } else {
            Err(DaemonError::Unauthenticated { uid: peer.uid, gid: peer.gid, what: "nothing is served" })
        };
        if let Err(e) = admitted {
            tracing::info!(pid = peer.pid, uid = peer.uid, error = %e, "connection refused");
            // Never blocks the accepting thread: a peer that does not read
            // loses the refusal, not the daemon's time.
            let _ = sock.set_nonblocking(true);
            let _ = reply(&sock, refused(e.rule(), e.to_string()));
            return;
        }
        let job = Job { server: self.clone(), sock, peer, status_only: !listed };
        let Some(job) = self.idle.hand(job) else { return };
        let idle = self.idle.clone();
        let spawned = std::thread::Builder::new().name("tuttid-conn".into()).spawn(move || {
            let mut job = job;
            loop {
                job.server.serve(job.sock, job.peer, job.status_only);
                match idle.wait() {
                    Some(next) => job = next,
                    None => return,
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot spawn a connection thread");
            self.accounts.disconnect(peer.uid);
        }
    }

    /// One admitted connection, from its thread's start to reclaim.
    /// `status_only`: the operator on no allow list, served `Status` only.
    fn serve(self: Arc<Self>, sock: UnixStream, peer: Peer, status_only: bool) {
        if sock.set_nonblocking(false).is_err() || sock.set_read_timeout(Some(self.lease)).is_err() {
            self.accounts.disconnect(peer.uid);
            return;
        }
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let row = Row { peer, connected: now, last: now, queues: Vec::new(), memory_bytes: 0 };
        lock(&self.clients).insert(id, row);
        // Declared before the session, so dropped after it: on every way
        // out of this thread (a panic too) the session reclaims first, then
        // the connection leaves the table and its uid's count.
        let _departure = Departure { server: &self, id, uid: peer.uid };
        tracing::info!(pid = peer.pid, uid = peer.uid, gid = peer.gid, "client connected");
        let domain = domain_of(id);
        // A doorbell rule broken on a forwarded drive ends the lease: the
        // connection is shut down, this thread sees it end and reclaims.
        let lease_end: crate::forward::LeaseEnd = match sock.try_clone() {
            Ok(s) => crate::forward::LeaseEnd(Arc::new(move || {
                let _ = s.shutdown(std::net::Shutdown::Both);
            })),
            Err(_) => return,
        };
        let mut session = Session::new(
            peer,
            self.drives.clone(),
            (self.accounts.clone(), lease_end),
            self.lease_ms,
            domain,
        );
        let why = self.serve_loop(&sock, &mut session, id, status_only);
        tracing::info!(pid = peer.pid, reason = why, "client gone: reclaiming");
        session.reclaim();
    }

    /// Requests until the connection ends; returns why it ended.
    fn serve_loop(
        &self,
        sock: &UnixStream,
        session: &mut Session,
        id: u64,
        status_only: bool,
    ) -> &'static str {
        loop {
            let frame = match recv_frame(sock) {
                Ok(f) => f,
                Err(e) if e.is_timeout() => return "lease expired (no heartbeat)",
                Err(FrameError::Decode(e)) => {
                    let _ = reply(sock, refused(Rule::Malformed, e.to_string()));
                    return "bad frame";
                }
                Err(FrameError::Io(_)) => return "connection closed",
            };
            if let Some(r) = lock(&self.clients).get_mut(&id) {
                r.last = Instant::now();
            }
            let answer = match Request::decode(&frame.payload) {
                Err(e) => refused(Rule::Malformed, e.to_string()),
                Ok(req) if frame.fds.len() != req.fds() => refused(
                    Rule::Malformed,
                    format!("{} carries {} descriptors, {} came", req.name(), req.fds(), frame.fds.len()),
                ),
                Ok(req) if !session.greeted => match session.hello(&req) {
                    Ok(r) => r,
                    Err(r) => {
                        let _ = reply(sock, r);
                        return "handshake refused";
                    }
                },
                Ok(Request::Status) => self.status_reply(session.peer),
                Ok(_) if status_only => {
                    let Peer { uid, gid, .. } = session.peer;
                    let what = "the operator is served the status only";
                    let e = DaemonError::Unauthenticated { uid, gid, what };
                    let _ = reply(sock, refused(e.rule(), e.to_string()));
                    return "not on any allow list";
                }
                Ok(req) => session.handle(req, frame.fds),
            };
            if let Some(r) = lock(&self.clients).get_mut(&id) {
                r.queues = session.queue_list();
                r.memory_bytes = session.memory_bytes();
            }
            if reply(sock, answer).is_err() {
                return "reply failed";
            }
        }
    }

    fn status_reply(&self, peer: Peer) -> Reply {
        if peer.uid != 0 && peer.uid != self.own_uid {
            return refused(
                Rule::NotAllowed,
                format!("uid {} may not see the status (root or the daemon's uid)", peer.uid),
            );
        }
        (Response::Status(self.status()), Vec::new())
    }

    /// Waits until more than `after` connections have been reclaimed (the
    /// count [`StatusReport::reclaimed`] shows), at most `timeout`; returns
    /// the count. For tests and fuzzing, which wait for a hung-up client's
    /// reclaim without polling.
    pub fn wait_reclaimed(&self, after: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut clients = lock(&self.clients);
        loop {
            let n = self.reclaimed.load(Ordering::Relaxed);
            let left = deadline.saturating_duration_since(Instant::now());
            if n > after || left.is_zero() {
                return n;
            }
            clients = self.departed.wait_timeout(clients, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The operator view now (clients trimmed to fit one frame). The
    /// client list and the reclaimed count are read together (under one
    /// lock), and the drives after them: every reclaim the count includes
    /// shows in the rest of the report.
    pub fn status(&self) -> StatusReport {
        let now = Instant::now();
        let table = lock(&self.clients);
        let reclaimed = self.reclaimed.load(Ordering::Relaxed);
        let mut clients: Vec<ClientStatus> = table
            .values()
            .map(|r| ClientStatus {
                pid: r.peer.pid,
                uid: r.peer.uid,
                gid: r.peer.gid,
                connected_ms: now.duration_since(r.connected).as_millis() as u64,
                idle_ms: now.duration_since(r.last).as_millis() as u64,
                queues: r.queues.clone(),
                memory_bytes: r.memory_bytes,
            })
            .collect();
        drop(table);
        clients.sort_by_key(|c| c.pid);
        let mut s =
            StatusReport { drives: self.drives.iter().map(Drive::status).collect(), clients, reclaimed };
        while Response::Status(s.clone()).encode().len() > MAX_FRAME as usize && s.clients.pop().is_some() {}
        s
    }
}

/// The DMA domain of connection `id` (ids count from 1): 1..=u32::MAX,
/// never [`nvme_emu::SHARED_DOMAIN`] (the daemon's own), distinct for any
/// `u32::MAX` consecutive connections.
fn domain_of(id: u64) -> u32 {
    (id.wrapping_sub(1) % u64::from(u32::MAX)) as u32 + 1
}

/// An admitted connection for a connection thread.
struct Job {
    server: Arc<Server>,
    sock: UnixStream,
    peer: Peer,
    status_only: bool,
}

/// Connection threads between connections: a thread that has reclaimed its
/// connection waits up to [`IDLE_KEEP`] for the next one (at most
/// [`IDLE_MAX`] wait), so that a new connection is served without starting
/// a thread. Every connection still has a thread of its own for as long as
/// it lives; the limits on connections are the accounts' as before.
#[derive(Debug, Default)]
struct Idle {
    /// Threads waiting, and the connections handed to them not yet taken.
    state: Mutex<(usize, Vec<Job>)>,
    /// Notified when a connection is handed over.
    handed: Condvar,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("peer", &self.peer).finish_non_exhaustive()
    }
}

/// How long a connection thread waits for another connection.
const IDLE_KEEP: Duration = Duration::from_secs(1);
/// How many connection threads may wait at once.
const IDLE_MAX: usize = 4;

impl Idle {
    /// Hands `job` to a waiting thread; gives it back when none waits
    /// for it (the caller starts a thread).
    fn hand(&self, job: Job) -> Option<Job> {
        let mut st = lock(&self.state);
        if st.0 > st.1.len() {
            st.1.push(job);
            drop(st);
            self.handed.notify_one();
            None
        } else {
            Some(job)
        }
    }

    /// Waits for a connection (after one ended on this thread); `None`:
    /// none came within [`IDLE_KEEP`], or enough threads wait already,
    /// and the thread ends.
    fn wait(&self) -> Option<Job> {
        let mut st = lock(&self.state);
        if st.0 >= IDLE_MAX {
            return None;
        }
        st.0 += 1;
        let deadline = Instant::now() + IDLE_KEEP;
        loop {
            if let Some(job) = st.1.pop() {
                st.0 -= 1;
                return Some(job);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                st.0 -= 1;
                return None;
            }
            st = self.handed.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// How often the accepting thread looks at `stop` while no connection
/// comes, and its pause after a failed `accept`.
const ACCEPT_PAUSE: Duration = Duration::from_millis(5);

/// Waits until a connection is pending on `listener`, at most
/// [`ACCEPT_PAUSE`] (so `stop` is still seen that often): a client is
/// accepted as soon as it connects, not at the end of a fixed sleep.
fn wait_for_connection(listener: &UnixListener) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let timeout = Timespec { tv_sec: 0, tv_nsec: ACCEPT_PAUSE.as_nanos() as _ };
    let mut fds = [PollFd::new(listener, PollFlags::IN)];
    // EINTR or any other failure: back to `accept` (and `stop`) at once.
    let _ = poll(&mut fds, Some(&timeout));
}

fn refused(rule: Rule, detail: String) -> Reply {
    (Response::Refused { rule, detail }, Vec::new())
}

fn reply(sock: &UnixStream, (resp, fds): Reply) -> Result<(), FrameError> {
    send_frame(sock, &resp.encode(), &borrow_all(&fds))
}

/// Makes the socket's directory (mode 0755, owned by the daemon) when it
/// is missing, and refuses one that another user could use to swap the
/// socket after it is bound: a directory not owned by the daemon's uid or
/// root, or writable by group or others without the sticky bit (`/tmp`
/// is fine: there only the owner may rename or remove the socket).
fn socket_directory(dir: &Path) -> Result<(), (&'static str, std::io::Error)> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| ("making the socket's directory for", e))?;
    }
    let meta = std::fs::metadata(dir).map_err(|e| ("reading the socket's directory of", e))?;
    let me = rustix::process::geteuid().as_raw();
    let unsafe_mode = meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0;
    if (meta.uid() != me && meta.uid() != 0) || unsafe_mode {
        let why = "the socket's directory is writable by other users (group/other write without the sticky bit, or another owner) for";
        return Err((why, std::io::ErrorKind::PermissionDenied.into()));
    }
    Ok(())
}

/// Binds the socket at `path` with `mode` (and group `gid`): a stale
/// socket file is replaced, a live one (a daemon answers) or any other
/// file is refused. The socket is bound, chown-ed and chmod-ed inside a
/// private directory (mode 0700, made here next to `path`: no other user
/// can swap a symlink in while the path is used), under umask 0177, and
/// then renamed to `path` (rename replaces a name, never follows a link);
/// so it is never more open than configured, and nothing is done by a
/// path someone else could redirect.
///
/// Its directory is made (0755) when missing, and refused when another
/// user could write it (`socket_directory`).
///
/// # Errors
///
/// [`DaemonError::Socket`].
pub fn bind(path: &Path, mode: u32, gid: Option<u32>) -> Result<UnixListener, DaemonError> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    let err = |op, source| DaemonError::Socket { op, path: path.display().to_string(), source };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err(
                "refusing to replace a non-socket file at",
                std::io::ErrorKind::AlreadyExists.into(),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(err("another daemon listens on", std::io::ErrorKind::AddrInUse.into()));
        }
    }
    let name =
        path.file_name().ok_or_else(|| err("no file name in", std::io::ErrorKind::InvalidInput.into()))?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    socket_directory(parent).map_err(|(op, e)| err(op, e))?;
    let private = parent.join(format!(".{}.{}.bind", name.to_string_lossy(), std::process::id()));
    // Fails if the name exists: the directory is always one made here.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| err("making a private directory for", e))?;
    let r = bind_in(&private.join("sock"), path, mode, gid).map_err(|(op, e)| err(op, e));
    let _ = std::fs::remove_dir_all(&private);
    r
}

/// Binds at `tmp` (in a private directory), sets group and mode there,
/// renames it to `path`.
fn bind_in(
    tmp: &Path,
    path: &Path,
    mode: u32,
    gid: Option<u32>,
) -> Result<UnixListener, (&'static str, std::io::Error)> {
    use std::os::unix::fs::PermissionsExt;
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let l = UnixListener::bind(tmp);
    rustix::process::umask(old);
    let l = l.map_err(|e| ("binding", e))?;
    if let Some(g) = gid {
        std::os::unix::fs::lchown(tmp, None, Some(g)).map_err(|e| ("chown of", e))?;
    }
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(mode)).map_err(|e| ("chmod of", e))?;
    std::fs::rename(tmp, path).map_err(|e| ("renaming the bound socket to", e))?;
    Ok(l)
}

/// A served connection's bookkeeping, undone when its thread ends
/// (normally or by a panic): out of the clients table, its uid's
/// connection count given back, the reclaim counted.
struct Departure<'a> {
    server: &'a Server,
    id: u64,
    uid: u32,
}

impl Drop for Departure<'_> {
    fn drop(&mut self) {
        lock(&self.server.clients).remove(&self.id);
        self.server.accounts.disconnect(self.uid);
        let clients = lock(&self.server.clients);
        self.server.reclaimed.fetch_add(1, Ordering::Relaxed);
        drop(clients);
        self.server.departed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::{bind, domain_of};

    #[test]
    fn the_socket_is_bound_privately_then_renamed_into_place() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sock");
        let l = bind(&path, 0o640, None).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["t.sock"], "the private directory is gone");
        let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        assert!(l.accept().is_ok(), "the renamed socket is the listener's");
        // A live daemon's socket is refused; a stale one replaced.
        assert!(bind(&path, 0o600, None).is_err());
        drop(l);
        let _l = bind(&path, 0o600, None).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // A symlink at the path is refused, never followed.
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(bind(&link, 0o666, None).is_err());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn the_socket_directory_is_made_safe_or_an_unsafe_one_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // Missing: made by the daemon, 0755.
        let made = dir.path().join("run/tutti");
        let _l = bind(&made.join("s.sock"), 0o600, None).unwrap();
        assert_eq!(std::fs::metadata(&made).unwrap().permissions().mode() & 0o7777, 0o755);
        // Writable by others without the sticky bit: refused, nothing bound.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = bind(&open.join("s.sock"), 0o600, None).unwrap_err();
        assert!(e.to_string().contains("writable by other users"), "{e}");
        assert!(!open.join("s.sock").exists());
        // World-writable with the sticky bit (as /tmp): fine.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(bind(&open.join("s.sock"), 0o600, None).is_ok());
    }

    #[test]
    fn connection_domains_are_never_the_daemons_and_do_not_repeat_soon() {
        assert_eq!(domain_of(1), 1);
        assert_eq!(domain_of(2), 2);
        assert_eq!(domain_of(u64::from(u32::MAX)), u32::MAX);
        assert_eq!(domain_of(u64::from(u32::MAX) + 1), 1, "wraps past 0");
        for id in [0, u64::MAX, u64::MAX - 1, 1 << 40] {
            assert_ne!(domain_of(id), nvme_emu::SHARED_DOMAIN, "id {id}");
        }
    }
}
