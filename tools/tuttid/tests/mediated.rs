//! Mediated submission on emulated drives (`mediated: true`, the default
//! of `pci` drives): the controller reads only the daemon's copy of each
//! SQE, checked first. All memory is in one device address space, as in a
//! real drive's vfio container, so only the checks stand between a client
//! and another's memory. Each attack fails for the attacker with the
//! status of its refusal, the victim's bytes stay as they were, and both
//! clients' honest I/O (single-page, two-page and PRP list transfers)
//! still round-trips.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use nvm_queue::QueuePair;
use nvme_regs::status::generic;
use nvme_regs::{Sqe, Status};
use tuttid_proto::{Client, DaemonDevice, SharedMemory};

const PAGE: usize = 4096;
const P: u64 = PAGE as u64;
const READ: u8 = 0x02;
const WRITE: u8 = 0x01;
/// Where the emulator's device addresses start: the daemon's admin SQ.
const DAEMON_IOVA: u64 = 0x1_0000_0000;

/// The client process body; a no-op unless run by a test as a client.
#[test]
fn client_role() {
    if std::env::var("TUTTID_TEST_ROLE").as_deref() == Ok("client") {
        std::process::exit(client_main());
    }
}

/// The four test drives with mediated submission, plus `drive_extra`
/// keys on each.
fn mediated_yaml(dir: &std::path::Path, drive_extra: &str) -> String {
    mediated_yaml_timed(dir, drive_extra, "")
}

/// As [`mediated_yaml`], with `emulated` keys (faults, timing) added.
fn mediated_yaml_timed(dir: &std::path::Path, drive_extra: &str, emu_extra: &str) -> String {
    config_yaml_timed(&dir.join("tutti.sock"), 10_000, "", emu_extra)
        .replace("    allow:", &format!("    mediated: true\n{drive_extra}    allow:"))
}

fn rw(opcode: u8, slba: u64, blocks: u32, prp1: u64, prp2: u64) -> Sqe {
    let mut s = Sqe::new(opcode, 1);
    s.prp1 = prp1;
    s.prp2 = prp2;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = blocks - 1;
    s
}

/// Submits `sqe` (PRPs as given) on `qp` and waits for its status.
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

fn queue_pair(c: &Arc<Client>) -> QueuePair {
    DaemonDevice::open(c.clone(), "d0").unwrap().grant_queue_pair(16, 8).unwrap()
}

/// A client's registered memory of `pages` pages and its device address.
struct Mem {
    shm: SharedMemory,
    iova: u64,
}

impl Mem {
    fn new(c: &Client, pages: usize) -> Mem {
        let shm = SharedMemory::new(pages * PAGE).unwrap();
        let (_, iova, _) = c.register_memory("d0", shm.fd(), 0, shm.len() as u64).unwrap();
        Mem { shm, iova }
    }
    fn page(&self, i: u64) -> u64 {
        self.iova + i * P
    }
    /// Writes a PRP list of `entries` at page `at`.
    fn list(&self, at: usize, entries: &[u64]) {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        self.shm.write(at * PAGE, &bytes).unwrap();
    }
    fn bytes(&self, from: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.shm.read(from, &mut v).unwrap();
        v
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect()
}

#[test]
fn honest_transfers_round_trip_through_mediation() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &mediated_yaml(dir.path(), ""));
    let c = Client::connect(&d.socket).unwrap();
    let facts = c.open_drive("d0").unwrap();
    assert!(facts.max_transfer <= 2 << 20, "mediated transfers are bounded");
    let mut qp = queue_pair(&c);
    let m = Mem::new(&c, 80);
    // The largest transfer (the emulator's MDTS: 32 pages) written by one
    // command through a PRP list at page 70.
    let n = (facts.max_transfer / P).min(64) as u32;
    assert!(n >= 4);
    let data = pattern(7, n as usize * PAGE);
    m.shm.write(0, &data).unwrap();
    m.list(70, &(1..u64::from(n)).map(|i| m.page(i)).collect::<Vec<_>>());
    assert_eq!(run(&mut qp, rw(WRITE, 0, n, m.page(0), m.page(70))), Status::SUCCESS);
    let cases: [(&str, u32, u64, u64, Vec<u64>); 4] = [
        ("one page", 1, m.page(0), 0, vec![]),
        ("two pages", 2, m.page(0), m.page(1), vec![]),
        ("list", 3, m.page(0), m.page(70), vec![m.page(1), m.page(2)]),
        ("list with a PRP1 offset", 2, m.page(0) + 512, m.page(70), vec![m.page(1), m.page(2)]),
    ];
    for (what, blocks, prp1, prp2, list) in cases {
        m.shm.write(0, &vec![0; 3 * PAGE]).unwrap();
        m.list(70, &list);
        assert_eq!(run(&mut qp, rw(READ, 0, blocks, prp1, prp2)), Status::SUCCESS, "{what}");
        let off = (prp1 - m.iova) as usize;
        let len = blocks as usize * PAGE;
        assert_eq!(m.bytes(off, len), data[..len], "{what}");
    }
    // Flush and Write Zeroes (what tutti-kv issues besides Read and Write).
    assert_eq!(run(&mut qp, Sqe::new(0x00, 1)), Status::SUCCESS);
    assert_eq!(run(&mut qp, rw(0x08, 100, 8, 0, 0)), Status::SUCCESS);
}

#[test]
fn attacks_fail_and_the_victims_io_is_unaffected() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &mediated_yaml(dir.path(), ""));
    let attacker = Client::connect(&d.socket).unwrap();
    let victim = Client::connect(&d.socket).unwrap();
    let mut aq = queue_pair(&attacker);
    let mut vq = queue_pair(&victim);
    let own = Mem::new(&attacker, 4);
    let theirs = Mem::new(&victim, 4);
    theirs.shm.write(0, &vec![0x5A; 4 * PAGE]).unwrap();
    let data = pattern(3, 3 * PAGE);
    own.shm.write(0, &data).unwrap();
    own.list(3, &[own.page(1), own.page(2)]);
    assert_eq!(run(&mut aq, rw(WRITE, 0, 3, own.page(0), own.page(3))), Status::SUCCESS);

    let field = Status::generic(generic::INVALID_FIELD).with_dnr(true);
    let t = theirs.page(0);
    for (what, sqe, list) in [
        ("read into the victim (PRP1)", rw(READ, 0, 1, t, 0), None),
        ("write from the victim (PRP1)", rw(WRITE, 0, 1, t, 0), None),
        ("read into the victim (PRP2)", rw(READ, 0, 2, own.page(0), t + P), None),
        ("write from the victim (PRP2)", rw(WRITE, 0, 2, own.page(0), t + P), None),
        (
            "read into the victim (list entry)",
            rw(READ, 0, 3, own.page(0), own.page(3)),
            Some([own.page(1), t]),
        ),
        (
            "write from the victim (list entry)",
            rw(WRITE, 0, 3, own.page(0), own.page(3)),
            Some([t, own.page(2)]),
        ),
        ("victim page as the PRP list", rw(READ, 0, 3, own.page(0), t), None),
        ("read into daemon memory (PRP1)", rw(READ, 0, 1, DAEMON_IOVA, 0), None),
        (
            "read into daemon memory (list entry)",
            rw(READ, 0, 3, own.page(0), own.page(3)),
            Some([own.page(1), DAEMON_IOVA]),
        ),
        ("write from daemon memory (PRP2)", rw(WRITE, 0, 2, own.page(0), DAEMON_IOVA), None),
        ("PRP1 past its registration", rw(READ, 0, 1, own.page(4), 0), None),
    ] {
        if let Some(l) = list {
            own.list(3, &l);
        }
        assert_eq!(run(&mut aq, sqe), field, "{what}");
    }
    // Admin opcodes in an I/O SQ (Create I/O CQ, Identify, Set Features,
    // Format NVM, Firmware Commit) and other NVM opcodes not allowed.
    for opcode in [0x05, 0x06, 0x09, 0x80, 0x10, 0x04, 0x05, 0x09, 0x0c] {
        let st = run(&mut aq, Sqe::new(opcode, 1));
        assert_eq!(st, Status::generic(generic::INVALID_OPCODE).with_dnr(true), "opcode {opcode:#x}");
    }
    let ns = Status::generic(generic::INVALID_NAMESPACE_OR_FORMAT).with_dnr(true);
    let mut other_ns = rw(READ, 0, 1, own.page(0), 0);
    other_ns.nsid = 0xffff_ffff;
    assert_eq!(run(&mut aq, other_ns), ns);
    let offset = Status::generic(generic::PRP_OFFSET_INVALID).with_dnr(true);
    assert_eq!(run(&mut aq, rw(READ, 0, 2, own.page(0), own.page(1) + 8)), offset);

    assert_eq!(theirs.bytes(0, 4 * PAGE), vec![0x5A; 4 * PAGE], "victim's bytes unchanged");
    // The refused writes did not reach the media; both are still served.
    own.shm.write(0, &vec![0; 3 * PAGE]).unwrap();
    own.list(3, &[own.page(1), own.page(2)]);
    assert_eq!(run(&mut aq, rw(READ, 0, 3, own.page(0), own.page(3))), Status::SUCCESS);
    assert_eq!(own.bytes(0, 3 * PAGE), data, "media unchanged by the refused writes");
    theirs.list(3, &[theirs.page(1), theirs.page(2)]);
    assert_eq!(run(&mut vq, rw(READ, 0, 3, theirs.page(0), theirs.page(3))), Status::SUCCESS);
    assert_eq!(theirs.bytes(0, 3 * PAGE), data, "the victim reads into its own memory");
    let st = Client::connect(&d.socket).unwrap().status().unwrap();
    assert_eq!(st.drives[0].dma_faults, 0, "refused before the controller saw them");
}

#[test]
fn command_bits_the_daemon_does_not_know_are_refused_not_forwarded() {
    // The controller's copy carries only the fields the daemon checked.
    // Write Zeroes' CDW12 bit 23 is Namespace Zeroes (NVM Command Set 1.1):
    // a controller that has it zeroes the whole namespace, every tenant's
    // blocks, ignoring SLBA and NLB. Key Per I/O's key tag (CDW12 19:16,
    // CDW13 31:16), PRINFO, directives and CDW2/3/14/15 are no safer to
    // pass through unread. The attacker gets Invalid Field; the victim's
    // blocks (the emulator has no NSZ, so this shows the refusal, not
    // the damage) read back as written.
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &mediated_yaml(dir.path(), ""));
    let attacker = Client::connect(&d.socket).unwrap();
    let victim = Client::connect(&d.socket).unwrap();
    let (mut aq, mut vq) = (queue_pair(&attacker), queue_pair(&victim));
    let (own, theirs) = (Mem::new(&attacker, 2), Mem::new(&victim, 2));
    let data = pattern(5, 2 * PAGE);
    theirs.shm.write(0, &data).unwrap();
    assert_eq!(run(&mut vq, rw(WRITE, 1000, 2, theirs.page(0), theirs.page(1))), Status::SUCCESS);
    let field = Status::generic(generic::INVALID_FIELD).with_dnr(true);
    let with = |mut s: Sqe, dword: usize, bits: u32| {
        let mut d = s.as_dwords();
        d[dword] |= bits;
        s = Sqe::from_dwords(d);
        s
    };
    let wz = rw(0x08, 0, 1, 0, 0);
    let rd = rw(READ, 0, 1, own.page(0), 0);
    for (what, sqe) in [
        ("Write Zeroes with Namespace Zeroes", with(wz, 12, 1 << 23)),
        ("Write Zeroes with PRINFO", with(wz, 12, 1 << 26)),
        ("Read with a key tag (CETYPE)", with(rd, 12, 1 << 16)),
        ("Write with a directive (DTYPE)", with(rw(WRITE, 0, 1, own.page(0), 0), 12, 1 << 20)),
        ("Read with CDW13", with(rd, 13, 1 << 16)),
        ("Read with CDW2", with(rd, 2, 1)),
        ("Read with CDW15", with(rd, 15, 1)),
        ("Flush with CDW10", with(Sqe::new(0x00, 1), 10, 1)),
    ] {
        assert_eq!(run(&mut aq, sqe), field, "{what}");
    }
    // What honest clients set still passes: FUA on Write, DEAC on Write Zeroes.
    assert_eq!(run(&mut aq, with(rw(WRITE, 0, 1, own.page(0), 0), 12, 1 << 30)), Status::SUCCESS);
    assert_eq!(run(&mut aq, with(wz, 12, 1 << 25)), Status::SUCCESS);
    theirs.shm.write(0, &vec![0; 2 * PAGE]).unwrap();
    assert_eq!(run(&mut vq, rw(READ, 1000, 2, theirs.page(0), theirs.page(1))), Status::SUCCESS);
    assert_eq!(theirs.bytes(0, 2 * PAGE), data, "the victim's blocks are as written");
}

#[test]
fn a_deep_queue_does_not_make_the_daemon_pin_list_pages_per_entry() {
    // The daemon keeps PRP list pages for every command slot of a mediated
    // queue, mapped (on a `pci` drive: pinned) for the controller. A
    // controller with MQES 16383 would give one grant 64 MiB of them
    // (256 MiB at 65535), outside every quota; mediated queues are capped
    // at MEDIATED_MAX_ENTRIES (4 MiB of list pages), and a client runs at
    // the depth it is granted.
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &mediated_yaml_timed(dir.path(), "", "mqes: 16383, "));
    let c = Client::connect(&d.socket).unwrap();
    let (g, _fds) = c.grant_queue("d0", 16384).unwrap();
    assert!(g.entries <= 1024, "granted {} entries", g.entries);
    let mut qp = DaemonDevice::open(c.clone(), "d0").unwrap().grant_queue_pair(16384, 1000).unwrap();
    let m = Mem::new(&c, 1);
    assert_eq!(run(&mut qp, rw(READ, 0, 1, m.page(0), 0)), Status::SUCCESS);
}

#[test]
fn a_prp_list_rewritten_after_the_doorbell_is_not_used() {
    // A thread flips the list's entry between the attacker's page and the
    // victim's while the attacker reads through it, again and again: the
    // daemon checks and uses its own copy, so every command either reads
    // into the attacker's page or is refused, and the victim's page is
    // never written. (Without the copy the controller would read the list
    // after the check, and some reads would land in the victim's page.)
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &mediated_yaml(dir.path(), ""));
    let attacker = Client::connect(&d.socket).unwrap();
    let victim = Client::connect(&d.socket).unwrap();
    let mut aq = queue_pair(&attacker);
    let own = Arc::new(Mem::new(&attacker, 4));
    let theirs = Mem::new(&victim, 2);
    theirs.shm.write(0, &vec![0x5A; 2 * PAGE]).unwrap();
    let (good, bad) = (own.page(2), theirs.page(0));
    own.list(3, &[own.page(1), good]);
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (own, stop) = (own.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                own.list(3, &[own.page(1), if n.is_multiple_of(2) { bad } else { good }]);
                n += 1;
            }
        })
    };
    let field = Status::generic(generic::INVALID_FIELD).with_dnr(true);
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..2000 {
        match run(&mut aq, rw(READ, 0, 3, own.page(0), own.page(3))) {
            Status::SUCCESS => ok += 1,
            s if s == field => refused += 1,
            s => panic!("unexpected status {s:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    eprintln!("{ok} read into the attacker's page, {refused} refused");
    assert_eq!(theirs.bytes(0, 2 * PAGE), vec![0x5A; 2 * PAGE], "victim's page never written");
}

#[test]
fn a_partition_is_the_tenants_namespace_and_nothing_past_it_is_reached() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let uid = rustix::process::getuid().as_raw();
    // This uid's commands reach LBAs 256..512 of each 2048-block
    // namespace (its LBAs 0..256); d0's media is a file the test reads.
    let part = format!("    partitions: [ {{ uids: [{uid}], first_lba: 256, blocks: 256 }} ]\n");
    let media = dir.path().join("d0.img");
    let yaml = mediated_yaml(dir.path(), &part).replacen(
        "{ emulated: { ",
        &format!("{{ emulated: {{ backing: {{ file: {} }}, ", media.display()),
        1,
    );
    let d = Daemon::start(dir.path(), &yaml);
    let c = Client::connect(&d.socket).unwrap();
    assert_eq!(c.open_drive("d0").unwrap().blocks, 256, "the tenant sees its partition's length");
    let mut qp = queue_pair(&c);
    let m = Mem::new(&c, 2);
    let range = Status::generic(generic::LBA_OUT_OF_RANGE).with_dnr(true);
    for (what, slba, blocks) in [("at the end", 256, 1), ("across the end", 255, 2), ("far", 1800, 1)] {
        assert_eq!(run(&mut qp, rw(WRITE, slba, blocks, m.page(0), m.page(1))), range, "write {what}");
        assert_eq!(run(&mut qp, rw(READ, slba, blocks, m.page(0), m.page(1))), range, "read {what}");
    }
    assert_eq!(run(&mut qp, rw(0x08, 250, 16, 0, 0)), range, "write zeroes across the end");
    let data = pattern(9, 2 * PAGE);
    m.shm.write(0, &data).unwrap();
    assert_eq!(run(&mut qp, rw(WRITE, 254, 2, m.page(0), m.page(1))), Status::SUCCESS);
    m.shm.write(0, &vec![0; 2 * PAGE]).unwrap();
    assert_eq!(run(&mut qp, rw(READ, 254, 2, m.page(0), m.page(1))), Status::SUCCESS);
    assert_eq!(m.bytes(0, 2 * PAGE), data);
    // On the media the tenant's LBA 254 is the namespace's 510, and
    // nothing outside 256..512 was written.
    let f = std::fs::File::open(&media).unwrap();
    let mut on_media = vec![0u8; 2 * PAGE];
    f.read_exact_at(&mut on_media, 510 * P).unwrap();
    assert_eq!(on_media, data);
    let mut all = vec![0u8; 2048 * PAGE];
    let n = f.read_at(&mut all, 0).unwrap();
    assert!(all[..256 * PAGE].iter().all(|&b| b == 0), "nothing before the partition");
    assert!(all[512 * PAGE..n.max(512 * PAGE)].iter().all(|&b| b == 0), "nothing after it");
    // A peer on no partition gets neither facts nor a queue.
    let other = format!("    partitions: [ {{ uids: [{}], first_lba: 0, blocks: 8 }} ]\n", uid + 1);
    let dir2 = tempfile::tempdir().unwrap();
    let d2 = Daemon::start(dir2.path(), &mediated_yaml(dir2.path(), &other));
    let c2 = Client::connect(&d2.socket).unwrap();
    assert!(c2.open_drive("d0").is_err() && c2.grant_queue("d0", 16).is_err(), "no partition, no queue");
}

#[test]
fn clients_stripe_through_mediated_drives() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &mediated_yaml(dir.path(), ""));
    stripe_verified(&d.socket, dir.path(), 4, 4);
    assert_all_reclaimed(&d.socket);
}

/// A mediated drive whose LBAs 64..128 complete `delay_us` late, a client
/// with a queue pair, and one page of its memory (`id`) that a Read of LBA
/// 64, submitted 50 ms ago, names.
struct HeldRead {
    _dir: tempfile::TempDir,
    daemon: Daemon,
    client: Arc<Client>,
    qp: QueuePair,
    id: u64,
    _shm: SharedMemory,
    /// The drive's registrations before this one.
    registrations_before: u32,
}

impl HeldRead {
    fn start(delay_us: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let faults = format!("faults: [ {{ lba: [64, 128], action: {{ delay_us: {delay_us} }} }} ], ");
        let daemon = Daemon::start(dir.path(), &mediated_yaml_timed(dir.path(), "", &faults));
        let client = Client::connect(&daemon.socket).unwrap();
        let mut qp = queue_pair(&client);
        let before = Client::connect(&daemon.socket).unwrap().status().unwrap().drives[0].registrations;
        let shm = SharedMemory::new(PAGE).unwrap();
        let (id, iova, _) = client.register_memory("d0", shm.fd(), 0, PAGE as u64).unwrap();
        qp.submit(rw(READ, 64, 1, iova, 0), None, 0).unwrap();
        qp.ring();
        std::thread::sleep(Duration::from_millis(50));
        Self { _dir: dir, daemon, client, qp, id, _shm: shm, registrations_before: before }
    }
}

/// The status of the first completion on `qp` within `within`.
fn first_status(qp: &mut QueuePair, within: Duration) -> Option<Status> {
    let mut status = None;
    let deadline = Instant::now() + within;
    while status.is_none() && Instant::now() < deadline {
        qp.poll(|c| status = Some(c.status));
    }
    status
}

#[test]
fn unregistering_waits_for_the_commands_that_may_name_the_memory() {
    // LBAs 64..128 complete 300 ms late: a registration a Read there
    // names is unmapped only after the Read completed (its IOVA could
    // otherwise go to another client while the controller still writes).
    let h = HeldRead::start(300_000);
    let (d, c, mut qp, id) = (&h.daemon, &h.client, h.qp, h.id);
    let before = h.registrations_before;
    let t = Instant::now();
    c.unregister_memory(id).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(150), "unregistered after {:?}", t.elapsed());
    let status = first_status(&mut qp, Duration::from_secs(5));
    assert_eq!(status, Some(Status::SUCCESS));
    let st = Client::connect(&d.socket).unwrap().status().unwrap();
    assert_eq!((st.drives[0].dma_faults, st.drives[0].registrations), (0, before));
}

#[test]
fn memory_of_a_queue_whose_deletion_failed_stays_mapped() {
    // A Read at LBA 200 makes the controller fatal: it is never completed,
    // and the ReleaseQueue that follows cannot delete the SQ (the queue is
    // quarantined, the controller may still DMA for it). Forwarding of the
    // queue stopped before Delete I/O SQ, which released its commands from
    // the unregistration wait; unregistering the memory the Read names
    // must still keep it mapped (as reclaim does for such a drive), else
    // its IOVA may go to another client while the command is live.
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let faults = "faults: [ { lba: [200, 201], action: controller_fatal } ], ";
    let d = Daemon::start(dir.path(), &mediated_yaml_timed(dir.path(), "", faults));
    let c = Client::connect(&d.socket).unwrap();
    let regs = || Client::connect(&d.socket).unwrap().status().unwrap().drives[0].registrations;
    let (g, [sq, _cq, db]) = c.grant_queue("d0", 16).unwrap();
    let shm = SharedMemory::new(PAGE).unwrap();
    let (id, iova, _) = c.register_memory("d0", shm.fd(), 0, PAGE as u64).unwrap();
    let bytes: Vec<u8> = rw(READ, 200, 1, iova, 0).as_dwords().iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::File::from(sq).write_at(&bytes, 0).unwrap();
    std::fs::File::from(db).write_at(&1u32.to_le_bytes(), 0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(c.release_queue("d0", g.qid).is_err(), "Delete I/O SQ of a fatal controller fails");
    c.unregister_memory(id).unwrap();
    assert_eq!(regs(), 1, "the memory stays mapped (and counted)");
    let st = Client::connect(&d.socket).unwrap().status().unwrap();
    assert_eq!(st.drives[0].quarantined, 1);
}

#[test]
fn bad_shadow_words_end_the_lease() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &mediated_yaml(dir.path(), ""));
    let ends =
        |c: &Client| eventually(Duration::from_secs(5), || c.heartbeat().is_err().then_some(())).is_some();
    let a = Client::connect(&d.socket).unwrap();
    let (_, [_sq, _cq, db]) = a.grant_queue("d0", 16).unwrap();
    std::fs::File::from(db).write_at(&3u32.to_le_bytes(), 2048).unwrap();
    assert!(ends(&a), "a CQ head past the posted completions");
    let b = Client::connect(&d.socket).unwrap();
    let (_, [_sq, _cq, db]) = b.grant_queue("d0", 16).unwrap();
    std::fs::File::from(db).write_at(&16u32.to_le_bytes(), 0).unwrap();
    assert!(ends(&b), "an SQ tail that is no entry index");
    let st = eventually(Duration::from_secs(10), || {
        let s = Client::connect(&d.socket).unwrap().status().unwrap();
        (s.drives[0].queues_free == s.drives[0].queues_total).then_some(s)
    });
    assert!(st.is_some(), "both reclaimed");
}

#[test]
fn sigkilled_clients_of_mediated_drives_are_reclaimed() {
    // Victims' LBAs complete 20 ms late (data moves at once, as a real
    // drive's DMA would), so kills land with commands in flight; a steady
    // client verifies every byte meanwhile.
    let dir = tempfile::tempdir().unwrap();
    let faults = "faults: [ { lba: [64, 128], action: { delay_us: 20000 } } ], ";
    let d = Daemon::start(dir.path(), &mediated_yaml_timed(dir.path(), "", faults));
    let mut steady = spawn_client(&d.socket, dir.path(), 0, 0);
    assert_eq!(wait_line(&mut steady, "ready").trim(), "ready");
    for round in 0..10u64 {
        let mut victim = spawn_client(&d.socket, dir.path(), 2 + round % 2, 0);
        assert_eq!(wait_line(&mut victim, "ready").trim(), "ready", "victim {round} did not start");
        std::thread::sleep(Duration::from_millis(60 + round * 7));
        victim.kill().unwrap();
        victim.wait().unwrap();
    }
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    let line = wait_line(&mut steady, "verified");
    let st = steady.wait().unwrap();
    assert!(st.success() && !line.is_empty(), "steady client saw an error: {st:?} {line:?}");
    let status = || Client::connect(&d.socket).unwrap().status().unwrap();
    let s = eventually(Duration::from_secs(20), || {
        let s = status();
        (s.clients.len() == 1
            && s.drives.iter().all(|d| d.queues_free == d.queues_total && d.registrations == 0))
        .then_some(s)
    })
    .unwrap_or_else(|| panic!("not reclaimed: {:#?}", status()));
    assert!(s.drives.iter().all(|d| d.dma_faults == 0 && d.quarantined == 0), "{s:?}");
    assert!(s.reclaimed >= 11, "{s:?}");
}

#[test]
fn an_unregistration_past_its_drain_bound_returns_and_is_finished_once_the_commands_complete() {
    // LBAs 64..128 complete 3 s late, longer than an unregistration waits
    // (1 s): the reply comes at that bound (not after 10 s, the client's
    // reply timeout), the memory stays mapped and counted while the Read
    // may still write it, and the connection's next request unmaps it
    // once the Read has completed. Before, the daemon waited 10 s, then
    // kept the memory mapped for good while giving its quota back.
    let h = HeldRead::start(3_000_000);
    let (d, c, mut qp, id) = (&h.daemon, &h.client, h.qp, h.id);
    let regs = || Client::connect(&d.socket).unwrap().status().unwrap().drives[0].registrations;
    let before = h.registrations_before;
    let t = Instant::now();
    c.unregister_memory(id).unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "unregistered after {took:?}"
    );
    assert_eq!(regs(), before + 1, "still mapped while the Read may write it");
    let status = first_status(&mut qp, Duration::from_secs(8));
    assert_eq!(status, Some(Status::SUCCESS));
    // The connection's next request finishes the deferred unregistration.
    let shm2 = SharedMemory::new(PAGE).unwrap();
    let (id2, _, _) = c.register_memory("d0", shm2.fd(), 0, PAGE as u64).unwrap();
    assert_eq!(regs(), before + 1, "the old one gone, the new one there");
    c.unregister_memory(id2).unwrap();
    let st = Client::connect(&d.socket).unwrap().status().unwrap();
    assert_eq!((st.drives[0].dma_faults, st.drives[0].registrations), (0, before));
}

/// `tuttid attack` (the hostile client the QEMU guest runs against its
/// vfio-bound drives) passes against a mediated drive, and fails, naming
/// the first attack that got through, against one that is not mediated
/// (there the per-connection DMA domain stops the PRP attacks with a Data
/// Transfer Error rather than mediation's Invalid Field).
#[test]
fn the_attack_command_passes_on_a_mediated_drive_and_fails_without_mediation() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &mediated_yaml(dir.path(), ""));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tuttid"))
        .args(["attack", "--socket", d.socket.to_str().unwrap(), "--drive", "d0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.matches("refused as expected").count(), 19, "{text}");
    assert!(text.contains("19 attacks refused"), "{text}");
    // The operator view counts them (the forwarding thread's counters).
    let st = Client::connect(&d.socket).unwrap().status().unwrap();
    let f = st.drives.iter().find(|r| r.name == "d0").unwrap().forwarding;
    assert_eq!(f.sqes_refused, 19, "{f:?}");
    assert!(f.sqes_mediated >= 3 && f.doorbells_forwarded > 0, "the honest write and reads: {f:?}");
    assert_eq!((f.doorbells_invalid, f.stray_completions), (0, 0), "{f:?}");
    drop(d);

    let plain = tempfile::tempdir().unwrap();
    let d = Daemon::start(plain.path(), &config_yaml(&plain.path().join("tutti.sock"), 10_000, ""));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tuttid"))
        .args(["attack", "--socket", d.socket.to_str().unwrap(), "--drive", "d0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("read into the victim (PRP1)"), "{err}");
}
