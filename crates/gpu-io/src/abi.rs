//! The kernel ABI: `#[repr(C)]` mirrors of the structs in
//! `kernels/tutti_io.cu` and `kernels/tutti_crc32c.cu`, with their sizes
//! checked at compile time.

/// One queue pair as the kernel sees it (`struct TuttiQueue`, 88 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TuttiQueue {
    /// Device pointer: SQ base, `size` x 64 bytes.
    pub sq: u64,
    /// Device pointer: CQ base, `size` x 16 bytes.
    pub cq: u64,
    /// Device pointer: the 32-bit SQ tail doorbell.
    pub sq_doorbell: u64,
    /// Device pointer: the 32-bit CQ head doorbell.
    pub cq_doorbell: u64,
    /// Device pointer: the queue's [`TuttiQueueState`] and its arrays.
    pub state: u64,
    /// Device pointer: bus address (IOVA) of each 4 KiB page of the data
    /// region, as this queue's drive sees it.
    pub pages: u64,
    /// Bytes in the data region.
    pub region_len: u64,
    /// Device pointer: one 4 KiB PRP list page per thread of the block.
    pub prp_lists: u64,
    /// Bus address (IOVA) of the first PRP list page, as the drive sees it.
    pub prp_lists_bus: u64,
    /// Entries of the SQ and of the CQ (QSIZE + 1).
    pub size: u32,
    /// Queue identifier.
    pub qid: u32,
    /// PRP list pages available.
    pub list_pages: u32,
    /// Padding.
    pub _pad: u32,
}

/// Per-queue state in device memory (`struct TuttiQueueState`, 64 bytes),
/// followed by `slot_cid: [u32; size]` (the CID last written into each SQ
/// slot) and `done: [u32; 65536]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TuttiQueueState {
    /// Unused (zero): one block serves the queue in a launch and owns it.
    pub lock: u32,
    /// Next CID the kernel tries (mod 65536; a CID is taken only from a
    /// free completion cell).
    pub cid_next: u32,
    /// SQ entries known fetched: every entry before a completed command's
    /// (the controller fetches in order). The kernel reuses SQ slots up to
    /// here, never on SQHD values alone.
    pub fetched: u64,
    /// SQ entries published (SQ tail, monotonic).
    pub published: u64,
    /// CQ entries consumed (monotonic).
    pub cq_head: u64,
    /// SQ head from each CQE's SQHD (monotonic; checked against
    /// `[sq_head, published]`, counted in `bad_sqhd` when outside).
    pub sq_head: u64,
    /// Phase tag expected at `cq_head`.
    pub phase: u32,
    /// CQEs whose CID matched no waiting command (unknown, duplicate, late,
    /// or naming another SQ).
    pub stale: u32,
    /// CQEs naming another SQ.
    pub bad_sqid: u32,
    /// CQEs whose SQHD lay outside `[sq_head, tail]`.
    pub bad_sqhd: u32,
    /// Unused (zero).
    pub reap_lock: u32,
    /// Padding.
    pub _pad: u32,
}

/// Entries of the per-CID completion table after the `slot_cid` array.
pub const DONE_ENTRIES: usize = 65536;

/// One request (`struct TuttiRequest`, 32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TuttiRequest {
    /// NVM opcode: 01h Write, 02h Read.
    pub opcode: u8,
    /// Padding.
    pub _pad0: u8,
    /// Index of the queue (in the batch's queue list) that serves it.
    pub queue: u16,
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Number of logical blocks, zero-based.
    pub nlb: u32,
    /// Transfer length in bytes (at most 513 4 KiB memory pages: PRP1 and
    /// one PRP list page).
    pub len: u32,
    /// Byte offset into the data region.
    pub mem_offset: u64,
}

/// One range for the CRC32C kernel (`struct TuttiCrcItem` in
/// `kernels/tutti_crc32c.cu`, 16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TuttiCrcItem {
    /// Device pointer of the first byte (any alignment).
    pub ptr: u64,
    /// Length in bytes (0: the pointer is not read).
    pub len: u64,
}

/// One queue pair served by the GPU null controller (`struct
/// TuttiNullQueue` of `kernels/tutti_null.cu`, 48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TuttiNullQueue {
    /// Device pointer: SQ base, `size` x 64 bytes.
    pub sq: u64,
    /// Device pointer: CQ base, `size` x 16 bytes.
    pub cq: u64,
    /// Device pointer: the 32-bit SQ tail doorbell.
    pub sq_doorbell: u64,
    /// Device pointer: the 32-bit CQ head doorbell.
    pub cq_doorbell: u64,
    /// Entries of the SQ and of the CQ.
    pub size: u32,
    /// SQID written in each CQE.
    pub qid: u32,
    /// SQ head at start (entries before it were fetched).
    pub sq_head: u32,
    /// CQ tail at start, with the phase tag of the next CQE in bit 31.
    pub cq_tail_phase: u32,
}

/// What the GPU null controller did on one queue (`struct TuttiNullReport`,
/// 32 bytes), written when it stops.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TuttiNullReport {
    /// CQEs posted.
    pub served: u64,
    /// Polls that found SQEs waiting and no free CQ slot (the host had not
    /// returned CQ entries with the CQ head doorbell).
    pub cq_full_polls: u64,
    /// Doorbell values read out of range (ignored): one per doorbell per
    /// poll, so a poll that finds both the SQ tail and the CQ head out of
    /// range counts 2.
    pub bad_doorbells: u64,
    /// SQ head at exit.
    pub sq_head: u32,
    /// CQ tail at exit, with the phase tag of the next CQE in bit 31.
    pub cq_tail_phase: u32,
}

const _: () = assert!(size_of::<TuttiNullQueue>() == 48);
const _: () = assert!(core::mem::offset_of!(TuttiNullQueue, size) == 32);
const _: () = assert!(size_of::<TuttiNullReport>() == 32);
const _: () = assert!(core::mem::offset_of!(TuttiNullReport, sq_head) == 24);
const _: () = assert!(size_of::<TuttiCrcItem>() == 16);
const _: () = assert!(core::mem::offset_of!(TuttiCrcItem, len) == 8);
const _: () = assert!(size_of::<TuttiQueue>() == 88);
const _: () = assert!(size_of::<TuttiQueueState>() == 64);
const _: () = assert!(size_of::<TuttiRequest>() == 32);
const _: () = assert!(core::mem::offset_of!(TuttiQueue, size) == 72);
const _: () = assert!(core::mem::offset_of!(TuttiQueueState, fetched) == 8);
const _: () = assert!(core::mem::offset_of!(TuttiRequest, mem_offset) == 24);

/// Kernel result word: no completion within the budget.
pub const STATUS_TIMEOUT: u32 = 0x8000_0001;
/// Kernel result word: the transfer needs more than one PRP list page.
pub const STATUS_UNSUPPORTED: u32 = 0x8000_0002;
/// Kernel result word: memory range or queue invalid.
pub const STATUS_BAD_REQUEST: u32 = 0x8000_0003;
/// Kernel result word: every CID of the queue is held by commands that
/// timed out and never completed; the request was not submitted.
pub const STATUS_NO_CID: u32 = 0x8000_0004;
