"""The scheduler's view of a store that a worker in another process writes.

The scheduler answers vLLM's "how many tokens of this prompt are cached"
without the KV tensors, which live in the worker. Two things cross the
process boundary, both through the store on the drives:

1. The key scheme. The keys' namespace names the KV layout (dtype, heads,
   head size, vLLM's tensor form and memory order), which only the worker
   sees. At ``register_kv_caches`` the worker puts a *manifest* object: the
   fields of its ``KeyScheme`` as JSON, under a key derived from what both
   sides know (model, rank, chunk and block size; ``manifest_key``).
2. The index. ``StoreReader`` opens the store read-only
   (``KvStore.open(read_only=True)``: no lease, a blank store stays blank, nothing is
   written; it only calls ``lookup_prefix`` and ``get``, and tutti-kv's get
   writes nothing), which rebuilds the index from the records on the media,
   and opens it again once it is older than ``refresh_s`` seconds.

A reader's answer may be stale: a chunk evicted since is a hit here and a
miss in the worker's own lookup at load time, which the worker reports as a
load error and vLLM recomputes (never wrong KV: the worker's gets are
checked against its own index and each object's CRC32C); a chunk saved
since is a miss until the next refresh.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import fields
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from tutti.engine.keys import KeyScheme

log = logging.getLogger("tutti.vllm")

MANIFEST_BYTES = 4096
"""Size of the manifest object (one 4 KiB block; the JSON is zero-padded)."""


def manifest_key(model: str, rank: int, world: int, chunk_tokens: int, block_size: int, key_size: int = 32) -> bytes:
    """The key of the manifest of rank ``rank`` of ``world`` tensor-parallel
    ranks, for the configured ``model`` and chunk and block sizes (tokens)."""
    from tutti._tutti import ChunkKeys

    ns = f"tutti-vllm manifest v1|model={model}|tp={rank}/{world}|chunk_tokens={chunk_tokens}|block_size={block_size}"
    return bytes(ChunkKeys(ns.encode(), key_size).next(None, [0]))


def encode_manifest(scheme: KeyScheme) -> np.ndarray:
    """``scheme``'s fields as zero-padded JSON, ``MANIFEST_BYTES`` long."""
    body = json.dumps({f.name: getattr(scheme, f.name) for f in fields(scheme) if f.init}, sort_keys=True).encode()
    if len(body) >= MANIFEST_BYTES:
        raise ValueError(f"manifest of {len(body)} bytes does not fit {MANIFEST_BYTES}")
    buf = np.zeros(MANIFEST_BYTES, dtype=np.uint8)
    buf[: len(body)] = np.frombuffer(body, dtype=np.uint8)
    return buf


def decode_manifest(buf: np.ndarray) -> KeyScheme:
    """The ``KeyScheme`` of a manifest (raises ``ValueError`` if malformed)."""
    raw = bytes(buf).rstrip(b"\0")
    try:
        return KeyScheme(**json.loads(raw.decode()))
    except (TypeError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"malformed tutti vLLM manifest: {e}") from e


def _shared_page() -> Tuple[Any, np.ndarray]:
    """A ``MANIFEST_BYTES`` ``tutti.SharedBuffer`` and a numpy view of it:
    shared memory, which every drive kind reaches (``daemon`` drives reach
    nothing else)."""
    import tutti

    sb = tutti.SharedBuffer(MANIFEST_BYTES)
    return sb, np.frombuffer(sb.buffer, dtype=np.uint8)


def put_manifest(store: Any, key: bytes, scheme: KeyScheme, timeout: float) -> bool:
    """Put ``scheme``'s manifest under ``key`` unless the store holds it
    already (a restart with the same layout writes nothing); True when it
    is stored."""
    buf = encode_manifest(scheme)
    sb, old = _shared_page()
    mem = store.register(sb)
    try:
        st = store.get_sync([(key, mem, 0, MANIFEST_BYTES)], timeout)
        if st[0].kind == "hit" and np.array_equal(old, buf):
            return True
        old[:] = buf
        st = store.put_sync([(key, mem, 0, MANIFEST_BYTES)], timeout)
    finally:
        store.unregister(mem)
    if not st[0].ok:
        log.warning("tutti: the manifest was not stored (%s); the scheduler in another process will find nothing", st[0].message)
    return bool(st[0].ok)


class StoreReader:
    """A read-only view of store ``name`` on ``shared``'s runtime (a
    ``state.SharedRuntime``), refreshed from the media at most every
    ``refresh_s`` seconds. In the writer's own process it defers to the
    writer (``lookup`` asks the writer's client)."""

    def __init__(self, shared: Any, name: str, refresh_s: float) -> None:
        self.shared = shared
        self.name = name
        self.refresh_s = refresh_s
        self.store: Optional[Any] = None
        self.scheme: Optional[KeyScheme] = None
        self.opened_at = float("-inf")
        self.refreshes = 0

    def lookup(self, tokens: Sequence[int], manifest: Callable[[int], bytes]) -> int:
        """Tokens of the longest prefix of ``tokens`` whose every object is
        in the store (a multiple of the chunk size; 0 while the worker has
        not registered its manifest). ``manifest(key_size)``: the
        manifest's key for the store's key size."""
        w = self.shared.writers.get(self.name)
        if w is not None:
            return int(w.client.lookup(tokens)) if w.client is not None else 0
        if time.monotonic() - self.opened_at >= self.refresh_s:
            self.refresh(manifest)
        s, store = self.scheme, self.store
        if s is None or store is None:
            return 0
        cks = s.chunk_keys(tokens)
        if not cks:
            return 0
        objs = [k for ck in cks for k in s.chunk_object_keys(ck)]
        return (int(store.lookup_prefix(objs)) // s.objects_per_chunk) * s.chunk_tokens

    def refresh(self, manifest: Callable[[int], bytes]) -> None:
        """Reopen the store read-only and read the manifest under ``manifest``."""
        import tutti

        self.close()
        self.opened_at = time.monotonic()
        try:
            store = tutti.KvStore.open(self.shared.runtime, self.name, create="never", read_only=True)
        except tutti.KvError as e:  # blank (no writer formatted it yet), or not a store
            log.debug("tutti: store %s not readable yet: %s", self.name, e)
            return
        self.refreshes += 1
        sb, buf = _shared_page()
        mem = store.register(sb)
        try:
            st = store.get_sync([(manifest(int(store.key_size)), mem, 0, MANIFEST_BYTES)], 5.0)
        finally:
            store.unregister(mem)
        self.store = store
        if st[0].kind != "hit":
            return
        try:
            self.scheme = decode_manifest(buf)
        except ValueError as e:
            log.warning("tutti: %s; lookups find nothing", e)

    def close(self) -> None:
        """Drop the open store (before this process opens it as writer)."""
        self.store = None
        self.scheme = None
        self.opened_at = float("-inf")
