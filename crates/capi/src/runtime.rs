//! The runtime object: creation (YAML text, YAML file, built-in emulated
//! default), destruction, shutdown, counters, store and drive facts, drive
//! reset.

use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tutti::config::MAX_STRIPE_DRIVES;
use tutti::{Config, Runtime};

use crate::ffi_util::{arg, c_str, copy_out_str, ffi_call, out, Fail};
use crate::status::tutti_status;

/// Drives of the built-in emulated default (`tutti_runtime_new_emulated`).
pub const TUTTI_EMULATED_DEFAULT_DRIVES: u32 = 4;
/// Bytes per drive of the built-in emulated default (256 MiB).
pub const TUTTI_EMULATED_DEFAULT_BYTES_PER_DRIVE: u64 = 256 << 20;
/// Slot size in bytes of the built-in emulated default (1 MiB): each
/// `tutti://kv/<n>` target is one slot of this size.
pub const TUTTI_EMULATED_DEFAULT_SLOT_BYTES: u64 = 1 << 20;

/// A tutti runtime: drives, stores and the handle tables, behind an opaque
/// pointer made by a `tutti_runtime_new_*` call and freed by
/// `tutti_runtime_destroy`.
///
/// Thread safety: every call except `tutti_runtime_destroy` may be made from
/// any thread, concurrently with any other, on the same runtime.
/// `tutti_runtime_destroy` must be the last call on it, made when no other
/// thread is inside a call on it.
#[allow(non_camel_case_types, reason = "C naming: cbindgen copies the name into tutti.h")]
pub struct tutti_runtime {
    pub(crate) rt: Runtime,
    /// Requests per operation not yet waited on (op handle -> count), so a
    /// wait can refuse a too-small status array before consuming the op.
    pub(crate) ops: Mutex<HashMap<u64, usize>>,
    /// Drive names in configuration order (the runtime's drive indices).
    pub(crate) drives: Vec<String>,
}

impl tutti_runtime {
    fn new(rt: Runtime) -> tutti_runtime {
        let drives = rt.drive_names();
        tutti_runtime { rt, ops: Mutex::new(HashMap::new()), drives }
    }

    /// The operations table (a poisoned lock is taken over: the map is
    /// never left half-updated).
    pub(crate) fn ops(&self) -> MutexGuard<'_, HashMap<u64, usize>> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Assembles a runtime from the config `config` gives and hands it to the
/// caller through `out_rt`.
fn create(config: impl FnOnce() -> Result<Config, Fail>, out_rt: *mut *mut tutti_runtime) -> tutti_status {
    ffi_call(|| {
        let dst = out(out_rt, "out_runtime")?;
        let rt = Runtime::from_config(config()?)?;
        dst.write(Box::into_raw(Box::new(tutti_runtime::new(rt))));
        Ok(())
    })
}

/// Creates a runtime from a YAML configuration (docs/config.md) given as a
/// NUL-terminated UTF-8 string, which is only read during the call.
///
/// On success stores a new runtime in `*out_runtime`; the caller owns it and
/// frees it with `tutti_runtime_destroy`. On failure `*out_runtime` is not
/// written. Errors: `TUTTI_STATUS_NULL_ARGUMENT`,
/// `TUTTI_STATUS_INVALID_ARGUMENT` (not UTF-8), `TUTTI_STATUS_CONFIG` (the
/// message names the key path), and the drives' errors
/// (`TUTTI_STATUS_EMULATOR`, `_PCI`, `_CONTROLLER`, `_GPU`).
#[no_mangle]
pub extern "C" fn tutti_runtime_new_yaml(
    yaml: *const c_char,
    out_runtime: *mut *mut tutti_runtime,
) -> tutti_status {
    create(|| Ok(Config::from_yaml_str(c_str(yaml, "yaml")?).map_err(tutti::Error::from)?), out_runtime)
}

/// Creates a runtime from a YAML configuration file at `path` (a
/// NUL-terminated UTF-8 path, only read during the call). Ownership and
/// errors as for `tutti_runtime_new_yaml`; an unreadable file is
/// `TUTTI_STATUS_CONFIG`.
#[no_mangle]
pub extern "C" fn tutti_runtime_new_file(
    path: *const c_char,
    out_runtime: *mut *mut tutti_runtime,
) -> tutti_status {
    create(|| Ok(Config::from_path(c_str(path, "path")?).map_err(tutti::Error::from)?), out_runtime)
}

/// Creates a runtime on emulated RAM drives: `drives` drives (1 to 4) named
/// `d0`, `d1`, ..., each with one namespace of `bytes_per_drive` bytes in
/// 4096-byte blocks, striped with a 128 KiB stripe unit (one drive: not
/// striped), and one store `kv` whose targets `tutti://kv/<n>` are slots of
/// `slot_bytes` bytes. The defaults are `TUTTI_EMULATED_DEFAULT_DRIVES` (4),
/// `TUTTI_EMULATED_DEFAULT_BYTES_PER_DRIVE` (256 MiB) and
/// `TUTTI_EMULATED_DEFAULT_SLOT_BYTES` (1 MiB). Data lives in this process's
/// memory and is gone when the runtime is destroyed.
///
/// Ownership as for `tutti_runtime_new_yaml`. Errors:
/// `TUTTI_STATUS_NULL_ARGUMENT`, `TUTTI_STATUS_INVALID_ARGUMENT` (`drives`
/// not in 1..=4), `TUTTI_STATUS_CONFIG` (sizes that are not multiples of
/// 4096 bytes, or zero), `TUTTI_STATUS_EMULATOR`.
#[no_mangle]
pub extern "C" fn tutti_runtime_new_emulated(
    drives: u32,
    bytes_per_drive: u64,
    slot_bytes: u64,
    out_runtime: *mut *mut tutti_runtime,
) -> tutti_status {
    create(
        || {
            // Checked first: the config builder makes one entry per drive.
            if drives == 0 || drives as usize > MAX_STRIPE_DRIVES {
                return Err(Fail::invalid(format!("drives is {drives}, expected 1..={MAX_STRIPE_DRIVES}")));
            }
            // `Runtime::from_config` validates it.
            Ok(Config::builtin_striped_ram(drives as usize, bytes_per_drive, slot_bytes))
        },
        out_runtime,
    )
}

/// Destroys a runtime made by a `tutti_runtime_new_*` call: shuts it down
/// if `tutti_shutdown` was not called (draining for up to 1 s) and frees
/// it. Every handle it minted is invalid afterwards; registered memory is
/// no longer used by it and may be freed. NULL is ignored. The pointer must
/// not be used again, and no other thread may be inside a call on it.
#[no_mangle]
pub extern "C" fn tutti_runtime_destroy(runtime: *mut tutti_runtime) {
    if runtime.is_null() {
        return;
    }
    // SAFETY: non-null, and by this function's contract made by
    // `Box::into_raw` in `create`, not destroyed before and not in use by
    // any other thread: ownership comes back here exactly once.
    let rt = unsafe { Box::from_raw(runtime) };
    // A panic while shutting down is caught; its message stays as this
    // thread's last error (there is no status to return it through).
    let _ = ffi_call(|| {
        drop(rt);
        Ok(())
    });
}

/// What `tutti_shutdown` found.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct tutti_shutdown_report {
    /// Operations still not final when the drain bound passed.
    pub ops_in_flight: u64,
    /// Commands still outstanding on the drives when the drain bound passed.
    pub commands_in_flight: u64,
    /// Completions reaped after deleting the submission queues (commands
    /// the controllers aborted or finished on the way out).
    pub commands_reaped_at_deletion: u64,
    /// Commands that got no completion at all; their requests stay not
    /// final (`TUTTI_OUTCOME_TIMEOUT` to a wait).
    pub commands_lost: u64,
    /// Drives whose queue deletion or controller shutdown (CC.SHN) failed.
    pub drives_failed: u32,
}

/// Orderly shutdown: stops accepting work (later submits get
/// `TUTTI_OUTCOME_NOT_ACCEPTED`, later opens and registrations
/// `TUTTI_STATUS_SHUTTING_DOWN`), drains operations in flight for up to
/// `drain_ms` milliseconds, deletes every I/O queue and shuts each
/// controller down (CC.SHN). Operations not yet waited on can still be
/// waited on (for their statuses); memory can still be unregistered. A
/// second call reports nothing. The runtime must still be destroyed.
///
/// Writes the report to `*out_report` (NULL is allowed: no report).
/// Returns `TUTTI_STATUS_CONTROLLER` when a drive's shutdown failed (the
/// report is written all the same, the message names the drives),
/// `TUTTI_STATUS_NULL_ARGUMENT` for a NULL runtime.
#[no_mangle]
pub extern "C" fn tutti_shutdown(
    runtime: *const tutti_runtime,
    drain_ms: u64,
    out_report: *mut tutti_shutdown_report,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let r = rt.rt.shutdown(Duration::from_millis(drain_ms));
        let failed: Vec<String> = r
            .drives
            .iter()
            .filter_map(|(d, res)| res.as_ref().err().map(|e| format!("{d:?}: {e}")))
            .collect();
        if !out_report.is_null() {
            out(out_report, "out_report")?.write(tutti_shutdown_report {
                ops_in_flight: r.ops_in_flight as u64,
                commands_in_flight: r.commands_in_flight,
                commands_reaped_at_deletion: r.commands_reaped_at_deletion,
                commands_lost: r.commands_lost,
                drives_failed: failed.len() as u32,
            });
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Fail::new(tutti_status::Controller, format!("drive shutdown failed: {}", failed.join("; "))))
        }
    })
}

/// Counters of a runtime, summed over every queue pair.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct tutti_stats {
    /// Commands written to submission queues (CPU execution).
    pub commands_submitted: u64,
    /// Completions matched to a command.
    pub commands_completed: u64,
    /// Completion queue entries with an unknown or stale command ID
    /// (dropped, counted).
    pub protocol_errors: u64,
    /// Completions for operations no longer waited on, or for commands that
    /// had already left their operation.
    pub late_completions: u64,
    /// Submission queue tail doorbell writes (CPU execution).
    pub sq_doorbell_writes: u64,
}

/// Stores the runtime's counters in `*out_stats`. Errors:
/// `TUTTI_STATUS_NULL_ARGUMENT`.
#[no_mangle]
pub extern "C" fn tutti_stats_get(
    runtime: *const tutti_runtime,
    out_stats: *mut tutti_stats,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let dst = out(out_stats, "out_stats")?;
        let s = rt.rt.stats();
        dst.write(tutti_stats {
            commands_submitted: s.commands_submitted,
            commands_completed: s.commands_completed,
            protocol_errors: s.protocol_errors,
            late_completions: s.late_completions,
            sq_doorbell_writes: s.sq_doorbell_writes,
        });
        Ok(())
    })
}

/// Facts about a store, for sizing a workload. Sizes in bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct tutti_store_info {
    /// Bytes in the store's datapath space.
    pub capacity: u64,
    /// Logical block size requests must be aligned to, bytes.
    pub block_size: u32,
    /// Drives of the store's datapath.
    pub drive_count: u32,
    /// Slot size of a `slab` resolver, bytes (0: not a slab store).
    pub slot_size: u64,
    /// Number of slots of a `slab` resolver (0: not a slab store).
    pub slots: u64,
    /// Whether a drive of the store has a volatile write cache: a write is
    /// then durable only after a `TUTTI_DIRECTION_FLUSH` request completes.
    pub volatile_write_cache: bool,
}

/// Stores the facts of store `name` (a NUL-terminated UTF-8 string, e.g.
/// `"kv"`) in `*out_info`. Errors: `TUTTI_STATUS_NULL_ARGUMENT`,
/// `TUTTI_STATUS_INVALID_ARGUMENT` (not UTF-8), `TUTTI_STATUS_UNKNOWN_STORE`.
#[no_mangle]
pub extern "C" fn tutti_store_info_get(
    runtime: *const tutti_runtime,
    name: *const c_char,
    out_info: *mut tutti_store_info,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let name = c_str(name, "name")?;
        let dst = out(out_info, "out_info")?;
        let s = rt
            .rt
            .store_info(name)
            .ok_or_else(|| Fail::new(tutti_status::UnknownStore, format!("no store named {name:?}")))?;
        dst.write(tutti_store_info {
            capacity: s.capacity,
            block_size: s.block_size,
            drive_count: s.drives.len() as u32,
            slot_size: s.slot_size.unwrap_or(0),
            slots: s.slots.unwrap_or(0),
            volatile_write_cache: s.volatile_write_cache,
        });
        Ok(())
    })
}

/// Stores the number of drives of the runtime in `*out_count`. Drive
/// indices (`tutti_drive_name`, `tutti_request_status.drive_index`) run
/// from 0 to count - 1, in configuration order. Errors:
/// `TUTTI_STATUS_NULL_ARGUMENT`.
#[no_mangle]
pub extern "C" fn tutti_drive_count(runtime: *const tutti_runtime, out_count: *mut u32) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        out(out_count, "out_count")?.write(rt.drives.len() as u32);
        Ok(())
    })
}

/// Copies the name of drive `index` into `buf` (`len` bytes) as a
/// NUL-terminated string and stores its length in bytes (without the NUL)
/// in `*out_len`; as `tutti_last_error_message` does: `buf` may be NULL
/// when `len` is 0, and `TUTTI_STATUS_BUFFER_TOO_SMALL` means it did not
/// fit. Errors also: `TUTTI_STATUS_NULL_ARGUMENT`,
/// `TUTTI_STATUS_INVALID_ARGUMENT` (index out of range).
#[no_mangle]
pub extern "C" fn tutti_drive_name(
    runtime: *const tutti_runtime,
    index: u32,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let name = rt.drives.get(index as usize).ok_or_else(|| {
            Fail::invalid(format!("drive index {index} out of range: the runtime has {}", rt.drives.len()))
        })?;
        copy_out_str(name, buf, len, out_len)
    })
}

/// Resets drive `name` (NUL-terminated UTF-8) after its controller failed
/// (`TUTTI_OUTCOME_CONTROLLER_FATAL`): controller reset, queues re-created;
/// it then takes new work again. Errors: `TUTTI_STATUS_NULL_ARGUMENT`,
/// `TUTTI_STATUS_INVALID_ARGUMENT`, `TUTTI_STATUS_UNKNOWN_DRIVE`,
/// `TUTTI_STATUS_DRIVE_BUSY`, `TUTTI_STATUS_CONTROLLER`, `TUTTI_STATUS_GPU`,
/// `TUTTI_STATUS_SHUTTING_DOWN`.
#[no_mangle]
pub extern "C" fn tutti_reset_drive(runtime: *const tutti_runtime, name: *const c_char) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        rt.rt.reset_drive(c_str(name, "name")?)?;
        Ok(())
    })
}
