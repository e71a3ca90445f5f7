//! The media timing model: one channel shared by all commands.
//!
//! A command occupies the channel for `bytes / bandwidth` or `1 / iops`
//! seconds, whichever is longer, starting when it is fetched or when the
//! channel frees up, whichever is later. Its completion is due at the end
//! of that occupancy plus the fixed latency. Data moves when the command is
//! fetched; only the CQE waits. Due completions sit in a min-heap.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use crate::config::TimingModel;
use crate::queues::Completion;

/// A completion waiting for its due time.
#[derive(Debug)]
pub(crate) struct Scheduled {
    pub due: Instant,
    /// Tie breaker: fetch order.
    pub seq: u64,
    pub cqid: u16,
    pub completion: Completion,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.due == other.due && self.seq == other.seq
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest due.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

/// Channel state plus the heap of scheduled completions.
#[derive(Debug)]
pub(crate) struct Timing {
    /// `None`: no media model, the heap only holds completions delayed by
    /// fault injection ([`crate::FaultAction::Delay`]).
    model: Option<TimingModel>,
    channel_free_at: Instant,
    seq: u64,
    pub heap: BinaryHeap<Scheduled>,
}

impl Timing {
    pub(crate) fn new(model: Option<TimingModel>) -> Self {
        let cap = if model.is_some() { 1024 } else { 16 };
        Self { model, channel_free_at: Instant::now(), seq: 0, heap: BinaryHeap::with_capacity(cap) }
    }

    /// Whether a media model schedules completions (otherwise only delayed
    /// completions use the heap).
    #[inline]
    pub(crate) fn has_model(&self) -> bool {
        self.model.is_some()
    }

    /// How long `bytes` occupy the channel.
    pub(crate) fn occupancy(&self, bytes: u64) -> Duration {
        let Some(model) = &self.model else {
            return Duration::ZERO;
        };
        let ns = |num: u128, den: u64| {
            Duration::from_nanos((num * 1_000_000_000 / u128::from(den)).min(u128::from(u64::MAX)) as u64)
        };
        let bw = model.bandwidth_bytes_per_s.map(|b| ns(u128::from(bytes), b)).unwrap_or_default();
        let op = model.iops.map(|i| ns(1, i)).unwrap_or_default();
        bw.max(op)
    }

    /// Reserves the channel for a command moving `bytes` fetched at `now`
    /// and returns when its completion is due.
    pub(crate) fn schedule(&mut self, now: Instant, bytes: u64) -> Instant {
        let start = now.max(self.channel_free_at);
        let end = start + self.occupancy(bytes);
        self.channel_free_at = end;
        end + self.model.map_or(Duration::ZERO, |m| m.latency)
    }

    /// Queues `completion` for CQ `cqid`, due at `due`.
    pub(crate) fn push(&mut self, due: Instant, cqid: u16, completion: Completion) {
        self.seq += 1;
        self.heap.push(Scheduled { due, seq: self.seq, cqid, completion });
    }

    /// Earliest due time, if any.
    /// When the controller thread must be awake again, given that nothing
    /// new arrives: the earliest due completion, or, if the media channel
    /// is still busy, when it frees up (a command fetched before then starts
    /// no earlier, so sleeping until then costs no throughput). `None` when
    /// nothing is scheduled.
    pub(crate) fn next_wake(&self, now: Instant) -> Option<Instant> {
        let due = self.next_due()?;
        Some(if self.channel_free_at > now { due.min(self.channel_free_at) } else { due })
    }

    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|s| s.due)
    }

    /// Pops the earliest completion if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Scheduled> {
        if self.heap.peek().is_some_and(|s| s.due <= now) {
            self.heap.pop()
        } else {
            None
        }
    }

    /// Forgets the channel reservation and every scheduled completion
    /// (controller reset).
    pub(crate) fn reset(&mut self) {
        self.heap.clear();
        self.channel_free_at = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_regs::Status;

    #[test]
    fn channel_serialises_commands() {
        let model = TimingModel {
            latency: Duration::from_micros(10),
            bandwidth_bytes_per_s: Some(1_000_000_000),
            iops: Some(100_000),
        };
        let mut t = Timing::new(Some(model));
        // 4 KiB at 1 GB/s = 4.096 us < 10 us per op.
        assert_eq!(t.occupancy(4096), Duration::from_micros(10));
        // 1 MiB = 1048.576 us > 10 us.
        assert_eq!(t.occupancy(1 << 20), Duration::from_nanos(1_048_576));
        let now = Instant::now() + Duration::from_secs(1);
        let a = t.schedule(now, 4096);
        let b = t.schedule(now, 4096);
        assert_eq!(a, now + Duration::from_micros(20));
        assert_eq!(b, now + Duration::from_micros(30));
        let c = Completion { dw0: 0, sqid: 1, cid: 0, status: Status::SUCCESS, quirk: Default::default() };
        t.push(b, 1, Completion { cid: 2, ..c });
        t.push(a, 1, Completion { cid: 1, ..c });
        assert_eq!(t.next_due(), Some(a));
        assert!(t.pop_due(now).is_none());
        assert_eq!(t.pop_due(b).unwrap().completion.cid, 1);
        assert_eq!(t.pop_due(b).unwrap().completion.cid, 2);
        assert!(t.pop_due(b).is_none());
    }
}
