//! The client side of a connection: handshake, one request at a time,
//! a heartbeat thread that keeps the lease, and a flag that turns true
//! once the daemon is gone (fail closed: every later call errs).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::error::{ClientError, DecodeError};
use crate::frame::{recv_frame, send_frame, FrameError};
use crate::message::{DriveFacts, QueueGrant, Request, Response, StatusReport};
use crate::PROTOCOL_VERSION;

/// Longest wait for one reply (queue creation, memory mapping), beyond
/// which the daemon counts as gone.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Which user the client trusts to serve the daemon's socket: it sends the
/// daemon memfds of its memory, so an impostor at the path (another user's
/// process bound there while the daemon was down) must get nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DaemonUid {
    /// Root, or the client's own effective uid (a process of the same user
    /// can read the client's memory anyway). The default.
    #[default]
    RootOrSelf,
    /// Exactly this uid.
    Is(u32),
}

impl DaemonUid {
    /// Checks the peer of `sock` (SO_PEERCRED, taken by the kernel at
    /// `connect`).
    fn check(self, sock: &UnixStream, socket: &str) -> Result<(), ClientError> {
        let cred = rustix::net::sockopt::socket_peercred(sock).map_err(|e| ClientError::Os {
            op: "reading the daemon's credentials (SO_PEERCRED)",
            source: e.into(),
        })?;
        let uid = cred.uid.as_raw();
        let me = rustix::process::geteuid().as_raw();
        let (ok, expected) = match self {
            Self::RootOrSelf => (uid == 0 || uid == me, format!("root or uid {me}")),
            Self::Is(want) => (uid == want, format!("uid {want}")),
        };
        if ok {
            Ok(())
        } else {
            Err(ClientError::Impostor { socket: socket.to_owned(), uid, expected })
        }
    }
}

/// A connection to `tuttid`. The connection is the lease: dropping the
/// client (or the process dying) makes the daemon reclaim every queue and
/// memory registration it made.
#[derive(Debug)]
pub struct Client {
    sock: Mutex<UnixStream>,
    socket: String,
    dead: AtomicBool,
    lease: Duration,
}

impl Client {
    /// Connects, sends `Hello` with [`PROTOCOL_VERSION`], and starts a
    /// heartbeat thread (every third of the lease) that lives as long as
    /// the client.
    ///
    /// # Errors
    ///
    /// [`ClientError::Disconnected`] when the socket cannot be reached;
    /// [`ClientError::Refused`] (rule `protocol-version`) from a daemon of
    /// another version.
    pub fn connect(socket: impl AsRef<Path>) -> Result<Arc<Self>, ClientError> {
        Self::connect_with(socket, PROTOCOL_VERSION, DaemonUid::RootOrSelf)
    }

    /// As [`Client::connect`], trusting only a daemon that runs as
    /// `daemon` (checked with SO_PEERCRED before anything is sent).
    ///
    /// # Errors
    ///
    /// [`ClientError::Impostor`] when the socket's process runs as another
    /// user; otherwise as [`Client::connect`].
    pub fn connect_trusting(socket: impl AsRef<Path>, daemon: DaemonUid) -> Result<Arc<Self>, ClientError> {
        Self::connect_with(socket, PROTOCOL_VERSION, daemon)
    }

    /// As [`Client::connect`], announcing `version` (for testing the
    /// daemon's refusal of other versions).
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub fn connect_with_version(socket: impl AsRef<Path>, version: u32) -> Result<Arc<Self>, ClientError> {
        Self::connect_with(socket, version, DaemonUid::RootOrSelf)
    }

    fn connect_with(
        socket: impl AsRef<Path>,
        version: u32,
        daemon: DaemonUid,
    ) -> Result<Arc<Self>, ClientError> {
        let path = socket.as_ref().display().to_string();
        let sock = UnixStream::connect(socket.as_ref()).map_err(|source| ClientError::Disconnected {
            socket: path.clone(),
            during: "connect",
            source,
        })?;
        daemon.check(&sock, &path)?;
        sock.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(|source| ClientError::Disconnected {
            socket: path.clone(),
            during: "connect",
            source,
        })?;
        let mut c =
            Self { sock: Mutex::new(sock), socket: path, dead: AtomicBool::new(false), lease: REPLY_TIMEOUT };
        match c.call(Request::Hello { version }, &[])? {
            (Response::HelloOk { lease_ms, .. }, _) => {
                c.lease = Duration::from_millis(u64::from(lease_ms.max(30)))
            }
            (other, _) => return Err(unexpected("Hello", other)),
        }
        let c = Arc::new(c);
        let weak = Arc::downgrade(&c);
        let period = c.lease / 3;
        std::thread::Builder::new()
            .name("tuttid-heartbeat".into())
            .spawn(move || heartbeat(weak, period))
            .map_err(|source| ClientError::Os { op: "spawning the heartbeat thread", source })?;
        Ok(c)
    }

    /// `true` once a call found the daemon gone (or refused on protocol
    /// grounds and closed): grants are void, nothing more will succeed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// The socket path.
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// The lease the daemon announced: silence this long is reclaimed.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Sends `req` with `fds` and waits for its reply (calls are
    /// serialised: one request in flight per connection).
    ///
    /// # Errors
    ///
    /// [`ClientError::Refused`] for a refusal; [`ClientError::Disconnected`]
    /// (and the client marked dead) on any socket error or timeout;
    /// [`ClientError::Decode`] for a reply that is not a message (also
    /// marks it dead: the stream cannot be trusted past it).
    pub fn call(
        &self,
        req: Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Response, Vec<OwnedFd>), ClientError> {
        if self.is_dead() {
            let source = std::io::Error::from(std::io::ErrorKind::NotConnected);
            return Err(ClientError::Disconnected {
                socket: self.socket.clone(),
                during: req.name(),
                source,
            });
        }
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        // A daemon that refuses a connection at accept (peer on no allow
        // list, too many connections) writes its refusal and closes before
        // reading anything: the send then fails, and the refusal waits in
        // the socket.
        let r = match send_frame(&sock, &req.encode(), fds) {
            Ok(()) => recv_frame(&sock),
            Err(e) => recv_frame(&sock).map_err(|_| e),
        };
        let frame = r.map_err(|e| self.fail(req.name(), e))?;
        let resp = Response::decode(&frame.payload).map_err(|e| {
            self.dead.store(true, Ordering::Release);
            ClientError::Decode(e)
        })?;
        if frame.fds.len() != resp.fds() {
            self.dead.store(true, Ordering::Release);
            return Err(DecodeError::FdCount { expected: resp.fds(), got: frame.fds.len() }.into());
        }
        if let Response::Refused { rule, detail } = resp {
            return Err(ClientError::Refused { rule, detail });
        }
        Ok((resp, frame.fds))
    }

    fn fail(&self, during: &'static str, e: FrameError) -> ClientError {
        self.dead.store(true, Ordering::Release);
        let source = match e {
            FrameError::Io(io) => io,
            FrameError::Decode(d) => std::io::Error::new(std::io::ErrorKind::InvalidData, d),
        };
        ClientError::Disconnected { socket: self.socket.clone(), during, source }
    }

    /// Facts about `drive`, needed before queues are granted on it.
    ///
    /// # Errors
    ///
    /// As [`Client::call`] (rules `unknown-drive`, `allow-list`).
    pub fn open_drive(&self, drive: &str) -> Result<DriveFacts, ClientError> {
        match self.call(Request::OpenDrive { drive: drive.to_owned() }, &[])?.0 {
            Response::DriveFacts(f) => Ok(f),
            other => Err(unexpected("OpenDrive", other)),
        }
    }

    /// A new queue pair on `drive` with up to `entries` entries per ring,
    /// and its three descriptors: SQ ring, CQ ring, doorbell page.
    ///
    /// # Errors
    ///
    /// As [`Client::call`] (rules `queue-quota`, `queue-pool-empty`,
    /// `allow-list`, `device`).
    pub fn grant_queue(&self, drive: &str, entries: u32) -> Result<(QueueGrant, [OwnedFd; 3]), ClientError> {
        let (resp, fds) = self.call(Request::GrantQueue { drive: drive.to_owned(), entries }, &[])?;
        match (resp, <[OwnedFd; 3]>::try_from(fds)) {
            (Response::QueueGranted(g), Ok(fds)) => Ok((g, fds)),
            (other, _) => Err(unexpected("GrantQueue", other)),
        }
    }

    /// Gives queue pair `qid` of `drive` back.
    ///
    /// # Errors
    ///
    /// As [`Client::call`] (rule `ownership`).
    pub fn release_queue(&self, drive: &str, qid: u16) -> Result<(), ClientError> {
        self.expect_done(Request::ReleaseQueue { drive: drive.to_owned(), qid }, &[])
    }

    /// Maps `len` bytes at `offset` of memfd `fd` for `drive`'s DMA:
    /// returns (id, device address of the first byte, mapped length).
    ///
    /// # Errors
    ///
    /// As [`Client::call`] (rules `memory-shape`, `memory-quota`, `device`).
    pub fn register_memory(
        &self,
        drive: &str,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
    ) -> Result<(u64, u64, u64), ClientError> {
        let req = Request::RegisterMemory { drive: drive.to_owned(), offset, len };
        match self.call(req, &[fd])?.0 {
            Response::MemoryRegistered { id, iova, len } => Ok((id, iova, len)),
            other => Err(unexpected("RegisterMemory", other)),
        }
    }

    /// Unmaps registration `id`.
    ///
    /// # Errors
    ///
    /// As [`Client::call`] (rule `ownership`).
    pub fn unregister_memory(&self, id: u64) -> Result<(), ClientError> {
        self.expect_done(Request::UnregisterMemory { id }, &[])
    }

    /// The operator view.
    ///
    /// # Errors
    ///
    /// As [`Client::call`].
    pub fn status(&self) -> Result<StatusReport, ClientError> {
        match self.call(Request::Status, &[])?.0 {
            Response::Status(s) => Ok(s),
            other => Err(unexpected("Status", other)),
        }
    }

    /// One heartbeat (the thread sends them by itself).
    ///
    /// # Errors
    ///
    /// As [`Client::call`].
    pub fn heartbeat(&self) -> Result<(), ClientError> {
        self.expect_done(Request::Heartbeat, &[])
    }

    fn expect_done(&self, req: Request, fds: &[BorrowedFd<'_>]) -> Result<(), ClientError> {
        let name = req.name();
        match self.call(req, fds)?.0 {
            Response::Done => Ok(()),
            other => Err(unexpected(name, other)),
        }
    }
}

fn unexpected(asked: &'static str, got: Response) -> ClientError {
    ClientError::UnexpectedReply { asked, got: got.name() }
}

/// Sends a heartbeat every `period` until the client is dropped or dead.
fn heartbeat(client: Weak<Client>, period: Duration) {
    let step = Duration::from_millis(10).min(period);
    let mut waited = Duration::ZERO;
    loop {
        std::thread::sleep(step);
        waited += step;
        let Some(c) = client.upgrade() else { return };
        if c.is_dead() {
            return;
        }
        if waited >= period {
            waited = Duration::ZERO;
            if let Err(e) = c.heartbeat() {
                tracing::warn!(socket = %c.socket, error = %e, "tuttid heartbeat failed");
            }
        }
    }
}
