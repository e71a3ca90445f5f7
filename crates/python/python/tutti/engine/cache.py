"""The KV cache client: lookup, save and per-layer load of a request's
longest cached prefix, over a ``tutti.KvStore``.

Loading is per layer so that an engine overlaps loading layer ``l + 1``
with computing layer ``l``::

    load = client.start_load(tokens, block_table)
    load.start_layer(0)
    for l in range(num_layers):
        if l + 1 < num_layers:
            load.start_layer(l + 1)      # in flight while layer l computes
        load.wait_layer(l)
        compute(l)                        # over load.found_tokens cached tokens
    result = load.result()                # the only count to trust

Failure handling: an item of chunk ``c`` that is not a "hit" of the
expected length (miss, checksum_mismatch, device, timeout, ...) in any layer
makes the usable prefix the chunks before ``c``: ``result().cached_tokens``
is ``c * chunk_tokens`` at most, and the caller recomputes every token
from there on (in every layer: the KV a layer did load past ``c`` is
recomputed too). A chunk is reported usable only when every segment of
every layer of it and of every chunk before it was a hit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tutti.engine.chunks import Chunking
from tutti.engine.keys import KeyScheme
from tutti.engine.layouts import Layout, Range
from tutti.engine.staging import DEFAULT_STAGING_BYTES, StagingStore, is_shared_memory_refusal

log = logging.getLogger("tutti.engine")

DEFAULT_TIMEOUT = 5.0
"""Seconds a wait of one layer's batches (or of a save) may take."""


class ObjectTooLargeError(ValueError):
    """A layout's objects do not fit the store's slots (or its block size)."""


@dataclass(frozen=True)
class ItemFailure:
    """One store item that failed: chunk index within the request, layer,
    segment, the item status's kind ("miss", "checksum_mismatch", "device",
    "timeout", "full", ...) and message."""

    chunk: int
    layer: int
    segment: int
    kind: str
    message: str


@dataclass
class LoadResult:
    """What a load made usable.

    ``cached_tokens`` (= ``cached_chunks * chunk_tokens``) is the prefix the
    caller may use; it recomputes tokens ``[cached_tokens, len(tokens))``.
    ``found_chunks``: chunks the lookup found (and the load tried).
    ``failures``: items that were not hits. ``unsafe_ranges``: memory of
    items that timed out: the drive may still write them, so the caller
    must not reuse those ranges until the drive is reset
    (``Runtime.reset_drive``) or must recompute into other memory.
    """

    chunk_tokens: int
    found_chunks: int
    cached_chunks: int
    failures: List[ItemFailure] = field(default_factory=list)
    unsafe_ranges: List[Range] = field(default_factory=list)

    @property
    def cached_tokens(self) -> int:
        """Tokens of the usable prefix."""
        return self.cached_chunks * self.chunk_tokens

    @property
    def found_tokens(self) -> int:
        """Tokens the lookup found before loading."""
        return self.found_chunks * self.chunk_tokens


@dataclass
class SaveResult:
    """What a save stored.

    ``stored_chunks``: leading chunks of the request whose every object is
    now in the store (put now or already there); ``put_objects``: objects
    written by this save; ``skipped_objects``: objects already present;
    ``failures``: puts that failed ("full", "device", "timeout", ...).
    """

    chunk_tokens: int
    stored_chunks: int
    put_objects: int
    skipped_objects: int
    failures: List[ItemFailure] = field(default_factory=list)

    @property
    def stored_tokens(self) -> int:
        """Tokens of ``stored_chunks``."""
        return self.stored_chunks * self.chunk_tokens


# (chunk, segment, Range) of one item of a batch.
_Tag = Tuple[int, int, Range]


class KvCacheClient:
    """A KV cache of one model over a ``tutti.KvStore``.

    ``store``: an open ``tutti.KvStore`` (or an object with its methods);
    ``layout``: where the engine's KV lives (layouts.py); its tensors are
    registered with the store here, once, and unregistered by ``close``.
    ``model``: the model id, part of the key namespace (with the layout's
    dtype, shape, name and chunk size). ``timeout``: default seconds per
    wait.

    Raises ``ObjectTooLargeError`` when one segment (store object) of the
    layout is larger than the store's object size (its slab ``slot_size``)
    or is not a whole number of the store's logical blocks (a get moves
    whole blocks, so a partial one would overwrite the bytes after it).
    For example, Llama-3-8B (8 KV heads, head dim 128, bf16) holds 4 KiB of
    K and V per token and layer, so a 256-token chunk of one layer in
    ``ContiguousChunks`` is 1 MiB: it fits a 1 MiB slot exactly; a 512-token
    chunk needs 2 MiB slots; in vLLM's paged layouts with 16-token blocks a
    segment is one 32 KiB block (K or V) or 64 KiB (K and V, FlashInfer).

    ``staging_bytes``: memory the store cannot reach itself (the engine's
    own tensors on ``daemon`` drives, which reach only shared memory) moves
    through a shared-memory staging buffer of that many bytes
    (``tutti.engine.StagingStore``: a copy per item each way, every object
    still checked by its CRC32C, only hits copied out). None (default):
    the tensors are registered directly, and if the store refuses them as
    not shared memory, staged through ``DEFAULT_STAGING_BYTES`` (64 MiB);
    0: never staged (the refusal is raised); > 0: always staged. ``staging``
    is the ``StagingStore`` in use, or None.
    """

    def __init__(
        self,
        store: Any,
        layout: Layout,
        model: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        block_size: int = 4096,
        staging_bytes: Optional[int] = None,
    ) -> None:
        self.store = store
        self.staging: Optional[StagingStore] = None
        self.layout = layout
        self.timeout = timeout
        self.chunking = Chunking(layout.chunk_tokens)
        self.keys = KeyScheme(
            model=model,
            dtype=layout.dtype,
            num_layers=layout.num_layers,
            kv_heads=layout.kv_heads,
            head_dim=layout.head_dim,
            v_heads=layout.v_heads,
            v_head_dim=layout.v_head_dim,
            layout=layout.name,
            chunk_tokens=layout.chunk_tokens,
            segments=layout.segments,
            key_size=store.key_size,
        )
        seg = layout.segment_bytes
        slot = int(store.stats()["object_size"])
        if seg > slot:
            vh, vd = layout.value_shape
            if (vh, vd) == (layout.kv_heads, layout.head_dim):
                per_token = f"{layout.kv_heads} KV heads x {layout.head_dim} x {layout.itemsize} B{' x 2 (K, V)' if seg == layout.layer_chunk_bytes else ''}"
            else:
                per_token = f"(K {layout.kv_heads} x {layout.head_dim} + V {vh} x {vd}) x {layout.itemsize} B"
            raise ObjectTooLargeError(
                f"{layout.name}: one object is {seg} bytes ({layout.chunk_tokens} tokens x "
                f"{per_token}, per layer"
                f"{'' if layout.segments == 1 else f', split in {layout.segments} segments'}) "
                f"but the store's objects hold at most {slot} bytes: use a smaller chunk_tokens "
                f"or a larger slab slot_size"
            )
        if seg % block_size != 0:
            raise ObjectTooLargeError(
                f"{layout.name}: one object is {seg} bytes, not a multiple of the store's "
                f"{block_size}-byte logical block (gets move whole blocks)"
            )
        if seg * 2 <= slot:
            log.warning(
                "%s: one object is %d bytes but takes a whole %d-byte slot of the store: %.0f%% of the "
                "store's capacity stays unused (a slab slot_size of %d bytes fits it exactly)",
                layout.name, seg, slot, 100.0 * (slot - seg) / slot, seg,
            )
        self._memories = self._register(layout, staging_bytes, seg)
        self._object_keys: Dict[bytes, List[bytes]] = {}

    def _register(self, layout: Layout, staging_bytes: Optional[int], seg: int) -> List[Any]:
        """Register the layout's tensors with the store, or with a staging
        buffer (staging.py): always when ``staging_bytes`` > 0, never when
        0, and when None only if the store refuses them as not shared
        memory (``daemon`` drives)."""
        if staging_bytes is None or staging_bytes == 0:
            mems: List[Any] = []
            try:
                for t in layout.tensors:
                    mems.append(self.store.register(t))
                return mems
            except Exception as e:
                for m in mems:
                    self.store.unregister(m)
                if staging_bytes == 0 or not is_shared_memory_refusal(e):
                    raise
                log.info("tutti: the store refused the KV memory (%s); staging through %d B of shared memory", e, DEFAULT_STAGING_BYTES)
                staging_bytes = DEFAULT_STAGING_BYTES
        if staging_bytes < -(-seg // 4096) * 4096:
            raise ValueError(f"staging_bytes ({staging_bytes}) is less than one object ({seg} bytes)")
        self.staging = StagingStore(self.store, staging_bytes)
        self.store = self.staging
        return [self.store.register(t) for t in layout.tensors]

    # Keys -----------------------------------------------------------------

    def chunk_keys(self, tokens: Sequence[int]) -> List[bytes]:
        """Chunk keys of the whole chunks of ``tokens``."""
        return self.keys.chunk_keys(tokens)

    def _objects(self, chunk_key: bytes) -> List[bytes]:
        """Object keys of one chunk, layer-major (memoised)."""
        ks = self._object_keys.get(chunk_key)
        if ks is None:
            if len(self._object_keys) >= 65536:
                self._object_keys.clear()
            ks = self._object_keys[chunk_key] = self.keys.chunk_object_keys(chunk_key)
        return ks

    def _layer_keys(self, chunk_key: bytes, layer: int) -> List[bytes]:
        s = self.keys.segments
        return self._objects(chunk_key)[layer * s : (layer + 1) * s]

    # Lookup ---------------------------------------------------------------

    def lookup_chunks(self, tokens: Sequence[int]) -> int:
        """Leading whole chunks of ``tokens`` whose every object (every
        layer, every segment) is in the store."""
        cks = self.chunk_keys(tokens)
        if not cks:
            return 0
        objs = [k for ck in cks for k in self._objects(ck)]
        return int(self.store.lookup_prefix(objs)) // self.keys.objects_per_chunk

    def lookup(self, tokens: Sequence[int]) -> int:
        """Tokens of the longest cached prefix of ``tokens`` (a multiple of
        ``chunk_tokens``); a load may still find fewer usable."""
        return self.chunking.tokens_of(self.lookup_chunks(tokens))

    # Save -----------------------------------------------------------------

    def start_save(
        self, tokens: Sequence[int], placement: Optional[Sequence[int]] = None, *, max_chunks: Optional[int] = None, skip_chunks: int = 0
    ) -> "LayerSave":
        """Begin saving the whole chunks of ``tokens`` (at most ``max_chunks``)
        whose KV is at ``placement``; objects already in the store are
        skipped, and so are the first ``skip_chunks`` chunks (another save
        of the same prefix covers them). Call ``save_layer(l)`` once the
        engine has written layer ``l``'s KV, then ``wait()``."""
        return LayerSave(self, tokens, placement, max_chunks, skip_chunks=skip_chunks)

    def save(
        self,
        tokens: Sequence[int],
        placement: Optional[Sequence[int]] = None,
        *,
        max_chunks: Optional[int] = None,
        timeout: Optional[float] = None,
        layers_in_flight: Optional[int] = None,
    ) -> SaveResult:
        """Save every layer of the whole chunks of ``tokens`` and wait: one
        put batch per layer and tensor. ``layers_in_flight``: at most that
        many layers' puts outstanding at once (after each group of that
        many layers the save waits for their puts, ``timeout`` seconds per
        group); None puts every layer before waiting on any."""
        s = self.start_save(tokens, placement, max_chunks=max_chunks)
        n = self.layout.num_layers
        for layer in range(n):
            s.save_layer(layer)
            if layers_in_flight is not None and (layer + 1) % max(1, layers_in_flight) == 0 and layer + 1 < n:
                s.wait_puts(timeout)
        return s.wait(timeout)

    # Load -----------------------------------------------------------------

    def start_load(self, tokens: Sequence[int], placement: Optional[Sequence[int]] = None, *, max_chunks: Optional[int] = None) -> "LayerLoad":
        """Look up the cached prefix of ``tokens`` (at most ``max_chunks``
        chunks) and prepare its per-layer load into ``placement``; nothing
        is read until ``start_layer``."""
        return LayerLoad(self, tokens, placement, max_chunks)

    def load(
        self,
        tokens: Sequence[int],
        placement: Optional[Sequence[int]] = None,
        *,
        max_chunks: Optional[int] = None,
        on_layer: Optional[Callable[[int], None]] = None,
        timeout: Optional[float] = None,
    ) -> LoadResult:
        """Load the cached prefix of ``tokens`` layer by layer: layer ``l +
        1`` is in flight while ``on_layer(l)`` runs (the engine's compute of
        layer ``l``). Returns the usable prefix; see the module docstring."""
        ld = self.start_load(tokens, placement, max_chunks=max_chunks)
        n = self.layout.num_layers
        ld.start_layer(0)
        for layer in range(n):
            if layer + 1 < n:
                ld.start_layer(layer + 1)
            ld.wait_layer(layer, timeout)
            if on_layer is not None:
                on_layer(layer)
        return ld.result()

    # Helpers --------------------------------------------------------------

    def _items(self, cks: Sequence[bytes], layer: int, chunks: Sequence[int], placement: Optional[Sequence[int]]) -> Dict[int, Tuple[List[Any], List[_Tag]]]:
        """Items of ``layer`` for ``chunks``, grouped by tensor (one batch
        per memory region: a GPU-executed batch takes one region)."""
        groups: Dict[int, Tuple[List[Any], List[_Tag]]] = {}
        for c in chunks:
            ranges = self.layout.ranges(layer, c, placement)
            for s, (key, r) in enumerate(zip(self._layer_keys(cks[c], layer), ranges)):
                items, tags = groups.setdefault(r.tensor, ([], []))
                items.append((key, self._memories[r.tensor], r.offset, r.length))
                tags.append((c, s, r))
        return groups

    def close(self) -> None:
        """Unregister the layout's tensors (after every batch was waited on).

        Every tensor is tried; a refusal (``tutti.MemoryRegistrationError``:
        a request that timed out still pins its memory until its drive is
        reset) keeps that tensor registered and is raised after the rest,
        so ``close`` may be called again later."""
        first: Optional[BaseException] = None
        kept: List[Any] = []
        for m in self._memories:
            try:
                self.store.unregister(m)
            except Exception as e:  # tutti.MemoryRegistrationError; the rest still go
                first = first or e
                kept.append(m)
        self._memories = kept
        if self.staging is not None and not kept:
            self.staging.close()
        if first is not None:
            raise first

    def __enter__(self) -> "KvCacheClient":
        return self

    def __exit__(self, *args: Any) -> None:
        self.close()


def _sync_cuda(layout: Layout) -> None:
    """Before a put: wait for the work queued on the current CUDA stream of
    each device holding the layout's tensors, so that the engine's writes
    are in memory before the drive reads it (the I/O runs on the runtime's
    own stream). Writes on other streams are the caller's to finish.

    Loads need no such step: ``KvBatch.wait`` returns after the bytes are in
    memory, so work the caller launches afterwards sees them."""
    seen = set()
    for t in layout.tensors:
        if getattr(t, "is_cuda", False) and t.device not in seen:
            import torch

            seen.add(t.device)
            torch.cuda.current_stream(t.device).synchronize()


class LayerLoad:
    """A per-layer load of a request's cached prefix (``KvCacheClient.start_load``).

    ``found_chunks``: chunks the lookup found (at most ``max_chunks``); the
    load reads those. ``start_layer(l)`` issues layer ``l``'s gets;
    ``wait_layer(l)`` waits for them; ``result()`` (after every layer was
    waited on) is the usable prefix.
    """

    def __init__(
        self, client: KvCacheClient, tokens: Sequence[int], placement: Optional[Sequence[int]], max_chunks: Optional[int], *, skip_chunks: int = 0
    ) -> None:
        self.client = client
        self.placement = placement
        self._cks = client.chunk_keys(tokens)
        found = client.lookup_chunks(tokens)
        if max_chunks is not None:
            found = max(0, min(found, max_chunks))
        self.found_chunks = found
        if found:
            client.layout.check_placement(placement, found)
        n = client.layout.num_layers
        self._batches: List[Optional[List[Tuple[Any, List[_Tag]]]]] = [None] * n
        self._layer_ok: List[Optional[int]] = [None] * n
        self._failures: List[ItemFailure] = []
        self._unsafe: List[Range] = []

    @property
    def found_tokens(self) -> int:
        """Tokens of ``found_chunks``."""
        return self.client.chunking.tokens_of(self.found_chunks)

    def start_layer(self, layer: int) -> None:
        """Issue the gets of every found chunk of ``layer`` (one batch per
        tensor). A layer is started once."""
        if self._batches[layer] is not None:
            raise RuntimeError(f"layer {layer} already started")
        groups = self.client._items(self._cks, layer, range(self.found_chunks), self.placement)
        self._batches[layer] = [(self.client.store.get(items), tags) for items, tags in groups.values()]

    def wait_layer(self, layer: int, timeout: Optional[float] = None) -> int:
        """Wait (up to ``timeout`` seconds for the layer) for layer
        ``layer``'s gets; return the chunks of this layer that loaded
        (leading chunks, all segments hits). The request's usable prefix
        is only known from ``result()``."""
        batches = self._batches[layer]
        if batches is None:
            self.start_layer(layer)
            batches = self._batches[layer]
            assert batches is not None
        if self._layer_ok[layer] is not None:
            return self._layer_ok[layer]  # type: ignore[return-value]
        deadline = time.monotonic() + (self.client.timeout if timeout is None else timeout)
        ok = self.found_chunks
        corrupt: List[bytes] = []
        for batch, tags in batches:
            statuses = batch.wait(max(0.0, deadline - time.monotonic()))
            for st, (c, s, r) in zip(statuses, tags):
                if st.kind == "hit" and st.length == r.length:
                    continue
                kind = st.kind if st.kind != "hit" else "wrong_length"
                self._failures.append(ItemFailure(c, layer, s, kind, st.message))
                ok = min(ok, c)
                if st.kind == "timeout":
                    self._unsafe.append(r)
                if st.kind in ("checksum_mismatch", "wrong_length"):
                    corrupt.append(self.client._layer_keys(self._cks[c], layer)[s])
        if corrupt:
            # Bytes that failed their checksum are never loaded again: the
            # next save of the chunk writes it anew. ``sync`` makes the
            # removal durable, so that another process opening the store
            # (a reader rebuilding its index from the media) misses too.
            self.client.store.remove(corrupt)
            sync = getattr(self.client.store, "sync", None)
            if sync is not None:
                try:
                    sync()
                except Exception as e:  # the removal stands in this process
                    log.warning("tutti: sync after removing %d corrupt objects failed: %s", len(corrupt), e)
        self._layer_ok[layer] = ok
        return ok

    def result(self) -> LoadResult:
        """The usable prefix: the chunks before the first chunk with a
        failed item in any layer. Waits for layers not yet waited on."""
        for layer in range(self.client.layout.num_layers):
            if self._layer_ok[layer] is None:
                self.wait_layer(layer)
        cached = min([self.found_chunks] + [x for x in self._layer_ok if x is not None])
        return LoadResult(self.client.layout.chunk_tokens, self.found_chunks, cached, list(self._failures), list(self._unsafe))


class LayerSave:
    """A per-layer save (``KvCacheClient.start_save``): ``save_layer(l)``
    puts layer ``l``'s objects of the request's whole chunks (those not in
    the store already); ``wait()`` finishes every put."""

    def __init__(
        self, client: KvCacheClient, tokens: Sequence[int], placement: Optional[Sequence[int]], max_chunks: Optional[int], *, skip_chunks: int = 0
    ) -> None:
        self.client = client
        self.placement = placement
        self._cks = client.chunk_keys(tokens)
        if max_chunks is not None:
            self._cks = self._cks[: max(0, max_chunks)]
        n = len(self._cks)
        if n:
            client.layout.check_placement(placement, n)
        skip = max(0, min(skip_chunks, n))
        objs = [k for ck in self._cks[skip:] for k in client._objects(ck)]
        present = client.store.contains(objs) if objs else []
        self._present = set(k for k, p in zip(objs, present) if p)
        self._present.update(k for ck in self._cks[:skip] for k in client._objects(ck))
        self._batches: List[Tuple[Any, List[_Tag], int]] = []
        self._started: set = set()
        self._put = 0
        self._failures: List[ItemFailure] = []
        self._stored = n

    def save_layer(self, layer: int) -> None:
        """Put layer ``layer``'s missing objects (one batch per tensor)."""
        if layer in self._started:
            raise RuntimeError(f"layer {layer} already saved")
        self._started.add(layer)
        if not self._cks:
            return
        _sync_cuda(self.client.layout)
        groups = self.client._items(self._cks, layer, range(len(self._cks)), self.placement)
        for items, tags in groups.values():
            keep = [(it, tag) for it, tag in zip(items, tags) if it[0] not in self._present]
            if keep:
                self._batches.append((self.client.store.put([it for it, _ in keep]), [t for _, t in keep], layer))
                self._put += len(keep)

    def wait_puts(self, timeout: Optional[float] = None) -> int:
        """Wait for the puts issued so far (``timeout`` seconds in all) and
        record their failures; the save goes on (more ``save_layer`` calls,
        then ``wait``). Returns the count of failed items so far. Lets a
        caller bound the puts in flight (``KvCacheClient.save``'s
        ``layers_in_flight``)."""
        deadline = time.monotonic() + (self.client.timeout if timeout is None else timeout)
        for batch, tags, layer in self._batches:
            statuses = batch.wait(max(0.0, deadline - time.monotonic()))
            for st, (c, s, _r) in zip(statuses, tags):
                if st.kind != "ok":
                    self._failures.append(ItemFailure(c, layer, s, st.kind, st.message))
                    self._stored = min(self._stored, c)
        self._batches = []
        return len(self._failures)

    def wait(self, timeout: Optional[float] = None) -> SaveResult:
        """Wait for every put not yet waited on (``timeout`` seconds in
        all) and report the whole save."""
        self.wait_puts(timeout)
        failures = list(self._failures)
        stored = self._stored
        missing = [layer for layer in range(self.client.layout.num_layers) if layer not in self._started]
        if missing and self._cks:
            # Layers never saved: the chunks are complete only if they were present already.
            for c, ck in enumerate(self._cks):
                if any(k not in self._present for layer in missing for k in self.client._layer_keys(ck, layer)):
                    stored = min(stored, c)
                    break
        return SaveResult(self.client.layout.chunk_tokens, stored, self._put, len(self._present), failures)
