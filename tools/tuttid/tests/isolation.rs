//! DMA isolation between clients of one emulated drive: device addresses
//! are handed out in order, so a client can compute where another
//! client's registered memory sits; commands on its own granted queue
//! that point PRPs there must fail (Data Transfer Error), leave the other
//! client's bytes and the media as they were, and leave the daemon serving
//! both clients.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use nvm_queue::QueuePair;
use nvme_regs::status::generic;
use nvme_regs::{Sqe, Status};
use tuttid_proto::{Client, DaemonDevice, SharedMemory};

const PAGE: usize = 4096;
const READ: u8 = 0x02;
const WRITE: u8 = 0x01;

/// A Read or Write of `blocks` 4 KiB blocks at LBA `slba` of namespace 1
/// with the PRPs given as they are.
fn rw(opcode: u8, slba: u64, blocks: u32, prp1: u64, prp2: u64) -> Sqe {
    let mut s = Sqe::new(opcode, 1);
    s.prp1 = prp1;
    s.prp2 = prp2;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = blocks - 1;
    s
}

/// Submits `sqe` (PRPs already set) on `qp` and waits for its status.
fn run(qp: &mut QueuePair, sqe: Sqe) -> Status {
    qp.submit(sqe, None, 0).expect("submit");
    qp.ring();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = None;
    while status.is_none() {
        assert!(Instant::now() < deadline, "no completion");
        qp.poll(|c| status = Some(c.status));
    }
    status.unwrap_or(Status::SUCCESS)
}

/// Client `c`'s queue pair on d0.
fn queue_pair(c: &Arc<Client>) -> QueuePair {
    DaemonDevice::open(c.clone(), "d0").unwrap().grant_queue_pair(16, 8).unwrap()
}

#[test]
fn a_client_cannot_dma_into_another_clients_memory() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &config_yaml(&dir.path().join("tutti.sock"), 10_000, ""));
    let attacker = Client::connect(&d.socket).unwrap();
    let victim = Client::connect(&d.socket).unwrap();
    let mut aq = queue_pair(&attacker);
    // The attacker's own memory: 4 pages (3 data, 1 PRP list).
    let own = SharedMemory::new(4 * PAGE).unwrap();
    let (_, own_iova, own_len) = attacker.register_memory("d0", own.fd(), 0, own.len() as u64).unwrap();
    // The victim registers next; the attacker guesses where: the next
    // address after its own mapping and one guard page.
    let theirs = SharedMemory::new(3 * PAGE).unwrap();
    theirs.write(0, &vec![0x5A; 3 * PAGE]).unwrap();
    let (_, their_iova, _) = victim.register_memory("d0", theirs.fd(), 0, theirs.len() as u64).unwrap();
    let guess = own_iova + own_len.next_multiple_of(PAGE as u64) + PAGE as u64;
    assert_eq!(guess, their_iova, "device addresses are predictable");
    let page = |i: u64| own_iova + i * PAGE as u64;
    // The PRP list lives in the attacker's last page.
    let set_list = |entries: [u64; 2]| {
        let list: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        own.write(3 * PAGE, &list).unwrap();
    };

    // The attacker's data on the media first (blocks 0..3).
    let data: Vec<u8> = (0..3 * PAGE).map(|i| (i * 7 + 3) as u8).collect();
    own.write(0, &data).unwrap();
    set_list([page(1), page(2)]);
    assert_eq!(run(&mut aq, rw(WRITE, 0, 3, page(0), page(3))), Status::SUCCESS);
    // Now the list's second entry is the victim's first page.
    set_list([page(1), guess]);

    let dte = Status::generic(generic::DATA_TRANSFER_ERROR).with_dnr(true);
    let attacks = [
        ("read into the victim (PRP1)", rw(READ, 0, 1, guess, 0)),
        ("write from the victim (PRP1)", rw(WRITE, 0, 1, guess, 0)),
        ("read into the victim (PRP2)", rw(READ, 0, 2, page(0), guess + PAGE as u64)),
        ("read into the victim (list entry)", rw(READ, 0, 3, page(0), page(3))),
        ("write from the victim (list entry)", rw(WRITE, 0, 3, page(0), page(3))),
        ("victim page as PRP list", rw(READ, 0, 3, page(0), guess)),
    ];
    for (what, sqe) in attacks {
        assert_eq!(run(&mut aq, sqe), dte, "{what}");
    }
    let mut now = vec![0u8; 3 * PAGE];
    theirs.read(0, &mut now).unwrap();
    assert_eq!(now, vec![0x5A; 3 * PAGE], "victim's bytes unchanged");

    // Both are still served: the media holds the attacker's data (no
    // write took the victim's bytes), and the victim's own queue reaches
    // its own memory.
    own.write(0, &vec![0; 3 * PAGE]).unwrap();
    set_list([page(1), page(2)]);
    assert_eq!(run(&mut aq, rw(READ, 0, 3, page(0), page(3))), Status::SUCCESS);
    let mut back = vec![0u8; 3 * PAGE];
    own.read(0, &mut back).unwrap();
    assert_eq!(back, data, "media unchanged by the refused writes");
    let mut vq = queue_pair(&victim);
    assert_eq!(run(&mut vq, rw(READ, 0, 2, their_iova, their_iova + PAGE as u64)), Status::SUCCESS);
    theirs.read(0, &mut now).unwrap();
    assert_eq!(&now[..2 * PAGE], &data[..2 * PAGE], "victim reads the drive into its own memory");
    assert_eq!(&now[2 * PAGE..], &vec![0x5A; PAGE][..]);
    let st = Client::connect(&d.socket).unwrap().status().unwrap();
    let d0 = st.drives.iter().find(|r| r.name == "d0").unwrap();
    assert_eq!(d0.dma_faults, 0, "refused, not unmapped, accesses");
    assert_eq!(st.clients.len(), 3);
}
