//! The emulator's IOVA space: device addresses handed out by
//! [`nvm_queue::NvmeDevice::dma_map`], and the only code that touches host
//! memory on the controller's behalf.
//!
//! Device addresses start at [`IOVA_BASE`] (so that a driver handing the
//! device a host pointer is caught, and tests see realistic 64-bit
//! addresses), are page aligned, are never reused, and every mapping is
//! followed by at least one unmapped guard page, so running off the end of
//! a buffer is a fault rather than an access to the next buffer.
//!
//! The region table sits behind a [`RwLock`]. The controller thread holds
//! the read side for a whole poll iteration ([`IovaSpace::view`]), which
//! makes each lookup a plain search; [`IovaSpace::unmap`] takes the write
//! side, so it waits until the batch that may be touching the range has
//! ended, and after it returns the controller can no longer reach the
//! memory.
//!
//! Mapped memory is shared with the driver's threads, so it is accessed
//! only with `ptr::copy_nonoverlapping` and atomics, never through Rust
//! references.
//!
//! Every mapping carries a DMA domain (an owner tag, as an IOMMU domain or
//! PASID would be on a real host): [`SHARED_DOMAIN`] (0) for the
//! controller's owner, or the tag of one client of a daemon. While the
//! controller executes a command from an SQ of domain `D != 0`
//! ([`DmaView::set_domain`]), every data buffer and PRP list page it
//! touches must lie in a mapping of domain `D`; anything else is a fault
//! (counted apart from unmapped addresses, [`DmaView::take_foreign`]), and
//! the foreign memory is not touched. Commands from SQs of domain 0 (the
//! admin queue, and every SQ of an emulator whose owner never sets a
//! domain) reach every mapping, as before.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use nvm_queue::{DeviceError, DmaMapping, HOST_PAGE_SIZE};

use crate::external::{ExternalMemory, PendingCopies};

/// The DMA domain of the controller's owner: mappings made with
/// [`nvm_queue::NvmeDevice::dma_map`] and SQs whose domain was never set.
/// An SQ of this domain reaches every mapping.
pub const SHARED_DOMAIN: u32 = 0;

/// First device address handed out.
pub const IOVA_BASE: u64 = 0x1_0000_0000;

const PAGE: u64 = HOST_PAGE_SIZE as u64;

/// An access to device addresses that are not entirely inside one mapped
/// region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DmaFault {
    /// First device address of the access.
    pub iova: u64,
    /// Length of the access in bytes.
    pub len: usize,
}

#[derive(Debug, Clone, Copy)]
struct Region {
    /// Device address of the first byte.
    iova: u64,
    /// Exact mapped length in bytes (not rounded).
    len: u64,
    /// Host address of the first byte (dangling for external memory).
    host: NonNull<u8>,
    /// Index into `Regions::external` for memory the emulator reaches
    /// through copies (GPU memory), `None` for host memory.
    external: Option<u32>,
    /// The DMA domain it was mapped in ([`SHARED_DOMAIN`] or a client's).
    domain: u32,
}

#[derive(Debug)]
struct Regions {
    /// Regions by start address.
    map: BTreeMap<u64, Region>,
    /// Next free device address (page aligned).
    next: u64,
    /// External memories, by `Region::external`.
    external: Vec<Option<Arc<dyn ExternalMemory>>>,
}

/// The table of DMA mappings of one emulated controller.
#[derive(Debug)]
pub(crate) struct IovaSpace {
    regions: RwLock<Regions>,
}

// SAFETY: the host pointers in the table are only dereferenced through
// copies and atomics while the read lock is held; `dma_map`'s contract keeps
// the memory alive until `unmap`, which takes the write lock.
unsafe impl Send for IovaSpace {}
// SAFETY: as above; the table itself is protected by the RwLock.
unsafe impl Sync for IovaSpace {}

impl IovaSpace {
    pub(crate) fn new() -> Self {
        Self { regions: RwLock::new(Regions { map: BTreeMap::new(), next: IOVA_BASE, external: Vec::new() }) }
    }

    /// Maps `len` bytes at `host` (page aligned, `len > 0`) in DMA domain
    /// `domain` and returns their device addresses.
    pub(crate) fn map(&self, host: NonNull<u8>, len: usize, domain: u32) -> Result<DmaMapping, DeviceError> {
        let addr = host.as_ptr() as usize;
        let bad = DeviceError::BadRange { addr, len };
        if len == 0 || addr & (HOST_PAGE_SIZE - 1) != 0 || addr.checked_add(len).is_none() {
            return Err(bad);
        }
        let mut r = self.regions.write().unwrap_or_else(|e| e.into_inner());
        Self::insert(&mut r, Region { iova: 0, len: len as u64, host, external: None, domain })
    }

    /// Maps external memory (see [`ExternalMemory`]) for data transfers.
    pub(crate) fn map_external(&self, mem: Arc<dyn ExternalMemory>) -> Result<DmaMapping, DeviceError> {
        let len =
            usize::try_from(mem.len()).map_err(|_| DeviceError::BadRange { addr: 0, len: usize::MAX })?;
        if len == 0 {
            return Err(DeviceError::BadRange { addr: 0, len });
        }
        let mut r = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let index =
            u32::try_from(r.external.len()).map_err(|_| DeviceError::AddressSpaceExhausted { len })?;
        let m = Self::insert(
            &mut r,
            Region {
                iova: 0,
                len: len as u64,
                host: NonNull::dangling(),
                external: Some(index),
                domain: SHARED_DOMAIN,
            },
        )?;
        r.external.push(Some(mem));
        Ok(m)
    }

    fn insert(r: &mut Regions, mut region: Region) -> Result<DmaMapping, DeviceError> {
        let len = region.len as usize;
        let iova = r.next;
        let next = region
            .len
            .checked_next_multiple_of(PAGE)
            .and_then(|l| l.checked_add(PAGE)) // guard page
            .and_then(|l| iova.checked_add(l))
            .ok_or(DeviceError::AddressSpaceExhausted { len })?;
        r.next = next;
        region.iova = iova;
        r.map.insert(iova, region);
        Ok(DmaMapping::contiguous(iova, len))
    }

    /// Removes the mapping starting at the mapping's first device address.
    /// Waits for the controller's current batch to end.
    pub(crate) fn unmap(&self, mapping: &DmaMapping) -> Result<(), DeviceError> {
        let iova = mapping.pages().first().copied().unwrap_or(0);
        let mut r = self.regions.write().unwrap_or_else(|e| e.into_inner());
        match r.map.get(&iova) {
            Some(reg) if reg.len.div_ceil(PAGE) == mapping.pages().len() as u64 => {
                if let Some(i) = reg.external {
                    if let Some(slot) = r.external.get_mut(i as usize) {
                        *slot = None;
                    }
                }
                r.map.remove(&iova);
                Ok(())
            }
            _ => Err(DeviceError::NotMapped { iova }),
        }
    }

    /// Locks the table for reading (one controller poll iteration).
    pub(crate) fn view(&self) -> DmaView<'_> {
        DmaView {
            guard: self.regions.read().unwrap_or_else(|e| e.into_inner()),
            cache: Default::default(),
            next: Cell::new(0),
            started: RefCell::new(Vec::new()),
            copies: Cell::new(0),
            domain: Cell::new(SHARED_DOMAIN),
            foreign: Cell::new(false),
        }
    }
}

/// Read access to the region table for one poll iteration: checked copies
/// to and from device addresses.
pub(crate) struct DmaView<'a> {
    guard: RwLockReadGuard<'a, Regions>,
    /// Small lookup cache: an iteration mostly touches a few buffers (the
    /// SQ, the CQ, a data buffer, a PRP list), so a handful of entries,
    /// replaced round robin, spares the tree walk on nearly every access.
    cache: [Cell<Option<Region>>; CACHE],
    next: Cell<usize>,
    /// External memories (by `Region::external`) on which the current
    /// command started asynchronous copies; [`DmaView::take_copies`]
    /// collects them.
    started: RefCell<Vec<u32>>,
    /// Asynchronous copies started through this view so far (a command
    /// started some when this moved during its execution).
    copies: Cell<u64>,
    /// DMA domain of the command being executed ([`SHARED_DOMAIN`]: any
    /// mapping may be reached).
    domain: Cell<u32>,
    /// An access was refused because its mapping belongs to another domain
    /// (since the last [`DmaView::take_foreign`] or
    /// [`DmaView::set_domain`]).
    foreign: Cell<bool>,
}

/// Entries of [`DmaView`]'s lookup cache.
const CACHE: usize = 4;

impl DmaView<'_> {
    fn find(&self, iova: u64) -> Option<Region> {
        for c in &self.cache {
            if let Some(r) = c.get() {
                if iova >= r.iova && iova - r.iova < r.len {
                    return Some(r);
                }
            }
        }
        let (_, r) = self.guard.map.range(..=iova).next_back()?;
        if iova - r.iova < r.len {
            let i = self.next.get();
            self.cache[i].set(Some(*r));
            self.next.set((i + 1) % CACHE);
            Some(*r)
        } else {
            None
        }
    }

    /// Host address of `iova..iova + len` when the whole range lies in one
    /// region.
    fn resolve(&self, iova: u64, len: usize) -> Result<*mut u8, DmaFault> {
        let (r, off) = self.locate(iova, len)?;
        Self::host_at(&r, off).ok_or(DmaFault { iova, len })
    }

    /// Host address of byte `off` of region `r` (found by `locate`, so
    /// `off` plus the access length lies inside it); `None` for external
    /// memory, which only copies (read/write/zero) reach.
    fn host_at(r: &Region, off: u64) -> Option<*mut u8> {
        if r.external.is_some() {
            return None;
        }
        // SAFETY: `locate` checked off + len <= r.len, so the pointer stays
        // inside the mapped host range (which `dma_map`'s contract keeps
        // allocated).
        Some(unsafe { r.host.as_ptr().add(off as usize) })
    }

    /// The region holding all of `iova..iova + len`, and the offset in it;
    /// a fault also when the region belongs to another DMA domain than the
    /// current command's (noted for [`DmaView::take_foreign`]).
    #[inline]
    fn locate(&self, iova: u64, len: usize) -> Result<(Region, u64), DmaFault> {
        let fault = DmaFault { iova, len };
        let r = self.find(iova).ok_or(fault)?;
        let domain = self.domain.get();
        if domain != SHARED_DOMAIN && r.domain != domain {
            self.foreign.set(true);
            return Err(fault);
        }
        let off = iova - r.iova;
        match off.checked_add(len as u64) {
            Some(end) if end <= r.len => Ok((r, off)),
            _ => Err(fault),
        }
    }

    /// Sets the DMA domain of the accesses that follow (the command about
    /// to execute comes from an SQ of `domain`; [`SHARED_DOMAIN`] after
    /// it) and forgets an earlier refused foreign access.
    #[inline]
    pub(crate) fn set_domain(&self, domain: u32) {
        self.domain.set(domain);
        self.foreign.set(false);
    }

    /// Whether an access was refused for belonging to another domain since
    /// the last call (or [`DmaView::set_domain`]); clears the note.
    pub(crate) fn take_foreign(&self) -> bool {
        self.foreign.replace(false)
    }

    /// The external memory of region `r`, if it is one.
    fn external(&self, r: &Region) -> Option<&dyn ExternalMemory> {
        let i = r.external? as usize;
        self.guard.external.get(i)?.as_deref()
    }

    /// Checks that `iova..iova + len` lies in one mapped region.
    pub(crate) fn check(&self, iova: u64, len: usize) -> Result<(), DmaFault> {
        self.locate(iova, len).map(|_| ())
    }

    /// Copies `dst.len()` bytes from device address `iova` into `dst`.
    pub(crate) fn read(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        if dst.is_empty() {
            return Ok(());
        }
        let (r, off) = self.locate(iova, dst.len())?;
        if r.external.is_some() {
            let ok = self.external(&r).is_some_and(|m| m.read(off, dst));
            return if ok { Ok(()) } else { Err(DmaFault { iova, len: dst.len() }) };
        }
        let src = self.resolve(iova, dst.len())?;
        // SAFETY: `src..src + dst.len()` is mapped host memory (resolve), the
        // region cannot be unmapped while `self` holds the read lock, and
        // `dst` is our own buffer, distinct from DMA memory.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` to device address `iova`.
    pub(crate) fn write(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        if src.is_empty() {
            return Ok(());
        }
        let (r, off) = self.locate(iova, src.len())?;
        if r.external.is_some() {
            let ok = self.external(&r).is_some_and(|m| m.write(off, src));
            return if ok { Ok(()) } else { Err(DmaFault { iova, len: src.len() }) };
        }
        let dst = self.resolve(iova, src.len())?;
        // SAFETY: as in `read`, with the direction reversed.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies `src` to device address `iova`, as [`DmaView::write`], except
    /// that external memory with asynchronous copies only starts the copy
    /// ([`ExternalMemory::start_write`]); [`DmaView::take_copies`] then
    /// returns what the command must wait for before its completion.
    ///
    /// # Safety
    ///
    /// `src` must stay allocated and unchanged until those copies have
    /// ended: it is the controller's RAM media, which the controller
    /// neither frees nor writes (power loss, reset, exit) before waiting
    /// for every copy in flight. Commands in flight together that overlap
    /// on the media have no defined result, as on a real drive.
    pub(crate) unsafe fn write_from_media(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        if src.is_empty() {
            return Ok(());
        }
        let (r, off) = self.locate(iova, src.len())?;
        if let Some(dst) = Self::host_at(&r, off) {
            // SAFETY: as in `write`: mapped host memory, held by the read
            // lock; `src` is the media, distinct from DMA memory.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
            return Ok(());
        }
        let Some(mem) = self.external(&r) else { return Err(DmaFault { iova, len: src.len() }) };
        let ptr = NonNull::from(src).cast::<u8>();
        // SAFETY: forwarded from this function's contract.
        match unsafe { mem.start_write(off, ptr, src.len()) } {
            None => self.write(iova, src),
            Some(ok) => self.started(&r, ok, iova, src.len()),
        }
    }

    /// Copies from device address `iova` into `dst`, as [`DmaView::read`],
    /// except that external memory with asynchronous copies only starts
    /// the copy (see [`DmaView::write_from_media`]).
    ///
    /// # Safety
    ///
    /// As for [`DmaView::write_from_media`]: `dst` is the controller's RAM
    /// media, not read or written by the controller until the copies end.
    pub(crate) unsafe fn read_into_media(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        if dst.is_empty() {
            return Ok(());
        }
        let (r, off) = self.locate(iova, dst.len())?;
        if let Some(src) = Self::host_at(&r, off) {
            // SAFETY: as in `read`.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
            return Ok(());
        }
        let Some(mem) = self.external(&r) else { return Err(DmaFault { iova, len: dst.len() }) };
        let len = dst.len();
        let ptr = NonNull::from(&mut *dst).cast::<u8>();
        // SAFETY: forwarded from this function's contract.
        match unsafe { mem.start_read(off, ptr, len) } {
            None => self.read(iova, dst),
            Some(ok) => self.started(&r, ok, iova, len),
        }
    }

    /// Records that a copy was started on region `r` (even one that failed
    /// to start: copies before it on that memory may still run).
    fn started(&self, r: &Region, ok: bool, iova: u64, len: usize) -> Result<(), DmaFault> {
        if let Some(i) = r.external {
            let mut v = self.started.borrow_mut();
            if !v.contains(&i) {
                v.push(i);
            }
        }
        self.copies.set(self.copies.get() + 1);
        if ok {
            Ok(())
        } else {
            Err(DmaFault { iova, len })
        }
    }

    /// Asynchronous copies started through this view so far.
    pub(crate) fn copies_started(&self) -> u64 {
        self.copies.get()
    }

    /// One fence per memory behind every copy started asynchronously since
    /// the last call (`None` when none was), each holding its memory;
    /// resets the record for the next burst.
    pub(crate) fn take_copies(&self) -> Option<PendingCopies> {
        let mut started = self.started.borrow_mut();
        if started.is_empty() {
            return None;
        }
        let fences = started
            .drain(..)
            .filter_map(|i| self.guard.external.get(i as usize)?.clone())
            .map(|mem| {
                let f = mem.fence();
                (mem, f)
            })
            .collect();
        Some(PendingCopies::new(fences))
    }

    /// Writes `len` zero bytes at `iova`.
    pub(crate) fn zero(&self, iova: u64, len: usize) -> Result<(), DmaFault> {
        if len == 0 {
            return Ok(());
        }
        let (r, _) = self.locate(iova, len)?;
        if r.external.is_some() {
            let zeros = [0u8; 4096];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(zeros.len());
                self.write(iova + done as u64, &zeros[..n])?;
                done += n;
            }
            return Ok(());
        }
        let dst = self.resolve(iova, len)?;
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes(dst, 0, len) };
        Ok(())
    }

    /// Atomic 32-bit load at a 4-byte-aligned device address.
    #[allow(dead_code)]
    pub(crate) fn load_u32(&self, iova: u64, order: Ordering) -> Result<u32, DmaFault> {
        let p = self.resolve(iova, 4)?;
        if p as usize & 3 != 0 {
            return Err(DmaFault { iova, len: 4 });
        }
        // SAFETY: in a mapped region, 4-byte aligned (checked), accessed
        // only atomically by the controller.
        Ok(unsafe { AtomicU32::from_ptr(p.cast()) }.load(order))
    }

    /// Atomic 32-bit store at a 4-byte-aligned device address.
    pub(crate) fn store_u32(&self, iova: u64, value: u32, order: Ordering) -> Result<(), DmaFault> {
        let p = self.resolve(iova, 4)?;
        if p as usize & 3 != 0 {
            return Err(DmaFault { iova, len: 4 });
        }
        // SAFETY: as in `load_u32`.
        unsafe { AtomicU32::from_ptr(p.cast()) }.store(value, order);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{alloc_zeroed, dealloc, Layout};

    #[test]
    fn map_lookup_unmap() {
        let layout = Layout::from_size_align(3 * 4096, 4096).unwrap();
        // SAFETY: non-zero size.
        let p = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        let space = IovaSpace::new();
        let a = space.map(p, 4096, SHARED_DOMAIN).unwrap();
        // SAFETY: in bounds of the allocation.
        let p2 = unsafe { NonNull::new_unchecked(p.as_ptr().add(4096)) };
        let b = space.map(p2, 2 * 4096 - 100, SHARED_DOMAIN).unwrap();
        assert_eq!(a.pages(), &[IOVA_BASE]);
        assert_eq!(b.pages()[0], IOVA_BASE + 2 * 4096, "guard page between mappings");
        {
            let v = space.view();
            v.write(IOVA_BASE + 8, &[1, 2, 3]).unwrap();
            let mut buf = [0u8; 3];
            v.read(IOVA_BASE + 8, &mut buf).unwrap();
            assert_eq!(buf, [1, 2, 3]);
            assert!(v.read(IOVA_BASE + 4090, &mut [0u8; 8]).is_err(), "crosses into the guard");
            assert!(v.check(IOVA_BASE + 4096, 1).is_err());
            assert!(v.check(b.pages()[0] + 2 * 4096 - 101, 1).is_ok());
            assert!(v.check(b.pages()[0] + 2 * 4096 - 100, 1).is_err(), "past exact length");
            assert!(v.check(0, 1).is_err());
            assert!(v.zero(IOVA_BASE + 4096, 0).is_ok(), "empty accesses touch nothing");
            assert!(v.check(u64::MAX, 4).is_err());
            v.store_u32(IOVA_BASE + 16, 7, Ordering::Release).unwrap();
            assert_eq!(v.load_u32(IOVA_BASE + 16, Ordering::Acquire).unwrap(), 7);
            assert!(v.load_u32(IOVA_BASE + 17, Ordering::Acquire).is_err());
        }
        assert!(space.map(p, 0, SHARED_DOMAIN).is_err());
        // SAFETY: in bounds.
        let unaligned = unsafe { NonNull::new_unchecked(p.as_ptr().add(8)) };
        assert!(matches!(space.map(unaligned, 8, SHARED_DOMAIN), Err(DeviceError::BadRange { .. })));
        space.unmap(&a).unwrap();
        assert!(matches!(space.unmap(&a), Err(DeviceError::NotMapped { .. })));
        assert!(space.view().check(IOVA_BASE, 1).is_err());
        space.unmap(&b).unwrap();
        // SAFETY: allocated above with this layout; no longer mapped.
        unsafe { dealloc(p.as_ptr(), layout) };
    }

    #[test]
    fn a_domain_reaches_only_its_own_mappings() {
        let layout = Layout::from_size_align(3 * 4096, 4096).unwrap();
        // SAFETY: non-zero size.
        let p = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        // SAFETY: in bounds of the allocation.
        let at = |i: usize| unsafe { NonNull::new_unchecked(p.as_ptr().add(i * 4096)) };
        let space = IovaSpace::new();
        let own = space.map(at(0), 4096, SHARED_DOMAIN).unwrap().pages()[0];
        let a = space.map(at(1), 4096, 7).unwrap().pages()[0];
        let b = space.map(at(2), 4096, 8).unwrap().pages()[0];
        {
            let v = space.view();
            // Domain 0 (the default) reaches every mapping.
            for iova in [own, a, b] {
                v.write(iova, &[1]).unwrap();
            }
            assert!(!v.take_foreign());
            v.set_domain(7);
            v.write(a + 1, &[2]).unwrap();
            assert!(!v.take_foreign(), "own domain");
            assert!(v.write(b + 1, &[3]).is_err());
            assert!(v.take_foreign(), "noted as foreign");
            assert!(!v.take_foreign(), "note cleared by take");
            assert!(v.read(own, &mut [0u8; 1]).is_err(), "the owner's memory is foreign too");
            assert!(v.zero(b, 8).is_err());
            assert!(v.store_u32(b + 4, 9, Ordering::Relaxed).is_err());
            assert!(v.check(b, 1).is_err());
            assert!(v.take_foreign());
            assert!(v.check(b + 4096, 1).is_err(), "unmapped: a fault");
            assert!(!v.take_foreign(), "but not a foreign one");
            v.set_domain(SHARED_DOMAIN);
            let mut got = [0u8; 8];
            v.read(b, &mut got).unwrap();
            assert_eq!(got, [1, 0, 0, 0, 0, 0, 0, 0], "domain 8 memory untouched by domain 7");
        }
        drop(space);
        // SAFETY: allocated above with this layout; the space that mapped
        // it is dropped.
        unsafe { dealloc(p.as_ptr(), layout) };
    }
}
