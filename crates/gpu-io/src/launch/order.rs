//! How a launch is shaped and ordered: threads per block
//! ([`block_threads`]), its order after earlier launches on its queues
//! ([`order_after`]) and the batch grouped by queue ([`group_by_queue`]).

use cudarc::driver::sys;

use crate::abi::{TuttiQueue, TuttiRequest};
use crate::error::GpuError;
use crate::queue::GpuQueue;
use crate::region::GpuRegion;
use crate::status::{MAX_QUEUES_PER_LAUNCH, MAX_REQUESTS_PER_LAUNCH};

#[cfg(doc)]
use crate::Gpu;

/// Threads per block of a launch: as many as asked (1 to 1024), at most
/// one per usable entry of the largest queue (`max_size - 1`), and at most
/// what the entry point can run per block (`func_max`: its registers per
/// thread limit it; with 66 registers a block of 1,024 threads does not
/// launch, `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`). The kernel serves a
/// queue with fewer threads than entries (each carries one command at a
/// time).
pub(crate) fn block_threads(requested: u32, max_size: u32, func_max: u32) -> u32 {
    requested.clamp(1, 1024).min(max_size.saturating_sub(1).max(1)).min(func_max.max(1))
}

/// The most threads a block of `func` may have
/// (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`); 1024 if the driver does
/// not say.
pub(crate) fn func_max_threads(func: sys::CUfunction) -> u32 {
    let mut v = 0i32;
    let attr = sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
    // SAFETY: `func` is a live function of the loaded module; `v` is a
    // valid out-pointer.
    let r = unsafe { sys::cuFuncGetAttribute(&mut v, attr, func) };
    if r == sys::CUresult::CUDA_SUCCESS && v > 0 {
        v as u32
    } else {
        1024
    }
}

/// How a launch is ordered after the last launch on one of its queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// No launch before it, or that one has ended.
    Nothing,
    /// That one was made on the same stream: the stream orders the two.
    StreamOrder,
    /// That one was made on another stream and may still run: the host
    /// waits for it before queuing this one (never the GPU: see
    /// [`Gpu::wait_other_streams`]; checked by `stream_model.rs`).
    HostWait,
}

/// The ordering of a launch on `stream` after `prev`, the last launch on
/// one of its queues as (its stream, whether it has ended).
pub(crate) fn order_after<S: PartialEq>(prev: Option<(S, bool)>, stream: S) -> After {
    match prev {
        None | Some((_, true)) => After::Nothing,
        Some((s, false)) if s == stream => After::StreamOrder,
        Some(_) => After::HostWait,
    }
}

/// Queue descriptors, request order by queue, per-queue offsets.
type Grouped = (Vec<TuttiQueue>, Vec<u32>, Vec<u32>);

/// Checks the batch and groups its request indexes by queue: the queue
/// descriptors (with each queue's data region), the order and the
/// per-queue offsets into it.
pub(crate) fn group_by_queue(
    queues: &[(&GpuQueue, &GpuRegion)],
    requests: &[TuttiRequest],
) -> Result<Grouped, GpuError> {
    if queues.is_empty() {
        return Err(GpuError::NoQueues);
    }
    if queues.len() > MAX_QUEUES_PER_LAUNCH {
        return Err(GpuError::TooManyQueues { queues: queues.len(), max: MAX_QUEUES_PER_LAUNCH });
    }
    if requests.len() > MAX_REQUESTS_PER_LAUNCH {
        return Err(GpuError::TooManyRequests { requests: requests.len(), max: MAX_REQUESTS_PER_LAUNCH });
    }
    let mut seen = std::collections::HashSet::with_capacity(queues.len());
    if let Some((q, _)) = queues.iter().find(|(q, _)| !seen.insert(std::ptr::from_ref::<GpuQueue>(q))) {
        return Err(GpuError::QueueTwice { qid: q.qid() });
    }
    let mut counts = vec![0u32; queues.len() + 1];
    for (i, r) in requests.iter().enumerate() {
        let q = usize::from(r.queue);
        if q >= queues.len() {
            return Err(GpuError::QueueIndex { request: i, queue: r.queue, queues: queues.len() });
        }
        counts[q + 1] += 1;
    }
    for q in 0..queues.len() {
        counts[q + 1] += counts[q];
    }
    let offsets = counts.clone();
    let mut order = vec![0u32; requests.len()];
    let mut fill = counts;
    for (i, r) in requests.iter().enumerate() {
        let q = usize::from(r.queue);
        order[fill[q] as usize] = i as u32;
        fill[q] += 1;
    }
    let descs = queues
        .iter()
        .map(|(q, region)| TuttiQueue { pages: region.pages_ptr(), region_len: region.len as u64, ..q.desc })
        .collect();
    Ok((descs, order, offsets))
}

#[cfg(test)]
mod tests {
    use super::block_threads;

    #[test]
    fn a_block_never_has_more_threads_than_the_entry_point_can_run() {
        // A 1,024-entry queue and a kernel of 66 registers per thread (at
        // most 960 threads per block on a GPU of 64 K registers): 960, not
        // 1,023 (which did not launch on the H200).
        assert_eq!(block_threads(u32::MAX, 1024, 960), 960);
        assert_eq!(block_threads(u32::MAX, 256, 960), 255, "one per usable entry");
        assert_eq!(block_threads(32, 1024, 1024), 32, "as asked");
        assert_eq!(block_threads(0, 2, 1024), 1, "at least one");
        assert_eq!(block_threads(u32::MAX, 65536, 1024), 1024, "never above 1,024");
    }
}
