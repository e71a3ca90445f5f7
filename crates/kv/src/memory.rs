//! Memory the store moves values to and from: host memory it can read
//! (to checksum), or GPU memory (checksummed by a kernel), registered with
//! the runtime once.

use tutti::MemoryHandle;

/// Where registered memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory; the store checksums it with the CPU's CRC32C
    /// instruction.
    Host,
    /// GPU memory (a device pointer); the store checksums it with a kernel.
    Gpu,
}

/// A memory region registered with a store ([`crate::KvStore::register_host`],
/// [`crate::KvStore::register_gpu`]). Values are byte ranges of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvMemory {
    pub(crate) handle: MemoryHandle,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) kind: MemoryKind,
    pub(crate) store_id: u64,
}

impl KvMemory {
    /// Length of the region, bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Host or GPU.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The runtime's handle for the region.
    pub fn handle(&self) -> MemoryHandle {
        self.handle
    }

    /// Bytes `offset..offset + len` of a host region.
    ///
    /// # Safety
    ///
    /// The region was registered with a pointer valid for its length (the
    /// contract of `register_host`), and no device writes this range while
    /// the slice lives (the store reads it only between the completion of
    /// a load and the return of `wait`, or before a save is submitted).
    pub(crate) unsafe fn host_bytes(&self, offset: u64, len: u64) -> &[u8] {
        debug_assert!(self.kind == MemoryKind::Host && offset + len <= self.len as u64);
        // SAFETY: in bounds (checked by the caller against `self.len`) of a
        // region valid for reads per this function's contract.
        unsafe { std::slice::from_raw_parts((self.addr + offset) as *const u8, len as usize) }
    }
}

/// A byte range of registered memory: the value of a put, or where a get
/// puts it.
#[derive(Debug, Clone, Copy)]
pub struct Value<'a> {
    /// The region.
    pub memory: &'a KvMemory,
    /// Start in the region, bytes (4-byte aligned).
    pub offset: u64,
    /// Payload length, bytes. Moved as whole logical blocks: the region
    /// must hold `offset + len` rounded up to the block size; a get
    /// overwrites the padding after `len`, a put stores it (it is not
    /// part of the checksum).
    pub len: u64,
}
