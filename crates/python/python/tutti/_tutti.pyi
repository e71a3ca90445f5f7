"""Type stubs of the extension module tutti._tutti (re-exported by tutti).

Sizes and offsets are bytes. Handles (targets, memory) are ints minted by
the runtime and checked on every use.
"""

from __future__ import annotations

import builtins
import os
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

class TuttiError(Exception):
    """Base class of every tutti error."""

class ConfigError(TuttiError):
    """The runtime configuration was refused."""

class HandleError(TuttiError):
    """A handle is stale (closed, released), foreign (another runtime's) or forged."""

class UriError(TuttiError):
    """A URI does not parse, names an unknown store, or its key is refused."""

class MemoryRegistrationError(TuttiError):
    """Registering or unregistering memory was refused."""

class DeviceError(TuttiError):
    """A drive failed: controller, PCI device, emulator, drive busy, unknown drive."""

class GpuError(TuttiError):
    """The GPU path failed (no CUDA driver or GPU, or a CUDA call)."""

class RequestError(TuttiError):
    """Requests were not accepted at submit."""

    statuses: List[Optional[Status]]
    """One entry per request: a StatusKind.NOT_ACCEPTED Status, or None if accepted."""
    operation: Optional[Operation]
    """The Operation of the accepted requests, or None."""

class ShutdownError(TuttiError):
    """The runtime is shutting down and accepts no new work."""

class KvError(TuttiError):
    """A tutti-kv store could not be opened or a call could not run."""

class StoreLeasedError(KvError):
    """Another writer holds the store's lease on the media (one writer per
    store, across processes); open it with ``read_only=True`` to read beside
    it."""

class TimeoutError(TuttiError, builtins.TimeoutError):
    """A wait passed its deadline. Also a builtin TimeoutError."""

class StatusKind(str, Enum):
    """What became of one request (``Status.kind``); defined in tutti/_status_kind.py.

    Members are ``str`` whose values are the old string kinds, so
    ``kind == "success"`` holds; ``str()`` and format give the value.
    """

    SUCCESS = "success"
    """Every byte moved and every command completed with NVMe status 0."""
    NOT_ACCEPTED = "not_accepted"
    """Refused at submit; nothing was sent."""
    NVME = "nvme"
    """A drive completed a command with an error status (sct, sc, dnr are set)."""
    TIMEOUT = "timeout"
    """Not final by the wait's deadline."""
    CONTROLLER_FATAL = "controller_fatal"
    """The drive failed (controller fatal status or gone); reset_drive it."""
    SUBMIT_FAILED = "submit_failed"
    """Accepted, but the runtime could not send it."""

class ItemStatusKind(str, Enum):
    """The outcome of one kv item (``ItemStatus.kind``); defined in tutti/_status_kind.py.

    Members are ``str`` whose values are the old string kinds, so
    ``kind == "hit"`` holds; ``str()`` and format give the value.
    """

    OK = "ok"
    """A put is durable; a remove done."""
    HIT = "hit"
    """A get loaded ``length`` bytes whose CRC32C matched."""
    MISS = "miss"
    """No object of this key."""
    CHECKSUM_MISMATCH = "checksum_mismatch"
    """The bytes read do not match the stored CRC32C: do not use them."""
    FULL = "full"
    """No free slot and nothing evictable."""
    TOO_LARGE = "too_large"
    """The value is larger than the store's objects."""
    BAD_VALUE = "bad_value"
    """The item itself is invalid (the message says why)."""
    DEVICE = "device"
    """A drive failed the I/O (sct/sc/dnr when it gave an NVMe status)."""
    TIMEOUT = "timeout"
    """Not complete by the wait's deadline."""

class Status:
    """The final status of one request of a batch."""

    @property
    def kind(self) -> StatusKind:
        """SUCCESS, NOT_ACCEPTED, NVME, TIMEOUT, CONTROLLER_FATAL or SUBMIT_FAILED (a str enum)."""
    @property
    def ok(self) -> bool:
        """True only for StatusKind.SUCCESS."""
    @property
    def sct(self) -> Optional[int]:
        """NVMe Status Code Type, for StatusKind.NVME."""
    @property
    def sc(self) -> Optional[int]:
        """NVMe Status Code, for StatusKind.NVME."""
    @property
    def dnr(self) -> Optional[bool]:
        """NVMe Do Not Retry bit, for StatusKind.NVME."""
    @property
    def drive(self) -> Optional[str]:
        """The drive that failed the request, when one did."""
    @property
    def message(self) -> str:
        """The runtime's description of the status."""
    def __bool__(self) -> bool: ...

class ItemStatus:
    """The outcome of one item of a kv batch."""

    @property
    def kind(self) -> ItemStatusKind:
        """OK, HIT, MISS, CHECKSUM_MISMATCH, FULL, TOO_LARGE, BAD_VALUE, DEVICE or TIMEOUT (a str enum)."""
    @property
    def ok(self) -> bool:
        """True for ItemStatusKind.OK and ItemStatusKind.HIT."""
    @property
    def length(self) -> Optional[int]:
        """Payload length in bytes, for ItemStatusKind.HIT."""
    @property
    def sct(self) -> Optional[int]: ...
    @property
    def sc(self) -> Optional[int]: ...
    @property
    def dnr(self) -> Optional[bool]: ...
    @property
    def message(self) -> str: ...
    def __bool__(self) -> bool: ...

class Request:
    """One I/O request (make it with read, write or flush)."""

    @property
    def kind(self) -> str:
        """"read", "write" or "flush"."""
    @property
    def target(self) -> int: ...
    @property
    def offset(self) -> int:
        """Offset in the target, bytes."""
    @property
    def length(self) -> int:
        """Length, bytes."""
    @property
    def memory(self) -> int:
        """Memory handle (0 for a flush)."""
    @property
    def memory_offset(self) -> int:
        """Offset in the memory region, bytes."""

MemoryArg = Union["Memory", int]

def read(target: int, offset: int, length: int, memory: MemoryArg, memory_offset: int = 0) -> Request:
    """Read `length` bytes at `offset` of `target` into `memory` at `memory_offset`."""

def write(target: int, offset: int, length: int, memory: MemoryArg, memory_offset: int = 0) -> Request:
    """Write `length` bytes from `memory` at `memory_offset` to `offset` of `target`."""

def flush(target: int) -> Request:
    """Flush every drive of `target`'s store (NVMe Flush)."""

class Operation:
    """A submitted batch."""

    def wait(self, timeout: float = 5.0) -> List[Status]:
        """Wait (GIL released) up to `timeout` seconds; one Status per request."""
    def try_wait(self) -> Optional[List[Status]]:
        """Poll once: the statuses when final (kept), else None."""
    def done(self) -> bool:
        """Whether every request is final (polls once)."""
    @property
    def cuda_event(self) -> Optional[int]:
        """The GPU launch's end event (a CUevent handle) while pending, else None.

        With emulated drives, a stream made to wait for a kernel still running
        can stall the emulator's copies it needs: prefer wait() first, or set
        CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts (docs/gpu.md)."""
    @property
    def stream(self) -> Any:
        """The stream object passed to Runtime.submit, or None."""

class SharedBuffer:
    """Shared host memory (a memfd): the host memory a tuttid-owned drive can reach.

    Register the object itself; read and write its bytes through `.buffer`.
    """

    def __init__(self, nbytes: int) -> None: ...
    @property
    def nbytes(self) -> int:
        """Length in bytes (whole 4 KiB pages)."""
    @property
    def buffer(self) -> Any:
        """An mmap.mmap of the same pages."""
    def __len__(self) -> int: ...

class Memory:
    """Memory registered with a runtime."""

    @property
    def handle(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """Length of the region, bytes."""
    @property
    def kind(self) -> str:
        """"host" or "gpu"."""
    @property
    def readonly(self) -> bool: ...
    @property
    def registered(self) -> bool: ...

class ShutdownReport:
    """What Runtime.shutdown found."""

    ops_in_flight: int
    commands_in_flight: int
    commands_reaped_at_deletion: int
    commands_lost: int
    drives: List[Tuple[str, Optional[str]]]
    @property
    def clean(self) -> bool: ...

class Runtime:
    """A tutti runtime (drives, resolvers, datapaths, stores)."""

    @staticmethod
    def from_yaml(text: str) -> Runtime: ...
    @staticmethod
    def from_file(path: Union[str, os.PathLike[str]]) -> Runtime: ...
    @staticmethod
    def emulated(drives: int = 4, drive_bytes: int = 256 << 20, slot_bytes: int = 1 << 20) -> Runtime: ...
    def __enter__(self) -> Runtime: ...
    def __exit__(self, *args: Any) -> bool: ...
    def open(self, uri: str) -> int: ...
    def open_batch(self, uris: Sequence[str]) -> List[int]: ...
    def close(self, target: int) -> None: ...
    def target_len(self, target: int) -> int: ...
    def register(self, obj: Any) -> Memory: ...
    def unregister(self, memory: Memory) -> None: ...
    def submit(self, requests: Sequence[Request], stream: Any = None) -> Operation:
        """Submit a batch; `stream`: a torch/CuPy stream or CUstream int for GPU-executed requests."""
    def reset_drive(self, name: str) -> None: ...
    def shutdown(self, drain: float = 5.0) -> ShutdownReport: ...
    def stats(self) -> Dict[str, int]: ...
    def store_info(self, name: str) -> Optional[Dict[str, Any]]: ...
    def drive_names(self) -> List[str]: ...
    @property
    def has_gpu(self) -> bool: ...

def _rust_roundtrip(runtime: Runtime, requests: Sequence[Request], iterations: int) -> Tuple[float, float]:
    """Benchmark helper: (seconds in all, seconds inside submit) of `iterations` submit+wait rounds done in Rust."""

KvItem = Tuple[bytes, "KvMemory", int, int]

class KvMemory:
    """Memory registered with a KvStore."""

    @property
    def handle(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def readonly(self) -> bool: ...

class KvBatch:
    """A batch of puts or gets in flight."""

    def wait(self, timeout: float = 5.0) -> List[ItemStatus]: ...
    def try_wait(self) -> Optional[List[ItemStatus]]: ...
    def done(self) -> bool: ...

class KvStore:
    """A persistent, crash-consistent KV-cache block store."""

    @staticmethod
    def open(
        runtime: Runtime,
        store: str = "kv",
        key_size: Optional[int] = None,
        create: str = "if_blank",
        read_only: bool = False,
    ) -> KvStore:
        """Open a store; a writer takes its lease (StoreLeasedError when held), a reader (read_only) takes none and writes nothing."""
    def register(self, obj: Any) -> KvMemory: ...
    def unregister(self, memory: KvMemory) -> None: ...
    def put(self, items: Sequence[KvItem]) -> KvBatch: ...
    def get(self, items: Sequence[KvItem]) -> KvBatch: ...
    def put_sync(self, items: Sequence[KvItem], timeout: float = 5.0) -> List[ItemStatus]: ...
    def get_sync(self, items: Sequence[KvItem], timeout: float = 5.0) -> List[ItemStatus]: ...
    def contains(self, keys: Sequence[bytes]) -> List[bool]: ...
    def keys(self) -> List[bytes]: ...
    def lookup_prefix(self, keys: Sequence[bytes]) -> int: ...
    def remove(self, keys: Sequence[bytes]) -> List[ItemStatus]: ...
    def sync(self) -> None: ...
    def stats(self) -> Dict[str, int]: ...
    @property
    def key_size(self) -> int: ...
    @property
    def runtime(self) -> Runtime: ...

class ChunkKeys:
    """Chained keys for token chunks (tutti-kv's ChunkKeys, BLAKE3)."""

    def __init__(self, namespace: bytes, key_size: int = 32) -> None: ...
    def chain(self, tokens: Sequence[int], chunk_tokens: int) -> List[bytes]: ...
    def next(self, prev: Optional[bytes], tokens: Sequence[int]) -> bytes: ...
    @property
    def key_size(self) -> int: ...
