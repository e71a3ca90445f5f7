//! Admin commands on the admin queue pair, each waited for with a bound
//! (NVMe Base 2.0, 5).

use std::time::Duration;

use nvme_regs::Sqe;

use super::{Controller, ControllerError};
use crate::dma::DmaBuffer;
use crate::queue::{Completion, DataRef};

impl Controller {
    /// Runs one admin command without data and waits (bounded) for it.
    pub fn admin_command(&mut self, sqe: Sqe, name: &'static str) -> Result<Completion, ControllerError> {
        self.admin_submit(sqe, None, name)
    }

    /// Runs one admin command that transfers up to 4096 bytes from the
    /// controller into `out` (Identify, Get Log Page).
    pub fn admin_with_data(
        &mut self,
        sqe: Sqe,
        name: &'static str,
        out: &mut [u8],
    ) -> Result<Completion, ControllerError> {
        let len = out.len().min(4096);
        self.scratch.fill(0);
        let mapping = self.scratch.mapping().clone();
        let c =
            self.admin_submit(sqe, Some(DataRef { mapping: &mapping, offset: 0, len: len.max(4) }), name)?;
        self.scratch.read_bytes(0, &mut out[..len])?;
        Ok(c)
    }

    fn admin_submit(
        &mut self,
        sqe: Sqe,
        data: Option<DataRef<'_>>,
        name: &'static str,
    ) -> Result<Completion, ControllerError> {
        let cid = self.admin.submit(sqe, data, 0)?;
        self.admin.ring();
        let device = self.device.clone();
        device.doorbell_written();
        let clock = device.clock();
        let deadline = clock.now() + self.opts.admin_timeout;
        let mut done = None;
        let mut spins = 0u32;
        loop {
            let timed_out = &mut self.timed_out;
            self.admin.poll(|c| {
                if c.cid == cid {
                    done = Some(c);
                } else {
                    // A late completion of a timed-out command: the
                    // controller is done with its data page.
                    timed_out.retain(|(q, _)| *q != c.cid);
                }
            });
            if let Some(c) = done {
                if !c.status.is_success() {
                    return Err(ControllerError::Command { command: name, status: c.status });
                }
                return Ok(c);
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                let csts = self.csts()?;
                if csts.cfs() {
                    return Err(ControllerError::Fatal { during: name });
                }
                if clock.now() >= deadline {
                    // The controller may still write this command's data:
                    // never hand the scratch page to another command. It is
                    // kept until the command completes late, a reset, or a
                    // drop that sees CSTS.RDY = 0 (`Controller::timed_out`).
                    if data.is_some() {
                        if let Ok(fresh) = DmaBuffer::new(&self.device, 4096) {
                            self.timed_out.push((cid, std::mem::replace(&mut self.scratch, fresh)));
                        }
                    }
                    return Err(ControllerError::Timeout {
                        what: name,
                        waited: self.opts.admin_timeout,
                        state: self.admin.dump(),
                    });
                }
                clock.poll_sleep(Duration::from_micros(20), deadline);
            } else {
                clock.spin();
            }
        }
    }
}
