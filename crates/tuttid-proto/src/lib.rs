//! `tuttid`'s protocol and client.
//!
//! `tuttid` is the one process that owns NVMe drives (admin queues,
//! controller registers, the IOMMU); other processes get I/O queue pairs
//! from it over a Unix socket. This crate holds what both sides share:
//!
//! * [`codec`], [`message`]: typed, versioned messages with a canonical
//!   little-endian encoding; decoding any byte string gives a message or a
//!   [`DecodeError`], never a panic.
//! * [`frame`]: length-prefixed frames (hard limit [`MAX_FRAME`]) with file
//!   descriptors passed by SCM_RIGHTS.
//! * [`shm`]: memfd-backed shared memory (rings, doorbell pages, client
//!   DMA memory), sealed against shrinking so no side can fault the other.
//! * [`client`]: a connection (handshake, heartbeat, requests) and
//!   [`device`]: a daemon-owned drive as an `nvm_queue::NvmeDevice`, so the
//!   driver's queue pairs run on granted rings unchanged.
//!
//! docs/tuttid.md describes the protocol, the security model and reclaim.
//!
//! Unsafe code is allowed here for mmap/munmap of memfds and for copies in
//! and out of shared memory (`shm.rs`), and for wrapping granted ring
//! memory and the doorbell window for the driver (`device.rs`); each block
//! states its invariant.
#![allow(unsafe_code)]

pub mod client;
pub mod codec;
pub mod device;
pub mod error;
pub mod frame;
pub mod message;
pub mod shm;

pub use client::{Client, DaemonUid};
pub use device::{DaemonDevice, DaemonDriveError};
pub use error::{ClientError, DecodeError, Rule};
pub use frame::{MAX_FDS, MAX_FRAME};
pub use message::{
    ClientStatus, DriveFacts, DriveStatus, ForwardingCounters, QueueGrant, Request, Response, StatusReport,
};
pub use shm::SharedMemory;

/// The protocol version this crate speaks; a daemon refuses any other in
/// the handshake (rule `protocol-version`).
pub const PROTOCOL_VERSION: u32 = 2;
