"""vLLM's paged KV caches as a ``tutti.engine`` layout.

``register_kv_caches`` hands the connector one tensor per attention layer.
Their logical shapes (the forms below) and their memory order (vLLM's
``get_kv_cache_stride_order``: NHD or HND, or the layouts of
``VLLM_KV_CACHE_LAYOUT`` in newer vLLM) vary with the attention backend and
the vLLM version, so this layout works from each tensor's strides rather
than from one fixed order:

- ``"flash_attn"``: ``[2, num_blocks, block_size, kv_heads, head_dim]``
  (FlashAttention and most backends; K at index 0, V at 1).
- ``"flashinfer"``: ``[num_blocks, 2, block_size, kv_heads, head_dim]``.
- ``"blocks_heads"``: ``[num_blocks, kv_heads, block_size, K+V]``, the 4-D
  per-layer view (``[B, H, N, C]``) of newer vLLM, K and V of a token and
  head side by side in the last dimension.

The memory a layer's block ``b`` occupies is found from the strides: the
innermost dimensions of the block that are densely packed form one
contiguous *piece*; the dimensions outside them (for example K/V of the
FlashAttention form, or the heads when heads are outside the blocks) give
``pieces_per_block`` such pieces. Each piece of each block is one store
object (segment), ``piece_bytes`` bytes; segments of a chunk are piece-major
(piece 0 of every block of the chunk, then piece 1, ...), the same order
``tutti.engine.StackedPagedKV`` uses (K blocks, then V blocks).

Registration: the tensors' *storages* are registered, each once (several
layers that share one allocation, as vLLM's layer-interleaved layouts do,
share one registration); ranges are byte offsets within a storage.

Skipped blocks: a placement (block table) entry of ``SCRATCH`` (-1) marks
a block that a load must leave alone: vLLM computed it locally (its own
prefix cache) and the chunk holding it starts before vLLM's hit ends. Its
ranges point into a one-block placeholder buffer (``scratch_index``) so
that plans stay whole; the connector's load drops every item in that buffer,
so nothing is read into it or from it.

The layout's name (part of the key namespace) names the form, the block
size and the memory order, so chunks saved in one order are never loaded
into another.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tutti.engine.attention import UnsupportedModel
from tutti.engine.layouts import Layout, Range, tensor_info

SCRATCH = -1
"""Block id of the scratch buffer in a placement."""

FORMS = {
    "flash_attn": ("kv", "block", "token", "head", "dim"),
    "flashinfer": ("block", "kv", "token", "head", "dim"),
    "blocks_heads": ("block", "head", "token", "kvdim"),
}


def detect_form(shape: Tuple[int, ...], num_blocks: Optional[int] = None) -> str:
    """The form (see the module docstring) of a per-layer KV tensor's shape.

    A 5-D shape with 2 in both of its first two dimensions (a cache of two
    blocks) is ambiguous and refused; a 3-D shape (vLLM's MLA latent cache)
    raises ``tutti.engine.UnsupportedModel``. ``num_blocks`` (vLLM's
    ``kv_cache_config.num_blocks``), when given, must be the shape's block
    count.
    """
    if len(shape) == 3:
        raise UnsupportedModel(
            "mla",
            f"KV cache shape {shape}: one latent tensor per layer ([num_blocks, block_size, kv_lora_rank + "
            "qk_rope_head_dim], vLLM's multi-head latent attention cache)",
            "a layout for the latent cache would be needed; the connector reads separate K and V per head",
        )
    if len(shape) == 4:
        form = "blocks_heads"
    elif len(shape) == 5:
        fa, fi = shape[0] == 2, shape[1] == 2
        if fa == fi:
            raise ValueError(f"KV cache shape {shape}: cannot tell [2, num_blocks, ...] from [num_blocks, 2, ...]")
        form = "flash_attn" if fa else "flashinfer"
    else:
        raise ValueError(f"KV cache shape {shape}: expected 5 dimensions ([2, nb, bs, h, d] or [nb, 2, bs, h, d]) or 4 ([nb, h, bs, 2d])")
    nb = shape[FORMS[form].index("block")]
    if num_blocks is not None and nb != num_blocks:
        raise ValueError(f"KV cache shape {shape} ({form}) has {nb} blocks but vLLM allocated {num_blocks}")
    return form


def _storage(t: Any) -> Tuple[Any, Tuple[Any, ...], int, Tuple[int, ...]]:
    """(flat uint8 tensor over the whole storage of ``t``, a key naming that
    storage, the byte offset of ``t``'s first element in it, ``t``'s strides
    in bytes)."""
    if hasattr(t, "untyped_storage"):  # torch
        import torch

        s = t.untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8, device=t.device)
        flat.set_(s, 0, (s.nbytes(),), (1,))
        isz = t.element_size()
        return flat, ("torch", str(t.device), s.data_ptr(), s.nbytes()), t.storage_offset() * isz, tuple(x * isz for x in t.stride())
    import numpy as np

    root = t
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not root.flags.c_contiguous:
        raise ValueError("the KV cache's underlying numpy buffer is not contiguous")
    flat = root.reshape(-1).view(np.uint8)
    start = root.__array_interface__["data"][0]
    off = t.__array_interface__["data"][0] - start
    return flat, ("numpy", start, flat.nbytes), off, tuple(int(x) for x in t.strides)


def _empty_like_device(t: Any, nbytes: int) -> Any:
    """A zeroed uint8 buffer of ``nbytes`` on ``t``'s device."""
    if hasattr(t, "untyped_storage"):
        import torch

        return torch.zeros(nbytes, dtype=torch.uint8, device=t.device)
    import numpy as np

    return np.zeros(nbytes, dtype=np.uint8)


class VllmPagedKV(Layout):
    """vLLM's per-layer paged KV tensors (see the module docstring).

    ``kv_caches``: one tensor per layer, in layer order, all of one form,
    shape and dtype (numpy arrays or torch tensors, any strides);
    ``block_size``: vLLM's block size in tokens (must equal the tensors'
    tokens per block); ``chunk_tokens``: tokens per chunk, a multiple of
    ``block_size``; ``num_blocks``: vLLM's block count (``kv_cache_config.
    num_blocks``), checked against the shape when given.

    ``tensors`` (what ``KvCacheClient`` registers): the tensors' storages,
    each once, as flat byte tensors, then the placeholder block
    (``scratch_index``).

    Sizes: ``piece_bytes`` (= ``segment_bytes``) bytes per store object;
    ``pieces_per_block`` objects per block and layer; ``segments =
    pieces_per_block * chunk_tokens // block_size`` objects per chunk and
    layer.
    """

    def __init__(self, kv_caches: Sequence[Any], block_size: int, chunk_tokens: int, *, num_blocks: Optional[int] = None) -> None:
        if not kv_caches:
            raise ValueError("no KV caches")
        if chunk_tokens < 1 or chunk_tokens % block_size:
            raise ValueError(f"chunk_tokens ({chunk_tokens}) must be a positive multiple of block_size ({block_size})")
        first = tensor_info(kv_caches[0])
        form = detect_form(first.shape, num_blocks)
        dims = FORMS[form]
        for i, t in enumerate(kv_caches):
            info = tensor_info(t)
            if (info.shape, info.dtype) != (first.shape, first.dtype):
                raise UnsupportedModel(
                    "per_layer_shapes",
                    f"kv_caches[{i}]: shape/dtype {info.shape} {info.dtype} differs from [0]'s {first.shape} {first.dtype}",
                    "every layer's KV cache must have one shape and dtype",
                )
        shape = dict(zip(dims, first.shape))
        if shape["token"] != block_size:
            raise ValueError(
                f"KV cache blocks hold {shape['token']} tokens but vLLM's block_size is {block_size} "
                f"(kernel block splitting is not supported)"
            )
        self.form = form
        self.dtype, self.itemsize = first.dtype, first.itemsize
        self.num_layers = len(kv_caches)
        self.num_blocks = shape["block"]
        self.block_size = block_size
        self.kv_heads = shape["head"]
        self.head_dim = shape["dim"] if "dim" in shape else shape["kvdim"] // 2
        self.chunk_tokens = chunk_tokens
        self.blocks_per_chunk = chunk_tokens // block_size
        bdim = dims.index("block")

        # Per layer: (storage index, byte offset of block 0, block stride);
        # the pieces of a block must be the same in every layer.
        self.tensors: List[Any] = []
        storage_index: Dict[Tuple[Any, ...], int] = {}
        self._layers: List[Tuple[int, int, int]] = []
        pieces: Optional[Tuple[int, Tuple[int, ...], str]] = None
        for i, t in enumerate(kv_caches):
            flat, key, off, strides = _storage(t)
            if key not in storage_index:
                storage_index[key] = len(self.tensors)
                self.tensors.append(flat)
            p = self._pieces(first.shape, strides, bdim, dims)
            if pieces is None:
                pieces = p
            elif p != pieces:
                raise ValueError(f"kv_caches[{i}]: memory order {p[2]} differs from layer 0's {pieces[2]}")
            self._layers.append((storage_index[key], off, strides[bdim]))
        assert pieces is not None
        self.piece_bytes, self._piece_offsets, self._order = pieces
        self.pieces_per_block = len(self._piece_offsets)
        self.segments = self.pieces_per_block * self.blocks_per_chunk
        self._check_disjoint()
        # The placeholder block (for placement entries SCRATCH).
        self.scratch_index = self._scratch = len(self.tensors)
        self.tensors.append(_empty_like_device(kv_caches[0], self.pieces_per_block * self.piece_bytes))

    def _pieces(self, shape: Tuple[int, ...], strides: Tuple[int, ...], bdim: int, dims: Tuple[str, ...]) -> Tuple[int, Tuple[int, ...], str]:
        """(piece bytes, byte offsets of a block's pieces from the block's
        start, a text naming the memory order)."""
        inner = [d for d in range(len(shape)) if d != bdim]
        # Dense suffix: innermost dimensions packed without gaps.
        by_stride = sorted(inner, key=lambda d: (strides[d], -d))
        dense: List[int] = []
        expect = self.itemsize
        for d in by_stride:
            if shape[d] == 1:
                dense.append(d)
                continue
            if strides[d] != expect:
                break
            dense.append(d)
            expect *= shape[d]
        outer = [d for d in inner if d not in dense]  # logical order
        offsets = tuple(
            sum(i * strides[d] for i, d in zip(idx, outer)) for idx in itertools.product(*[range(shape[d]) for d in outer])
        )
        physical = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
        order = ",".join(dims[d] for d in physical)
        return expect, offsets, order

    def _check_disjoint(self) -> None:
        """Pieces of one block, and of neighbouring blocks, must not overlap."""
        for _, off, stride in self._layers:
            if stride <= 0 or off < 0 or min(self._piece_offsets) < 0:
                raise ValueError("KV cache with negative strides is not supported")
            spans = sorted(b * stride + o for b in range(min(self.num_blocks, 4)) for o in self._piece_offsets)
            for a, b in zip(spans, spans[1:]):
                if b - a < self.piece_bytes:
                    raise ValueError("KV cache pieces overlap (unsupported strides)")

    @property
    def name(self) -> str:
        return f"vllm-paged[{self.form}|bs={self.block_size}|order={self._order}|pieces={self.pieces_per_block}]"

    @property
    def segment_bytes(self) -> int:
        return self.piece_bytes

    def block_ranges(self, layer: int, block: int) -> List[Range]:
        """The ``pieces_per_block`` byte ranges of block ``block`` of layer
        ``layer`` (the placeholder buffer for ``SCRATCH``)."""
        self._check_layer(layer)
        if block == SCRATCH:
            return [Range(self._scratch, p * self.piece_bytes, self.piece_bytes) for p in range(self.pieces_per_block)]
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"{self.name}: block id {block} out of range [0, {self.num_blocks})")
        tensor, off, stride = self._layers[layer]
        base = off + block * stride
        return [Range(tensor, base + o, self.piece_bytes) for o in self._piece_offsets]

    def ranges(self, layer: int, chunk: int, placement: Optional[Sequence[int]]) -> List[Range]:
        if placement is None:
            raise ValueError(f"{self.name}: a block table is required")
        bpc = self.blocks_per_chunk
        blocks = [int(b) for b in placement[chunk * bpc : (chunk + 1) * bpc]]
        if len(blocks) != bpc:
            raise ValueError(f"{self.name}: block table too short for chunk {chunk}")
        per_block = [self.block_ranges(layer, b) for b in blocks]
        return [per_block[j][p] for p in range(self.pieces_per_block) for j in range(bpc)]

    def check_placement(self, placement: Optional[Sequence[int]], num_chunks: int) -> None:
        """``placement`` is the block table: at least ``num_chunks *
        blocks_per_chunk`` block ids in ``[0, num_blocks)`` or ``SCRATCH``."""
        if placement is None:
            raise ValueError(f"{self.name}: a block table is required")
        need = num_chunks * self.blocks_per_chunk
        if len(placement) < need:
            raise ValueError(f"{self.name}: block table has {len(placement)} blocks, {num_chunks} chunks need {need}")
        for b in placement[:need]:
            if int(b) != SCRATCH and not 0 <= int(b) < self.num_blocks:
                raise ValueError(f"{self.name}: block id {b} out of range [0, {self.num_blocks})")
