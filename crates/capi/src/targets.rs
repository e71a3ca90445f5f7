//! Targets: `tutti://<store>/<key>` URIs opened into target handles (u64),
//! their sizes, and closing them.

use std::ffi::c_char;

use tutti::TargetHandle;

use crate::ffi_util::{arg, c_str, ffi_call, out, out_array, slice_in, Fail};
use crate::runtime::tutti_runtime;
use crate::status::tutti_status;

/// Opens `uri` (NUL-terminated UTF-8, `tutti://<store>/<key>`; for a slab
/// store the key is the slot number, e.g. `tutti://kv/7`) and stores its
/// target handle in `*out_target`. A handle is a u64 minted by this
/// runtime; it stays valid until `tutti_close`.
///
/// Errors: `TUTTI_STATUS_NULL_ARGUMENT`, `TUTTI_STATUS_INVALID_ARGUMENT`
/// (not UTF-8), `TUTTI_STATUS_URI` (malformed, unknown store, key refused),
/// `TUTTI_STATUS_TOO_MANY_HANDLES`, `TUTTI_STATUS_SHUTTING_DOWN`.
#[no_mangle]
pub extern "C" fn tutti_open(
    runtime: *const tutti_runtime,
    uri: *const c_char,
    out_target: *mut u64,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let dst = out(out_target, "out_target")?;
        dst.write(rt.rt.open(c_str(uri, "uri")?)?.to_u64());
        Ok(())
    })
}

/// Opens `n` URIs (`uris`: `n` pointers to NUL-terminated UTF-8 strings).
/// For each `i`, `out_targets[i]` gets its handle (0 when it failed) and
/// `out_statuses[i]` its status; both arrays hold `n` entries.
///
/// Returns `TUTTI_STATUS_OK` when every URI opened; otherwise the status of
/// the first that failed, with its message as the last error (the others
/// are still opened and must be closed). Errors of the call itself (nothing
/// opened): `TUTTI_STATUS_NULL_ARGUMENT` (a NULL array),
/// `TUTTI_STATUS_INVALID_ARGUMENT` (`n` is 0). A NULL entry of `uris` is
/// `TUTTI_STATUS_NULL_ARGUMENT` in its own status.
#[no_mangle]
pub extern "C" fn tutti_open_batch(
    runtime: *const tutti_runtime,
    uris: *const *const c_char,
    n: usize,
    out_targets: *mut u64,
    out_statuses: *mut tutti_status,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let uris = slice_in(uris, n, "uris")?;
        let targets = out_array(out_targets, n, "out_targets")?;
        let statuses = out_array(out_statuses, n, "out_statuses")?;
        let mut first: Option<Fail> = None;
        for (i, &u) in uris.iter().enumerate() {
            let r = c_str(u, "the URI").and_then(|u| rt.rt.open(u).map_err(Fail::from));
            match r {
                Ok(t) => {
                    targets.write(i, t.to_u64());
                    statuses.write(i, tutti_status::Ok);
                }
                Err(f) => {
                    targets.write(i, 0);
                    statuses.write(i, f.status);
                    first.get_or_insert(Fail::new(f.status, format!("uris[{i}]: {}", f.message)));
                }
            }
        }
        first.map_or(Ok(()), Err)
    })
}

/// Stores the size in bytes of target `target` in `*out_len`. Errors:
/// `TUTTI_STATUS_NULL_ARGUMENT`, `TUTTI_STATUS_HANDLE` (stale, foreign or
/// forged).
#[no_mangle]
pub extern "C" fn tutti_target_len(
    runtime: *const tutti_runtime,
    target: u64,
    out_len: *mut u64,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let dst = out(out_len, "out_len")?;
        dst.write(rt.rt.target_len(TargetHandle::from_u64(target))?);
        Ok(())
    })
}

/// Closes a target; its handle (and every copy) is stale afterwards
/// (a request naming it is `TUTTI_OUTCOME_NOT_ACCEPTED`). Operations
/// already submitted on it run to completion. Errors:
/// `TUTTI_STATUS_NULL_ARGUMENT`, `TUTTI_STATUS_HANDLE`.
#[no_mangle]
pub extern "C" fn tutti_close(runtime: *const tutti_runtime, target: u64) -> tutti_status {
    ffi_call(|| {
        arg(runtime, "runtime")?.rt.close(TargetHandle::from_u64(target))?;
        Ok(())
    })
}
