//! DMA memory: page-aligned host buffers that a device reads and writes, and
//! that know the device-visible address of each of their pages.
//!
//! A device may write this memory at any time, so it is never exposed as a
//! Rust reference: all access is through copies (`ptr::copy`) and atomic
//! loads and stores, as openvmm's `user_driver` does.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::device::{DeviceError, DmaMapping, HostMemory, NvmeDevice, HOST_PAGE_SIZE};

/// Errors creating or accessing DMA memory.
#[derive(Debug, thiserror::Error)]
pub enum DmaError {
    /// Zero-length or overflowing size.
    #[error("invalid DMA buffer size {len}")]
    BadSize {
        /// Requested size in bytes.
        len: usize,
    },
    /// The host allocation failed.
    #[error("allocating {len} bytes of DMA memory failed")]
    OutOfMemory {
        /// Requested size in bytes.
        len: usize,
    },
    /// The device refused the mapping.
    #[error("mapping DMA memory for the device failed")]
    Map(#[source] DeviceError),
    /// An access outside the buffer.
    #[error("access {offset:#x}+{len:#x} is outside the {size:#x}-byte DMA buffer")]
    OutOfBounds {
        /// Byte offset of the access.
        offset: usize,
        /// Length of the access in bytes.
        len: usize,
        /// Size of the buffer in bytes.
        size: usize,
    },
}

/// Page-aligned, zero-initialised host memory mapped for one device.
///
/// Used for queue memory (SQ, CQ, PRP lists, Identify buffers) and for
/// bounce buffers. Dropping it unmaps it from the device first, then frees
/// it; a buffer a timed-out command may still write must be kept alive
/// (see [`DmaBuffer::leak_until_reset`]).
#[derive(Debug)]
pub struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
    mapping: DmaMapping,
    device: Arc<dyn NvmeDevice>,
}

/// Where a [`DmaBuffer`]'s memory comes from, and so how it is released.
#[derive(Debug)]
enum Backing {
    /// The process heap, with this alignment: unmapped, then freed.
    Heap { align: usize },
    /// Memory the device supplied ([`NvmeDevice::alloc_host`]): unmapped,
    /// then the owner dropped.
    Device(#[allow(dead_code)] Box<dyn std::fmt::Debug + Send + Sync>),
    /// Memory mapped by someone else (a ring `tuttid` granted): not
    /// unmapped from the device by this buffer (its owner does that after
    /// deleting the queue); the keeper is dropped.
    Foreign(#[allow(dead_code)] Box<dyn std::fmt::Debug + Send + Sync>),
}

// SAFETY: the buffer is plain memory accessed only through copies and atomic
// operations; the device handle is Send + Sync.
unsafe impl Send for DmaBuffer {}
// SAFETY: as above: shared access never creates references into the memory.
unsafe impl Sync for DmaBuffer {}

impl DmaBuffer {
    /// Allocates `len` bytes (rounded up to whole 4 KiB pages), zeroed, and
    /// maps them for `device`.
    pub fn new(device: &Arc<dyn NvmeDevice>, len: usize) -> Result<Self, DmaError> {
        Self::new_aligned(device, len, HOST_PAGE_SIZE)
    }

    /// As [`DmaBuffer::new`], with the host allocation aligned to `align`
    /// bytes (a power of two of at least 4 KiB; queue memory is aligned to
    /// the controller's memory page size). The device address alignment is
    /// the device's business; callers that need it check it.
    pub fn new_aligned(device: &Arc<dyn NvmeDevice>, len: usize, align: usize) -> Result<Self, DmaError> {
        let align = align.max(HOST_PAGE_SIZE);
        let rounded = len
            .checked_next_multiple_of(HOST_PAGE_SIZE)
            .filter(|&n| n > 0)
            .ok_or(DmaError::BadSize { len })?;
        if let Some(host) = device.alloc_host(rounded).map_err(DmaError::Map)? {
            return Self::from_device_memory(device, host, rounded, align);
        }
        let layout = Layout::from_size_align(rounded, align).map_err(|_| DmaError::BadSize { len })?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(DmaError::OutOfMemory { len: rounded })?;
        // SAFETY: the allocation lives until `drop`, which unmaps before
        // freeing; we never create references into it.
        match unsafe { device.dma_map(ptr, rounded) } {
            Ok(mapping) => Ok(Self {
                ptr,
                len: rounded,
                backing: Backing::Heap { align },
                mapping,
                device: device.clone(),
            }),
            Err(e) => {
                // SAFETY: allocated above with this layout, never mapped.
                unsafe { alloc::dealloc(raw, layout) };
                Err(DmaError::Map(e))
            }
        }
    }

    fn from_device_memory(
        device: &Arc<dyn NvmeDevice>,
        host: HostMemory,
        len: usize,
        align: usize,
    ) -> Result<Self, DmaError> {
        if host.len < len || !(host.ptr.as_ptr() as usize).is_multiple_of(align) {
            return Err(DmaError::BadSize { len });
        }
        // SAFETY: `host.owner` keeps the memory allocated until this
        // buffer's drop, which unmaps it first; no references into it.
        let mapping = unsafe { device.dma_map(host.ptr, len) }.map_err(DmaError::Map)?;
        // Zeroed by the device's allocator (contract of `alloc_host`).
        Ok(Self { ptr: host.ptr, len, backing: Backing::Device(host.owner), mapping, device: device.clone() })
    }

    /// Wraps memory that is mapped for the device already and whose
    /// mapping someone else removes (queue rings a daemon granted): dropping
    /// the buffer drops `keeper` (which keeps the memory mapped in this
    /// process) and does not call [`NvmeDevice::dma_unmap`].
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be page aligned, readable and writable, and
    /// stay so while `keeper` lives; `mapping` must give its device
    /// addresses (at least `len` bytes of it). No Rust reference into the
    /// memory may exist while the buffer lives.
    pub unsafe fn from_foreign(
        device: &Arc<dyn NvmeDevice>,
        ptr: NonNull<u8>,
        len: usize,
        mapping: DmaMapping,
        keeper: Box<dyn std::fmt::Debug + Send + Sync>,
    ) -> Result<Self, DmaError> {
        if len == 0 || !len.is_multiple_of(HOST_PAGE_SIZE) || mapping.len() < len {
            return Err(DmaError::BadSize { len });
        }
        Ok(Self { ptr, len, backing: Backing::Foreign(keeper), mapping, device: device.clone() })
    }

    /// Size in bytes (a multiple of 4 KiB).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: buffers have at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Device addresses of the buffer's pages.
    pub fn mapping(&self) -> &DmaMapping {
        &self.mapping
    }

    /// Device address of byte `offset`, or an error past the end.
    pub fn device_addr(&self, offset: usize) -> Result<u64, DmaError> {
        self.mapping.addr(offset).filter(|_| offset < self.len).ok_or(DmaError::OutOfBounds {
            offset,
            len: 0,
            size: self.len,
        })
    }

    /// Host pointer to the first byte (for the emulator's tests and for
    /// handing to a GPU mapping; never dereference it as a reference).
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, offset: usize, len: usize, align: usize) -> Result<*mut u8, DmaError> {
        let oob = DmaError::OutOfBounds { offset, len, size: self.len };
        match offset.checked_add(len) {
            Some(end) if end <= self.len && offset.is_multiple_of(align) => {}
            _ => return Err(oob),
        }
        // SAFETY: offset + len <= self.len: in bounds of the allocation.
        Ok(unsafe { self.ptr.as_ptr().add(offset) })
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        let dst = self.check(offset, src.len(), 1)?;
        // SAFETY: `dst..dst+src.len()` is inside the allocation; `src` is a
        // distinct Rust slice, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies `dst.len()` bytes from the buffer at `offset` into `dst`.
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        let src = self.check(offset, dst.len(), 1)?;
        // SAFETY: as in `write_bytes`.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Sets every byte of the buffer to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole allocation, no references exist into it.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }

    /// Atomic 32-bit load at a 4-byte-aligned `offset`.
    pub fn load_u32(&self, offset: usize, order: Ordering) -> Result<u32, DmaError> {
        let p = self.check(offset, 4, 4)?;
        // SAFETY: in bounds and 4-byte aligned (page-aligned base).
        Ok(unsafe { AtomicU32::from_ptr(p.cast()) }.load(order))
    }

    /// `N` consecutive 32-bit words at a 4-byte-aligned `offset`, checked
    /// once, as atomics: the only way to touch them is an atomic load or
    /// store (the device may write them at any time). For reading a CQE
    /// with one bounds check.
    pub(crate) fn atomic_words<const N: usize>(&self, offset: usize) -> Result<&[AtomicU32; N], DmaError> {
        let p = self.check(offset, 4 * N, 4)?;
        // SAFETY: `4 * N` bytes from `p` are in bounds and 4-byte aligned
        // (page-aligned base, aligned offset); `AtomicU32` has the layout of
        // `u32`, and the memory is only ever accessed atomically while this
        // buffer lives (its contract), so a shared reference to atomics
        // over it is sound for the lifetime of `&self`.
        Ok(unsafe { &*p.cast::<[AtomicU32; N]>() })
    }

    /// Atomic 32-bit store at a 4-byte-aligned `offset`.
    pub fn store_u32(&self, offset: usize, value: u32, order: Ordering) -> Result<(), DmaError> {
        let p = self.check(offset, 4, 4)?;
        // SAFETY: as in `load_u32`.
        unsafe { AtomicU32::from_ptr(p.cast()) }.store(value, order);
        Ok(())
    }

    /// Atomic 64-bit store at an 8-byte-aligned `offset` (PRP list entries).
    pub fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<(), DmaError> {
        let p = self.check(offset, 8, 8)?;
        // SAFETY: in bounds and 8-byte aligned.
        unsafe { AtomicU64::from_ptr(p.cast()) }.store(value, order);
        Ok(())
    }

    /// Atomic 64-bit load at an 8-byte-aligned `offset`.
    pub fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, DmaError> {
        let p = self.check(offset, 8, 8)?;
        // SAFETY: in bounds and 8-byte aligned.
        Ok(unsafe { AtomicU64::from_ptr(p.cast()) }.load(order))
    }

    /// Keeps the memory allocated and mapped for the rest of the process,
    /// for buffers that a timed-out command may still write (NVMe gives no
    /// guarantee until the controller is reset).
    pub fn leak_until_reset(self) {
        std::mem::forget(self);
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        if matches!(self.backing, Backing::Foreign(_)) {
            return; // the keeper drops with `self`; its owner unmaps it
        }
        if let Err(e) = self.device.dma_unmap(&self.mapping) {
            // The device may still reach this memory: leaking is the only
            // safe choice.
            tracing::error!(error = %e, "DMA unmap failed; leaking the buffer");
            if let Backing::Device(owner) | Backing::Foreign(owner) =
                std::mem::replace(&mut self.backing, Backing::Heap { align: HOST_PAGE_SIZE })
            {
                std::mem::forget(owner);
            }
            return;
        }
        let Backing::Heap { align } = self.backing else {
            return; // a device's memory: its owner drops with `self`
        };
        // SAFETY: allocated in `new_aligned` with exactly this layout (len is
        // a non-zero multiple of the page size, align a power of two, both
        // checked there by Layout::from_size_align).
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, align)) };
    }
}
