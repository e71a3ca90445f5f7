//! The kinds of `tutti.Status` and `tutti.ItemStatus` (issue 27: typed
//! errors at the Python boundary). Rust enums here; in Python the members of
//! `tutti.StatusKind` and `tutti.ItemStatusKind`, `str` enums defined in
//! `python/tutti/_status_kind.py` whose values are the strings `kind` was
//! before, so `status.kind == "success"` keeps working.
//!
//! [`register`] imports those classes once, when the extension module
//! loads, and adds them to it; the getters hand out their members.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The Python module that defines the enum classes.
const MODULE: &str = "tutti._status_kind";

static STATUS_KIND: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static ITEM_STATUS_KIND: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// What became of one request of a runtime batch (`tutti.StatusKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatusKind {
    /// "success": every byte moved, every command completed with status 0.
    Success,
    /// "not_accepted": refused at submit; nothing was sent.
    NotAccepted,
    /// "nvme": a drive completed a command with an error status.
    Nvme,
    /// "timeout": not final by the wait's deadline.
    Timeout,
    /// "controller_fatal": the drive failed.
    ControllerFatal,
    /// "submit_failed": accepted, but the runtime could not send it.
    SubmitFailed,
}

impl StatusKind {
    /// The value of the Python member (the old string `kind`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::NotAccepted => "not_accepted",
            Self::Nvme => "nvme",
            Self::Timeout => "timeout",
            Self::ControllerFatal => "controller_fatal",
            Self::SubmitFailed => "submit_failed",
        }
    }

    /// The `tutti.StatusKind` member.
    pub fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        STATUS_KIND.import(py, MODULE, "StatusKind")?.call1((self.as_str(),))
    }
}

/// The outcome of one item of a kv batch (`tutti.ItemStatusKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemStatusKind {
    /// "ok": a put is durable, a remove done.
    Ok,
    /// "hit": a get loaded the object and its checksum matched.
    Hit,
    /// "miss": no object of this key.
    Miss,
    /// "checksum_mismatch": the bytes read do not match the stored CRC32C.
    ChecksumMismatch,
    /// "full": no free slot and nothing evictable.
    Full,
    /// "too_large": larger than the store's objects.
    TooLarge,
    /// "bad_value": the item itself is invalid.
    BadValue,
    /// "device": a drive failed the I/O.
    Device,
    /// "timeout": not complete by the wait's deadline.
    Timeout,
}

impl ItemStatusKind {
    /// The value of the Python member (the old string `kind`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::ChecksumMismatch => "checksum_mismatch",
            Self::Full => "full",
            Self::TooLarge => "too_large",
            Self::BadValue => "bad_value",
            Self::Device => "device",
            Self::Timeout => "timeout",
        }
    }

    /// The `tutti.ItemStatusKind` member.
    pub fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        ITEM_STATUS_KIND.import(py, MODULE, "ItemStatusKind")?.call1((self.as_str(),))
    }
}

/// Imports the two enum classes and adds them to the extension module, so
/// `tutti._tutti.StatusKind` is the class the getters use.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("StatusKind", STATUS_KIND.import(py, MODULE, "StatusKind")?)?;
    m.add("ItemStatusKind", ITEM_STATUS_KIND.import(py, MODULE, "ItemStatusKind")?)?;
    Ok(())
}
