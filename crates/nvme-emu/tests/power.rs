//! Crash semantics: the volatile write cache (what is durable when), power
//! failures (torn at logical block boundaries, seeded), backings that
//! outlive an emulator (named RAM disks, files), direct media access.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use nvm_queue::{DmaBuffer, NvmeDevice};
use nvme_emu::{
    BackingSpec, EmuError, Emulator, EmulatorConfig, FaultAction, FaultMatch, FaultRule, MediaAccessError,
    NamespaceSpec, PowerFailReport, WriteCacheSpec,
};
use nvme_regs::registers::offset;
use nvme_regs::status::generic as gsc;
use nvme_regs::{IdentifyController, Sqe, Status};

/// Logical block size of namespace 1 in these tests.
const BLOCK: usize = 4096;
/// Blocks of namespace 1.
const BLOCKS: u64 = 256;

/// One 4 KiB-block namespace of 1 MiB (and a 512-byte one behind it) on
/// RAM disk `disk`, with a write cache of `capacity` bytes seeded `seed`.
fn cached(disk: &str, capacity: u64, seed: u64) -> EmulatorConfig {
    let mut c =
        EmulatorConfig::new(disk, vec![NamespaceSpec::new(BLOCKS, 4096), NamespaceSpec::new(64, 512)]);
    c.backing = BackingSpec::RamDisk(disk.to_owned());
    c.write_cache = Some(WriteCacheSpec { capacity_bytes: capacity, seed });
    c
}

/// A fresh RAM disk name (tests run in parallel in one process).
fn fresh(name: &str) -> String {
    let _ = nvme_emu::remove_ram_disk(name);
    name.to_owned()
}

/// Data for Read/Write of up to 32 blocks of 4 KiB: pages plus a PRP list.
struct Io {
    data: DmaBuffer,
    list: DmaBuffer,
}

impl Io {
    fn new(dev: &Arc<dyn NvmeDevice>) -> Self {
        let data = DmaBuffer::new(dev, 32 * PAGE).unwrap();
        let list = DmaBuffer::new(dev, PAGE).unwrap();
        for i in 1..32 {
            let a = data.device_addr(i * PAGE).unwrap();
            list.store_u64((i - 1) * 8, a, std::sync::atomic::Ordering::Relaxed).unwrap();
        }
        Io { data, list }
    }

    /// A Read (02h) or Write (01h) of `nlb` 4 KiB blocks at `slba` of NSID
    /// 1, FUA when `fua`.
    fn sqe(&self, opcode: u8, slba: u64, nlb: u32, fua: bool) -> Sqe {
        let prp2 = match nlb {
            1 => 0,
            2 => self.data.device_addr(PAGE).unwrap(),
            _ => self.list.device_addr(0).unwrap(),
        };
        let mut s = rw(opcode, 1, slba, nlb, self.data.device_addr(0).unwrap(), prp2);
        if fua {
            s.cdw12 |= 1 << 30;
        }
        s
    }
}

fn write(h: &Harness, q: &mut Queue, io: &Io, slba: u64, bytes: &[u8], fua: bool) {
    io.data.write_bytes(0, bytes).unwrap();
    let c = h.submit_on(q, io.sqe(0x01, slba, (bytes.len() / BLOCK) as u32, fua));
    assert_eq!(c.status(), Status::SUCCESS, "write at {slba}");
}

fn read(h: &Harness, q: &mut Queue, io: &Io, slba: u64, nlb: usize) -> Vec<u8> {
    let c = h.submit_on(q, io.sqe(0x02, slba, nlb as u32, false));
    assert_eq!(c.status(), Status::SUCCESS, "read at {slba}");
    let mut v = vec![0u8; nlb * BLOCK];
    io.data.read_bytes(0, &mut v).unwrap();
    v
}

fn flush(h: &Harness, q: &mut Queue, nsid: u32) -> Status {
    h.submit_on(q, Sqe::new(0x00, nsid)).status()
}

/// What the RAM disk (or file) behind `config` holds in blocks
/// `slba..slba + n` of NSID 1, read by a new emulator.
fn reopen_and_read(config: EmulatorConfig, slba: u64, n: usize) -> Vec<u8> {
    let emu = Emulator::start(config).unwrap();
    let mut v = vec![0u8; n * BLOCK];
    emu.read_media(1, slba * BLOCK as u64, &mut v).unwrap();
    v
}

/// Per block of `got`: `Some(true)` new, `Some(false)` old, `None` neither
/// (a torn block).
fn classify(got: &[u8], old: &[u8], new: &[u8]) -> Vec<Option<bool>> {
    got.chunks(BLOCK)
        .zip(old.chunks(BLOCK).zip(new.chunks(BLOCK)))
        .map(|(g, (o, n))| {
            if g == n {
                Some(true)
            } else if g == o {
                Some(false)
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn an_unflushed_multi_block_write_is_torn_only_at_block_boundaries() {
    let old = pattern(16 * BLOCK, 1);
    let new = pattern(16 * BLOCK, 2);
    let (mut torn, mut all_kept, mut all_lost) = (0, 0, 0);
    for seed in 0..12u64 {
        let disk = fresh(&format!("power-torn-{seed}"));
        let mut h = Harness::start(cached(&disk, 64 << 20, seed));
        let mut q = h.create_io(1, 16);
        let io = Io::new(&h.dev);
        h.emu.write_media(1, 40 * BLOCK as u64, &old).unwrap(); // durable
        write(&h, &mut q, &io, 40, &new, false);
        assert!(read(&h, &mut q, &io, 40, 16) == new, "reads see the cache");
        let r = h.emu.power_fail();
        assert_eq!(r.kept_blocks + r.lost_blocks, 16, "{r:?}");
        assert_eq!(r.restore_errors, 0);
        let got = reopen_and_read(cached(&disk, 64 << 20, seed), 40, 16);
        let blocks = classify(&got, &old, &new);
        assert!(blocks.iter().all(Option::is_some), "seed {seed}: a block mixes old and new bytes");
        let kept = blocks.iter().filter(|b| **b == Some(true)).count() as u64;
        assert_eq!((kept, 16 - kept), (r.kept_blocks, r.lost_blocks), "seed {seed}");
        match kept {
            0 => all_lost += 1,
            16 => all_kept += 1,
            _ => torn += 1,
        }
        // The same seed and history give the same outcome.
        if seed == 3 {
            let disk2 = fresh("power-torn-repeat");
            let mut h2 = Harness::start(cached(&disk2, 64 << 20, seed));
            let mut q2 = h2.create_io(1, 16);
            let io2 = Io::new(&h2.dev);
            h2.emu.write_media(1, 40 * BLOCK as u64, &old).unwrap();
            write(&h2, &mut q2, &io2, 40, &new, false);
            assert_eq!(h2.emu.power_fail(), r);
            assert!(reopen_and_read(cached(&disk2, 64 << 20, seed), 40, 16) == got);
            nvme_emu::remove_ram_disk(&disk2).unwrap();
        }
        nvme_emu::remove_ram_disk(&disk).unwrap();
    }
    assert!(torn > 0, "no seed tore the write (all kept {all_kept}, all lost {all_lost})");
}

#[test]
fn flush_then_power_failure_keeps_everything() {
    for nsid in [1, 0xFFFF_FFFF] {
        let disk = fresh(&format!("power-flush-{nsid:x}"));
        let mut h = Harness::start(cached(&disk, 64 << 20, 7));
        let mut q = h.create_io(1, 16);
        let io = Io::new(&h.dev);
        let new = pattern(8 * BLOCK, 3);
        write(&h, &mut q, &io, 0, &new, false);
        write(&h, &mut q, &io, 100, &new, false);
        assert_eq!(flush(&h, &mut q, nsid), Status::SUCCESS);
        assert_eq!(h.emu.power_fail(), PowerFailReport::default(), "nothing left in the cache");
        assert!(reopen_and_read(cached(&disk, 64 << 20, 7), 0, 8) == new);
        assert!(reopen_and_read(cached(&disk, 64 << 20, 7), 100, 8) == new);
        nvme_emu::remove_ram_disk(&disk).unwrap();
    }
}

#[test]
fn flush_of_an_unknown_namespace_fails_and_keeps_the_cache() {
    let disk = fresh("power-flush-bad");
    let mut h = Harness::start(cached(&disk, 64 << 20, 7));
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    write(&h, &mut q, &io, 0, &pattern(4 * BLOCK, 3), false);
    assert_eq!(flush(&h, &mut q, 3), generic(gsc::INVALID_NAMESPACE_OR_FORMAT));
    // Flushing namespace 2 leaves namespace 1's blocks in the cache.
    assert_eq!(flush(&h, &mut q, 2), Status::SUCCESS);
    let r = h.emu.power_fail();
    assert_eq!(r.kept_blocks + r.lost_blocks, 4);
    nvme_emu::remove_ram_disk(&disk).unwrap();
}

#[test]
fn a_fua_write_keeps_its_blocks_and_only_those() {
    let disk = fresh("power-fua");
    let mut h = Harness::start(cached(&disk, 64 << 20, 11));
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    let a = pattern(4 * BLOCK, 4);
    let b = pattern(4 * BLOCK, 5);
    write(&h, &mut q, &io, 0, &a, false); // cached
    write(&h, &mut q, &io, 2, &b, true); // FUA over blocks 2..6
    let r = h.emu.power_fail();
    assert_eq!(r.kept_blocks + r.lost_blocks, 2, "only blocks 0 and 1 were left non-durable: {r:?}");
    let got = reopen_and_read(cached(&disk, 64 << 20, 11), 2, 4);
    assert!(got == b, "the FUA write survives whole");
    nvme_emu::remove_ram_disk(&disk).unwrap();
}

#[test]
fn beyond_its_capacity_the_cache_destages_the_oldest_blocks() {
    let disk = fresh("power-destage");
    // Room for 8 blocks of 4 KiB.
    let mut h = Harness::start(cached(&disk, 8 * BLOCK as u64, 5));
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    let new = pattern(32 * BLOCK, 6);
    for i in 0..32 {
        write(&h, &mut q, &io, i, &new[i as usize * BLOCK..(i as usize + 1) * BLOCK], false);
    }
    // Rewriting a block still in the cache does not make it younger.
    write(&h, &mut q, &io, 24, &new[24 * BLOCK..25 * BLOCK], false);
    let r = h.emu.power_fail();
    assert_eq!(r.kept_blocks + r.lost_blocks, 8, "{r:?}");
    let got = reopen_and_read(cached(&disk, 8 * BLOCK as u64, 5), 0, 32);
    assert!(got[..24 * BLOCK] == new[..24 * BLOCK], "the 24 oldest were destaged: durable");
    let zero = vec![0u8; 32 * BLOCK];
    let tail = classify(&got[24 * BLOCK..], &zero[24 * BLOCK..], &new[24 * BLOCK..]);
    assert!(tail.iter().all(Option::is_some));
    assert_eq!(tail.iter().filter(|b| **b == Some(true)).count() as u64, r.kept_blocks);
    nvme_emu::remove_ram_disk(&disk).unwrap();
}

#[test]
fn a_file_reopened_after_a_power_failure_holds_exactly_the_surviving_blocks() {
    let path = std::env::temp_dir().join(format!("nvme-emu-power-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let config = |seed| {
        let mut c = cached("file", 64 << 20, seed);
        c.backing = BackingSpec::File(path.clone());
        c
    };
    let old = pattern(16 * BLOCK, 8);
    let new = pattern(16 * BLOCK, 9);
    let mut h = Harness::start(config(2));
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    write(&h, &mut q, &io, 8, &old, false);
    assert_eq!(flush(&h, &mut q, 1), Status::SUCCESS, "Flush syncs the file");
    write(&h, &mut q, &io, 8, &new, false);
    let r = h.emu.power_fail();
    assert_eq!(r.kept_blocks + r.lost_blocks, 16);
    // The old emulator (and its DMA buffers) still live: the file is free.
    let got = reopen_and_read(config(2), 8, 16);
    let blocks = classify(&got, &old, &new);
    assert!(blocks.iter().all(Option::is_some));
    assert_eq!(blocks.iter().filter(|b| **b == Some(true)).count() as u64, r.kept_blocks);
    // The file itself, read without any emulator.
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes[8 * BLOCK..24 * BLOCK] == got[..]);
    drop((q, io, h));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_ram_disk_outlives_its_emulator_and_has_one_holder_at_a_time() {
    let disk = fresh("power-ram-disk");
    let data = pattern(3 * BLOCK, 10);
    let a = Emulator::start(cached(&disk, 0, 1)).unwrap();
    assert!(
        matches!(Emulator::start(cached(&disk, 0, 1)), Err(EmuError::RamDiskInUse { name }) if name == disk)
    );
    assert!(matches!(nvme_emu::remove_ram_disk(&disk), Err(EmuError::RamDiskInUse { .. })));
    a.write_media(1, 5 * BLOCK as u64, &data).unwrap();
    drop(a);
    // Another layout is refused, not reinterpreted.
    let mut other = cached(&disk, 0, 1);
    other.namespaces.pop();
    assert!(matches!(Emulator::start(other), Err(EmuError::RamDiskLayout { .. })));
    // Without a write cache too: the RAM disk is independent of the cache.
    let mut plain = cached(&disk, 0, 1);
    plain.write_cache = None;
    assert!(reopen_and_read(plain, 5, 3) == data);
    assert!(nvme_emu::remove_ram_disk(&disk).unwrap());
    assert!(reopen_and_read(cached(&disk, 0, 1), 5, 3).iter().all(|&b| b == 0), "removed: a new disk");
    nvme_emu::remove_ram_disk(&disk).unwrap();
}

#[test]
fn identify_reports_vwc_and_features_report_and_set_wce() {
    let disk = fresh("power-vwc");
    let mut h = Harness::start(cached(&disk, 64 << 20, 1));
    let buf = DmaBuffer::new(&h.dev, 4096).unwrap();
    assert!(h.admin(identify(1, 0, buf.device_addr(0).unwrap())).status().is_success());
    let mut bytes = vec![0u8; 4096];
    buf.read_bytes(0, &mut bytes).unwrap();
    let id = IdentifyController::parse(&bytes).unwrap();
    assert_eq!(id.vwc() & 1, 1, "VWC bit 0: a volatile write cache is present");
    assert_eq!(bytes[525] >> 1 & 3, 0b11, "VWC bits 2:1: Flush takes NSID FFFFFFFFh");
    assert_eq!(id.awupf.get(), 0, "AWUPF 0: one logical block is atomic");
    let get = |sel: u32| {
        let mut s = Sqe::new(0x0A, 0);
        s.cdw10 = 0x06 | sel << 8;
        s
    };
    assert_eq!(h.admin(get(0)).dw0, 1, "WCE = 1");
    assert_eq!(h.admin(get(3)).dw0, 1 << 2, "changeable");
    let mut set = Sqe::new(0x09, 0);
    set.cdw10 = 0x06;
    set.cdw11 = 0;
    // Write-through from here: a write is durable at completion.
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    write(&h, &mut q, &io, 0, &pattern(2 * BLOCK, 1), false); // cached
    assert!(h.admin(set).status().is_success());
    assert_eq!(h.admin(get(0)).dw0, 0, "WCE = 0");
    write(&h, &mut q, &io, 10, &pattern(2 * BLOCK, 2), false);
    assert_eq!(h.emu.power_fail(), PowerFailReport::default(), "disabling flushed; then write-through");
    nvme_emu::remove_ram_disk(&disk).unwrap();

    // Without a write cache: VWC = 0, WCE reads 0, Set is refused.
    let mut h = Harness::start(config("power-no-vwc"));
    let buf = DmaBuffer::new(&h.dev, 4096).unwrap();
    assert!(h.admin(identify(1, 0, buf.device_addr(0).unwrap())).status().is_success());
    buf.read_bytes(0, &mut bytes).unwrap();
    assert_eq!(IdentifyController::parse(&bytes).unwrap().vwc(), 0);
    assert_eq!(h.admin(get(0)).dw0, 0);
    assert_eq!(h.admin(set).status(), generic(gsc::INVALID_FIELD));
}

#[test]
fn a_power_fail_rule_cuts_the_power_on_the_kth_write_before_its_completion() {
    let disk = fresh("power-rule");
    let mut cfg = cached(&disk, 64 << 20, 3);
    cfg.faults.push(FaultRule {
        matches: FaultMatch { opcode: Some(0x01), io_only: true, ..Default::default() },
        action: FaultAction::PowerFail,
        times: Some(1),
        skip: 2,
    });
    let mut h = Harness::start(cfg);
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    let old = pattern(8 * BLOCK, 20);
    let new = pattern(8 * BLOCK, 21);
    h.emu.write_media(1, 64 * BLOCK as u64, &old).unwrap();
    write(&h, &mut q, &io, 0, &new[..BLOCK], false); // 1st write: passes
    write(&h, &mut q, &io, 1, &new[..BLOCK], false); // 2nd write: passes
    assert!(h.emu.power_fail_report().is_none());
    // The 3rd write: executed into the cache, then the power fails.
    io.data.write_bytes(0, &new).unwrap();
    q.push(io.sqe(0x01, 64, 8, false));
    h.ring_sq(1, q.sq_tail);
    let r = wait_for(|| h.emu.power_fail_report()).expect("the power failed");
    assert_eq!(r.kept_blocks + r.lost_blocks, 10, "blocks 0, 1 and 64..72 were non-durable: {r:?}");
    std::thread::sleep(Duration::from_millis(20));
    assert!(q.peek().is_none(), "no CQE for the write the power failed on");
    assert_eq!(h.dev.bar0().read32(offset::CSTS).unwrap(), u32::MAX, "gone: registers read all ones");
    assert_eq!(h.emu.stats().faults_injected, 1);
    assert_eq!(h.emu.power_fail(), r, "the first power failure's report");
    let got = reopen_and_read(cached(&disk, 64 << 20, 3), 64, 8);
    let blocks = classify(&got, &old, &new);
    assert!(blocks.iter().all(Option::is_some), "torn only at block boundaries");
    nvme_emu::remove_ram_disk(&disk).unwrap();
}

#[test]
fn nothing_panics_on_commands_after_the_power_failure() {
    let disk = fresh("power-after");
    let mut h = Harness::start(cached(&disk, 64 << 20, 9));
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    write(&h, &mut q, &io, 0, &pattern(4 * BLOCK, 1), false);
    let r = h.emu.power_fail();
    assert_eq!(r.kept_blocks + r.lost_blocks, 4);
    // A driver that does not notice: more commands, doorbells, a reset.
    for i in 0..8 {
        q.push(io.sqe(if i % 2 == 0 { 0x01 } else { 0x02 }, i, 4, false));
    }
    h.ring_sq(1, q.sq_tail);
    h.admin.push(Sqe::new(0x00, 0xFFFF_FFFF));
    h.ring_sq(0, h.admin.sq_tail);
    h.write_cc(cc_enable().with_en(false));
    h.write_cc(cc_enable());
    std::thread::sleep(Duration::from_millis(30));
    assert!(q.peek().is_none() && h.admin.peek().is_none(), "no completion after the power failure");
    assert!(h.emu.is_running(), "the controller thread did not panic");
    assert_eq!(csts(&*h.dev).0, u32::MAX);
    assert!(matches!(h.emu.read_media(1, 0, &mut [0u8; 16]), Err(MediaAccessError::PoweredOff)));
    assert!(matches!(h.emu.write_media(1, 0, &[1u8; 16]), Err(MediaAccessError::PoweredOff)));
    assert_eq!(h.emu.power_fail(), r);
    drop((q, io, h));
    nvme_emu::remove_ram_disk(&disk).unwrap();
}

#[test]
fn direct_media_access_sees_the_media_under_the_cache_and_checks_ranges() {
    let disk = fresh("power-direct");
    let mut h = Harness::start(cached(&disk, 64 << 20, 4));
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    let old = pattern(2 * BLOCK, 30);
    let new = pattern(2 * BLOCK, 31);
    h.emu.write_media(1, 0, &old).unwrap();
    write(&h, &mut q, &io, 0, &new, false);
    // The media still holds the durable contents; reads see the cache.
    let mut m = vec![0u8; 2 * BLOCK];
    h.emu.read_media(1, 0, &mut m).unwrap();
    assert!(m == old);
    assert!(read(&h, &mut q, &io, 0, 2) == new);
    // Corrupt 16 bytes across the two blocks, unaligned: on the media only.
    h.emu.write_media(1, BLOCK as u64 - 8, &[0xEE; 16]).unwrap();
    h.emu.read_media(1, 0, &mut m).unwrap();
    assert!(m[BLOCK - 8..BLOCK + 8].iter().all(|&b| b == 0xEE));
    assert!(read(&h, &mut q, &io, 0, 2) == new, "the cached blocks hide it");
    // Once flushed, the cached contents are the media's.
    assert_eq!(flush(&h, &mut q, 1), Status::SUCCESS);
    h.emu.read_media(1, 0, &mut m).unwrap();
    assert!(m == new);
    // Namespace 2 (512-byte blocks) and the range checks.
    h.emu.write_media(2, 64 * 512 - 3, &[1, 2, 3]).unwrap();
    let end = BLOCKS * BLOCK as u64;
    assert!(matches!(
        h.emu.read_media(1, end - 1, &mut [0u8; 2]),
        Err(MediaAccessError::OutOfRange { nsid: 1, offset, len: 2, size }) if offset == end - 1 && size == end
    ));
    assert!(matches!(h.emu.write_media(2, u64::MAX, &[0]), Err(MediaAccessError::OutOfRange { .. })));
    assert!(matches!(h.emu.read_media(3, 0, &mut [0]), Err(MediaAccessError::NoNamespace { nsid: 3, .. })));
    assert!(matches!(h.emu.read_media(0, 0, &mut [0]), Err(MediaAccessError::NoNamespace { .. })));
    h.emu.read_media(1, end, &mut []).unwrap();
    drop((q, io, h));
    nvme_emu::remove_ram_disk(&disk).unwrap();

    let mut null = config("power-direct-null");
    null.backing = BackingSpec::Null;
    let emu = Emulator::start(null).unwrap();
    assert!(matches!(emu.write_media(1, 0, &[0]), Err(MediaAccessError::NullBacking)));
}

#[test]
fn write_zeroes_is_durable_at_completion_and_shutdown_flushes() {
    let disk = fresh("power-zeroes");
    let mut h = Harness::start(cached(&disk, 64 << 20, 6));
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    write(&h, &mut q, &io, 0, &pattern(8 * BLOCK, 40), false);
    assert!(h.submit_on(&mut q, rw(0x08, 1, 0, 4, 0, 0)).status().is_success());
    write(&h, &mut q, &io, 100, &pattern(2 * BLOCK, 41), false);
    // Blocks 4..8 and 100..102 are left in the cache; a normal shutdown
    // notification (CC.SHN = 01b) makes them durable.
    h.write_cc(cc_enable().with_shn(nvme_regs::ShutdownNotification::Normal));
    assert!(h.wait_csts(|c| c.shst() == nvme_regs::ShutdownStatus::Complete).is_some());
    assert_eq!(h.emu.power_fail(), PowerFailReport::default());
    let got = reopen_and_read(cached(&disk, 64 << 20, 6), 0, 8);
    assert!(
        got[..4 * BLOCK].iter().all(|&b| b == 0) && got[4 * BLOCK..] == pattern(8 * BLOCK, 40)[4 * BLOCK..]
    );
    drop((q, io, h));
    nvme_emu::remove_ram_disk(&disk).unwrap();
}

#[test]
fn without_a_write_cache_flush_is_a_no_op_and_nothing_is_lost() {
    let disk = fresh("power-no-cache");
    let mut cfg = cached(&disk, 0, 0);
    cfg.write_cache = None;
    let mut h = Harness::start(cfg.clone());
    let mut q = h.create_io(1, 16);
    let io = Io::new(&h.dev);
    let data = pattern(4 * BLOCK, 50);
    write(&h, &mut q, &io, 0, &data, false);
    assert_eq!(flush(&h, &mut q, 1), Status::SUCCESS);
    assert_eq!(h.emu.power_fail(), PowerFailReport::default());
    assert!(reopen_and_read(cfg, 0, 4) == data);
    drop((q, io, h));
    nvme_emu::remove_ram_disk(&disk).unwrap();
}
