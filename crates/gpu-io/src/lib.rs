//! GPU-initiated NVMe I/O: GPU threads build SQEs, publish the SQ tail and
//! ring the doorbell, and poll completions by phase tag, with no CPU in the
//! data path. The device code is `kernels/tutti_io.cu`, committed as PTX
//! (`kernels/tutti_io.ptx`) and loaded here through the CUDA driver API
//! (cudarc, dynamically loaded: this crate builds, links and runs its
//! CPU-only tests on machines without CUDA; [`Gpu::open`] returns
//! [`GpuError::NoDriver`] there).
//!
//! What exists (see docs/gpu.md): queue pairs whose SQ/CQ live in host
//! memory mapped into the GPU (what the emulator reads); doorbells in the
//! emulator's register page mapped into the GPU ([`GpuDrive::map`]); one
//! launch serving a batch over several drives (one block per queue); data in
//! host memory or in GPU memory ([`GpuBuffer`], which the emulator reaches
//! with CUDA copies); PRP lists built by GPU threads, one list page per
//! command (transfers of up to 512 pages after the first, about 2 MiB;
//! longer ones report [`GpuStatus::Unsupported`]); and the runtime's GPU
//! execution mode (`execution: gpu` in the `tutti` crate), which drives its
//! queues through this crate. Written but not yet run on hardware: doorbells
//! in a real BAR0 ([`GpuDrive::map_mmio`], `CU_MEMHOSTREGISTER_IOMEMORY`).
//! Not written: queue memory in GPU device memory, and peer DMA into GPU
//! memory for a real drive.
//!
//! Checksums: [`Gpu::crc32c`] computes the standard CRC32C of many
//! GPU-resident ranges in one launch (`kernels/tutti_crc32c.cu`), the value
//! the `crc32c` crate gives for the same bytes in host memory.
//!
//! Unsafe code is allowed here: CUDA driver calls and registering host
//! memory for device access. Each block states what makes it sound.
#![allow(unsafe_code)]

pub mod abi;
mod buffer;
mod copy_lanes;
mod crc32c;
mod cuda;
mod drive;
mod emulated_dma;
mod error;
mod gpu;
mod launch;
mod launch_end;
mod null_ctrl;
pub mod ptx;
mod queue;
mod reap_model;
mod region;
mod status;
mod stream_model;

pub use buffer::GpuBuffer;
pub use crc32c::{GpuRange, CRC32C_CHUNK_BYTES, MAX_CRC32C_LEN, MAX_CRC32C_TASKS};
pub use drive::GpuDrive;
pub use error::GpuError;
pub use gpu::Gpu;
pub use launch::{GpuLaunch, GpuStream};
pub use launch_end::LaunchEnd;
pub use null_ctrl::NullControllers;
pub use queue::{GpuQueue, GpuQueueCounters};
pub use region::GpuRegion;
pub use status::{GpuStatus, MAX_QUEUES_PER_LAUNCH, MAX_REQUESTS_PER_LAUNCH};
