//! GPU launch lanes: which of a drive's GPU queues, and which CUDA stream,
//! a GPU-executed batch launches on.
//!
//! Lane `i` is queue `i` (modulo its count) of every drive with GPU queues,
//! plus, for a batch submitted without a caller stream, a CUDA stream of
//! the runtime's own. Kernels on one stream run one after another, so with
//! one stream two batches in flight never overlap on the GPU: each batch
//! starts on idle drives and pays a command latency before data flows
//! (`stripe --gpu` at batch 32 moved 87.9% of the modelled bandwidth on
//! four drives; docs/benchmarks.md, "Issue 23"). With lanes, the next batch
//! runs beside the one in flight, on its own queues, and the drives stay
//! busy.
//!
//! A batch takes, in this order: the lane whose last launch is still
//! running on the caller's own stream (stream order keeps that caller's
//! launches in submission order, with no host wait); else the first idle
//! lane from a round-robin start; else the round-robin lane itself, behind
//! its running launch (on its own stream: stream order; on another stream:
//! `gpu-io` waits for it on the host, never on the GPU). Two threads that
//! pick the same lane at once stay correct: `gpu-io` orders launches on a
//! queue by the same rules.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use gpu_io::{Gpu, GpuError, GpuStream, LaunchEnd};

/// The runtime's launch lanes: one stream per lane, and each lane's last
/// launch.
#[derive(Debug)]
pub(crate) struct GpuLanes {
    streams: Vec<GpuStream>,
    /// Per lane: the stream of its last launch and that launch's end.
    last: Mutex<Vec<Option<(u64, LaunchEnd)>>>,
    /// Round-robin start of the next pick.
    next: AtomicUsize,
}

/// A lane picked for one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane {
    /// Lane number: the launch uses queue `index % n` of each drive that
    /// has `n` GPU queues.
    pub index: usize,
    /// The stream to launch on: the caller's, or the lane's own.
    pub stream: u64,
}

impl GpuLanes {
    /// `count` lanes (at least one), each with a new stream of `gpu`.
    ///
    /// # Errors
    ///
    /// A CUDA error creating a stream.
    pub(crate) fn new(gpu: &Gpu, count: usize) -> Result<Self, GpuError> {
        let streams = (0..count.max(1)).map(|_| GpuStream::new(gpu)).collect::<Result<Vec<_>, _>>()?;
        let last = Mutex::new(vec![None; streams.len()]);
        Ok(Self { streams, last, next: AtomicUsize::new(0) })
    }

    /// The lane for a launch on `caller`'s stream (`None`: the lane's own
    /// stream), by the rules in the module's documentation.
    pub(crate) fn pick(&self, caller: Option<u64>) -> Lane {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let running: Vec<Option<u64>> =
            last.iter().map(|l| l.as_ref().filter(|(_, end)| !end.is_done()).map(|(s, _)| *s)).collect();
        let index = choose(&running, caller, self.next.fetch_add(1, Ordering::Relaxed));
        Lane { index, stream: caller.unwrap_or_else(|| self.streams[index].raw()) }
    }

    /// Records the launch just made on `lane`.
    pub(crate) fn launched(&self, lane: Lane, end: LaunchEnd) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last[lane.index] = Some((lane.stream, end));
    }
}

/// The lane for a launch on `caller`'s stream, given each lane's running
/// launch's stream (`None`: idle) and a round-robin counter `turn`.
fn choose(running: &[Option<u64>], caller: Option<u64>, turn: usize) -> usize {
    let n = running.len().max(1);
    if let Some(i) = caller.and_then(|s| running.iter().position(|&r| r == Some(s))) {
        return i;
    }
    let start = turn % n;
    (0..n).map(|k| (start + k) % n).find(|&i| running.get(i).is_none_or(|r| r.is_none())).unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn a_batch_goes_to_an_idle_lane_while_another_runs() {
        // Lane 0 runs a launch of the runtime's own stream 10: the next
        // batch takes lane 1, whatever the round-robin start.
        assert_eq!(choose(&[Some(10), None], None, 0), 1);
        assert_eq!(choose(&[Some(10), None], None, 1), 1);
        assert_eq!(choose(&[None, Some(11)], None, 1), 0);
    }

    #[test]
    fn idle_lanes_are_taken_in_turn() {
        assert_eq!(choose(&[None, None, None], None, 0), 0);
        assert_eq!(choose(&[None, None, None], None, 1), 1);
        assert_eq!(choose(&[None, None, None], None, 5), 2);
    }

    #[test]
    fn a_caller_stream_with_a_running_launch_stays_on_its_lane() {
        // Stream order keeps one caller's launches in order without a
        // host wait, even when another lane is idle.
        assert_eq!(choose(&[None, Some(77)], Some(77), 0), 1);
        // Another caller stream goes to the idle lane.
        assert_eq!(choose(&[None, Some(77)], Some(78), 1), 0);
    }

    #[test]
    fn with_every_lane_busy_the_turn_decides() {
        assert_eq!(choose(&[Some(1), Some(2)], None, 0), 0);
        assert_eq!(choose(&[Some(1), Some(2)], None, 3), 1);
        assert_eq!(choose(&[Some(1), Some(2)], Some(9), 3), 1);
    }
}
