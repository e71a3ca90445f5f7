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
//! Validation ([`check`]): a value must be an entry index of its queue
//! (`< entries`); anything else is counted (`invalid`) and not forwarded,
//! so a client cannot make the controller see an Invalid Doorbell Write
//! (an asynchronous error that some controllers treat as fatal). A client
//! can still only ring its own queues: the shadow page is the only thing
//! it holds, and the forwarder maps each page to exactly one qid.
//!
//! Cost: while any shadow word changed within the last [`SPIN_FOR`] (the
//! drive's `forward_spin_us`), the
//! thread polls without sleeping (one core, yielding to other runnable
//! threads between passes); after that it sleeps [`IDLE_SLEEP`] between
//! passes. A doorbell therefore reaches the controller within one pass
//! (well under a microsecond for a few queues) while busy, and within
//! about `IDLE_SLEEP` plus the kernel's timer slack (~50 µs) after idling.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvm_queue::{Mmio, NvmeDevice};
use nvme_regs::registers::doorbell_offset;
use tuttid_proto::shm::{sealed_memfd, MappedFd, PAGE};

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

/// One granted queue pair's shadow page.
#[derive(Debug)]
struct Shadow {
    qid: u16,
    entries: u32,
    /// Atomic view of `_page` (declared first: dropped before the mapping).
    words: Mmio,
    _page: MappedFd,
    /// Last value seen in the SQ tail / CQ head word.
    last: [u32; 2],
}

/// Counters of one forwarder.
#[derive(Debug, Default)]
pub struct ForwardStats {
    /// Doorbell values written to the controller.
    pub forwarded: AtomicU64,
    /// Shadow values refused by [`check`] (not forwarded).
    pub invalid: AtomicU64,
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
    /// sleeping for `spin_for` after each change.
    ///
    /// # Errors
    ///
    /// The thread could not be spawned.
    pub fn start(
        name: &str,
        device: Arc<dyn NvmeDevice>,
        dstrd: u8,
        spin_for: Duration,
    ) -> std::io::Result<Arc<Self>> {
        let f = Arc::new(Self {
            name: name.to_owned(),
            device,
            dstrd,
            spin_for,
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
        lock(&self.shadows).push(Shadow { qid, entries, words, _page: page, last: [0, 0] });
        Ok(theirs)
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

    /// One pass over the shadow pages: forwards every changed, valid word.
    /// Returns whether any word changed and how many queues there are.
    fn pass(&self) -> (bool, usize) {
        let mut shadows = lock(&self.shadows);
        let mut changed = false;
        for s in shadows.iter_mut() {
            for (i, is_cq) in [false, true].into_iter().enumerate() {
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
                if !check(v, s.entries) {
                    self.stats.invalid.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                self.ring(s.qid, is_cq, v);
            }
        }
        (changed, shadows.len())
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

#[cfg(test)]
mod tests {
    use super::*;

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
