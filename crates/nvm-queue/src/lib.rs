//! Queue memory and the CPU side of an NVMe driver.
//!
//! Follows the NVM Express Base Specification 2.0 (PCIe transport). Owns:
//! DMA memory and device addresses ([`dma`], [`device`]), the one MMIO module
//! ([`mmio`]), the PRP builder ([`prp`]), submission/completion rings and
//! command-ID allocation ([`queue`]), controller bring-up and admin commands
//! ([`controller`]), active namespaces and their LBA formats ([`namespace`]),
//! and the byte-to-block I/O planner ([`io`]).
//!
//! Unsafe code is allowed here (and only in `mmio`, `dma` and `device`'s
//! contract) because this crate touches device registers and memory a
//! device writes; every block states the invariant that makes it sound.
#![allow(unsafe_code)]

pub mod device;
pub mod dma;
pub mod mmio;
pub mod prp;

pub use device::{DeviceError, DmaMapping, NvmeDevice, HOST_PAGE_SIZE};
pub use dma::{DmaBuffer, DmaError};
pub use mmio::{Doorbell, Mmio, MmioError};
pub use prp::{Prp, PrpBuilder, PrpError};
pub mod controller;
pub mod io;
pub mod namespace;
pub mod queue;
#[cfg(test)]
mod test_device;

pub use controller::{Controller, ControllerError, ControllerInfo, ControllerOptions};
pub use io::{plan_io, IoChunk, IoError, IoOp, IoPlan, NamespaceInfo};
pub use namespace::{ActiveNamespace, NamespaceError, NamespaceFormat};
pub use queue::{Completion, DataRef, QueueError, QueuePair, QueuePairConfig, QueueStats, SubmitError};
