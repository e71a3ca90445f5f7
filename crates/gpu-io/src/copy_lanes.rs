//! The emulator's copy lanes of a [`crate::Gpu`]: the CUDA streams its
//! asynchronous copies to and from [`crate::GpuBuffer`]s run on, one per
//! emulated controller thread, and the fences that tell the controller when
//! a burst's copies have ended.
//!
//! - **Lanes.** [`COPY_LANES`] streams per `Gpu`, shared by all its
//!   buffers (few streams: every stream beyond `CUDA_DEVICE_MAX_CONNECTIONS`
//!   shares a hardware queue with another). Controller threads take lanes
//!   in the order of their first copy, so any `COPY_LANES` of them in a row
//!   (the drives of one stripe) copy side by side. A fence on a lane comes
//!   after every copy queued on it before, whichever buffer they touch.
//! - **Notes per thread and memory.** Noted copies are kept apart by the
//!   thread that noted them (two threads may share a lane) and by the
//!   memory they touch: a memory's fence queues only the calling thread's
//!   copies of that memory, so a fence never completes before copies
//!   another thread has yet to queue, and a copy the driver refuses fails
//!   the fence of the memory it touches, never reports another's as done.
//! - **Batched copies.** A burst's copies are only noted when the
//!   controller starts them; its fence queues them in one
//!   `cuMemcpyBatchAsync` per run of one direction (one
//!   `cuMemcpyHtoDAsync`/`cuMemcpyDtoHAsync` for a single copy, or each
//!   alone where the driver has no batched copies). On the H200 machine,
//!   128 KiB copies issued one call each topped out at 24 GB/s from one
//!   thread and fell to 15 GB/s from four (the driver serialises the
//!   calls), while batches of 8, 32 and 128 moved 47, 52 and 54 GB/s
//!   (docs/benchmarks.md, "Emulated DMA: copy calls").
//! - **Fence words.** After a burst's copies the controller thread queues
//!   `cuStreamWriteValue32` on its lane: the GPU writes the burst's
//!   sequence number into a word of pinned host memory once every copy
//!   before it has ended (the default flags order the write after them,
//!   behind a memory barrier). The controller polls that word with a
//!   plain load: no CUDA call per poll, where an event per burst cost a
//!   create, a record, a query per poll and a destroy, all contending for
//!   the driver with every other drive's thread and with the application's
//!   launches. A copy that fails never writes its word: a fence still
//!   pending asks the stream itself every [`STREAM_CHECK_EVERY`] polls,
//!   and an error there fails the fence (the commands end with Data
//!   Transfer Error, as before).
//! - **Events** remain for a device without stream memory operations
//!   (`CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1` = 0).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext};
use nvme_emu::{CopyFence, FenceState};

use crate::cuda::{PinnedBuf, Stream};
use crate::error::GpuError;

/// Copy streams per `Gpu`: as many as a stripe has drives.
pub(crate) const COPY_LANES: usize = 4;

/// Bytes between two lanes' fence words (one cache line each).
const WORD_STRIDE: usize = 64;

/// A pending word fence asks its stream for an error once every this many
/// polls.
const STREAM_CHECK_EVERY: u32 = 1024;

/// Threads that have made an asynchronous copy so far.
static COPY_THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number among copying threads, taken at its first copy
    /// (its lane is the number modulo [`COPY_LANES`]).
    static COPIER: usize = COPY_THREADS.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's number among copying threads.
pub(crate) fn current_copier() -> usize {
    COPIER.with(|c| *c)
}

/// Direction of a copy between the emulator's host media and GPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// `cuMemcpyHtoD`: a Read command's data arriving in GPU memory.
    HostToDevice,
    /// `cuMemcpyDtoH`: a Write command's data leaving GPU memory.
    DeviceToHost,
}

/// A copy noted by the controller, queued at the burst's fence.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deferred {
    pub(crate) dir: Direction,
    /// Destination address (device pointer or host address, by `dir`).
    pub(crate) dst: u64,
    /// Source address (host address or device pointer, by `dir`).
    pub(crate) src: u64,
    /// Bytes.
    pub(crate) len: usize,
}

/// A [`Gpu`](crate::Gpu)'s copy streams, the copies noted for them and
/// their fence words.
#[derive(Debug)]
pub(crate) struct CopyLanes {
    streams: Box<[Stream]>,
    /// Per lane, the copies noted and not yet queued, each with the number
    /// of the thread that noted it ([`current_copier`]) and the memory it
    /// touches (its owner key).
    pending: [Mutex<Vec<(usize, usize, Deferred)>>; COPY_LANES],
    /// Whether `cuMemcpyBatchAsync` may be used (a driver of CUDA 12.8 or
    /// later that has it; cleared when it refuses a batch as unsupported or
    /// invalid).
    batch: AtomicBool,
    /// The device's ordinal, for the batch's location hints.
    ordinal: i32,
    /// `COPY_LANES` words, [`WORD_STRIDE`] bytes apart, in pinned host
    /// memory mapped into the GPU; `None` without stream memory operations.
    words: Option<PinnedBuf>,
    /// Per lane, the last sequence number queued. Held while a fence's
    /// write is queued, so that a lane's words are written in sequence
    /// order even when two threads share the lane.
    issued: [Mutex<u32>; COPY_LANES],
    ctx: Arc<CudaContext>,
}

// SAFETY: the stream handles and the pinned words are used from any thread
// with the context bound (every CUDA call binds it); the words are only
// read by the host with atomic loads.
unsafe impl Send for CopyLanes {}
// SAFETY: as above; `issued` is behind mutexes.
unsafe impl Sync for CopyLanes {}

impl CopyLanes {
    /// [`COPY_LANES`] new streams of `ctx`, with fence words when
    /// `mem_ops` (the device supports stream memory operations), and
    /// batched copies when `batch`. Made when the `Gpu` opens (before any
    /// kernel runs) and freed with its last buffer or fence.
    pub(crate) fn new(ctx: &Arc<CudaContext>, mem_ops: bool, batch: bool) -> Result<Arc<Self>, GpuError> {
        let streams = (0..COPY_LANES).map(|_| Stream::new(ctx)).collect::<Result<Box<[_]>, _>>()?;
        let words = if mem_ops {
            let words = PinnedBuf::new(ctx, COPY_LANES * WORD_STRIDE)?;
            // SAFETY: freshly allocated, `len` bytes, no GPU work uses it yet.
            unsafe { std::ptr::write_bytes(words.ptr, 0, words.len) };
            Some(words)
        } else {
            None
        };
        Ok(Arc::new(Self {
            streams,
            pending: Default::default(),
            batch: AtomicBool::new(batch),
            ordinal: i32::try_from(ctx.ordinal()).unwrap_or(0),
            words,
            issued: Default::default(),
            ctx: ctx.clone(),
        }))
    }

    /// The stream of `lane` (`0..COPY_LANES`).
    fn stream(&self, lane: usize) -> &Stream {
        &self.streams[lane % COPY_LANES]
    }

    /// Notes a copy of the calling thread to or from the memory `owner`
    /// (a key unique among live memories: the `GpuBuffer`'s address),
    /// queued by the next fence of that memory.
    pub(crate) fn defer(&self, owner: usize, copy: Deferred) {
        let me = current_copier();
        self.pending[me % COPY_LANES].lock().unwrap_or_else(|p| p.into_inner()).push((me, owner, copy));
    }

    /// A fence after every copy the calling thread has noted so far for
    /// the memory `owner` (queued now, on its lane; the fence also comes
    /// after whatever else the lane carried before). Only that memory's
    /// copies: a refused copy must fail the fence of the memory it
    /// touches, not another's. Infallible: a copy the driver refused fails
    /// the fence once the lane's other copies have ended; when neither a
    /// word write nor an event can be queued, it waits for the lane's
    /// stream here and returns the outcome.
    pub(crate) fn fence(self: &Arc<Self>, owner: usize) -> Box<dyn CopyFence> {
        let me = current_copier();
        let lane = me % COPY_LANES;
        let copies: Vec<Deferred> = {
            let mut pending = self.pending[lane].lock().unwrap_or_else(|p| p.into_inner());
            let (mine, others): (Vec<_>, Vec<_>) =
                pending.drain(..).partition(|(t, o, _)| *t == me && *o == owner);
            *pending = others;
            mine.into_iter().map(|(_, _, c)| c).collect()
        };
        if !copies.is_empty() && !self.issue(lane, &copies) {
            // Copies before the refused one may run: they end first.
            let _ = self.stream(lane).sync();
            return Box::new(FenceState::Failed);
        }
        if let Some(f) = self.word_fence(lane) {
            return Box::new(f);
        }
        let stream = self.stream(lane);
        match CopyEvent::record(&self.ctx, stream.raw) {
            Some(e) => Box::new(e),
            None => Box::new(if stream.sync().is_ok() { FenceState::Done } else { FenceState::Failed }),
        }
    }

    /// Queues `copies` on `lane`'s stream, each run of one direction as
    /// one batch; `false` when the driver refused one.
    fn issue(&self, lane: usize, copies: &[Deferred]) -> bool {
        if self.ctx.bind_to_thread().is_err() {
            return false;
        }
        let stream = self.stream(lane).raw;
        let mut ok = true;
        for run in copies.chunk_by(|a, b| a.dir == b.dir) {
            ok &= if run.len() > 1 && self.batch.load(Ordering::Relaxed) {
                self.issue_batch(run, stream)
            } else {
                run.iter().all(|c| issue_one(c, stream))
            };
        }
        ok
    }

    /// One `cuMemcpyBatchAsync` for `run` (one direction, stream order for
    /// the sources), or each copy alone if the driver refuses the batch
    /// (and no more batches on this GPU when the refusal is about the API
    /// or the memory kind).
    fn issue_batch(&self, run: &[Deferred], stream: sys::CUstream) -> bool {
        let mut dsts: Vec<sys::CUdeviceptr> = run.iter().map(|c| c.dst).collect();
        let mut srcs: Vec<sys::CUdeviceptr> = run.iter().map(|c| c.src).collect();
        let mut sizes: Vec<usize> = run.iter().map(|c| c.len).collect();
        let host = sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, id: 0 };
        let device = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal,
        };
        let (src_hint, dst_hint) = match run[0].dir {
            Direction::HostToDevice => (host, device),
            Direction::DeviceToHost => (device, host),
        };
        let mut attrs = sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: src_hint,
            dstLocHint: dst_hint,
            flags: 0,
        };
        let mut attr_index = 0usize;
        let mut fail_index = usize::MAX;
        // SAFETY: the three arrays hold `run.len()` entries; one attribute
        // applies from copy 0 on; every address was checked when the copy
        // was noted (device ranges inside the buffer, host ranges the
        // controller's media, kept until the fence completes).
        let r = unsafe {
            sys::cuMemcpyBatchAsync(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                run.len(),
                &mut attrs,
                &mut attr_index,
                1,
                &mut fail_index,
                stream,
            )
        };
        if r == sys::CUresult::CUDA_SUCCESS {
            return true;
        }
        // Refused (unsupported, or memory the batch API does not take with
        // stream-ordered sources, such as pageable media): whatever part of
        // it was queued ends first, then every copy goes alone (copying the
        // same bytes twice is harmless). Batches stop for this GPU when the
        // refusal is about the API or the memory kind, not one copy.
        tracing::warn!(error = ?r, fail_index, "gpu-io: batched copy refused; copying one call each");
        if matches!(r, sys::CUresult::CUDA_ERROR_NOT_SUPPORTED | sys::CUresult::CUDA_ERROR_INVALID_VALUE) {
            self.batch.store(false, Ordering::Relaxed);
        }
        // SAFETY: a live stream of this context (bound by the caller).
        let _ = unsafe { sys::cuStreamSynchronize(stream) };
        run.iter().all(|c| issue_one(c, stream))
    }

    /// Queues the next sequence number's write to `lane`'s word; `None`
    /// without fence words or when the driver refuses the write.
    fn word_fence(self: &Arc<Self>, lane: usize) -> Option<WordFence> {
        let words = self.words.as_ref()?;
        self.ctx.bind_to_thread().ok()?;
        let mut issued = self.issued[lane].lock().unwrap_or_else(|p| p.into_inner());
        let seq = issued.wrapping_add(1);
        let addr = words.dptr + (lane * WORD_STRIDE) as u64;
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: `addr` is a 4-byte aligned word of the mapped pinned
        // allocation, which lives as long as `self` (every fence holds an
        // `Arc` of it); the stream is live.
        unsafe { sys::cuStreamWriteValue32_v2(self.stream(lane).raw, addr, seq, flags) }.result().ok()?;
        *issued = seq;
        Some(WordFence { lanes: self.clone(), lane, seq, polls: AtomicU32::new(0) })
    }

    /// The current value of `lane`'s word.
    fn word(&self, lane: usize) -> u32 {
        let Some(words) = &self.words else { return 0 };
        // SAFETY: the word lies inside the allocation, is 4-byte aligned
        // (64-byte stride from a page-aligned base), and is only ever
        // accessed atomically by the host (the GPU writes it by DMA).
        let word = unsafe { &*words.ptr.add(lane * WORD_STRIDE).cast::<AtomicU32>() };
        word.load(Ordering::Acquire)
    }
}

/// Queues one copy on `stream`; `false` when the driver refuses it.
fn issue_one(c: &Deferred, stream: sys::CUstream) -> bool {
    // SAFETY: as for a batch (`CopyLanes::issue_batch`): the addresses were
    // checked when the copy was noted and stay valid until its fence
    // completes.
    let r = unsafe {
        match c.dir {
            Direction::HostToDevice => {
                sys::cuMemcpyHtoDAsync_v2(c.dst, c.src as *const std::ffi::c_void, c.len, stream)
            }
            Direction::DeviceToHost => {
                sys::cuMemcpyDtoHAsync_v2(c.dst as *mut std::ffi::c_void, c.src, c.len, stream)
            }
        }
    };
    r == sys::CUresult::CUDA_SUCCESS
}

/// Whether the driver's API is at least `version` (e.g. 12080 for 12.8)
/// and has the entry point `symbol` (NUL-terminated): cudarc's loader
/// panics on a missing symbol, so a call is made only after this.
pub(crate) fn driver_has(version: i32, symbol: &[u8]) -> bool {
    let mut v = 0;
    // SAFETY: a valid out-pointer.
    let new_enough =
        unsafe { sys::cuDriverGetVersion(&mut v) } == sys::CUresult::CUDA_SUCCESS && v >= version;
    // SAFETY: only looks the symbol up; nothing is called through it.
    new_enough && unsafe { sys::culib().get::<unsafe extern "C" fn()>(symbol) }.is_ok()
}

/// `cuMemcpyBatchAsync` with the CUDA 12.8 signature this crate calls.
pub(crate) fn driver_has_batched_copies() -> bool {
    driver_has(12080, b"cuMemcpyBatchAsync\0")
}

/// `cuStreamWriteValue32_v2` (CUDA 11.7 and later).
pub(crate) fn driver_has_stream_writes() -> bool {
    driver_has(11070, b"cuStreamWriteValue32_v2\0")
}

impl Drop for CopyLanes {
    /// Every copy and word write queued on the lanes ends before the words
    /// are freed (a fence that failed early may have left one queued).
    fn drop(&mut self) {
        for s in self.streams.iter() {
            let _ = s.sync();
        }
    }
}

/// A fence on a lane's word: done once the word has reached `seq`.
#[derive(Debug)]
struct WordFence {
    lanes: Arc<CopyLanes>,
    lane: usize,
    seq: u32,
    /// Polls so far (every [`STREAM_CHECK_EVERY`]th asks the stream).
    polls: AtomicU32,
}

impl WordFence {
    /// The word has reached `seq` (sequence numbers compared modulo 2^32).
    fn reached(&self) -> bool {
        self.lanes.word(self.lane).wrapping_sub(self.seq) as i32 >= 0
    }

    /// The stream's verdict on a fence whose word has not been seen:
    /// `Pending` while the stream runs, otherwise whether the word is
    /// there now (an idle stream has made every write it was given).
    fn ask_stream(&self) -> FenceState {
        if self.lanes.ctx.bind_to_thread().is_err() {
            return FenceState::Failed;
        }
        // SAFETY: a live stream of this context.
        match unsafe { sys::cuStreamQuery(self.lanes.stream(self.lane).raw) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => FenceState::Pending,
            sys::CUresult::CUDA_SUCCESS if self.reached() => FenceState::Done,
            _ => FenceState::Failed,
        }
    }
}

impl CopyFence for WordFence {
    fn state(&self) -> FenceState {
        if self.reached() {
            return FenceState::Done;
        }
        if self.polls.fetch_add(1, Ordering::Relaxed) % STREAM_CHECK_EVERY == STREAM_CHECK_EVERY - 1 {
            return self.ask_stream();
        }
        FenceState::Pending
    }

    fn wait(&self) -> FenceState {
        if self.reached() {
            return FenceState::Done;
        }
        if self.lanes.stream(self.lane).sync().is_err() {
            return FenceState::Failed;
        }
        if self.reached() {
            FenceState::Done
        } else {
            FenceState::Failed
        }
    }
}

/// A CUDA event recorded after a burst's copies: the fence where the
/// device has no stream memory operations.
#[derive(Debug)]
struct CopyEvent {
    event: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: an event handle may be queried and destroyed from any thread with
// its context bound (each call below binds it).
unsafe impl Send for CopyEvent {}
// SAFETY: as above; the driver API is thread-safe and the handle is never
// changed after `record`.
unsafe impl Sync for CopyEvent {}

impl CopyEvent {
    /// Creates an event (no timing) and records it on `stream`; `None` if
    /// either call fails.
    fn record(ctx: &Arc<CudaContext>, stream: sys::CUstream) -> Option<Self> {
        ctx.bind_to_thread().ok()?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: `event` is a valid out-pointer.
        unsafe { sys::cuEventCreate(&mut event, flags) }.result().ok()?;
        let e = Self { event, ctx: ctx.clone() };
        // SAFETY: both handles are live in this context.
        unsafe { sys::cuEventRecord(e.event, stream) }.result().ok()?;
        Some(e)
    }
}

impl CopyFence for CopyEvent {
    fn state(&self) -> FenceState {
        if self.ctx.bind_to_thread().is_err() {
            return FenceState::Failed;
        }
        // SAFETY: a live event of this context.
        match unsafe { sys::cuEventQuery(self.event) } {
            sys::CUresult::CUDA_SUCCESS => FenceState::Done,
            sys::CUresult::CUDA_ERROR_NOT_READY => FenceState::Pending,
            _ => FenceState::Failed,
        }
    }

    fn wait(&self) -> FenceState {
        if self.ctx.bind_to_thread().is_err() {
            return FenceState::Failed;
        }
        // SAFETY: a live event of this context.
        match unsafe { sys::cuEventSynchronize(self.event) }.result() {
            Ok(()) => FenceState::Done,
            Err(_) => FenceState::Failed,
        }
    }
}

impl Drop for CopyEvent {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in `record`, destroyed once; CUDA releases it once
        // the work before it has ended.
        let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
    }
}
