//! Every raw system call of this crate: VFIO ioctls (Linux
//! `include/uapi/linux/vfio.h`, `Documentation/driver-api/vfio.rst`),
//! `mmap`/`munmap`, `mlock`/`munlock` and `access`. Nothing else in the
//! crate uses `unsafe`; each block here says why it is sound.
//!
//! Structures come from `vfio-bindings` (bindgen output of the uapi header,
//! with size and offset asserts); ioctl numbers are computed here and
//! pinned by a test against the values of the uapi header.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

use vfio_bindings::bindings::vfio as b;

/// `_IO(VFIO_TYPE, VFIO_BASE + n)`: VFIO ioctls carry no size or direction
/// bits (`_IOC_NONE`), so the number is `(type << 8) | nr`.
const fn vfio_io(n: u32) -> libc::c_ulong {
    (((b::VFIO_TYPE as u32) << 8) | (b::VFIO_BASE + n)) as libc::c_ulong
}

/// VFIO_GET_API_VERSION (container).
pub const VFIO_GET_API_VERSION: libc::c_ulong = vfio_io(0);
/// VFIO_CHECK_EXTENSION (container).
pub const VFIO_CHECK_EXTENSION: libc::c_ulong = vfio_io(1);
/// VFIO_SET_IOMMU (container).
pub const VFIO_SET_IOMMU: libc::c_ulong = vfio_io(2);
/// VFIO_GROUP_GET_STATUS (group).
pub const VFIO_GROUP_GET_STATUS: libc::c_ulong = vfio_io(3);
/// VFIO_GROUP_SET_CONTAINER (group).
pub const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = vfio_io(4);
/// VFIO_GROUP_UNSET_CONTAINER (group).
pub const VFIO_GROUP_UNSET_CONTAINER: libc::c_ulong = vfio_io(5);
/// VFIO_GROUP_GET_DEVICE_FD (group).
pub const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = vfio_io(6);
/// VFIO_DEVICE_GET_REGION_INFO (device).
pub const VFIO_DEVICE_GET_REGION_INFO: libc::c_ulong = vfio_io(8);
/// VFIO_IOMMU_GET_INFO (container, type1).
pub const VFIO_IOMMU_GET_INFO: libc::c_ulong = vfio_io(12);
/// VFIO_IOMMU_MAP_DMA (container, type1).
pub const VFIO_IOMMU_MAP_DMA: libc::c_ulong = vfio_io(13);
/// VFIO_IOMMU_UNMAP_DMA (container, type1).
pub const VFIO_IOMMU_UNMAP_DMA: libc::c_ulong = vfio_io(14);

pub use b::{
    vfio_region_info, VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION, VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE,
    VFIO_GROUP_FLAGS_VIABLE, VFIO_NOIOMMU_IOMMU, VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_REGION_INFO_FLAG_MMAP,
};

/// Converts an ioctl/libc return value to a result (`-1` -> errno).
fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// An ioctl whose argument is a plain integer.
fn ioctl_val(fd: RawFd, req: libc::c_ulong, arg: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the VFIO requests used with this helper (GET_API_VERSION,
    // CHECK_EXTENSION, SET_IOMMU, UNSET_CONTAINER) take an integer (or
    // nothing) by value; the kernel reads no user memory for them.
    cvt(unsafe { libc::ioctl(fd, req as _, arg) })
}

/// An ioctl whose argument points to `T`, which the kernel may read and write.
///
/// # Safety
///
/// `req` must be an ioctl that reads/writes at most `size_of::<T>()` bytes
/// at its argument (or `argsz` bytes, when `T` starts with an `argsz` that
/// the caller set no larger than `size_of::<T>()`).
unsafe fn ioctl_ptr<T>(fd: RawFd, req: libc::c_ulong, arg: *mut T) -> io::Result<libc::c_int> {
    // SAFETY: the caller guarantees the kernel stays inside `*arg`.
    cvt(unsafe { libc::ioctl(fd, req as _, arg) })
}

/// VFIO_GET_API_VERSION on a container fd (expects [`VFIO_API_VERSION`]).
pub fn get_api_version(container: &File) -> io::Result<i32> {
    ioctl_val(container.as_raw_fd(), VFIO_GET_API_VERSION, 0)
}

/// VFIO_CHECK_EXTENSION: 1 when the container supports IOMMU type `ext`.
pub fn check_extension(container: &File, ext: u32) -> io::Result<i32> {
    ioctl_val(container.as_raw_fd(), VFIO_CHECK_EXTENSION, ext as libc::c_ulong)
}

/// VFIO_SET_IOMMU: selects the IOMMU model (after a group is attached).
pub fn set_iommu(container: &File, kind: u32) -> io::Result<()> {
    ioctl_val(container.as_raw_fd(), VFIO_SET_IOMMU, kind as libc::c_ulong).map(drop)
}

/// VFIO_GROUP_GET_STATUS: the group's flags (`VFIO_GROUP_FLAGS_VIABLE`...).
pub fn group_flags(group: &File) -> io::Result<u32> {
    let mut st = b::vfio_group_status { argsz: size_of::<b::vfio_group_status>() as u32, flags: 0 };
    // SAFETY: GET_STATUS writes one vfio_group_status (argsz set to its size).
    unsafe { ioctl_ptr(group.as_raw_fd(), VFIO_GROUP_GET_STATUS, &mut st) }?;
    Ok(st.flags)
}

/// VFIO_GROUP_SET_CONTAINER: attaches the group to the container.
pub fn group_set_container(group: &File, container: &File) -> io::Result<()> {
    let mut fd: libc::c_int = container.as_raw_fd();
    // SAFETY: SET_CONTAINER reads one int (the container fd) at the pointer.
    unsafe { ioctl_ptr(group.as_raw_fd(), VFIO_GROUP_SET_CONTAINER, &mut fd) }.map(drop)
}

/// VFIO_GROUP_UNSET_CONTAINER: detaches the group (before closing).
pub fn group_unset_container(group: &File) -> io::Result<()> {
    ioctl_val(group.as_raw_fd(), VFIO_GROUP_UNSET_CONTAINER, 0).map(drop)
}

/// VFIO_GROUP_GET_DEVICE_FD for the device named `name` (its PCI address).
pub fn group_get_device_fd(group: &File, name: &str) -> io::Result<File> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: GET_DEVICE_FD reads a NUL-terminated string at the pointer;
    // `c` is one and outlives the call.
    let fd = unsafe { ioctl_ptr(group.as_raw_fd(), VFIO_GROUP_GET_DEVICE_FD, c.as_ptr().cast_mut()) }?;
    // SAFETY: on success the ioctl returned a new fd that we now own.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// VFIO_DEVICE_GET_REGION_INFO for region `index` (BAR0 = 0, config = 7).
pub fn region_info(device: &File, index: u32) -> io::Result<vfio_region_info> {
    let mut ri =
        vfio_region_info { argsz: size_of::<vfio_region_info>() as u32, index, ..Default::default() };
    // SAFETY: with argsz = size_of::<vfio_region_info>() the kernel writes at
    // most that many bytes (capabilities beyond it are only reported through
    // a larger argsz, which we do not ask for).
    unsafe { ioctl_ptr(device.as_raw_fd(), VFIO_DEVICE_GET_REGION_INFO, &mut ri) }?;
    Ok(ri)
}

/// VFIO_IOMMU_GET_INFO with its capability chain: the valid IOVA ranges
/// (inclusive) when the kernel reports `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`
/// (Linux 5.4+), else `None`.
pub fn iommu_iova_ranges(container: &File) -> io::Result<Option<Vec<(u64, u64)>>> {
    let hdr = size_of::<b::vfio_iommu_type1_info>();
    // First call with the bare struct to learn the full argsz.
    let mut buf = vec![0u64; hdr.div_ceil(8)];
    let mut argsz = hdr as u32;
    for _ in 0..2 {
        buf.resize((argsz as usize).div_ceil(8).max(hdr.div_ceil(8)), 0);
        buf.fill(0);
        let info = buf.as_mut_ptr().cast::<b::vfio_iommu_type1_info>();
        // SAFETY: `buf` is 8-byte aligned (Vec<u64>) and at least `argsz`
        // bytes long, and the kernel writes at most `argsz` bytes.
        unsafe {
            (*info).argsz = argsz;
            ioctl_ptr(container.as_raw_fd(), VFIO_IOMMU_GET_INFO, info)?;
        }
        // SAFETY: as above; the kernel filled the header.
        let (want, flags, cap_offset) = unsafe { ((*info).argsz, (*info).flags, (*info).cap_offset) };
        if want <= argsz {
            if flags & b::VFIO_IOMMU_INFO_CAPS == 0 || cap_offset == 0 {
                return Ok(None);
            }
            let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).take(argsz as usize).collect();
            return Ok(parse_iova_range_cap(&bytes, cap_offset as usize));
        }
        argsz = want;
    }
    Ok(None)
}

/// Walks a VFIO capability chain in `buf` (the whole `vfio_iommu_type1_info`
/// reply) from `first` and decodes the IOVA range capability: inclusive
/// `(start, end)` pairs. `None` when the chain has no such capability or is
/// malformed.
pub fn parse_iova_range_cap(buf: &[u8], first: usize) -> Option<Vec<(u64, u64)>> {
    let u16_at = |o: usize| buf.get(o..o + 2).map(|s| u16::from_ne_bytes([s[0], s[1]]));
    let u32_at = |o: usize| buf.get(o..o + 4).map(|s| u32::from_ne_bytes(s.try_into().unwrap_or([0; 4])));
    let u64_at = |o: usize| buf.get(o..o + 8).map(|s| u64::from_ne_bytes(s.try_into().unwrap_or([0; 8])));
    let mut off = first;
    for _ in 0..64 {
        // vfio_info_cap_header { u16 id; u16 version; u32 next; }
        let id = u16_at(off)?;
        let next = u32_at(off + 4)? as usize;
        if u32::from(id) == b::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
            // { header; u32 nr_iovas; u32 reserved; vfio_iova_range[] }
            let n = u32_at(off + 8)? as usize;
            let mut v = Vec::with_capacity(n.min(64));
            for i in 0..n {
                let o = off + 16 + i * 16;
                v.push((u64_at(o)?, u64_at(o + 8)?));
            }
            return Some(v);
        }
        if next == 0 || next <= off {
            return None;
        }
        off = next;
    }
    None
}

/// VFIO_IOMMU_MAP_DMA (read and write) of `size` bytes at host `vaddr` to `iova`.
///
/// # Safety
///
/// Until [`dma_unmap`] of the same `iova`/`size` succeeds, the device may
/// read and write `vaddr..vaddr + size` at any time: the memory must stay
/// allocated, and no Rust reference to it may exist while the device can
/// write it (only raw-pointer, atomic or volatile access), the standard of
/// `vfio-ioctls`' `vfio_dma_map`.
pub unsafe fn dma_map(container: &File, vaddr: usize, iova: u64, size: u64) -> io::Result<()> {
    let mut m = b::vfio_iommu_type1_dma_map {
        argsz: size_of::<b::vfio_iommu_type1_dma_map>() as u32,
        flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
        vaddr: vaddr as u64,
        iova,
        size,
    };
    // SAFETY: MAP_DMA reads one vfio_iommu_type1_dma_map; the lifetime
    // contract of the mapped memory is the caller's.
    unsafe { ioctl_ptr(container.as_raw_fd(), VFIO_IOMMU_MAP_DMA, &mut m) }.map(drop)
}

/// VFIO_IOMMU_UNMAP_DMA of `size` bytes at `iova`; returns the bytes unmapped.
pub fn dma_unmap(container: &File, iova: u64, size: u64) -> io::Result<u64> {
    let mut u = b::vfio_iommu_type1_dma_unmap {
        argsz: size_of::<b::vfio_iommu_type1_dma_unmap>() as u32,
        flags: 0,
        iova,
        size,
        ..Default::default()
    };
    // SAFETY: UNMAP_DMA reads and writes back one vfio_iommu_type1_dma_unmap
    // (argsz without the bitmap extension); it touches no other user memory.
    unsafe { ioctl_ptr(container.as_raw_fd(), VFIO_IOMMU_UNMAP_DMA, &mut u) }?;
    Ok(u.size)
}

/// A register window (a BAR) mapped shared and read/write from a file
/// (a VFIO device fd at the region's offset, or sysfs `resource0`),
/// wrapped in the crate-wide MMIO type. Unmapped on drop.
#[derive(Debug)]
pub struct MappedBar {
    mmio: nvm_queue::Mmio,
    base: usize,
    len: usize,
}

impl MappedBar {
    /// Maps `len` bytes of `fd` at `offset`.
    pub fn map(fd: &File, len: usize, offset: u64) -> io::Result<Self> {
        let offset =
            libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping chosen by the kernel (addr = NULL) cannot
        // alias any Rust object; failure is MAP_FAILED, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `p..p + len` is mapped read/write until `drop` unmaps it,
        // which happens only when `self` (and so this `Mmio`) goes away;
        // nothing in this crate creates references into it. Doorbells taken
        // from the Mmio are kept valid by their owners holding the device
        // (the `Mmio::doorbell` contract). mmap returns page-aligned memory.
        match unsafe { nvm_queue::Mmio::new(p.cast(), len) } {
            Ok(mmio) => Ok(Self { mmio, base: p as usize, len }),
            Err(_) => {
                // SAFETY: unmapping the mapping made just above, unused.
                unsafe { libc::munmap(p, len) };
                Err(io::Error::from(io::ErrorKind::InvalidData))
            }
        }
    }

    /// The mapped window.
    pub fn mmio(&self) -> &nvm_queue::Mmio {
        &self.mmio
    }
}

impl Drop for MappedBar {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is the mapping made in `map`; the only
        // handle to it, `self.mmio`, dies with `self`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Locks `len` bytes at `ptr` in RAM (faulting them in) for the no-IOMMU
/// fallback. This keeps the pages resident, but it does **not** fix their
/// physical frames: compaction and NUMA balancing may still migrate locked
/// pages, after which the device writes to a stale address. The fallback
/// is documented as unsafe for that reason (docs/real-drives.md).
pub fn mlock(ptr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: mlock only changes the residency of the pages; an invalid
    // range is reported as ENOMEM, not undefined behaviour.
    cvt(unsafe { libc::mlock(ptr.as_ptr().cast(), len) }).map(drop)
}

/// Undoes [`mlock`].
pub fn munlock(ptr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: as for mlock.
    cvt(unsafe { libc::munlock(ptr.as_ptr().cast(), len) }).map(drop)
}

/// `access(path, R_OK | W_OK)`: may this process open `path` read/write?
pub fn can_read_write(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: `c` is a valid NUL-terminated string for the call's duration.
    unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of the ioctl numbers in `include/uapi/linux/vfio.h`
    /// (`_IO(';', 100 + n)`), as `vfio-ioctls` also pins them.
    #[test]
    fn ioctl_numbers_are_pinned() {
        assert_eq!(VFIO_GET_API_VERSION, 0x3B64);
        assert_eq!(VFIO_CHECK_EXTENSION, 0x3B65);
        assert_eq!(VFIO_SET_IOMMU, 0x3B66);
        assert_eq!(VFIO_GROUP_GET_STATUS, 0x3B67);
        assert_eq!(VFIO_GROUP_SET_CONTAINER, 0x3B68);
        assert_eq!(VFIO_GROUP_UNSET_CONTAINER, 0x3B69);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3B6A);
        assert_eq!(VFIO_DEVICE_GET_REGION_INFO, 0x3B6C);
        assert_eq!(VFIO_IOMMU_GET_INFO, 0x3B70);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3B71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3B72);
        assert_eq!((VFIO_TYPE1v2_IOMMU, VFIO_NOIOMMU_IOMMU, VFIO_API_VERSION), (3, 8, 0));
        assert_eq!((VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX), (0, 7));
        assert_eq!(size_of::<b::vfio_iommu_type1_dma_map>(), 32);
        assert_eq!(size_of::<b::vfio_iommu_type1_dma_unmap>(), 24);
    }

    #[test]
    fn iova_range_capability_chain() {
        // info header (24 bytes), then a migration cap (id 2) at 24 pointing
        // to the IOVA range cap (id 1) at 56 with two ranges.
        let mut buf = vec![0u8; 56 + 16 + 32];
        buf[24..26].copy_from_slice(&2u16.to_ne_bytes());
        buf[28..32].copy_from_slice(&56u32.to_ne_bytes());
        buf[56..58].copy_from_slice(&1u16.to_ne_bytes());
        buf[64..68].copy_from_slice(&2u32.to_ne_bytes());
        for (i, (s, e)) in [(0u64, 0xFEDF_FFFFu64), (0xFEF0_0000, 0x7F_FFFF_FFFF)].iter().enumerate() {
            let o = 72 + i * 16;
            buf[o..o + 8].copy_from_slice(&s.to_ne_bytes());
            buf[o + 8..o + 16].copy_from_slice(&e.to_ne_bytes());
        }
        assert_eq!(
            parse_iova_range_cap(&buf, 24),
            Some(vec![(0, 0xFEDF_FFFF), (0xFEF0_0000, 0x7F_FFFF_FFFF)])
        );
        // Truncated or looping chains decode to None, never panic.
        assert_eq!(parse_iova_range_cap(&buf[..80], 24), None);
        let mut looped = buf.clone();
        looped[56..58].copy_from_slice(&9u16.to_ne_bytes());
        looped[60..64].copy_from_slice(&24u32.to_ne_bytes());
        assert_eq!(parse_iova_range_cap(&looped, 24), None);
    }
}
