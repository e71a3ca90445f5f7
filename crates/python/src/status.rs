//! Per-request statuses (`tutti.Status`) and per-item statuses of the kv
//! store (`tutti.ItemStatus`), as small frozen Python objects.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use tutti::{error_chain, NvmeStatus, RequestStatus};
use tutti_kv::ItemStatus as RsItemStatus;

use crate::status_kind::{ItemStatusKind, StatusKind};

/// The final status of one request of a batch, in the order the batch gave
/// them.
///
/// `kind` is a `tutti.StatusKind`: SUCCESS, NOT_ACCEPTED (refused at
/// submit; nothing was sent), NVME (a drive completed a command with an
/// error status: `sct`, `sc`, `dnr` are set), TIMEOUT (not final by the
/// wait's deadline), CONTROLLER_FATAL (the drive failed; `reset_drive` it),
/// SUBMIT_FAILED. Its members are `str` whose values are the old strings
/// ("success", "not_accepted", ...), so `kind == "success"` still holds.
/// `ok` is True only for SUCCESS: every byte moved and every command
/// completed with NVMe status 0. `message` is the runtime's account of it.
#[pyclass(frozen, module = "tutti", name = "Status")]
#[derive(Debug, Clone)]
pub struct Status {
    /// What became of the request (Python sees the `tutti.StatusKind`
    /// member).
    kind: StatusKind,
    /// NVMe Status Code Type (NVMe Base 2.0 §4.2.3), for kind "nvme".
    #[pyo3(get)]
    sct: Option<u8>,
    /// NVMe Status Code, for kind "nvme".
    #[pyo3(get)]
    sc: Option<u8>,
    /// NVMe Do Not Retry bit, for kind "nvme".
    #[pyo3(get)]
    dnr: Option<bool>,
    /// The drive that failed the request, when one did.
    #[pyo3(get)]
    drive: Option<String>,
    /// The runtime's description of the status.
    #[pyo3(get)]
    message: String,
}

/// The one `Status(success)` object every successful request shares
/// (statuses are frozen), so a batch of successes costs a reference each,
/// not an object each.
static SUCCESS: PyOnceLock<Py<Status>> = PyOnceLock::new();

impl Status {
    /// The Python object for a runtime status: the shared success object,
    /// or a new one.
    pub fn to_py(py: Python<'_>, s: &RequestStatus) -> PyResult<Py<Status>> {
        if s.is_success() {
            let ok = SUCCESS.get_or_try_init(py, || Py::new(py, Self::from_request(s)))?;
            return Ok(ok.clone_ref(py));
        }
        Py::new(py, Self::from_request(s))
    }

    /// The Python status for a runtime status.
    pub fn from_request(s: &RequestStatus) -> Self {
        let base =
            |kind, message: String| Self { kind, sct: None, sc: None, dnr: None, drive: None, message };
        match s {
            RequestStatus::Success => base(StatusKind::Success, "success".into()),
            RequestStatus::NotAccepted(e) => base(StatusKind::NotAccepted, error_chain(e)),
            RequestStatus::Nvme { drive, status } => Self {
                drive: Some(drive.clone()),
                ..Self::nvme(status, format!("drive {drive:?}: {status}"))
            },
            RequestStatus::Timeout => base(StatusKind::Timeout, "not complete by the wait's deadline".into()),
            RequestStatus::ControllerFatal { drive } => Self {
                drive: Some(drive.clone()),
                ..base(
                    StatusKind::ControllerFatal,
                    format!(
                        "drive {drive:?} failed (controller fatal status or gone); reset it with reset_drive"
                    ),
                )
            },
            RequestStatus::SubmitFailed { reason } => base(StatusKind::SubmitFailed, reason.to_string()),
            other => base(StatusKind::SubmitFailed, format!("{other:?}")),
        }
    }

    /// The status of a request refused at submit.
    pub fn not_accepted(e: &tutti::RequestError) -> Self {
        Self::from_request(&RequestStatus::NotAccepted(e.clone()))
    }

    /// A request the binding refused before anything was submitted.
    pub fn refused(message: String) -> Self {
        Self { kind: StatusKind::NotAccepted, sct: None, sc: None, dnr: None, drive: None, message }
    }

    /// What became of the request.
    pub fn status_kind(&self) -> StatusKind {
        self.kind
    }

    /// The description.
    pub fn message(&self) -> String {
        self.message.clone()
    }

    fn nvme(status: &NvmeStatus, message: String) -> Self {
        Self {
            kind: StatusKind::Nvme,
            sct: Some(status.sct),
            sc: Some(status.sc),
            dnr: Some(status.dnr),
            drive: None,
            message,
        }
    }
}

#[pymethods]
impl Status {
    /// A `tutti.StatusKind` member (a `str` enum: its value is the old
    /// string kind).
    #[getter]
    fn kind<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.kind.to_py(py)
    }

    /// True only for `StatusKind.SUCCESS`.
    #[getter]
    fn ok(&self) -> bool {
        self.kind == StatusKind::Success
    }

    fn __bool__(&self) -> bool {
        self.ok()
    }

    fn __repr__(&self) -> String {
        match (self.kind, self.sct, self.sc) {
            (StatusKind::Success, ..) => "Status(success)".into(),
            (StatusKind::Nvme, Some(sct), Some(sc)) => format!(
                "Status(nvme, sct={sct:#x}, sc={sc:#x}, dnr={}, drive={:?}: {})",
                self.dnr.unwrap_or(false),
                self.drive.as_deref().unwrap_or(""),
                self.message
            ),
            (kind, ..) => format!("Status({}: {})", kind.as_str(), self.message),
        }
    }
}

/// The outcome of one item of a kv batch.
///
/// `kind` is a `tutti.ItemStatusKind`: OK (a put is durable, a remove
/// done), HIT (a get loaded `length` bytes whose checksum matched), MISS,
/// CHECKSUM_MISMATCH (the bytes read do not match the stored CRC32C: do not
/// use them), FULL, TOO_LARGE, BAD_VALUE, DEVICE (a drive failed the I/O;
/// `sct`/`sc`/`dnr` when it gave an NVMe status), TIMEOUT. Its members are
/// `str` whose values are the old strings ("ok", "hit", ...). `ok` is True
/// for OK and HIT.
#[pyclass(frozen, module = "tutti", name = "ItemStatus")]
#[derive(Debug, Clone)]
pub struct ItemStatus {
    /// The outcome (Python sees the `tutti.ItemStatusKind` member).
    kind: ItemStatusKind,
    /// Payload length in bytes, for "hit".
    #[pyo3(get)]
    length: Option<u64>,
    /// NVMe Status Code Type, for "device" with an NVMe status.
    #[pyo3(get)]
    sct: Option<u8>,
    /// NVMe Status Code, for "device" with an NVMe status.
    #[pyo3(get)]
    sc: Option<u8>,
    /// NVMe Do Not Retry bit, for "device" with an NVMe status.
    #[pyo3(get)]
    dnr: Option<bool>,
    /// Description of the outcome.
    #[pyo3(get)]
    message: String,
}

impl ItemStatus {
    /// The Python status for a kv item status.
    pub fn from_item(s: &RsItemStatus) -> Self {
        let base =
            |kind, message: String| Self { kind, length: None, sct: None, sc: None, dnr: None, message };
        match s {
            RsItemStatus::Ok => base(ItemStatusKind::Ok, "ok".into()),
            RsItemStatus::Hit { len } => {
                Self { length: Some(*len), ..base(ItemStatusKind::Hit, format!("hit, {len} bytes")) }
            }
            RsItemStatus::Miss => base(ItemStatusKind::Miss, "no object of this key".into()),
            RsItemStatus::ChecksumMismatch { stored, computed } => base(
                ItemStatusKind::ChecksumMismatch,
                format!("payload CRC32C {computed:#010x} differs from the stored {stored:#010x}: do not use the bytes"),
            ),
            RsItemStatus::Full => base(ItemStatusKind::Full, "no free slot and nothing evictable".into()),
            RsItemStatus::TooLarge { len, max } => {
                base(ItemStatusKind::TooLarge, format!("{len} bytes is larger than the store's {max}-byte objects"))
            }
            RsItemStatus::BadValue { reason } => base(ItemStatusKind::BadValue, reason.clone()),
            RsItemStatus::Device { status, drive, message } => {
                let msg = match drive {
                    Some(d) => format!("drive {d:?}: {message}"),
                    None => message.clone(),
                };
                Self {
                    sct: status.map(|s| s.sct),
                    sc: status.map(|s| s.sc),
                    dnr: status.map(|s| s.dnr),
                    ..base(ItemStatusKind::Device, msg)
                }
            }
            RsItemStatus::Timeout => base(ItemStatusKind::Timeout, "not complete by the wait's deadline".into()),
            other => base(ItemStatusKind::Device, format!("{other:?}")),
        }
    }
}

#[pymethods]
impl ItemStatus {
    /// An `tutti.ItemStatusKind` member (a `str` enum: its value is the
    /// old string kind).
    #[getter]
    fn kind<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.kind.to_py(py)
    }

    /// True for `ItemStatusKind.OK` and `ItemStatusKind.HIT`.
    #[getter]
    fn ok(&self) -> bool {
        matches!(self.kind, ItemStatusKind::Ok | ItemStatusKind::Hit)
    }

    fn __bool__(&self) -> bool {
        self.ok()
    }

    fn __repr__(&self) -> String {
        match (self.kind, self.length) {
            (ItemStatusKind::Ok, _) => "ItemStatus(ok)".into(),
            (ItemStatusKind::Hit, Some(n)) => format!("ItemStatus(hit, length={n})"),
            (kind, _) => format!("ItemStatus({}: {})", kind.as_str(), self.message),
        }
    }
}
