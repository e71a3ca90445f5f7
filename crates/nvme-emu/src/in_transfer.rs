//! A command whose CQE waits for its copies (`transfer.rs` drives it).

use std::sync::Arc;
use std::time::Instant;

use crate::external::PendingCopies;
use crate::queues::Completion;

/// One command whose CQE waits for its copies.
#[derive(Debug)]
pub(crate) struct InTransfer {
    /// The burst's fences; `None` until the burst ends
    /// ([`crate::controller::Controller::attach_burst`]).
    pub(crate) copies: Option<Arc<PendingCopies>>,
    pub(crate) cqid: u16,
    pub(crate) completion: Completion,
    /// When the CQE is due by the timing model or an injected delay;
    /// `None`: posted as soon as the copies end.
    pub(crate) due: Option<Instant>,
    /// How many times the CQE is posted (fault injection: 2 for
    /// `CompleteTwice`).
    pub(crate) times: u32,
}
