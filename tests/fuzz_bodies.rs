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
    //! hand out fake bus addresses: the test plays the controller.
    use nvm_queue::{DeviceError, DmaMapping, Mmio, NvmeDevice};
    use std::ptr::NonNull;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Debug)]
    pub struct Device {
        _page: Box<[u32]>,
        mmio: Mmio,
        next: AtomicU64,
    }

    impl Device {
        pub fn new() -> Self {
            let mut page = vec![0u32; 0x2000 / 4].into_boxed_slice();
            // SAFETY: the boxed page lives as long as the device (its heap
            // memory does not move) and is only accessed through `mmio`.
            #[allow(unsafe_code)]
            let mmio = unsafe { Mmio::new(page.as_mut_ptr().cast(), 0x2000) }.expect("aligned");
            Self { _page: page, mmio, next: AtomicU64::new(0x1_0000_0000) }
        }
    }

    impl NvmeDevice for Device {
        fn name(&self) -> &str {
            "hostile"
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
    use nvm_queue::{Controller, ControllerOptions, DmaBuffer, NvmeDevice};
    use nvme_emu::{Emulator, EmulatorConfig, NamespaceSpec};
    use nvme_regs::Sqe;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let mut cfg =
        EmulatorConfig::new("fuzz", vec![NamespaceSpec::new(256, 4096), NamespaceSpec::new(64, 512)]);
    cfg.mqes = 15;
    cfg.io_queues = 2;
    let emu = Emulator::start(cfg).expect("emulator starts");
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    // Bring-up with the normal bound (a busy machine may delay the
    // emulator's thread by milliseconds), then short bounds for the fuzzed
    // commands, some of which never complete (AER) by design.
    let mut ctrl =
        Controller::init(dev.clone(), ControllerOptions::default()).expect("fresh emulator comes up");
    let Ok(mut qp) = ctrl.create_io_queue_pair(1, 8, 7) else { return };
    ctrl.set_admin_timeout(Duration::from_millis(20));
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
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(200) {
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
    std::thread::sleep(Duration::from_millis(1));
    assert!(emu.is_running(), "the emulator's controller thread died");
}
