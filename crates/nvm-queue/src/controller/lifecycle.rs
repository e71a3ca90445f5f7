//! Enabling, resetting and shutting the controller down, and the bounded
//! CSTS waits they share (NVMe Base 2.0, 3.5.1, 3.6, 3.7.2).

use std::time::Duration;

use nvme_regs::opcode::DeleteIoCq;
use nvme_regs::registers::offset;
use nvme_regs::{Aqa, Cc, Csts, ShutdownNotification, ShutdownStatus};

use super::{Controller, ControllerError, SHUTDOWN_TIMEOUT};
use crate::device::NvmeDevice;
use crate::queue::QueuePair;

impl Controller {
    /// Controller-level reset (NVMe Base 2.0 3.7.2): CC.EN = 0 and wait for
    /// CSTS.RDY = 0 (which also clears CSTS.CFS and deletes every queue on
    /// the controller), then the admin queue is re-programmed on the same
    /// memory, the controller re-enabled, re-identified, and the I/O queue
    /// count asked for again.
    ///
    /// Every command outstanding on any queue is gone: the owners of I/O
    /// queue pairs must call [`QueuePair::reset_after_controller_reset`]
    /// (failing what it returns) and then
    /// [`Controller::recreate_io_queue_pair`]. After the reset the
    /// controller no longer touches memory of the old commands.
    pub fn reset(&mut self) -> Result<(), ControllerError> {
        let bar = self.device.bar0();
        let cc = Cc(bar.read32(offset::CC)?);
        if Cc(u32::MAX) == cc {
            return Err(ControllerError::DeviceGone { register: "CC" });
        }
        bar.write32(offset::CC, cc.with_en(false).with_shn(ShutdownNotification::None).0)?;
        wait_csts(&*self.device, self.ready_timeout, "CSTS.RDY = 0 for reset", false, |c| !c.rdy())?;
        self.live_queues.clear();
        self.sq_deleted.clear();
        // CSTS.RDY = 0: the controller no longer touches host memory, so
        // the pages of timed-out admin commands can be freed.
        self.timed_out.clear();
        // Nothing on the admin queue can complete any more.
        let lost = self.admin.reset_after_controller_reset();
        if !lost.is_empty() {
            // The scratch page may have belonged to one of them; the reset
            // ended its DMA, so it can be reused.
            tracing::warn!(commands = lost.len(), "admin commands lost in the reset");
        }
        enable(&*self.device, &self.admin, self.page_size, self.ready_timeout)?;
        self.shut_down = false;
        self.identify()?;
        self.set_number_of_queues()
    }

    /// Orderly shutdown: deletes every remaining I/O SQ, then every
    /// remaining I/O CQ, then sets CC.SHN = 01b (normal) and waits (bounded
    /// by CAP.TO, at least [`SHUTDOWN_TIMEOUT`]) for CSTS.SHST = 10b
    /// (complete). The caller stops submitting and drains I/O first, and to
    /// match aborted commands to their requests deletes each SQ itself and
    /// reaps its CQ ([`Controller::delete_io_sq`]) before calling this.
    pub fn shutdown(&mut self) -> Result<(), ControllerError> {
        let qids = self.live_queues.clone();
        let mut first_err = None;
        for &q in &qids {
            if self.sq_deleted.contains(&q) {
                continue;
            }
            if let Err(e) = self.delete_sq(q) {
                first_err.get_or_insert(e);
            }
        }
        for &q in &qids {
            if let Err(e) = self.admin_command(DeleteIoCq::new(q).build(), "Delete I/O Completion Queue") {
                first_err.get_or_insert(e);
            }
        }
        self.live_queues.clear();
        self.sq_deleted.clear();
        let bar = self.device.bar0();
        let cc = Cc(bar.read32(offset::CC)?);
        bar.write32(offset::CC, cc.with_shn(ShutdownNotification::Normal).0)?;
        // CAP.TO bounds ready transitions, not shutdown (RTD3E does); like
        // Linux, allow at least SHUTDOWN_TIMEOUT.
        let t = self.ready_timeout.max(SHUTDOWN_TIMEOUT);
        wait_csts(&*self.device, t, "CSTS.SHST = complete", true, |c| c.shst() == ShutdownStatus::Complete)?;
        self.shut_down = true;
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Controller {
    /// A controller dropped without [`Controller::shutdown`] (an error path,
    /// a panic) is disabled (CC.EN = 0, bounded wait for CSTS.RDY = 0)
    /// before its admin queue memory is freed, so it cannot DMA into memory
    /// that is about to be reused.
    ///
    /// The pages of admin commands that timed out are freed once CSTS.RDY
    /// = 0 is seen; if it never is (or the controller was shut down, not
    /// disabled), the device keeps them ([`NvmeDevice::keep_dma`]).
    fn drop(&mut self) {
        let mut stopped = false;
        if !self.shut_down {
            let bar = self.device.bar0();
            if let Ok(cc) = bar.read32(offset::CC).map(Cc) {
                let disabled = !cc.en() || bar.write32(offset::CC, cc.with_en(false).0).is_ok();
                if disabled && (cc.en() || !self.timed_out.is_empty()) {
                    stopped =
                        wait_csts(&*self.device, self.ready_timeout, "CSTS.RDY = 0 on drop", false, |c| {
                            !c.rdy()
                        })
                        .is_ok();
                }
            }
        }
        if !stopped && !self.timed_out.is_empty() {
            tracing::warn!(
                pages = self.timed_out.len(),
                "controller not seen stopped (CSTS.RDY = 0): keeping the pages of timed-out admin commands"
            );
            let pages = self.timed_out.drain(..).map(|(_, b)| Box::new(b) as Box<dyn Send>).collect();
            self.device.keep_dma(crate::device::KeptDma::new(pages));
        }
    }
}

/// Programs AQA/ASQ/ACQ for `admin` (64-bit registers as two halves, low
/// first), writes CC with EN = 1 (IOSQES 6, IOCQES 4, MPS from `page_size`,
/// NVM command set), and waits for CSTS.RDY = 1, failing at once on
/// CSTS.CFS (NVMe Base 2.0 3.5.1).
pub(super) fn enable(
    device: &dyn NvmeDevice,
    admin: &QueuePair,
    page_size: usize,
    ready_timeout: Duration,
) -> Result<(), ControllerError> {
    let bar = device.bar0();
    let entries = admin.sq().size();
    bar.write32(offset::AQA, Aqa::new((entries - 1) as u16, (admin.cq().size() - 1) as u16).0)?;
    bar.write64(offset::ASQ, admin.sq().memory().device_addr(0)?)?;
    bar.write64(offset::ACQ, admin.cq().memory().device_addr(0)?)?;
    let mps = page_size.trailing_zeros().saturating_sub(12);
    let cc = Cc(0)
        .with_iosqes(6)
        .with_iocqes(4)
        .with_mps(mps as u8)
        .with_css(0)
        .with_ams(0)
        .with_shn(ShutdownNotification::None)
        .with_en(true);
    bar.write32(offset::CC, cc.0)?;
    wait_csts(device, ready_timeout, "CSTS.RDY = 1 after CC.EN = 1", true, |c| c.rdy())
}

/// How often a register wait reads CSTS.
const CSTS_POLL: Duration = Duration::from_micros(50);

/// Polls CSTS until `done` holds, `timeout` passes, CSTS reads all ones, or
/// (when `fail_on_cfs`) CSTS.CFS is set; on the device's clock
/// ([`NvmeDevice::clock`]).
pub(super) fn wait_csts(
    device: &dyn NvmeDevice,
    timeout: Duration,
    what: &'static str,
    fail_on_cfs: bool,
    mut done: impl FnMut(Csts) -> bool,
) -> Result<(), ControllerError> {
    let clock = device.clock();
    let start = clock.now();
    loop {
        let csts = Csts(device.bar0().read32(offset::CSTS)?);
        if csts.is_all_ones() {
            return Err(ControllerError::DeviceGone { register: "CSTS" });
        }
        if fail_on_cfs && csts.cfs() {
            return Err(ControllerError::Fatal { during: what });
        }
        if done(csts) {
            return Ok(());
        }
        if clock.now().saturating_duration_since(start) >= timeout {
            return Err(ControllerError::Timeout {
                what,
                waited: timeout,
                state: format!("CSTS = {:#010x}", csts.0),
            });
        }
        clock.poll_sleep(CSTS_POLL, start + timeout);
    }
}
