//! [`Gpu`]: one GPU's CUDA context with the tutti kernels loaded, made of
//! parts that own their state: the I/O stream and the gate of memory
//! management ([`Quiesce`]), the I/O kernel with its launch slots
//! ([`IoKernel`], `launch/`), the checksum engine ([`Crc32cEngine`],
//! `crc32c/`) and the emulator's copy lanes ([`CopyLanes`]). `Gpu`'s
//! methods live beside what they drive: launches in `launch/`, checksums
//! in `crc32c/`, null controllers in `null_ctrl.rs`, page locking for the
//! emulator in `emulated_dma.rs`.

use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext};

use crate::copy_lanes::CopyLanes;
use crate::crc32c::engine::Crc32cEngine;
use crate::cuda::{load_module, Quiesce, Stream};
use crate::error::{drv, GpuError};
use crate::launch::kernel::IoKernel;
use crate::ptx::{TUTTI_CRC32C_ENTRY_C, TUTTI_CRC32C_PTX_C, TUTTI_IO_ENTRY_C};

/// A GPU with the tutti kernels loaded.
#[derive(Debug)]
pub struct Gpu {
    /// The I/O stream and the gate of memory management (`Quiesce`).
    pub(crate) quiet: Arc<Quiesce>,
    /// `tutti_io` and `tutti_ring_probe`, their module and the reusable
    /// launch buffers (`launch/`).
    pub(crate) io: IoKernel,
    /// `tutti_crc32c` (see [`Gpu::crc32c`]), its module, its own stream and
    /// its scratch (`crc32c/`).
    pub(crate) crc: Crc32cEngine,
    /// The emulator's copy streams and fences for this GPU's buffers
    /// (`copy_lanes.rs`).
    pub(crate) copy_lanes: Arc<CopyLanes>,
    /// Declared last: dropped after everything made in it.
    pub(crate) ctx: Arc<CudaContext>,
}

// SAFETY: CUfunction/CUmodule are handles valid in any thread once the
// context is bound, which every method does first.
unsafe impl Send for Gpu {}
// SAFETY: the handles are never changed after `open`, so `&Gpu` only reads
// them; the CUDA driver API is thread-safe, and launches from several
// threads onto the one non-blocking stream (`Stream::new`) are queued and
// run in the order the driver receives them.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Opens GPU `ordinal` and loads the kernels. [`GpuError::NoDriver`]
    /// when the CUDA driver library is absent (checked first: nothing else
    /// touches CUDA then).
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuCtxCreate"))?;
        let io_ptx = crate::ptx::io_ptx()?;
        let (module, func) = load_module(&ctx, &io_ptx, TUTTI_IO_ENTRY_C)?;
        // Looked up only when the PTX has it (a failed lookup would be a
        // driver error that tools such as compute-sanitizer report).
        let probe_entry = format!(".entry {}(", crate::ptx::TUTTI_RING_PROBE_ENTRY);
        let probe_func = if io_ptx.to_bytes().windows(probe_entry.len()).any(|w| w == probe_entry.as_bytes())
        {
            // SAFETY: `module.raw` is the module just loaded, alive in `module`.
            unsafe {
                result::module::get_function(module.raw, crate::ptx::TUTTI_RING_PROBE_ENTRY_C.to_owned())
            }
            .ok()
        } else {
            None
        };
        let (crc_module, crc_func) = load_module(&ctx, TUTTI_CRC32C_PTX_C, TUTTI_CRC32C_ENTRY_C)?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))?;
        // Fence words need stream memory operations (`cuStreamWriteValue32`).
        let stream_mem_ops = crate::copy_lanes::driver_has_stream_writes()
            && ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1)
                .is_ok_and(|v| v == 1);
        let copy_lanes =
            CopyLanes::new(&ctx, stream_mem_ops, crate::copy_lanes::driver_has_batched_copies())?;
        let quiet = Arc::new(Quiesce::new(Stream::new(&ctx)?));
        let crc_stream = Stream::new(&ctx)?;
        Ok(Self {
            quiet,
            io: IoKernel::new(module, func, probe_func),
            crc: Crc32cEngine::new(
                crc_module,
                crc_func,
                crc_stream,
                u64::try_from(sm_count).unwrap_or(1).max(1),
            ),
            copy_lanes,
            ctx,
        })
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}
