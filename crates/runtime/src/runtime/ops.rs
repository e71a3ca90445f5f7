//! Operation accounting: the one owner of "every command of a batch leaves
//! it exactly once".
//!
//! An operation is one [`crate::Runtime::submit`] call. When it is
//! registered, each accepted request gets the number of NVMe commands its
//! plan holds; from then on each command leaves the operation exactly once,
//! through one of three doors:
//!
//! - [`OpState::complete`]: the drive (a CQE) or the GPU kernel reported the
//!   command's status;
//! - [`OpState::unsent`]: it never reached a drive (the queue stayed full,
//!   the drive was failed, the kernel launch was refused);
//! - [`OpState::abandon`]: its drive was declared failed (CSTS.CFS, gone) or
//!   reset, so no completion will come; the caller keeps its memory pinned
//!   until the controller reset ends the drive's DMA.
//!
//! Everything else is derived: a request is final when none of its commands
//! is left; the operation's [`OpState::outstanding`] count is the sum of
//! what is left; a retired operation (its statuses taken by a wait whose
//! deadline passed) can be dropped once nothing is left. No caller adjusts
//! a count by hand: a command that would leave twice is refused
//! ([`Settle::Refused`]) and counted by the caller as a late completion.
//!
//! Routing: every CPU-executed command carries a 64-bit tag ([`make_tag`])
//! naming its operation slot, 16 bits of the operation's generation and its
//! request index, so a completion finds its request without a lookup table.

use std::sync::Arc;

use super::gpu::GpuOp;
use crate::error::{RequestError, RequestStatus};
use crate::handle::{HandleTable, RawHandle};
use crate::region::Region;

/// Largest operation slot a command tag can carry (24 bits): the handle
/// tables' own bound, so every operation slot fits.
pub(crate) const TAG_SLOT_MAX: u32 = crate::handle::SLOT_MAX;

/// Tag layout: op slot (24 bits) | op generation, low 16 bits | request
/// index (24 bits).
pub(crate) fn make_tag(op: RawHandle, req: usize) -> u64 {
    (u64::from(op.slot & TAG_SLOT_MAX) << 40)
        | (u64::from(op.generation & 0xFFFF) << 24)
        | (req as u64 & 0xFF_FFFF)
}

/// `(op slot, op generation low 16 bits, request index)` of a tag.
pub(crate) fn split_tag(tag: u64) -> (u32, u32, usize) {
    ((tag >> 40) as u32, ((tag >> 24) & 0xFFFF) as u32, (tag & 0xFF_FFFF) as usize)
}

/// Removes operation `h` from the table once it is retired and nothing of
/// it is left ([`OpState::can_drop`]): whoever settles its last command or
/// retires it calls this, so an entry never outlives its commands.
pub(crate) fn drop_if_done(ops: &mut HandleTable<OpState>, h: RawHandle) {
    if ops.get(h).is_ok_and(OpState::can_drop) {
        let _ = ops.remove(h);
    }
}

/// What happened to a command handed to [`OpState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Settle {
    /// Counted; the request still has commands left.
    Counted,
    /// Counted, and it was the request's last: the request is final.
    RequestFinal,
    /// Not counted: the request has no command left (a duplicate or late
    /// report) or the index names no request.
    Refused,
}

/// One request's accounting: 16 bytes, so that registering a batch and
/// taking its statuses move little memory (a failure is rare and boxed).
#[derive(Debug)]
struct ReqState {
    /// Commands that have not left yet.
    left: u32,
    /// First failure seen, or the refusal of a request not accepted.
    status: Option<Box<RequestStatus>>,
}

/// One operation (one batch).
#[derive(Debug)]
pub(crate) struct OpState {
    reqs: Vec<ReqState>,
    /// Requests with commands left; kept equal to
    /// `reqs.iter().filter(|r| r.left > 0).count()` by [`OpState::settle`].
    unfinished: usize,
    /// Commands left over all requests; kept equal to the sum of `left` by
    /// [`OpState::settle`].
    outstanding: u64,
    /// The statuses were taken by a wait: the handle is dead and the entry
    /// lives on only until its outstanding commands leave.
    retired: bool,
    /// Datapaths the operation's commands went to (what `wait` polls);
    /// shared, so a waiter takes it without copying.
    pub datapaths: Arc<[usize]>,
    /// Memory the operation's commands move; kept registered while it lives.
    pub regions: Vec<Arc<Region>>,
    /// The kernel launch carrying its GPU-executed commands.
    pub gpu: Option<GpuOp>,
    /// When a `try_wait` that found it not final last read its drives'
    /// controller status (`None`: not yet): `try_wait` callers keep no
    /// state of their own, so the operation rate-limits their checks.
    pub health_checked: Option<std::time::Instant>,
}

impl OpState {
    /// An operation whose requests have these command counts (`Ok`) or were
    /// refused (`Err`, final at once as [`RequestStatus::NotAccepted`]).
    pub fn new(
        requests: impl IntoIterator<Item = Result<u32, RequestError>>,
        datapaths: Arc<[usize]>,
        regions: Vec<Arc<Region>>,
    ) -> Self {
        let reqs: Vec<ReqState> = requests
            .into_iter()
            .map(|r| match r {
                Ok(n) => ReqState { left: n, status: None },
                Err(e) => ReqState { left: 0, status: Some(Box::new(RequestStatus::NotAccepted(e))) },
            })
            .collect();
        let unfinished = reqs.iter().filter(|r| r.left > 0).count();
        let outstanding = reqs.iter().map(|r| u64::from(r.left)).sum();
        Self {
            reqs,
            unfinished,
            outstanding,
            retired: false,
            datapaths,
            regions,
            gpu: None,
            health_checked: None,
        }
    }

    /// The one place counts change: `n` commands of request `index` leave,
    /// `failure` recorded if it is the request's first.
    fn settle(&mut self, index: usize, n: u32, failure: Option<RequestStatus>) -> Settle {
        let Some(r) = self.reqs.get_mut(index) else { return Settle::Refused };
        if n == 0 || n > r.left {
            return Settle::Refused;
        }
        if let Some(f) = failure {
            r.status.get_or_insert_with(|| Box::new(f));
        }
        r.left -= n;
        self.outstanding -= u64::from(n);
        if r.left > 0 {
            return Settle::Counted;
        }
        self.unfinished -= 1;
        Settle::RequestFinal
    }

    /// One command of request `index` finished with `failure` (`None` for
    /// NVMe status 0).
    pub fn complete(&mut self, index: usize, failure: Option<RequestStatus>) -> Settle {
        self.settle(index, 1, failure)
    }

    /// `n` commands of request `index` never reached a drive, because of
    /// `why` (a [`RequestStatus::SubmitFailed`]).
    pub fn unsent(&mut self, index: usize, n: u32, why: RequestStatus) -> Settle {
        self.settle(index, n, Some(why))
    }

    /// One command of request `index` will get no completion: its drive
    /// failed or was reset (`why`: [`RequestStatus::ControllerFatal`]), or
    /// the GPU kernel gave up on it (`why`: [`RequestStatus::Timeout`]).
    /// The caller pins the operation's memory until the drive is reset.
    pub fn abandon(&mut self, index: usize, why: RequestStatus) -> Settle {
        self.settle(index, 1, Some(why))
    }

    /// Commands that have not left (sent and not completed, or not yet sent).
    pub fn outstanding(&self) -> u64 {
        self.outstanding
    }

    /// `true` when every request is final.
    pub fn is_final(&self) -> bool {
        self.unfinished == 0
    }

    /// `true` once a wait took the statuses.
    pub fn is_retired(&self) -> bool {
        self.retired
    }

    /// `true` when the entry can go: retired and nothing left.
    pub fn can_drop(&self) -> bool {
        self.retired && self.outstanding == 0
    }

    /// Takes one status per request, in order (a request with commands left
    /// is [`RequestStatus::Timeout`]) and retires the operation.
    pub fn retire(&mut self) -> Vec<RequestStatus> {
        self.retired = true;
        self.reqs
            .iter_mut()
            .map(|r| match (r.left, r.status.take()) {
                (0, Some(s)) => *s,
                (0, None) => RequestStatus::Success,
                // A failure seen so far goes nowhere: the handle is dead.
                (_, _) => RequestStatus::Timeout,
            })
            .collect()
    }

    /// Recomputes the derived counts from the per-request state (tests).
    #[cfg(test)]
    fn check_invariants(&self) {
        assert_eq!(self.unfinished, self.reqs.iter().filter(|r| r.left > 0).count());
        assert_eq!(self.outstanding, self.reqs.iter().map(|r| u64::from(r.left)).sum::<u64>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_regs::Status;

    fn op(counts: &[Result<u32, RequestError>]) -> OpState {
        OpState::new(counts.iter().cloned(), Arc::from([0usize]), Vec::new())
    }

    fn nvme(sc: u8) -> RequestStatus {
        RequestStatus::Nvme { drive: "d".into(), status: Status::new(0, sc) }
    }

    fn fatal() -> RequestStatus {
        RequestStatus::ControllerFatal { drive: "d".into() }
    }

    #[test]
    fn tags_round_trip() {
        let h = RawHandle { runtime: 1, slot: 0xAB_CDEF, generation: 0x1234_5678 };
        assert_eq!(split_tag(make_tag(h, 0xFF_FFFF)), (0xAB_CDEF, 0x5678, 0xFF_FFFF));
    }

    #[test]
    fn each_command_completes_once_and_the_request_is_final_after_its_last() {
        let mut s = op(&[Ok(2), Ok(1)]);
        assert_eq!((s.outstanding(), s.is_final()), (3, false));
        assert_eq!(s.complete(0, None), Settle::Counted);
        assert_eq!(s.complete(1, None), Settle::RequestFinal);
        assert_eq!(s.complete(1, None), Settle::Refused, "a duplicate completion is refused");
        assert_eq!(s.complete(7, None), Settle::Refused, "an index past the batch is refused");
        assert_eq!(s.complete(0, None), Settle::RequestFinal);
        s.check_invariants();
        assert!(s.is_final());
        assert_eq!(s.retire(), [RequestStatus::Success, RequestStatus::Success]);
        assert!(s.can_drop());
    }

    #[test]
    fn refused_requests_are_final_at_once_and_keep_their_reason() {
        let mut s = op(&[Err(RequestError::ZeroLength), Ok(1)]);
        assert_eq!((s.outstanding(), s.is_final()), (1, false));
        assert_eq!(s.complete(0, None), Settle::Refused);
        assert_eq!(s.complete(1, None), Settle::RequestFinal);
        assert_eq!(
            s.retire(),
            [RequestStatus::NotAccepted(RequestError::ZeroLength), RequestStatus::Success]
        );
    }

    #[test]
    fn first_failure_wins() {
        let mut s = op(&[Ok(3)]);
        let _ = s.complete(0, Some(nvme(0x81)));
        let _ = s.complete(0, Some(nvme(0x02)));
        let _ = s.complete(0, None);
        assert_eq!(s.retire(), [nvme(0x81)]);
    }

    #[test]
    fn timeout_retires_with_commands_left_and_late_completions_drain_it() {
        let mut s = op(&[Ok(2), Ok(1)]);
        let _ = s.complete(1, None);
        assert_eq!(s.retire(), [RequestStatus::Timeout, RequestStatus::Success]);
        assert!(s.is_retired() && !s.can_drop(), "two commands may still move memory");
        assert_eq!(s.complete(0, None), Settle::Counted);
        assert_eq!(s.complete(0, Some(nvme(0x81))), Settle::RequestFinal);
        assert!(s.can_drop());
        s.check_invariants();
    }

    #[test]
    fn abort_by_sq_deletion_is_a_completion_with_its_status() {
        // Delete I/O SQ: the controller completes a fetched command with
        // "Command Aborted due to SQ Deletion" (SCT 0h, SC 08h).
        let mut s = op(&[Ok(2)]);
        let _ = s.complete(0, None);
        assert_eq!(s.complete(0, Some(nvme(0x08))), Settle::RequestFinal);
        assert_eq!(s.retire(), [nvme(0x08)]);
    }

    #[test]
    fn controller_fatal_device_gone_and_reset_abandon_what_is_left() {
        // A fatal controller (CSTS.CFS), a device that reads all ones or a
        // reset each end the commands the drive still holds, once each.
        let mut s = op(&[Ok(3), Ok(1)]);
        let _ = s.complete(0, None);
        assert_eq!(s.abandon(0, fatal()), Settle::Counted);
        assert_eq!(s.abandon(0, fatal()), Settle::RequestFinal);
        assert_eq!(s.abandon(0, fatal()), Settle::Refused, "nothing is abandoned twice");
        assert_eq!(s.complete(1, None), Settle::RequestFinal);
        s.check_invariants();
        assert_eq!(s.retire(), [fatal(), RequestStatus::Success]);
    }

    #[test]
    fn unsent_commands_leave_in_one_step() {
        let why = RequestStatus::SubmitFailed {
            reason: crate::SubmitFailure::QueueFull { drive: "d0".into(), qid: 1 },
        };
        let mut s = op(&[Ok(5)]);
        let _ = s.complete(0, None);
        assert_eq!(s.unsent(0, 5, why.clone()), Settle::Refused, "more than are left");
        assert_eq!(s.unsent(0, 4, why.clone()), Settle::RequestFinal);
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.retire(), [why]);
    }

    #[test]
    fn shutdown_counts_what_never_came_back() {
        // Shutdown reports the outstanding commands of operations whose
        // completions never came (deleted SQ, no abort CQE).
        let mut s = op(&[Ok(2), Ok(2)]);
        let _ = s.complete(0, None);
        let _ = s.complete(1, None);
        let _ = s.complete(1, None);
        assert_eq!(s.outstanding(), 1);
        assert_eq!(s.retire(), [RequestStatus::Timeout, RequestStatus::Success]);
        assert!(!s.can_drop());
    }

    proptest::proptest! {
        /// Any sequence of reports keeps the derived counts true, and a
        /// request's commands leave at most as many times as it has.
        #[test]
        fn counts_stay_derived(counts in proptest::collection::vec(0u32..4, 1..6),
                               events in proptest::collection::vec((0usize..7, 0u8..3, 1u32..3), 0..40)) {
            let reqs: Vec<Result<u32, RequestError>> =
                counts.iter().map(|&c| if c == 0 { Err(RequestError::ZeroLength) } else { Ok(c) }).collect();
            let mut s = op(&reqs);
            let mut left: Vec<u32> = counts.clone();
            for (i, kind, n) in events {
                let r = match kind {
                    0 => s.complete(i, None),
                    1 => s.abandon(i, fatal()),
                    _ => s.unsent(i, n, RequestStatus::SubmitFailed { reason: crate::SubmitFailure::EarlierCommandRefused }),
                };
                let n = if kind == 2 { n } else { 1 };
                let ok = left.get(i).is_some_and(|&l| l >= n);
                proptest::prop_assert_eq!(r != Settle::Refused, ok);
                if ok { left[i] -= n; }
                s.check_invariants();
            }
            proptest::prop_assert_eq!(s.outstanding(), left.iter().map(|&l| u64::from(l)).sum::<u64>());
        }
    }
}
