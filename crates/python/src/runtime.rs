//! `tutti.Runtime`: the runtime API with handles as integers, Python
//! objects registered as memory (`tutti.Memory`, in `registration.rs`), errors as
//! exceptions.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tutti::config::MAX_STRIPE_DRIVES;
use tutti::{error_chain, Config, OpHandle, Runtime, TargetHandle};

use crate::deferred;
use crate::errors::{runtime_error_with, ConfigError, IntoPyResult, RequestError, TuttiError};
use crate::registrar::Held;
use crate::registration::Memory;
use crate::request::{Operation, Request};
use crate::status::Status;

/// The longest shutdown drain bound (2^32 s, about 136 years).
pub const MAX_DRAIN: Duration = Duration::from_secs(1 << 32);

/// Seconds as a `Duration`, or `ValueError`.
pub fn seconds(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|e| PyValueError::new_err(format!("{s} seconds: {e}")))
}

/// What `Runtime.shutdown` found: operations and commands still in flight
/// when the drain bound passed, and how each drive's shutdown went.
#[pyclass(frozen, module = "tutti", name = "ShutdownReport", get_all)]
#[derive(Debug)]
pub struct ShutdownReport {
    /// Operations not final when the drain bound passed.
    ops_in_flight: usize,
    /// Commands outstanding when the drain bound passed.
    commands_in_flight: u64,
    /// Commands completed or aborted when their SQ was deleted.
    commands_reaped_at_deletion: u64,
    /// Commands that got no completion at all.
    commands_lost: u64,
    /// Per drive: (name, None) or (name, error message).
    drives: Vec<(String, Option<String>)>,
}

#[pymethods]
impl ShutdownReport {
    /// True when nothing was in flight or lost and every drive shut down.
    #[getter]
    fn clean(&self) -> bool {
        self.ops_in_flight == 0 && self.commands_lost == 0 && self.drives.iter().all(|(_, e)| e.is_none())
    }

    fn __repr__(&self) -> String {
        format!(
            "ShutdownReport(ops_in_flight={}, commands_in_flight={}, commands_lost={}, drives={:?})",
            self.ops_in_flight, self.commands_in_flight, self.commands_lost, self.drives
        )
    }
}

/// A tutti runtime: drives, resolvers, datapaths and stores assembled from a
/// configuration. Open targets by URI (`tutti://<store>/<key>`), register
/// memory, submit batches of requests, wait for per-request statuses.
/// Sizes and offsets are bytes. Use it as a context manager (`with`) to
/// shut it down on exit. Thread-safe; waits release the GIL.
#[pyclass(frozen, module = "tutti", name = "Runtime")]
#[derive(Debug)]
pub struct PyRuntime {
    pub(crate) rt: Arc<Runtime>,
    /// Handles of read-only registrations (refused as read targets).
    readonly: Mutex<HashSet<u64>>,
}

impl PyRuntime {
    fn build(py: Python<'_>, config: Config) -> PyResult<Self> {
        let rt = py.detach(move || Runtime::from_config(config)).py()?;
        Ok(Self { rt: Arc::new(rt), readonly: Mutex::new(HashSet::new()) })
    }

    fn readonly(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.readonly.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The binding's own checks: a read into read-only memory. Returns the
    /// exception to raise (nothing submitted) when one fails.
    fn precheck(&self, py: Python<'_>, requests: &[PyRef<'_, Request>]) -> PyResult<Option<PyErr>> {
        let ro = self.readonly();
        if ro.is_empty() {
            return Ok(None);
        }
        let bad: Vec<usize> = requests
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_read() && ro.contains(&r.memory))
            .map(|(i, _)| i)
            .collect();
        drop(ro);
        let Some(&first) = bad.first() else { return Ok(None) };
        let statuses: Vec<Status> = (0..requests.len())
            .map(|i| {
                Status::refused(if bad.contains(&i) {
                    "read into read-only memory".into()
                } else {
                    format!("not submitted: request {first} of the batch was refused")
                })
            })
            .collect();
        let msg = format!("request {first}: read into read-only memory; nothing was submitted");
        Ok(Some(request_error(py, msg, statuses.into_iter().map(Some).collect(), None)?))
    }
}

/// The distinct `Memory` objects a batch names (most batches name one), for
/// its operation to keep alive.
fn distinct_memory(py: Python<'_>, requests: &[PyRef<'_, Request>]) -> Vec<Py<Memory>> {
    let mut keep: Vec<Py<Memory>> = Vec::with_capacity(1);
    for m in requests.iter().filter_map(|r| r.keep.as_ref()) {
        if !keep.iter().any(|k| k.is(m)) {
            keep.push(m.clone_ref(py));
        }
    }
    keep
}

/// `tutti.RequestError(msg)` with `.statuses` and `.operation`.
fn request_error(
    py: Python<'_>,
    msg: String,
    statuses: Vec<Option<Status>>,
    operation: Option<Operation>,
) -> PyResult<PyErr> {
    let err = RequestError::new_err(msg);
    let v = err.value(py);
    v.setattr("statuses", PyList::new(py, statuses)?)?;
    match operation {
        Some(op) => v.setattr("operation", Py::new(py, op)?)?,
        None => v.setattr("operation", py.None())?,
    }
    Ok(err)
}

#[pymethods]
impl PyRuntime {
    /// A runtime from a YAML configuration (docs/config.md). Raises
    /// `tutti.ConfigError` when it is refused, `tutti.DeviceError` when a
    /// drive cannot start.
    #[staticmethod]
    fn from_yaml(py: Python<'_>, text: &str) -> PyResult<Self> {
        let config = Config::from_yaml_str(text).map_err(|e| ConfigError::new_err(error_chain(&e)))?;
        Self::build(py, config)
    }

    /// A runtime from a YAML configuration file.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let config = Config::from_path(&path).map_err(|e| ConfigError::new_err(error_chain(&e)))?;
        Self::build(py, config)
    }

    /// A runtime over `drives` emulated RAM drives of `drive_bytes` bytes
    /// each, striped into one store "kv" whose `slab` resolver cuts it into
    /// slots of `slot_bytes` bytes (`tutti://kv/<slot>`). `drives` is 1 to
    /// 4; raises `tutti.ConfigError` for other values or sizes that are not
    /// non-zero multiples of 4096 bytes.
    #[staticmethod]
    #[pyo3(signature = (drives = 4, drive_bytes = 256 << 20, slot_bytes = 1 << 20))]
    fn emulated(py: Python<'_>, drives: usize, drive_bytes: u64, slot_bytes: u64) -> PyResult<Self> {
        // Checked first: the config builder makes one entry per drive, so a
        // huge count would exhaust memory (or overflow) before validation.
        if drives == 0 || drives > MAX_STRIPE_DRIVES {
            return Err(ConfigError::new_err(format!(
                "drives is {drives}: an emulated runtime has 1 to {MAX_STRIPE_DRIVES} drives"
            )));
        }
        Self::build(py, Config::builtin_striped_ram(drives, drive_bytes, slot_bytes))
    }

    /// Returns the runtime itself; `__exit__` shuts it down.
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Shuts the runtime down (5 s drain); exceptions propagate.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        let rt = self.rt.clone();
        py.detach(move || drop(rt.shutdown(Duration::from_secs(5))));
        false
    }

    /// Opens `tutti://<store>/<key>` and returns its target handle (an int).
    /// Raises `tutti.UriError` for a malformed URI, an unknown store or a
    /// key the store refuses.
    fn open(&self, uri: &str) -> PyResult<u64> {
        self.rt.open(uri).py().map(TargetHandle::to_u64)
    }

    /// Opens several URIs; their handles in order. If one fails, the others
    /// are closed and its error raised, naming its index.
    fn open_batch(&self, uris: Vec<String>) -> PyResult<Vec<u64>> {
        let refs: Vec<&str> = uris.iter().map(String::as_str).collect();
        let results = self.rt.open_batch(&refs);
        let Some((i, e)) = results.iter().enumerate().find_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
        else {
            return Ok(results.into_iter().flatten().map(TargetHandle::to_u64).collect());
        };
        let err = runtime_error_with(e, format!("uris[{i}]: {}", error_chain(e)));
        for t in results.iter().flatten() {
            let _ = self.rt.close(*t);
        }
        Err(err)
    }

    /// Closes a target; its handle is stale afterwards (`tutti.HandleError`
    /// on use).
    fn close(&self, target: u64) -> PyResult<()> {
        self.rt.close(TargetHandle::from_u64(target)).py()
    }

    /// Size of an opened target, bytes.
    fn target_len(&self, target: u64) -> PyResult<u64> {
        self.rt.target_len(TargetHandle::from_u64(target)).py()
    }

    /// Registers `obj`'s memory for I/O and returns a `Memory`: a
    /// C-contiguous buffer-protocol object (numpy array, bytearray,
    /// memoryview, bytes: read-only ones may only be written to drives), a
    /// CUDA array (`__cuda_array_interface__`) or a DLPack tensor
    /// (`__dlpack__`) on the runtime's GPU (config `gpu.ordinal`, default
    /// 0), which needs a runtime whose datapath has
    /// `execution: gpu`. Raises `tutti.MemoryRegistrationError` for a
    /// non-contiguous or unsupported object, or a GPU array on another GPU.
    fn register(&self, py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Memory> {
        deferred::retry(py);
        let held = Held::register(py, &self.rt, obj)?;
        if held.readonly {
            self.readonly().insert(held.handle().to_u64());
        }
        Ok(Memory { held })
    }

    /// Unregisters memory and lets go of its object. Raises
    /// `tutti.MemoryRegistrationError` while an operation still uses it
    /// (nothing changes; wait for the operation first) and
    /// `tutti.HandleError` for memory of another runtime or already
    /// unregistered.
    fn unregister(&self, py: Python<'_>, memory: &Bound<'_, Memory>) -> PyResult<()> {
        deferred::retry(py);
        let m = memory.get();
        m.held.unregister(py, &self.rt)?;
        self.readonly().remove(&m.handle_u64());
        Ok(())
    }

    /// Submits a batch of requests (`tutti.read`, `tutti.write`,
    /// `tutti.flush`) and returns its `Operation`. The GIL is released while
    /// commands are queued.
    ///
    /// If any request is refused (a closed or foreign target, a range out
    /// of the target, an unaligned offset or length, memory not registered,
    /// a read into read-only memory...), raises `tutti.RequestError` whose
    /// `.statuses` has one entry per request (a "not_accepted" Status for
    /// each refused one, None for each accepted one) and whose `.operation`
    /// is the Operation of the accepted requests (wait on it), or None. A
    /// read into read-only memory is caught before anything is submitted.
    ///
    /// `stream`: a CUDA stream of the runtime's GPU on which the batch's
    /// GPU-executed requests run (`torch.cuda.Stream`, a CuPy `Stream`, or
    /// a raw `CUstream` as an int): after the work queued before on it, and
    /// before the work queued after, with no host synchronisation. The
    /// Operation keeps the stream object alive until it is dropped; its
    /// `cuda_event` is the launch's end event. `None` (the default): the
    /// runtime's own stream. Stream 0 (the legacy default stream) fails
    /// the GPU requests ("submit_failed" statuses).
    #[pyo3(signature = (requests, stream = None))]
    fn submit(
        &self,
        py: Python<'_>,
        requests: Vec<PyRef<'_, Request>>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Operation> {
        deferred::retry(py);
        let raw_stream = stream.as_ref().map(stream_handle).transpose()?;
        if let Some(e) = self.precheck(py, &requests)? {
            return Err(e);
        }
        let reqs: Vec<tutti::Request> = requests.iter().map(|r| r.to_rust()).collect();
        let keep = distinct_memory(py, &requests);
        let rt = self.rt.clone();
        let sub = py.detach(move || match raw_stream {
            None => rt.submit(&reqs),
            // SAFETY: the Operation holds the stream object (below), and
            // CUDA defers a stream's destruction until its work has ended.
            #[allow(unsafe_code)]
            Some(s) => unsafe { rt.submit_on_stream(&reqs, s) },
        });
        let stream = stream.map(Bound::unbind);
        let refused: Vec<Option<Status>> =
            sub.states().iter().map(|s| s.as_ref().err().map(Status::not_accepted)).collect();
        let n_refused = refused.iter().flatten().count();
        if n_refused == 0 {
            return Ok(Operation::new(py, self.rt.clone(), sub.op(), Vec::new(), keep)?.with_stream(stream));
        }
        let first = refused.iter().position(Option::is_some).unwrap_or(0);
        let msg = format!(
            "{n_refused} of {} requests not accepted; request {first}: {}",
            refused.len(),
            refused[first].as_ref().map(|s| s.message()).unwrap_or_default()
        );
        let op = match sub.op() {
            Some(op) => Some(
                Operation::new(py, self.rt.clone(), Some(op), refused.clone(), keep)?.with_stream(stream),
            ),
            None => None,
        };
        Err(request_error(py, msg, refused, op)?)
    }

    /// Resets a drive whose controller failed (CSTS.CFS) so it takes work
    /// again. Raises `tutti.DeviceError` (unknown drive, drive busy,
    /// controller error).
    fn reset_drive(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let rt = self.rt.clone();
        let name = name.to_owned();
        py.detach(move || rt.reset_drive(&name)).py()
    }

    /// Orderly shutdown: stops accepting work, drains operations for up to
    /// `drain` seconds (at most 2^32, about 136 years), deletes the queues
    /// and shuts the controllers down.
    /// A second call returns an empty report.
    #[pyo3(signature = (drain = 5.0))]
    fn shutdown(&self, py: Python<'_>, drain: f64) -> PyResult<ShutdownReport> {
        // Capped: the runtime adds it to `Instant::now()`, which panics on
        // overflow after marking the runtime shut down (the drives were
        // then never shut down).
        let drain = seconds(drain)?.min(MAX_DRAIN);
        let rt = self.rt.clone();
        let r = py.detach(move || rt.shutdown(drain));
        deferred::retry(py);
        Ok(ShutdownReport {
            ops_in_flight: r.ops_in_flight,
            commands_in_flight: r.commands_in_flight,
            commands_reaped_at_deletion: r.commands_reaped_at_deletion,
            commands_lost: r.commands_lost,
            drives: r.drives.into_iter().map(|(n, res)| (n, res.err())).collect(),
        })
    }

    /// Counters summed over every queue pair: a dict of ints
    /// (commands_submitted, commands_completed, protocol_errors,
    /// late_completions, sq_doorbell_writes).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.rt.stats();
        let d = PyDict::new(py);
        d.set_item("commands_submitted", s.commands_submitted)?;
        d.set_item("commands_completed", s.commands_completed)?;
        d.set_item("protocol_errors", s.protocol_errors)?;
        d.set_item("late_completions", s.late_completions)?;
        d.set_item("sq_doorbell_writes", s.sq_doorbell_writes)?;
        Ok(d)
    }

    /// Facts about store `name` as a dict (name, capacity and block_size in
    /// bytes, slot_size in bytes and slots for a slab resolver, drives,
    /// volatile_write_cache), or None when there is no such store.
    fn store_info<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(s) = self.rt.store_info(name) else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("name", s.name)?;
        d.set_item("capacity", s.capacity)?;
        d.set_item("block_size", s.block_size)?;
        d.set_item("slot_size", s.slot_size)?;
        d.set_item("slots", s.slots)?;
        d.set_item("drives", s.drives)?;
        d.set_item("volatile_write_cache", s.volatile_write_cache)?;
        Ok(Some(d))
    }

    /// Names of the drives, in configuration order.
    fn drive_names(&self) -> Vec<String> {
        self.rt.drive_names()
    }

    /// True when a datapath uses GPU execution (GPU memory can be
    /// registered).
    #[getter]
    fn has_gpu(&self) -> bool {
        self.rt.gpu().is_some()
    }

    fn __repr__(&self) -> String {
        format!("Runtime(drives={:?})", self.rt.drive_names())
    }
}

/// Benchmark helper: `iterations` rounds of submit + wait of `requests`
/// done in Rust on `runtime` (GIL released); returns `(seconds in all,
/// seconds inside submit)`. Raises if a request fails, and, as `submit`
/// does, for a read into read-only memory (before anything is submitted).
#[pyfunction]
pub fn _rust_roundtrip(
    py: Python<'_>,
    runtime: &Bound<'_, PyRuntime>,
    requests: Vec<PyRef<'_, Request>>,
    iterations: u64,
) -> PyResult<(f64, f64)> {
    if let Some(e) = runtime.get().precheck(py, &requests)? {
        return Err(e);
    }
    let reqs: Vec<tutti::Request> = requests.iter().map(|r| r.to_rust()).collect();
    let rt = runtime.get().rt.clone();
    let result = py.detach(move || -> Result<(f64, f64), String> {
        let start = Instant::now();
        let mut in_submit = Duration::ZERO;
        for _ in 0..iterations {
            let t = Instant::now();
            let sub = rt.submit(&reqs);
            in_submit += t.elapsed();
            let op: OpHandle = sub.op().ok_or("no request accepted")?;
            let st = rt.wait(op, Duration::from_secs(10)).map_err(|e| error_chain(&e))?;
            if let Some(bad) = st.iter().find(|s| !s.is_success()) {
                return Err(format!("{bad:?}"));
            }
        }
        Ok((start.elapsed().as_secs_f64(), in_submit.as_secs_f64()))
    });
    result.map_err(TuttiError::new_err)
}

/// The raw `CUstream` of `obj`: an int, or an object with `cuda_stream`
/// (PyTorch) or `ptr` (CuPy) holding one.
fn stream_handle(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(v) = obj.extract::<u64>() {
        return Ok(v);
    }
    for attr in ["cuda_stream", "ptr"] {
        if let Ok(v) = obj.getattr(attr) {
            return v.extract::<u64>();
        }
    }
    Err(pyo3::exceptions::PyTypeError::new_err(
        "stream must be a torch.cuda.Stream, a CuPy Stream or a CUstream handle (int)",
    ))
}
