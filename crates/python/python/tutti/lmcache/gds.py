"""LMCache's ``GDSBackend`` / ``GDSHandle`` contract over a tutti store.

LMCache (``lmcache/v1/gpu_connector/gds_backends/base.py``) asks of a
backend: ``open_slab(location, size, direct_io)`` returns a handle for
``size`` bytes of storage; ``register_buffer(tensor)`` /
``register_stream(raw_stream)`` prepare DMA; a handle's
``read_async`` / ``write_async(buf_base, size, file_offset, buf_offset,
raw_stream)`` enqueue ``size`` bytes between the slab at ``file_offset`` and
the registered buffer starting at ``buf_base`` at ``buf_offset``, ordered on
``raw_stream``, and return a ``Submission`` whose ``bytes_done`` is, once
the stream has passed the I/O, the byte count or a negative error. Errors
found at submit raise at once. Sizes and offsets are bytes.

Here the slab is a tutti store (``location`` ``tutti://<store>``): slab
byte ``o`` is byte ``o % slot_size`` of target ``tutti://<store>/<o //
slot_size>``. Where it runs:

- GPU memory (a runtime whose datapath has ``execution: gpu``): requests are
  submitted on the caller's stream (``Runtime.submit(..., stream=raw)``):
  they run after the work queued on it before and before the work queued
  after, with no host synchronisation; ``bytes_done`` is filled in when
  tutti's operation is final (polled by ``bytes_done``, ``wait`` and every
  later submit). The legacy default stream (``raw_stream`` 0) cannot carry
  tutti's kernels: there the call synchronises that stream, runs the I/O on
  the runtime's own stream and returns when it is done.
- Host memory (``execution: cpu``, CPU tensors): the call returns when the
  I/O is done, ``bytes_done`` final. On CPU LMCache's streams are stubs
  whose ``synchronize()`` and events are no-ops, so completion at return is
  the only ordering that matches what LMCache expects of a stream.

Ranges that are not whole logical blocks (and buffers at addresses that are
not 4-byte aligned) go through a per-stream bounce buffer: a partial block
is read whole, and written by read-modify-write. Two writes sharing a
logical block must not be in flight at once (LMCache's slab allocator
aligns objects to 4 KiB, so its objects never share one).

Failures: a request tutti refuses at submit, a range outside the slab, an
unregistered buffer raise at once (``SlabError``, a ``tutti.RequestError``
and ``ValueError``; ``tutti.MemoryRegistrationError``). A drive's failure
shows in ``bytes_done`` as ``-errno`` (:func:`status_errno`), and in
``TuttiSubmission.statuses``.
"""

from __future__ import annotations

import errno
import math
import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Sequence

import torch
from lmcache.v1.gpu_connector.gds_backends._driver import SharedDriver
from lmcache.v1.gpu_connector.gds_backends.base import GDSBackend, GDSHandle, Submission

import tutti
from tutti.lmcache import BACKEND_NAME, get_runtime

__all__ = ["BOUNCE_BYTES", "SlabError", "TuttiGDSBackend", "TuttiGDSHandle", "TuttiSubmission", "Piece", "plan", "status_errno"]

BOUNCE_BYTES = 1 << 20
"""Size of one bounce buffer, bytes: the most one bounced piece moves."""

PRP_ALIGN = 4
"""Memory addresses of direct requests must be multiples of this (NVMe PRP1: dword aligned), bytes."""


class SlabError(tutti.RequestError, ValueError):
    """A slab or a request on it was refused: bad location, size or range.

    Also a ``ValueError``, which LMCache's GDS context documents for these.
    Nothing was submitted: ``statuses`` is empty and ``operation`` None."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.statuses: List[Optional[tutti.Status]] = []
        self.operation: Optional[tutti.Operation] = None


def status_errno(status: tutti.Status) -> int:
    """The positive errno LMCache's ``bytes_done`` carries (negated) for a
    failed tutti request: ``ETIMEDOUT`` for "timeout", ``ENODEV`` for
    "controller_fatal", ``EINVAL`` for "not_accepted" and "submit_failed"
    (e.g. a GPU request on the legacy default stream), ``EIO`` for an NVMe
    status and anything else; 0 for success."""
    kind = status.kind
    if kind == "success":
        return 0
    if kind == "timeout":
        return errno.ETIMEDOUT
    if kind == "controller_fatal":
        return errno.ENODEV
    if kind in ("not_accepted", "submit_failed"):
        return errno.EINVAL
    return errno.EIO


@dataclass(frozen=True)
class Piece:
    """One step of a transfer, bytes throughout.

    ``direct``: the slab range ``[file_start, file_start + file_len)`` moves
    to or from the caller's buffer at ``buf_offset`` as it is. Otherwise it
    moves through a bounce buffer, of which ``nbytes`` bytes from ``skip``
    are the caller's (the rest are neighbouring bytes of whole blocks).
    """

    direct: bool
    file_start: int
    file_len: int
    skip: int
    nbytes: int
    buf_offset: int


def plan(file_offset: int, size: int, buf_offset: int, buf_addr: int, block: int, bounce: int = BOUNCE_BYTES) -> List[Piece]:
    """Cut a transfer of ``size`` bytes at slab ``file_offset`` (buffer at
    address ``buf_addr`` + ``buf_offset``) into direct whole-block pieces and
    bounced pieces of at most ``bounce`` bytes of whole blocks. ``block``:
    the store's logical block size, bytes (``bounce`` a multiple of it)."""
    end = file_offset + size
    pieces: List[Piece] = []

    def bounced(s: int, e: int) -> None:
        while s < e:
            a = s - s % block
            n = min(e, a + bounce) - s
            covered = -(-(s + n) // block) * block - a
            pieces.append(Piece(False, a, covered, s - a, n, buf_offset + (s - file_offset)))
            s += n

    if (buf_addr + buf_offset - file_offset) % PRP_ALIGN != 0:
        bounced(file_offset, end)  # no block-aligned byte lands on an aligned address
        return pieces
    head_end = min(-(-file_offset // block) * block, end)
    body_end = max(end - end % block, head_end)
    bounced(file_offset, head_end)
    if head_end < body_end:
        n = body_end - head_end
        pieces.append(Piece(True, head_end, n, 0, n, buf_offset + (head_end - file_offset)))
    bounced(body_end, end)
    return pieces


class TuttiSubmission(Submission):
    """LMCache's ``Submission`` for a transfer made of tutti operations.

    ``bytes_done`` is 0 while any operation is pending, then ``size`` when
    every request succeeded, else ``-errno`` of the first failure."""

    __slots__ = ("_ops", "_statuses", "_done_lock")

    def __init__(self, size: int, file_offset: int, buf_offset: int, ops: Sequence[tutti.Operation]) -> None:
        super().__init__(size, file_offset, buf_offset)
        self._ops: List[tutti.Operation] = list(ops)
        self._statuses: Optional[List[tutti.Status]] = None
        self._done_lock = threading.Lock()

    def _finish(self, statuses: List[tutti.Status]) -> None:
        bad = next((s for s in statuses if not s.ok), None)
        self.result.value = self.size.value if bad is None else -status_errno(bad)
        self._statuses = statuses
        self._ops = []

    def poll(self) -> bool:
        """Whether the transfer is final (fills ``bytes_done`` when it is)."""
        with self._done_lock:
            if self._statuses is not None:
                return True
            got = [op.try_wait() for op in self._ops]
            if any(g is None for g in got):
                return False
            self._finish([s for g in got for s in g])  # type: ignore[union-attr]
            return True

    def wait(self, timeout: float = 30.0) -> int:
        """Wait (GIL released) up to ``timeout`` seconds per operation; return ``bytes_done``."""
        with self._done_lock:
            if self._statuses is None:
                self._finish([s for op in self._ops for s in op.wait(timeout=timeout)])
        return self.result.value

    @property
    def bytes_done(self) -> int:
        """Bytes moved once final (``size``), a negative errno on failure, 0 while pending."""
        self.poll()
        return self.result.value

    @property
    def statuses(self) -> Optional[List[tutti.Status]]:
        """tutti's statuses of every request of the transfer, once final."""
        self.poll()
        return self._statuses


class _Registered:
    """A registered tensor: the tensor (kept alive), its bytes and tutti's Memory."""

    __slots__ = ("tensor", "flat", "memory")

    def __init__(self, tensor: torch.Tensor, memory: tutti.Memory) -> None:
        self.tensor = tensor
        self.flat = tensor.view(-1).view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8)
        self.memory = memory


class TuttiGDSBackend(GDSBackend):
    """LMCache GDS backend ``"tutti"``: a slab on a tutti store.

    Never chosen by ``auto``. Constructed without arguments by LMCache; the
    runtime is ``tutti.lmcache.get_runtime()`` unless one is passed."""

    name = BACKEND_NAME
    _driver = SharedDriver()
    timeout_s: float = 30.0
    """Seconds one wait on tutti may take before its requests count as timed out."""

    def __init__(self, runtime: Optional[tutti.Runtime] = None) -> None:
        super().__init__()
        self._explicit = runtime
        self._lock = threading.Lock()
        self._buffers: Dict[int, _Registered] = {}
        self._streams: set = set()
        self._bounce: Dict[int, _Registered] = {}  # raw stream -> GPU bounce buffer
        self._host_bounce: "queue.SimpleQueue[_Registered]" = queue.SimpleQueue()
        self._all_bounce: List[_Registered] = []
        self._handles: List["TuttiGDSHandle"] = []

    @classmethod
    def is_default(cls) -> bool:
        return False

    @property
    def runtime(self) -> tutti.Runtime:
        """The runtime slabs are opened on."""
        return self._explicit if self._explicit is not None else get_runtime()

    def validate_environment(self) -> None:
        """Raise ``ValueError`` (a ``tutti.ConfigError`` too) when no runtime can be had."""
        try:
            self.runtime
        except tutti.ConfigError as e:
            raise _ConfigValueError(str(e)) from e

    def open_slab(self, location: str, size: int, direct_io: bool) -> "TuttiGDSHandle":
        """Open ``size`` bytes of store ``location`` (``tutti://<store>``) as
        a slab; ``direct_io`` is ignored (tutti never uses the page cache).
        Raises ``SlabError`` for a bad location or a size above the store's
        capacity, ``tutti.TuttiError`` when targets cannot be opened."""
        prefix = "tutti://"
        if not isinstance(location, str) or not location.startswith(prefix) or not location[len(prefix):].strip("/"):
            raise SlabError(f"tutti slab location must be tutti://<store>, got {location!r}")
        if not isinstance(size, int) or size <= 0:
            raise SlabError(f"slab size must be a positive int of bytes, got {size!r}")
        store = location[len(prefix):].strip("/")
        if "/" in store:
            raise SlabError(f"tutti slab location names a store, not a key: {location!r}")
        rt = self.runtime
        info = rt.store_info(store)
        if info is None:
            raise SlabError(f"{location}: no store {store!r} in the runtime")
        if size > info["capacity"]:
            raise SlabError(f"{location}: slab of {size} bytes exceeds the store's {info['capacity']} bytes")
        slot = int(info["slot_size"])
        targets = rt.open_batch([f"tutti://{store}/{i}" for i in range(math.ceil(size / slot))])
        self._ensure_driver_open()
        handle = TuttiGDSHandle(self, location, targets, slot, int(info["block_size"]), size)
        with self._lock:
            self._handles.append(handle)
        return handle

    def register_buffer(self, buf: torch.Tensor) -> None:
        """Register a contiguous tensor (GPU, or host on ``execution: cpu``)
        for I/O; raises ``tutti.MemoryRegistrationError`` if refused or
        already registered."""
        if not isinstance(buf, torch.Tensor):
            raise tutti.MemoryRegistrationError(f"register_buffer: expected a torch.Tensor, got {type(buf).__name__}")
        base = buf.data_ptr()
        with self._lock:
            if base in self._buffers:
                raise tutti.MemoryRegistrationError(f"register_buffer: a buffer at 0x{base:x} is already registered")
            self._buffers[base] = _Registered(buf, self.runtime.register(buf))

    def deregister_buffer(self, buf: torch.Tensor) -> None:
        """Unregister the buffer at ``buf``'s base address (the tensor is not
        freed), once every transfer still pending on this backend's slabs is
        final (LMCache has synchronised the stream; tutti still has to see
        the operations end before the memory is free)."""
        with self._lock:
            reg = self._buffers.pop(buf.data_ptr(), None)
            handles = list(self._handles)
        if reg is None:
            raise tutti.MemoryRegistrationError(f"deregister_buffer: no buffer at 0x{buf.data_ptr():x} is registered")
        for h in handles:
            h.reap(wait=True)
        self.runtime.unregister(reg.memory)

    def register_stream(self, raw_stream: int) -> None:
        """Note a stream (a ``CUstream`` int) and, on a GPU runtime, make its
        bounce buffer now: registering GPU memory waits for running I/O
        kernels, which LMCache's setup (before any I/O) never meets."""
        raw = int(raw_stream)
        with self._lock:
            self._streams.add(raw)
            have = raw in self._bounce
        if raw and not have and torch.cuda.is_available() and self.runtime.has_gpu:
            try:
                reg = self._new_bounce(torch.device("cuda", torch.cuda.current_device()))
            except tutti.TuttiError:
                return  # made on first use instead
            with self._lock:
                self._bounce.setdefault(raw, reg)

    def deregister_stream(self, raw_stream: int) -> None:
        """Forget a stream and free its bounce buffer (its I/O must be done)."""
        with self._lock:
            self._streams.discard(int(raw_stream))
            reg = self._bounce.pop(int(raw_stream), None)
        if reg is not None:
            self._drop_bounce(reg)

    def close_driver(self) -> None:
        """Free this backend's bounce buffers, then release its driver share
        (LMCache calls it after closing the slab; repeated calls do nothing)."""
        with self._lock:
            regs = list(self._all_bounce)
            self._bounce.clear()
            self._host_bounce = queue.SimpleQueue()
            self._handles = [h for h in self._handles if h.is_open]
        for reg in regs:
            self._drop_bounce(reg)
        super().close_driver()

    def lookup(self, buf_base: int) -> _Registered:
        """The registration whose tensor starts at ``buf_base``."""
        with self._lock:
            reg = self._buffers.get(buf_base)
        if reg is None:
            raise tutti.MemoryRegistrationError(f"no buffer registered at 0x{buf_base:x} (register_buffer first)")
        return reg

    def bounce_for(self, like: _Registered, raw_stream: int) -> _Registered:
        """A bounce buffer of ``BOUNCE_BYTES`` on ``like``'s device: the
        stream's own on a GPU (reused in stream order), else one from a pool
        (give it back with :meth:`give_back`)."""
        dev = like.tensor.device
        if dev.type != "cuda":
            try:
                return self._host_bounce.get_nowait()
            except queue.Empty:
                return self._new_bounce(dev)
        with self._lock:
            reg = self._bounce.get(raw_stream)
        if reg is None:
            reg = self._new_bounce(dev)
            with self._lock:
                self._bounce[raw_stream] = reg
        return reg

    def give_back(self, reg: _Registered) -> None:
        """Return a host bounce buffer to the pool."""
        if reg.tensor.device.type != "cuda":
            self._host_bounce.put(reg)

    def _new_bounce(self, device: torch.device) -> _Registered:
        t = torch.empty(BOUNCE_BYTES, dtype=torch.uint8, device=device)
        reg = _Registered(t, self.runtime.register(t))
        with self._lock:
            self._all_bounce.append(reg)
        return reg

    def _drop_bounce(self, reg: _Registered) -> None:
        with self._lock:
            if reg in self._all_bounce:
                self._all_bounce.remove(reg)
        try:
            self.runtime.unregister(reg.memory)
        except tutti.TuttiError:
            pass  # still in use by a drive: the binding unregisters it once done


class _ConfigValueError(tutti.ConfigError, ValueError):
    """No runtime for the tutti backend (also a ValueError, as LMCache expects)."""


class TuttiGDSHandle(GDSHandle):
    """A slab: ``size`` bytes of a tutti store, as targets of ``slot`` bytes each."""

    def __init__(self, backend: TuttiGDSBackend, path: str, targets: List[int], slot: int, block: int, size: int) -> None:
        super().__init__(path)
        self._backend = backend
        self._targets = targets
        self.slot_size = slot
        self.block_size = block
        self.size = size
        self._inflight: Deque[TuttiSubmission] = deque()
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        """Whether :meth:`close` has not run yet."""
        return bool(self._targets)

    def reap(self, wait: bool = False) -> None:
        """Drop finished transfers from the front of the pending queue (they
        finish in submission order on a stream); with ``wait``, wait for all."""
        with self._lock:
            while self._inflight and (self._inflight[0].poll() or wait):
                sub = self._inflight.popleft()
                if wait:
                    sub.wait(self._backend.timeout_s)

    def read_async(self, buf_base: int, size: int, file_offset: int, buf_offset: int, raw_stream: int) -> Submission:
        """Enqueue a slab-to-buffer read; see the module docstring."""
        return self._transfer(False, buf_base, size, file_offset, buf_offset, raw_stream)

    def write_async(self, buf_base: int, size: int, file_offset: int, buf_offset: int, raw_stream: int) -> Submission:
        """Enqueue a buffer-to-slab write; see the module docstring."""
        return self._transfer(True, buf_base, size, file_offset, buf_offset, raw_stream)

    def close(self) -> None:
        """Wait for pending transfers and close the targets; repeated calls do nothing."""
        with self._lock:
            targets, self._targets = self._targets, []
            pending, self._inflight = list(self._inflight), deque()
        for sub in pending:
            sub.wait(self._backend.timeout_s)
        rt = self._backend.runtime
        for t in targets:
            try:
                rt.close(t)
            except tutti.TuttiError:
                pass

    def _check(self, reg: _Registered, size: int, file_offset: int, buf_offset: int) -> None:
        for name, v in (("size", size), ("file_offset", file_offset), ("buf_offset", buf_offset)):
            if not isinstance(v, int) or v < 0:
                raise SlabError(f"{name} must be a non-negative int of bytes, got {v!r}")
        if size == 0:
            raise SlabError("size must be at least 1 byte")
        if not self._targets:
            raise SlabError(f"{self.path}: the slab is closed")
        if file_offset + size > self.size:
            raise SlabError(f"{self.path}: [{file_offset}, {file_offset + size}) is outside the slab's {self.size} bytes")
        if buf_offset + size > reg.memory.nbytes:
            raise SlabError(f"buffer range [{buf_offset}, {buf_offset + size}) is outside the registered {reg.memory.nbytes} bytes")

    def requests(self, write: bool, start: int, length: int, memory: tutti.Memory, mem_off: int) -> List[tutti.Request]:
        """tutti requests for slab bytes ``[start, start + length)``, cut at
        slot boundaries, from or into ``memory`` at ``mem_off``."""
        make = tutti.write if write else tutti.read
        out = []
        while length > 0:
            t, off = divmod(start, self.slot_size)
            n = min(length, self.slot_size - off)
            out.append(make(self._targets[t], off, n, memory, mem_off))
            start, length, mem_off = start + n, length - n, mem_off + n
        return out

    def _transfer(self, write: bool, buf_base: int, size: int, file_offset: int, buf_offset: int, raw_stream: int) -> Submission:
        reg = self._backend.lookup(buf_base)
        self._check(reg, size, file_offset, buf_offset)
        pieces = plan(file_offset, size, buf_offset, buf_base, self.block_size)
        gpu = reg.memory.kind == "gpu"
        stream: Optional[int] = int(raw_stream) if gpu and raw_stream else None
        if gpu and stream is None:
            torch.cuda.default_stream(reg.tensor.device).synchronize()
        runner = _Runner(self, reg, write, stream)
        try:
            for p in pieces:
                runner.piece(p)
        finally:
            runner.release()
        sub = TuttiSubmission(size, file_offset, buf_offset, runner.ops)
        if stream is None:
            sub.wait(self._backend.timeout_s)
            return sub
        self.reap()
        with self._lock:
            self._inflight.append(sub)
        return sub


class _Runner:
    """Submits the pieces of one transfer. With ``stream`` (GPU) everything
    is queued on it; without, each step is waited for before the next."""

    def __init__(self, handle: TuttiGDSHandle, reg: _Registered, write: bool, stream: Optional[int]) -> None:
        self.h, self.reg, self.write, self.stream = handle, reg, write, stream
        self.ops: List[tutti.Operation] = []
        self.bounce: Optional[_Registered] = None
        self.failed = False

    def release(self) -> None:
        if self.bounce is not None and self.stream is None:
            self.h._backend.give_back(self.bounce)

    def submit(self, reqs: List[tutti.Request]) -> bool:
        """Submit; on the host path wait too. False once a step failed (the
        rest of a host transfer is then skipped: its status says why)."""
        if self.failed:
            return False
        try:
            op = self.h._backend.runtime.submit(reqs, stream=self.stream)
        except tutti.RequestError as e:
            if e.operation is not None:
                e.operation.wait(timeout=self.h._backend.timeout_s)
            for op in self.ops:
                op.wait(timeout=self.h._backend.timeout_s)
            raise
        self.ops.append(op)
        if self.stream is None:
            st = op.wait(timeout=self.h._backend.timeout_s)
            self.failed = not all(s.ok for s in st)
        return not self.failed

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy between the caller's buffer and the bounce buffer: on the
        stream, or done before returning (the next step reuses the bounce
        buffer from the runtime's own stream)."""
        if self.stream is None:
            dst.copy_(src)
            if dst.is_cuda:
                torch.cuda.current_stream(dst.device).synchronize()
            return
        with torch.cuda.stream(torch.cuda.ExternalStream(self.stream, device=dst.device)):
            dst.copy_(src, non_blocking=True)

    def piece(self, p: Piece) -> None:
        h, mem = self.h, self.reg.memory
        if p.direct:
            self.submit(h.requests(self.write, p.file_start, p.file_len, mem, p.buf_offset))
            return
        if self.bounce is None:
            self.bounce = h._backend.bounce_for(self.reg, self.stream or 0)
        b = self.bounce
        user = self.reg.flat[p.buf_offset : p.buf_offset + p.nbytes]
        window = b.flat[p.skip : p.skip + p.nbytes]
        if not self.write:
            if self.submit(h.requests(False, p.file_start, p.file_len, b.memory, 0)):
                self.copy(user, window)
            return
        if (p.skip or p.nbytes != p.file_len) and not self.submit(h.requests(False, p.file_start, p.file_len, b.memory, 0)):
            return  # the blocks around the bytes could not be read: nothing is written
        self.copy(window, user)
        self.submit(h.requests(True, p.file_start, p.file_len, b.memory, 0))
