use super::*;
use crate::test_device::DeadDevice;
use nvme_regs::registers::offset;
use nvme_regs::{Aqa, Cap, Cc};
use std::time::{Duration, Instant};

fn cap(to_500ms: u8) -> Cap {
    Cap(0).with_mqes_z(63).with_css_nvm(true).with_to_500ms(to_500ms)
}

#[test]
fn csts_cfs_ends_the_enable_wait_at_once() {
    // CAP.TO = 60 s; CFS must not wait for it.
    let dev = DeadDevice::start(cap(120), 0b10);
    let t = Instant::now();
    let e = Controller::init(dev, ControllerOptions::default()).unwrap_err();
    assert!(matches!(e, ControllerError::Fatal { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn ready_that_never_comes_times_out_at_cap_to() {
    // CAP.TO = 1 (500 ms): RDY stays 0 after CC.EN = 1.
    let dev = DeadDevice::start(cap(1), 0);
    let t = Instant::now();
    let e = Controller::init(dev, ControllerOptions::default()).unwrap_err();
    assert!(matches!(e, ControllerError::Timeout { what: "CSTS.RDY = 1 after CC.EN = 1", .. }), "{e}");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(500) && waited < Duration::from_secs(5), "{waited:?}");
}

#[test]
fn cap_to_zero_gets_the_documented_floor() {
    let dev = DeadDevice::start(cap(0), 0);
    let t = Instant::now();
    assert!(matches!(
        Controller::init(dev, ControllerOptions::default()),
        Err(ControllerError::Timeout { .. })
    ));
    assert!(t.elapsed() >= MIN_READY_TIMEOUT);
}

#[test]
fn all_ones_registers_mean_the_device_is_gone() {
    let dev = DeadDevice::start(Cap(u64::MAX), u32::MAX);
    assert!(matches!(
        Controller::init(dev, ControllerOptions::default()),
        Err(ControllerError::DeviceGone { register: "CAP" })
    ));
    // CAP fine, CSTS all ones (surprise removal during bring-up).
    let dev = DeadDevice::start(cap(1), u32::MAX);
    assert!(matches!(
        Controller::init(dev, ControllerOptions::default()),
        Err(ControllerError::DeviceGone { register: "CSTS" })
    ));
}

#[test]
fn aqa_asq_acq_are_programmed_before_enable() {
    let dev = DeadDevice::start(cap(1), 0);
    let _ = Controller::init(dev.clone(), ControllerOptions { admin_entries: 16, ..Default::default() });
    let bar = dev.bar0();
    let aqa = Aqa(bar.read32(offset::AQA).unwrap());
    assert_eq!((aqa.asqs_z(), aqa.acqs_z()), (15, 15));
    let (asq, acq) = (bar.read64(offset::ASQ).unwrap(), bar.read64(offset::ACQ).unwrap());
    assert!(asq >= 0x1_0000_0000 && asq % 4096 == 0 && acq % 4096 == 0 && asq != acq);
    let cc = Cc(bar.read32(offset::CC).unwrap());
    assert!(cc.en());
    assert_eq!((cc.iosqes(), cc.iocqes(), cc.mps(), cc.css()), (6, 4, 0, 0));
}
