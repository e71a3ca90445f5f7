//! The emulator's handle: start (on a thread, or on a virtual clock),
//! fault injection, direct media access, DMA domains, and the
//! [`NvmeDevice`] the driver sees.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nvm_queue::{Clock, DeviceError, DmaMapping, Mmio, NvmeDevice, RealClock, VirtualClock};

use crate::config::EmulatorConfig;
use crate::controller::Controller;
use crate::dma::{self, SHARED_DOMAIN};
use crate::error::EmuError;
use crate::external::{ExternalMemory, PageLocker};
use crate::fault::{self, FaultRule};
use crate::media::{self, MediaAccessError, PowerFailReport};
use crate::regs;
use crate::run::{self, Clocked};
use crate::shared::Shared;
use crate::stats::{EmuStats, StatsAtomics};

/// A running software NVMe controller. Dropping it stops and joins the
/// controller thread (or, on a virtual clock, leaves the clock).
pub struct Emulator {
    shared: Arc<Shared>,
    config: EmulatorConfig,
    name: String,
    thread: Option<JoinHandle<()>>,
    /// Set instead of `thread` by [`Emulator::start_on`].
    clocked: Option<Clocked>,
}

impl fmt::Debug for Emulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Emulator").field("name", &self.name).field("stats", &self.stats()).finish()
    }
}

impl Emulator {
    /// Validates `config`, allocates the register page and the backing
    /// store, and spawns the controller thread `nvme-emu-<name>`.
    pub fn start(config: EmulatorConfig) -> Result<Arc<Emulator>, EmuError> {
        let (shared, ctrl) = Self::build(&config)?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nvme-emu-{}", config.name))
            .spawn(move || run::run(thread_shared, ctrl))
            .map_err(EmuError::Spawn)?;
        let name = format!("emu:{}", config.name);
        Ok(Arc::new(Emulator { name, shared, config, thread: Some(thread), clocked: None }))
    }

    /// As [`Emulator::start`], but on virtual time and without a thread:
    /// the controller polls whenever something sleeps on `clock` (before
    /// and after the clock moves, see [`VirtualClock`]), at the clock's
    /// instant, and [`NvmeDevice::clock`] hands `clock` to the driver, so
    /// its bounded waits step this controller. Nothing happens between
    /// sleeps: a host that rings a doorbell sees the completion after its
    /// next sleep on `clock`. For tests and fuzzing: fast and repeatable.
    pub fn start_on(config: EmulatorConfig, clock: Arc<VirtualClock>) -> Result<Arc<Emulator>, EmuError> {
        let (shared, ctrl) = Self::build(&config)?;
        let clocked = Clocked::start(shared.clone(), ctrl, clock);
        let name = format!("emu:{}", config.name);
        Ok(Arc::new(Emulator { name, shared, config, thread: None, clocked: Some(clocked) }))
    }

    fn build(config: &EmulatorConfig) -> Result<(Arc<Shared>, Controller), EmuError> {
        config.validate()?;
        let regs = regs::RegisterPage::new(config)?;
        let media = media::Media::new(config)?;
        let shared = Arc::new(Shared {
            regs,
            iova: dma::IovaSpace::new(),
            sq_domains: (0..=config.io_queues).map(|_| std::sync::atomic::AtomicU32::new(0)).collect(),
            stats: StatsAtomics::default(),
            stop: AtomicBool::new(false),
            faults: fault::Faults::new(config.faults.clone()),
            gone: AtomicBool::new(config.registers_all_ones),
            gone_fill: std::sync::atomic::AtomicU32::new(u32::MAX),
            gone_ack: AtomicBool::new(false),
            kick: AtomicBool::new(false),
            media: std::sync::Mutex::new(media),
        });
        if config.registers_all_ones {
            shared.regs.fill_ones();
        }
        Ok((shared, Controller::new(config.clone())))
    }

    /// The memfd of I/O queue pair `qid`'s doorbell page (SQ tail and CQ
    /// head doorbells, the 4096 bytes at `1000h + qid * 4096` of BAR0),
    /// when the emulator was started with
    /// [`EmulatorConfig::shared_doorbells`] and `1 <= qid <= io_queues`;
    /// `None` otherwise. The admin queue's page is never handed out.
    pub fn doorbell_page_fd(&self, qid: u16) -> Option<std::os::fd::OwnedFd> {
        if qid == 0 {
            return None;
        }
        self.shared.regs.doorbell_page_fd(qid)
    }

    /// Replaces I/O queue pair `qid`'s doorbell page by a fresh, zeroed
    /// memfd page, so a process that mapped the old page (a client whose
    /// lease was reclaimed) can no longer ring this queue's doorbells once
    /// it is granted to someone else. Call it while the queue does not
    /// exist on the controller. `Ok(false)` without shared doorbells.
    ///
    /// # Errors
    ///
    /// [`EmuError::Os`] when the new page cannot be made.
    pub fn renew_doorbell_page(&self, qid: u16) -> Result<bool, EmuError> {
        if qid == 0 {
            return Ok(false);
        }
        self.shared.regs.renew_doorbell_page(qid)
    }

    /// The counters now.
    pub fn stats(&self) -> EmuStats {
        self.shared.stats.snapshot(self.shared.faults.injected.load(Ordering::Relaxed))
    }

    /// Appends a fault-injection rule, checked after those already
    /// installed (from [`EmulatorConfig::faults`] or earlier calls). It
    /// applies to commands the controller fetches from now on; commands
    /// already fetched are not affected. Safe to call from any thread while
    /// the controller runs. A rule with `times: Some(0)` is ignored.
    pub fn add_fault(&self, rule: FaultRule) {
        self.shared.faults.add(rule);
    }

    /// Removes every fault-injection rule. Commands fetched from now on
    /// execute normally; completions already delayed by a
    /// [`FaultAction::Delay`] are still posted when due, and commands held
    /// by [`FaultAction::NeverComplete`] stay without a completion.
    pub fn clear_faults(&self) {
        self.shared.faults.clear();
    }

    /// Fault injection: the device disappears (surprise removal, dead
    /// link), as [`EmulatorConfig::registers_all_ones`] from the start.
    /// Every register, CAP, CSTS and the doorbells included, reads
    /// `0xFFFF_FFFF` from when this returns; the controller thread stops
    /// all work (no fetch, no completion, no DMA: commands in flight never
    /// complete). Host register writes still land in the page's memory
    /// until the thread restores all ones, at most about 1 ms later. There
    /// is no way back: start a new emulator.
    ///
    /// Returns once the controller thread has stopped working (it finishes
    /// the poll iteration in progress first).
    pub fn set_gone(&self) {
        self.stop_answering(u32::MAX);
    }

    /// Fault injection: the function's memory space is disabled (PCI
    /// Command register bit 1 cleared under the driver, e.g. with
    /// `setpci`): as [`Emulator::set_gone`], except that the register page
    /// reads all zeros, which is what QEMU's guest sees for a BAR that no
    /// longer decodes. CSTS then reads RDY = 0 and CFS = 0: only a host
    /// that checks RDY notices. There is no way back: start a new emulator.
    pub fn disable_memory_space(&self) {
        self.stop_answering(0);
    }

    fn stop_answering(&self, fill: u32) {
        self.shared.gone_fill.store(fill, Ordering::SeqCst);
        self.shared.gone.store(true, Ordering::SeqCst);
        self.shared.regs.fill(fill);
        if let Some(t) = &self.thread {
            t.thread().unpark();
            while !self.shared.gone_ack.load(Ordering::Acquire) && !t.is_finished() {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        if let Some(c) = &self.clocked {
            c.step_now(&self.shared);
        }
    }

    /// Fault injection: the power fails. At once, as [`Emulator::set_gone`]:
    /// the controller stops fetching and completing (commands in flight
    /// never complete) and every register reads `0xFFFF_FFFF`. Then each
    /// logical block that the write cache holds non-durable is kept (its
    /// new contents) or lost (back to its last durable contents), each
    /// decided on its own by a generator seeded with
    /// [`WriteCacheSpec::seed`], so a multi-block write may be torn at
    /// logical block boundaries, never inside a block (AWUPF = 0). Then
    /// the backing store is released: a RAM disk goes back to its
    /// registry and a file is closed, so a new emulator can open them
    /// while this handle (and any DMA buffer holding it) lives on. Without
    /// a write cache nothing is lost. See the crate documentation, "Power
    /// loss".
    ///
    /// Only the first power failure acts (this call or a
    /// [`FaultAction::PowerFail`] rule); later calls return its report.
    /// There is no way back: start a new emulator.
    pub fn power_fail(&self) -> PowerFailReport {
        self.stop_answering(u32::MAX);
        self.shared.lock_media().power_loss()
    }

    /// The report of the power failure, once the power has failed
    /// ([`Emulator::power_fail`] or a [`FaultAction::PowerFail`] rule);
    /// `None` before.
    pub fn power_fail_report(&self) -> Option<PowerFailReport> {
        self.shared.lock_media().power_report()
    }

    /// Writes `data` straight to the media of namespace `nsid` at byte
    /// `byte_offset`, bypassing the commands and the write cache (for
    /// corruption tests): durable at once. A logical block the write cache
    /// holds non-durable gets the bytes in its last durable contents: host
    /// reads still return its cached contents, which replace the written
    /// bytes if the block is destaged or kept at a power failure. Any byte
    /// range inside the namespace, no alignment needed. Waits for the
    /// controller's current poll iteration.
    ///
    /// # Errors
    ///
    /// [`MediaAccessError::NoNamespace`], [`MediaAccessError::OutOfRange`]
    /// (the range is not inside the namespace),
    /// [`MediaAccessError::PoweredOff`] after a power failure,
    /// [`MediaAccessError::NullBacking`], [`MediaAccessError::Store`] (a
    /// file I/O error).
    pub fn write_media(&self, nsid: u32, byte_offset: u64, data: &[u8]) -> Result<(), MediaAccessError> {
        self.shared.lock_media().write_direct(nsid, byte_offset, data)
    }

    /// Reads what the media of namespace `nsid` holds at byte
    /// `byte_offset` into `buf`, bypassing the commands and the write
    /// cache: for a logical block the write cache holds non-durable, its
    /// last durable contents (what a power failure that loses it leaves).
    /// Errors as [`Emulator::write_media`].
    pub fn read_media(&self, nsid: u32, byte_offset: u64, buf: &mut [u8]) -> Result<(), MediaAccessError> {
        self.shared.lock_media().read_direct(nsid, byte_offset, buf)
    }

    /// Maps memory the emulator reaches only through copies (GPU memory,
    /// see [`ExternalMemory`]) into this controller's device address space,
    /// for data transfers, in [`SHARED_DOMAIN`] (SQs given another domain
    /// with [`Emulator::set_sq_domain`] cannot reach it). Unmap with
    /// [`NvmeDevice::dma_unmap`].
    pub fn map_external(&self, mem: Arc<dyn ExternalMemory>) -> Result<DmaMapping, DeviceError> {
        self.shared.iova.map_external(mem)
    }

    /// Maps `host..host + len` (4 KiB-aligned `host`, `len > 0`) as
    /// [`NvmeDevice::dma_map`] does, owned by DMA domain `domain`: commands
    /// from SQs of another non-zero domain cannot reach it (their data
    /// buffers and PRP list pages there fail with Data Transfer Error,
    /// counted in [`EmuStats::dma_domain_faults`]). Domain
    /// [`SHARED_DOMAIN`] (0) is the controller owner's, the same as
    /// [`NvmeDevice::dma_map`]. Unmap with [`NvmeDevice::dma_unmap`].
    ///
    /// # Errors
    ///
    /// As [`NvmeDevice::dma_map`]: [`DeviceError::BadRange`] for an
    /// unaligned or empty range, [`DeviceError::AddressSpaceExhausted`].
    ///
    /// # Safety
    ///
    /// As [`NvmeDevice::dma_map`]: the memory must stay allocated until
    /// [`NvmeDevice::dma_unmap`] of the mapping has returned, and nothing
    /// may hold a Rust reference into it while the controller may write it.
    pub unsafe fn dma_map_in_domain(
        &self,
        host: NonNull<u8>,
        len: usize,
        domain: u32,
    ) -> Result<DmaMapping, DeviceError> {
        self.shared.iova.map(host, len, domain)
    }

    /// Sets the DMA domain of I/O SQ `qid` (1..=`io_queues`): the SQ the
    /// next Create I/O SQ of `qid` makes belongs to `domain`, and its
    /// commands reach only data buffers and PRP list pages mapped in that
    /// domain (every mapping for [`SHARED_DOMAIN`], the default). Set it
    /// before sending Create I/O SQ; an SQ that exists keeps the domain
    /// it was created with. Rings are fetched and completions posted by
    /// the controller whatever their domain.
    ///
    /// # Errors
    ///
    /// [`EmuError::NoSuchQueue`] when `qid` is 0 (the admin queue, always
    /// the owner's) or above `io_queues`.
    pub fn set_sq_domain(&self, qid: u16, domain: u32) -> Result<(), EmuError> {
        let slot = (qid != 0).then(|| self.shared.sq_domains.get(usize::from(qid))).flatten();
        let slot = slot.ok_or(EmuError::NoSuchQueue { qid, io_queues: self.config.io_queues })?;
        // Release: ordered before the doorbell write of the Create I/O SQ
        // that follows, whose handling reads it (Acquire).
        slot.store(domain, Ordering::Release);
        Ok(())
    }

    /// Page-locks the RAM media (the RAM and RAM disk stores' images)
    /// through `locker`, once per image and for as long as the media
    /// lives (a power failure releases the locks with the media), so that
    /// the copies of a DMA engine between it and external memory
    /// ([`ExternalMemory::start_read`]) run asynchronously and at full
    /// speed. Returns how many images are locked (0 for the file and null
    /// stores, or when the locker refuses). Waits for the controller's
    /// current poll iteration and holds it back while locking, which takes
    /// time in proportion to the media's size: call it at set-up, not
    /// while commands are expected to complete.
    pub fn lock_media_pages(&self, locker: &dyn PageLocker) -> usize {
        self.shared.lock_media().lock_pages(locker)
    }

    /// `true` while the controller thread runs: `false` after it stopped,
    /// and (a bug, which tests and fuzzing look for) if it panicked. On a
    /// virtual clock: `false` once a poll panicked (the panic itself
    /// reached whoever slept on the clock).
    pub fn is_running(&self) -> bool {
        match &self.clocked {
            Some(c) => c.is_running(),
            None => self.thread.as_ref().is_some_and(|t| !t.is_finished()),
        }
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &EmulatorConfig {
        &self.config
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(c) = self.clocked.take() {
            c.stop();
        }
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                tracing::error!(name = %self.name, "nvme-emu controller thread panicked");
            }
        }
    }
}

impl NvmeDevice for Emulator {
    fn name(&self) -> &str {
        &self.name
    }

    fn bar0(&self) -> &Mmio {
        self.shared.regs.mmio()
    }

    /// Maps `host..host + len` (4 KiB-aligned `host`, `len > 0`) at fresh
    /// device addresses from [`IOVA_BASE`] up, followed by an unmapped
    /// guard page.
    unsafe fn dma_map(&self, host: NonNull<u8>, len: usize) -> Result<DmaMapping, DeviceError> {
        self.shared.iova.map(host, len, SHARED_DOMAIN)
    }

    /// Removes a mapping; waits until the controller thread's current poll
    /// iteration (which may be touching it) has ended.
    fn dma_unmap(&self, mapping: &DmaMapping) -> Result<(), DeviceError> {
        self.shared.iova.unmap(mapping)
    }

    /// Wakes the controller thread and keeps it polling for at least
    /// 200 us: a GPU kernel about to write doorbells in
    /// the register page cannot wake it, and a napping thread would see
    /// them only at the end of its nap (up to 1 ms; 50 us plus the
    /// timer's overshoot between a host's requests).
    /// The virtual clock of an emulator started with
    /// [`Emulator::start_on`]; the real clock otherwise.
    fn clock(&self) -> &dyn Clock {
        match &self.clocked {
            Some(c) => c.clock(),
            None => &RealClock,
        }
    }

    /// Wakes the controller thread from its nap (up to 1 ms when long
    /// idle) to look at the doorbells now.
    fn doorbell_written(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    fn expect_doorbells(&self) {
        self.shared.kick.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}
