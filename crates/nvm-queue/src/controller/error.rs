//! [`ControllerError`]: what bring-up, admin commands and shutdown return.

use std::time::Duration;

use nvme_regs::{DecodeError, Status};

use crate::dma::DmaError;
use crate::mmio::MmioError;
use crate::queue::{QueueError, SubmitError};

/// Errors of bring-up, admin commands and shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// A register read all ones: the device is gone (surprise removal,
    /// dead link).
    #[error("{register} read all ones: the device is gone")]
    DeviceGone {
        /// The register read.
        register: &'static str,
    },
    /// CSTS.CFS is set: the controller hit a fatal error.
    #[error("controller fatal status (CSTS.CFS) during {during}")]
    Fatal {
        /// What the driver was doing.
        during: &'static str,
    },
    /// A bounded wait ran out.
    #[error("timed out after {waited:?} waiting for {what}; {state}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        waited: Duration,
        /// Queue/register state for diagnosis.
        state: String,
    },
    /// An admin command completed with an error status.
    #[error("{command} failed: {status}")]
    Command {
        /// Command name.
        command: &'static str,
        /// NVMe status.
        status: Status,
    },
    /// The controller returned data that does not decode.
    #[error("malformed {what} data from the controller")]
    Decode {
        /// What was decoded.
        what: &'static str,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// The controller lacks something this driver needs.
    #[error("unsupported controller: {0}")]
    Unsupported(String),
    /// A register access left BAR0.
    #[error("register access")]
    Mmio(#[from] MmioError),
    /// Queue creation failed on the host side.
    #[error("queue setup")]
    Queue(#[from] QueueError),
    /// DMA memory allocation or mapping failed.
    #[error("DMA memory")]
    Dma(#[from] DmaError),
    /// An admin command could not be queued.
    #[error("admin submission")]
    Submit(#[from] SubmitError),
    /// An I/O queue was asked beyond what the controller granted.
    #[error("I/O queue {qid} not available: the controller granted {granted}")]
    NoQueue {
        /// Queue asked for.
        qid: u16,
        /// Number granted by Set Features (Number of Queues).
        granted: u16,
    },
}
