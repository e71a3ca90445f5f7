//! Fuzz body `tuttid_session`: a hostile client of an in-process `tuttid`
//! (one emulated drive, mediated submission), driven by the input as a
//! script: handshakes, framed requests with file descriptors of every kind
//! (sealed, unsealed and sparse memfds, pipes, /dev/null), raw and partial
//! frames, granted queues whose shadow SQ it fills with fuzzed SQEs whose
//! PRPs often point into its own registrations, and doorbell writes of any
//! value. After each script the client hangs up, and the daemon must have
//! reclaimed everything (every queue free, no registration left), never
//! let the drive touch memory outside a mapping (`dma_faults == 0`), and
//! still serve an honest client.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tuttid_proto::frame::{recv_frame, send_frame};
use tuttid_proto::message::{Request, Response};
use tuttid_proto::shm::{MappedFd, SharedMemory};

/// The daemon every script talks to.
struct Daemon {
    socket: PathBuf,
    server: Arc<tuttid::Server>,
    dstrd: u8,
    /// Connections made to it so far and since closed (each one is
    /// reclaimed once gone).
    connections: AtomicU64,
    /// The honest client, connected once for the whole process: after every
    /// script it must still be served (a new connection per input cost a
    /// connection thread, a heartbeat thread and a reclaim each).
    honest: Arc<tuttid_proto::Client>,
    /// Scripts run, to open a fresh honest connection every
    /// [`FRESH_HONEST_EVERY`]th.
    scripts: AtomicU64,
}

/// How often (in scripts) a new honest connection must also be accepted
/// and served, besides the persistent one.
const FRESH_HONEST_EVERY: u64 = 64;

/// Prefix of the socket folder of a process's fuzz daemon (then its pid).
const DIR_PREFIX: &str = "tuttid-session-fuzz-";

/// Removes the socket folders that processes no longer running left in
/// `tmp` (the daemon lives until the process exits, so a process cannot
/// remove its own); folders of live processes stay.
fn remove_stale_dirs(tmp: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn daemon() -> &'static Daemon {
    static D: OnceLock<Daemon> = OnceLock::new();
    D.get_or_init(|| {
        let tmp = std::env::temp_dir();
        remove_stale_dirs(&tmp);
        let dir = tmp.join(format!("{DIR_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let socket = dir.join("s.sock");
        let uid = rustix::process::getuid().as_raw();
        let yaml = format!(
            "socket: {}\nsocket_mode: \"0600\"\nlease_ms: 2000\ndrives:\n  d0:\n    device: {{ emulated: {{ namespaces: [ {{ capacity: 4MiB, block_size: 4096 }} ], io_queues: 8 }} }}\n    allow: {{ uids: [0, {uid}] }}\n    queues_per_client: 3\n    mediated: true\n    forward_spin_us: 0\n",
            socket.display()
        );
        let cfg = tuttid::DaemonConfig::from_yaml(&yaml).expect("the fuzz daemon's config");
        // The drive's emulator on virtual time: each queue's create and
        // delete (admin commands) is answered within the driver's wait, not
        // after a nap of the emulator's thread and of the driver.
        let clock = nvm_queue::VirtualClock::new();
        let server = tuttid::Server::start_on(&cfg, clock).expect("the fuzz daemon starts");
        let listener = tuttid::bind(&cfg.socket, 0o600, None).expect("the fuzz daemon binds");
        let s = server.clone();
        std::thread::spawn(move || {
            let stop = std::sync::atomic::AtomicBool::new(false);
            s.run(&listener, &stop);
        });
        let honest = tuttid_proto::Client::connect(&socket).expect("the honest client connects");
        let facts = honest.open_drive("d0").expect("d0");
        Daemon {
            socket,
            server,
            dstrd: facts.dstrd,
            connections: AtomicU64::new(0),
            honest,
            scripts: AtomicU64::new(0),
        }
    })
}

/// A granted queue pair the script holds: its shadow SQ and doorbells.
struct Queue {
    qid: u16,
    entries: u32,
    sq: MappedFd,
    db: MappedFd,
    db_base: usize,
}

/// The script's state: its connection, the input left, what it holds.
struct Script<'a> {
    sock: UnixStream,
    data: &'a [u8],
    queues: Vec<Queue>,
    /// (id, iova, len) of registrations the daemon granted.
    regions: Vec<(u64, u64, u64)>,
    /// Kept alive while registered.
    memory: Vec<SharedMemory>,
    /// The bytes sent as the daemon will read them, to know when a reply
    /// is owed.
    sent: Sent,
    /// Frames read back (replies and refusals).
    received: u64,
}

/// The byte stream the script sent, parsed as the daemon parses it
/// (`recv_frame`): how many whole frames it holds, so that a read for a
/// reply waits only when one is owed. The daemon answers every whole frame
/// with one frame, or closes the connection; a read with nothing owed would
/// only wait out the read timeout (the daemon is still waiting for the rest
/// of a frame), so it looks without waiting instead.
#[derive(Default)]
struct Sent {
    /// The bytes of the frame not yet whole.
    partial: Vec<u8>,
    /// Whole frames sent.
    frames: u64,
    /// A header the daemon refuses (it answers and closes), or a send that
    /// failed part way: from here on every read may wait.
    unknown: bool,
}

impl Sent {
    fn push(&mut self, bytes: &[u8]) {
        if self.unknown {
            return;
        }
        self.partial.extend_from_slice(bytes);
        while self.partial.len() >= tuttid_proto::frame::HEADER_LEN {
            let word = |i: usize| u32::from_le_bytes([0, 1, 2, 3].map(|k| self.partial[i + k]));
            let len = word(4);
            if word(0) != tuttid_proto::frame::MAGIC || len == 0 || len > tuttid_proto::MAX_FRAME {
                self.unknown = true;
                return;
            }
            let whole = tuttid_proto::frame::HEADER_LEN + len as usize;
            if self.partial.len() < whole {
                return;
            }
            self.partial.drain(..whole);
            self.frames += 1;
        }
    }
}

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |acc, i| acc | u64::from(self.byte().unwrap_or(0)) << (8 * i))
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.data.len());
        let (a, b) = self.data.split_at(n);
        self.data = b;
        a.to_vec()
    }

    fn send(&mut self, req: &Request, fds: &[std::os::fd::BorrowedFd<'_>]) {
        self.send_raw(&req.encode(), fds);
    }

    /// Sends one frame of `payload` and notes what the daemon will read.
    fn send_raw(&mut self, payload: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) {
        match send_frame(&self.sock, payload, fds) {
            Ok(()) => {
                let len = payload.len() as u32;
                self.sent.push(&tuttid_proto::frame::MAGIC.to_le_bytes());
                self.sent.push(&len.to_le_bytes());
                self.sent.push(payload);
            }
            // Refused before anything was sent (empty, too long).
            Err(tuttid_proto::frame::FrameError::Decode(_)) => {}
            Err(_) => self.sent.unknown = true,
        }
    }

    /// Whether a reply may arrive without the script sending more: one is
    /// owed, the stream is past knowing, or something (a frame, the end of
    /// the connection) is already there to read.
    fn reply_may_come(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        if self.sent.unknown || self.sent.frames > self.received {
            return true;
        }
        let mut fds = [PollFd::new(&self.sock, PollFlags::IN)];
        poll(&mut fds, Some(&Timespec { tv_sec: 0, tv_nsec: 0 })).map_or(true, |n| n > 0)
    }

    /// Reads one reply, keeping what it grants.
    fn reply(&mut self) -> Option<Response> {
        if !self.reply_may_come() {
            return None;
        }
        let f = recv_frame(&self.sock).ok()?;
        self.received += 1;
        let r = Response::decode(&f.payload).ok()?;
        match &r {
            Response::QueueGranted(g) => self.keep_queue(g, f.fds),
            Response::MemoryRegistered { id, iova, len } => self.regions.push((*id, *iova, *len)),
            _ => {}
        }
        Some(r)
    }

    fn keep_queue(&mut self, g: &tuttid_proto::message::QueueGrant, fds: Vec<OwnedFd>) {
        let Ok([sq, _cq, db]) = <[OwnedFd; 3]>::try_from(fds) else { return };
        let (Ok(sq), Ok(db)) = (MappedFd::map(sq, 0, g.sq_len), MappedFd::map(db, 0, 4096)) else { return };
        let Ok(page) = usize::try_from(g.doorbell_page) else { return };
        self.queues.push(Queue { qid: g.qid, entries: g.entries, sq, db, db_base: page });
    }

    fn drive(&mut self) -> String {
        if self.byte().unwrap_or(0) < 240 {
            "d0".into()
        } else {
            "nope".into()
        }
    }

    fn step(&mut self, op: u8) {
        match op % 12 {
            0 => {
                let v = if self.byte().unwrap_or(0) < 230 { tuttid_proto::PROTOCOL_VERSION } else { 7 };
                self.send(&Request::Hello { version: v }, &[]);
            }
            1 => {
                let n = usize::from(self.byte().unwrap_or(0));
                let bytes = self.take(n);
                self.send_raw(&bytes, &[]);
            }
            2 => {
                let n = usize::from(self.byte().unwrap_or(0) % 12);
                let bytes = self.take(n);
                match std::io::Write::write_all(&mut &self.sock, &bytes) {
                    Ok(()) => self.sent.push(&bytes),
                    Err(_) => self.sent.unknown = true,
                }
            }
            3 => {
                let (drive, entries) = (self.drive(), u32::from(self.byte().unwrap_or(0)) * 4);
                self.send(&Request::GrantQueue { drive, entries }, &[]);
            }
            4 => self.register(),
            5 => self.sqe(),
            6 => self.doorbell(false),
            7 => self.doorbell(true),
            8 => {
                let id = self.pick_region().map_or_else(|| self.u64(), |r| r.0);
                self.send(&Request::UnregisterMemory { id }, &[]);
            }
            9 => {
                let b = u16::from(self.byte().unwrap_or(0));
                let qid = self.queues.first().map_or(b, |q| q.qid);
                let drive = self.drive();
                self.send(&Request::ReleaseQueue { drive, qid }, &[]);
            }
            10 => {
                let req = match self.byte().unwrap_or(0) % 3 {
                    0 => Request::Heartbeat,
                    1 => Request::Status,
                    _ => Request::OpenDrive { drive: self.drive() },
                };
                self.send(&req, &[]);
            }
            _ => {
                let _ = self.reply();
            }
        }
    }

    fn pick_region(&mut self) -> Option<(u64, u64, u64)> {
        let n = self.regions.len();
        let b = usize::from(self.byte().unwrap_or(0));
        (n > 0).then(|| self.regions[b % n])
    }

    /// A RegisterMemory with a descriptor of a fuzzed kind.
    fn register(&mut self) {
        let kind = self.byte().unwrap_or(0) % 6;
        let (offset, len) = ((self.u64() % 4) * 4096, (u64::from(self.byte().unwrap_or(1)) % 17) * 4096);
        let drive = self.drive();
        let req = Request::RegisterMemory { drive, offset, len };
        let fd: Option<OwnedFd> = match kind {
            0 | 1 => {
                // An honest, sealed, fully allocated memfd.
                if let Ok(m) = SharedMemory::new(64 << 10) {
                    self.send(&req, &[m.fd()]);
                    self.memory.push(m);
                }
                None
            }
            2 => memfd(64 << 10),
            3 => memfd(1 << 40),
            4 => std::fs::File::open("/dev/null").ok().map(OwnedFd::from),
            _ => rustix::pipe::pipe().ok().map(|(r, _w)| r),
        };
        if let Some(fd) = fd {
            self.send(&req, &[fd.as_fd()]);
        }
    }

    /// Writes a fuzzed SQE into a held queue's shadow SQ, its PRPs often
    /// aimed inside one of the script's registrations.
    fn sqe(&mut self) {
        let n = self.queues.len();
        if n == 0 {
            return;
        }
        let qi = usize::from(self.byte().unwrap_or(0)) % n;
        let slot = u32::from(self.byte().unwrap_or(0)) % self.queues[qi].entries.max(1);
        let mut sqe = [0u8; 64];
        let raw = self.take(64);
        sqe[..raw.len()].copy_from_slice(&raw);
        const OPS: [u8; 6] = [0x01, 0x02, 0x00, 0x08, 0x06, 0x09]; // Write, Read, Flush, Write Zeroes, (admin) Identify, DSM
        sqe[0] = OPS[usize::from(sqe[0]) % OPS.len()];
        sqe[4..8].copy_from_slice(&1u32.to_le_bytes()); // NSID 1 (the fuzzed bytes may keep it)
        if let Some((_, iova, len)) = self.pick_region() {
            let at = iova + (self.u64() % len.max(1)) / 4096 * 4096;
            sqe[24..32].copy_from_slice(&at.to_le_bytes()); // PRP1
        }
        let q = &self.queues[qi];
        let off = slot as usize * 64;
        if off + 64 <= q.sq.len() {
            // SAFETY: `q.sq` maps at least `off + 64` bytes of the shadow
            // SQ memfd for as long as `q` lives; the daemon reads this
            // memory only when a doorbell names the slot, and a torn read
            // is one more hostile SQE, which is what this target feeds it.
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::copy_nonoverlapping(sqe.as_ptr(), q.sq.as_ptr().add(off), 64);
            }
        }
    }

    /// Writes a fuzzed value to a held queue's SQ tail or CQ head doorbell.
    fn doorbell(&mut self, cq: bool) {
        let n = self.queues.len();
        if n == 0 {
            return;
        }
        let b = usize::from(self.byte().unwrap_or(0));
        let q = &self.queues[b % n];
        let value = u32::from(self.data.first().copied().unwrap_or(1)) % (q.entries + 2);
        let at = nvme_regs::registers::doorbell_offset(q.qid, cq, daemon().dstrd).wrapping_sub(q.db_base);
        if at + 4 <= q.db.len() && at.is_multiple_of(4) {
            // SAFETY: `q.db` maps the 4096-byte doorbell page; `at + 4` is
            // inside it and 4-byte aligned.
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::write_volatile(q.db.as_ptr().add(at).cast::<u32>(), value);
            }
        }
        let _ = self.byte();
    }
}

/// A memfd of `len` bytes, unsealed, never written (sparse).
fn memfd(len: u64) -> Option<OwnedFd> {
    let fd = rustix::fs::memfd_create(
        "fuzz",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .ok()?;
    rustix::fs::ftruncate(&fd, len).ok()?;
    Some(fd)
}

/// The body.
pub fn tuttid_session(data: &[u8]) {
    let d = daemon();
    let sock = UnixStream::connect(&d.socket).expect("the daemon accepts a connection");
    let made = d.connections.fetch_add(1, Ordering::Relaxed) + 1;
    let _ = sock.set_read_timeout(Some(Duration::from_millis(20)));
    let _ = sock.set_write_timeout(Some(Duration::from_millis(500)));
    let mut s = Script {
        sock,
        data,
        queues: Vec::new(),
        regions: Vec::new(),
        memory: Vec::new(),
        sent: Sent::default(),
        received: 0,
    };
    for _ in 0..64 {
        let Some(op) = s.byte() else { break };
        s.step(op);
    }
    drop(s);
    // Everything the script held comes back once the daemon sees it gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    let st = loop {
        let st = d.server.status();
        // Every connection closed so far (this script's too, even one the
        // daemon had not yet accepted when it hung up) has been reclaimed,
        // and only the persistent honest client is left.
        let whole = st.reclaimed >= made
            && st.clients.len() == 1
            && st.drives.iter().all(|r| r.queues_free == r.queues_total && r.registrations == 0);
        let left = deadline.saturating_duration_since(Instant::now());
        if whole || left.is_zero() {
            break st;
        }
        // Each reclaim ends with the count going up (notified), and the
        // report shows every reclaim its count includes: wait for the next.
        d.server.wait_reclaimed(st.reclaimed, left);
    };
    assert!(st.reclaimed >= made, "{made} connections made, {} reclaimed: {st:?}", st.reclaimed);
    assert_eq!(st.clients.len(), 1, "a hung-up client is still listed (or the honest one is gone): {st:?}");
    for r in &st.drives {
        assert_eq!(r.queues_free, r.queues_total, "queues not reclaimed: {r:?}");
        assert_eq!(r.registrations, 0, "registrations not reclaimed: {r:?}");
        assert_eq!(r.dma_faults, 0, "the drive touched memory outside every mapping: {r:?}");
    }
    // The persistent honest client is still connected, listed, and served.
    let report = d.honest.status().expect("the honest client is still served");
    assert_eq!(report.clients.len(), 1, "only the honest client is connected: {report:?}");
    assert!(!d.honest.is_dead(), "the honest client's connection is alive");
    // Now and then a new honest connection must also be accepted and
    // served (the hostile one of every script is accepted too).
    if d.scripts.fetch_add(1, Ordering::Relaxed).is_multiple_of(FRESH_HONEST_EVERY) {
        d.connections.fetch_add(1, Ordering::Relaxed);
        let c = tuttid_proto::Client::connect(&d.socket).expect("a new honest client is served");
        assert!(c.status().is_ok(), "a new honest client's Status is answered");
    }
}

#[cfg(test)]
mod stale_dirs {
    use super::{remove_stale_dirs, DIR_PREFIX};

    #[test]
    fn only_folders_of_processes_no_longer_running_are_removed() {
        let tmp = std::env::temp_dir().join(format!("stale-dirs-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let live = tmp.join(format!("{DIR_PREFIX}{}", std::process::id()));
        let dead = tmp.join(format!("{DIR_PREFIX}4000000000")); // above any pid_max
        let other = tmp.join(format!("{DIR_PREFIX}not-a-pid"));
        for d in [&live, &dead, &other] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("s.sock"), b"").unwrap();
        }
        remove_stale_dirs(&tmp);
        assert!(live.exists(), "this process's folder stays");
        assert!(!dead.exists(), "a dead process's folder goes");
        assert!(other.exists(), "a folder not named by a pid stays");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
