//! The parts of CPython's buffer protocol (PEP 3118) and of DLPack that
//! PyO3's stable-ABI build for Python 3.9 does not declare.
//!
//! `PyObject_GetBuffer`, `PyBuffer_Release` and `Py_buffer` entered the
//! limited API in Python 3.11, but both functions have been exported by
//! every CPython 3 interpreter with this struct layout (unchanged since
//! Python 3.3), so an abi3 wheel built for 3.9 can call them on CPython
//! 3.9 and 3.10 as well.

use std::ffi::{c_char, c_int, c_void};

use pyo3::ffi::{PyObject, Py_ssize_t};

/// `Py_buffer` (CPython `Include/pybuffer.h`).
#[repr(C)]
#[derive(Debug)]
pub struct PyBuffer {
    pub buf: *mut c_void,
    pub obj: *mut PyObject,
    pub len: Py_ssize_t,
    pub itemsize: Py_ssize_t,
    pub readonly: c_int,
    pub ndim: c_int,
    pub format: *mut c_char,
    pub shape: *mut Py_ssize_t,
    pub strides: *mut Py_ssize_t,
    pub suboffsets: *mut Py_ssize_t,
    pub internal: *mut c_void,
}

impl PyBuffer {
    /// An empty view for `PyObject_GetBuffer` to fill.
    pub fn empty() -> Self {
        Self {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        }
    }
}

/// `PyBUF_FORMAT | PyBUF_STRIDES` (= `PyBUF_RECORDS_RO`): shape and strides,
/// no indirect (suboffset) arrays, read-only exports allowed.
pub const PYBUF_RECORDS_RO: c_int = 0x0004 | 0x0010 | 0x0008;

extern "C" {
    pub fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut PyBuffer, flags: c_int) -> c_int;
    pub fn PyBuffer_Release(view: *mut PyBuffer);
}

/// DLPack `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DlDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// DLPack `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DlDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// DLPack `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DlTensor {
    pub data: *mut c_void,
    pub device: DlDevice,
    pub ndim: i32,
    pub dtype: DlDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// DLPack `DLManagedTensor` (the unversioned capsule "dltensor").
#[repr(C)]
#[derive(Debug)]
pub struct DlManagedTensor {
    pub dl_tensor: DlTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// DLPack device types.
pub const KDL_CPU: i32 = 1;
/// CUDA device memory.
pub const KDL_CUDA: i32 = 2;
/// Pinned host memory (cudaMallocHost).
pub const KDL_CUDA_HOST: i32 = 3;
