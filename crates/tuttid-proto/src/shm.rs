//! Shared memory: memfd-backed mappings that can be handed to another
//! process with SCM_RIGHTS.
//!
//! [`SharedMemory`] is memory a client allocates to do I/O with (sealed
//! against shrinking, so the daemon that maps it can never fault on a
//! truncated file); every live one is listed in a process-wide registry so
//! a device-access layer can find the memfd and offset behind any host
//! address ([`lookup`]). [`MappedFd`] maps a received descriptor.
//! [`Window`] is an address range of private placeholder pages into which
//! shared pages (granted doorbell pages) are mapped at fixed offsets.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use rustix::fs::{
    fallocate, fcntl_add_seals, fcntl_get_seals, fstat, fstatfs, ftruncate, memfd_create, FallocateFlags,
    MemfdFlags, SealFlags,
};
use rustix::mm::{mmap, mmap_anonymous, munmap, MapFlags, ProtFlags};

/// Page size shared mappings are made of, bytes.
pub const PAGE: usize = 4096;

/// Errors creating or mapping shared memory.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// A system call failed.
    #[error("{op} failed")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A length or offset that is zero, not page aligned, or past the file.
    #[error("range {offset:#x}+{len:#x} is empty, not page aligned or outside the {size:#x}-byte file")]
    BadRange {
        /// Offset in the file, bytes.
        offset: u64,
        /// Length, bytes.
        len: u64,
        /// File size, bytes.
        size: u64,
    },
    /// The descriptor is not a memfd sealed against shrinking
    /// (F_SEAL_SHRINK): mapping it could fault later if it were truncated.
    #[error("descriptor is not a memfd sealed against shrinking")]
    NotSealed,
    /// Client memory (a registration) is not sealed against growing too
    /// (F_SEAL_GROW): [`SharedMemory`] always is, so a daemon accepts
    /// nothing looser.
    #[error("descriptor is not a memfd sealed against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW)")]
    NotSealedGrow,
    /// The memfd has holes: fewer bytes allocated than its size. Mapping
    /// it for DMA would make the daemon build page lists for, and on a
    /// real drive pin, memory that does not exist yet (a 1 TiB sparse
    /// memfd costs nothing to make). [`SharedMemory`] allocates all of its
    /// pages at creation (fallocate).
    #[error(
        "memfd of {size} bytes has only {allocated} allocated (sparse): allocate all of it first (fallocate)"
    )]
    Sparse {
        /// File size, bytes.
        size: u64,
        /// Bytes allocated (st_blocks * 512).
        allocated: u64,
    },
    /// A hugetlbfs memfd. A hole punched into it later (or an exhausted
    /// hugepage pool) makes the daemon's next access to the page raise
    /// SIGBUS; the only seals that forbid punching (F_SEAL_WRITE,
    /// F_SEAL_FUTURE_WRITE) also forbid the writable shared mapping that
    /// I/O memory needs, so such memory cannot be made safe to share.
    #[error("hugetlbfs memfds are refused: a hole punched later would kill the daemon with SIGBUS, and the seals that forbid punching also forbid writable mappings")]
    HugeTlb,
}

/// `f_type` of hugetlbfs (linux/magic.h).
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

fn os(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |e| ShmError::Os { op, source: e.into() }
}

/// A descriptor and a shared read-write mapping of `len` bytes of it, unmapped
/// on drop: the one mapping type behind [`SharedMemory`] (all of a memfd
/// this process made) and [`MappedFd`] (part of a descriptor received).
#[derive(Debug)]
struct Mapping {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; this type only keeps it
// alive and hands out its address, never references into it.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes at `offset` of `fd`, shared and read-write. The
    /// caller has checked that `fd` cannot shrink below `offset + len` (a
    /// memfd sealed with F_SEAL_SHRINK, that long), so access never faults.
    fn shared(fd: OwnedFd, offset: u64, len: usize) -> Result<Self, ShmError> {
        // SAFETY: a fresh shared mapping inside a file that cannot shrink
        // (the caller's check), at an address the kernel picks; nothing
        // else is mapped there.
        let p = unsafe {
            mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, offset)
        }
        .map_err(os("mmap"))?;
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or(ShmError::Os { op: "mmap", source: std::io::Error::other("null mapping") })?;
        Ok(Self { fd, ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is the mapping made in `Mapping::shared`,
        // unmapped only here; no reference into it exists.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

static REGISTRY: Mutex<Vec<Weak<Mapping>>> = Mutex::new(Vec::new());

/// Page-aligned, zeroed memory in a memfd (sealed against shrinking and
/// growing), mapped shared into this process, that a daemon can map too.
/// Cloning shares the same memory; it is unmapped when the last clone
/// goes.
#[derive(Debug, Clone)]
pub struct SharedMemory {
    inner: Arc<Mapping>,
}

impl SharedMemory {
    /// `len` bytes (rounded up to whole 4 KiB pages), zeroed.
    ///
    /// # Errors
    ///
    /// [`ShmError::BadRange`] for zero or overflowing `len`;
    /// [`ShmError::Os`] when memfd_create, ftruncate, sealing or mmap fails.
    pub fn new(len: usize) -> Result<Self, ShmError> {
        let bad = ShmError::BadRange { offset: 0, len: len as u64, size: 0 };
        let len = len.checked_next_multiple_of(PAGE).filter(|&n| n > 0).ok_or(bad)?;
        let fd = memfd_create("tutti-shm", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        ftruncate(&fd, len as u64).map_err(os("ftruncate"))?;
        // Every page allocated now: a daemon refuses sparse memfds.
        fallocate(&fd, FallocateFlags::empty(), 0, len as u64).map_err(os("fallocate"))?;
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(os("F_ADD_SEALS"))?;
        // A file of exactly `len` bytes, sealed against shrinking.
        let inner = Arc::new(Mapping::shared(fd, 0, len)?);
        let mut reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&inner));
        Ok(Self { inner })
    }

    /// Host address of the first byte (page aligned). Never turn it into a
    /// Rust reference while a device may write the memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr.as_ptr()
    }

    /// Length in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always `false`: at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The memfd, for sending to a daemon.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// Copies `src` into the memory at byte `offset`.
    ///
    /// # Errors
    ///
    /// [`ShmError::BadRange`] when the copy would leave the memory.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), ShmError> {
        let dst = self.range(offset, src.len())?;
        // SAFETY: in bounds (checked); `src` is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies `dst.len()` bytes at byte `offset` out of the memory.
    ///
    /// # Errors
    ///
    /// [`ShmError::BadRange`] when the copy would leave the memory.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), ShmError> {
        let src = self.range(offset, dst.len())?;
        // SAFETY: in bounds (checked); `dst` is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn range(&self, offset: usize, len: usize) -> Result<*mut u8, ShmError> {
        match offset.checked_add(len) {
            // SAFETY: offset + len <= self.len: inside the mapping.
            Some(end) if end <= self.inner.len => Ok(unsafe { self.as_ptr().add(offset) }),
            _ => Err(ShmError::BadRange {
                offset: offset as u64,
                len: len as u64,
                size: self.inner.len as u64,
            }),
        }
    }
}

/// The shared memory holding all of `host..host + len` (any live
/// [`SharedMemory`] of this process): a clone of it and the byte offset of
/// `host` in its memfd. `None` when the range is not (entirely) inside one.
pub fn lookup(host: usize, len: usize) -> Option<(SharedMemory, u64)> {
    let end = host.checked_add(len)?;
    let reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    reg.iter().filter_map(Weak::upgrade).find_map(|inner| {
        let start = inner.ptr.as_ptr() as usize;
        (host >= start && end <= start + inner.len)
            .then(|| (SharedMemory { inner: inner.clone() }, (host - start) as u64))
    })
}

/// A received descriptor, mapped shared read-write.
#[derive(Debug)]
pub struct MappedFd {
    map: Mapping,
}

impl MappedFd {
    /// Maps `len` bytes at `offset` of `fd` after checking that it is a
    /// memfd sealed against shrinking and large enough (so the mapping can
    /// never fault).
    ///
    /// # Errors
    ///
    /// [`ShmError::NotSealed`], [`ShmError::BadRange`] (empty, misaligned,
    /// past the end), [`ShmError::Os`].
    pub fn map(fd: OwnedFd, offset: u64, len: u64) -> Result<Self, ShmError> {
        let seals = fcntl_get_seals(&fd).map_err(|_| ShmError::NotSealed)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(ShmError::NotSealed);
        }
        let size = fstat(&fd).map_err(os("fstat"))?.st_size as u64;
        let page = PAGE as u64;
        let ok = len > 0
            && offset.is_multiple_of(page)
            && len.is_multiple_of(page)
            && offset.checked_add(len).is_some_and(|e| e <= size)
            && usize::try_from(len).is_ok();
        if !ok {
            return Err(ShmError::BadRange { offset, len, size });
        }
        // Sealed against shrinking and long enough (checked above).
        Ok(Self { map: Mapping::shared(fd, offset, len as usize)? })
    }

    /// Maps memory a client sent for registration, after the checks that
    /// keep a client from costing the daemon more than what it really
    /// allocated, or killing it with SIGBUS: sealed against shrinking and
    /// growing, not hugetlbfs, and no holes (st_blocks * 512 >= st_size),
    /// all checked on the descriptor before anything is mapped; then as
    /// [`MappedFd::map`].
    ///
    /// # Errors
    ///
    /// [`ShmError::NotSealedGrow`], [`ShmError::HugeTlb`],
    /// [`ShmError::Sparse`], and those of [`MappedFd::map`].
    pub fn map_client(fd: OwnedFd, offset: u64, len: u64) -> Result<Self, ShmError> {
        let seals = fcntl_get_seals(&fd).map_err(|_| ShmError::NotSealed)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(ShmError::NotSealedGrow);
        }
        let fs = fstatfs(&fd).map_err(os("fstatfs"))?;
        #[allow(clippy::unnecessary_cast)] // f_type's integer type differs between targets
        if fs.f_type as u64 == HUGETLBFS_MAGIC {
            return Err(ShmError::HugeTlb);
        }
        let st = fstat(&fd).map_err(os("fstat"))?;
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
        if allocated < size {
            return Err(ShmError::Sparse { size, allocated });
        }
        Self::map(fd, offset, len)
    }

    /// Host address of the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// Always `false`.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// An address range of private, zeroed placeholder pages, into which shared
/// pages are mapped at fixed page offsets ([`Window::map_page`]). A write
/// to a placeholder reaches nobody.
#[derive(Debug)]
pub struct Window {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory, accessed only through raw pointers and atomics.
unsafe impl Send for Window {}
// SAFETY: as above.
unsafe impl Sync for Window {}

impl Window {
    /// A window of `len` bytes (rounded up to pages).
    ///
    /// # Errors
    ///
    /// [`ShmError::BadRange`] for zero length; [`ShmError::Os`].
    pub fn new(len: usize) -> Result<Self, ShmError> {
        let bad = ShmError::BadRange { offset: 0, len: len as u64, size: 0 };
        let len = len.checked_next_multiple_of(PAGE).filter(|&n| n > 0).ok_or(bad)?;
        // SAFETY: a fresh anonymous private mapping at a kernel-chosen address.
        let p = unsafe {
            mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE)
        }
        .map_err(os("mmap"))?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(ShmError::NotSealed)?;
        Ok(Self { ptr, len })
    }

    /// Maps the first page of `fd` (a memfd sealed against shrinking, at
    /// least one page long) over the placeholder page at byte `offset`.
    ///
    /// # Errors
    ///
    /// [`ShmError::BadRange`] for an offset outside the window or not page
    /// aligned; [`ShmError::NotSealed`]; [`ShmError::Os`].
    pub fn map_page(&self, offset: usize, fd: BorrowedFd<'_>) -> Result<(), ShmError> {
        if !offset.is_multiple_of(PAGE) || offset.checked_add(PAGE).is_none_or(|e| e > self.len) {
            return Err(ShmError::BadRange {
                offset: offset as u64,
                len: PAGE as u64,
                size: self.len as u64,
            });
        }
        let seals = fcntl_get_seals(fd).map_err(|_| ShmError::NotSealed)?;
        let size = fstat(fd).map_err(os("fstat"))?.st_size as u64;
        if !seals.contains(SealFlags::SHRINK) || size < PAGE as u64 {
            return Err(ShmError::NotSealed);
        }
        // SAFETY: the target page lies inside this window (checked), which
        // this value owns; MAP_FIXED replaces only that placeholder page.
        // The file cannot shrink below the page (checked), so no SIGBUS.
        unsafe {
            mmap(
                self.ptr.as_ptr().add(offset).cast(),
                PAGE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                fd,
                0,
            )
        }
        .map_err(os("mmap"))?;
        Ok(())
    }

    /// Host address of the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the whole window (placeholders and pages mapped over
        // them), owned by this value.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A memfd of `len` bytes sealed against shrinking and growing, for memory
/// the daemon shares (rings); not mapped.
///
/// # Errors
///
/// [`ShmError::Os`].
pub fn sealed_memfd(name: &str, len: usize) -> Result<OwnedFd, ShmError> {
    let fd =
        memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(os("memfd_create"))?;
    ftruncate(&fd, len as u64).map_err(os("ftruncate"))?;
    fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).map_err(os("F_ADD_SEALS"))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_is_found_and_mappable_twice() {
        let m = SharedMemory::new(3 * PAGE - 5).unwrap();
        assert_eq!(m.len(), 3 * PAGE);
        m.write(PAGE + 1, b"abc").unwrap();
        let (found, off) = lookup(m.as_ptr() as usize + PAGE, PAGE).unwrap();
        assert_eq!(off, PAGE as u64);
        assert_eq!(found.as_ptr(), m.as_ptr());
        assert!(lookup(m.as_ptr() as usize + PAGE, 3 * PAGE).is_none());
        let dup = m.fd().try_clone_to_owned().unwrap();
        let other = MappedFd::map(dup, PAGE as u64, PAGE as u64).unwrap();
        let mut b = [0u8; 3];
        // SAFETY: in bounds of the one-page mapping; no references into it.
        unsafe { std::ptr::copy_nonoverlapping(other.as_ptr().add(1), b.as_mut_ptr(), 3) };
        assert_eq!(&b, b"abc");
        let dup = m.fd().try_clone_to_owned().unwrap();
        assert!(matches!(MappedFd::map(dup, 0, 4 * PAGE as u64), Err(ShmError::BadRange { .. })));
        let unsealed = memfd_create("u", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&unsealed, PAGE as u64).unwrap();
        assert!(matches!(MappedFd::map(unsealed, 0, PAGE as u64), Err(ShmError::NotSealed)));
        assert!(matches!(m.write(3 * PAGE - 1, b"xy"), Err(ShmError::BadRange { .. })));
    }

    #[test]
    fn client_memory_must_be_allocated_sealed_and_not_hugetlb() {
        let m = SharedMemory::new(3 * PAGE).unwrap();
        let st = fstat(m.fd()).unwrap();
        assert!(st.st_blocks * 512 >= st.st_size, "SharedMemory is fully allocated");
        MappedFd::map_client(m.fd().try_clone_to_owned().unwrap(), 0, 3 * PAGE as u64).unwrap();
        // Sealed against shrinking only: refused.
        let shrink_only = sealed_memfd_with("s", PAGE, SealFlags::SHRINK);
        fallocate(&shrink_only, FallocateFlags::empty(), 0, PAGE as u64).unwrap();
        assert!(matches!(MappedFd::map_client(shrink_only, 0, PAGE as u64), Err(ShmError::NotSealedGrow)));
        // A sealed, 1 TiB sparse memfd: refused before anything is mapped.
        let sparse = sealed_memfd("sparse", PAGE).unwrap();
        let big = memfd_create("big", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        ftruncate(&big, 1 << 40).unwrap();
        fcntl_add_seals(&big, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        let t = std::time::Instant::now();
        assert!(matches!(
            MappedFd::map_client(big, 0, 1 << 40),
            Err(ShmError::Sparse { size, allocated: 0 }) if size == 1 << 40
        ));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(matches!(MappedFd::map_client(sparse, 0, PAGE as u64), Err(ShmError::Sparse { .. })));
        // One page allocated of two: still a hole.
        let half = sealed_memfd_with("h", 2 * PAGE, SealFlags::SHRINK | SealFlags::GROW);
        fallocate(&half, FallocateFlags::empty(), 0, PAGE as u64).unwrap();
        assert!(matches!(MappedFd::map_client(half, 0, PAGE as u64), Err(ShmError::Sparse { .. })));
        // hugetlbfs, where the kernel has it (no pool needed to create one).
        if let Ok(h) =
            memfd_create("huge", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING | MemfdFlags::HUGETLB)
        {
            let _ = ftruncate(&h, 2 << 20);
            let _ = fcntl_add_seals(&h, SealFlags::SHRINK | SealFlags::GROW);
            assert!(matches!(MappedFd::map_client(h, 0, 2 << 20), Err(ShmError::HugeTlb)));
        }
    }

    fn sealed_memfd_with(name: &str, len: usize, seals: SealFlags) -> OwnedFd {
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        ftruncate(&fd, len as u64).unwrap();
        fcntl_add_seals(&fd, seals).unwrap();
        fd
    }

    #[test]
    fn window_maps_pages_at_offsets() {
        let w = Window::new(3 * PAGE).unwrap();
        let page = sealed_memfd("p", PAGE).unwrap();
        w.map_page(PAGE, page.as_fd()).unwrap();
        let theirs = MappedFd::map(page, 0, PAGE as u64).unwrap();
        // SAFETY: both pointers are in bounds of their mappings.
        unsafe {
            w.as_ptr().add(PAGE + 8).write_volatile(42);
            assert_eq!(theirs.as_ptr().add(8).read_volatile(), 42);
        }
        let p2 = sealed_memfd("p", PAGE).unwrap();
        assert!(w.map_page(3 * PAGE, p2.as_fd()).is_err());
        assert!(w.map_page(7, p2.as_fd()).is_err());
    }
}
