//! A command's data buffer as the controller reaches it: the PRP walk,
//! reads into the controller's scratch buffer, writes of returned data
//! (Identify, Get Log Page), and the count of a refused access.

use std::sync::atomic::Ordering;

use nvme_regs::{Sqe, Status};

use crate::controller::Controller;
use crate::dma::{DmaFault, DmaView};
use crate::shared::Shared;

impl Controller {
    /// Counts a DMA fault on a data transfer: a refused access to another
    /// DMA domain's memory, or one outside every mapping.
    pub(crate) fn data_fault(&self, sh: &Shared, dma: &DmaView<'_>) {
        if dma.take_foreign() {
            sh.stats.dma_domain_faults.fetch_add(1, Ordering::Relaxed);
        } else {
            sh.stats.dma_faults.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads a command's data (PRP1/PRP2, `len` bytes) into `self.scratch`
    /// (resized to `len`).
    pub(crate) fn read_data(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        sqe: &Sqe,
        len: usize,
    ) -> Result<(), Status> {
        self.walk(sh, dma, sqe, len as u64)?;
        self.scratch.resize(len.max(4096), 0);
        let mut off = 0usize;
        for s in &self.segs {
            let l = s.len as usize;
            let Some(dst) = self.scratch.get_mut(off..off + l) else {
                break;
            };
            if dma.read(s.iova, dst).is_err() {
                self.data_fault(sh, dma);
                return Err(crate::prp::PrpError::Fault(DmaFault { iova: s.iova, len: l }).status());
            }
            off += l;
        }
        Ok(())
    }

    /// Writes `data` followed by zeroes up to `len` bytes to the command's
    /// data buffer (Identify, Get Log Page).
    pub(crate) fn write_data(
        &mut self,
        sh: &Shared,
        dma: &DmaView<'_>,
        sqe: &Sqe,
        data: &[u8],
        len: usize,
    ) -> Result<(), Status> {
        self.walk(sh, dma, sqe, len as u64)?;
        let mut off = 0usize;
        for s in &self.segs {
            let l = s.len as usize;
            let from_data = data.len().saturating_sub(off).min(l);
            let r = dma
                .write(s.iova, data.get(off..off + from_data).unwrap_or(&[]))
                .and_then(|()| dma.zero(s.iova + from_data as u64, l - from_data));
            if r.is_err() {
                self.data_fault(sh, dma);
                return Err(crate::prp::PrpError::Fault(DmaFault { iova: s.iova, len: l }).status());
            }
            off += l;
        }
        Ok(())
    }

    /// Walks the command's PRPs for `len` bytes into `self.segs`.
    pub(crate) fn walk(&mut self, sh: &Shared, dma: &DmaView<'_>, sqe: &Sqe, len: u64) -> Result<(), Status> {
        crate::prp::walk(dma, sqe.prp1, sqe.prp2, len, self.page, &mut self.segs).map_err(|e| {
            if matches!(e, crate::prp::PrpError::Fault(_)) {
                self.data_fault(sh, dma);
            }
            e.status()
        })
    }
}
