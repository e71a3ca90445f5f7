//! Python bindings of tutti (the runtime) and tutti-kv, built with PyO3 as
//! one abi3 extension module, `tutti._tutti`, re-exported by the pure-Python
//! package `tutti` (crates/python/python/tutti). docs/python.md is the
//! guide.
//!
//! Handles are Python ints (the runtime's 64-bit handles, checked on every
//! use); buffers, CUDA arrays and DLPack tensors become registrations
//! (`memory.rs`); errors become exceptions (`errors.rs`); no call panics
//! into Python: input-derived values are never unwrapped.

// Unsafe is needed to register memory exported by Python objects with the
// runtime (its `register_memory` contract), and to speak the C buffer
// protocol and DLPack (`ffi.rs`, `memory.rs`), which PyO3's stable-ABI
// build for Python 3.9 does not wrap. Each block states why it is sound.
#![allow(unsafe_code)]

mod deferred;
mod errors;
mod ffi;
mod kv;
mod memory;
mod registrar;
mod registration;
mod request;
mod runtime;
mod shared;
mod status;
mod status_kind;

use pyo3::prelude::*;

/// The `tutti._tutti` extension module.
#[pymodule]
fn _tutti(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<runtime::PyRuntime>()?;
    m.add_class::<registration::Memory>()?;
    m.add_class::<shared::SharedBuffer>()?;
    m.add_class::<runtime::ShutdownReport>()?;
    m.add_class::<request::Request>()?;
    m.add_class::<request::Operation>()?;
    m.add_class::<status::Status>()?;
    m.add_class::<status::ItemStatus>()?;
    status_kind::register(m)?;
    m.add_function(wrap_pyfunction!(request::read, m)?)?;
    m.add_function(wrap_pyfunction!(request::write, m)?)?;
    m.add_function(wrap_pyfunction!(request::flush, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_rust_roundtrip, m)?)?;
    kv::register(m)?;
    Ok(())
}
