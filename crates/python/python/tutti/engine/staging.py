"""Staging through shared memory: a ``tutti.KvStore`` whose drives can only
reach shared memory (``daemon`` drives of a ``tuttid``, docs/tuttid.md) used
with memory an engine allocated itself (vLLM's KV tensors, numpy arrays,
CUDA tensors).

``StagingStore(store, nbytes)`` has the methods of ``tutti.KvStore`` that
the engine core calls (``register``, ``unregister``, ``get``, ``put``,
``get_sync``, ``put_sync``; everything else — ``lookup_prefix``,
``contains``, ``remove``, ``stats``, ``key_size`` — is the store's own).
It registers one ``tutti.SharedBuffer`` of ``nbytes`` with the store, and:

- ``register(obj)`` registers nothing with the store: it keeps a flat byte
  view of ``obj`` (a contiguous numpy array or torch tensor, host or
  CUDA) and returns a handle for items;
- ``put(items)`` copies each item's bytes from its memory into a slot of
  the staging buffer (a D2H copy for a CUDA tensor, a memcpy on the host),
  then puts the slot;
- ``get(items)`` gets each object into a slot and, when its status is
  ``hit``, copies the bytes out into the item's memory (H2D for CUDA).
  Only a hit is copied: a ``checksum_mismatch`` (tutti-kv's CRC32C over
  every object, as without staging), a miss or a device error leaves the
  destination as it was.

Bounded and pipelined: a batch larger than the buffer moves in rounds of at
most half the buffer, so one round's copies run while the next round's I/O
is in flight; a round is issued when its slots are free (a batch issues
what fits when it is made, the rest as its ``wait`` frees slots). Batches
share the buffer: a ``wait`` that finds no free slot finishes the oldest
round in flight of any batch (for a get, that round's hits are copied out
then; for a put, its slots are freed), so batches started out of order
(layer ``l + 1``'s load issued before layer ``l``'s wait) never wait on
each other forever.

A timed-out round's slots are never reused (the drive may still write
them) and never copied out, so a late completion lands in the staging
buffer, not in the engine's memory. When timed-out slots fill the buffer,
items that cannot be issued end as ``timeout``.

Not thread-safe: one thread issues and waits (as the engine core does).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, List, Optional, Sequence, Tuple

DEFAULT_STAGING_BYTES = 64 << 20
"""Default size of a staging buffer: 64 MiB (two 32 MiB rounds in flight;
e.g. one layer of 8,192 tokens of Llama-3-8B's K and V is 32 MiB)."""

PAGE = 4096


def is_shared_memory_refusal(err: BaseException) -> bool:
    """True when ``err`` is a store's refusal to register memory that is not
    shared memory (a ``daemon`` drive: ``DeviceError::NotShareable``, or
    GPU memory on a daemon drive)."""
    import tutti

    if not isinstance(err, tutti.TuttiError):
        return False
    msg = str(err)
    return "shared (memfd) memory" in msg or "is owned by tuttid" in msg


@dataclass
class StagedStatus:
    """The status of an item that never reached the store (``timeout``:
    the batch's wait ran out, or timed-out slots left no room), with the
    attributes of ``tutti.ItemStatus``."""

    kind: str
    message: str
    length: Optional[int] = None
    sct: Optional[int] = None
    sc: Optional[int] = None
    dnr: Optional[bool] = None

    @property
    def ok(self) -> bool:
        return self.kind in ("ok", "hit")

    def __bool__(self) -> bool:
        return self.ok


class StagedMemory:
    """A handle ``StagingStore.register`` returns: a flat byte view of the
    registered object (nothing is registered with the store)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.flat, self.is_torch = _flat_bytes(obj)
        self.nbytes = int(self.flat.shape[0])


def _flat_bytes(obj: Any) -> Tuple[Any, bool]:
    """A flat uint8 view of a contiguous numpy array or torch tensor, or of
    any object with the buffer protocol (a ``tutti.SharedBuffer``'s
    ``.buffer``)."""
    if hasattr(obj, "untyped_storage"):  # torch
        if not obj.is_contiguous():
            raise ValueError("a staged tensor must be contiguous")
        import torch

        return obj.reshape(-1).view(torch.uint8), True
    import numpy as np

    if hasattr(obj, "buffer") and not isinstance(obj, np.ndarray):  # tutti.SharedBuffer
        obj = obj.buffer
    a = np.asarray(obj) if isinstance(obj, np.ndarray) else np.frombuffer(obj, dtype=np.uint8)
    if not a.flags.c_contiguous:
        raise ValueError("a staged array must be C-contiguous")
    return a.reshape(-1).view(np.uint8), False


class _Slots:
    """First-fit allocator of page runs of the staging buffer."""

    def __init__(self, nbytes: int) -> None:
        self.free: List[List[int]] = [[0, nbytes]]  # sorted, disjoint [start, end)
        self.lost = 0

    def alloc(self, n: int) -> Optional[int]:
        n = -(-n // PAGE) * PAGE
        for run in self.free:
            if run[1] - run[0] >= n:
                at = run[0]
                run[0] += n
                if run[0] == run[1]:
                    self.free.remove(run)
                return at
        return None

    def release(self, at: int, n: int) -> None:
        n = -(-n // PAGE) * PAGE
        end = at + n
        i = 0
        while i < len(self.free) and self.free[i][0] < at:
            i += 1
        self.free.insert(i, [at, end])
        # Merge with the neighbours.
        if i + 1 < len(self.free) and self.free[i][1] == self.free[i + 1][0]:
            self.free[i][1] = self.free[i + 1][1]
            del self.free[i + 1]
        if i > 0 and self.free[i - 1][1] == self.free[i][0]:
            self.free[i - 1][1] = self.free[i][1]
            del self.free[i]


# One item of a round: (index in its batch, staging offset, memory, offset, length).
_Slot = Tuple[int, int, StagedMemory, int, int]


class _Round:
    def __init__(self, batch: "StagedBatch", real: Any, slots: List[_Slot]) -> None:
        self.batch = batch
        self.real = real
        self.slots = slots


class StagedBatch:
    """A put or get through the staging buffer (``KvBatch``'s ``wait``)."""

    def __init__(self, stage: "StagingStore", items: Sequence[Any], is_get: bool) -> None:
        self.stage = stage
        self.is_get = is_get
        self.items = [(bytes(k), m, int(off), int(n)) for k, m, off, n in items]
        for _, m, off, n in self.items:
            if not isinstance(m, StagedMemory):
                raise TypeError("items of a StagingStore batch take memory from its register()")
            if off < 0 or n <= 0 or off + n > m.nbytes:
                raise ValueError(f"item range [{off}, {off + n}) outside the registered {m.nbytes} bytes")
            if n > stage.nbytes:
                raise ValueError(f"an item of {n} bytes does not fit the {stage.nbytes}-byte staging buffer")
        self.statuses: List[Any] = [None] * len(self.items)
        self.pending: Deque[int] = deque(range(len(self.items)))
        self.rounds: Deque[_Round] = deque()
        self._issue()

    def _issue(self) -> None:
        """Issue rounds (at most half the buffer each) while slots are free."""
        st = self.stage
        while self.pending:
            slots: List[_Slot] = []
            used = 0
            while self.pending and (not slots or used + self.items[self.pending[0]][3] <= st.round_bytes):
                i = self.pending[0]
                _, m, off, n = self.items[i]
                at = st.slots.alloc(n)
                if at is None:
                    break
                self.pending.popleft()
                slots.append((i, at, m, off, n))
                used += -(-n // PAGE) * PAGE
            if not slots:
                return
            if not self.is_get:
                st._copy(slots, into_stage=True)
            real_items = [(self.items[i][0], st.memory, at, n) for i, at, _, _, n in slots]
            real = st.store.get(real_items) if self.is_get else st.store.put(real_items)
            r = _Round(self, real, slots)
            self.rounds.append(r)
            st.inflight.append(r)

    def wait(self, timeout: float) -> List[Any]:
        """Finish every item (``timeout`` seconds in all) and return their
        statuses, in item order."""
        deadline = time.monotonic() + timeout
        st = self.stage
        while self.rounds or self.pending:
            left = max(0.0, deadline - time.monotonic())
            if not self.rounds and left > 0:
                self._issue()  # slots other batches freed since
            if self.rounds:
                st._finish(self.rounds[0], left)
            elif st.inflight:
                st._finish(st.inflight[0], left)  # another batch holds the slots
            else:
                # Nothing in flight anywhere and still no room: timed-out
                # slots hold the buffer.
                self._fail_pending("timed-out reads hold the staging buffer; nothing could be issued")
                break
            if time.monotonic() >= deadline:
                self._fail_pending("not issued before the wait's deadline")
            else:
                self._issue()
        return list(self.statuses)

    def _fail_pending(self, why: str) -> None:
        while self.pending:
            self.statuses[self.pending.popleft()] = StagedStatus("timeout", why)


class StagingStore:
    """A ``tutti.KvStore`` seen through a shared-memory staging buffer of
    ``nbytes`` (module docstring). ``store``: the open store; ``nbytes``:
    the buffer's size (rounded up to whole pages; every item must fit in
    it)."""

    def __init__(self, store: Any, nbytes: int = DEFAULT_STAGING_BYTES) -> None:
        import tutti

        if nbytes < PAGE:
            raise ValueError(f"a staging buffer of {nbytes} bytes is less than one {PAGE}-byte page")
        self.store = store
        self.buffer = tutti.SharedBuffer(int(nbytes))
        self.nbytes = int(self.buffer.nbytes)
        self.round_bytes = max(PAGE, (self.nbytes // 2) // PAGE * PAGE)
        self.memory = store.register(self.buffer)
        import numpy as np

        self._np = np.frombuffer(self.buffer.buffer, dtype=np.uint8)
        self._torch: Any = None
        self.slots = _Slots(self.nbytes)
        self.inflight: Deque[_Round] = deque()
        self.copied_bytes = 0
        """Bytes copied between the staging buffer and registered memory."""

    # The store's other methods ------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name == "store":  # not set yet (or gone): no recursion
            raise AttributeError(name)
        return getattr(self.store, name)

    # Memory -----------------------------------------------------------------

    def register(self, obj: Any) -> StagedMemory:
        """A handle over ``obj``'s bytes (nothing is registered with the store)."""
        return StagedMemory(obj)

    def unregister(self, memory: StagedMemory) -> None:
        """Forget a handle (its batches must have been waited on)."""
        if any(s[2] is memory for r in self.inflight for s in r.slots):
            raise RuntimeError("memory in use by a batch not yet waited on")

    def close(self) -> None:
        """Unregister the staging buffer (after every batch was waited on;
        kept registered when timed-out reads may still write it)."""
        if self.memory is None:
            return
        if self.inflight or self.slots.lost:
            return
        self.store.unregister(self.memory)
        self.memory = None

    # Batches ----------------------------------------------------------------

    def put(self, items: Sequence[Any]) -> StagedBatch:
        """Copy each ``(key, memory, offset, length)`` item into the buffer
        and put it (in rounds; see the module docstring)."""
        return StagedBatch(self, items, is_get=False)

    def get(self, items: Sequence[Any]) -> StagedBatch:
        """Get each item into the buffer and copy its hits out."""
        return StagedBatch(self, items, is_get=True)

    def put_sync(self, items: Sequence[Any], timeout: float) -> List[Any]:
        """``put(items).wait(timeout)``."""
        return self.put(items).wait(timeout)

    def get_sync(self, items: Sequence[Any], timeout: float) -> List[Any]:
        """``get(items).wait(timeout)``."""
        return self.get(items).wait(timeout)

    # Internals --------------------------------------------------------------

    def _finish(self, r: _Round, timeout: float) -> None:
        statuses = r.real.wait(timeout)
        self.inflight.remove(r)
        r.batch.rounds.remove(r)
        out: List[_Slot] = []
        for st, slot in zip(statuses, r.slots):
            r.batch.statuses[slot[0]] = st
            if st.kind == "timeout":
                self.slots.lost += 1  # the drive may still write it: never reused
                continue
            if r.batch.is_get and st.kind == "hit":
                n = min(slot[4], int(st.length or 0))
                if n > 0:
                    out.append((slot[0], slot[1], slot[2], slot[3], n))
        if out:
            self._copy(out, into_stage=False)
        for st, slot in zip(statuses, r.slots):
            if st.kind != "timeout":
                self.slots.release(slot[1], slot[4])

    def _stage_view(self, torch_side: bool) -> Any:
        if not torch_side:
            return self._np
        if self._torch is None:
            import torch

            self._torch = torch.from_numpy(self._np)
        return self._torch

    def _copy(self, slots: Sequence[_Slot], *, into_stage: bool) -> None:
        """Copy ``slots`` between the staging buffer and their memory,
        merging runs adjacent on both sides into one copy."""
        runs: List[List[Any]] = []  # [stage_at, memory, offset, length]
        for _, at, m, off, n in slots:
            if runs and runs[-1][1] is m and runs[-1][0] + runs[-1][3] == at and runs[-1][2] + runs[-1][3] == off:
                runs[-1][3] += n
            else:
                runs.append([at, m, off, n])
        for at, m, off, n in runs:
            stage = self._stage_view(m.is_torch)[at : at + n]
            mem = m.flat[off : off + n]
            if m.is_torch:
                if into_stage:
                    stage.copy_(mem)
                else:
                    mem.copy_(stage)
            elif into_stage:
                stage[:] = mem
            else:
                mem[:] = stage
            self.copied_bytes += n
