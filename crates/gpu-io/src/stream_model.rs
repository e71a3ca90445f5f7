//! A CPU model of how CUDA streams share the GPU's hardware queues
//! (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default), checking in plain
//! `cargo test` the rule that issue 23's hang broke: **no GPU work may wait
//! for an I/O kernel, except behind it on the same stream.**
//!
//! With emulated drives, an I/O kernel ends only after the emulator's
//! copies of its data, which the emulator queues on its copy lanes while
//! the kernel runs. A hardware queue serves its streams' work in the order
//! it was queued, and an entry that cannot start yet (a `cuStreamWaitEvent`
//! on a kernel still running, a copy behind a running kernel on its own
//! stream) holds back everything queued behind it in that hardware queue,
//! whatever its stream. When a copy lane shares the queue, the kernel waits
//! for copies that wait for the kernel: a cycle only the commands' budgets
//! break (every item `Timeout`). A kernel behind a kernel on the same
//! stream does not hold its queue (the compute engine orders the two):
//! `tutti-bench stripe --gpu` with two launches in flight completed with
//! `CUDA_DEVICE_MAX_CONNECTIONS=1` on the H200.
//!
//! The model plays the work a KV load queues (the I/O kernel, the
//! emulator's copies, the checksum, a second launch on the same or another
//! stream) over every mapping of streams to 1 to 4 hardware queues, with
//! the emulator's copies queued after whatever the host queued before them
//! (the order that failed), and with the launch ordering the code uses
//! ([`crate::launch::order::order_after`]). The checks fail if the checksum goes
//! back to waiting for the load on the GPU, or if a launch on another
//! stream waits for the previous one on the GPU.

#![cfg(test)]

use crate::launch::order::{order_after, After};

/// What a hardware-queue entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// An I/O kernel that ends once `copies` emulator copies have run; the
    /// emulator queues them on stream `lane` once the kernel has started.
    Io { id: usize, copies: usize, lane: usize },
    /// One emulator copy for I/O kernel `id`.
    Copy { id: usize },
    /// `cuStreamWaitEvent` on I/O kernel `id`'s end event.
    WaitFor { id: usize },
    /// A kernel that ends as soon as it starts (the checksum).
    Plain,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    stream: usize,
    work: Work,
    started: bool,
    done: bool,
}

/// Streams on hardware queues, and the entries queued so far.
struct Gpu {
    /// Hardware queue of each stream.
    queue_of: Vec<usize>,
    entries: Vec<Entry>,
    copies_done: Vec<usize>,
}

impl Gpu {
    fn new(queue_of: Vec<usize>) -> Self {
        Self { queue_of, entries: Vec::new(), copies_done: vec![0; 8] }
    }

    fn push(&mut self, stream: usize, work: Work) {
        self.entries.push(Entry { stream, work, started: false, done: false });
    }

    fn io_done(&self, id: usize) -> bool {
        self.entries.iter().any(|e| matches!(e.work, Work::Io { id: i, .. } if i == id) && e.done)
    }

    /// The entry before `i` on its stream, if any.
    fn stream_before(&self, i: usize) -> Option<&Entry> {
        self.entries[..i].iter().rev().find(|e| e.stream == self.entries[i].stream)
    }

    /// Whether entry `i` can leave its hardware queue now; kernels behind
    /// a kernel on their stream leave (the compute engine orders them).
    fn can_issue(&self, i: usize) -> bool {
        let e = &self.entries[i];
        let before = self.stream_before(i);
        let before_done = before.is_none_or(|b| b.done);
        match e.work {
            Work::WaitFor { id } => before_done && self.io_done(id),
            Work::Copy { .. } => before_done,
            Work::Io { .. } | Work::Plain => {
                before_done || before.is_some_and(|b| matches!(b.work, Work::Io { .. } | Work::Plain))
            }
        }
    }

    /// One step: every hardware queue issues its first waiting entry if it
    /// can; started work runs. Returns whether anything changed.
    fn step(&mut self) -> bool {
        let mut changed = false;
        let queues = self.queue_of.iter().copied().max().unwrap_or(0) + 1;
        for q in 0..queues {
            let head = (0..self.entries.len())
                .find(|&i| !self.entries[i].started && self.queue_of[self.entries[i].stream] == q);
            if let Some(i) = head.filter(|&i| self.can_issue(i)) {
                self.entries[i].started = true;
                changed = true;
            }
        }
        for i in 0..self.entries.len() {
            changed |= self.run(i);
        }
        changed
    }

    /// Runs started entry `i` as far as it can go.
    fn run(&mut self, i: usize) -> bool {
        let e = self.entries[i];
        if !e.started || e.done || !self.stream_before(i).is_none_or(|b| b.done) {
            return false;
        }
        match e.work {
            Work::Io { id, copies, lane } => {
                // Running: the emulator queues its copies (once), behind
                // whatever is queued by now.
                if !self.entries.iter().any(|c| c.work == Work::Copy { id }) {
                    for _ in 0..copies {
                        self.push(lane, Work::Copy { id });
                    }
                }
                if self.copies_done[id] < copies {
                    return false;
                }
            }
            Work::Copy { id } => self.copies_done[id] += 1,
            Work::WaitFor { .. } | Work::Plain => {}
        }
        self.entries[i].done = true;
        true
    }

    /// Runs until everything is done (`true`) or nothing can move (a
    /// cycle: `false`).
    fn settle(&mut self) -> bool {
        while self.step() {}
        self.entries.iter().all(|e| e.done)
    }

    /// The host waits for I/O kernel `id` (`cuEventSynchronize`).
    fn host_wait(&mut self, id: usize) -> bool {
        while !self.io_done(id) {
            if !self.step() {
                return false;
            }
        }
        true
    }
}

/// Streams: 0 the I/O stream, 1 the checksum stream, 2 and 3 copy lanes,
/// 4 a caller's stream.
const STREAMS: usize = 5;

/// Every mapping of the streams onto 1 to 4 hardware queues.
fn mappings() -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for queues in 1..=4usize {
        for code in 0..queues.pow(STREAMS as u32) {
            out.push((0..STREAMS).map(|s| code / queues.pow(s as u32) % queues).collect());
        }
    }
    out
}

/// A KV load as tutti-kv did it before issue 23's fix: the checksum queued
/// on its stream behind the load's end event.
fn load_then_checksum_on_the_gpu(gpu: &mut Gpu) -> bool {
    gpu.push(0, Work::Io { id: 1, copies: 3, lane: 2 });
    gpu.push(1, Work::WaitFor { id: 1 });
    gpu.push(1, Work::Plain);
    gpu.settle()
}

/// A KV load as tutti-kv does it: the checksum launched once the host has
/// seen the load end.
fn load_then_checksum_after_it(gpu: &mut Gpu) -> bool {
    gpu.push(0, Work::Io { id: 1, copies: 3, lane: 2 });
    if !gpu.host_wait(1) {
        return false;
    }
    gpu.push(1, Work::Plain);
    gpu.settle()
}

/// Two launches on the same queues, the second on `second_stream`,
/// ordered after the first as the code orders them.
fn two_launches(gpu: &mut Gpu, second_stream: usize) -> bool {
    gpu.push(0, Work::Io { id: 1, copies: 2, lane: 2 });
    match order_after(Some((0, false)), second_stream) {
        After::Nothing | After::StreamOrder => {}
        After::HostWait => {
            if !gpu.host_wait(1) {
                return false;
            }
        }
    }
    gpu.push(second_stream, Work::Io { id: 2, copies: 2, lane: 3 });
    gpu.settle()
}

#[test]
fn a_checksum_queued_behind_the_load_on_the_gpu_can_stall_it() {
    // The model sees issue 23's cycle: some mapping (a copy lane sharing
    // the checksum stream's hardware queue) never completes.
    let stalls = mappings().into_iter().filter(|m| !load_then_checksum_on_the_gpu(&mut Gpu::new(m.clone())));
    assert!(stalls.count() > 0, "the model must show the cycle the old order made");
}

#[test]
fn a_checksum_launched_after_the_load_never_stalls_it() {
    for m in mappings() {
        assert!(load_then_checksum_after_it(&mut Gpu::new(m.clone())), "streams on queues {m:?}");
    }
}

#[test]
fn two_launches_in_flight_on_one_stream_or_two_complete_on_any_mapping() {
    for m in mappings() {
        assert!(two_launches(&mut Gpu::new(m.clone()), 0), "same stream, queues {m:?}");
        assert!(two_launches(&mut Gpu::new(m.clone()), 4), "caller's stream, queues {m:?}");
    }
}

#[test]
fn a_launch_waiting_on_the_gpu_for_another_streams_launch_can_stall_it() {
    // What `order_after` must never answer for another stream: the
    // second launch's stream made to wait on the GPU.
    let stalls = mappings().into_iter().filter(|m| {
        let mut gpu = Gpu::new(m.clone());
        gpu.push(0, Work::Io { id: 1, copies: 2, lane: 2 });
        gpu.push(4, Work::WaitFor { id: 1 });
        gpu.push(4, Work::Io { id: 2, copies: 2, lane: 3 });
        !gpu.settle()
    });
    assert!(stalls.count() > 0);
    assert_eq!(order_after(Some((0, false)), 4), After::HostWait);
    assert_eq!(order_after(Some((0, true)), 4), After::Nothing);
    assert_eq!(order_after(Some((4, false)), 4), After::StreamOrder);
    assert_eq!(order_after(None, 4), After::Nothing);
}
