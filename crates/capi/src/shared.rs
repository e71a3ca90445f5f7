//! Shared host memory (a memfd, `tutti::SharedMemory`): the only host
//! memory a drive owned by `tuttid` (a runtime `daemon` drive) can reach.
//! Any runtime can register it too.

use std::ffi::c_void;

use tutti::SharedMemory;

use crate::ffi_util::{ffi_call, out, Fail};
use crate::status::tutti_status;

/// Shared host memory for I/O, made by `tutti_shared_memory_new` and freed
/// by `tutti_shared_memory_free`.
#[allow(non_camel_case_types)]
pub struct tutti_shared_memory {
    mem: SharedMemory,
}

/// Allocates `len` bytes (rounded up to whole 4 KiB pages, zeroed) of
/// shared memory and stores it in `*out_memory`. Its address is
/// `tutti_shared_memory_ptr`, its length `tutti_shared_memory_len`;
/// register that range with `tutti_register_memory` as any host memory.
///
/// Errors: `TUTTI_STATUS_NULL_ARGUMENT`, `TUTTI_STATUS_MEMORY` (zero
/// `len`, or the memfd could not be made or mapped).
#[no_mangle]
pub extern "C" fn tutti_shared_memory_new(
    len: usize,
    out_memory: *mut *mut tutti_shared_memory,
) -> tutti_status {
    ffi_call(|| {
        let dst = out(out_memory, "out_memory")?;
        let mem = SharedMemory::new(len)
            .map_err(|e| Fail::new(tutti_status::Memory, format!("shared memory of {len} bytes: {e}")))?;
        dst.write(Box::into_raw(Box::new(tutti_shared_memory { mem })));
        Ok(())
    })
}

/// The address of the first byte (page aligned); NULL for a NULL `memory`.
#[no_mangle]
pub extern "C" fn tutti_shared_memory_ptr(memory: *const tutti_shared_memory) -> *mut c_void {
    // SAFETY: non-null pointers come from `tutti_shared_memory_new` and
    // stay valid until `tutti_shared_memory_free` (the caller's contract).
    unsafe { memory.as_ref() }.map_or(std::ptr::null_mut(), |m| m.mem.as_ptr().cast())
}

/// Length in bytes (whole pages); 0 for a NULL `memory`.
#[no_mangle]
pub extern "C" fn tutti_shared_memory_len(memory: *const tutti_shared_memory) -> usize {
    // SAFETY: as in `tutti_shared_memory_ptr`.
    unsafe { memory.as_ref() }.map_or(0, |m| m.mem.len())
}

/// Frees shared memory. Unregister it from every runtime first (or destroy
/// those runtimes): a registered range must stay allocated. NULL is
/// ignored; the pointer must not be used again.
#[no_mangle]
pub extern "C" fn tutti_shared_memory_free(memory: *mut tutti_shared_memory) {
    if memory.is_null() {
        return;
    }
    // SAFETY: non-null, made by `Box::into_raw` in `tutti_shared_memory_new`
    // and (the caller's contract) not freed before: ownership comes back
    // here once.
    let m = unsafe { Box::from_raw(memory) };
    // A panic while unmapping is caught (there is no status to return).
    let _ = ffi_call(|| {
        drop(m);
        Ok(())
    });
}
