//! The register page: BAR0 of the emulated controller (NVMe Base 2.0,
//! 3.1.4), in ordinary page-aligned memory.
//!
//! The driver and the controller thread both access it only through one
//! [`Mmio`] (aligned 32-bit atomic loads and stores); no Rust reference to
//! its bytes ever exists.

use std::alloc::{self, Layout};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

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
    memory: Memory,
    dstrd: u8,
}

/// Where the register window lives.
#[derive(Debug)]
enum Memory {
    /// The heap (the default).
    Heap(Layout),
    /// An anonymous mapping of `len` bytes whose doorbell pages are each
    /// replaced by a shared mapping of their own memfd
    /// (`EmulatorConfig::shared_doorbells`); `pages[y]` is queue pair y's.
    Shared { len: usize, pages: std::sync::Mutex<Vec<OwnedFd>> },
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
        let (ptr, memory) = if config.shared_doorbells {
            shared_window(len, usize::from(config.io_queues) + 1)?
        } else {
            let layout = Layout::from_size_align(len, 4096)
                .map_err(|_| EmuError::OutOfMemory { bytes: len as u64 })?;
            // SAFETY: `len >= 0x1000`, non-zero.
            let ptr = unsafe { alloc::alloc_zeroed(layout) };
            if ptr.is_null() {
                return Err(EmuError::OutOfMemory { bytes: len as u64 });
            }
            (ptr, Memory::Heap(layout))
        };
        // SAFETY: `ptr..ptr + len` is our memory, released only in `drop`
        // after the `Mmio` (a field of the same value) is gone, and never
        // accessed through references.
        let mmio = match unsafe { Mmio::new(ptr, len) } {
            Ok(m) => m,
            Err(e) => {
                release(ptr, &memory);
                return Err(EmuError::Mmio(e));
            }
        };
        let page = Self { mmio, ptr, memory, dstrd: config.dstrd };
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

    /// The memfd holding queue pair `qid`'s doorbell page, when the
    /// doorbells are shared.
    pub(crate) fn doorbell_page_fd(&self, qid: u16) -> Option<OwnedFd> {
        match &self.memory {
            Memory::Shared { pages, .. } => {
                let pages = pages.lock().unwrap_or_else(|p| p.into_inner());
                pages.get(usize::from(qid)).and_then(|f| f.as_fd().try_clone_to_owned().ok())
            }
            Memory::Heap(_) => None,
        }
    }

    /// Replaces queue pair `qid`'s doorbell page by a fresh memfd page
    /// (zeroed), so whoever mapped the old one reaches nothing any more.
    /// `false` when the doorbells are not shared or the qid has no page.
    pub(crate) fn renew_doorbell_page(&self, qid: u16) -> Result<bool, EmuError> {
        let Memory::Shared { pages, .. } = &self.memory else { return Ok(false) };
        let mut pages = pages.lock().unwrap_or_else(|p| p.into_inner());
        let Some(slot) = pages.get_mut(usize::from(qid)) else { return Ok(false) };
        *slot = doorbell_page(self.ptr, 0x1000 + usize::from(qid) * 4096)?;
        Ok(true)
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
        release(self.ptr, &self.memory);
    }
}

/// Frees or unmaps the register window (the `Mmio` over it is gone or
/// never existed, and no other user of it outlives the emulator: trait
/// contract of `NvmeDevice::bar0`).
fn release(ptr: *mut u8, memory: &Memory) {
    match memory {
        // SAFETY: allocated in `new` with this layout.
        Memory::Heap(layout) => unsafe { alloc::dealloc(ptr, *layout) },
        // SAFETY: the whole window mapped by `shared_window`, with the
        // doorbell pages mapped over parts of it; unmapped only here.
        Memory::Shared { len, .. } => unsafe {
            libc::munmap(ptr.cast(), *len);
        },
    }
}

fn os_error(what: &'static str) -> EmuError {
    EmuError::Os { op: what, source: std::io::Error::last_os_error() }
}

/// A window of `len` bytes (anonymous, zeroed) whose pages at `1000h + y *
/// 4096`, for y in `0..queues`, are each a shared mapping of a memfd of
/// their own (one page, sealed against shrinking and growing).
fn shared_window(len: usize, queues: usize) -> Result<(*mut u8, Memory), EmuError> {
    // SAFETY: a fresh anonymous private mapping at a kernel-chosen address.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(os_error("mmap of the register window"));
    }
    let ptr = base.cast::<u8>();
    let mut pages = Vec::with_capacity(queues);
    for y in 0..queues {
        let offset = 0x1000 + y * 4096;
        if offset + 4096 > len {
            break;
        }
        match doorbell_page(ptr, offset) {
            Ok(fd) => pages.push(fd),
            Err(e) => {
                release(ptr, &Memory::Shared { len, pages: std::sync::Mutex::new(pages) });
                return Err(e);
            }
        }
    }
    Ok((ptr, Memory::Shared { len, pages: std::sync::Mutex::new(pages) }))
}

/// Creates a sealed one-page memfd and maps it over the window page at
/// `offset`.
fn doorbell_page(base: *mut u8, offset: usize) -> Result<OwnedFd, EmuError> {
    // SAFETY: the name is a NUL-terminated literal.
    let raw = unsafe {
        libc::memfd_create(c"nvme-emu-doorbells".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    };
    if raw < 0 {
        return Err(os_error("memfd_create"));
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let fdn = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: plain system calls on our descriptor.
    if unsafe { libc::ftruncate(fdn, 4096) } != 0 {
        return Err(os_error("ftruncate"));
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: as above.
    if unsafe { libc::fcntl(fdn, libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os_error("F_ADD_SEALS"));
    }
    // SAFETY: `base + offset .. + 4096` lies inside the window this
    // emulator owns (checked by the caller); MAP_FIXED replaces just that
    // page with the memfd, which cannot shrink (no SIGBUS).
    let p = unsafe {
        libc::mmap(
            base.add(offset).cast(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fdn,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_error("mmap of a doorbell page"));
    }
    Ok(fd)
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
        assert!(p.doorbell_page_fd(1).is_none());
        assert_eq!(p.mmio().read32(offset::CSTS).unwrap(), u32::MAX);
        assert_eq!(p.doorbell(300, true), u32::MAX);
    }

    #[test]
    fn shared_doorbell_pages_are_their_own_memfds() {
        let mut c = EmulatorConfig::new("s", vec![NamespaceSpec::new(8, 4096)]);
        c.dstrd = 9;
        c.io_queues = 3;
        c.shared_doorbells = true;
        let p = RegisterPage::new(&c).unwrap();
        assert_eq!(p.mmio().len(), 0x1000 + 4 * 4096);
        // SQ 2 tail and CQ 2 head (Base 2.0 3.1.4.23/24: 1000h + (2y + 1) * (4 << 9)).
        assert_eq!(doorbell_offset(2, false, 9), 0x1000 + 2 * 4096);
        assert_eq!(doorbell_offset(2, true, 9), 0x1000 + 2 * 4096 + 2048);
        p.mmio().write32(doorbell_offset(2, true, 9), 9).unwrap();
        let fd = p.doorbell_page_fd(2).unwrap();
        let mut word = [0u8; 4];
        // SAFETY: plain pread on a valid descriptor into a local buffer.
        let n =
            unsafe { libc::pread(std::os::fd::AsRawFd::as_raw_fd(&fd), word.as_mut_ptr().cast(), 4, 2048) };
        assert_eq!(n, 4);
        assert_eq!(u32::from_le_bytes(word), 9);
        assert!(p.doorbell_page_fd(4).is_none());
        // A renewed page is a new file: the old one no longer reaches BAR0.
        assert!(p.renew_doorbell_page(2).unwrap());
        p.mmio().write32(doorbell_offset(2, true, 9), 11).unwrap();
        // SAFETY: as above.
        let n =
            unsafe { libc::pread(std::os::fd::AsRawFd::as_raw_fd(&fd), word.as_mut_ptr().cast(), 4, 2048) };
        assert_eq!((n, u32::from_le_bytes(word)), (4, 9));
        assert_eq!(p.doorbell(2, true), 11);
        c.dstrd = 0;
        assert!(c.validate().is_err());
    }
}
