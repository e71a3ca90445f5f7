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

/// A controller whose CSTS.RDY follows CC.EN (or stays 1 once set, when
/// `stuck`) and that never answers an admin command, on a virtual clock;
/// it counts its live DMA mappings and keeps what `keep_dma` hands it.
#[derive(Debug)]
struct SilentDevice {
    page: Box<[std::sync::atomic::AtomicU32]>,
    mmio: crate::Mmio,
    next_iova: std::sync::atomic::AtomicU64,
    mapped: std::sync::atomic::AtomicUsize,
    kept: std::sync::Mutex<Vec<crate::KeptDma>>,
    stuck: bool,
    clock: Arc<crate::VirtualClock>,
}

impl SilentDevice {
    fn start(stuck: bool) -> Arc<Self> {
        use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize};
        let page: Box<[AtomicU32]> = (0..0x2000 / 4).map(|_| AtomicU32::new(0)).collect();
        let c = cap(1);
        page[0].store(c.lo(), std::sync::atomic::Ordering::Relaxed);
        page[1].store(c.hi(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the boxed page lives as long as the device (its heap
        // memory does not move) and is only accessed atomically.
        let mmio = unsafe { crate::Mmio::new(page.as_ptr() as *mut u8, 0x2000) }.expect("aligned");
        let dev = Arc::new(Self {
            page,
            mmio,
            next_iova: AtomicU64::new(0x1_0000_0000),
            mapped: AtomicUsize::new(0),
            kept: std::sync::Mutex::new(Vec::new()),
            stuck,
            clock: crate::VirtualClock::new(),
        });
        let weak = Arc::downgrade(&dev);
        dev.clock.add_ticker(Arc::new(move |_| {
            let d = weak.upgrade()?;
            let (cc, csts) = (&d.page[offset::CC / 4], &d.page[offset::CSTS / 4]);
            let en = Cc(cc.load(std::sync::atomic::Ordering::Acquire)).en();
            let rdy = en || (d.stuck && csts.load(std::sync::atomic::Ordering::Acquire) & 1 == 1);
            csts.store(u32::from(rdy), std::sync::atomic::Ordering::Release);
            None
        }));
        dev
    }

    fn mapped(&self) -> usize {
        self.mapped.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl NvmeDevice for SilentDevice {
    fn name(&self) -> &str {
        "silent"
    }
    fn bar0(&self) -> &crate::Mmio {
        &self.mmio
    }
    fn clock(&self) -> &dyn crate::Clock {
        &*self.clock
    }
    unsafe fn dma_map(
        &self,
        _host: std::ptr::NonNull<u8>,
        len: usize,
    ) -> Result<crate::DmaMapping, crate::DeviceError> {
        use std::sync::atomic::Ordering;
        self.mapped.fetch_add(1, Ordering::SeqCst);
        let iova = self.next_iova.fetch_add((len as u64).next_multiple_of(4096) + 4096, Ordering::Relaxed);
        Ok(crate::DmaMapping::contiguous(iova, len))
    }
    fn dma_unmap(&self, _m: &crate::DmaMapping) -> Result<(), crate::DeviceError> {
        self.mapped.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
    fn keep_dma(&self, kept: crate::KeptDma) {
        self.kept.lock().unwrap().push(kept);
    }
}

fn silent_bring_up(dev: &Arc<SilentDevice>) -> ControllerError {
    let opts = ControllerOptions { admin_timeout: Duration::from_millis(1), ..Default::default() };
    let nvme: Arc<dyn NvmeDevice> = dev.clone();
    Controller::init(nvme, opts).unwrap_err()
}

#[test]
fn failed_bring_ups_give_back_the_pages_of_timed_out_commands() {
    // Identify Controller times out each time; the drop disables the
    // controller, sees CSTS.RDY = 0, and so may free the page the command
    // could have written: nothing stays mapped, nothing is kept.
    let dev = SilentDevice::start(false);
    for _ in 0..50 {
        let e = silent_bring_up(&dev);
        assert!(matches!(e, ControllerError::Timeout { what: "Identify Controller", .. }), "{e}");
    }
    assert_eq!(dev.mapped(), 0, "DMA mappings left after 50 failed bring-ups");
    assert!(dev.kept.lock().unwrap().is_empty());
    assert_eq!(Arc::strong_count(&dev), 1, "a buffer still holds the device");
}

#[test]
fn pages_of_a_controller_never_seen_stopped_go_to_the_device() {
    // RDY stays 1 after CC.EN = 0: the page must stay mapped, and goes to
    // `keep_dma` (one per failed bring-up), which the device can free once
    // it knows it no longer does DMA.
    let dev = SilentDevice::start(true);
    for _ in 0..3 {
        silent_bring_up(&dev);
        // Bring-up starts by disabling it: un-stick it for the next try.
        dev.page[offset::CSTS / 4].store(0, std::sync::atomic::Ordering::SeqCst);
    }
    assert_eq!(dev.kept.lock().unwrap().iter().map(crate::KeptDma::len).sum::<usize>(), 3);
    assert_eq!(dev.mapped(), 3, "only the kept pages stay mapped");
    let kept = std::mem::take(&mut *dev.kept.lock().unwrap());
    drop(kept);
    assert_eq!(dev.mapped(), 0);
    assert_eq!(Arc::strong_count(&dev), 1);
}
