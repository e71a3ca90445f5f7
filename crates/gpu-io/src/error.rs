//! The errors of the GPU path: [`GpuError`], one enum for the crate, and
//! [`drv`], which wraps a failed CUDA driver call into it.

use cudarc::driver::result::DriverError;

#[cfg(doc)]
use crate::{abi::TuttiRequest, Gpu, GpuBuffer, GpuQueue, GpuRegion};

/// Errors of the GPU path.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver library on this machine.
    #[error(
        "no CUDA driver (libcuda) on this machine: install the NVIDIA driver, or run without the GPU path"
    )]
    NoDriver,
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed")]
    Driver {
        /// The call.
        call: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// The loaded I/O module has no `tutti_ring_probe` entry (a
    /// `TUTTI_IO_PTX` override built from an older source).
    #[error("the loaded I/O kernel module has no tutti_ring_probe entry point (TUTTI_IO_PTX from an older source?)")]
    NoRingProbe,
    /// [`Gpu::start_null_controllers`] was given a queue that a launch has
    /// used (the GPU-side indexes are no longer the host's).
    #[error(
        "I/O queue pair {qid} has been used by a GPU launch: null controllers start on fresh queues only"
    )]
    NullControllerQueueUsed {
        /// Queue identifier.
        qid: u16,
    },
    /// The null controllers did not stop within 10 s of being asked (a
    /// queue kept busy, or a hung kernel); their memory is kept.
    #[error("the GPU null controllers did not stop within 10 s")]
    NullControllerStuck,
    /// [`Gpu::start_null_controllers`] while another set of null
    /// controllers runs on this `Gpu`.
    #[error("null controllers already run on this GPU: stop them first")]
    NullControllersRunning,
    /// `TUTTI_IO_PTX` names a file that cannot be used as the I/O kernel.
    #[error("TUTTI_IO_PTX={path}: {reason}")]
    KernelOverride {
        /// The path in the environment variable.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// [`Gpu::launch`] was given one queue pair twice: its two blocks
    /// would each keep up to `size - 1` commands in flight on it and
    /// overrun its SQ.
    #[error("I/O queue pair {qid} appears twice in one GPU launch: list each queue once")]
    QueueTwice {
        /// Queue identifier.
        qid: u16,
    },
    /// [`GpuQueue::with_device_rings`] was given a queue pair that has been
    /// used (SQ tail, CQ head or phase not at their initial values).
    #[error(
        "I/O queue pair {qid} has been used: rings in GPU memory start empty, so they take a fresh pair"
    )]
    QueueNotFresh {
        /// Queue identifier.
        qid: u16,
    },
    /// [`GpuQueue::recreate`] on a queue whose rings are in GPU memory
    /// ([`GpuQueue::with_device_rings`]): no controller can reach them.
    #[error("I/O queue pair {qid} has its rings in GPU memory: only GPU null controllers serve it, it cannot be re-created on a controller")]
    DeviceRings {
        /// Queue identifier.
        qid: u16,
    },
    /// [`Gpu::launch`] was given no queues.
    #[error("a GPU launch needs at least one (GpuQueue, GpuRegion) pair; none was given")]
    NoQueues,
    /// [`Gpu::launch`] was given more queues than one launch can serve.
    #[error(
        "a GPU launch serves at most {max} queues (one block each), {queues} were given: split the batch"
    )]
    TooManyQueues {
        /// Queues given.
        queues: usize,
        /// Most queues one launch takes.
        max: usize,
    },
    /// [`Gpu::launch`] was given more requests than one launch can report.
    #[error("a GPU launch takes at most {max} requests, {requests} were given: split the batch")]
    TooManyRequests {
        /// Requests given.
        requests: usize,
        /// Most requests one launch takes.
        max: usize,
    },
    /// A request's [`TuttiRequest::queue`] is not an index into the
    /// launch's queue slice.
    #[error(
        "request {request} names queue {queue}, but the launch has {queues} queue(s): \
         TuttiRequest::queue is an index into the slice passed to launch (0..{queues})"
    )]
    QueueIndex {
        /// Index of the request in the batch.
        request: usize,
        /// The queue index it names.
        queue: u16,
        /// Number of queues in the launch.
        queues: usize,
    },
    /// [`GpuQueue::new`] was given a queue pair with commands outstanding.
    #[error(
        "I/O queue pair {qid} has {outstanding} command(s) outstanding: reap them \
         before handing the pair to the GPU"
    )]
    QueueBusy {
        /// Queue identifier.
        qid: u16,
        /// Commands submitted and not yet completed.
        outstanding: usize,
    },
    /// [`GpuQueue::new`] was given a queue pair whose SQ and CQ differ in
    /// size (the kernel indexes both with one size).
    #[error(
        "I/O queue pair {qid} has a {sq_entries}-entry SQ and a {cq_entries}-entry CQ: \
         the GPU path needs equal sizes; create the pair with one size for both"
    )]
    QueueSizeMismatch {
        /// Queue identifier.
        qid: u16,
        /// SQ entries.
        sq_entries: u32,
        /// CQ entries.
        cq_entries: u32,
    },
    /// Allocating or mapping a queue's PRP list pages failed.
    #[error("allocating {bytes} bytes of PRP list memory for I/O queue pair {qid}")]
    PrpListMemory {
        /// Queue identifier.
        qid: u16,
        /// Bytes asked for (one 4 KiB page per GPU thread of the queue).
        bytes: usize,
        /// The allocation's or the mapping's error.
        #[source]
        source: nvm_queue::DmaError,
    },
    /// The drive sees a queue's PRP list pages at non-consecutive bus
    /// addresses (a mapping without an IOMMU: one physical address per
    /// page); the kernel addresses the list pages as one range.
    #[error(
        "the PRP list memory of I/O queue pair {qid} is not contiguous for the drive \
         (page {page} at bus address {found:#x}, expected {expected:#x}): the GPU path \
         needs an IOMMU mapping (vfio-pci with an IOMMU gives consecutive IOVAs)"
    )]
    PrpListNotContiguous {
        /// Queue identifier.
        qid: u16,
        /// Index of the first page out of sequence.
        page: usize,
        /// Its bus address.
        found: u64,
        /// The address that would have continued the range.
        expected: u64,
    },
    /// [`GpuRegion::new`] was given a length the DMA mapping does not cover.
    #[error(
        "a GPU data region of {len} bytes does not fit its {mapping_len}-byte DMA mapping: \
         pass a length of at most the mapping's (which must not be empty)"
    )]
    RegionOutsideMapping {
        /// Region length asked for.
        len: usize,
        /// Length of the mapping.
        mapping_len: usize,
    },
    /// A copy to or from a [`GpuBuffer`] reaches past its end.
    #[error(
        "copy of {len} bytes at offset {offset} is outside the {size}-byte GPU buffer: \
         keep offset + length within GpuBuffer::len()"
    )]
    BufferOutOfBounds {
        /// Byte offset of the copy.
        offset: usize,
        /// Bytes to copy.
        len: usize,
        /// Size of the buffer.
        size: usize,
    },
    /// Reading back more bytes than a device allocation holds (a bug in
    /// gpu-io: every read is sized from the allocation's contents).
    #[error(
        "reading {bytes} bytes back from a {size}-byte device allocation (a bug in gpu-io: please report it)"
    )]
    DeviceReadPastEnd {
        /// Bytes asked for.
        bytes: usize,
        /// Size of the allocation.
        size: usize,
    },
    /// A range given to [`Gpu::crc32c`] reaches past its buffer's end.
    #[error(
        "CRC32C item {item}: {len} bytes at offset {offset} are outside the {size}-byte GPU buffer: \
         keep offset + length within GpuBuffer::len()"
    )]
    Crc32cOutOfBounds {
        /// Index of the item in the batch.
        item: usize,
        /// Byte offset of the range.
        offset: usize,
        /// Bytes in the range.
        len: usize,
        /// Size of the buffer in bytes.
        size: usize,
    },
    /// A range given to [`Gpu::crc32c`] lies in a [`GpuBuffer`] of another
    /// [`Gpu`] (another CUDA context, whose memory this one cannot read).
    #[error(
        "CRC32C item {item} is in a GPU buffer of another Gpu: checksum it with the Gpu it was allocated on"
    )]
    Crc32cForeignBuffer {
        /// Index of the item in the batch.
        item: usize,
    },
    /// A raw range given to [`Gpu::crc32c_raw`] is longer than
    /// [`crate::MAX_CRC32C_LEN`] or wraps past the end of the address space.
    #[error(
        "CRC32C item {item}: {len} bytes at device address {ptr:#x} wrap the address space or \
         exceed MAX_CRC32C_LEN"
    )]
    Crc32cBadRange {
        /// Index of the item in the batch.
        item: usize,
        /// Device pointer of the range.
        ptr: u64,
        /// Bytes in the range.
        len: usize,
    },
    /// A CRC32C batch needs more chunks than one launch counts.
    #[error("a CRC32C batch of {items} items needs more than {max_tasks} chunks of 8 KiB: split the batch")]
    Crc32cBatchTooLarge {
        /// Items in the batch.
        items: usize,
        /// Most chunks one launch takes ([`crate::MAX_CRC32C_TASKS`]).
        max_tasks: u64,
    },
    /// [`Gpu::launch_on`] was given the legacy default stream (0), which
    /// synchronises with every blocking stream: pass a stream of your own
    /// (or none, for the GPU's own).
    #[error("the legacy default stream (0) cannot carry an I/O kernel: pass a created stream, or none")]
    LegacyStream,
    /// Re-creating a queue pair on the controller failed.
    #[error("re-creating I/O queue pair {qid}")]
    Recreate {
        /// Queue identifier.
        qid: u16,
        /// The controller's error.
        #[source]
        source: nvm_queue::ControllerError,
    },
}

/// Wraps the error of the CUDA driver call `call` as [`GpuError::Driver`].
pub(crate) fn drv(call: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |source| GpuError::Driver { call, source }
}
