//! Submission and completion rings, command IDs and the CPU queue pair.
//!
//! | file | concept |
//! | --- | --- |
//! | `ring.rs` | index arithmetic, one slot always empty |
//! | `sq.rs` | SQ: push an SQE, ring the tail doorbell once per batch |
//! | `cq.rs` | CQ: phase-tag detection, head doorbell after consuming |
//! | `cid.rs` | command IDs with generations |
//! | `pair.rs` | the queue pair tying them together with PRP list pages |

mod cid;
mod cq;
mod pair;
mod ring;
mod sq;

pub use cid::{CidError, CidTable};
pub use cq::{CompletionQueue, CQE_SIZE};
pub use pair::{Completion, DataRef, QueueError, QueuePair, QueuePairConfig, QueueStats, SubmitError};
pub use ring::Ring;
pub use sq::{SubmissionQueue, SQE_SIZE};
