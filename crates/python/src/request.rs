//! Requests (`tutti.read`, `tutti.write`, `tutti.flush`) and operations
//! (`tutti.Operation`: `wait`, `done`, `try_wait`).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tutti::{Direction, MemoryHandle, OpHandle, Runtime, TargetHandle};

use crate::deferred;
use crate::errors::{timeout_error_type, IntoPyResult};
use crate::registration::Memory;
use crate::status::Status;
use crate::status_kind::StatusKind;

/// One I/O request: `length` bytes at byte `offset` of an opened target,
/// to (read) or from (write) byte `memory_offset` of registered memory, or a
/// flush of the target's drives. Make one with `tutti.read`, `tutti.write`
/// or `tutti.flush`. All offsets and lengths are bytes.
#[pyclass(frozen, module = "tutti", name = "Request")]
#[derive(Debug)]
pub struct Request {
    /// Read, write or flush (Python sees its name as `kind`).
    pub direction: Direction,
    /// Target handle (from `Runtime.open`).
    #[pyo3(get)]
    pub target: u64,
    /// Offset in the target, bytes (a multiple of the logical block size).
    #[pyo3(get)]
    pub offset: u64,
    /// Length, bytes (a non-zero multiple of the logical block size).
    #[pyo3(get)]
    pub length: u64,
    /// Memory handle (`Memory.handle`), 0 for a flush.
    #[pyo3(get)]
    pub memory: u64,
    /// Offset in the memory region, bytes (4-byte aligned).
    #[pyo3(get)]
    pub memory_offset: u64,
    /// The `Memory` object when one was given (not its int handle): kept
    /// alive by the request and by its operation until it is final, so a
    /// temporary registration (`tutti.read(t, 0, n, rt.register(buf))`) is
    /// not unregistered under the drive.
    pub keep: Option<Py<Memory>>,
}

impl Request {
    /// The runtime's request.
    pub fn to_rust(&self) -> tutti::Request {
        let target = TargetHandle::from_u64(self.target);
        let memory = MemoryHandle::from_u64(self.memory);
        match self.direction {
            Direction::Read => {
                tutti::Request::read(target, self.offset, self.length, memory, self.memory_offset)
            }
            Direction::Write => {
                tutti::Request::write(target, self.offset, self.length, memory, self.memory_offset)
            }
            Direction::Flush => tutti::Request::flush(target),
        }
    }

    /// Whether it reads from a drive into memory.
    pub fn is_read(&self) -> bool {
        self.direction == Direction::Read
    }

    /// The direction's name: "read", "write" or "flush".
    fn kind_name(&self) -> &'static str {
        match self.direction {
            Direction::Read => "read",
            Direction::Write => "write",
            Direction::Flush => "flush",
        }
    }
}

#[pymethods]
impl Request {
    /// "read", "write" or "flush".
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind_name()
    }

    fn __repr__(&self) -> String {
        match self.kind_name() {
            "flush" => format!("flush(target={:#x})", self.target),
            k => format!(
                "{k}(target={:#x}, offset={}, length={}, memory={:#x}, memory_offset={})",
                self.target, self.offset, self.length, self.memory, self.memory_offset
            ),
        }
    }
}

/// A memory argument: a `Memory` object (kept) or its integer handle.
fn memory_handle(memory: &Bound<'_, PyAny>) -> PyResult<(u64, Option<Py<Memory>>)> {
    if let Ok(m) = memory.cast::<Memory>() {
        return Ok((m.get().handle_u64(), Some(m.clone().unbind())));
    }
    let handle = memory
        .extract::<u64>()
        .map_err(|_| PyValueError::new_err("memory must be a tutti.Memory or an int handle"))?;
    Ok((handle, None))
}

/// A read of `length` bytes at byte `offset` of `target` into `memory` at
/// byte `memory_offset`. `memory` is a `Memory` (from `Runtime.register`)
/// or its integer handle.
#[pyfunction]
#[pyo3(signature = (target, offset, length, memory, memory_offset = 0))]
pub fn read(
    target: u64,
    offset: u64,
    length: u64,
    memory: &Bound<'_, PyAny>,
    memory_offset: u64,
) -> PyResult<Request> {
    let (memory, keep) = memory_handle(memory)?;
    Ok(Request { direction: Direction::Read, target, offset, length, memory, memory_offset, keep })
}

/// A write of `length` bytes from `memory` at byte `memory_offset` to byte
/// `offset` of `target`.
#[pyfunction]
#[pyo3(signature = (target, offset, length, memory, memory_offset = 0))]
pub fn write(
    target: u64,
    offset: u64,
    length: u64,
    memory: &Bound<'_, PyAny>,
    memory_offset: u64,
) -> PyResult<Request> {
    let (memory, keep) = memory_handle(memory)?;
    Ok(Request { direction: Direction::Write, target, offset, length, memory, memory_offset, keep })
}

/// A flush of every drive of `target`'s store (NVMe Flush, NVMe Base 2.0
/// §7.1): writes completed before it was submitted are durable when it
/// completes.
#[pyfunction]
pub fn flush(target: u64) -> Request {
    Request {
        direction: Direction::Flush,
        target,
        offset: 0,
        length: 0,
        memory: 0,
        memory_offset: 0,
        keep: None,
    }
}

/// Where an operation stands.
#[derive(Debug)]
enum OpState {
    /// Submitted; not yet final as far as we know.
    Pending(OpHandle),
    /// Another thread is in `wait`.
    Waiting,
    /// Final: the statuses, one per request of the batch.
    Done(Vec<Py<Status>>),
}

/// A submitted batch. `wait` (or `try_wait` until it returns a list) gives
/// one `Status` per request, in the batch's order; the result is kept, so
/// later calls return it again.
#[pyclass(frozen, module = "tutti", name = "Operation")]
#[derive(Debug)]
pub struct Operation {
    rt: Arc<Runtime>,
    /// Statuses of requests refused at submit, by index (merged in).
    refused: Vec<Option<Status>>,
    state: Mutex<OpState>,
    /// Signalled when a thread's wait leaves `OpState::Waiting`, for the
    /// threads that wait on the same operation at the same time.
    waited: Condvar,
    /// The `Memory` objects its requests named, alive until it is final.
    keep: Mutex<Vec<Py<Memory>>>,
    /// The caller's CUDA stream object its GPU requests run on, if any.
    stream: Option<Py<PyAny>>,
}

impl Operation {
    /// An operation on `op`; `refused[i]` is the status of request `i` when
    /// it was refused at submit (its runtime status is then reported too);
    /// `keep` are the `Memory` objects its requests named.
    pub fn new(
        py: Python<'_>,
        rt: Arc<Runtime>,
        op: Option<OpHandle>,
        refused: Vec<Option<Status>>,
        keep: Vec<Py<Memory>>,
    ) -> PyResult<Self> {
        let (state, keep) = match op {
            Some(op) => (OpState::Pending(op), keep),
            None => {
                let done =
                    refused.iter().flatten().map(|s| Py::new(py, s.clone())).collect::<PyResult<_>>()?;
                (OpState::Done(done), Vec::new())
            }
        };
        Ok(Self {
            rt,
            refused,
            state: Mutex::new(state),
            waited: Condvar::new(),
            keep: Mutex::new(keep),
            stream: None,
        })
    }

    /// Keeps `stream` (the caller's CUDA stream object) alive with the
    /// operation.
    pub fn with_stream(mut self, stream: Option<Py<PyAny>>) -> Self {
        self.stream = stream;
        self
    }

    fn lock(&self) -> MutexGuard<'_, OpState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Python statuses of a final batch; lets go of its `Memory`
    /// objects (the runtime no longer uses them).
    fn finish(&self, py: Python<'_>, statuses: &[tutti::RequestStatus]) -> PyResult<Vec<Py<Status>>> {
        let mut out = Vec::with_capacity(statuses.len());
        for (i, s) in statuses.iter().enumerate() {
            out.push(match self.refused.get(i) {
                // The runtime already reports refused requests as
                // NotAccepted; keep the binding's own refusals when it has
                // them.
                Some(Some(r)) => Py::new(py, r.clone())?,
                _ => Status::to_py(py, s)?,
            });
        }
        std::mem::take(&mut *self.keep.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(out)
    }
}

fn clone_all(py: Python<'_>, v: &[Py<Status>]) -> Vec<Py<Status>> {
    v.iter().map(|s| s.clone_ref(py)).collect()
}

/// Blocks (call it with the GIL released) while `busy(state)` (another
/// thread's wait runs) until `waited` is signalled or `deadline` passes;
/// true when the other wait still runs at the deadline.
pub fn wait_for_other<T>(
    state: &Mutex<T>,
    waited: &Condvar,
    busy: impl Fn(&T) -> bool,
    deadline: Option<Instant>,
) -> bool {
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    while busy(&st) {
        let Some(left) = deadline.map(|d| d.saturating_duration_since(Instant::now())) else {
            st = waited.wait(st).unwrap_or_else(|p| p.into_inner());
            continue;
        };
        if left.is_zero() {
            return true;
        }
        st = waited.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
    }
    false
}

/// `tutti.TimeoutError` for a wait whose deadline passed while another
/// thread's wait on the same `what` still ran.
pub fn still_waited_on(py: Python<'_>, what: &str) -> PyErr {
    let msg = format!("the deadline passed while another thread's wait on this {what} was still running");
    match timeout_error_type(py) {
        Ok(t) => PyErr::from_type(t.clone(), msg),
        Err(e) => e,
    }
}

#[pymethods]
impl Operation {
    /// Waits (with the GIL released) until every request is final or
    /// `timeout` seconds pass, and returns one Status per request, in the
    /// batch's order. Requests not final by then are Status "timeout": the
    /// deadline is final (the runtime keeps their memory busy until the
    /// drive completes them). A thread that calls `wait` while another
    /// thread's wait runs waits for that one and returns its result (or
    /// raises `tutti.TimeoutError` if its own deadline passes first).
    /// Raises `tutti.HandleError` if the runtime no longer knows the
    /// operation.
    #[pyo3(signature = (timeout = 5.0))]
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<Py<Status>>> {
        let timeout =
            Duration::try_from_secs_f64(timeout).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let deadline = Instant::now().checked_add(timeout);
        let op = loop {
            let mut st = self.lock();
            match std::mem::replace(&mut *st, OpState::Waiting) {
                OpState::Pending(op) => break op,
                OpState::Waiting => {
                    drop(st);
                    let busy = |s: &OpState| matches!(s, OpState::Waiting);
                    if py.detach(|| wait_for_other(&self.state, &self.waited, busy, deadline)) {
                        return Err(still_waited_on(py, "operation"));
                    }
                }
                OpState::Done(s) => {
                    *st = OpState::Done(clone_all(py, &s));
                    return Ok(s);
                }
            }
        };
        let rt = self.rt.clone();
        let result = py.detach(move || rt.wait(op, timeout));
        let mut st = self.lock();
        match result {
            Ok(statuses) => {
                let out = self.finish(py, &statuses);
                *st = match &out {
                    Ok(out) => OpState::Done(clone_all(py, out)),
                    // Only a failed allocation of a Status object gets here.
                    Err(_) => OpState::Done(Vec::new()),
                };
                drop(st);
                self.waited.notify_all();
                deferred::retry(py);
                out
            }
            Err(e) => {
                *st = OpState::Pending(op);
                drop(st);
                self.waited.notify_all();
                Err(e).py()
            }
        }
    }

    /// Polls once without blocking: the statuses if every request is final
    /// (kept for later calls), else None.
    fn try_wait(&self, py: Python<'_>) -> PyResult<Option<Vec<Py<Status>>>> {
        let mut st = self.lock();
        let op = match &*st {
            OpState::Pending(op) => *op,
            OpState::Waiting => return Ok(None),
            OpState::Done(s) => return Ok(Some(clone_all(py, s))),
        };
        match self.rt.try_wait(op).py()? {
            Some(statuses) => {
                let out = self.finish(py, &statuses)?;
                *st = OpState::Done(clone_all(py, &out));
                drop(st);
                deferred::retry(py);
                Ok(Some(out))
            }
            None => Ok(None),
        }
    }

    /// The end event of the batch's GPU launch (a `CUevent` handle as an
    /// int), recorded on its stream after the I/O kernel: order another
    /// stream after the I/O with `cuStreamWaitEvent`. None when the batch
    /// has no GPU-executed request, or once it has been waited on (the
    /// event is valid until then). With emulated drives, a stream made to
    /// wait for a kernel that is still running can stall the emulator's
    /// copies that kernel needs (docs/gpu.md, "Under load"): prefer
    /// `wait()` first, or set `CUDA_DEVICE_MAX_CONNECTIONS=32` before CUDA
    /// starts.
    #[getter]
    fn cuda_event(&self) -> PyResult<Option<u64>> {
        match &*self.lock() {
            OpState::Pending(op) => self.rt.gpu_event(*op).py(),
            _ => Ok(None),
        }
    }

    /// The stream object passed to `Runtime.submit`, or None.
    #[getter]
    fn stream(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.stream.as_ref().map(|s| s.clone_ref(py))
    }

    /// Whether every request is final (polls once; the statuses are kept
    /// for `wait`).
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.try_wait(py)?.is_some())
    }

    fn __repr__(&self) -> String {
        match &*self.lock() {
            OpState::Pending(op) => format!("Operation(pending, handle={:#x})", op.to_u64()),
            OpState::Waiting => "Operation(being waited on)".into(),
            OpState::Done(s) => {
                format!(
                    "Operation(done, {} of {} ok)",
                    s.iter().filter(|s| s.get().status_kind() == StatusKind::Success).count(),
                    s.len()
                )
            }
        }
    }
}

impl Drop for Operation {
    /// An operation dropped before it was final is handed back to the
    /// runtime with a zero-timeout wait: its handle is released and its
    /// memory stays busy until the drives complete its commands.
    fn drop(&mut self) {
        if let OpState::Pending(op) = &*self.lock() {
            let _ = self.rt.wait(*op, Duration::ZERO);
        }
    }
}
