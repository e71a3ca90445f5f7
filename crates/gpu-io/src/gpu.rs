//! Context, module, host mappings, queue pairs and launches.

use std::ffi::{c_void, CStr};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{sys, CudaContext};
use std::sync::{Mutex, MutexGuard};

use nvm_queue::{Controller, DmaBuffer, DmaMapping, NvmeDevice, QueuePair};
use nvme_regs::Status;

use crate::abi::{
    TuttiQueue, TuttiQueueState, TuttiRequest, DONE_ENTRIES, STATUS_BAD_REQUEST, STATUS_NO_CID,
    STATUS_TIMEOUT, STATUS_UNSUPPORTED,
};
use crate::copy_lanes::CopyLanes;
use crate::launch::{KernelEvent, SlotPool};
use crate::ptx::{TUTTI_CRC32C_ENTRY_C, TUTTI_CRC32C_PTX_C, TUTTI_IO_ENTRY_C};

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

/// Most queues one [`Gpu::launch`] serves (one block each; a request names
/// its queue with a `u16` index).
pub const MAX_QUEUES_PER_LAUNCH: usize = u16::MAX as usize;

/// Most requests one [`Gpu::launch`] takes (the kernel indexes them with
/// `u32`s).
pub const MAX_REQUESTS_PER_LAUNCH: usize = u32::MAX as usize;

pub(crate) fn drv(call: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |source| GpuError::Driver { call, source }
}

/// Final state of one request of a GPU batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuStatus {
    /// Completed with NVMe status 0.
    Success,
    /// Completed with an NVMe error status.
    Nvme(Status),
    /// No completion within the budget.
    Timeout,
    /// Needs more than one PRP list page (more than 512 4 KiB pages after
    /// the first): not supported; split the transfer.
    Unsupported,
    /// Memory range or queue invalid.
    BadRequest,
    /// Not submitted: every CID of its queue is held by a command that
    /// timed out and never completed (the drive may still complete it).
    /// The queue needs a controller reset and `GpuQueue::recreate`.
    NoCid,
    /// The kernel did not reach it (a bug if ever seen).
    NotRun,
}

/// Result word the host writes before a launch.
pub(crate) const STATUS_NOT_RUN: u32 = 0x8000_00FF;

impl GpuStatus {
    /// Decodes the kernel's result word.
    pub fn from_word(w: u32) -> Self {
        match w {
            0 => GpuStatus::Success,
            STATUS_TIMEOUT => GpuStatus::Timeout,
            STATUS_UNSUPPORTED => GpuStatus::Unsupported,
            STATUS_BAD_REQUEST => GpuStatus::BadRequest,
            STATUS_NO_CID => GpuStatus::NoCid,
            w if w & 0x8000_0000 == 0 => GpuStatus::Nvme(Status::from_field((w << 1) as u16)),
            _ => GpuStatus::NotRun,
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub(crate) struct DeviceMem {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) len: usize,
    /// `false` for memory the caller owns (never freed here).
    owned: bool,
    pub(crate) ctx: Arc<CudaContext>,
}

impl DeviceMem {
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: plain allocation in the bound context; freed in Drop.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }.map_err(drv("cuMemAlloc"))?;
        let mem = Self { ptr, len, owned: true, ctx: ctx.clone() };
        // SAFETY: `ptr` is a live allocation of at least `len` bytes.
        unsafe { result::memset_d8_sync(ptr, 0, len.max(1)) }.map_err(drv("cuMemsetD8"))?;
        Ok(mem)
    }

    pub(crate) fn from_slice<T: Copy>(ctx: &Arc<CudaContext>, data: &[T]) -> Result<Self, GpuError> {
        let mem = Self::zeroed(ctx, std::mem::size_of_val(data))?;
        if !data.is_empty() {
            // SAFETY: the allocation holds exactly `data`'s bytes; T is plain
            // data (Copy, repr(C) ABI structs or integers).
            unsafe { result::memcpy_htod_sync(mem.ptr, data) }.map_err(drv("cuMemcpyHtoD"))?;
        }
        Ok(mem)
    }

    pub(crate) fn read<T: Copy + Default>(&self, n: usize) -> Result<Vec<T>, GpuError> {
        let bytes = n.saturating_mul(size_of::<T>());
        if bytes > self.len {
            return Err(GpuError::DeviceReadPastEnd { bytes, size: self.len });
        }
        let mut v = vec![T::default(); n];
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `v` has room for n elements; the allocation holds at least
        // as many bytes (checked above).
        unsafe { result::memcpy_dtoh_sync(&mut v, self.ptr) }.map_err(drv("cuMemcpyDtoH"))?;
        Ok(v)
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `malloc_sync` in this context, freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A non-blocking CUDA stream: it never synchronises with the legacy
/// default stream, so a kernel that waits on the emulator and the
/// emulator's CUDA copies into GPU memory can run at the same time.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) raw: sys::CUstream,
    ctx: Arc<CudaContext>,
}

// SAFETY: a stream handle may be used from any thread with its context bound.
unsafe impl Send for Stream {}
// SAFETY: as above; CUDA serialises work on one stream itself.
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let raw =
            result::stream::create(result::stream::StreamKind::NonBlocking).map_err(drv("cuStreamCreate"))?;
        Ok(Self { raw, ctx: ctx.clone() })
    }

    /// Binds the stream's context to the calling thread.
    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    pub(crate) fn sync(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `raw` is a live stream of this context.
        unsafe { result::stream::synchronize(self.raw) }.map_err(drv("cuStreamSynchronize"))
    }
}

/// The gate of the GPU path's own CUDA memory management (device
/// allocations and frees, memsets, synchronous copies, stream creation):
/// each runs only while no I/O kernel runs.
///
/// Why: an I/O kernel waits for completions that the emulator delivers
/// after CUDA copies from its controller thread (`GpuBuffer::copy_in` /
/// `copy_out`). On the H200 (2026-12-01), such a call made by another
/// thread while an I/O kernel ran (a checksum's buffers, a second launch's
/// descriptors) left the emulator's copies waiting behind the kernel,
/// and the kernel waiting for the copies until each command's budget
/// ended: puts of GPU memory in flight together timed out. Whatever the
/// driver's reason (an implicit device synchronisation in `cuMemFree`,
/// or the ordering the CUDA programming guide gives allocations and
/// memsets), none of this crate's calls of that kind now overlaps an I/O
/// kernel. Shown on the H200: see docs/gpu.md, "Memory management while
/// I/O kernels run".
///
/// Never entered by the emulator's controller thread (a `GpuBuffer`'s
/// copies, its asynchronous copies and fences, and its drop are not
/// gated), which the kernels wait on.
#[derive(Debug)]
pub(crate) struct Quiesce {
    /// The end events of the launches in flight (on any stream).
    lock: Mutex<Vec<Arc<KernelEvent>>>,
    /// The I/O kernels' own stream (launches that name no stream).
    pub(crate) io: Stream,
    /// Kernels that run until told to stop (GPU null controllers): while
    /// one runs, reusable memory is kept rather than freed (a CUDA free
    /// may wait for every kernel, this one included).
    persistent: std::sync::atomic::AtomicUsize,
}

impl Quiesce {
    pub(crate) fn new(io: Stream) -> Self {
        Self { lock: Mutex::new(Vec::new()), io, persistent: Default::default() }
    }

    /// Counts a kernel that runs until told to stop (`+1`) or its end.
    pub(crate) fn persistent_kernel(&self, started: bool) {
        use std::sync::atomic::Ordering;
        if started {
            self.persistent.fetch_add(1, Ordering::AcqRel);
        } else {
            self.persistent.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether memory may be freed now (no persistent kernel runs).
    pub(crate) fn may_free(&self) -> bool {
        self.persistent.load(std::sync::atomic::Ordering::Acquire) == 0
    }

    /// Returns `item` (a launch slot, a checksum scratch) to the pool
    /// `free` when `keep` says the pool wants it, or while a persistent
    /// kernel runs; otherwise frees it inside the gate (re-checking there:
    /// a persistent kernel starts inside the gate, and a free would wait
    /// for it).
    pub(crate) fn keep_or_free<T>(&self, free: &Mutex<Vec<T>>, item: T, keep: impl FnOnce(&[T]) -> bool) {
        let mut pool = free.lock().unwrap_or_else(|p| p.into_inner());
        if keep(&pool) || !self.may_free() {
            pool.push(item);
            return;
        }
        drop(pool);
        let gate = self.enter();
        if !self.may_free() {
            free.lock().unwrap_or_else(|p| p.into_inner()).push(item);
            return;
        }
        drop(item);
        drop(gate);
    }

    /// Takes the gate, then waits until every I/O kernel launched so far
    /// has ended (each command bounded by its launch's budget; the thread
    /// sleeps on each launch's event). Hold the guard across the memory
    /// management: no launch starts meanwhile.
    pub(crate) fn enter(&self) -> Result<MutexGuard<'_, Vec<Arc<KernelEvent>>>, GpuError> {
        let mut guard = self.lock();
        for e in guard.iter() {
            e.synchronize()?;
        }
        guard.clear();
        self.io.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        self.io.sync()?;
        Ok(guard)
    }

    /// The list of launches in flight, locked (a launch holds it while it
    /// queues its work and lists itself).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<Arc<KernelEvent>>> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unlists a launch that has ended.
    pub(crate) fn finished(&self, done: &Arc<KernelEvent>) {
        self.lock().retain(|e| !Arc::ptr_eq(e, done));
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in `new`, destroyed once, after its work (callers
        // synchronise before dropping).
        let _ = unsafe { result::stream::destroy(self.raw) };
    }
}

/// Host memory registered with CUDA and mapped into the GPU's address space
/// (`cuMemHostRegister` with `DEVICEMAP | PORTABLE`); unregistered on drop.
#[derive(Debug)]
struct HostMapping {
    host: *mut c_void,
    dptr: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the mapping is an address pair; CUDA calls on it bind the context
// of the thread that makes them.
unsafe impl Send for HostMapping {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for HostMapping {}

impl HostMapping {
    /// # Safety
    ///
    /// `host..host + len` must stay allocated until the mapping is dropped,
    /// and must not overlap another registration.
    unsafe fn new(ctx: &Arc<CudaContext>, host: *mut u8, len: usize) -> Result<Self, GpuError> {
        // SAFETY: forwarded.
        unsafe { Self::with_flags(ctx, host, len, 0) }
    }

    /// As [`HostMapping::new`], adding `extra` registration flags (e.g.
    /// `CU_MEMHOSTREGISTER_IOMEMORY` for a device's MMIO window).
    ///
    /// # Safety
    ///
    /// As for [`HostMapping::new`].
    unsafe fn with_flags(
        ctx: &Arc<CudaContext>,
        host: *mut u8,
        len: usize,
        extra: u32,
    ) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP | extra;
        // SAFETY: forwarded from this function's contract.
        unsafe { sys::cuMemHostRegister_v2(host.cast(), len, flags) }
            .result()
            .map_err(drv("cuMemHostRegister"))?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` was registered with DEVICEMAP just above.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host.cast(), 0) }.result();
        let mapping = Self { host: host.cast(), dptr, ctx: ctx.clone() };
        r.map_err(drv("cuMemHostGetDevicePointer"))?;
        Ok(mapping)
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered in `new`, unregistered once.
        let _ = unsafe { sys::cuMemHostUnregister(self.host) };
    }
}

/// A GPU with the tutti kernels loaded.
#[derive(Debug)]
pub struct Gpu {
    pub(crate) func: sys::CUfunction,
    /// `tutti_ring_probe` from the same module, when the module has it (a
    /// `TUTTI_IO_PTX` override may not).
    pub(crate) probe_func: Option<sys::CUfunction>,
    /// The I/O stream and the gate of memory management (`Quiesce`).
    pub(crate) quiet: Arc<Quiesce>,
    _module: Module,
    /// `tutti_crc32c` (see [`Gpu::crc32c`]) and its module.
    pub(crate) crc_func: sys::CUfunction,
    _crc_module: Module,
    /// The checksum kernels' own stream, so that a checksum never waits
    /// behind an I/O launch on `stream`.
    pub(crate) crc_stream: Stream,
    /// Device scratch of the checksum launches, reused across calls.
    pub(crate) crc_scratch: crate::crc32c::CrcScratchPool,
    /// Multiprocessors of the device (sizes the checksum grid).
    pub(crate) sm_count: u64,
    /// The emulator's copy streams and fences for this GPU's buffers
    /// (`copy_lanes.rs`).
    pub(crate) copy_lanes: Arc<CopyLanes>,
    /// Reusable launch buffers (`launch.rs`). Declared before `ctx`.
    pub(crate) slots: Arc<SlotPool>,
    pub(crate) ctx: Arc<CudaContext>,
}

#[derive(Debug)]
pub(crate) struct Module {
    raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: loaded once in `Gpu::open`, unloaded once.
        let _ = unsafe { result::module::unload(self.raw) };
    }
}

// SAFETY: CUfunction/CUmodule are handles valid in any thread once the
// context is bound, which every method does first.
unsafe impl Send for Gpu {}
// SAFETY: the handles are never changed after `open`, so `&Gpu` only reads
// them; the CUDA driver API is thread-safe, and launches from several
// threads onto the one non-blocking stream (`Stream::new`) are queued and
// run in the order the driver receives them.
unsafe impl Sync for Gpu {}

/// Loads a PTX image into `ctx` and finds its entry point.
pub(crate) fn load_module(
    ctx: &Arc<CudaContext>,
    ptx: &CStr,
    entry: &CStr,
) -> Result<(Module, sys::CUfunction), GpuError> {
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: `ptx` is a NUL-terminated PTX image (the constants in
    // crate::ptx are checked at compile time).
    let raw = unsafe { result::module::load_data(ptx.as_ptr().cast()) }.map_err(drv("cuModuleLoadData"))?;
    let module = Module { raw, ctx: ctx.clone() };
    // SAFETY: `raw` is the module just loaded; `module` unloads it on drop.
    let func =
        unsafe { result::module::get_function(raw, entry.to_owned()) }.map_err(drv("cuModuleGetFunction"))?;
    Ok((module, func))
}

impl Gpu {
    /// Opens GPU `ordinal` and loads the kernels. [`GpuError::NoDriver`]
    /// when the CUDA driver library is absent (checked first: nothing else
    /// touches CUDA then).
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuCtxCreate"))?;
        let io_ptx = crate::ptx::io_ptx()?;
        let (module, func) = load_module(&ctx, &io_ptx, TUTTI_IO_ENTRY_C)?;
        // Looked up only when the PTX has it (a failed lookup would be a
        // driver error that tools such as compute-sanitizer report).
        let probe_entry = format!(".entry {}(", crate::ptx::TUTTI_RING_PROBE_ENTRY);
        let probe_func = if io_ptx.to_bytes().windows(probe_entry.len()).any(|w| w == probe_entry.as_bytes())
        {
            // SAFETY: `module.raw` is the module just loaded, alive in `module`.
            unsafe {
                result::module::get_function(module.raw, crate::ptx::TUTTI_RING_PROBE_ENTRY_C.to_owned())
            }
            .ok()
        } else {
            None
        };
        let (crc_module, crc_func) = load_module(&ctx, TUTTI_CRC32C_PTX_C, TUTTI_CRC32C_ENTRY_C)?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))?;
        // Fence words need stream memory operations (`cuStreamWriteValue32`).
        let stream_mem_ops = crate::copy_lanes::driver_has_stream_writes()
            && ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1)
                .is_ok_and(|v| v == 1);
        let copy_lanes =
            CopyLanes::new(&ctx, stream_mem_ops, crate::copy_lanes::driver_has_batched_copies())?;
        let quiet = Arc::new(Quiesce::new(Stream::new(&ctx)?));
        let crc_stream = Stream::new(&ctx)?;
        Ok(Self {
            func,
            probe_func,
            quiet,
            _module: module,
            crc_func,
            _crc_module: crc_module,
            crc_stream,
            crc_scratch: Default::default(),
            sm_count: u64::try_from(sm_count).unwrap_or(1).max(1),
            copy_lanes,
            slots: Arc::new(SlotPool::default()),
            ctx,
        })
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Runs one batch in one kernel launch and waits for it: see
    /// [`Gpu::launch`].
    pub fn run(
        &self,
        queues: &[(&GpuQueue, &GpuRegion)],
        requests: &[TuttiRequest],
        threads_per_queue: u32,
        budget: Duration,
    ) -> Result<Vec<GpuStatus>, GpuError> {
        self.launch(queues, requests, threads_per_queue, budget)?.wait()
    }
}

/// A drive's register window mapped into the GPU, for its doorbells.
#[derive(Debug)]
pub struct GpuDrive {
    bar: HostMapping,
    device: Arc<dyn NvmeDevice>,
}

impl GpuDrive {
    /// Maps `device`'s register window (the emulator's register page: host
    /// memory) into the GPU.
    pub fn map(gpu: &Gpu, device: Arc<dyn NvmeDevice>) -> Result<Self, GpuError> {
        let _quiet = gpu.quiet.enter()?;
        let bar = device.bar0();
        // SAFETY: the window stays allocated while `device` lives, and this
        // struct keeps `device` alive longer than the mapping (field order:
        // `bar` drops first).
        let bar = unsafe { HostMapping::new(&gpu.ctx, bar.base_ptr(), bar.len()) }?;
        Ok(Self { bar, device })
    }

    /// Maps a real controller's BAR0 (an MMIO window, e.g. mmapped from
    /// vfio-pci) into the GPU with `CU_MEMHOSTREGISTER_IOMEMORY`, so GPU
    /// threads store to its doorbells directly over PCIe. Written for real
    /// drives (issue 3's device access); not yet run on hardware: see
    /// docs/gpu.md. Emulated drives use [`GpuDrive::map`].
    pub fn map_mmio(gpu: &Gpu, device: Arc<dyn NvmeDevice>) -> Result<Self, GpuError> {
        let _quiet = gpu.quiet.enter()?;
        let bar = device.bar0();
        // SAFETY: the window stays mapped while `device` lives, which this
        // struct keeps alive longer than the registration.
        let bar = unsafe {
            HostMapping::with_flags(&gpu.ctx, bar.base_ptr(), bar.len(), sys::CU_MEMHOSTREGISTER_IOMEMORY)
        }?;
        Ok(Self { bar, device })
    }

    /// The drive.
    pub fn device(&self) -> &Arc<dyn NvmeDevice> {
        &self.device
    }
}

/// An I/O queue pair handed to the GPU. It keeps the [`QueuePair`] (and so
/// its SQ/CQ memory) alive; from here on only GPU threads drive it.
#[derive(Debug)]
pub struct GpuQueue {
    pub(crate) desc: TuttiQueue,
    state: DeviceMem,
    _sq: HostMapping,
    _cq: HostMapping,
    _lists_map: HostMapping,
    _lists: DmaBuffer,
    qid: u16,
    /// The queue's controller: told before each launch that the GPU is
    /// about to ring its doorbells ([`NvmeDevice::expect_doorbells`]).
    device: Arc<dyn NvmeDevice>,
    /// The host-side pair: owns the SQ/CQ memory; locked only to re-create
    /// the queue after a controller reset.
    qp: Mutex<QueuePair>,
    /// Rewriting and reading `state` waits for running I/O kernels.
    quiet: Arc<Quiesce>,
    /// The end event of the last launch that used this queue: a launch on
    /// another stream waits for it on the host first (one on the same
    /// stream follows it in stream order), so that two kernels never
    /// drive one queue at once.
    last: Mutex<Option<Arc<KernelEvent>>>,
    /// A GPU null controller serves this queue (`null_ctrl.rs`).
    null_served: std::sync::atomic::AtomicBool,
    /// SQ, CQ and both doorbells in GPU memory instead
    /// ([`GpuQueue::with_device_rings`]); `None` for host-memory rings.
    device_rings: Option<DeviceMem>,
}

/// Writes the GPU-side state of a queue whose host-side indexes are `qp`'s
/// (into zeroed `state`).
fn write_initial_state(state: &DeviceMem, qp: &QueuePair) -> Result<(), GpuError> {
    let init = TuttiQueueState {
        fetched: u64::from(qp.sq().head()),
        published: u64::from(qp.sq().tail()),
        cq_head: u64::from(qp.cq().head()),
        sq_head: u64::from(qp.sq().head()),
        phase: u32::from(qp.cq().phase()),
        ..Default::default()
    };
    state.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    // SAFETY: `state` holds at least one TuttiQueueState (its length is
    // the state plus the per-slot cells).
    unsafe { result::memcpy_htod_sync(state.ptr, std::slice::from_ref(&init)) }.map_err(drv("cuMemcpyHtoD"))
}

impl GpuQueue {
    /// As [`GpuQueue::new`], but the kernels see the SQ, the CQ and both
    /// doorbells in GPU memory (zeroed, `size` x 64 + `size` x 16 + 8
    /// bytes) instead of `qp`'s host rings and the drive's register page:
    /// the layout of BaM, where the queues live in GPU memory. Only a GPU
    /// null controller ([`Gpu::start_null_controllers`]) can serve such a
    /// queue: neither the emulator's threads nor the host can reach that
    /// memory, so its drive must leave its I/O queues to the GPU
    /// (`EmulatorConfig::io_queues_detached`). `qp` must be fresh (SQ tail
    /// 0, CQ head 0, phase 1), as the rings start empty. For measuring the
    /// submitter without PCIe in its loop (`tutti-bench gpu-rate --rings
    /// device`); not a datapath.
    ///
    /// # Errors
    ///
    /// As [`GpuQueue::new`]; [`GpuError::QueueNotFresh`] for a pair that
    /// has been used (its rings would start empty in GPU memory).
    pub fn with_device_rings(gpu: &Gpu, drive: &GpuDrive, qp: QueuePair) -> Result<Self, GpuError> {
        let (tail, head, phase) = (qp.sq().tail(), qp.cq().head(), qp.cq().phase());
        if (tail, head, phase) != (0, 0, true) {
            return Err(GpuError::QueueNotFresh { qid: qp.qid() });
        }
        let mut q = Self::new(gpu, drive, qp)?;
        let _quiet = gpu.quiet.enter()?;
        let size = q.desc.size as usize;
        let rings = DeviceMem::zeroed(&gpu.ctx, size * 80 + 8)?;
        q.desc.sq = rings.ptr;
        q.desc.cq = rings.ptr + size as u64 * 64;
        q.desc.sq_doorbell = rings.ptr + size as u64 * 80;
        q.desc.cq_doorbell = q.desc.sq_doorbell + 4;
        q.device_rings = Some(rings);
        Ok(q)
    }

    /// Whether the SQ, CQ and doorbells are in GPU memory
    /// ([`GpuQueue::with_device_rings`]).
    pub fn has_device_rings(&self) -> bool {
        self.device_rings.is_some()
    }

    /// Maps `qp`'s SQ and CQ into the GPU and sets up its state from the
    /// pair's current indexes. `qp` must be idle (nothing outstanding).
    pub fn new(gpu: &Gpu, drive: &GpuDrive, qp: QueuePair) -> Result<Self, GpuError> {
        // Registrations and allocations: not while an I/O kernel runs.
        let _quiet = gpu.quiet.enter()?;
        let qid = qp.qid();
        if qp.outstanding() != 0 {
            return Err(GpuError::QueueBusy { qid, outstanding: qp.outstanding() });
        }
        let size = qp.sq().size();
        if qp.cq().size() != size {
            return Err(GpuError::QueueSizeMismatch { qid, sq_entries: size, cq_entries: qp.cq().size() });
        }
        let (sqm, cqm) = (qp.sq().memory(), qp.cq().memory());
        // SAFETY: the SQ/CQ buffers live in `qp`, which this struct owns and
        // drops after the mappings (field order).
        let sq = unsafe { HostMapping::new(&gpu.ctx, sqm.host_ptr(), sqm.len()) }?;
        // SAFETY: as above.
        let cq = unsafe { HostMapping::new(&gpu.ctx, cqm.host_ptr(), cqm.len()) }?;
        // One PRP list page per thread that may run on this queue.
        let list_pages = (size - 1).min(1024);
        let bytes = list_pages as usize * 4096;
        let lists = DmaBuffer::new(drive.device(), bytes).map_err(|source| GpuError::PrpListMemory {
            qid,
            bytes,
            source,
        })?;
        // SAFETY: `lists` lives in this struct and drops after the mapping.
        let lists_map = unsafe { HostMapping::new(&gpu.ctx, lists.host_ptr(), lists.len()) }?;
        let pages = lists.mapping().pages();
        let lists_bus = pages.first().copied().unwrap_or(0);
        let expected = |i: usize| lists_bus + i as u64 * 4096;
        if let Some(page) = (1..pages.len()).find(|&i| pages[i] != expected(i)) {
            return Err(GpuError::PrpListNotContiguous {
                qid,
                page,
                found: pages[page],
                expected: expected(page),
            });
        }
        let state_len = size_of::<TuttiQueueState>() + 4 * (size as usize + DONE_ENTRIES);
        let state = DeviceMem::zeroed(&gpu.ctx, state_len)?;
        write_initial_state(&state, &qp)?;
        let bar = drive.bar.dptr;
        let desc = TuttiQueue {
            sq: sq.dptr,
            cq: cq.dptr,
            sq_doorbell: bar + qp.sq().doorbell_offset() as u64,
            cq_doorbell: bar + qp.cq().doorbell_offset() as u64,
            state: state.ptr,
            pages: 0,
            region_len: 0,
            prp_lists: lists_map.dptr,
            prp_lists_bus: lists_bus,
            size,
            qid: u32::from(qp.qid()),
            list_pages,
            _pad: 0,
        };
        Ok(Self {
            desc,
            state,
            _sq: sq,
            _cq: cq,
            _lists_map: lists_map,
            _lists: lists,
            qid,
            device: drive.device().clone(),
            qp: Mutex::new(qp),
            quiet: gpu.quiet.clone(),
            last: Mutex::new(None),
            null_served: Default::default(),
            device_rings: None,
        })
    }

    /// Whether a GPU null controller serves this queue.
    pub(crate) fn null_served(&self) -> bool {
        self.null_served.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the queue as served by a GPU null controller, or no longer.
    pub(crate) fn set_null_served(&self, on: bool) {
        self.null_served.store(on, std::sync::atomic::Ordering::Release);
    }

    /// The host-side pair's SQ tail, CQ head and CQ phase tag (the GPU's
    /// starting point for a queue no launch has used).
    pub(crate) fn host_indexes(&self) -> (u32, u32, bool) {
        let qp = self.qp.lock().unwrap_or_else(|p| p.into_inner());
        (qp.sq().tail(), qp.cq().head(), qp.cq().phase())
    }

    /// Tells the queue's controller that a kernel is about to ring its
    /// doorbells (an emulated one stops napping).
    pub(crate) fn expect_doorbells(&self) {
        self.device.expect_doorbells();
    }

    /// The end event of the last launch on this queue.
    pub(crate) fn last_launch(&self) -> Option<Arc<KernelEvent>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records `done` as the last launch on this queue.
    pub(crate) fn set_last_launch(&self, done: &Arc<KernelEvent>) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(done.clone());
    }

    /// Queue identifier.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Re-creates this queue pair on `ctrl` after a controller reset (which
    /// deleted every I/O queue): Create I/O CQ and SQ on the same memory,
    /// cleared, and the GPU-side state (tail reservation, published tail,
    /// CQ head, phase, per-slot completion cells) rewritten to match a
    /// fresh queue, so GPU threads start again at slot 0 with phase 1.
    ///
    /// No kernel may be running on this queue while this runs (the caller
    /// waits for every launch that uses it first): the kernel keeps the
    /// same state in device memory and would race the rewrite.
    ///
    /// # Errors
    ///
    /// [`GpuError::DeviceRings`] for a queue with rings in GPU memory;
    /// [`GpuError::Recreate`] when the controller refuses the queue,
    /// [`GpuError::Driver`] when the state cannot be written.
    pub fn recreate(&self, ctrl: &mut Controller) -> Result<(), GpuError> {
        if self.device_rings.is_some() {
            return Err(GpuError::DeviceRings { qid: self.qid });
        }
        let mut qp = self.qp.lock().unwrap_or_else(|p| p.into_inner());
        // The memset and copy below must not overlap another drive's I/O
        // kernel either (`Quiesce`).
        let _quiet = self.quiet.enter()?;
        ctrl.recreate_io_queue_pair(&mut qp)
            .map_err(|source| GpuError::Recreate { qid: self.qid, source })?;
        self.state.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `state.ptr` is a live allocation of `state.len` bytes.
        unsafe { result::memset_d8_sync(self.state.ptr, 0, self.state.len) }.map_err(drv("cuMemsetD8"))?;
        write_initial_state(&self.state, &qp)
    }

    /// CQEs the GPU side dropped because their CID matched no waiting
    /// command (unknown, duplicate or late after a timeout).
    /// Waits for running I/O kernels first (`Quiesce`).
    pub fn stale_completions(&self) -> Result<u32, GpuError> {
        Ok(self.protocol_counters()?.stale)
    }

    /// The kernel's protocol-error counters of this queue pair (totals
    /// since it was created or recreated). Waits for running I/O kernels
    /// first (`Quiesce`).
    pub fn protocol_counters(&self) -> Result<GpuQueueCounters, GpuError> {
        let _quiet = self.quiet.enter()?;
        let st = self.state.read::<TuttiQueueState>(1)?[0];
        Ok(GpuQueueCounters { stale: st.stale, bad_sqid: st.bad_sqid, bad_sqhd: st.bad_sqhd })
    }
}

/// What the I/O kernel dropped or distrusted on one queue pair (counts of
/// CQEs, wrapping at 2^32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuQueueCounters {
    /// CQEs dropped: their CID matched no waiting command (unknown,
    /// duplicate, or late after a timeout), or they named another SQ.
    pub stale: u32,
    /// CQEs whose SQID was not this queue's (also counted in `stale`).
    pub bad_sqid: u32,
    /// CQEs whose SQHD lay outside the entries submitted and not yet known
    /// fetched (NVMe Base 2.0 4.2.1); the SQ head was not moved by them.
    pub bad_sqhd: u32,
}

/// A data region as one drive sees it: the bus address of each 4 KiB page,
/// in device memory for the kernel (PRPs are built from it on the GPU).
#[derive(Debug)]
pub struct GpuRegion {
    /// Always `Some` until dropped (freed inside the gate).
    pages: Option<DeviceMem>,
    pub(crate) len: usize,
    quiet: Arc<Quiesce>,
}

impl GpuRegion {
    /// Uploads `mapping`'s page addresses; `len` bytes of it are usable.
    /// Waits for running I/O kernels first (`Quiesce`).
    pub fn new(gpu: &Gpu, mapping: &DmaMapping, len: usize) -> Result<Self, GpuError> {
        if len > mapping.len() || mapping.pages().is_empty() {
            return Err(GpuError::RegionOutsideMapping { len, mapping_len: mapping.len() });
        }
        let _quiet = gpu.quiet.enter()?;
        let pages = DeviceMem::from_slice(&gpu.ctx, mapping.pages())?;
        Ok(Self { pages: Some(pages), len, quiet: gpu.quiet.clone() })
    }

    /// Device pointer of the page address table.
    pub(crate) fn pages_ptr(&self) -> u64 {
        self.pages.as_ref().map_or(0, |p| p.ptr)
    }
}

impl Drop for GpuRegion {
    /// Frees the page table with no I/O kernel running (`Quiesce`).
    fn drop(&mut self) {
        let Some(pages) = self.pages.take() else { return };
        let _quiet = self.quiet.enter();
        drop(pages);
    }
}

/// GPU memory (`cuMemAlloc`) that a KV block can live in. The emulator
/// reaches it through CUDA copies ([`nvme_emu::ExternalMemory`]); a real
/// drive would reach it by peer DMA (not yet written, see docs/gpu.md).
///
/// Its copies and its drop are not gated by `Quiesce`: the emulator's
/// controller thread makes the copies (a running I/O kernel waits on
/// them) and may drop the last reference.
#[derive(Debug)]
pub struct GpuBuffer {
    /// The synchronous copies to and from this memory (`copy_in`/`copy_out`).
    pub(crate) copies: Stream,
    /// The GPU's copy lanes, for the emulator's asynchronous copies
    /// (`emulated_dma.rs`, `copy_lanes.rs`).
    pub(crate) lanes: Arc<CopyLanes>,
    pub(crate) mem: DeviceMem,
}

impl GpuBuffer {
    /// Allocates `len` zeroed bytes of GPU memory.
    /// Waits for running I/O kernels first (`Quiesce`).
    pub fn zeroed(gpu: &Gpu, len: usize) -> Result<Self, GpuError> {
        let _quiet = gpu.quiet.enter()?;
        Ok(Self {
            copies: Stream::new(&gpu.ctx)?,
            lanes: gpu.copy_lanes.clone(),
            mem: DeviceMem::zeroed(&gpu.ctx, len)?,
        })
    }

    /// Wraps GPU memory the caller owns (`len` bytes at device pointer
    /// `dptr` in this GPU's context); it is never freed here. Waits for
    /// running I/O kernels first (`Quiesce`).
    ///
    /// # Safety
    ///
    /// `dptr..dptr + len` must be a live allocation of this context for as
    /// long as the returned value (and any mapping of it) exists.
    pub unsafe fn from_raw(gpu: &Gpu, dptr: u64, len: usize) -> Result<Self, GpuError> {
        // Creating the copy streams is kept off running I/O kernels too.
        let _quiet = gpu.quiet.enter()?;
        Ok(Self {
            copies: Stream::new(&gpu.ctx)?,
            lanes: gpu.copy_lanes.clone(),
            mem: DeviceMem { ptr: dptr, len, owned: false, ctx: gpu.ctx.clone() },
        })
    }

    /// The context the memory belongs to.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.mem.ctx
    }

    /// Device pointer of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.mem.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// Copies `src` to byte `offset` (host to GPU).
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        self.check(offset, src.len())?;
        self.mem.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: offset + len is inside the allocation (checked); `src`
        // outlives the copy (synchronised before returning).
        unsafe { result::memcpy_htod_async(self.mem.ptr + offset as u64, src, self.copies.raw) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        self.copies.sync()
    }

    /// Copies `dst.len()` bytes from byte `offset` (GPU to host).
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        self.check(offset, dst.len())?;
        self.mem.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: offset + len is inside the allocation (checked); `dst`
        // outlives the copy (synchronised before returning).
        unsafe { result::memcpy_dtoh_async(dst, self.mem.ptr + offset as u64, self.copies.raw) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.copies.sync()
    }

    pub(crate) fn check(&self, offset: usize, len: usize) -> Result<(), GpuError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.mem.len => Ok(()),
            _ => Err(GpuError::BufferOutOfBounds { offset, len, size: self.mem.len }),
        }
    }
}
