//! Test-only driver for the emulator: raw register writes through `bar0()`,
//! queues in `DmaBuffer`s, bounded waits for CQEs by phase tag.

#![allow(dead_code, missing_docs)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvm_queue::{DmaBuffer, NvmeDevice};
use nvme_emu::{Emulator, EmulatorConfig, NamespaceSpec};
use nvme_regs::registers::{doorbell_offset, offset};
use nvme_regs::{Aqa, Cc, Cqe, Csts, Sqe, Status};
use zerocopy::IntoBytes;

pub const TIMEOUT: Duration = Duration::from_secs(5);
pub const PAGE: usize = 4096;

/// Polls `f` until it returns `Some`, for at most [`TIMEOUT`].
pub fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::yield_now();
    }
}

pub fn csts(dev: &dyn NvmeDevice) -> Csts {
    Csts(dev.bar0().read32(offset::CSTS).unwrap())
}

/// A queue pair as the test driver sees it.
pub struct Queue {
    pub qid: u16,
    pub sq: DmaBuffer,
    pub cq: DmaBuffer,
    pub sq_size: u32,
    pub cq_size: u32,
    pub sq_tail: u32,
    pub cq_head: u32,
    pub phase: bool,
    pub next_cid: u16,
}

impl Queue {
    pub fn new(dev: &Arc<dyn NvmeDevice>, qid: u16, sq_size: u32, cq_size: u32) -> Self {
        Queue {
            qid,
            sq: DmaBuffer::new(dev, sq_size as usize * 64).unwrap(),
            cq: DmaBuffer::new(dev, cq_size as usize * 16).unwrap(),
            sq_size,
            cq_size,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
            next_cid: 0,
        }
    }

    /// Writes `sqe` (CID assigned here) at the tail without ringing.
    pub fn push(&mut self, mut sqe: Sqe) -> u16 {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        sqe.set_cid(cid);
        self.sq.write_bytes(self.sq_tail as usize * 64, sqe.as_bytes()).unwrap();
        self.sq_tail = (self.sq_tail + 1) % self.sq_size;
        cid
    }

    /// The CQE at the head if its phase tag is current.
    pub fn peek(&self) -> Option<Cqe> {
        let off = self.cq_head as usize * 16;
        let dw3 = self.cq.load_u32(off + 12, Ordering::Acquire).unwrap();
        if (dw3 >> 16) & 1 != u32::from(self.phase) {
            return None;
        }
        let mut d = [0u32; 4];
        for (i, w) in d.iter_mut().enumerate().take(3) {
            *w = self.cq.load_u32(off + i * 4, Ordering::Relaxed).unwrap();
        }
        d[3] = dw3;
        Some(Cqe::from_dwords(d))
    }

    /// Consumes the head CQE (no doorbell).
    pub fn pop(&mut self) -> Option<Cqe> {
        let c = self.peek()?;
        self.cq_head += 1;
        if self.cq_head == self.cq_size {
            self.cq_head = 0;
            self.phase = !self.phase;
        }
        Some(c)
    }
}

/// An enabled emulator with its admin queue.
pub struct Harness {
    pub emu: Arc<Emulator>,
    pub dev: Arc<dyn NvmeDevice>,
    pub admin: Queue,
    pub dstrd: u8,
}

pub fn config(name: &str) -> EmulatorConfig {
    EmulatorConfig::new(name, vec![NamespaceSpec::new(1024, 4096), NamespaceSpec::new(4096, 512)])
}

pub fn cc_enable() -> Cc {
    Cc(0).with_iosqes(6).with_iocqes(4).with_mps(0).with_css(Cc::CSS_NVM).with_en(true)
}

impl Harness {
    pub fn start(config: EmulatorConfig) -> Self {
        let dstrd = config.dstrd;
        let emu = Emulator::start(config).unwrap();
        let dev: Arc<dyn NvmeDevice> = emu.clone();
        let admin = Queue::new(&dev, 0, 32, 32);
        let h = Harness { emu, dev, admin, dstrd };
        h.program_admin();
        h.write_cc(cc_enable());
        assert!(h.wait_csts(|c| c.rdy()).is_some(), "CSTS.RDY did not become 1");
        h
    }

    pub fn program_admin(&self) {
        let bar = self.dev.bar0();
        bar.write32(offset::AQA, Aqa::new(self.admin.sq_size as u16 - 1, self.admin.cq_size as u16 - 1).0)
            .unwrap();
        bar.write64(offset::ASQ, self.admin.sq.device_addr(0).unwrap()).unwrap();
        bar.write64(offset::ACQ, self.admin.cq.device_addr(0).unwrap()).unwrap();
    }

    pub fn write_cc(&self, cc: Cc) {
        self.dev.bar0().write32(offset::CC, cc.0).unwrap();
    }

    pub fn wait_csts(&self, f: impl Fn(Csts) -> bool) -> Option<Csts> {
        wait_for(|| Some(csts(&*self.dev)).filter(|&c| f(c)))
    }

    pub fn ring_sq(&self, qid: u16, tail: u32) {
        self.dev.bar0().write32(doorbell_offset(qid, false, self.dstrd), tail).unwrap();
    }

    pub fn ring_cq(&self, qid: u16, head: u32) {
        self.dev.bar0().write32(doorbell_offset(qid, true, self.dstrd), head).unwrap();
    }

    /// Submits on `q`, waits for the CQE, consumes it and rings the CQ head.
    pub fn submit_on(&self, q: &mut Queue, sqe: Sqe) -> Cqe {
        submit(&*self.dev, self.dstrd, q, sqe)
    }

    pub fn admin(&mut self, sqe: Sqe) -> Cqe {
        submit(&*self.dev, self.dstrd, &mut self.admin, sqe)
    }

    /// Creates I/O CQ and SQ `qid` and returns the queue.
    pub fn create_io(&mut self, qid: u16, size: u32) -> Queue {
        let q = Queue::new(&self.dev, qid, size, size);
        let c = self.admin(create_cq(qid, size, q.cq.device_addr(0).unwrap()));
        assert_eq!(c.status(), Status::SUCCESS, "Create I/O CQ");
        let c = self.admin(create_sq(qid, size, q.sq.device_addr(0).unwrap(), qid));
        assert_eq!(c.status(), Status::SUCCESS, "Create I/O SQ");
        q
    }
}

/// Submits on `q`, waits for the CQE, consumes it and rings the CQ head.
pub fn submit(dev: &dyn NvmeDevice, dstrd: u8, q: &mut Queue, sqe: Sqe) -> Cqe {
    let cid = q.push(sqe);
    dev.bar0().write32(doorbell_offset(q.qid, false, dstrd), q.sq_tail).unwrap();
    let cqe = wait_for(|| q.peek())
        .unwrap_or_else(|| panic!("no CQE for opcode {:#x} on queue {}", sqe.opcode(), q.qid));
    q.pop();
    dev.bar0().write32(doorbell_offset(q.qid, true, dstrd), q.cq_head).unwrap();
    assert_eq!(cqe.cid, cid, "CID");
    assert_eq!(cqe.sqid, q.qid, "SQID");
    cqe
}

pub fn create_cq(qid: u16, size: u32, base: u64) -> Sqe {
    let mut s = Sqe::new(0x05, 0);
    s.prp1 = base;
    s.cdw10 = u32::from(qid) | (size - 1) << 16;
    s.cdw11 = 1;
    s
}

pub fn create_sq(qid: u16, size: u32, base: u64, cqid: u16) -> Sqe {
    let mut s = Sqe::new(0x01, 0);
    s.prp1 = base;
    s.cdw10 = u32::from(qid) | (size - 1) << 16;
    s.cdw11 = 1 | u32::from(cqid) << 16;
    s
}

pub fn identify(cns: u8, nsid: u32, prp1: u64) -> Sqe {
    let mut s = Sqe::new(0x06, nsid);
    s.prp1 = prp1;
    s.cdw10 = u32::from(cns);
    s
}

/// Read (0x02) / Write (0x01) / Write Zeroes (0x08) of `nlb` blocks.
pub fn rw(opcode: u8, nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Sqe {
    let mut s = Sqe::new(opcode, nsid);
    s.prp1 = prp1;
    s.prp2 = prp2;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = nlb - 1;
    s
}

/// A byte pattern that differs per offset and per `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

pub fn generic(sc: u8) -> Status {
    Status::generic(sc).with_dnr(true)
}

pub fn specific(sc: u8) -> Status {
    Status::command_specific(sc).with_dnr(true)
}

/// SplitMix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
