//! The store's own host buffer, registered with the runtime: superblock,
//! record blocks and the record table during recovery move through it.
//!
//! It is shared memory (`tutti::SharedMemory`, a memfd mapping), which
//! every drive kind can register: a drive owned by `tuttid` (the runtime's
//! `daemon` drives) reaches only memory it can map too.

use tutti::{MemoryHandle, Runtime, SharedMemory};

/// A zeroed, page-aligned host buffer registered with a runtime for its
/// lifetime.
#[derive(Debug)]
pub(crate) struct Staging {
    buf: Option<SharedMemory>,
    len: usize,
    pub handle: MemoryHandle,
}

impl Staging {
    /// `bytes` (rounded up to whole 4 KiB pages) registered with `rt`.
    pub fn new(rt: &Runtime, bytes: usize) -> Result<Self, tutti::Error> {
        let buf = SharedMemory::new(bytes.max(1)).map_err(|e| tutti::Error::Memory {
            reason: format!("allocating the store's {bytes}-byte staging buffer: {e}"),
            source: None,
        })?;
        let len = buf.len();
        // SAFETY: `buf` is a live mapping of `len` bytes that never moves
        // and outlives the registration: `release` unregisters before it
        // is unmapped (or leaks it). The store touches it only between a
        // request's completion and the next submission.
        #[allow(unsafe_code)]
        let handle = unsafe { rt.register_memory(buf.as_ptr(), len)? };
        Ok(Self { buf: Some(buf), len, handle })
    }

    /// Bytes of the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    fn ptr(&self) -> *mut u8 {
        self.buf.as_ref().map_or(std::ptr::NonNull::dangling().as_ptr(), SharedMemory::as_ptr)
    }

    /// The buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping holds `len` bytes for as long as `self`
        // (`buf` is `None` only after `release` consumed `self`); no
        // device writes it while the store reads it (module docs).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr(), self.len)
        }
    }

    /// The buffer's bytes, for writing.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, with the unique borrow of `self`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr(), self.len)
        }
    }

    /// Unregisters the buffer and frees it; when the runtime still holds
    /// it (a timed-out command may still write it), leaks it instead, so a
    /// late DMA never lands in freed memory.
    pub fn release(mut self, rt: &Runtime) {
        if let Err(e) = rt.unregister_memory(self.handle) {
            tracing::warn!(error = %e, "tutti-kv: staging buffer still in use; leaked instead of freed");
            std::mem::forget(self.buf.take());
        }
    }
}
