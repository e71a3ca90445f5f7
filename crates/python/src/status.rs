//! Per-request statuses (`tutti.Status`) and per-item statuses of the kv
//! store (`tutti.ItemStatus`), as small frozen Python objects.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use tutti::{error_chain, NvmeStatus, RequestStatus};
use tutti_kv::ItemStatus as RsItemStatus;

/// The final status of one request of a batch, in the order the batch gave
/// them.
///
/// `kind` is one of "success", "not_accepted" (refused at submit; nothing
/// was sent), "nvme" (a drive completed a command with an error status:
/// `sct`, `sc`, `dnr` are set), "timeout" (not final by the wait's
/// deadline), "controller_fatal" (the drive failed; `reset_drive` it),
/// "submit_failed". `ok` is True only for "success": every byte moved and
/// every command completed with NVMe status 0. `message` is the runtime's
/// account of it.
#[pyclass(frozen, module = "tutti", name = "Status")]
#[derive(Debug, Clone)]
pub struct Status {
    /// "success", "not_accepted", "nvme", "timeout", "controller_fatal" or
    /// "submit_failed".
    #[pyo3(get)]
    kind: &'static str,
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
            RequestStatus::Success => base("success", "success".into()),
            RequestStatus::NotAccepted(e) => base("not_accepted", error_chain(e)),
            RequestStatus::Nvme { drive, status } => Self {
                drive: Some(drive.clone()),
                ..Self::nvme(status, format!("drive {drive:?}: {status}"))
            },
            RequestStatus::Timeout => base("timeout", "not complete by the wait's deadline".into()),
            RequestStatus::ControllerFatal { drive } => Self {
                drive: Some(drive.clone()),
                ..base(
                    "controller_fatal",
                    format!(
                        "drive {drive:?} failed (controller fatal status or gone); reset it with reset_drive"
                    ),
                )
            },
            RequestStatus::SubmitFailed { reason } => base("submit_failed", reason.to_string()),
            other => base("submit_failed", format!("{other:?}")),
        }
    }

    /// The status of a request refused at submit.
    pub fn not_accepted(e: &tutti::RequestError) -> Self {
        Self::from_request(&RequestStatus::NotAccepted(e.clone()))
    }

    /// A request the binding refused before anything was submitted.
    pub fn refused(message: String) -> Self {
        Self { kind: "not_accepted", sct: None, sc: None, dnr: None, drive: None, message }
    }

    /// The kind name.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The description.
    pub fn message(&self) -> String {
        self.message.clone()
    }

    fn nvme(status: &NvmeStatus, message: String) -> Self {
        Self {
            kind: "nvme",
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
    /// True only for kind "success".
    #[getter]
    fn ok(&self) -> bool {
        self.kind == "success"
    }

    fn __bool__(&self) -> bool {
        self.ok()
    }

    fn __repr__(&self) -> String {
        match (self.kind, self.sct, self.sc) {
            ("success", ..) => "Status(success)".into(),
            ("nvme", Some(sct), Some(sc)) => format!(
                "Status(nvme, sct={sct:#x}, sc={sc:#x}, dnr={}, drive={:?}: {})",
                self.dnr.unwrap_or(false),
                self.drive.as_deref().unwrap_or(""),
                self.message
            ),
            (kind, ..) => format!("Status({kind}: {})", self.message),
        }
    }
}

/// The outcome of one item of a kv batch.
///
/// `kind` is one of "ok" (a put is durable, a remove done), "hit" (a get
/// loaded `length` bytes whose checksum matched), "miss", "checksum_mismatch"
/// (the bytes read do not match the stored CRC32C: do not use them), "full",
/// "too_large", "bad_value", "device" (a drive failed the I/O; `sct`/`sc`/
/// `dnr` when it gave an NVMe status), "timeout". `ok` is True for "ok" and
/// "hit".
#[pyclass(frozen, module = "tutti", name = "ItemStatus")]
#[derive(Debug, Clone)]
pub struct ItemStatus {
    /// See the class docstring.
    #[pyo3(get)]
    kind: &'static str,
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
            RsItemStatus::Ok => base("ok", "ok".into()),
            RsItemStatus::Hit { len } => Self { length: Some(*len), ..base("hit", format!("hit, {len} bytes")) },
            RsItemStatus::Miss => base("miss", "no object of this key".into()),
            RsItemStatus::ChecksumMismatch { stored, computed } => base(
                "checksum_mismatch",
                format!("payload CRC32C {computed:#010x} differs from the stored {stored:#010x}: do not use the bytes"),
            ),
            RsItemStatus::Full => base("full", "no free slot and nothing evictable".into()),
            RsItemStatus::TooLarge { len, max } => {
                base("too_large", format!("{len} bytes is larger than the store's {max}-byte objects"))
            }
            RsItemStatus::BadValue { reason } => base("bad_value", reason.clone()),
            RsItemStatus::Device { status, drive, message } => {
                let msg = match drive {
                    Some(d) => format!("drive {d:?}: {message}"),
                    None => message.clone(),
                };
                Self {
                    sct: status.map(|s| s.sct),
                    sc: status.map(|s| s.sc),
                    dnr: status.map(|s| s.dnr),
                    ..base("device", msg)
                }
            }
            RsItemStatus::Timeout => base("timeout", "not complete by the wait's deadline".into()),
            other => base("device", format!("{other:?}")),
        }
    }
}

#[pymethods]
impl ItemStatus {
    /// True for "ok" and "hit".
    #[getter]
    fn ok(&self) -> bool {
        matches!(self.kind, "ok" | "hit")
    }

    fn __bool__(&self) -> bool {
        self.ok()
    }

    fn __repr__(&self) -> String {
        match (self.kind, self.length) {
            ("ok", _) => "ItemStatus(ok)".into(),
            ("hit", Some(n)) => format!("ItemStatus(hit, length={n})"),
            (kind, _) => format!("ItemStatus({kind}: {})", self.message),
        }
    }
}
