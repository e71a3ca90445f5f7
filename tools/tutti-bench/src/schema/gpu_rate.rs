//! `gpu-rate`: commands per second of GPU threads submitting.

use serde::{Deserialize, Serialize};

/// The fields of a `gpu-rate` document: one launch of the I/O kernel
/// against null-backed emulated controllers (or GPU null controllers),
/// beside the bare ring probe and one CPU thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRateResult {
    /// Emulated controllers.
    pub drives: u64,
    /// I/O queue pairs over all of them.
    pub queues: u64,
    /// Entries per queue.
    pub queue_depth: u32,
    /// Who serves the I/O side: `emulator` or `gpu-null`.
    pub controller: String,
    /// Where the rings live: `host` or `device`.
    pub rings: String,
    /// Commands of the protocol launch.
    pub gpu_commands: u64,
    /// The protocol kernel's GPU time (CUDA events on its stream, just
    /// before and after it), seconds.
    pub gpu_kernel_seconds: f64,
    /// `gpu_commands` over `gpu_kernel_seconds`: the device-side rate.
    pub gpu_commands_per_second: f64,
    /// The whole launch as the host sees it (grouping the requests by
    /// queue, filling the launch slot, the kernel, reading the statuses
    /// back), seconds.
    pub gpu_launch_seconds: f64,
    /// `gpu_commands` over `gpu_launch_seconds`.
    pub gpu_launch_commands_per_second: f64,
    /// Entries per second of the bare ring probe over the same queues and
    /// requests, by its kernel's GPU time (`None`: skipped or unavailable).
    pub probe_entries_per_second: Option<f64>,
    /// The same, by the probe's whole launch as the host sees it.
    pub probe_launch_entries_per_second: Option<f64>,
    /// Why the probe did not run, when it did not.
    pub probe_skipped: Option<String>,
    /// "CQ full" stalls the emulated controllers counted in the protocol
    /// run; for GPU null controllers, the polls (over every run) that found
    /// commands waiting and no free CQ slot.
    pub cq_full_stalls: u64,
    /// Commands the GPU null controllers served over every run (warm-up,
    /// probe, protocol); `None` with the emulator.
    pub null_served: Option<u64>,
    /// One CPU thread on one queue pair (`rate`), commands/s.
    pub cpu_commands_per_second: f64,
    /// `gpu_commands_per_second` / `cpu_commands_per_second`.
    pub ratio: f64,
}
