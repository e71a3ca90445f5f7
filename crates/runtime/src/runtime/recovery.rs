//! Recovery: noticing a controller that is fatal or gone, failing the
//! commands it holds, and bringing it back with `reset_drive`.
//!
//! A controller is judged by its registers, never by silence alone: CSTS
//! that cannot be read or reads all ones (the device vanished: surprise
//! removal, memory space disabled, a dead link), CSTS.CFS = 1 (Controller
//! Fatal Status, NVMe Base 2.0 3.1.4.6), or CSTS.RDY = 0 while the runtime
//! has it enabled (the controller was reset or disabled under us). Such a
//! drive goes to [`DriveState::Failed`]; every command its queues hold is
//! abandoned ([`RequestStatus::ControllerFatal`] naming the drive) and the
//! memory of their operations stays pinned to the drive until its reset.
//!
//! Locks, never two at once except where noted: the drive's health lock
//! (state changes), one queue pair at a time (emptying it), then the
//! operations table (and under it the drive's health lock, to pin memory);
//! `reset_drive` holds the drive's controller lock while it takes each
//! queue pair's lock in turn.

use nvm_queue::Controller;

use super::ops::{drop_if_done, split_tag};
use super::{lock, Runtime};
use crate::drive::{Drive, DriveState};
use crate::error::{Error, RequestStatus};

/// Why a controller is judged dead, from one read of CSTS: gone (see
/// [`controller_gone`]) or CSTS.CFS = 1.
pub(crate) fn controller_dead(c: &Controller) -> Option<String> {
    match c.csts() {
        Ok(csts) if csts.0 != u32::MAX && csts.cfs() => Some("CSTS.CFS = 1: controller fatal status".into()),
        _ => controller_gone(c),
    }
}

/// Why a controller no longer answers at all, from one read of CSTS: it
/// cannot be read, reads all ones (the device vanished), or reads RDY = 0
/// while the runtime has it enabled (reset or disabled under us, or a BAR
/// that no longer decodes and reads zeros). Such a controller is not sent
/// CC.SHN at shutdown.
pub(crate) fn controller_gone(c: &Controller) -> Option<String> {
    match c.csts() {
        Err(e) => Some(format!("CSTS cannot be read ({e}): the device is gone")),
        Ok(csts) if csts.0 == u32::MAX => Some("CSTS reads all ones: the device is gone".into()),
        Ok(csts) if !csts.rdy() => Some(format!(
            "CSTS.RDY = 0 ({:#x}) while enabled: the controller was reset or disabled, or its BAR no longer decodes",
            csts.0
        )),
        Ok(_) => None,
    }
}

impl Runtime {
    /// Reads CSTS of every ready CPU-driven drive of these datapaths (those
    /// whose controller no other thread holds) and fails the dead ones.
    pub(super) fn check_drives(&self, dps: &[usize]) {
        for &dpi in dps {
            for d in self.datapaths[dpi].drives() {
                if !d.is_ready() || d.queues.is_empty() {
                    continue;
                }
                // The drive is marked failed while the controller lock is
                // still held: a reset (which needs that lock) cannot slip
                // in between the CSTS read and the verdict and be undone by
                // a stale reading.
                let Some(ctrl) = &d.controller else {
                    // A tuttid drive: dead when the connection is.
                    if let Some(why) = d.daemon_dead() {
                        if d.mark_failed() {
                            self.abandon_failed(d, &why);
                        }
                    }
                    continue;
                };
                let Ok(c) = ctrl.try_lock() else { continue };
                let Some(why) = controller_dead(&c) else { continue };
                let failed = d.mark_failed();
                drop(c);
                if failed {
                    self.abandon_failed(d, &why);
                }
            }
        }
    }

    /// `true` (and the drive marked failed) when GPU-driven drive `index`'s
    /// controller is dead: the GPU cannot tell a dead controller from a
    /// slow one, the registers can.
    pub(super) fn gpu_drive_dead(&self, index: usize) -> bool {
        let Some(d) = self.drives.get(index) else { return false };
        let dead = match &d.controller {
            Some(c) => controller_dead(&lock(c)),
            None => d.daemon_dead(),
        };
        if let Some(why) = &dead {
            if d.mark_failed() {
                tracing::error!(drive = %d.name, reason = %why, "controller failed under GPU-driven I/O");
            }
        }
        dead.is_some()
    }

    /// Ends every command outstanding on the queues of `d`, which was just
    /// marked failed, with [`RequestStatus::ControllerFatal`]. Their memory
    /// is released only by the controller reset ([`Runtime::reset_drive`]),
    /// because a controller in this state may still be writing it.
    fn abandon_failed(&self, d: &Drive, why: &str) {
        tracing::error!(drive = %d.name, reason = %why, "controller failed: failing its outstanding commands");
        self.abandon_queues(d);
    }

    /// Empties `d`'s CPU queue pairs (the controller is dead or about to be
    /// reset, so none of their commands will complete) and abandons each
    /// command once, pinning its operation's memory to the drive.
    fn abandon_queues(&self, d: &Drive) {
        for q in &d.queues {
            // The rings are dead; their commands end here (the queue memory
            // itself stays allocated in the pair).
            let lost = lock(q).reset_after_controller_reset();
            if lost.is_empty() {
                continue;
            }
            let mut ops = lock(&self.ops);
            for (_, tag) in lost {
                let (slot, gen16, index) = split_tag(tag);
                let Some((h, st)) = ops.get_mut_by_slot(slot) else { continue };
                if h.generation & 0xFFFF != gen16 {
                    continue;
                }
                let _ = st.abandon(index, RequestStatus::ControllerFatal { drive: d.name.clone() });
                d.pin_until_reset(&st.regions);
                drop_if_done(&mut ops, h);
            }
        }
    }

    /// Resets drive `name`'s controller (CC.EN = 0, which also clears
    /// CSTS.CFS), brings it up again and re-creates its I/O queues, after a
    /// fatal controller error failed its outstanding requests with
    /// [`RequestStatus::ControllerFatal`]. Works on a healthy drive too
    /// (its outstanding commands fail the same way). Memory pinned by the
    /// drive's abandoned commands is released once the reset succeeds.
    ///
    /// GPU-executed drives (`execution: gpu`) are reset the same way, and
    /// their GPU-side queue state is rewritten for the re-created queues;
    /// a GPU command that timed out on a fatal controller ends as
    /// [`RequestStatus::ControllerFatal`].
    ///
    /// # Errors
    ///
    /// [`Error::DriveBusy`] while a GPU kernel that uses the drive has not
    /// finished (whether or not a thread is waiting on it; a batch being
    /// launched concurrently is refused instead) or another reset of it is
    /// under way; [`Error::Controller`] or [`Error::Gpu`] when the reset or
    /// a Create fails (the drive stays failed); [`Error::ShuttingDown`];
    /// [`Error::UnknownDrive`].
    pub fn reset_drive(&self, name: &str) -> Result<(), Error> {
        let d = self
            .drives
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| Error::UnknownDrive { name: name.to_owned(), known: self.drive_names() })?;
        if self.shutting_down.load(std::sync::atomic::Ordering::Acquire) || d.state() == DriveState::ShutDown
        {
            return Err(Error::ShuttingDown);
        }
        if d.controller.is_none() {
            // The daemon owns the controller; a dead connection's grants
            // are void and a new runtime reconnects (docs/tuttid.md).
            return Err(Error::DaemonOwned { drive: d.name.clone(), operation: "reset_drive" });
        }
        // No kernel may run on GPU queues while they are re-created; new
        // launches on the drive are refused from here on.
        d.begin_reset().map_err(|ops| Error::DriveBusy { drive: d.name.clone(), ops })?;
        self.abandon_queues(d);
        let r = recreate(d);
        d.end_reset(r.is_ok());
        r
    }
}

/// Resets `d`'s controller and re-creates its CPU or GPU queues.
fn recreate(d: &Drive) -> Result<(), Error> {
    let ctrl_err = |source| Error::Controller { drive: d.name.clone(), source };
    let Some(ctrl) = &d.controller else {
        return Err(Error::DaemonOwned { drive: d.name.clone(), operation: "reset_drive" });
    };
    let mut c = lock(ctrl);
    c.reset().map_err(ctrl_err)?;
    for q in &d.queues {
        c.recreate_io_queue_pair(&mut lock(q)).map_err(ctrl_err)?;
    }
    if let Some(g) = &d.gpu {
        for q in &g.queues {
            q.recreate(&mut c)
                .map_err(|source| Error::Gpu { context: format!("resetting drive {:?}", d.name), source })?;
        }
    }
    Ok(())
}
