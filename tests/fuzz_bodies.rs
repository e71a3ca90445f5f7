//! The bodies of the fuzz targets in `fuzz/`, shared with the ordinary
//! `cargo test` that replays every saved corpus entry and crash
//! (`tests/fuzz_corpus.rs`), so CI runs them without a fuzzer. Each body
//! must never panic, whatever the bytes; where it can, it also checks a
//! property of the result.

use nvm_queue::prp::{PrpBuilder, PrpListMemory, VecListPages};
use nvm_queue::DmaMapping;
use nvme_regs::identify::parse_active_namespace_list;
use nvme_regs::{Cqe, ErrorLogEntry, IdentifyController, IdentifyNamespace, SmartLog, Status};

/// Bytes a device hands the driver: CQEs, Identify data, log pages.
pub fn decode_device_data(data: &[u8]) {
    for chunk in data.chunks_exact(16) {
        let dw = |i: usize| u32::from_le_bytes([chunk[i], chunk[i + 1], chunk[i + 2], chunk[i + 3]]);
        let cqe = Cqe::from_dwords([dw(0), dw(4), dw(8), dw(12)]);
        let s = cqe.status();
        let _ = (cqe.phase(), s.is_success(), s.name(), s.to_string());
        // The 15 status bits round-trip exactly.
        assert_eq!(Status::from_field(s.to_field(cqe.phase())), s);
        assert_eq!(s.to_field(cqe.phase()), cqe.status);
    }
    let mut page = [0u8; 4096];
    let n = data.len().min(4096);
    page[..n].copy_from_slice(&data[..n]);
    for bytes in [&page[..], data] {
        if let Ok(c) = IdentifyController::parse(bytes) {
            let _ = (c.vid(), c.sn(), c.mn(), c.fr(), c.mdts(), c.nn(), c.sqes(), c.cqes(), c.oncs());
            for mps in [4096usize, 8192, 1 << 27] {
                let _ = c.max_transfer_bytes(mps);
            }
        }
        if let Ok(ns) = IdentifyNamespace::parse(bytes) {
            let _ =
                (ns.nsze(), ns.ncap(), ns.nlbaf(), ns.flbas(), ns.formatted_lba_format(), ns.block_size());
            if let Ok(bs) = ns.block_size() {
                assert!((512..=65536).contains(&bs) && bs.is_power_of_two());
            }
            for i in 0..70 {
                let _ = ns.lbaf(i);
            }
        }
        if let Ok(list) = parse_active_namespace_list(bytes) {
            assert!(list.take(2000).all(|nsid| nsid != 0));
        }
    }
    if let Ok(s) = SmartLog::parse(&page[..512]) {
        let _ = (s.composite_temperature(), s.data_units_read(), s.media_errors());
    }
    let _ = ErrorLogEntry::parse_page(data);
}

/// The PRP builder over an arbitrary buffer layout: either a typed error,
/// or PRPs that a controller's walk turns into exactly the transfer's pages.
pub fn prp_builder(data: &[u8]) {
    if data.len() < 12 {
        return;
    }
    let page = 4096usize << (data[0] % 3);
    const SPAN: usize = 64 * 4096;
    // Mostly in range (so the interesting paths run), sometimes not.
    let raw_off = usize::from(u16::from_le_bytes([data[1], data[2]])) * 4 + usize::from(data[3] % 4);
    let offset = if data[3] & 0x80 == 0 { raw_off % SPAN } else { raw_off };
    let raw_len = usize::from(u16::from_le_bytes([data[4], data[5]])) * 37 + usize::from(data[6]);
    let len = if data[6] & 0x80 == 0 { raw_len % (SPAN - offset.min(SPAN - 1)) } else { raw_len };
    // Per-page device addresses: contiguous, or scattered from the input.
    let pages: Vec<u64> = if data[7] & 1 == 0 {
        (0..64u64).map(|i| 0x1_0000_0000 + i * 4096).collect()
    } else {
        data[8..]
            .chunks(2)
            .take(64)
            .map(|c| {
                0x2_0000_0000 + u64::from(c[0]) * 4096 + u64::from(*c.get(1).unwrap_or(&0) & 1) * 0x100_0000
            })
            .collect()
    };
    let mapping = DmaMapping::from_pages(pages);
    let Ok(b) = PrpBuilder::new(page) else { return };
    let mut list = VecListPages::new(0x9_0000_0000, 4, page);
    let Ok(prp) = b.build(&mapping, offset, len, &mut list) else { return };
    // Walk as a controller would and compare with the mapping.
    assert_eq!(prp.prp1, mapping.addr(offset).unwrap());
    assert_eq!(prp.prp1 % 4, 0);
    let in_first = page - (prp.prp1 as usize % page);
    let n = len.saturating_sub(in_first).div_ceil(page);
    let mut entries = Vec::new();
    if n == 1 {
        entries.push(prp.prp2);
    } else if n > 1 {
        let per = page / 8;
        let (mut lp, mut slot) = (0usize, 0usize);
        assert_eq!(prp.prp2, list.list_page_addr(0));
        while entries.len() < n {
            let e = list.pages[lp][slot];
            if slot == per - 1 && n - entries.len() > 1 {
                lp += 1;
                slot = 0;
                assert_eq!(e, list.addrs[lp]);
                continue;
            }
            entries.push(e);
            slot += 1;
        }
    }
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(*e % page as u64, 0, "entry {i} not page aligned");
        assert_eq!(Some(*e), mapping.addr(offset + in_first + i * page));
    }
}

/// The YAML configuration parser: a config or a typed error with a path.
pub fn config_parser(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match tutti::Config::from_yaml_str(text) {
        Ok(c) => {
            // Whatever parses and validates also prints and re-parses.
            if let Ok(y) = c.to_yaml_string() {
                let _ = tutti::Config::from_yaml_str(&y);
            }
        }
        Err(e) => {
            let _ = (e.path(), e.to_string());
        }
    }
}

/// The driver's completion path facing a hostile device: the test writes
/// arbitrary CQEs (any CID, SQID, SQHD, status, phase) into a live queue
/// pair's CQ. It must never panic, never deliver a tag it did not submit,
/// and never deliver a tag twice; every delivered status is what the CQE
/// said.
pub fn hostile_completions(data: &[u8]) {
    use nvm_queue::queue::{QueuePair, QueuePairConfig};
    use nvme_regs::opcode::Flush;
    use std::collections::HashSet;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    if data.len() < 2 {
        return;
    }
    let dev: Arc<dyn nvm_queue::NvmeDevice> = Arc::new(hostile::Device::new());
    let entries = 2 + u32::from(data[0] % 31);
    let cfg = QueuePairConfig {
        qid: 1,
        sq_entries: entries,
        cq_entries: entries,
        max_outstanding: (entries - 1) as u16,
        max_transfer: 4096,
        page_size: 4096,
        dstrd: 0,
    };
    let Ok(mut qp) = QueuePair::new(&dev, cfg) else { return };
    let mut issued = HashSet::new();
    for t in 0..u64::from(data[1] % entries as u8) {
        if qp.submit(Flush::new(1).build(), None, t).is_ok() {
            issued.insert(t);
        }
    }
    qp.ring();
    let mut delivered = HashSet::new();
    for round in data[2..].chunks(16 * entries as usize) {
        let mem = qp.cq().memory();
        for (i, cqe) in round.chunks_exact(16).enumerate() {
            for d in 0..4 {
                let v = u32::from_le_bytes([cqe[4 * d], cqe[4 * d + 1], cqe[4 * d + 2], cqe[4 * d + 3]]);
                let _ = mem.store_u32(i * 16 + d * 4, v, Ordering::Release);
            }
        }
        qp.poll(|c| {
            assert!(issued.contains(&c.tag), "tag {} was never submitted", c.tag);
            assert!(delivered.insert(c.tag), "tag {} delivered twice", c.tag);
        });
    }
    let s = qp.stats();
    assert_eq!(s.completed as usize, delivered.len());
    assert!(qp.outstanding() + delivered.len() == issued.len());
}

mod hostile {
    //! A device whose registers are plain memory and whose DMA mappings
    //! hand out fake bus addresses: the test plays the controller. It runs
    //! on a virtual clock, so the driver's re-reads of a CQE body naming
    //! another SQ (and the grace it gives such an entry) take virtual time.
    use nvm_queue::{Clock, DeviceError, DmaMapping, Mmio, NvmeDevice, VirtualClock};
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[derive(Debug)]
    pub struct Device {
        _page: Box<[u32]>,
        mmio: Mmio,
        next: AtomicU64,
        clock: Arc<VirtualClock>,
    }

    impl Device {
        pub fn new() -> Self {
            let mut page = vec![0u32; 0x2000 / 4].into_boxed_slice();
            // SAFETY: the boxed page lives as long as the device (its heap
            // memory does not move) and is only accessed through `mmio`.
            #[allow(unsafe_code)]
            let mmio = unsafe { Mmio::new(page.as_mut_ptr().cast(), 0x2000) }.expect("aligned");
            Self { _page: page, mmio, next: AtomicU64::new(0x1_0000_0000), clock: VirtualClock::new() }
        }
    }

    impl NvmeDevice for Device {
        fn name(&self) -> &str {
            "hostile"
        }
        fn clock(&self) -> &dyn Clock {
            &*self.clock
        }
        fn bar0(&self) -> &Mmio {
            &self.mmio
        }
        #[allow(unsafe_code)]
        unsafe fn dma_map(&self, _host: NonNull<u8>, len: usize) -> Result<DmaMapping, DeviceError> {
            let iova = self.next.fetch_add((len as u64).next_multiple_of(4096) + 4096, Ordering::Relaxed);
            Ok(DmaMapping::contiguous(iova, len))
        }
        fn dma_unmap(&self, _m: &DmaMapping) -> Result<(), DeviceError> {
            Ok(())
        }
    }
}

/// The emulator fed arbitrary admin and I/O SQEs (any opcode, NSID, PRPs,
/// CDWs), doorbell writes and register writes: its controller thread must
/// keep running (no panic) and never touch memory outside what was mapped
/// (a stray access would crash the process).
pub fn emulator_commands(data: &[u8]) {
    use nvm_queue::{Clock, Controller, ControllerOptions, DmaBuffer, NvmeDevice, VirtualClock};
    use nvme_emu::{Emulator, EmulatorConfig, NamespaceSpec};
    use nvme_regs::Sqe;
    use std::sync::Arc;
    use std::time::Duration;

    let mut cfg =
        EmulatorConfig::new("fuzz", vec![NamespaceSpec::new(256, 4096), NamespaceSpec::new(64, 512)]);
    cfg.mqes = 15;
    cfg.io_queues = 2;
    // On virtual time: no controller thread; the driver's waits (and the
    // sleeps below) poll the emulator, so an input runs the same way every
    // time and no real time is waited.
    let clock = VirtualClock::new();
    let emu = Emulator::start_on(cfg, clock.clone()).expect("emulator starts");
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    // Bring-up with the normal bound, then short bounds for the fuzzed
    // commands, some of which never complete (AER) by design: a command
    // the emulator completes does so at the first poll.
    let mut ctrl =
        Controller::init(dev.clone(), ControllerOptions::default()).expect("fresh emulator comes up");
    let Ok(mut qp) = ctrl.create_io_queue_pair(1, 8, 7) else { return };
    ctrl.set_admin_timeout(Duration::from_millis(1));
    let buf = DmaBuffer::new(&dev, 16 * 1024).expect("dma");
    let _ = buf.mapping();
    for (k, op) in data.chunks(65).take(32).enumerate() {
        let mut b = [0u8; 65];
        b[..op.len()].copy_from_slice(op);
        let mut dw = [0u32; 16];
        for (i, d) in dw.iter_mut().enumerate() {
            *d = u32::from_le_bytes([b[1 + 4 * i], b[2 + 4 * i], b[3 + 4 * i], b[4 + 4 * i]]);
        }
        let sqe = Sqe::from_dwords(dw);
        match b[0] % 8 {
            // Admin commands (Create/Delete queues, Identify, logs, features...).
            0..=2 => {
                let _ = ctrl.admin_command(sqe, "fuzz");
            }
            // I/O commands with the SQE's own PRPs (often unmapped).
            3..=5 => {
                if qp.submit(sqe, None, k as u64).is_ok() {
                    qp.ring();
                }
                for _ in 0..4 {
                    clock.sleep(Duration::from_micros(50));
                    qp.poll(|_| {});
                }
            }
            // A raw doorbell write (any queue, any value).
            6 => {
                let _ = dev.bar0().write32(0x1000 + usize::from(b[1] % 16) * 4, dw[1] % 64);
            }
            // A raw register write (CC, AQA, ASQ, ACQ, INTMS...).
            _ => {
                let reg = [0x0C, 0x10, 0x14, 0x24, 0x28, 0x2C, 0x30, 0x34][usize::from(b[1] % 8)];
                let _ = dev.bar0().write32(reg, dw[1]);
            }
        }
    }
    clock.sleep(Duration::from_millis(1));
    assert!(emu.is_running(), "the emulator's controller died");
}

/// Controller bring-up ([`nvm_queue::Controller::init`]) facing a device
/// whose register values (CAP, VS, CSTS after each CC write) and admin
/// completions (status, DW0, raw CQEs, no completion at all) and Identify
/// data all come from the input. `init` must never panic, must return
/// within a bound set by CAP.TO and the admin timeout, and must give a
/// typed error or a controller whose facts (CAP, Identify Controller,
/// namespaces) are exactly what the device served; once the device has
/// stopped, none of the DMA memory of the input may outlive it.
///
/// CAP.TO is cut to 0..=3 (at most 1.5 s per register wait) and at most
/// two admin commands go unanswered per input, so that each input runs in
/// bounded time; the CAP.TO bound itself is unit-tested in
/// `crates/nvm-queue/src/controller/tests.rs`. The device runs on a virtual
/// clock (`nvm_queue::VirtualClock`): the driver's waits step it and take
/// no real time, and the time bound is checked in virtual time, exactly.
/// Returns whether bring-up succeeded.
pub fn controller_bringup(data: &[u8]) -> bool {
    use nvm_queue::{Controller, ControllerOptions, NvmeDevice};
    use nvme_regs::{Cap, IdentifyController, IdentifyNamespace};
    use std::sync::Arc;
    use std::time::Duration;

    let dev = scripted::Device::start(data);
    let nvme: Arc<dyn NvmeDevice> = dev.clone();
    let opts = ControllerOptions { admin_timeout: Duration::from_millis(20), ..Default::default() };
    let r = Controller::init(nvme, opts);
    let took = dev.virtual_clock().elapsed();
    // Once init has returned, answer register writes plainly (the
    // controller's Drop disables it and waits for CSTS.RDY = 0).
    dev.go_plain();
    // At most four register waits of at most 1.5 s (the disable of a
    // controller caught mid-enable, the reset, the enable, and the drop of
    // a controller whose Identify failed), one admin timeout (any admin
    // failure ends init) and one 20 us poll for each answered admin
    // command (Identify Controller, the active list, up to 1024 Identify
    // Namespace, Set Features).
    let bound =
        4 * Duration::from_millis(1500) + Duration::from_millis(20) + 1030 * Duration::from_micros(20);
    assert!(took <= bound, "bring-up took {took:?} of virtual time");
    let served = dev.served();
    let up = r.is_ok();
    match r {
        Err(e) => {
            let _ = e.to_string();
        }
        Ok(ctrl) => {
            assert_eq!(ctrl.cap(), Cap(served.cap), "CAP as served");
            let page = |cns: u8, nsid: u32| {
                served.pages.iter().rev().filter(move |p| p.cns == cns && (cns != 0 || p.nsid == nsid))
            };
            let idc = page(1, 0).next().expect("Identify Controller was served");
            let id = IdentifyController::parse(&idc.bytes).expect("it decoded for the driver");
            let info = ctrl.info();
            assert_eq!(
                (info.vid, info.mdts, info.nn, info.cntlid),
                (id.vid(), id.mdts(), id.nn(), id.cntlid())
            );
            // As the driver keeps it (Identify's own space trimming only).
            assert_eq!(info.serial, id.sn().unwrap());
            let lists: Vec<Vec<u32>> = page(2, 0)
                .filter_map(|p| nvme_regs::identify::parse_active_namespace_list(&p.bytes).ok())
                .map(|l| l.collect())
                .collect();
            for ns in ctrl.namespaces() {
                assert!(lists.iter().any(|l| l.contains(&ns.nsid)), "NSID {} was never listed", ns.nsid);
                assert!(
                    page(0, ns.nsid).any(|p| IdentifyNamespace::parse(&p.bytes).is_ok_and(|id| {
                        id.block_size().ok() == Some(ns.block_size) && id.nsze() == ns.blocks
                    })),
                    "namespace {ns:?} matches no Identify Namespace served"
                );
            }
            assert!(ctrl.io_queues_granted() <= 8);
            drop(ctrl);
        }
    }
    dev.stop();
    // Nothing the driver made still holds the device: every DMA buffer
    // was freed, or kept by the device and freed by `stop` (a buffer kept
    // for the rest of the process would hold it, and ran a 5-minute fuzz
    // run out of memory before 2026-12-05).
    assert_eq!(Arc::strong_count(&dev), 1, "DMA memory of this input outlived it");
    up
}

mod scripted {
    //! A device played from a byte script (the fuzz input): it answers
    //! register writes and admin commands whenever the driver waits on its
    //! virtual clock (a ticker on the clock, no thread of its own).
    #![allow(unsafe_code)]

    use nvm_queue::{Clock, DeviceError, DmaMapping, Mmio, NvmeDevice, TickerId, VirtualClock};
    use nvme_regs::registers::{doorbell_offset, offset};
    use nvme_regs::{Aqa, Cap, Cc};
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, Weak};

    const PAGE_BYTES: usize = 0x2000;

    /// An Identify page the device wrote.
    #[derive(Debug, Clone)]
    pub struct Served {
        pub cns: u8,
        pub nsid: u32,
        pub bytes: Vec<u8>,
    }

    /// Everything the device served.
    #[derive(Debug, Clone, Default)]
    pub struct Log {
        pub cap: u64,
        pub pages: Vec<Served>,
    }

    #[derive(Debug)]
    pub struct Device {
        page: Box<[AtomicU32]>,
        mmio: Mmio,
        next: AtomicU64,
        /// (device address, host address, length) of each mapping. The
        /// player touches host memory only while holding this lock, and
        /// `dma_unmap` removes an entry under it, so it never writes memory
        /// that was freed.
        maps: Mutex<Vec<(u64, usize, usize)>>,
        plain: AtomicBool,
        log: Mutex<Log>,
        clock: Arc<VirtualClock>,
        ticker: Mutex<Option<TickerId>>,
        player: Mutex<Player>,
        /// DMA memory the driver could not prove the device done with
        /// ([`NvmeDevice::keep_dma`]): freed by [`Device::stop`], after
        /// which the player writes nothing. (The buffers hold the device,
        /// so without that neither would ever be freed: memory kept per
        /// input, which ran a 5-minute fuzz run out of memory.)
        kept: Mutex<Vec<nvm_queue::KeptDma>>,
    }

    #[derive(Debug)]
    struct Script {
        data: Vec<u8>,
        pos: usize,
        unanswered: u32,
    }

    impl Script {
        fn byte(&mut self) -> Option<u8> {
            let b = self.data.get(self.pos).copied();
            self.pos += usize::from(b.is_some());
            b
        }
        fn u32(&mut self) -> u32 {
            u32::from_le_bytes([0; 4].map(|_| self.byte().unwrap_or(0)))
        }
    }

    /// The player's state between turns.
    #[derive(Debug)]
    struct Player {
        s: Script,
        /// The CC value last acted on (the page starts with the script's).
        last_cc: u32,
        sq_db: usize,
        cq_db: usize,
        /// Admin queues while "enabled": (ASQ, ACQ, entries SQ, CQ).
        admin: Option<(u64, u64, u32, u32)>,
        head: u32,
        cq_tail: u32,
        phase: bool,
    }

    impl Device {
        pub fn start(data: &[u8]) -> Arc<Self> {
            let mut s = Script { data: data.to_vec(), pos: 0, unanswered: 0 };
            let lo = s.u32();
            let hi = s.u32();
            // CAP.TO cut to 0..=3 (bounded time per input).
            let cap = Cap::from_halves(lo, hi);
            let cap = cap.with_to_500ms(cap.to_500ms() % 4);
            let vs = s.u32();
            let csts = s.u32();
            let cc = s.u32();
            let page: Box<[AtomicU32]> = (0..PAGE_BYTES / 4).map(|_| AtomicU32::new(0)).collect();
            page[0].store(cap.0 as u32, Ordering::Relaxed);
            page[1].store((cap.0 >> 32) as u32, Ordering::Relaxed);
            page[offset::VS / 4].store(vs, Ordering::Relaxed);
            page[offset::CSTS / 4].store(csts, Ordering::Relaxed);
            page[offset::CC / 4].store(cc, Ordering::Relaxed);
            // SAFETY: the boxed page lives as long as the device (its heap
            // memory does not move); it is only accessed atomically, through
            // `mmio` and by the player.
            let mmio = unsafe { Mmio::new(page.as_ptr() as *mut u8, PAGE_BYTES) }.expect("aligned");
            let rest = data.get(s.pos..).unwrap_or(&[]).to_vec();
            let dstrd = cap.dstrd();
            let player = Player {
                s: Script { data: rest, pos: 0, unanswered: 0 },
                last_cc: cc,
                sq_db: doorbell_offset(0, false, dstrd),
                cq_db: doorbell_offset(0, true, dstrd),
                admin: None,
                head: 0,
                cq_tail: 0,
                phase: true,
            };
            let dev = Arc::new(Self {
                page,
                mmio,
                next: AtomicU64::new(0x1_0000_0000),
                maps: Mutex::new(Vec::new()),
                plain: AtomicBool::new(false),
                log: Mutex::new(Log { cap: cap.0, pages: Vec::new() }),
                clock: VirtualClock::new(),
                ticker: Mutex::new(None),
                player: Mutex::new(player),
                kept: Mutex::new(Vec::new()),
            });
            let weak: Weak<Self> = Arc::downgrade(&dev);
            // It acts only on what the driver wrote: after a turn that
            // changed nothing it has nothing of its own to do (`None`), so a
            // polling wait moves on to its deadline when the script gives
            // no answer.
            let id = dev.clock.add_ticker(Arc::new(move |now| {
                let d = weak.upgrade()?;
                d.play().then_some(now)
            }));
            *dev.ticker.lock().unwrap() = Some(id);
            dev
        }

        /// The device's virtual clock.
        pub fn virtual_clock(&self) -> &VirtualClock {
            &self.clock
        }

        pub fn go_plain(&self) {
            self.plain.store(true, Ordering::SeqCst);
        }

        pub fn served(&self) -> Log {
            self.log.lock().unwrap().clone()
        }

        /// Leaves the clock: the device plays no more, so the DMA memory
        /// it was given to keep can go.
        pub fn stop(&self) {
            if let Some(id) = self.ticker.lock().unwrap().take() {
                self.clock.remove_ticker(id);
            }
            let kept = std::mem::take(&mut *self.kept.lock().unwrap());
            drop(kept);
        }

        fn reg(&self, off: usize) -> u32 {
            self.page.get(off / 4).map_or(0, |r| r.load(Ordering::Acquire))
        }

        fn set_reg(&self, off: usize, v: u32) {
            if let Some(r) = self.page.get(off / 4) {
                r.store(v, Ordering::Release);
            }
        }

        /// Runs `f` on the host address of device range `iova..iova + len`
        /// if one mapping holds it, with the mapping table locked.
        fn with_host(&self, iova: u64, len: usize, f: impl FnOnce(*mut u8)) -> bool {
            let maps = self.maps.lock().unwrap();
            for &(base, host, mlen) in maps.iter() {
                if iova >= base && iova.saturating_add(len as u64) <= base + mlen as u64 {
                    f((host + (iova - base) as usize) as *mut u8);
                    return true;
                }
            }
            false
        }

        fn load32(&self, iova: u64) -> Option<u32> {
            let mut v = None;
            if iova.is_multiple_of(4) {
                self.with_host(iova, 4, |p| {
                    // SAFETY: `p` lies in a live mapping (checked under its
                    // lock, held while this runs) and is 4-byte aligned
                    // (mappings start on host pages); the memory is only
                    // accessed atomically.
                    v = Some(unsafe { AtomicU32::from_ptr(p.cast()) }.load(Ordering::Acquire));
                });
            }
            v
        }

        fn store32(&self, iova: u64, v: u32) {
            if iova.is_multiple_of(4) {
                self.with_host(iova, 4, |p| {
                    // SAFETY: as in `load32`.
                    unsafe { AtomicU32::from_ptr(p.cast()) }.store(v, Ordering::Release);
                });
            }
        }

        /// One turn of the player (each time the driver waits on the
        /// clock): CSTS after a CC change, then every admin command the SQ
        /// tail doorbell offers, from the script. Whether it did anything.
        fn play(&self) -> bool {
            let mut guard = self.player.lock().unwrap();
            let p = &mut *guard;
            let cc = Cc(self.reg(offset::CC));
            let mut acted = cc.0 != p.last_cc;
            if acted {
                p.last_cc = cc.0;
                self.change_csts(p, cc);
            }
            while self.fetch_one(p) {
                acted = true;
            }
            acted
        }

        /// CSTS after CC became `cc`: plain (RDY follows EN, SHST follows
        /// SHN) or from the script; the admin queues (re)start on RDY.
        fn change_csts(&self, p: &mut Player, cc: Cc) {
            let plain = self.plain.load(Ordering::Acquire) || p.s.byte().is_none_or(|m| m % 4 != 0);
            let csts = if plain {
                let shst = if cc.0 & (3 << 14) != 0 { 0b10 << 2 } else { 0 };
                u32::from(cc.en()) | shst
            } else {
                p.s.u32()
            };
            self.set_reg(offset::CSTS, csts);
            p.admin = None;
            if cc.en() && csts & 1 == 1 {
                let aqa = Aqa(self.reg(offset::AQA));
                let asq = u64::from(self.reg(offset::ASQ)) | u64::from(self.reg(offset::ASQ + 4)) << 32;
                let acq = u64::from(self.reg(offset::ACQ)) | u64::from(self.reg(offset::ACQ + 4)) << 32;
                p.admin = Some((asq, acq, u32::from(aqa.asqs_z()) + 1, u32::from(aqa.acqs_z()) + 1));
                (p.head, p.cq_tail, p.phase) = (0, 0, true);
                self.set_reg(p.sq_db, 0);
                self.set_reg(p.cq_db, 0);
            }
        }

        /// Fetches and answers one admin command if the doorbell offers one
        /// and the CQ has room; `false` when there was none.
        fn fetch_one(&self, p: &mut Player) -> bool {
            let Some((asq, acq, sqn, cqn)) = p.admin else { return false };
            let tail = self.reg(p.sq_db);
            if tail >= sqn || p.head == tail || (p.cq_tail + 1) % cqn == self.reg(p.cq_db) {
                return false;
            }
            let mut dw = [0u32; 16];
            for (i, d) in dw.iter_mut().enumerate() {
                *d = self.load32(asq + u64::from(p.head) * 64 + 4 * i as u64).unwrap_or(0);
            }
            p.head = (p.head + 1) % sqn;
            if let Some((cqe, raw)) = self.answer(&mut p.s, &dw, p.head) {
                let at = acq + u64::from(p.cq_tail) * 16;
                for (i, d) in cqe.iter().enumerate().take(3) {
                    self.store32(at + 4 * i as u64, *d);
                }
                // A raw CQE keeps its own phase tag.
                let dw3 = if raw { cqe[3] } else { (cqe[3] & !(1 << 16)) | u32::from(p.phase) << 16 };
                self.store32(at + 12, dw3);
                p.cq_tail = (p.cq_tail + 1) % cqn;
                if p.cq_tail == 0 {
                    p.phase = !p.phase;
                }
            }
            true
        }

        /// The CQE (DW0..DW3, phase filled in by the caller unless it is a
        /// raw one, `true`) for admin command `dw`, or none; writes its
        /// Identify data first.
        fn answer(&self, s: &mut Script, dw: &[u32; 16], sqhd: u32) -> Option<([u32; 4], bool)> {
            let (opcode, cid) = (dw[0] as u8, (dw[0] >> 16) as u16);
            let mode = if self.plain.load(Ordering::Acquire) { 0 } else { s.byte().unwrap_or(0) % 8 };
            if mode == 7 && s.unanswered < 2 {
                s.unanswered += 1;
                return None;
            }
            let prp1 = u64::from(dw[6]) | u64::from(dw[7]) << 32;
            if opcode == 0x06 {
                let len = usize::from(s.byte().unwrap_or(0)) * 16;
                let mut bytes = vec![0u8; 4096];
                for b in bytes.iter_mut().take(len) {
                    *b = s.byte().unwrap_or(0);
                }
                for (i, w) in bytes.chunks_exact(4).enumerate() {
                    self.store32(prp1 + 4 * i as u64, u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
                }
                let (cns, nsid) = (dw[10] as u8, dw[1]);
                self.log.lock().unwrap().pages.push(Served { cns, nsid, bytes });
            }
            let dw2 = sqhd & 0xFFFF; // SQID 0
            Some(match mode {
                5 => {
                    let status = u32::from(s.byte().unwrap_or(0)) | u32::from(s.byte().unwrap_or(0)) << 8;
                    ([0, 0, dw2, u32::from(cid) | (status & 0x7FFF) << 17], false)
                }
                6 => ([s.u32(), s.u32(), s.u32(), s.u32()], true),
                _ => ([s.u32(), 0, dw2, u32::from(cid)], false),
            })
        }
    }

    impl NvmeDevice for Device {
        fn name(&self) -> &str {
            "scripted"
        }
        fn clock(&self) -> &dyn Clock {
            &*self.clock
        }
        fn bar0(&self) -> &Mmio {
            &self.mmio
        }
        unsafe fn dma_map(&self, host: NonNull<u8>, len: usize) -> Result<DmaMapping, DeviceError> {
            let iova = self.next.fetch_add((len as u64).next_multiple_of(4096) + 4096, Ordering::Relaxed);
            self.maps.lock().unwrap().push((iova, host.as_ptr() as usize, len));
            Ok(DmaMapping::contiguous(iova, len))
        }
        fn dma_unmap(&self, m: &DmaMapping) -> Result<(), DeviceError> {
            let iova = m.pages().first().copied().unwrap_or(0);
            self.maps.lock().unwrap().retain(|&(b, _, _)| b != iova);
            Ok(())
        }
        fn keep_dma(&self, kept: nvm_queue::KeptDma) {
            self.kept.lock().unwrap().push(kept);
        }
    }
}

/// The tuttid protocol facing a hostile peer: any payload decodes, as a
/// request and as a reply, to a typed error or to a message that
/// re-encodes to exactly the same bytes; any byte stream on the socket
/// reads as frames or a typed framing error.
pub fn tuttid_protocol(data: &[u8]) {
    use tuttid_proto::{Request, Response};
    if let Ok(r) = Request::decode(data) {
        assert_eq!(r.encode(), data, "request {r:?} does not re-encode to its bytes");
    }
    if let Ok(r) = Response::decode(data) {
        assert_eq!(r.encode(), data, "reply {r:?} does not re-encode to its bytes");
    }
    let Ok((a, b)) = std::os::unix::net::UnixStream::pair() else { return };
    let _ = b.set_read_timeout(Some(std::time::Duration::from_millis(50)));
    let _ = std::io::Write::write_all(&mut &a, &data[..data.len().min(100_000)]);
    drop(a);
    for _ in 0..64 {
        match tuttid_proto::frame::recv_frame(&b) {
            Ok(f) => assert!(!f.payload.is_empty() && f.payload.len() <= tuttid_proto::MAX_FRAME as usize),
            Err(_) => break,
        }
    }
}
