"""tutti: kernel-bypass NVMe I/O for LLM KV-cache offload, from Python.

The runtime (``tutti.Runtime``) opens targets by URI (``tutti://<store>/<key>``),
registers memory (numpy arrays and other buffers, CUDA arrays, DLPack tensors),
submits batches of requests (``tutti.read``, ``tutti.write``, ``tutti.flush``)
and returns one ``tutti.Status`` per request (its ``kind`` a
``tutti.StatusKind``). ``tutti.KvStore`` keeps KV-cache blocks under chained
keys (``tutti.ChunkKeys``), crash-consistent and checksummed; each item's
``tutti.ItemStatus`` has an ``tutti.ItemStatusKind``. Sizes and offsets are
bytes. docs/python.md is the guide.
"""

from __future__ import annotations

from typing import Sequence, Union

from tutti._tutti import (
    ChunkKeys,
    ConfigError,
    DeviceError,
    GpuError,
    HandleError,
    ItemStatus,
    ItemStatusKind,
    KvBatch,
    KvError,
    KvMemory,
    KvStore,
    Memory,
    MemoryRegistrationError,
    Operation,
    Request,
    RequestError,
    StoreLeasedError,
    Runtime,
    SharedBuffer,
    ShutdownError,
    ShutdownReport,
    Status,
    StatusKind,
    TimeoutError,
    TuttiError,
    UriError,
    flush,
    read,
    write,
)

__all__ = [
    "ChunkKeys",
    "ConfigError",
    "DeviceError",
    "GpuError",
    "HandleError",
    "ItemStatus",
    "ItemStatusKind",
    "KvBatch",
    "KvError",
    "StoreLeasedError",
    "KvMemory",
    "KvStore",
    "Memory",
    "MemoryRegistrationError",
    "Operation",
    "Request",
    "RequestError",
    "Runtime",
    "SharedBuffer",
    "ShutdownError",
    "ShutdownReport",
    "Status",
    "StatusKind",
    "TimeoutError",
    "TuttiError",
    "UriError",
    "check",
    "flush",
    "read",
    "write",
]


def check(statuses: Sequence[Union[Status, ItemStatus]]) -> None:
    """Raise if any status is not ok; return None otherwise.

    Raises ``tutti.TimeoutError`` (also a builtin ``TimeoutError``) when every
    failure is a timeout, else ``tutti.DeviceError``. The exception's
    ``statuses`` attribute holds the statuses given, and its message names
    the first failure by index.
    """
    bad = [(i, s) for i, s in enumerate(statuses) if not s.ok]
    if not bad:
        return
    i, first = bad[0]
    only_timeouts = all(s.kind in (StatusKind.TIMEOUT, ItemStatusKind.TIMEOUT) for _, s in bad)
    cls = TimeoutError if only_timeouts else DeviceError
    err = cls(f"{len(bad)} of {len(statuses)} failed; [{i}] {first.kind}: {first.message}")
    err.statuses = list(statuses)
    raise err
