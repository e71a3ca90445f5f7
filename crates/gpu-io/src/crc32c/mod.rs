//! CRC32C (Castagnoli) of GPU-resident byte ranges, many per launch
//! (`kernels/tutti_crc32c.cu`): the standard CRC32C (reflected polynomial
//! 0x82F63B78, initial value 0xFFFFFFFF, final xor 0xFFFFFFFF), the value
//! the `crc32c` crate's `crc32c(&bytes)` returns for the same bytes.
//!
//! The host side lays out the launch: each item's aligned 8-byte words
//! are cut into chunks of [`CRC32C_CHUNK_BYTES`], one warp per chunk, and
//! the kernel combines the chunk CRCs itself (see the source's header).
//! Here: [`GpuRange`] and [`Gpu::crc32c`]; the task split in `tasks.rs`,
//! the launch's memory in `scratch.rs`, the launch in `engine.rs`, a CPU
//! model of the kernel in `model.rs` (tests).

use std::sync::Arc;
use std::time::Duration;

use crate::abi::TuttiCrcItem;
use crate::buffer::GpuBuffer;
use crate::crc32c::tasks::raw_items;
use crate::error::GpuError;
use crate::gpu::Gpu;

pub(crate) mod engine;
#[cfg(test)]
mod model;
pub(crate) mod scratch;
pub(crate) mod tasks;

pub use tasks::{CRC32C_CHUNK_BYTES, MAX_CRC32C_LEN, MAX_CRC32C_TASKS};

/// `len` bytes at byte `offset` of a [`GpuBuffer`]: one object to checksum
/// with [`Gpu::crc32c`]. Bounds are checked there.
#[derive(Debug, Clone, Copy)]
pub struct GpuRange<'a> {
    buffer: &'a GpuBuffer,
    offset: usize,
    len: usize,
}

impl<'a> GpuRange<'a> {
    /// `len` bytes from byte `offset` of `buffer`.
    pub fn new(buffer: &'a GpuBuffer, offset: usize, len: usize) -> Self {
        Self { buffer, offset, len }
    }

    /// The whole buffer.
    pub fn all(buffer: &'a GpuBuffer) -> Self {
        Self { buffer, offset: 0, len: buffer.len() }
    }
}

impl Gpu {
    /// The standard CRC32C of each range, in order, computed on this GPU in
    /// one kernel launch (synchronous: returns when the kernel has ended).
    /// Empty ranges give 0, as `crc32c::crc32c(&[])` does. Its device
    /// buffers come from a pool, so it does not wait for running I/O
    /// kernels, except when it needs more scratch than any kept: that
    /// allocation waits for every I/O kernel of this `Gpu` launched so far
    /// (`Quiesce` in `cuda/quiesce.rs`).
    ///
    /// The ranges are read on this `Gpu`'s checksum stream, which is not
    /// ordered with other CUDA streams: writes into the buffers made on
    /// another stream must have completed first ([`GpuBuffer::copy_in`]
    /// completes before it returns). Bytes written while the kernel runs
    /// give an unspecified checksum, never unsafety.
    ///
    /// # Errors
    ///
    /// [`GpuError::Crc32cOutOfBounds`] for a range past its buffer's end,
    /// [`GpuError::Crc32cForeignBuffer`] for a buffer of another [`Gpu`],
    /// [`GpuError::Crc32cBatchTooLarge`] past [`MAX_CRC32C_TASKS`] chunks,
    /// [`GpuError::Driver`] when CUDA fails.
    pub fn crc32c(&self, ranges: &[GpuRange<'_>]) -> Result<Vec<u32>, GpuError> {
        Ok(self.crc32c_ranges(ranges, false)?.0)
    }

    /// As [`Gpu::crc32c`], also returning the kernel's own time (CUDA
    /// events around the launch: no allocation or copy included).
    ///
    /// # Errors
    ///
    /// As for [`Gpu::crc32c`].
    pub fn crc32c_timed(&self, ranges: &[GpuRange<'_>]) -> Result<(Vec<u32>, Duration), GpuError> {
        self.crc32c_ranges(ranges, true)
    }

    fn crc32c_ranges(&self, ranges: &[GpuRange<'_>], timed: bool) -> Result<(Vec<u32>, Duration), GpuError> {
        let mut items = Vec::with_capacity(ranges.len());
        for (item, r) in ranges.iter().enumerate() {
            if !Arc::ptr_eq(r.buffer.context(), &self.ctx) {
                return Err(GpuError::Crc32cForeignBuffer { item });
            }
            let size = r.buffer.len();
            if r.offset.checked_add(r.len).is_none_or(|end| end > size) {
                return Err(GpuError::Crc32cOutOfBounds { item, offset: r.offset, len: r.len, size });
            }
            items.push(TuttiCrcItem { ptr: r.buffer.device_ptr() + r.offset as u64, len: r.len as u64 });
        }
        // SAFETY: every range lies inside a live GpuBuffer of this context
        // (checked above), which the borrows keep alive for the call.
        unsafe { self.crc.run(&self.ctx, &self.quiet, &items, timed) }
    }

    /// The standard CRC32C of each `(device pointer, length in bytes)`
    /// range, in order, in one launch (synchronous). Pointers may have any
    /// alignment; a range of length 0 is never read (its pointer may be 0).
    ///
    /// # Safety
    ///
    /// Each range of non-zero length must be device memory of this `Gpu`'s
    /// context (or mapped into it), readable by the GPU for the whole call.
    /// A range that is not faults the kernel, which leaves the CUDA context
    /// unusable for every later call.
    ///
    /// # Errors
    ///
    /// [`GpuError::Crc32cBadRange`] for a length above [`MAX_CRC32C_LEN`] or
    /// a range that wraps the address space, otherwise as [`Gpu::crc32c`].
    pub unsafe fn crc32c_raw(&self, ranges: &[(u64, usize)]) -> Result<Vec<u32>, GpuError> {
        let items = raw_items(ranges)?;
        // SAFETY: forwarded from this function's contract.
        Ok(unsafe { self.crc.run(&self.ctx, &self.quiet, &items, false) }?.0)
    }
}
