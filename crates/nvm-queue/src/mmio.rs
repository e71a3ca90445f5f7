//! The one module that performs MMIO: loads and stores to a mapped register
//! window (a controller's BAR0, or the register page of `nvme-emu`).
//!
//! Every access is a single, naturally aligned 32-bit load or store. They are
//! issued as atomic operations (Acquire loads, Release stores): on x86-64
//! these compile to one plain aligned `mov`, which is exactly what an MMIO
//! access must be, and they stay sound when the "device" on the other side
//! is another thread (the emulator) instead of a PCIe function. 64-bit
//! registers (CAP, ASQ, ACQ) are accessed as two 32-bit halves, low half
//! first, as NVMe Base 2.0 section 3.1.4 permits and as controllers that do
//! not support 64-bit accesses require.
//!
//! Why not `volatile-register`: its `RW<T>`/`RO<T>` are `VolatileCell`s
//! reached through a `&RegisterBlock` laid over the MMIO address. A Rust
//! reference is `dereferenceable`, which lets the compiler insert reads the
//! program never made (rust-embedded/volatile-register#10,
//! japaric/vcell#10; no language guarantee exempts `&UnsafeCell` yet,
//! rust-lang/unsafe-code-guidelines#411); it checks nothing against the
//! mapped window's length; a fixed struct cannot place the doorbells, whose
//! stride is CAP.DSTRD at run time; and its volatile accesses would race
//! the emulator thread's accesses to the register page (a data race: Rust
//! volatile is not atomic). [`Mmio`] keeps a raw pointer and the length
//! instead, so no reference to device memory ever exists. See also
//! docs/architecture.md, "Dependencies".

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Errors from a register access that would leave the mapped window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MmioError {
    /// The access `offset..offset + 4` is not inside the window of `len` bytes.
    #[error("MMIO access at offset {offset:#x} is outside the {len:#x}-byte window")]
    OutOfBounds {
        /// Byte offset of the access.
        offset: usize,
        /// Size of the window in bytes.
        len: usize,
    },
    /// The access is not 4-byte aligned.
    #[error("MMIO access at offset {offset:#x} is not 4-byte aligned")]
    Misaligned {
        /// Byte offset of the access.
        offset: usize,
    },
    /// The window base handed to [`Mmio::new`] is null or not 4-byte aligned.
    #[error("MMIO window base is null or not 4-byte aligned")]
    BadBase,
}

/// A mapped register window of `len` bytes.
///
/// Owns no memory: whoever created it (the vfio BAR mapping, the emulator)
/// keeps the mapping alive at least as long as this value and every
/// [`Doorbell`] taken from it.
#[derive(Debug)]
pub struct Mmio {
    base: NonNull<u32>,
    len: usize,
}

// SAFETY: the window is only accessed through atomic 32-bit operations, which
// may be issued from any thread; `Mmio::new`'s contract keeps it mapped.
unsafe impl Send for Mmio {}
// SAFETY: as for Send: all accesses are atomic, no `&mut` aliasing exists.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// Wraps a mapped register window.
    ///
    /// # Safety
    ///
    /// `base..base + len` must be mapped, readable and writable for as long
    /// as the returned value (and every [`Doorbell`] made from it) lives, and
    /// must not be accessed through Rust references (`&`/`&mut` to its bytes)
    /// by anyone while this value lives: only through atomic or volatile
    /// 32-bit accesses.
    pub unsafe fn new(base: *mut u8, len: usize) -> Result<Self, MmioError> {
        if base.is_null() || !(base as usize).is_multiple_of(4) {
            return Err(MmioError::BadBase);
        }
        let base = NonNull::new(base.cast::<u32>()).ok_or(MmioError::BadBase)?;
        Ok(Self { base, len })
    }

    /// Host address of the window's first byte, for mapping the same window
    /// into another agent's address space (a GPU, through
    /// `cuMemHostRegister`). Never dereference it as a Rust reference.
    pub fn base_ptr(&self) -> *mut u8 {
        self.base.as_ptr().cast()
    }

    /// Size of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the window has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize) -> Result<*mut u32, MmioError> {
        if !offset.is_multiple_of(4) {
            return Err(MmioError::Misaligned { offset });
        }
        match offset.checked_add(4) {
            Some(end) if end <= self.len => {}
            _ => return Err(MmioError::OutOfBounds { offset, len: self.len }),
        }
        // SAFETY: offset + 4 <= len, so the pointer stays inside the window.
        Ok(unsafe { self.base.as_ptr().byte_add(offset) })
    }

    /// Reads the 32-bit register at byte `offset` (Acquire).
    pub fn read32(&self, offset: usize) -> Result<u32, MmioError> {
        let p = self.check(offset)?;
        // SAFETY: `p` is in bounds and 4-byte aligned (checked above); the
        // window is mapped for our lifetime and only accessed atomically
        // (contract of `Mmio::new`).
        Ok(unsafe { AtomicU32::from_ptr(p) }.load(Ordering::Acquire))
    }

    /// Writes the 32-bit register at byte `offset` (Release: every store
    /// this thread made before, including SQE stores in DMA memory, is
    /// visible before the register store).
    pub fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        let p = self.check(offset)?;
        // SAFETY: as in `read32`.
        unsafe { AtomicU32::from_ptr(p) }.store(value, Ordering::Release);
        Ok(())
    }

    /// Reads a 64-bit register as two 32-bit loads, low half first.
    pub fn read64(&self, offset: usize) -> Result<u64, MmioError> {
        let lo = self.read32(offset)?;
        let hi = self.read32(offset + 4)?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }

    /// Writes a 64-bit register as two 32-bit stores, low half first.
    pub fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        self.write32(offset, value as u32)?;
        self.write32(offset + 4, (value >> 32) as u32)
    }

    /// A pre-checked handle to one 32-bit doorbell register at `offset`, so
    /// the hot path rings it without re-checking bounds.
    ///
    /// # Safety
    ///
    /// The returned [`Doorbell`] carries no lifetime: the caller must keep
    /// this window mapped (in practice, keep the device that owns it alive)
    /// for as long as the doorbell exists. `QueuePair` does so by holding the
    /// device.
    pub unsafe fn doorbell(&self, offset: usize) -> Result<Doorbell, MmioError> {
        let p = self.check(offset)?;
        Ok(Doorbell {
            // SAFETY: `check` returned an in-bounds, aligned, non-null pointer.
            reg: unsafe { NonNull::new_unchecked(p) },
            offset,
        })
    }
}

/// One SQ tail or CQ head doorbell register (NVMe Base 2.0 3.1.4.23/24).
///
/// Must not outlive the [`Mmio`] window it came from (the owner of the
/// queue keeps the device, and so the window, alive).
#[derive(Debug)]
pub struct Doorbell {
    reg: NonNull<u32>,
    offset: usize,
}

// SAFETY: a doorbell is only written with atomic 32-bit stores.
unsafe impl Send for Doorbell {}
// SAFETY: as above.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// Writes `value` (a new SQ tail or CQ head, an entry index) with one
    /// 32-bit Release store: every SQE store of this thread made before the
    /// call is visible to the controller before the doorbell is.
    #[inline]
    pub fn ring(&self, value: u32) {
        #[cfg(not(target_arch = "x86_64"))]
        // Weakly ordered CPUs: a Release store may not order normal-memory
        // stores before a device-memory store; a full fence does (Linux's
        // wmb() before writel()).
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: `reg` was bounds- and alignment-checked by `Mmio::doorbell`
        // and the window outlives the doorbell (type-level contract).
        unsafe { AtomicU32::from_ptr(self.reg.as_ptr()) }.store(value, Ordering::Release);
    }

    /// Byte offset of the doorbell in the register window.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_alignment_are_checked() {
        let mut page = vec![0u32; 1024];
        // SAFETY: `page` outlives `mmio` and is not otherwise touched.
        let mmio = unsafe { Mmio::new(page.as_mut_ptr().cast(), 4096) }.unwrap();
        mmio.write64(0x28, 0x1_2345_6000).unwrap();
        assert_eq!(mmio.read32(0x28).unwrap(), 0x2345_6000);
        assert_eq!(mmio.read32(0x2C).unwrap(), 1);
        assert_eq!(mmio.read64(0x28).unwrap(), 0x1_2345_6000);
        assert_eq!(mmio.read32(4094), Err(MmioError::Misaligned { offset: 4094 }));
        assert_eq!(mmio.read32(4096), Err(MmioError::OutOfBounds { offset: 4096, len: 4096 }));
        assert!(mmio.write32(usize::MAX - 3, 1).is_err());
        // SAFETY: `db` is used only while `page` (the window) lives.
        let db = unsafe { mmio.doorbell(0x1000 - 4) }.unwrap();
        db.ring(7);
        assert_eq!(mmio.read32(0xFFC).unwrap(), 7);
        // SAFETY: the error path creates no doorbell.
        assert!(unsafe { mmio.doorbell(0x1000) }.is_err());
    }
}
