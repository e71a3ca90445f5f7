//! Zero-filled RAM for emulated media (the `ram` backing, named RAM
//! disks, undo logs): allocated lazily by the OS, with transparent huge
//! pages asked for, and a failed allocation an error rather than an abort.

use crate::EmuError;

/// A zero-initialised RAM area obtained with `alloc_zeroed`, so the OS
/// commits pages lazily, and allocation failure is an error, not an abort.
pub(crate) fn zeroed_vec(n: usize) -> Result<Vec<u8>, EmuError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).map_err(|_| EmuError::OutOfMemory { bytes: n as u64 })?;
    // SAFETY: non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(EmuError::OutOfMemory { bytes: n as u64 });
    }
    advise_huge_pages(p, n);
    // SAFETY: `p` was allocated by the global allocator with the layout of
    // `[u8; n]` (what Vec<u8> uses), is fully initialised (zeroed), and
    // length == capacity == n.
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// Asks Linux to back a large RAM store with transparent huge pages: the
/// first write to each 2 MiB then costs one fault instead of 512, which is
/// most of the cost of saving into a fresh emulated drive. Advisory only;
/// failure (or another OS) changes nothing but speed.
fn advise_huge_pages(p: *mut u8, n: usize) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = (p as usize).next_multiple_of(PAGE);
        let end = (p as usize + n) & !(PAGE - 1);
        if end > start && end - start >= 2 << 20 {
            // SAFETY: madvise only changes paging hints for pages inside
            // this allocation (rounded inwards to page boundaries); it does
            // not change their contents or validity.
            let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, n);
}
