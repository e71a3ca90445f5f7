//! What the [`crate::Emulator`] handle and the controller share: the
//! register page, the IOVA space, the media, fault rules, counters and the
//! flags that stop the controller.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::dma::IovaSpace;
use crate::fault::Faults;
use crate::media::Media;
use crate::regs::RegisterPage;
use crate::stats::StatsAtomics;

/// State shared between the [`crate::Emulator`] handle and its controller.
#[derive(Debug)]
pub(crate) struct Shared {
    pub regs: RegisterPage,
    pub iova: IovaSpace,
    /// DMA domain of each qid's next I/O SQ, by qid (index 0 unused:
    /// the admin SQ is always [`crate::SHARED_DOMAIN`]);
    /// [`crate::Emulator::set_sq_domain`] writes, Create I/O SQ reads.
    pub sq_domains: Box<[std::sync::atomic::AtomicU32]>,
    pub stats: StatsAtomics,
    pub stop: AtomicBool,
    /// Fault-injection rules ([`crate::FaultRule`]).
    pub faults: Faults,
    /// The device is gone ([`crate::Emulator::set_gone`],
    /// [`crate::EmulatorConfig::registers_all_ones`]): the thread only keeps the
    /// register page all ones.
    pub gone: AtomicBool,
    /// What the register page of a gone device reads: `u32::MAX` (gone) or
    /// 0 (memory space disabled, [`crate::Emulator::disable_memory_space`]).
    pub gone_fill: std::sync::atomic::AtomicU32,
    /// Set by the thread once it has seen `gone` and stopped working.
    pub gone_ack: AtomicBool,
    /// Set by [`nvm_queue::NvmeDevice::expect_doorbells`]: another agent is
    /// about to ring doorbells; the thread polls for `run::KICK_SPIN` before
    /// it naps again.
    pub kick: AtomicBool,
    /// The backing store and write cache. The thread holds the lock for a
    /// poll iteration; the handle takes it for direct media access and a
    /// power failure.
    pub media: Mutex<Media>,
}

impl Shared {
    /// Locks the media (a panic while it was held leaves it usable).
    pub(crate) fn lock_media(&self) -> MutexGuard<'_, Media> {
        self.media.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The device stops answering: the register page reads all ones from
    /// now on and the thread stops working (see `run.rs`).
    pub(crate) fn go_away(&self) {
        self.gone_fill.store(u32::MAX, Ordering::SeqCst);
        self.gone.store(true, Ordering::SeqCst);
        self.regs.fill(u32::MAX);
    }
}
