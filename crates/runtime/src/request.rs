//! Requests, submissions and their states.

use crate::error::RequestError;
use crate::handle::{MemoryHandle, OpHandle, TargetHandle};

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Drive to memory (load).
    Read,
    /// Memory to drive (save).
    Write,
    /// Flush (NVM 00h; NVMe Base 2.0 §7.1): one Flush to the namespace on
    /// every drive of the target's store. Writes that completed before the
    /// flush was submitted are on non-volatile media when it completes
    /// (with a volatile write cache, VWC = 1; without one it is a no-op
    /// the drive completes at once). `offset`, `len`, `memory` and
    /// `memory_offset` are not used. Commands in flight are not ordered
    /// against it: wait for the writes first (NVMe Base 2.0 §7.1).
    Flush,
}

/// One I/O request: `len` bytes at byte `offset` of a target, to or from
/// byte `memory_offset` of a registered memory region, or a flush of the
/// target's drives ([`Request::flush`]). All units are bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Read or write.
    pub direction: Direction,
    /// Opened target.
    pub target: TargetHandle,
    /// Offset in the target, bytes (a multiple of the logical block size).
    pub offset: u64,
    /// Length, bytes (a non-zero multiple of the logical block size).
    pub len: u64,
    /// Registered memory.
    pub memory: MemoryHandle,
    /// Offset in the memory region, bytes (4-byte aligned).
    pub memory_offset: u64,
}

impl Request {
    /// A read of `len` bytes at `offset` of `target` into `memory` at
    /// `memory_offset`.
    pub fn read(
        target: TargetHandle,
        offset: u64,
        len: u64,
        memory: MemoryHandle,
        memory_offset: u64,
    ) -> Self {
        Self { direction: Direction::Read, target, offset, len, memory, memory_offset }
    }

    /// A write of `len` bytes from `memory` at `memory_offset` to `offset`
    /// of `target`.
    pub fn write(
        target: TargetHandle,
        offset: u64,
        len: u64,
        memory: MemoryHandle,
        memory_offset: u64,
    ) -> Self {
        Self { direction: Direction::Write, target, offset, len, memory, memory_offset }
    }

    /// A durability barrier on every drive of `target`'s store
    /// ([`Direction::Flush`]): it completes when everything written (and
    /// completed) before it was submitted is durable. Counts as one NVMe
    /// command per drive. Its `memory` is a handle that names nothing and
    /// is never looked up.
    pub fn flush(target: TargetHandle) -> Self {
        Self {
            direction: Direction::Flush,
            target,
            offset: 0,
            len: 0,
            memory: MemoryHandle::from_raw_parts(0, 0, 0),
            memory_offset: 0,
        }
    }

    /// `true` for a flush ([`Request::flush`]).
    pub fn is_flush(&self) -> bool {
        self.direction == Direction::Flush
    }
}

/// The result of [`crate::Runtime::submit`]: an operation handle (when at
/// least one request was accepted) and one initial state per request, in
/// input order.
///
/// `#[must_use]`: a request that was not accepted is reported here and
/// nowhere else unless the operation is waited on.
#[must_use = "requests may have been refused; check the states and wait on the operation"]
#[derive(Debug)]
pub struct Submission {
    pub(crate) op: Option<OpHandle>,
    pub(crate) states: Vec<Result<(), RequestError>>,
}

impl Submission {
    /// Handle to wait on; `None` when no request was accepted.
    pub fn op(&self) -> Option<OpHandle> {
        self.op
    }

    /// Per request: `Ok` if accepted, or why not.
    pub fn states(&self) -> &[Result<(), RequestError>] {
        &self.states
    }

    /// Number of accepted requests.
    pub fn accepted(&self) -> usize {
        self.states.iter().filter(|s| s.is_ok()).count()
    }
}
