//! The store's own host buffer, registered with the runtime: superblock,
//! record blocks and the record table during recovery move through it.

use tutti::{MemoryHandle, Runtime};

/// A zeroed, 8-byte-aligned host buffer registered with a runtime for its
/// lifetime.
#[derive(Debug)]
pub(crate) struct Staging {
    buf: Vec<u64>,
    pub handle: MemoryHandle,
}

impl Staging {
    /// `bytes` (rounded up to 8) registered with `rt`.
    pub fn new(rt: &Runtime, bytes: usize) -> Result<Self, tutti::Error> {
        let mut buf = vec![0u64; bytes.div_ceil(8)];
        // SAFETY: `buf` is a live allocation of `buf.len() * 8` bytes that
        // is never reallocated and outlives the registration: `Drop`
        // unregisters before the Vec is freed. The store touches it only
        // between a request's completion and the next submission.
        #[allow(unsafe_code)]
        let handle = unsafe { rt.register_memory(buf.as_mut_ptr().cast(), buf.len() * 8)? };
        Ok(Self { buf, handle })
    }

    /// Bytes of the buffer.
    pub fn len(&self) -> usize {
        self.buf.len() * 8
    }

    /// The buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: a u64 slice viewed as its bytes: same allocation, length
        // times 8, u8 has no alignment or validity requirement.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.len())
        }
    }

    /// The buffer's bytes, for writing.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len();
        // SAFETY: as in `bytes`, with the unique borrow of `self`.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast(), len)
        }
    }

    /// Unregisters the buffer and frees it; when the runtime still holds
    /// it (a timed-out command may still write it), leaks it instead, so a
    /// late DMA never lands in freed memory.
    pub fn release(mut self, rt: &Runtime) {
        if let Err(e) = rt.unregister_memory(self.handle) {
            tracing::warn!(error = %e, "tutti-kv: staging buffer still in use; leaked instead of freed");
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}
