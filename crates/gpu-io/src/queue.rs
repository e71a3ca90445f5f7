//! [`GpuQueue`]: an I/O queue pair handed to the GPU, and its protocol
//! counters ([`GpuQueueCounters`]).

use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};
use nvm_queue::{Controller, DmaBuffer, NvmeDevice, QueuePair};

use crate::abi::{TuttiQueue, TuttiQueueState, DONE_ENTRIES};
use crate::cuda::{DeviceMem, HostMapping, KernelEvent, Quiesce};
use crate::drive::GpuDrive;
use crate::error::{drv, GpuError};
use crate::gpu::Gpu;

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

    /// The last launch on this queue as (its stream, whether it has
    /// ended), for `order_after` (`launch/order.rs`).
    pub(crate) fn last_on(&self) -> Option<(sys::CUstream, bool)> {
        self.last_launch().map(|p| (p.stream, p.is_done()))
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
