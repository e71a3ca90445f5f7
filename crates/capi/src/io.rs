//! I/O: requests, `tutti_submit`, and the per-request statuses that
//! `tutti_wait` / `tutti_try_wait` return.

use std::ffi::c_char;
use std::time::Duration;

use tutti::{MemoryHandle, OpHandle, Request, RequestStatus, TargetHandle};

use crate::ffi_util::{arg, ffi_call, fixed_str, out, out_array, slice_in, Fail, OutArray};
use crate::runtime::tutti_runtime;
use crate::status::tutti_status;

/// Direction of a request: one of the `TUTTI_DIRECTION_` values.
#[allow(non_camel_case_types, reason = "C naming: cbindgen copies the name into tutti.h")]
pub type tutti_direction = u32;
/// Drive to memory (load).
pub const TUTTI_DIRECTION_READ: tutti_direction = 0;
/// Memory to drive (save).
pub const TUTTI_DIRECTION_WRITE: tutti_direction = 1;
/// Durability barrier on every drive of the target's store (NVMe Flush):
/// writes that completed before it was submitted are durable when it
/// completes. `offset`, `len`, `memory` and `memory_offset` are ignored.
pub const TUTTI_DIRECTION_FLUSH: tutti_direction = 2;

/// Bytes of `tutti_request_status.message`, its NUL included.
pub const TUTTI_MESSAGE_LEN: usize = 256;

/// One I/O request: `len` bytes at byte `offset` of target `target`, to or
/// from byte `memory_offset` of registered memory `memory`. Units are
/// bytes: `offset` and `len` multiples of the store's block size
/// (`tutti_store_info.block_size`), `len` non-zero, `memory_offset` a
/// multiple of 4.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct tutti_request {
    /// `TUTTI_DIRECTION_READ`, `_WRITE` or `_FLUSH`.
    pub direction: tutti_direction,
    /// Target handle (`tutti_open`).
    pub target: u64,
    /// Offset in the target, bytes.
    pub offset: u64,
    /// Length, bytes.
    pub len: u64,
    /// Memory handle (`tutti_register_memory`).
    pub memory: u64,
    /// Offset in the memory region, bytes.
    pub memory_offset: u64,
}

/// What became of one request.
#[allow(non_camel_case_types, reason = "C naming: cbindgen copies the name into tutti.h")]
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum tutti_outcome {
    /// Every byte transferred; every NVMe command completed with status 0.
    Success = 0,
    /// Not accepted at submission (the message says why); nothing was sent.
    NotAccepted = 1,
    /// A drive completed a command of it with an NVMe error status: `sct`,
    /// `sc`, `crd`, `more`, `dnr` and `drive_index` say which. Its data must
    /// not be used.
    Nvme = 2,
    /// Not final when the wait's deadline passed. Its memory stays busy
    /// (`TUTTI_STATUS_MEMORY_BUSY`) until the drive completes it.
    Timeout = 3,
    /// The controller of drive `drive_index` failed (CSTS.CFS) or vanished;
    /// `tutti_reset_drive` makes it usable again.
    ControllerFatal = 4,
    /// Some of its commands could not be queued (the message says why).
    SubmitFailed = 5,
    /// `tutti_submit` only: accepted; its final outcome comes from a wait.
    Pending = 6,
    /// A status this version of the binding does not know by kind; the
    /// message says what it is.
    Other = 7,
}

/// The status of one request of a batch, in the batch's order.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tutti_request_status {
    /// What became of it.
    pub kind: tutti_outcome,
    /// NVMe SCT, Status Code Type (3 bits; NVMe Base 2.0 4.2.3), for
    /// `TUTTI_OUTCOME_NVME`, else 0.
    pub sct: u8,
    /// NVMe SC, Status Code (meaning depends on `sct`), for
    /// `TUTTI_OUTCOME_NVME`, else 0.
    pub sc: u8,
    /// NVMe CRD, Command Retry Delay (2 bits), for `TUTTI_OUTCOME_NVME`.
    pub crd: u8,
    /// NVMe M, More: the Error Information log has more.
    pub more: bool,
    /// NVMe DNR, Do Not Retry: the same command would fail again.
    pub dnr: bool,
    /// Index of the drive concerned (`tutti_drive_name`) for
    /// `TUTTI_OUTCOME_NVME` and `TUTTI_OUTCOME_CONTROLLER_FATAL`, else -1.
    pub drive_index: i32,
    /// Why, as NUL-terminated UTF-8 text (empty for success and pending),
    /// cut to `TUTTI_MESSAGE_LEN - 1` bytes.
    pub message: [c_char; TUTTI_MESSAGE_LEN],
}

impl tutti_request_status {
    fn new(kind: tutti_outcome, message: &str) -> Self {
        tutti_request_status {
            kind,
            sct: 0,
            sc: 0,
            crd: 0,
            more: false,
            dnr: false,
            drive_index: -1,
            message: fixed_str(message),
        }
    }

    /// The C form of a runtime status; drive names become indices into
    /// `drives`.
    fn from_status(s: &RequestStatus, drives: &[String]) -> Self {
        let index = |d: &str| drives.iter().position(|n| n == d).map_or(-1, |i| i as i32);
        match s {
            RequestStatus::Success => Self::new(tutti_outcome::Success, ""),
            RequestStatus::NotAccepted(e) => Self::new(tutti_outcome::NotAccepted, &tutti::error_chain(e)),
            RequestStatus::Nvme { drive, status } => tutti_request_status {
                sct: status.sct,
                sc: status.sc,
                crd: status.crd,
                more: status.more,
                dnr: status.dnr,
                drive_index: index(drive),
                ..Self::new(tutti_outcome::Nvme, &format!("drive {drive:?}: {status}"))
            },
            RequestStatus::Timeout => Self::new(
                tutti_outcome::Timeout,
                "not final when the wait's deadline passed; its memory stays busy until the drive completes it",
            ),
            RequestStatus::ControllerFatal { drive } => tutti_request_status {
                drive_index: index(drive),
                ..Self::new(
                    tutti_outcome::ControllerFatal,
                    &format!("drive {drive:?}: the controller failed or vanished; reset the drive"),
                )
            },
            RequestStatus::SubmitFailed { reason } => {
                Self::new(tutti_outcome::SubmitFailed, &format!("could not be queued: {reason}"))
            }
            other => Self::new(tutti_outcome::Other, &format!("{other:?}")),
        }
    }
}

/// The runtime form of request `i` of a batch.
fn to_request(i: usize, r: &tutti_request) -> Result<Request, Fail> {
    let target = TargetHandle::from_u64(r.target);
    let memory = MemoryHandle::from_u64(r.memory);
    match r.direction {
        TUTTI_DIRECTION_READ => Ok(Request::read(target, r.offset, r.len, memory, r.memory_offset)),
        TUTTI_DIRECTION_WRITE => Ok(Request::write(target, r.offset, r.len, memory, r.memory_offset)),
        TUTTI_DIRECTION_FLUSH => Ok(Request::flush(target)),
        d => Err(Fail::invalid(format!(
            "requests[{i}].direction is {d}: expected TUTTI_DIRECTION_READ (0), _WRITE (1) or _FLUSH (2)"
        ))),
    }
}

/// Submits a batch of `n` requests (`requests`: `n` entries, read during
/// the call only). `out_statuses` (`n` entries) gets, per request,
/// `TUTTI_OUTCOME_PENDING` (accepted) or `TUTTI_OUTCOME_NOT_ACCEPTED` with
/// the reason (a stale target, a range out of bounds, a misaligned
/// offset...: nothing was sent for it). `*out_op` gets the operation handle
/// to wait on, or 0 when no request was accepted. An operation's handle
/// stays valid until a wait returns its statuses; the memory it uses must
/// not be touched until then.
///
/// Returns `TUTTI_STATUS_OK` whenever the batch was looked at, whatever
/// each request's acceptance. Errors (nothing submitted):
/// `TUTTI_STATUS_NULL_ARGUMENT`, `TUTTI_STATUS_INVALID_ARGUMENT` (`n` is
/// 0, or a direction is not a `TUTTI_DIRECTION_` value).
#[no_mangle]
pub extern "C" fn tutti_submit(
    runtime: *const tutti_runtime,
    requests: *const tutti_request,
    n: usize,
    out_statuses: *mut tutti_request_status,
    out_op: *mut u64,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let requests = slice_in(requests, n, "requests")?;
        let statuses = out_array(out_statuses, n, "out_statuses")?;
        let op_out = out(out_op, "out_op")?;
        let batch =
            requests.iter().enumerate().map(|(i, r)| to_request(i, r)).collect::<Result<Vec<_>, _>>()?;
        let sub = rt.rt.submit(&batch);
        for (i, st) in sub.states().iter().enumerate() {
            let s = match st {
                Ok(()) => tutti_request_status::new(tutti_outcome::Pending, ""),
                Err(e) => tutti_request_status::new(tutti_outcome::NotAccepted, &tutti::error_chain(e)),
            };
            statuses.write(i, s);
        }
        let op = sub.op().map_or(0, |op| op.to_u64());
        if op != 0 {
            rt.ops().insert(op, n);
        }
        op_out.write(op);
        Ok(())
    })
}

/// The shared body of `tutti_wait` and `tutti_try_wait`: refuses a
/// too-small array before consuming the operation, then runs `wait` and
/// writes what it returns.
fn take_statuses(
    runtime: *const tutti_runtime,
    op: u64,
    out_statuses: *mut tutti_request_status,
    capacity: usize,
    out_count: *mut usize,
    wait: impl FnOnce(&tutti::Runtime, OpHandle) -> Result<Option<Vec<RequestStatus>>, tutti::Error>,
) -> tutti_status {
    ffi_call(|| {
        let rt = arg(runtime, "runtime")?;
        let count = out(out_count, "out_count")?;
        let statuses = out_array(out_statuses, capacity, "out_statuses")?;
        let known = rt.ops().get(&op).copied();
        if let Some(n) = known.filter(|n| *n > capacity) {
            count.write(n);
            return Err(Fail::new(
                tutti_status::BufferTooSmall,
                format!(
                    "the operation has {n} requests, the status array holds {capacity}; it stays waitable"
                ),
            ));
        }
        let got = wait(&rt.rt, OpHandle::from_u64(op)).inspect_err(|e| {
            if matches!(e, tutti::Error::Handle(_)) {
                rt.ops().remove(&op);
            }
        })?;
        let Some(got) = got else {
            return Err(Fail::new(tutti_status::NotReady, "the operation is not final yet; it stays valid"));
        };
        rt.ops().remove(&op);
        write_statuses(rt, &got, &statuses)?;
        count.write(got.len());
        Ok(())
    })
}

/// Writes final statuses to the caller's array.
fn write_statuses(
    rt: &tutti_runtime,
    got: &[RequestStatus],
    out: &OutArray<tutti_request_status>,
) -> Result<(), Fail> {
    if got.len() > out.len() {
        // Only an operation this binding did not submit could get here.
        return Err(Fail::new(
            tutti_status::Other,
            format!(
                "the operation had {} requests, more than the array's {}; statuses lost",
                got.len(),
                out.len()
            ),
        ));
    }
    for (i, s) in got.iter().enumerate() {
        out.write(i, tutti_request_status::from_status(s, &rt.drives));
    }
    Ok(())
}

/// Waits until every request of operation `op` is final or `timeout_ms`
/// milliseconds pass (0: poll once), then writes one status per request, in
/// submission order, to `out_statuses` (`capacity` entries) and their
/// number to `*out_count`. Requests not final at the deadline are
/// `TUTTI_OUTCOME_TIMEOUT`. The handle is consumed: a second wait is
/// `TUTTI_STATUS_HANDLE`.
///
/// Errors: `TUTTI_STATUS_NULL_ARGUMENT`, `TUTTI_STATUS_HANDLE` (stale,
/// foreign or forged), `TUTTI_STATUS_BUFFER_TOO_SMALL` when `capacity` is
/// less than the batch's request count: then `*out_count` gets that count
/// and the operation is not consumed (wait again with a larger array).
#[no_mangle]
pub extern "C" fn tutti_wait(
    runtime: *const tutti_runtime,
    op: u64,
    timeout_ms: u64,
    out_statuses: *mut tutti_request_status,
    capacity: usize,
    out_count: *mut usize,
) -> tutti_status {
    take_statuses(runtime, op, out_statuses, capacity, out_count, |rt, op| {
        rt.wait(op, Duration::from_millis(timeout_ms)).map(Some)
    })
}

/// Non-blocking wait: reaps completions once; when every request of `op`
/// is final, writes the statuses and consumes the handle as `tutti_wait`
/// does; otherwise returns `TUTTI_STATUS_NOT_READY` and the handle stays
/// valid. Other errors as for `tutti_wait`.
#[no_mangle]
pub extern "C" fn tutti_try_wait(
    runtime: *const tutti_runtime,
    op: u64,
    out_statuses: *mut tutti_request_status,
    capacity: usize,
    out_count: *mut usize,
) -> tutti_status {
    take_statuses(runtime, op, out_statuses, capacity, out_count, |rt, op| rt.try_wait(op))
}
