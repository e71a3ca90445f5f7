//! Exceptions: one Python class per family of runtime and kv errors, each
//! carrying the full message of the Rust error and its sources
//! (`tutti::error_chain`).
//!
//! ```text
//! TuttiError(Exception)
//! ├── ConfigError              configuration refused
//! ├── HandleError              stale, foreign or forged handle
//! ├── UriError                 malformed URI, unknown store, refused key
//! ├── MemoryRegistrationError  register/unregister refused, memory busy
//! ├── DeviceError              controller, PCI, emulator, drive busy, unknown drive
//! ├── GpuError                 CUDA/GPU path
//! ├── RequestError             requests not accepted at submit (.statuses, .operation)
//! ├── ShutdownError            the runtime is shutting down
//! ├── KvError                  store-level errors of tutti-kv
//! └── TimeoutError             (also a builtin TimeoutError)
//! ```

use pyo3::exceptions::{PyException, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use tutti::error_chain;
use tutti_kv::KvError as RsKvError;

pyo3::create_exception!(tutti, TuttiError, PyException, "Base class of every tutti error.");
pyo3::create_exception!(tutti, ConfigError, TuttiError, "The runtime configuration was refused.");
pyo3::create_exception!(
    tutti,
    HandleError,
    TuttiError,
    "A handle is stale (closed, released), foreign (another runtime's) or forged."
);
pyo3::create_exception!(
    tutti,
    UriError,
    TuttiError,
    "A URI does not parse, names an unknown store, or its key is refused."
);
pyo3::create_exception!(
    tutti,
    MemoryRegistrationError,
    TuttiError,
    "Registering or unregistering memory was refused (unsupported or non-contiguous object, wrong GPU, memory still in use)."
);
pyo3::create_exception!(
    tutti,
    DeviceError,
    TuttiError,
    "A drive failed: controller, PCI device, emulator, drive busy, or an unknown drive name."
);
pyo3::create_exception!(
    tutti,
    GpuError,
    TuttiError,
    "The GPU path failed (no CUDA driver or GPU, or a CUDA call)."
);
pyo3::create_exception!(
    tutti,
    RequestError,
    TuttiError,
    "Requests were not accepted at submit. `.statuses` holds one Status per request (the refused ones are \"not_accepted\"); `.operation` is the Operation of the accepted ones, or None."
);
pyo3::create_exception!(
    tutti,
    ShutdownError,
    TuttiError,
    "The runtime is shutting down and accepts no new work."
);
pyo3::create_exception!(
    tutti,
    KvError,
    TuttiError,
    "A tutti-kv store could not be opened or a call could not run."
);
pyo3::create_exception!(
    tutti,
    StoreLeasedError,
    KvError,
    "Another writer (another runtime of this process, another process, or a process elsewhere that renews its lease) holds the store's lease on the media: one writer per store. Open it with read_only=True to read beside it."
);

static TIMEOUT_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `tutti.TimeoutError`: subclass of both `TuttiError` and the builtin
/// `TimeoutError`, made once with `type(...)` (two bases).
pub fn timeout_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    TIMEOUT_ERROR
        .get_or_try_init(py, || {
            let bases = PyTuple::new(py, [py.get_type::<TuttiError>(), py.get_type::<PyTimeoutError>()])?;
            let ns = PyDict::new(py);
            ns.set_item("__module__", "tutti")?;
            ns.set_item("__doc__", "A wait passed its deadline. Also a builtin TimeoutError.")?;
            let t = py.get_type::<PyType>().call1(("TimeoutError", bases, ns))?;
            Ok::<_, PyErr>(t.cast_into::<PyType>()?.unbind())
        })
        .map(|t| t.bind(py))
}

/// The exception for a runtime error, with its full message.
pub fn runtime_error(e: &tutti::Error) -> PyErr {
    runtime_error_with(e, error_chain(e))
}

/// The exception class for a runtime error, with message `msg`.
pub fn runtime_error_with(e: &tutti::Error, msg: String) -> PyErr {
    match e {
        tutti::Error::Config(_) => ConfigError::new_err(msg),
        tutti::Error::Handle(_) => HandleError::new_err(msg),
        tutti::Error::Uri { .. } => UriError::new_err(msg),
        tutti::Error::Memory { .. } | tutti::Error::MemoryBusy { .. } => {
            MemoryRegistrationError::new_err(msg)
        }
        tutti::Error::UnknownDrive { .. }
        | tutti::Error::Emulator { .. }
        | tutti::Error::Pci { .. }
        | tutti::Error::Daemon { .. }
        | tutti::Error::DaemonOwned { .. }
        | tutti::Error::Controller { .. }
        | tutti::Error::DriveBusy { .. } => DeviceError::new_err(msg),
        tutti::Error::Gpu { .. } => GpuError::new_err(msg),
        tutti::Error::ShuttingDown => ShutdownError::new_err(msg),
        // BindingMismatch is a configuration whose parts do not fit.
        tutti::Error::BindingMismatch { .. } => ConfigError::new_err(msg),
        // TooManyHandles, TooManyRuntimes and any later variant.
        _ => TuttiError::new_err(msg),
    }
}

/// The exception for a tutti-kv error.
pub fn kv_error(e: &RsKvError) -> PyErr {
    match e {
        RsKvError::Runtime(r) => runtime_error(r),
        RsKvError::MemoryInUse | RsKvError::ForeignMemory => MemoryRegistrationError::new_err(error_chain(e)),
        RsKvError::Gpu(_) | RsKvError::NoGpu => GpuError::new_err(error_chain(e)),
        RsKvError::Leased { .. } => StoreLeasedError::new_err(error_chain(e)),
        _ => KvError::new_err(error_chain(e)),
    }
}

/// Extension trait: `result.py()?` turns a Rust error into its exception.
pub trait IntoPyResult<T> {
    /// The result with its error as a Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, tutti::Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| runtime_error(&e))
    }
}

impl<T> IntoPyResult<T> for Result<T, RsKvError> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| kv_error(&e))
    }
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TuttiError", py.get_type::<TuttiError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("HandleError", py.get_type::<HandleError>())?;
    m.add("UriError", py.get_type::<UriError>())?;
    m.add("MemoryRegistrationError", py.get_type::<MemoryRegistrationError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("GpuError", py.get_type::<GpuError>())?;
    m.add("RequestError", py.get_type::<RequestError>())?;
    m.add("ShutdownError", py.get_type::<ShutdownError>())?;
    m.add("KvError", py.get_type::<KvError>())?;
    m.add("StoreLeasedError", py.get_type::<StoreLeasedError>())?;
    m.add("TimeoutError", timeout_error_type(py)?)?;
    Ok(())
}
