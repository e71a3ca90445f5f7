//! The register page: BAR0 of the emulated controller (NVMe Base 2.0,
//! 3.1.4), in ordinary page-aligned memory.
//!
//! The driver and the controller thread both access it only through one
//! [`Mmio`] (aligned 32-bit atomic loads and stores); no Rust reference to
//! its bytes ever exists.

use std::alloc::{self, Layout};

use nvm_queue::Mmio;
use nvme_regs::registers::{doorbell_offset, offset};
use nvme_regs::{Cap, Cc, Csts, Vs};

use crate::config::EmulatorConfig;
use crate::EmuError;

/// The register page and its [`Mmio`] window.
#[derive(Debug)]
pub(crate) struct RegisterPage {
    mmio: Mmio,
    ptr: *mut u8,
    layout: Layout,
    dstrd: u8,
}

// SAFETY: the memory is only accessed through `Mmio` (atomics); the raw
// pointer is kept only to free the allocation in `drop`.
unsafe impl Send for RegisterPage {}
// SAFETY: as above.
unsafe impl Sync for RegisterPage {}

impl RegisterPage {
    /// Allocates the zeroed page for `config` and writes the initial CAP,
    /// VS and CSTS.
    pub(crate) fn new(config: &EmulatorConfig) -> Result<Self, EmuError> {
        let len = config.register_page_len().ok_or(EmuError::Config {
            field: "io_queues",
            value: u64::from(config.io_queues),
            reason: "register page too large",
        })?;
        let layout =
            Layout::from_size_align(len, 4096).map_err(|_| EmuError::OutOfMemory { bytes: len as u64 })?;
        // SAFETY: `len >= 0x1000`, non-zero.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(EmuError::OutOfMemory { bytes: len as u64 });
        }
        // SAFETY: `ptr..ptr + len` is our allocation, freed only in `drop`
        // after the `Mmio` (a field of the same value) is gone, and never
        // accessed through references.
        let mmio = match unsafe { Mmio::new(ptr, len) } {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: allocated above with `layout`.
                unsafe { alloc::dealloc(ptr, layout) };
                return Err(EmuError::Mmio(e));
            }
        };
        let page = Self { mmio, ptr, layout, dstrd: config.dstrd };
        page.write64(offset::CAP, Self::cap(config).0);
        page.write32(offset::VS, Vs::V1_4.0);
        page.set_csts(Csts(0));
        Ok(page)
    }

    /// CAP as the controller advertises it (Base 2.0 3.1.4.1).
    pub(crate) fn cap(config: &EmulatorConfig) -> Cap {
        Cap(0)
            .with_mqes_z(config.mqes)
            .with_cqr(true)
            .with_to_500ms(config.cap_to_500ms)
            .with_dstrd(config.dstrd)
            .with_css_nvm(true)
            .with_mpsmin(MPSMIN)
            .with_mpsmax(MPSMAX)
    }

    pub(crate) fn mmio(&self) -> &Mmio {
        &self.mmio
    }

    fn read32(&self, off: usize) -> u32 {
        // Offsets used here are constants inside the first page, or
        // doorbells of queues the page was sized for: errors cannot happen;
        // read 0 if one ever did.
        self.mmio.read32(off).unwrap_or(0)
    }

    fn write32(&self, off: usize, v: u32) {
        let _ = self.mmio.write32(off, v);
    }

    fn write64(&self, off: usize, v: u64) {
        let _ = self.mmio.write64(off, v);
    }

    pub(crate) fn cc(&self) -> Cc {
        Cc(self.read32(offset::CC))
    }

    pub(crate) fn set_csts(&self, csts: Csts) {
        self.write32(offset::CSTS, csts.0);
    }

    pub(crate) fn aqa(&self) -> u32 {
        self.read32(offset::AQA)
    }

    /// ASQ or ACQ, read as two halves, low first.
    pub(crate) fn read64(&self, off: usize) -> u64 {
        self.mmio.read64(off).unwrap_or(0)
    }

    /// Raw value of SQ `qid`'s tail doorbell (or CQ head doorbell).
    #[inline]
    pub(crate) fn doorbell(&self, qid: u16, is_cq: bool) -> u32 {
        self.read32(doorbell_offset(qid, is_cq, self.dstrd))
    }

    /// Resets a doorbell register to 0 (controller reset, queue creation).
    pub(crate) fn clear_doorbell(&self, qid: u16, is_cq: bool) {
        self.write32(doorbell_offset(qid, is_cq, self.dstrd), 0);
    }

    /// Sets every register of the page, doorbells included, to all ones:
    /// what a host reads from a device that is gone.
    pub(crate) fn fill_ones(&self) {
        self.fill(u32::MAX);
    }

    /// Sets every register in the page to `value` (what a host reads from
    /// a device that is gone, `u32::MAX`, or whose memory space is
    /// disabled, 0 on QEMU).
    pub(crate) fn fill(&self, value: u32) {
        let mut off = 0;
        while off + 4 <= self.mmio.len() {
            self.write32(off, value);
            off += 4;
        }
    }

    /// Resets every doorbell register in the page to 0.
    pub(crate) fn clear_all_doorbells(&self) {
        let mut off = offset::DOORBELL_BASE;
        while off + 4 <= self.mmio.len() {
            self.write32(off, 0);
            off += 4;
        }
    }
}

impl Drop for RegisterPage {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with `self.layout`; the `Mmio` window
        // is dropped with `self` and no other user of the page outlives the
        // emulator that owns it (trait contract of `NvmeDevice::bar0`).
        unsafe { alloc::dealloc(self.ptr, self.layout) };
    }
}

/// CAP.MPSMIN: 4 KiB pages.
pub(crate) const MPSMIN: u8 = 0;
/// CAP.MPSMAX: 64 KiB pages.
pub(crate) const MPSMAX: u8 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NamespaceSpec;

    #[test]
    fn initial_registers() {
        let mut c = EmulatorConfig::new("r", vec![NamespaceSpec::new(8, 4096)]);
        c.dstrd = 2;
        c.io_queues = 300;
        let p = RegisterPage::new(&c).unwrap();
        assert_eq!(p.mmio().len(), 0x1000 + 0x3000);
        let cap = Cap(p.mmio().read64(offset::CAP).unwrap());
        assert_eq!(cap.mqes_z(), 1023);
        assert!(cap.cqr());
        assert_eq!(cap.dstrd(), 2);
        assert_eq!(cap.to_500ms(), 20);
        assert!(cap.css_nvm());
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.mpsmax(), 4);
        assert_eq!(p.mmio().read32(offset::VS).unwrap(), 0x0001_0400);
        assert_eq!(p.mmio().read32(offset::CSTS).unwrap(), 0);
        p.mmio().write32(doorbell_offset(300, true, 2), 5).unwrap();
        assert_eq!(p.doorbell(300, true), 5);
        p.clear_all_doorbells();
        assert_eq!(p.doorbell(300, true), 0);
        p.fill_ones();
        assert_eq!(p.mmio().read64(offset::CAP).unwrap(), u64::MAX);
        assert_eq!(p.mmio().read32(offset::CSTS).unwrap(), u32::MAX);
        assert_eq!(p.doorbell(300, true), u32::MAX);
    }
}
