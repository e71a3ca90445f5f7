//! `tuttid attack`: a hostile client for checking a running daemon's
//! mediated submission where the attacks of `tests/mediated.rs` cannot run
//! (the QEMU guest's vfio-bound drives, a real drive). It opens two
//! connections, a victim and an attacker, each with a queue pair and
//! registered memory on `--drive`, and the attacker issues Reads and Writes
//! whose PRP1, PRP2, a PRP list entry or the list page itself name the
//! victim's memory or memory of nobody (IOVA 0), admin and unlisted
//! opcodes, another NSID and a misaligned PRP2. Each must complete with
//! its refusal status (DNR set); then the victim's bytes must be unchanged
//! and both clients' honest list Reads must return what the attacker wrote.
//!
//! It writes `3 * 4096` bytes at LBA 0 of the drive's namespace (the
//! tenant's partition): run it on a scratch drive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use nvm_queue::QueuePair;
use nvme_regs::status::generic;
use nvme_regs::{Sqe, Status};
use tuttid_proto::{Client, DaemonDevice, SharedMemory};

use crate::verify::Failure;

const PAGE: usize = 4096;
const P: u64 = PAGE as u64;
const READ: u8 = 0x02;
const WRITE: u8 = 0x01;

/// Options of `attack`.
#[derive(Debug, Args)]
pub struct AttackArgs {
    /// The daemon's socket.
    #[arg(long)]
    pub socket: std::path::PathBuf,
    /// The (mediated) drive to attack through.
    #[arg(long)]
    pub drive: String,
}

/// One client's connection, queue pair and 4 pages of registered memory.
struct Side {
    qp: QueuePair,
    shm: SharedMemory,
    iova: u64,
    /// Logical blocks per 4 KiB page.
    per_page: u32,
    _client: Arc<Client>,
}

impl Side {
    fn new(a: &AttackArgs) -> Result<Side, Failure> {
        let client = Client::connect(&a.socket).map_err(fail)?;
        let dev = DaemonDevice::open(client.clone(), &a.drive).map_err(fail)?;
        let bs = dev.facts().block_size;
        if bs == 0 || bs as usize > PAGE || !PAGE.is_multiple_of(bs as usize) {
            return Err(fail(format!("block size {bs}: this check needs blocks of at most 4 KiB")));
        }
        let qp = dev.grant_queue_pair(16, 8).map_err(fail)?;
        let shm = SharedMemory::new(4 * PAGE).map_err(fail)?;
        let (_, iova, _) = client.register_memory(&a.drive, shm.fd(), 0, shm.len() as u64).map_err(fail)?;
        Ok(Side { qp, shm, iova, per_page: (PAGE / bs as usize) as u32, _client: client })
    }

    fn page(&self, i: u64) -> u64 {
        self.iova + i * P
    }

    /// A Read or Write of `pages` pages at LBA 0.
    fn rw(&self, opcode: u8, pages: u32, prp1: u64, prp2: u64) -> Sqe {
        let mut s = Sqe::new(opcode, 1);
        (s.prp1, s.prp2, s.cdw12) = (prp1, prp2, pages * self.per_page - 1);
        s
    }

    fn list(&self, entries: &[u64]) -> Result<(), Failure> {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        self.shm.write(3 * PAGE, &bytes).map_err(fail)
    }

    fn bytes(&self, len: usize) -> Result<Vec<u8>, Failure> {
        let mut v = vec![0u8; len];
        self.shm.read(0, &mut v).map_err(fail)?;
        Ok(v)
    }

    /// Submits `sqe` and waits (10 s) for its status.
    fn run(&mut self, sqe: Sqe) -> Result<Status, Failure> {
        self.qp.submit(sqe, None, 0).map_err(fail)?;
        self.qp.ring();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut status = None;
        while status.is_none() {
            if Instant::now() > deadline {
                return Err(fail("a command got no completion in 10 s"));
            }
            self.qp.poll(|c| status = Some(c.status));
        }
        Ok(status.unwrap_or(Status::SUCCESS))
    }
}

fn fail(e: impl std::fmt::Display) -> Failure {
    (false, e.to_string())
}

/// `check` fails as wrong data (an attack that got through) when `got` is
/// not `want`.
fn expect(what: &str, got: Status, want: Status) -> Result<(), Failure> {
    if got == want {
        println!("refused as expected: {what}");
        Ok(())
    } else {
        Err((true, format!("{what}: completed with {got:?}, expected the refusal {want:?}")))
    }
}

/// Runs the attacks; the number checked.
///
/// # Errors
///
/// `(true, ..)` when an attack was not refused or bytes changed that must
/// not have; `(false, ..)` when the daemon or drive could not be used.
pub fn run(a: &AttackArgs) -> Result<usize, Failure> {
    let mut attacker = Side::new(a)?;
    let mut victim = Side::new(a)?;
    victim.shm.write(0, &vec![0x5A; 4 * PAGE]).map_err(fail)?;
    let data: Vec<u8> = (0..3 * PAGE).map(|i| (i as u8).wrapping_mul(31) ^ (i >> 12) as u8).collect();
    attacker.shm.write(0, &data).map_err(fail)?;
    let base = attacker.iova;
    let own = move |i: u64| base + i * P;
    attacker.list(&[own(1), own(2)])?;
    let st = attacker.run(attacker.rw(WRITE, 3, own(0), own(3)))?;
    if st != Status::SUCCESS {
        return Err(fail(format!("the attacker's honest write failed: {st:?}")));
    }
    let field = Status::generic(generic::INVALID_FIELD).with_dnr(true);
    let t = victim.page(0);
    let cases: [(&str, Sqe, Option<[u64; 2]>); 10] = [
        ("read into the victim (PRP1)", attacker.rw(READ, 1, t, 0), None),
        ("write from the victim (PRP1)", attacker.rw(WRITE, 1, t, 0), None),
        ("read into the victim (PRP2)", attacker.rw(READ, 2, own(0), t + P), None),
        ("write from the victim (PRP2)", attacker.rw(WRITE, 2, own(0), t + P), None),
        ("read into the victim (list entry)", attacker.rw(READ, 3, own(0), own(3)), Some([own(1), t])),
        ("write from the victim (list entry)", attacker.rw(WRITE, 3, own(0), own(3)), Some([t, own(2)])),
        ("the victim's page as the PRP list", attacker.rw(READ, 3, own(0), t), None),
        ("read into IOVA 0 (PRP1)", attacker.rw(READ, 1, 0, 0), None),
        ("read into IOVA 0 (list entry)", attacker.rw(READ, 3, own(0), own(3)), Some([own(1), 0])),
        ("PRP1 past its registration", attacker.rw(READ, 1, own(4), 0), None),
    ];
    let mut checked = 0;
    for (what, sqe, list) in cases {
        if let Some(l) = list {
            attacker.list(&l)?;
        }
        expect(what, attacker.run(sqe)?, field)?;
        checked += 1;
    }
    for opcode in [0x05u8, 0x06, 0x09, 0x80, 0x10, 0x04, 0x0c] {
        let want = Status::generic(generic::INVALID_OPCODE).with_dnr(true);
        expect(&format!("opcode {opcode:#04x} in an I/O SQ"), attacker.run(Sqe::new(opcode, 1))?, want)?;
        checked += 1;
    }
    let mut other_ns = attacker.rw(READ, 1, own(0), 0);
    other_ns.nsid = 0xffff_ffff;
    let ns = Status::generic(generic::INVALID_NAMESPACE_OR_FORMAT).with_dnr(true);
    expect("another NSID", attacker.run(other_ns)?, ns)?;
    let offset = Status::generic(generic::PRP_OFFSET_INVALID).with_dnr(true);
    expect("a misaligned PRP2", attacker.run(attacker.rw(READ, 2, own(0), own(1) + 8))?, offset)?;
    checked += 2;
    honest_reads(&mut attacker, &mut victim, &data)?;
    Ok(checked)
}

/// The victim's bytes are untouched; both sides' list Reads return what
/// the attacker wrote (the refused writes never reached the media).
fn honest_reads(attacker: &mut Side, victim: &mut Side, data: &[u8]) -> Result<(), Failure> {
    if victim.bytes(4 * PAGE)? != vec![0x5A; 4 * PAGE] {
        return Err((true, "the victim's memory changed".into()));
    }
    for (who, side) in [("attacker", attacker), ("victim", victim)] {
        side.shm.write(0, &vec![0; 3 * PAGE]).map_err(fail)?;
        side.list(&[side.page(1), side.page(2)])?;
        let st = side.run(side.rw(READ, 3, side.page(0), side.page(3)))?;
        if st != Status::SUCCESS {
            return Err(fail(format!("the {who}'s honest read failed: {st:?}")));
        }
        if side.bytes(3 * PAGE)? != data {
            return Err((
                true,
                format!("the {who} read other bytes than the honest write left on the media"),
            ));
        }
    }
    Ok(())
}
