//! A drive that loses power (`Emulator::power_fail`, or a `power_fail`
//! fault rule in the YAML): waits on its operations end promptly as a
//! device failure, shutdown completes, and a new runtime on the same
//! `ram_disk` backing sees exactly the durable data: each 4 KiB block
//! written without a flush reads back whole, old or new (never a mix), and
//! data written through `Emulator::write_media` before the failure is all
//! there.

use std::time::{Duration, Instant};

use tutti::{Config, MemoryHandle, Request, RequestStatus, Runtime};

const MIB: usize = 1 << 20;
const BLOCK: usize = 4096;

/// Drive d0 (16 MiB of 4 KiB blocks) on RAM disk `disk` with a write
/// cache, `faults` (a YAML list) and one queue; a slab store `kv` of 1 MiB
/// slots on it.
fn config(disk: &str, faults: &str) -> Config {
    let yaml = format!(
        "drives:
  d0:
    emulated:
      namespaces: [{{ capacity: 16MiB, block_size: 4096 }}]
      backing: {{ ram_disk: {disk} }}
      write_cache: {{ capacity: 64MiB, seed: 5 }}
      faults: {faults}
resolvers: {{ slots: {{ slab: {{ slot_size: 1MiB }} }} }}
datapaths: {{ local: {{ local_nvme: {{ drive: d0, queues: 1 }} }} }}
stores: {{ kv: {{ resolver: slots, datapath: local }} }}
"
    );
    Config::from_yaml_str(&yaml).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect()
}

fn memory(rt: &Runtime, buf: &mut [u8]) -> MemoryHandle {
    // SAFETY: `buf` outlives the runtime in each test and is untouched
    // while I/O runs.
    #[allow(unsafe_code)]
    unsafe {
        rt.register_memory(buf.as_mut_ptr(), buf.len()).unwrap()
    }
}

/// Writes `data` to slot `slot` from offset 0 of `m` (which holds it).
fn write_slot(rt: &Runtime, m: MemoryHandle, slot: u32) -> Vec<RequestStatus> {
    let t = rt.open(&format!("tutti://kv/{slot}")).unwrap();
    rt.wait(rt.submit(&[Request::write(t, 0, MIB as u64, m, 0)]).op().unwrap(), Duration::from_secs(10))
        .unwrap()
}

/// Reads slot `slot` of a new runtime on `config` into a vector.
fn read_slots(config: Config, slots: &[u32]) -> Vec<Vec<u8>> {
    let rt = Runtime::from_config(config).unwrap();
    let mut buf = vec![0u8; MIB];
    let m = memory(&rt, &mut buf);
    let mut out = Vec::new();
    for &slot in slots {
        let t = rt.open(&format!("tutti://kv/{slot}")).unwrap();
        let op = rt.submit(&[Request::read(t, 0, MIB as u64, m, 0)]).op().unwrap();
        assert_eq!(rt.wait(op, Duration::from_secs(10)).unwrap(), [RequestStatus::Success]);
        out.push(buf.clone());
    }
    rt.unregister_memory(m).unwrap();
    let r = rt.shutdown(Duration::from_secs(5));
    assert!(r.drives.iter().all(|(_, d)| d.is_ok()), "{r:?}");
    out
}

/// (blocks equal to `new`, blocks equal to `old`); panics on a block that
/// is neither (torn inside a logical block).
fn old_or_new(got: &[u8], old: &[u8], new: &[u8]) -> (u64, u64) {
    let (mut n, mut o) = (0, 0);
    for (i, g) in got.chunks(BLOCK).enumerate() {
        let r = i * BLOCK..(i + 1) * BLOCK;
        if g == &new[r.clone()] {
            n += 1;
        } else if g == &old[r] {
            o += 1;
        } else {
            panic!("block {i} mixes old and new contents");
        }
    }
    (n, o)
}

/// A wait on an operation of the powered-off drive: a device failure
/// naming d0, well before its 30 s deadline.
fn fails_promptly(rt: &Runtime, op: tutti::OpHandle) {
    let t0 = Instant::now();
    let st = rt.wait(op, Duration::from_secs(30)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "noticed after {:?}", t0.elapsed());
    match &st[0] {
        RequestStatus::ControllerFatal { drive } => assert_eq!(drive, "d0"),
        RequestStatus::SubmitFailed { reason } => assert!(reason.to_string().contains("\"d0\""), "{reason}"),
        other => panic!("not a device failure: {other:?}"),
    }
}

#[test]
fn after_power_fail_waits_fail_promptly_and_a_new_runtime_sees_the_durable_data() {
    let disk = "runtime-power-fail";
    let _ = nvme_emu::remove_ram_disk(disk);
    // Reads of slot 1 (LBA 256) would complete 30 s late: one stays in
    // flight across the power failure.
    let cfg = config(disk, "[{ lba: [256, 257], op: read, action: { delay_us: 30000000 } }]");
    let rt = Runtime::from_config(cfg.clone()).unwrap();
    let emu = rt.emulator("d0").unwrap().clone();
    let (old, new, kept_safe) = (pattern(MIB, 1), pattern(MIB, 2), pattern(MIB, 3));
    emu.write_media(1, 0, &old).unwrap(); // slot 0, durable
    emu.write_media(1, 2 * MIB as u64, &kept_safe).unwrap(); // slot 2, durable
    let mut buf = new.clone();
    buf.resize(2 * MIB, 0);
    let m = memory(&rt, &mut buf);
    // Slot 0 rewritten: complete, but only in the drive's write cache.
    assert_eq!(write_slot(&rt, m, 0), [RequestStatus::Success]);
    let t1 = rt.open("tutti://kv/1").unwrap();
    let in_flight = rt.submit(&[Request::read(t1, 0, 4096, m, MIB as u64)]).op().unwrap();
    std::thread::sleep(Duration::from_millis(50));

    let report = emu.power_fail();
    assert_eq!(report.kept_blocks + report.lost_blocks, 256, "slot 0's blocks were in the cache: {report:?}");
    fails_promptly(&rt, in_flight);
    let t3 = rt.open("tutti://kv/3").unwrap();
    fails_promptly(&rt, rt.submit(&[Request::write(t3, 0, 4096, m, 0)]).op().unwrap());
    let t0 = Instant::now();
    let r = rt.shutdown(Duration::from_secs(1));
    assert!(t0.elapsed() < Duration::from_secs(3), "shutdown took {:?}", t0.elapsed());
    assert!(r.drives[0].1.as_ref().is_err_and(|e| e.contains("no CC.SHN")), "{r:?}");

    // The power failure released the RAM disk: a new runtime attaches it
    // while the old one (and its pinned memory) still exists.
    let got = read_slots(cfg, &[0, 2]);
    let (n, o) = old_or_new(&got[0], &old, &new);
    assert_eq!((n, o), (report.kept_blocks, report.lost_blocks), "exactly the kept blocks are new");
    assert!(got[1] == kept_safe, "write_media data survives whole");
    drop((rt, emu));
    drop(buf);
    nvme_emu::remove_ram_disk(disk).unwrap();
}

#[test]
fn a_power_fail_rule_on_the_kth_write_fails_its_request_and_keeps_only_durable_data() {
    let disk = "runtime-power-rule";
    let _ = nvme_emu::remove_ram_disk(disk);
    // A 1 MiB write is 8 commands of 128 KiB (MDTS 5): the 9th write
    // command, the first of the second request, cuts the power.
    let cfg = config(disk, "[{ op: write, action: power_fail, skip: 8 }]");
    let rt = Runtime::from_config(cfg.clone()).unwrap();
    let old = pattern(MIB, 7);
    rt.emulator("d0").unwrap().write_media(1, 0, &old).unwrap();
    let mut buf = pattern(MIB, 8);
    let m = memory(&rt, &mut buf);
    assert_eq!(write_slot(&rt, m, 0), [RequestStatus::Success]);
    let t0 = Instant::now();
    let st = write_slot(&rt, m, 4);
    assert!(t0.elapsed() < Duration::from_secs(2), "noticed after {:?}", t0.elapsed());
    assert_eq!(st, [RequestStatus::ControllerFatal { drive: "d0".into() }]);
    let emu = rt.emulator("d0").unwrap();
    let report = emu.power_fail_report().expect("the rule cut the power");
    assert_eq!(emu.stats().faults_injected, 1);
    assert_eq!(report.kept_blocks + report.lost_blocks, 256 + 32, "slot 0 and one command: {report:?}");
    rt.shutdown(Duration::from_secs(1));

    let got = read_slots(cfg, &[0, 4]);
    let new = pattern(MIB, 8);
    let (n0, _) = old_or_new(&got[0], &old, &new);
    let (n4, _) = old_or_new(&got[1], &vec![0u8; MIB], &new);
    assert_eq!(n0 + n4, report.kept_blocks);
    assert!(got[1][128 << 10..].iter().all(|&b| b == 0), "the failed request's later commands never ran");
    drop(rt);
    drop(buf);
    nvme_emu::remove_ram_disk(disk).unwrap();
}

#[test]
fn shutdown_fails_the_commands_of_a_powered_off_drive_instead_of_draining_until_its_bound() {
    let disk = "runtime-power-drain";
    let _ = nvme_emu::remove_ram_disk(disk);
    // Writes complete an hour late: the one below is in flight when the
    // power fails, and nobody waits on it.
    let cfg = config(disk, "[{ op: write, action: { delay_us: 3600000000 } }]");
    let rt = Runtime::from_config(cfg).unwrap();
    let mut buf = pattern(MIB, 4);
    let m = memory(&rt, &mut buf);
    let t = rt.open("tutti://kv/0").unwrap();
    let _unwaited = rt.submit(&[Request::write(t, 0, 4096, m, 0)]).op().unwrap();
    for _ in 0..10_000 {
        if rt.emulator("d0").unwrap().stats().faults_injected > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(rt.emulator("d0").unwrap().stats().faults_injected, 1, "the write was fetched");
    rt.emulator("d0").unwrap().power_fail();
    // Before the drain read the controllers' status, it waited out all of
    // its bound and reported the write still in flight.
    let r = rt.shutdown(Duration::from_secs(60));
    assert_eq!((r.ops_in_flight, r.commands_in_flight), (0, 0), "{r:?}");
    assert!(r.drives[0].1.as_ref().is_err_and(|e| e.contains("no CC.SHN")), "{r:?}");
    drop(rt);
    drop(buf);
    nvme_emu::remove_ram_disk(disk).unwrap();
}

#[test]
fn a_power_fail_rule_on_a_flush_cuts_the_power_after_the_flush_and_before_its_completion() {
    let disk = "runtime-power-flush";
    let _ = nvme_emu::remove_ram_disk(disk);
    // `op: flush` in the YAML: the second Flush command cuts the power.
    let cfg = config(disk, "[{ op: flush, action: power_fail, skip: 1 }]");
    let rt = Runtime::from_config(cfg.clone()).unwrap();
    let mut buf = pattern(MIB, 9);
    let m = memory(&rt, &mut buf);
    let t = rt.open("tutti://kv/0").unwrap();
    let flush =
        |rt: &Runtime| rt.wait(rt.submit(&[Request::flush(t)]).op().unwrap(), Duration::from_secs(10));
    assert_eq!(flush(&rt).unwrap(), [RequestStatus::Success], "the first Flush passes");
    assert_eq!(write_slot(&rt, m, 0), [RequestStatus::Success], "writes are not matched");
    assert_eq!(flush(&rt).unwrap(), [RequestStatus::ControllerFatal { drive: "d0".into() }]);
    let emu = rt.emulator("d0").unwrap();
    assert_eq!(emu.stats().faults_injected, 1);
    // The rule executes its command, then cuts the power: the Flush made
    // slot 0 durable, but the host never heard of it.
    let report = emu.power_fail_report().expect("the rule cut the power");
    assert_eq!(report.kept_blocks + report.lost_blocks, 0, "nothing was left in the cache: {report:?}");
    rt.shutdown(Duration::from_secs(1));
    assert!(read_slots(cfg, &[0])[0] == pattern(MIB, 9), "slot 0 is durable");
    drop(rt);
    drop(buf);
    nvme_emu::remove_ram_disk(disk).unwrap();
}
