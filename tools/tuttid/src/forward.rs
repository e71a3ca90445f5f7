//! Daemon-forwarded ("shadow") doorbells, for drives whose doorbells share
//! one BAR0 page (CAP.DSTRD < 10: every real drive; see docs/tuttid.md).
//!
//! A client never maps BAR0. Each granted queue pair gets a shadow page, a
//! 4 KiB memfd shared with the client, laid out as queue pair `qid`'s
//! doorbell page at CAP.DSTRD = 9: the SQ tail word at byte 0, the CQ head
//! word at byte 2048. The client's driver is unchanged: the daemon reports
//! DSTRD 9 in `DriveFacts` and the client maps the shadow page at
//! `1000h + qid * 4096` of its register window, so its "doorbell stores"
//! land in shared memory. One forwarding thread per drive polls the shadow
//! words of the drive's granted queues and writes each changed, valid value
//! to the real doorbell with one 32-bit store through BAR0's [`Mmio`].
//!
//! This is the shape of NVMe's Doorbell Buffer Config command (Base 2.0,
//! 5.8: "Shadow Doorbell buffer" in host memory that an emulated
//! controller polls, used by QEMU's and cloud hypervisors' emulated NVMe),
//! with the daemon in the controller's place.
//!
//! Validation ([`check`], [`Track`]): a value must be an entry index of
//! its queue (`< entries`), an SQ tail may add no more entries than the SQ
//! has free (its head is the SQHD of the newest completion the controller
//! posted), and a CQ head may pass only completions the controller posted
//! (the CQ ring, read here, phase tag first). A value that breaks a rule
//! is counted (`invalid`), never forwarded, and ends the client's lease
//! (its connection is shut down, so the daemon reclaims its queues), so a
//! client cannot make the controller see an Invalid Doorbell Write (an
//! asynchronous error that some controllers treat as fatal). A client can
//! still only ring its own queues: the shadow page is the only thing it
//! holds, and the forwarder maps each page to exactly one qid. The CQ ring
//! is mapped writable in the client too: a client that forges completions
//! in its own CQ can still mislead the SQ head bound (docs/tuttid.md).
//!
//! Mediated queue pairs ([`Forwarder::attach_mediated`], the default on
//! `pci` drives) go further: the forwarder also checks and copies each SQE
//! from the client's shadow SQ into the controller's SQ and copies each
//! completion into the client's CQ ([`crate::mediate`]); their doorbell
//! values are the controller's own indices, written by the daemon.
//!
//! Cost: while any shadow word changed within the last [`SPIN_FOR`] (the
//! drive's `forward_spin_us`), the
//! thread polls without sleeping (one core, yielding to other runnable
//! threads between passes); after that it sleeps [`IDLE_SLEEP`] between
//! passes. A doorbell therefore reaches the controller within one pass
//! (well under a microsecond for a few queues) while busy, and within
//! about `IDLE_SLEEP` plus the kernel's timer slack (~50 µs) after idling.
//!
//! An emulated drive on a virtual clock ([`crate::Server::start_on`], for
//! tests and fuzzing) has no controller thread: after each pass the
//! forwarding thread steps it, moving its time on by [`IDLE_SLEEP`], so
//! what a pass forwarded is fetched and completed before the next one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvm_queue::{Clock, Mmio, NvmeDevice, VirtualClock};
use nvme_regs::registers::doorbell_offset;
use tuttid_proto::shm::{sealed_memfd, MappedFd, PAGE};
use tuttid_proto::ForwardingCounters;

use crate::mediate::{MediatedQueue, Violation};

/// CAP.DSTRD of the shadow layout the client sees: a 2048-byte stride puts
/// queue pair y's two doorbells in page y + 1 of the register window.
pub const SHADOW_DSTRD: u8 = 9;
/// Byte offset of the CQ head word in a shadow page (SQ tail at 0).
pub const SHADOW_CQ_OFFSET: usize = 2048;
/// Default time to keep polling without sleeping after the last change
/// (the drive config's `forward_spin_us`).
pub const SPIN_FOR: Duration = Duration::from_micros(200);
/// Sleep between passes once idle.
pub const IDLE_SLEEP: Duration = Duration::from_micros(20);
/// Sleep between passes while no queue is granted.
const EMPTY_SLEEP: Duration = Duration::from_millis(1);

/// Whether a shadow value may be forwarded to a doorbell of a queue of
/// `entries` entries: it must be an entry index.
pub fn check(value: u32, entries: u32) -> bool {
    value < entries
}

/// Ends a client's lease (shuts its connection down) when it breaks a
/// doorbell rule.
#[derive(Clone)]
pub struct LeaseEnd(pub Arc<dyn Fn() + Send + Sync>);

impl LeaseEnd {
    /// Ends the lease.
    pub fn end(&self) {
        (self.0)();
    }
}

impl std::fmt::Debug for LeaseEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseEnd")
    }
}

/// What the forwarder knows of one queue pair's rings: the doorbell values
/// it forwarded, the SQ head the controller reported, and how far it has
/// read the controller's completions. Indices are entry indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Track {
    entries: u32,
    /// SQ tail last forwarded.
    sq_tail: u32,
    /// SQ head: SQHD of the newest completion read.
    sq_head: u32,
    /// CQ head last forwarded.
    cq_head: u32,
    /// Next CQ slot to read, and the phase tag a new completion there has.
    cq_next: u32,
    phase: bool,
}

impl Track {
    /// A new queue pair of `entries` entries (all indices 0, phase 1).
    pub fn new(entries: u32) -> Self {
        Self { entries, sq_tail: 0, sq_head: 0, cq_head: 0, cq_next: 0, phase: true }
    }

    /// Ring distance from `a` forward to `b`.
    fn dist(&self, a: u32, b: u32) -> u32 {
        (b + self.entries - a) % self.entries
    }

    /// Completions posted and not yet released by a forwarded CQ head.
    fn posted(&self) -> u32 {
        self.dist(self.cq_head, self.cq_next)
    }

    /// Whether the CQ may hold another completion that was not read yet.
    fn may_read(&self) -> bool {
        self.posted() < self.entries - 1
    }

    /// A completion read at `cq_next` (its phase matched) reporting SQ head
    /// `sqhd`. `false` when no controller could have posted it: SQHD
    /// outside what was forwarded (a forged entry).
    pub fn completion(&mut self, sqhd: u32) -> bool {
        if sqhd >= self.entries || self.dist(self.sq_head, sqhd) > self.dist(self.sq_head, self.sq_tail) {
            return false;
        }
        self.sq_head = sqhd;
        self.cq_next = (self.cq_next + 1) % self.entries;
        if self.cq_next == 0 {
            self.phase = !self.phase;
        }
        true
    }

    /// A new SQ tail: taken when it is an entry index and adds no more
    /// entries than the SQ has free (one slot always empty).
    pub fn sq_tail(&mut self, v: u32) -> bool {
        let used = self.dist(self.sq_head, self.sq_tail);
        if !check(v, self.entries) || used + self.dist(self.sq_tail, v) > self.entries - 1 {
            return false;
        }
        self.sq_tail = v;
        true
    }

    /// A new CQ head: taken when it passes only completions read.
    pub fn cq_head(&mut self, v: u32) -> bool {
        if !check(v, self.entries) || self.dist(self.cq_head, v) > self.posted() {
            return false;
        }
        self.cq_head = v;
        true
    }
}

/// A queue pair's CQ ring as the forwarder reads it.
struct CqView {
    /// Atomic view of `_ring` (declared first: dropped before it).
    words: Mmio,
    _ring: Arc<MappedFd>,
}

/// One granted queue pair's shadow page.
struct Shadow {
    qid: u16,
    /// Atomic view of `_page` (declared first: dropped before the mapping).
    words: Mmio,
    _page: MappedFd,
    /// Last value seen in the SQ tail / CQ head word.
    last: [u32; 2],
    track: Track,
    /// The CQ ring and the lease to end, once the queue exists.
    cq: Option<(CqView, LeaseEnd)>,
    /// A mediated queue pair (instead of `cq`): its rings and the lease.
    mediated: Option<(Box<MediatedQueue>, LeaseEnd)>,
    /// A rule was broken: nothing more is forwarded.
    dead: bool,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow").field("qid", &self.qid).field("track", &self.track).finish()
    }
}

/// Counters of one forwarder.
#[derive(Debug, Default)]
pub struct ForwardStats {
    /// Doorbell values written to the controller.
    pub forwarded: AtomicU64,
    /// Shadow values refused by [`check`] (not forwarded).
    pub invalid: AtomicU64,
    /// Mediated: SQEs checked and copied to a real SQ.
    pub mediated: AtomicU64,
    /// Mediated: SQEs refused (completed by the daemon).
    pub refused: AtomicU64,
    /// Mediated: controller completions with a CID of no outstanding
    /// command (dropped).
    pub stray: AtomicU64,
}

impl ForwardStats {
    /// The counters now, as the status report carries them.
    pub fn snapshot(&self) -> ForwardingCounters {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ForwardingCounters {
            doorbells_forwarded: n(&self.forwarded),
            doorbells_invalid: n(&self.invalid),
            sqes_mediated: n(&self.mediated),
            sqes_refused: n(&self.refused),
            stray_completions: n(&self.stray),
        }
    }
}

/// The forwarding thread of one drive and the shadow pages it polls.
#[derive(Debug)]
pub struct Forwarder {
    name: String,
    device: Arc<dyn NvmeDevice>,
    /// The controller's CAP.DSTRD (real doorbell layout).
    dstrd: u8,
    /// Poll without sleeping this long after the last change.
    spin_for: Duration,
    /// The virtual clock the drive's emulator runs on, stepped after
    /// every pass; `None` for a device that runs by itself.
    clock: Option<Arc<VirtualClock>>,
    shadows: Mutex<Vec<Shadow>>,
    stop: AtomicBool,
    /// Counters.
    pub stats: ForwardStats,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Forwarder {
    /// Starts the forwarding thread of drive `name`, whose controller
    /// (`device`) has doorbell stride CAP.DSTRD = `dstrd`; it polls without
    /// sleeping for `spin_for` after each change, and steps `clock` (the
    /// virtual clock `device` runs on, if any) after every pass.
    ///
    /// # Errors
    ///
    /// The thread could not be spawned.
    pub fn start(
        name: &str,
        device: Arc<dyn NvmeDevice>,
        (dstrd, spin_for): (u8, Duration),
        clock: Option<Arc<VirtualClock>>,
    ) -> std::io::Result<Arc<Self>> {
        let f = Arc::new(Self {
            name: name.to_owned(),
            device,
            dstrd,
            spin_for,
            clock,
            shadows: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            stats: ForwardStats::default(),
            thread: Mutex::new(None),
        });
        let me = f.clone();
        let t = std::thread::Builder::new().name(format!("tuttid-fwd-{name}")).spawn(move || me.run())?;
        *lock(&f.thread) = Some(t);
        Ok(f)
    }

    /// A fresh, zeroed shadow page for a new grant of queue pair `qid`
    /// (`entries` per ring), registered for forwarding. Its words start at
    /// 0, as a new queue's doorbells, so nothing is forwarded before the
    /// client rings: it may be added before the queue is created (the
    /// daemon does, and removes it if creation fails). Returns the client's
    /// copy of the page's descriptor.
    ///
    /// # Errors
    ///
    /// Creating or mapping the memfd failed (a message).
    #[allow(unsafe_code)] // Mmio::new's contract, stated at the call
    pub fn add(&self, qid: u16, entries: u32) -> Result<std::os::fd::OwnedFd, String> {
        let fd = sealed_memfd("tuttid-shadow-doorbells", PAGE).map_err(|e| format!("shadow memfd: {e}"))?;
        let theirs = fd.try_clone().map_err(|e| format!("dup: {e}"))?;
        let page = MappedFd::map(fd, 0, PAGE as u64).map_err(|e| format!("shadow mmap: {e}"))?;
        // SAFETY: `page` is mapped read-write for PAGE bytes and lives in the
        // same `Shadow` as the Mmio, declared after it (dropped later); the
        // daemon only accesses it through the Mmio's atomic 32-bit loads
        // (the client's stores are another process's atomics).
        let words =
            unsafe { Mmio::new(page.as_ptr(), page.len()) }.map_err(|e| format!("shadow page: {e}"))?;
        let track = Track::new(entries);
        lock(&self.shadows).push(Shadow {
            qid,
            words,
            _page: page,
            last: [0, 0],
            track,
            cq: None,
            mediated: None,
            dead: false,
        });
        Ok(theirs)
    }

    /// Gives the forwarder queue pair `qid`'s CQ ring (mapped here, the
    /// controller's writes land in it) and the lease to end when its
    /// client breaks a doorbell rule. Until this is called no doorbell of
    /// `qid` is forwarded.
    ///
    /// # Errors
    ///
    /// The ring is not 4-byte aligned (a message).
    #[allow(unsafe_code)] // Mmio::new's contract, stated at the call
    pub fn attach(&self, qid: u16, cq: Arc<MappedFd>, lease_end: LeaseEnd) -> Result<(), String> {
        // SAFETY: `cq` is mapped for its length and kept alive by the Arc
        // stored beside the Mmio (dropped after it); it is only read here,
        // through the Mmio's atomic 32-bit loads.
        let words = unsafe { Mmio::new(cq.as_ptr(), cq.len()) }.map_err(|e| format!("CQ ring: {e}"))?;
        let mut shadows = lock(&self.shadows);
        let s =
            shadows.iter_mut().find(|s| s.qid == qid).ok_or_else(|| format!("no shadow page for {qid}"))?;
        s.cq = Some((CqView { words, _ring: cq }, lease_end));
        Ok(())
    }

    /// Gives the forwarder queue pair `qid`'s mediated rings (its shadow
    /// page must have been added) and the lease to end when its client
    /// breaks a queue rule. Until this is called nothing of `qid` is
    /// forwarded.
    ///
    /// # Errors
    ///
    /// No shadow page for `qid` (a message).
    pub fn attach_mediated(&self, qid: u16, q: MediatedQueue, lease_end: LeaseEnd) -> Result<(), String> {
        let mut shadows = lock(&self.shadows);
        let s =
            shadows.iter_mut().find(|s| s.qid == qid).ok_or_else(|| format!("no shadow page for {qid}"))?;
        s.mediated = Some((Box::new(q), lease_end));
        Ok(())
    }

    /// Stops forwarding for `qid` (before its SQ is deleted: a doorbell of
    /// a deleted queue is an invalid write). When this returns, the thread
    /// writes no doorbell of `qid` any more.
    pub fn remove(&self, qid: u16) {
        lock(&self.shadows).retain(|s| s.qid != qid);
    }

    /// Stops the thread and waits for it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    fn run(&self) {
        let mut last_change = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let (changed, queues) = self.pass();
            if let Some(clock) = &self.clock {
                // The emulator's turn (outside `pass`: no shadow locked):
                // it fetches what was just forwarded and posts completions,
                // which the next pass reads.
                clock.sleep(IDLE_SLEEP);
            }
            if changed {
                last_change = Instant::now();
            } else if queues == 0 {
                std::thread::sleep(EMPTY_SLEEP);
            } else if last_change.elapsed() > self.spin_for {
                std::thread::sleep(IDLE_SLEEP);
            } else {
                // Busy: poll again at once, but let other runnable threads
                // of this CPU go first (a small VM, an oversubscribed
                // host); with nothing else runnable this returns at once.
                std::thread::yield_now();
            }
        }
    }

    /// One pass over the shadow pages: forwards every changed, valid word
    /// (the CQ head first: it frees CQ room the SQ tail may use); a word
    /// that breaks a rule ends its client's lease. Returns whether any
    /// word changed and how many queues there are.
    fn pass(&self) -> (bool, usize) {
        let mut shadows = lock(&self.shadows);
        let mut changed = false;
        for s in shadows.iter_mut() {
            if s.dead {
                continue;
            }
            if s.mediated.is_some() {
                changed |= self.pass_mediated(s);
                continue;
            }
            for (i, is_cq) in [(1, true), (0, false)] {
                let off = if is_cq { SHADOW_CQ_OFFSET } else { 0 };
                // Acquire: the client's SQE stores before its shadow store
                // are visible to this thread, and so ordered before the
                // doorbell store below (Release).
                let Ok(v) = s.words.read32(off) else { continue };
                if v == s.last[i] {
                    continue;
                }
                s.last[i] = v;
                changed = true;
                if !self.admit(s, is_cq, v) {
                    self.violation(s, is_cq, v);
                    break;
                }
                self.ring(s.qid, is_cq, v);
            }
        }
        (changed, shadows.len())
    }

    /// One pass over a mediated queue pair: its completions copied, its new
    /// SQEs checked and copied, the real doorbells written. Returns whether
    /// anything changed.
    fn pass_mediated(&self, s: &mut Shadow) -> bool {
        let (Ok(sq), Ok(cq)) = (s.words.read32(0), s.words.read32(SHADOW_CQ_OFFSET)) else { return false };
        let changed = [sq, cq] != s.last;
        s.last = [sq, cq];
        let Some((q, _)) = &mut s.mediated else { return false };
        match q.pass(sq, cq) {
            Ok(p) => {
                let st = &self.stats;
                st.mediated.fetch_add(p.forwarded, Ordering::Relaxed);
                st.refused.fetch_add(p.refused, Ordering::Relaxed);
                st.stray.fetch_add(p.stray, Ordering::Relaxed);
                if let Some(h) = p.cq_head {
                    self.ring(s.qid, true, h);
                }
                if let Some(t) = p.sq_tail {
                    self.ring(s.qid, false, t);
                }
                changed || p.moved()
            }
            Err(v) => {
                let is_cq = matches!(v, Violation::CqHead { .. });
                self.violation(s, is_cq, if is_cq { cq } else { sq });
                true
            }
        }
    }

    /// Whether doorbell value `v` of `s` may be forwarded (taking it into
    /// the queue's [`Track`] if so). Completions are read first, and read
    /// again before a refusal: the client may have seen one posted after
    /// this pass's first read.
    fn admit(&self, s: &mut Shadow, is_cq: bool, v: u32) -> bool {
        let Some((cq, _)) = &s.cq else { return false };
        let take = |t: &mut Track| if is_cq { t.cq_head(v) } else { t.sq_tail(v) };
        for _ in 0..2 {
            if !read_completions(&mut s.track, &cq.words) {
                return false;
            }
            let mut t = s.track;
            if take(&mut t) {
                s.track = t;
                return true;
            }
        }
        false
    }

    /// `s`'s client broke a rule with value `v`: counted, nothing more of
    /// the queue forwarded, and its lease ended (the daemon then deletes
    /// the queue and reclaims the client).
    fn violation(&self, s: &mut Shadow, is_cq: bool, v: u32) {
        self.stats.invalid.fetch_add(1, Ordering::Relaxed);
        s.dead = true;
        let which = if is_cq { "CQ head" } else { "SQ tail" };
        tracing::warn!(drive = %self.name, qid = s.qid, which, value = v, track = ?s.track,
            "doorbell value refused; ending the client's lease");
        if let Some((_, end)) = &s.cq {
            end.end();
        }
        if let Some((_, end)) = &s.mediated {
            end.end();
        }
    }

    fn ring(&self, qid: u16, is_cq: bool, value: u32) {
        #[cfg(not(target_arch = "x86_64"))]
        // As `nvm_queue::Doorbell::ring`: order normal-memory stores (seen
        // through the shadow word) before the device-memory store.
        std::sync::atomic::fence(Ordering::SeqCst);
        match self.device.bar0().write32(doorbell_offset(qid, is_cq, self.dstrd), value) {
            Ok(()) => {
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats.invalid.fetch_add(1, Ordering::Relaxed);
                tracing::error!(drive = %self.name, qid, error = %e, "doorbell outside BAR0");
            }
        }
    }
}

/// Reads the completions the controller posted since the last read into
/// `t` (phase tag first, Acquire, then SQHD). `false` for one no
/// controller could have posted.
fn read_completions(t: &mut Track, cq: &Mmio) -> bool {
    while t.may_read() {
        let off = t.cq_next as usize * 16;
        let Ok(dw3) = cq.read32(off + 12) else { return false };
        if (dw3 >> 16) & 1 != u32::from(t.phase) {
            return true;
        }
        let Ok(dw2) = cq.read32(off + 8) else { return false };
        if !t.completion(dw2 & 0xffff) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sq(mut t: Track, v: u32) -> bool {
        t.sq_tail(v)
    }

    fn cqh(mut t: Track, v: u32) -> bool {
        t.cq_head(v)
    }

    #[test]
    fn sq_tails_never_overflow_and_cq_heads_never_pass_what_was_posted() {
        let mut t = Track::new(4);
        assert!(!sq(t, 4), "not an index");
        assert!(t.sq_tail(2));
        // Three usable slots of four: a third entry fits, a fourth not.
        let mut full = t;
        assert!(full.sq_tail(3));
        assert!(!full.sq_tail(0), "a fourth entry would overflow the SQ");
        // Nothing posted: no CQ head may move.
        assert!(!cqh(t, 1));
        // The controller fetched one command and posted its completion
        // (SQHD 1): one CQ entry may be released, and one more SQ slot.
        assert!(t.completion(1));
        assert!(!cqh(t, 2), "past the one posted completion");
        assert!(t.cq_head(1));
        assert!(t.sq_tail(0), "tail 2 -> 0 adds 2 with head 1: 3 used");
        assert!(!sq(t, 1), "would overflow");
        // A completion reporting an SQ head past the forwarded tail is forged.
        let mut forged = Track::new(4);
        assert!(forged.sq_tail(1));
        assert!(!forged.completion(2));
        assert!(!forged.completion(9));
    }

    #[test]
    fn completions_are_read_by_phase_tag() {
        let mem = sealed_memfd("cq", PAGE).unwrap();
        let ring = MappedFd::map(mem, 0, PAGE as u64).unwrap();
        // SAFETY: `ring` is mapped for PAGE bytes and outlives `cq`.
        #[allow(unsafe_code)]
        let cq = unsafe { Mmio::new(ring.as_ptr(), ring.len()) }.unwrap();
        let mut t = Track::new(4);
        assert!(t.sq_tail(3));
        assert!(read_completions(&mut t, &cq));
        assert!(!cqh(t, 1), "nothing posted yet");
        let post = |slot: usize, sqhd: u32, phase: u32| {
            cq.write32(slot * 16 + 8, sqhd).unwrap();
            cq.write32(slot * 16 + 12, phase << 16).unwrap();
        };
        post(0, 1, 1);
        post(1, 3, 1);
        assert!(read_completions(&mut t, &cq));
        assert!(cqh(t, 2) && !cqh(t, 3));
        assert!(t.cq_head(2));
        assert!(t.sq_tail(1), "head 3: tail 3 -> 1 adds 2 of 3 free");
        // A forged completion (SQHD past the tail) is refused.
        post(2, 2, 1);
        assert!(!read_completions(&mut t, &cq));
    }

    #[test]
    fn only_entry_indices_pass() {
        assert!(check(0, 2) && check(1, 2));
        assert!(!check(2, 2) && !check(u32::MAX, 64) && !check(0, 0));
        assert!(check(1023, 1024) && !check(1024, 1024));
    }

    #[test]
    fn shadow_layout_is_the_dstrd_9_doorbell_page() {
        for qid in [1u16, 7, 63] {
            let page = 0x1000 + usize::from(qid) * PAGE;
            assert_eq!(doorbell_offset(qid, false, SHADOW_DSTRD), page);
            assert_eq!(doorbell_offset(qid, true, SHADOW_DSTRD), page + SHADOW_CQ_OFFSET);
        }
    }
}
