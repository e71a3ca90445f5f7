//! Turning a Python object into memory the runtime can register: the
//! buffer protocol (host), `__cuda_array_interface__` v2/v3 (GPU), DLPack
//! `__dlpack__` (GPU or host). An [`Export`] holds what keeps the memory
//! alive and in place (a strong reference to the exporter, the buffer view,
//! the DLPack capsule's tensor) until it is released after a successful
//! unregister (`registration.rs` holds it in a `tutti.Memory`).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::MemoryRegistrationError;
use crate::ffi::{self, DlManagedTensor, PyBuffer};

/// Where the memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Host memory.
    Host,
    /// Device memory of a GPU (device pointer).
    Gpu,
}

impl Location {
    /// "host" or "gpu".
    pub fn name(self) -> &'static str {
        match self {
            Location::Host => "host",
            Location::Gpu => "gpu",
        }
    }
}

/// What must be released when the registration ends.
#[derive(Debug)]
enum Hold {
    /// Nothing but the reference to the exporter (CUDA array interface).
    Reference,
    /// A buffer view (host memory).
    Buffer(Box<PyBuffer>),
    /// A consumed DLPack tensor whose deleter is ours to call.
    Dlpack(*mut DlManagedTensor),
}

/// Memory exported by a Python object, kept alive and in place while held.
#[derive(Debug)]
pub struct Export {
    /// Address (host pointer or CUDA device pointer) of the first byte.
    pub ptr: u64,
    /// Length, bytes.
    pub len: usize,
    /// Host or GPU.
    pub location: Location,
    /// Whether the exporter marked it read-only.
    pub readonly: bool,
    owner: Option<Py<PyAny>>,
    hold: Hold,
}

// SAFETY: the raw pointers in `Hold` (a buffer view, a DLPack tensor) are
// only used in `release`, which runs with the GIL held; nothing else reads
// or writes through them, so moving or sharing the value between threads
// is sound.
unsafe impl Send for Export {}
// SAFETY: as above; `&Export` gives no access to the pointers.
unsafe impl Sync for Export {}

/// `MemoryRegistrationError(msg)`.
fn refuse(msg: impl Into<String>) -> PyErr {
    MemoryRegistrationError::new_err(msg.into())
}

/// Whether `strides` (bytes) are those of a C-contiguous array of `shape`
/// with `itemsize`-byte items (dimensions of extent 1 may have any stride).
fn c_contiguous(shape: &[i64], strides: &[i64], itemsize: i64) -> bool {
    let mut expect = itemsize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n > 1 && s != expect {
            return false;
        }
        expect = expect.saturating_mul(n.max(1));
    }
    true
}

/// Whether a PEP 3118 struct format has an 'O' (object pointer) code;
/// field names (`:name:`, as in `T{i:a:O:b:}`) are skipped.
fn format_has_objects(format: &[u8]) -> bool {
    let mut in_name = false;
    for &c in format {
        match c {
            b':' => in_name = !in_name,
            b'O' if !in_name => return true,
            _ => {}
        }
    }
    false
}

/// Product of `shape` times `itemsize`, bytes; `None` on overflow or a
/// negative extent.
fn byte_len(shape: &[i64], itemsize: i64) -> Option<usize> {
    shape
        .iter()
        .try_fold(usize::try_from(itemsize).ok()?, |acc, &n| acc.checked_mul(usize::try_from(n).ok()?))
}

impl Export {
    /// Exports `obj`: a `tutti.SharedBuffer` (its own mapping), a GPU array
    /// (`__cuda_array_interface__`, then
    /// `__dlpack__` for non-CPU devices), else a buffer-protocol object,
    /// else a host DLPack tensor.
    pub fn from_object(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(sb) = obj.cast::<crate::shared::SharedBuffer>() {
            // Its own mapping, held by the reference to the object.
            let sb = sb.get();
            return Ok(Export {
                ptr: sb.ptr(),
                len: sb.len(),
                location: Location::Host,
                readonly: false,
                owner: Some(obj.clone().unbind()),
                hold: Hold::Reference,
            });
        }
        if obj.hasattr("__cuda_array_interface__")? {
            return Self::from_cai(obj);
        }
        if obj.hasattr("__dlpack__")? && !Self::dlpack_on_cpu(obj)? {
            return Self::from_dlpack(obj);
        }
        match Self::from_buffer(obj)? {
            Ok(e) => Ok(e),
            Err(_) if obj.hasattr("__dlpack__")? => Self::from_dlpack(obj),
            Err(not_a_buffer) => Err(not_a_buffer),
        }
    }

    /// The GPU ordinal of a GPU export (`None`: unknown or host).
    pub fn check_gpu_device(obj: &Bound<'_, PyAny>, want: i64) -> PyResult<()> {
        let Some(dev) = Self::gpu_device(obj)? else { return Ok(()) };
        if dev != want {
            return Err(refuse(format!(
                "the array is on GPU {dev}, but the runtime drives GPU {want}: move it there first (e.g. tensor.to(\"cuda:{want}\"))"
            )));
        }
        Ok(())
    }

    /// The CUDA device of a GPU array: `__dlpack_device__()`, else
    /// `.device.index` (torch) or `.device.id` (CuPy).
    fn gpu_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
        if obj.hasattr("__dlpack_device__")? {
            let (_, id): (i64, i64) = obj.call_method0("__dlpack_device__")?.extract()?;
            return Ok(Some(id));
        }
        let Ok(dev) = obj.getattr("device") else { return Ok(None) };
        for attr in ["index", "id"] {
            if let Ok(v) = dev.getattr(attr) {
                if let Ok(i) = v.extract::<i64>() {
                    return Ok(Some(i));
                }
            }
        }
        Ok(None)
    }

    fn dlpack_on_cpu(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
        if !obj.hasattr("__dlpack_device__")? {
            return Ok(false);
        }
        let (kind, _): (i32, i64) = obj.call_method0("__dlpack_device__")?.extract()?;
        Ok(kind == ffi::KDL_CPU || kind == ffi::KDL_CUDA_HOST)
    }

    /// A contiguous buffer-protocol object (bytes, bytearray, memoryview,
    /// numpy array, array.array, mmap...). `Ok(Err(e))` when `obj` exports
    /// no buffer at all; `Err` when its buffer cannot be registered.
    fn from_buffer(obj: &Bound<'_, PyAny>) -> PyResult<PyResult<Self>> {
        let mut view = Box::new(PyBuffer::empty());
        // SAFETY: `obj` is a live object (we hold the GIL through `obj`'s
        // token) and `view` points to a writable, properly laid out
        // Py_buffer that outlives the call.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PYBUF_RECORDS_RO) };
        if rc != 0 {
            let cause = PyErr::take(obj.py()).map(|e| e.to_string()).unwrap_or_default();
            return Ok(Err(refuse(format!(
                "cannot register a {}: not a buffer, CUDA array or DLPack tensor ({cause})",
                obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))));
        }
        let export = Export {
            ptr: view.buf as u64,
            len: usize::try_from(view.len).unwrap_or(0),
            location: Location::Host,
            readonly: view.readonly != 0,
            owner: Some(obj.clone().unbind()),
            hold: Hold::Buffer(view),
        };
        if let Hold::Buffer(v) = &export.hold {
            // `export` is dropped on each refusal, releasing the view.
            if !Self::buffer_contiguous(v) {
                return Err(refuse("the buffer is not C-contiguous (e.g. a strided slice a[::2]); register a contiguous array (np.ascontiguousarray)"));
            }
            if Self::holds_objects(v) {
                return Err(refuse("the buffer holds Python object pointers (dtype=object, struct format 'O'): bytes read into it would be dereferenced as objects; register an array of plain numbers"));
            }
        }
        Ok(Ok(export))
    }

    /// Whether the items are `PyObject *` (format code 'O', e.g. a numpy
    /// array of dtype=object or a structured dtype with an object field):
    /// a read into them would plant forged object pointers.
    fn holds_objects(v: &PyBuffer) -> bool {
        if v.format.is_null() {
            return false;
        }
        // SAFETY: a filled Py_buffer requested with PyBUF_FORMAT has a
        // NUL-terminated format string (or NULL: "B"), valid while the view
        // is held.
        let format = unsafe { std::ffi::CStr::from_ptr(v.format) }.to_bytes();
        format_has_objects(format)
    }

    fn buffer_contiguous(v: &PyBuffer) -> bool {
        if !v.suboffsets.is_null() {
            return false;
        }
        if v.strides.is_null() || v.shape.is_null() || v.ndim <= 0 {
            return true;
        }
        let n = usize::try_from(v.ndim).unwrap_or(0);
        // SAFETY: a filled Py_buffer with PyBUF_STRIDES has `ndim` entries
        // in `shape` and `strides`, valid while the view is held.
        let (shape, strides) =
            unsafe { (std::slice::from_raw_parts(v.shape, n), std::slice::from_raw_parts(v.strides, n)) };
        let shape: Vec<i64> = shape.iter().map(|&x| x as i64).collect();
        let strides: Vec<i64> = strides.iter().map(|&x| x as i64).collect();
        c_contiguous(&shape, &strides, v.itemsize as i64)
    }

    /// `__cuda_array_interface__` v2/v3: data (ptr, readonly), shape,
    /// strides (None or C-contiguous), typestr (its item size).
    fn from_cai(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let cai = obj.getattr("__cuda_array_interface__")?;
        let cai = cai.cast::<PyDict>().map_err(|_| refuse("__cuda_array_interface__ is not a dict"))?;
        let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            cai.get_item(k)?.ok_or_else(|| refuse(format!("__cuda_array_interface__ has no {k:?}")))
        };
        let (ptr, readonly): (u64, bool) = get("data")?.extract()?;
        let shape: Vec<i64> = get("shape")?.extract()?;
        let typestr: String = get("typestr")?.extract()?;
        let itemsize: i64 = typestr
            .get(2..)
            .and_then(|s| s.parse().ok())
            .filter(|&n: &i64| n > 0)
            .ok_or_else(|| refuse(format!("unsupported typestr {typestr:?}")))?;
        if let Some(strides) = cai.get_item("strides")?.filter(|s| !s.is_none()) {
            let strides: Vec<i64> = strides.extract()?;
            if strides.len() != shape.len() || !c_contiguous(&shape, &strides, itemsize) {
                return Err(refuse(
                    "the CUDA array is not C-contiguous; register a contiguous array (.contiguous())",
                ));
            }
        }
        let len = byte_len(&shape, itemsize).ok_or_else(|| refuse("the CUDA array's size overflows"))?;
        Ok(Export {
            ptr,
            len,
            location: Location::Gpu,
            readonly,
            owner: Some(obj.clone().unbind()),
            hold: Hold::Reference,
        })
    }

    /// A DLPack tensor: `obj.__dlpack__()` gives a capsule "dltensor"; it is
    /// renamed "used_dltensor" (we own it now) and its deleter is called at
    /// release.
    fn from_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let capsule = obj.call_method0("__dlpack__")?;
        // SAFETY: `capsule` is a live object; PyCapsule_GetPointer checks
        // its type and name and returns null (with an exception) otherwise.
        let managed = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr()) }
            .cast::<DlManagedTensor>();
        if managed.is_null() {
            let cause = PyErr::take(obj.py()).map(|e| e.to_string()).unwrap_or_default();
            return Err(refuse(format!(
                "__dlpack__ did not return an unused \"dltensor\" capsule ({cause})"
            )));
        }
        // SAFETY: as above; the name is a static C string, as the capsule
        // keeps the pointer.
        if unsafe { pyo3::ffi::PyCapsule_SetName(capsule.as_ptr(), c"used_dltensor".as_ptr()) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // From here we own `managed` and must call its deleter.
        let hold = Hold::Dlpack(managed);
        // SAFETY: a "dltensor" capsule holds a valid DLManagedTensor that
        // stays valid until its deleter is called (by us, at release).
        let t = unsafe { &(*managed).dl_tensor };
        let mut export = Export {
            ptr: 0,
            len: 0,
            location: Location::Host,
            readonly: false,
            owner: Some(obj.clone().unbind()),
            hold,
        };
        let location = match t.device.device_type {
            ffi::KDL_CUDA => Location::Gpu,
            ffi::KDL_CPU | ffi::KDL_CUDA_HOST => Location::Host,
            other => return Err(refuse(format!("DLPack device type {other} is neither CPU nor CUDA"))),
        };
        let (shape, strides) = dl_shape(t)?;
        let bits = u32::from(t.dtype.bits) * u32::from(t.dtype.lanes);
        let itemsize = i64::from(bits.div_ceil(8));
        if let Some(strides) = strides {
            let bytes: Vec<i64> = strides.iter().map(|s| s.saturating_mul(itemsize)).collect();
            if !c_contiguous(&shape, &bytes, itemsize) {
                return Err(refuse(
                    "the DLPack tensor is not compact (C-contiguous); register a contiguous tensor",
                ));
            }
        }
        export.len =
            byte_len(&shape, itemsize).ok_or_else(|| refuse("the DLPack tensor's size overflows"))?;
        export.ptr = (t.data as u64).wrapping_add(t.byte_offset);
        export.location = location;
        Ok(export)
    }

    /// Releases the buffer view or the DLPack tensor and the reference to
    /// the exporter. Call only when no device can touch the memory any more.
    pub fn release(mut self, py: Python<'_>) {
        self.release_in_place(py);
    }

    fn release_in_place(&mut self, _py: Python<'_>) {
        match std::mem::replace(&mut self.hold, Hold::Reference) {
            Hold::Reference => {}
            Hold::Buffer(mut view) => {
                // SAFETY: `view` was filled by a successful PyObject_GetBuffer
                // and is released once; the GIL is held (`_py`).
                unsafe { ffi::PyBuffer_Release(&mut *view) };
            }
            Hold::Dlpack(managed) => {
                // SAFETY: we own the consumed tensor (the capsule was renamed)
                // and call its deleter exactly once, as DLPack requires.
                if let Some(deleter) = unsafe { (*managed).deleter } {
                    // SAFETY: as above.
                    unsafe { deleter(managed) };
                }
            }
        }
        self.owner = None;
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        if matches!(self.hold, Hold::Reference) && self.owner.is_none() {
            return;
        }
        Python::attach(|py| self.release_in_place(py));
    }
}

/// Shape and strides (elements) of a DLPack tensor.
fn dl_shape(t: &ffi::DlTensor) -> PyResult<(Vec<i64>, Option<Vec<i64>>)> {
    let n = usize::try_from(t.ndim).map_err(|_| refuse("negative DLPack ndim"))?;
    if n == 0 {
        return Ok((Vec::new(), None));
    }
    if t.shape.is_null() {
        return Err(refuse("DLPack tensor without a shape"));
    }
    // SAFETY: DLPack gives `ndim` shape entries (and strides when not null),
    // valid while the managed tensor lives (until its deleter runs).
    let shape = unsafe { std::slice::from_raw_parts(t.shape, n) }.to_vec();
    let strides = (!t.strides.is_null())
        // SAFETY: as above.
        .then(|| unsafe { std::slice::from_raw_parts(t.strides, n) }.to_vec());
    Ok((shape, strides))
}

/// A `(shape..)` tuple of ints for reprs.
pub fn describe(e: &Export) -> String {
    format!("{} bytes of {} memory{}", e.len, e.location.name(), if e.readonly { ", read-only" } else { "" })
}
