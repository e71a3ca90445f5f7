//! Queue memory and the CPU side of an NVMe driver.
//!
//! Follows the NVM Express Base Specification 2.0 (PCIe transport). Owns:
//! DMA memory and device addresses ([`dma`], [`device`]), the clock bounded
//! waits run on, real or virtual ([`clock`]), the one MMIO module
//! ([`mmio`]), the PRP builder ([`prp`]), submission/completion rings and
//! command-ID allocation ([`queue`]), controller bring-up and admin commands
//! ([`controller`]), active namespaces and their LBA formats ([`namespace`]),
//! and the byte-to-block I/O planner ([`io`]).
//!
//! Unsafe code is allowed here because this crate touches device registers
//! and memory a device writes; every block states the invariant that makes
//! it sound. The unsafe sites, all of them:
//!
//! * [`mmio`]: [`Mmio::new`] is an `unsafe fn` (the caller vouches that the
//!   window stays mapped and is touched only through 32-bit atomic or
//!   volatile accesses); `check` offsets the base pointer after its bounds
//!   and alignment checks; `read32`/`write32` and [`Doorbell::ring`] load
//!   and store through `AtomicU32::from_ptr` (the register accesses
//!   themselves); [`Mmio::doorbell`] is an `unsafe fn` (the [`Doorbell`] it
//!   returns carries no lifetime, so the caller keeps the window mapped) and
//!   builds the doorbell's `NonNull` unchecked from the checked pointer;
//!   `unsafe impl Send`/`Sync` for [`Mmio`] and [`Doorbell`] (raw pointers,
//!   accessed only atomically). Its unit test builds an [`Mmio`] over a
//!   `Vec` and takes doorbells from it.
//! * [`dma`]: [`DmaBuffer`] allocates with `alloc_zeroed` and frees with
//!   `dealloc` by hand (page-aligned layout; freed only after the device
//!   unmapping succeeded), calls the unsafe [`NvmeDevice::dma_map`],
//!   offsets its base pointer after bounds checks, copies in and out with
//!   `copy_nonoverlapping`, fills with `write_bytes`, and loads and stores
//!   queue entries through `AtomicU32`/`AtomicU64::from_ptr` (never a Rust
//!   reference into memory the device writes); `unsafe impl Send`/`Sync`
//!   for [`DmaBuffer`] (a raw pointer; no references into the memory).
//! * [`device`]: [`NvmeDevice::dma_map`] is an `unsafe fn` of the trait:
//!   the caller keeps the memory allocated (and resident) until it is
//!   unmapped, or until a controller reset if a command touching it timed
//!   out, and holds no reference into it while the device may write it.
//! * [`queue`] (`pair.rs`): [`QueuePair::new`] calls [`Mmio::doorbell`] for
//!   its two doorbells; the pair holds the device, which keeps its BAR0
//!   mapped.
//! * `test_device` (unit tests only): builds an [`Mmio`] over a boxed page
//!   and implements [`NvmeDevice::dma_map`] (it hands out addresses and
//!   touches no memory).
#![allow(unsafe_code)]

pub mod clock;
pub mod device;
pub mod dma;
pub mod mmio;
pub mod prp;

pub use clock::{Clock, RealClock, Ticker, TickerId, VirtualClock, SPIN_TIME};
pub use device::{DeviceError, DmaMapping, HostMemory, KeptDma, NvmeDevice, HOST_PAGE_SIZE};
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
