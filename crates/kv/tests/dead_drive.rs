//! A store whose drive lost power: what its calls report, what they leave
//! in memory, and that a batch dropped on the dead drive does not hold up
//! the runtime's shutdown.

mod common;

use std::time::Duration;

use common::{fill, key, runtime, yaml_sized, Buf, T};
use nvme_emu::{FaultAction, FaultMatch, FaultRule};
use tutti_kv::{ItemStatus, KvError, KvStore, OpenOptions, Put, Value};

/// One RAM drive of 9 slots of 16 KiB: a store of 8 objects.
fn small_store(disk: &str) -> (std::sync::Arc<tutti::Runtime>, KvStore) {
    let _ = nvme_emu::remove_ram_disk(disk);
    let rt = runtime(&yaml_sized(1, "144KiB", "16KiB", &|_| format!("{{ ram_disk: {disk} }}")));
    let kv = KvStore::open(rt.clone(), &OpenOptions::new("kv")).unwrap();
    assert_eq!(kv.stats().capacity, 8);
    (rt, kv)
}

fn put1(kv: &KvStore, buf: &mut Buf<'_>, k: u64) -> ItemStatus {
    fill(&mut buf.bytes[..4096], k, 1);
    let v = Value { memory: buf.mem(), offset: 0, len: 4096 };
    kv.put_sync(&[Put { key: key(k), value: v }], T).unwrap().remove(0)
}

#[test]
fn a_put_that_must_evict_on_a_dead_drive_reports_the_device_error_and_evicts_only_once() {
    let (rt, kv) = small_store("dead-drive-evict");
    let mut buf = Buf::new(&kv, 4096);
    for k in 0..8 {
        assert_eq!(put1(&kv, &mut buf, k), ItemStatus::Ok);
    }
    rt.emulator("d0").unwrap().power_fail();
    // The store is full: the put evicts the least recently used object,
    // and the round that would clear its record fails on the dead drive.
    let st = put1(&kv, &mut buf, 100);
    assert!(matches!(&st, ItemStatus::Device { drive: Some(d), .. } if d == "d0"), "{st:?}");
    let s = kv.stats();
    assert_eq!((s.evictions, s.objects), (1, 7), "{s:?}");
    // Later puts retry the clearing round first; they evict nothing more.
    for k in 101..106 {
        let st = put1(&kv, &mut buf, k);
        assert!(matches!(st, ItemStatus::Device { .. }), "put {k}: {st:?}");
    }
    let s = kv.stats();
    assert_eq!((s.evictions, s.objects), (1, 7), "{s:?}");
    assert_eq!(s.device_errors, 6, "{s:?}");
    assert_eq!(kv.contains(&[key(0), key(1), key(7)]), [false, true, true]);
    drop(buf);
    drop(kv);
    drop(rt);
    nvme_emu::remove_ram_disk("dead-drive-evict").unwrap();
}

#[test]
fn a_put_dropped_while_its_write_is_stuck_on_a_dead_drive_does_not_hold_up_shutdown() {
    let (rt, kv) = small_store("dead-drive-drop");
    // Declared before the store's runtime goes: the memory stays pinned
    // to the dead drive, so it must outlive the runtime.
    let mut bytes = vec![0u8; 4096];
    // SAFETY: `bytes` outlives the runtime (dropped after it below) and is
    // not touched while the put runs.
    #[allow(unsafe_code)]
    let mem = unsafe { kv.register_host(bytes.as_mut_ptr(), bytes.len()).unwrap() };
    let emu = rt.emulator("d0").unwrap().clone();
    // Payload writes complete an hour late.
    emu.add_fault(FaultRule {
        matches: FaultMatch { opcode: Some(0x01), io_only: true, ..Default::default() },
        action: FaultAction::Delay(Duration::from_secs(3600)),
        times: None,
        skip: 0,
    });
    let pending =
        kv.put(&[Put { key: key(1), value: Value { memory: &mem, offset: 0, len: 4096 } }]).unwrap();
    for _ in 0..10_000 {
        if emu.stats().faults_injected > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(emu.stats().faults_injected, 1, "the payload write was fetched");
    emu.power_fail();
    drop(pending);
    assert_eq!(kv.stats().orphaned_batches, 1, "the dropped put waits for its write");
    match kv.unregister(mem) {
        Err(KvError::MemoryInUse) => {}
        other => panic!("memory of a dropped put in flight: {other:?}"),
    }
    drop(kv);
    let rt = std::sync::Arc::into_inner(rt).expect("the store let go of the runtime");
    // Before the drain read the controllers' status, it waited out all of
    // its bound (a second when the runtime is dropped) and reported the
    // write still in flight.
    let r = rt.shutdown(Duration::from_secs(60));
    assert_eq!((r.ops_in_flight, r.commands_in_flight), (0, 0), "{r:?}");
    drop(rt);
    drop(bytes);
    nvme_emu::remove_ram_disk("dead-drive-drop").unwrap();
}

#[test]
fn memory_a_failed_drive_still_pins_is_refused_with_memory_busy() {
    let (rt, kv) = small_store("dead-drive-unregister");
    let mut bytes = vec![0u8; 4096];
    // SAFETY: `bytes` outlives the runtime (the unregister below fails, so
    // it must) and is not touched while the put runs.
    #[allow(unsafe_code)]
    let mem = unsafe { kv.register_host(bytes.as_mut_ptr(), bytes.len()).unwrap() };
    rt.emulator("d0").unwrap().power_fail();
    let st = kv.put_sync(&[Put { key: key(1), value: Value { memory: &mem, offset: 0, len: 4096 } }], T);
    assert!(matches!(&st.unwrap()[0], ItemStatus::Device { .. }));
    // The failed drive may still have written the memory: the runtime keeps
    // it mapped until the drive is reset, so it must outlive the runtime.
    match kv.unregister(mem) {
        Err(KvError::Runtime(tutti::Error::MemoryBusy { .. })) => {}
        other => panic!("memory a dead drive pins: {other:?}"),
    }
    drop(kv);
    drop(rt);
    drop(bytes);
    nvme_emu::remove_ram_disk("dead-drive-unregister").unwrap();
}
