//! NVMe data layouts: controller registers, submission and completion queue
//! entries, status codes, Identify data structures and log pages.
//!
//! References are to the *NVM Express Base Specification, Revision 2.0*
//! ("NVMe Base 2.0") and, for the I/O command set, the *NVM Express NVM
//! Command Set Specification, Revision 1.0* ("NVM Command Set 1.0"); section
//! numbers of Base 1.4 are given where they differ noticeably. Only the PCIe
//! transport is covered.
//!
//! This crate is pure layout: it performs no MMIO and no DMA, is `no_std`,
//! and forbids `unsafe`. Every wire structure is `#[repr(C)]` with
//! [`zerocopy`] derives and compile-time assertions on its size and field
//! offsets. Decoding data that came from a device never panics; malformed
//! values give [`DecodeError`].
//!
//! Conventions used in the docs:
//!
//! * "zero-based" means the field holds *count - 1* (e.g. `MQES`, `QSIZE`,
//!   `NLB`); accessors for zero-based fields end in `_z` or say so, and
//!   command builders take 1-based counts and convert once, internally.
//! * sizes are in bytes unless a docstring says "logical blocks" or "dwords"
//!   (1 dword = 4 bytes).
//! * all multi-byte fields are little-endian on the wire. Structures that are
//!   parsed from arbitrary byte buffers (Identify, log pages) use
//!   [`zerocopy::little_endian`] integer types and have alignment 1; queue
//!   entries ([`Sqe`], [`Cqe`]) use native integers, which is why the crate
//!   refuses to build for big-endian targets.
//!
//! Module map:
//!
//! | module | contents | spec |
//! | --- | --- | --- |
//! | [`registers`] | BAR0 offsets, CAP/VS/CC/CSTS/AQA, doorbells | Base 2.0 3.1.4 |
//! | [`sqe`] | 64-byte submission queue entry | Base 2.0 4.2 |
//! | [`opcode`] | opcodes and command builders | Base 2.0 5, NVM Command Set 1.0 3 |
//! | [`cqe`] | 16-byte completion queue entry | Base 2.0 4.2.1 |
//! | [`status`] | status field, SCT/SC names | Base 2.0 4.2.3 |
//! | [`identify`] | Identify Controller / Namespace | Base 2.0 5.17.2, NVM Command Set 1.0 4.1.5 |
//! | [`log`] | SMART / Health and Error Information log pages | Base 2.0 5.16.1 |
//! | [`features`] | feature identifiers, Number of Queues | Base 2.0 5.27.1 |
//! | [`error`] | [`DecodeError`] | - |

#![no_std]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

#[cfg(target_endian = "big")]
compile_error!("nvme-regs: Sqe/Cqe/ControllerRegisters use native integers and NVMe is little-endian");

pub mod cqe;
pub mod error;
pub mod features;
pub mod identify;
pub mod log;
pub mod opcode;
pub mod registers;
pub mod sqe;
pub mod status;

pub use cqe::Cqe;
pub use error::DecodeError;
pub use features::NumberOfQueues;
pub use identify::{IdentifyController, IdentifyNamespace, LbaFormat};
pub use log::{ErrorLogEntry, SmartLog};
pub use opcode::Nlb;
pub use registers::{Aqa, Cap, Cc, ControllerRegisters, Csts, ShutdownNotification, ShutdownStatus, Vs};
pub use sqe::Sqe;
pub use status::{Status, StatusCodeType};
