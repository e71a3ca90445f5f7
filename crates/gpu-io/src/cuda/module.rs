//! [`Module`]: a loaded PTX module, unloaded on drop, and
//! [`load_module`].

use std::ffi::CStr;
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext};

use crate::error::{drv, GpuError};

/// A PTX module loaded into a context (`cuModuleLoadData`), unloaded on
/// drop.
#[derive(Debug)]
pub(crate) struct Module {
    pub(crate) raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: loaded once in `Gpu::open`, unloaded once.
        let _ = unsafe { result::module::unload(self.raw) };
    }
}

/// Loads a PTX image into `ctx` and finds its entry point.
pub(crate) fn load_module(
    ctx: &Arc<CudaContext>,
    ptx: &CStr,
    entry: &CStr,
) -> Result<(Module, sys::CUfunction), GpuError> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: `ptx` is a NUL-terminated PTX image (the constants in
    // crate::ptx are checked at compile time).
    let raw = unsafe { result::module::load_data(ptx.as_ptr().cast()) }.map_err(drv("cuModuleLoadData"))?;
    let module = Module { raw, ctx: ctx.clone() };
    // SAFETY: `raw` is the module just loaded; `module` unloads it on drop.
    let func =
        unsafe { result::module::get_function(raw, entry.to_owned()) }.map_err(drv("cuModuleGetFunction"))?;
    Ok((module, func))
}
