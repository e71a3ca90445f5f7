//! Memory registration: host memory (a pointer) and GPU memory (a CUDA
//! device pointer) into memory handles (u64) that requests name.

use std::ffi::c_void;

use tutti::MemoryHandle;

use crate::ffi_util::{arg, ffi_call, out};
use crate::runtime::tutti_runtime;
use crate::status::tutti_status;

/// Registers `len` bytes of host memory at `ptr` for I/O (maps its pages
/// for DMA on every drive, once) and stores the memory handle in
/// `*out_memory`. Requests then name it by handle and a byte offset.
///
/// Contract (not checkable here; breaking it is undefined behaviour): until
/// `tutti_unregister_memory` succeeds for the handle (or the runtime is
/// destroyed) the memory stays allocated; while an operation reading into
/// it is in flight (submitted, not yet returned by a wait) the caller
/// neither reads nor writes it, nor writes memory a write operation is
/// reading. After `TUTTI_OUTCOME_TIMEOUT` a drive may still write it until
/// `tutti_unregister_memory` succeeds.
///
/// Errors: `TUTTI_STATUS_NULL_ARGUMENT` (`runtime`, `out_memory`),
/// `TUTTI_STATUS_MEMORY` (NULL `ptr`, zero `len`, a range that wraps, a
/// mapping a device refused), `TUTTI_STATUS_TOO_MANY_HANDLES`,
/// `TUTTI_STATUS_SHUTTING_DOWN`.
#[no_mangle]
pub extern "C" fn tutti_register_memory(
    runtime: *const tutti_runtime,
    ptr: *mut c_void,
    len: usize,
    out_memory: *mut u64,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let dst = out(out_memory, "out_memory")?;
        // SAFETY: forwarded to the caller by this function's contract
        // (documented above and in tutti.h): the memory outlives the
        // registration and is not touched while I/O on it runs. A NULL
        // pointer or zero length is refused by the runtime.
        let m = unsafe { rt.rt.register_memory(ptr.cast::<u8>(), len) }?;
        dst.write(m.to_u64());
        Ok(())
    })
}

/// Registers `len` bytes of GPU memory at CUDA device pointer `device_ptr`
/// (in the runtime's CUDA context, GPU 0) and stores the memory handle in
/// `*out_memory`. Needs a datapath with `execution: gpu`. Contract as for
/// `tutti_register_memory`: the allocation outlives the registration and is
/// not touched while an operation on it is in flight.
///
/// Errors: `TUTTI_STATUS_NULL_ARGUMENT`, `TUTTI_STATUS_MEMORY` (no GPU
/// datapath, a zero pointer or length, a drive that would need peer DMA),
/// `TUTTI_STATUS_GPU`, `TUTTI_STATUS_TOO_MANY_HANDLES`,
/// `TUTTI_STATUS_SHUTTING_DOWN`.
#[no_mangle]
pub extern "C" fn tutti_register_gpu_memory(
    runtime: *const tutti_runtime,
    device_ptr: u64,
    len: usize,
    out_memory: *mut u64,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let dst = out(out_memory, "out_memory")?;
        // SAFETY: forwarded to the caller by this function's contract, as
        // for `tutti_register_memory`; a zero pointer or length is refused
        // by the runtime.
        let m = unsafe { rt.rt.register_gpu_memory(device_ptr, len) }?;
        dst.write(m.to_u64());
        Ok(())
    })
}

/// Unregisters memory (host or GPU); the handle is stale afterwards and the
/// memory is the caller's again. Errors: `TUTTI_STATUS_NULL_ARGUMENT`,
/// `TUTTI_STATUS_HANDLE`, `TUTTI_STATUS_MEMORY_BUSY` (an operation using it
/// was not waited on yet, or a timed-out command may still write it: wait,
/// then try again).
#[no_mangle]
pub extern "C" fn tutti_unregister_memory(runtime: *const tutti_runtime, memory: u64) -> tutti_status {
    ffi_call(|| {
        arg(runtime, "runtime")?.rt.unregister_memory(MemoryHandle::from_u64(memory))?;
        Ok(())
    })
}
