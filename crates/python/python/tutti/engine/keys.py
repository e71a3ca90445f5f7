"""Store keys of chunks and of their per-layer objects.

Derivation (all BLAKE3, through ``tutti.ChunkKeys``; docs/kv-store.md
"Keys" gives ChunkKeys' own definition):

1. The *namespace* names everything that changes the KV bytes of a token
   sequence: model id, dtype, number of layers, KV heads, head dimension
   (and V's, where they differ from K's),
   the layout's name (how a chunk's bytes are cut into objects) and the chunk
   size in tokens. It is a UTF-8 text, ``KeyScheme.namespace``; two models,
   dtypes, layouts or chunk sizes never share keys.
2. The *chunk key* of chunk ``c`` is ``ChunkKeys(namespace).chain(tokens,
   chunk_tokens)[c]``: it names the whole prefix ``tokens[: (c + 1) *
   chunk_tokens]``, so a prefix's keys are a prefix of the keys.
3. The *object key* of segment ``s`` of layer ``l`` of chunk ``c`` is
   ``ChunkKeys(namespace).next(chunk_key_c, [LAYER_TAG, l, s] + [0] *
   max(0, chunk_tokens - 2))``: BLAKE3 of the chunk key followed by
   ``max(3, chunk_tokens + 1)`` u32 words. A chunk key hashes its predecessor and
   exactly ``chunk_tokens`` words, so an object key never equals a chunk
   key of the same namespace (the inputs differ in length). Chunk keys are
   never stored themselves; only object keys are.

Each (chunk, layer, segment) is its own store object (one store slot). A
layout cuts a chunk's layer into ``segments`` objects (one for a contiguous
buffer, one or two per paged block, layouts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from tutti._tutti import ChunkKeys

LAYER_TAG = 0x4C415952
"""First u32 word of an object key's input ("LAYR")."""


@dataclass(frozen=True)
class KeyScheme:
    """Keys of one model's KV cache in one layout.

    ``model``: the model's id (e.g. "meta-llama/Meta-Llama-3-8B"); ``dtype``:
    the KV dtype's name; ``num_layers``, ``kv_heads``, ``head_dim``: the
    model's attention shape; ``layout``: the layout's name
    (``Layout.name``); ``chunk_tokens``: chunk size in tokens;
    ``segments``: store objects per (chunk, layer); ``key_size``: 16 or 32
    bytes (the store's key size); ``v_heads``, ``v_head_dim``: V's heads
    and head size where they differ from K's (``kv_heads``, ``head_dim``,
    e.g. multi-head latent attention), None where they do not.
    """

    model: str
    dtype: str
    num_layers: int
    kv_heads: int
    head_dim: int
    layout: str
    chunk_tokens: int
    segments: int = 1
    key_size: int = 32
    v_heads: Optional[int] = None
    v_head_dim: Optional[int] = None
    _keys: ChunkKeys = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("num_layers", "kv_heads", "head_dim", "chunk_tokens", "segments"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("v_heads", "v_head_dim"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int or None, got {v!r}")
        if self.key_size not in (16, 32):
            raise ValueError(f"key_size must be 16 or 32, got {self.key_size}")
        object.__setattr__(self, "_keys", ChunkKeys(self.namespace.encode(), self.key_size))

    @property
    def namespace(self) -> str:
        """The namespace text (step 1 of the derivation). V's shape is
        named only where it differs from K's, so the keys of models whose K
        and V share a shape are those of earlier releases."""
        vh, vd = self.v_heads or self.kv_heads, self.v_head_dim or self.head_dim
        v = "" if (vh, vd) == (self.kv_heads, self.head_dim) else f"|v_heads={vh}|v_head_dim={vd}"
        return (
            f"tutti-engine v1|model={self.model}|dtype={self.dtype}|layers={self.num_layers}"
            f"|kv_heads={self.kv_heads}|head_dim={self.head_dim}{v}|layout={self.layout}"
            f"|chunk_tokens={self.chunk_tokens}|segments={self.segments}"
        )

    def chunk_keys(self, tokens: Sequence[int]) -> List[bytes]:
        """Chunk keys of the whole chunks of ``tokens`` (token ids, u32)."""
        return self._keys.chain(list(tokens), self.chunk_tokens)

    def object_key(self, chunk_key: bytes, layer: int, segment: int = 0) -> bytes:
        """Key of segment ``segment`` of layer ``layer`` of the chunk named
        by ``chunk_key`` (step 3 of the derivation)."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} out of range [0, {self.num_layers})")
        if not 0 <= segment < self.segments:
            raise ValueError(f"segment {segment} out of range [0, {self.segments})")
        words = [LAYER_TAG, layer, segment] + [0] * max(0, self.chunk_tokens - 2)
        return self._keys.next(chunk_key, words)

    def layer_keys(self, chunk_key: bytes, layer: int) -> List[bytes]:
        """Keys of every segment of layer ``layer`` of one chunk, in segment order."""
        return [self.object_key(chunk_key, layer, s) for s in range(self.segments)]

    def chunk_object_keys(self, chunk_key: bytes) -> List[bytes]:
        """Keys of every object of one chunk, layer-major then segment."""
        return [k for layer in range(self.num_layers) for k in self.layer_keys(chunk_key, layer)]

    @property
    def objects_per_chunk(self) -> int:
        """Store objects per chunk: ``num_layers * segments``."""
        return self.num_layers * self.segments
