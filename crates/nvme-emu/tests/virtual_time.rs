//! Controller bring-up against an emulator on a virtual clock
//! (`Emulator::start_on`): the driver's register waits run on the device's
//! clock (`NvmeDevice::clock`), step the emulator, and take virtual time
//! only. The assertions are on virtual time, never on the wall clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvm_queue::{Clock, Controller, ControllerError, ControllerOptions, NvmeDevice, VirtualClock};
use nvme_emu::{BackingSpec, EmuError, Emulator, EmulatorConfig, NamespaceSpec};
use nvme_regs::registers::offset;
use nvme_regs::Csts;

fn config(name: &str, ready_delay: Duration) -> EmulatorConfig {
    let mut cfg = EmulatorConfig::new(name, vec![NamespaceSpec::new(64, 4096)]);
    cfg.ready_delay = ready_delay;
    cfg
}

#[test]
fn a_10_s_ready_delay_is_waited_out_in_virtual_time() {
    let clock = VirtualClock::new();
    // CAP.TO = 10 s (the default 20 units of 500 ms): the wait may take it
    // all, exactly.
    let emu = Emulator::start_on(config("virtual-ready", Duration::from_secs(10)), clock.clone()).unwrap();
    // A ticker registered after the emulator's runs after it on every
    // sleep: it notes the virtual time at which CSTS.RDY first reads 1.
    let ready_at = Arc::new(Mutex::new(None));
    let (seen, regs) = (ready_at.clone(), emu.clone());
    let epoch = clock.now();
    let ticker = clock.add_ticker(Arc::new(move |now| {
        let csts = Csts(regs.bar0().read32(offset::CSTS).unwrap());
        let mut seen = seen.lock().unwrap();
        if csts.rdy() && seen.is_none() {
            *seen = Some(now - epoch);
        }
        None
    }));
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let ctrl = Controller::init(dev, ControllerOptions::default()).expect("bring-up on virtual time");
    // The enable's CC write came at virtual time zero (the disable wait
    // before it found RDY = 0 without sleeping): RDY came exactly the
    // modelled delay later, and the driver saw it then.
    assert_eq!(*ready_at.lock().unwrap(), Some(Duration::from_secs(10)));
    // The rest of bring-up (Identify, Set Features) took a spin of the
    // admin wait (1 us) per command: 10 s of virtual time in all, plus
    // those.
    // (The polls in between were few: the emulator told the clock when
    // RDY was due, and the wait moved straight on to it.)
    let elapsed = clock.elapsed();
    assert!(
        elapsed >= Duration::from_secs(10) && elapsed < Duration::from_secs(10) + Duration::from_millis(1)
    );
    assert_eq!(ctrl.namespaces().len(), 1);
    assert_eq!(ctrl.namespaces()[0].blocks, 64);
    assert!(emu.is_running());
    drop(ctrl);
    clock.remove_ticker(ticker);
}

#[test]
fn a_ready_that_never_comes_times_out_at_cap_to_in_virtual_time() {
    let clock = VirtualClock::new();
    let mut cfg = config("virtual-never-ready", Duration::ZERO);
    cfg.never_ready = true;
    cfg.cap_to_500ms = 3;
    let emu = Emulator::start_on(cfg, clock.clone()).unwrap();
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let e = Controller::init(dev, ControllerOptions::default()).unwrap_err();
    assert!(
        matches!(e, ControllerError::Timeout { what: "CSTS.RDY = 1 after CC.EN = 1", waited, .. }
            if waited == Duration::from_millis(1500)),
        "{e}"
    );
    // CAP.TO = 1.5 s from virtual time zero, to the nanosecond.
    assert_eq!(clock.elapsed(), Duration::from_millis(1500));
}

#[test]
fn an_emulator_dropped_leaves_its_clock_and_releases_its_media() {
    let clock = VirtualClock::new();
    let disk = format!("virtual-time-{}", std::process::id());
    let mut cfg = config("virtual-drop", Duration::ZERO);
    cfg.backing = BackingSpec::RamDisk(disk.clone());
    let emu = Emulator::start_on(cfg.clone(), clock.clone()).unwrap();
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    drop(Controller::init(dev, ControllerOptions::default()).unwrap());
    assert!(matches!(Emulator::start_on(cfg.clone(), clock.clone()), Err(EmuError::RamDiskInUse { .. })));
    drop(emu);
    // The clock no longer holds the controller (nor its media): the disk
    // is free for the next emulator, which comes up on the same clock.
    let emu = Emulator::start_on(cfg, clock.clone()).expect("the RAM disk was released");
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    drop(Controller::init(dev, ControllerOptions::default()).unwrap());
    drop(emu);
    nvme_emu::remove_ram_disk(&disk).unwrap();
}
