"""Plans: where chunk ``c`` of layer ``l`` lives in an engine's KV tensors.

A layout holds an engine's KV tensors (numpy arrays, CPU or CUDA torch
tensors; C-contiguous) and names, for (layer, chunk, placement), the byte
ranges that hold that chunk's keys and values. Each range is one store
object ("segment"); ``Layout.ranges`` returns them in segment order, which
is the order of ``KeyScheme.layer_keys``. Offsets and lengths are bytes
from the start of a tensor; tokens are counted in tokens.

Layouts:

- ``PagedKV``: separate K and V tensors per layer, each
  ``[num_blocks, block_size, kv_heads, head_dim]``, paged by a block table.
  A chunk spans ``chunk_tokens // block_size`` blocks; segments are the K
  block of each of them, then the V block of each (``2 * blocks_per_chunk``
  segments of ``block_size * kv_heads * head_dim * itemsize`` bytes).
- ``StackedPagedKV``: vLLM's FlashAttention layout, one tensor per layer
  ``[2, num_blocks, block_size, kv_heads, head_dim]`` (K then V; vLLM
  ``FlashAttentionBackend.get_kv_cache_shape``); segments as ``PagedKV``.
- ``BlockMajorPagedKV``: vLLM's FlashInfer layout, one tensor per layer
  ``[num_blocks, 2, block_size, kv_heads, head_dim]``: a block's K and V are
  adjacent, so each block is one segment of ``2 * block bytes``.
- ``ContiguousChunks``: one contiguous buffer per chunk and layer, each
  buffer ``[num_slots, 2, kv_heads, chunk_tokens, head_dim]`` (K then V,
  heads-major as in transformers' ``[batch, kv_heads, seq, head_dim]``); a
  chunk is one segment of ``2 * chunk_tokens * kv_heads * head_dim *
  itemsize`` bytes at slot ``placement[c]``. A token slice of transformers'
  cache tensors is not contiguous across heads, so the transformers
  integration gathers it into such a staging buffer (one device copy per
  layer) rather than saving one object per head. K and V of different
  shapes per token (multi-head latent attention) use the flat form
  ``[num_slots, chunk_tokens * (kv_heads * head_dim + v_heads *
  v_head_dim)]``: K ``[kv_heads, chunk_tokens, head_dim]`` then V
  ``[v_heads, chunk_tokens, v_head_dim]`` in each slot (``key_view``,
  ``value_view``); with equal shapes its bytes are those of the 5-D form.

Placement: for paged layouts, the request's block table (block ids, block
``j`` of the request holding its tokens ``[j * block_size, (j + 1) *
block_size)``); for ``ContiguousChunks``, the buffer slot of each chunk
(``None`` means chunk ``c`` in slot ``c``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Range:
    """``length`` bytes at byte ``offset`` of tensor ``tensor`` (an index
    into ``Layout.tensors``)."""

    tensor: int
    offset: int
    length: int


@dataclass(frozen=True)
class TensorInfo:
    """Shape, element size (bytes), dtype name and contiguity of a tensor."""

    shape: Tuple[int, ...]
    itemsize: int
    dtype: str
    contiguous: bool

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n


def tensor_info(t: Any) -> TensorInfo:
    """Describe a numpy array or a torch tensor (CPU or CUDA)."""
    shape = tuple(int(x) for x in t.shape)
    if hasattr(t, "element_size"):  # torch
        itemsize = int(t.element_size())
        contiguous = bool(t.is_contiguous())
        dtype = str(t.dtype)
        if dtype.startswith("torch."):
            dtype = dtype[len("torch.") :]
    else:  # numpy and other buffers with the numpy attributes
        itemsize = int(t.itemsize)
        contiguous = bool(t.flags.c_contiguous)
        dtype = str(t.dtype)
    return TensorInfo(shape, itemsize, dtype, contiguous)


class Layout(ABC):
    """Where each (layer, chunk) of a request lives in an engine's KV tensors.

    Attributes set by subclasses: ``tensors`` (the tensors to register, in
    ``Range.tensor`` order), ``num_layers``, ``kv_heads``, ``head_dim``,
    ``dtype`` (name), ``itemsize`` (bytes per element), ``chunk_tokens``
    (tokens per chunk), ``segments`` (store objects per chunk and layer);
    ``v_heads``, ``v_head_dim``: V's heads and head size where they differ
    from K's (``kv_heads``, ``head_dim``), None where they do not.
    """

    tensors: List[Any]
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    itemsize: int
    chunk_tokens: int
    segments: int
    v_heads: Optional[int] = None
    v_head_dim: Optional[int] = None

    @property
    def value_shape(self) -> Tuple[int, int]:
        """``(heads, head_dim)`` of V per token (K's unless set apart)."""
        return (self.v_heads or self.kv_heads, self.v_head_dim or self.head_dim)

    @property
    @abstractmethod
    def name(self) -> str:
        """The layout's name, part of the key namespace: chunks saved in one
        layout are never loaded through another."""

    @property
    @abstractmethod
    def segment_bytes(self) -> int:
        """Bytes of each segment (store object)."""

    @abstractmethod
    def ranges(self, layer: int, chunk: int, placement: Optional[Sequence[int]]) -> List[Range]:
        """The ``segments`` byte ranges of chunk ``chunk`` (index within the
        request) of layer ``layer``, in segment order."""

    @abstractmethod
    def check_placement(self, placement: Optional[Sequence[int]], num_chunks: int) -> None:
        """Raise ValueError unless ``placement`` can hold ``num_chunks`` chunks."""

    @property
    def layer_chunk_bytes(self) -> int:
        """Bytes of one chunk of one layer, K and V: ``2 * chunk_tokens *
        kv_heads * head_dim * itemsize`` (``chunk_tokens * (kv_heads *
        head_dim + v_heads * v_head_dim) * itemsize`` where V differs)."""
        vh, vd = self.value_shape
        return self.chunk_tokens * (self.kv_heads * self.head_dim + vh * vd) * self.itemsize

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} out of range [0, {self.num_layers})")


def _same_tensors(tensors: Sequence[Any], what: str, rank: int) -> TensorInfo:
    if len(tensors) == 0:
        raise ValueError(f"{what}: no tensors")
    infos = [tensor_info(t) for t in tensors]
    first = infos[0]
    for i, info in enumerate(infos):
        if len(info.shape) != rank:
            raise ValueError(f"{what}[{i}]: expected {rank} dimensions, got shape {info.shape}")
        if (info.shape, info.itemsize, info.dtype) != (first.shape, first.itemsize, first.dtype):
            raise ValueError(f"{what}[{i}]: shape/dtype {info.shape} {info.dtype} differs from [0]'s {first.shape} {first.dtype}")
        if not info.contiguous:
            raise ValueError(f"{what}[{i}]: not contiguous (register a contiguous tensor)")
    return first


class _Paged(Layout):
    """Common part of the paged layouts."""

    num_blocks: int
    block_size: int

    def _init_paged(self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, chunk_tokens: int) -> None:
        if chunk_tokens < 1 or chunk_tokens % block_size != 0:
            raise ValueError(f"chunk_tokens ({chunk_tokens}) must be a positive multiple of block_size ({block_size})")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv_heads, self.head_dim, self.chunk_tokens = kv_heads, head_dim, chunk_tokens
        self.blocks_per_chunk = chunk_tokens // block_size
        self.block_bytes = block_size * kv_heads * head_dim * self.itemsize

    def check_placement(self, placement: Optional[Sequence[int]], num_chunks: int) -> None:
        """``placement`` is the block table: at least ``num_chunks *
        blocks_per_chunk`` block ids in ``[0, num_blocks)``."""
        if placement is None:
            raise ValueError(f"{self.name}: a block table is required")
        need = num_chunks * self.blocks_per_chunk
        if len(placement) < need:
            raise ValueError(f"{self.name}: block table has {len(placement)} blocks, {num_chunks} chunks need {need}")
        for b in placement[:need]:
            if not 0 <= int(b) < self.num_blocks:
                raise ValueError(f"{self.name}: block id {b} out of range [0, {self.num_blocks})")

    def _blocks(self, chunk: int, placement: Optional[Sequence[int]]) -> List[int]:
        if placement is None:
            raise ValueError(f"{self.name}: a block table is required")
        bpc = self.blocks_per_chunk
        blocks = [int(b) for b in placement[chunk * bpc : (chunk + 1) * bpc]]
        if len(blocks) != bpc:
            raise ValueError(f"{self.name}: block table too short for chunk {chunk}")
        for b in blocks:
            if not 0 <= b < self.num_blocks:
                raise ValueError(f"{self.name}: block id {b} out of range [0, {self.num_blocks})")
        return blocks


class PagedKV(_Paged):
    """Separate K and V tensors per layer, each ``[num_blocks, block_size,
    kv_heads, head_dim]``. ``tensors`` is ``[K_0, V_0, K_1, V_1, ...]``.
    Segments of a chunk: its K blocks, then its V blocks (``2 *
    blocks_per_chunk``, each ``block_bytes``)."""

    def __init__(self, k_caches: Sequence[Any], v_caches: Sequence[Any], chunk_tokens: int) -> None:
        if len(k_caches) != len(v_caches):
            raise ValueError(f"{len(k_caches)} K caches but {len(v_caches)} V caches")
        info = _same_tensors(list(k_caches) + list(v_caches), "k_caches+v_caches", 4)
        nb, bs, h, d = info.shape
        self.itemsize, self.dtype = info.itemsize, info.dtype
        self.num_layers = len(k_caches)
        self.tensors = [t for kv in zip(k_caches, v_caches) for t in kv]
        self._init_paged(nb, bs, h, d, chunk_tokens)
        self.segments = 2 * self.blocks_per_chunk

    @property
    def name(self) -> str:
        return f"paged-kv[nb,{self.block_size},h,d]"

    @property
    def segment_bytes(self) -> int:
        return self.block_bytes

    def ranges(self, layer: int, chunk: int, placement: Optional[Sequence[int]]) -> List[Range]:
        self._check_layer(layer)
        blocks = self._blocks(chunk, placement)
        bb = self.block_bytes
        return [Range(2 * layer, b * bb, bb) for b in blocks] + [Range(2 * layer + 1, b * bb, bb) for b in blocks]


class StackedPagedKV(_Paged):
    """vLLM's FlashAttention layout: one tensor per layer ``[2, num_blocks,
    block_size, kv_heads, head_dim]`` (index 0 K, 1 V). Segments as
    ``PagedKV``: K blocks then V blocks."""

    def __init__(self, kv_caches: Sequence[Any], chunk_tokens: int) -> None:
        info = _same_tensors(kv_caches, "kv_caches", 5)
        two, nb, bs, h, d = info.shape
        if two != 2:
            raise ValueError(f"kv_caches: first dimension must be 2 (K, V), got shape {info.shape}")
        self.itemsize, self.dtype = info.itemsize, info.dtype
        self.num_layers = len(kv_caches)
        self.tensors = list(kv_caches)
        self._init_paged(nb, bs, h, d, chunk_tokens)
        self.segments = 2 * self.blocks_per_chunk

    @property
    def name(self) -> str:
        return f"paged-kv[2,nb,{self.block_size},h,d]"

    @property
    def segment_bytes(self) -> int:
        return self.block_bytes

    def ranges(self, layer: int, chunk: int, placement: Optional[Sequence[int]]) -> List[Range]:
        self._check_layer(layer)
        blocks = self._blocks(chunk, placement)
        bb, v0 = self.block_bytes, self.num_blocks * self.block_bytes
        return [Range(layer, b * bb, bb) for b in blocks] + [Range(layer, v0 + b * bb, bb) for b in blocks]


class BlockMajorPagedKV(_Paged):
    """vLLM's FlashInfer layout: one tensor per layer ``[num_blocks, 2,
    block_size, kv_heads, head_dim]``; block ``b``'s K and V are the
    ``2 * block_bytes`` at ``b * 2 * block_bytes``, one segment per block."""

    def __init__(self, kv_caches: Sequence[Any], chunk_tokens: int) -> None:
        info = _same_tensors(kv_caches, "kv_caches", 5)
        nb, two, bs, h, d = info.shape
        if two != 2:
            raise ValueError(f"kv_caches: second dimension must be 2 (K, V), got shape {info.shape}")
        self.itemsize, self.dtype = info.itemsize, info.dtype
        self.num_layers = len(kv_caches)
        self.tensors = list(kv_caches)
        self._init_paged(nb, bs, h, d, chunk_tokens)
        self.segments = self.blocks_per_chunk

    @property
    def name(self) -> str:
        return f"paged-kv[nb,2,{self.block_size},h,d]"

    @property
    def segment_bytes(self) -> int:
        return 2 * self.block_bytes

    def ranges(self, layer: int, chunk: int, placement: Optional[Sequence[int]]) -> List[Range]:
        self._check_layer(layer)
        blocks = self._blocks(chunk, placement)
        sb = 2 * self.block_bytes
        return [Range(layer, b * sb, sb) for b in blocks]


def _split_last(t: Any, shape: Tuple[int, ...]) -> Any:
    """A view of the 2-D slice ``t`` (rows of one stride, elements packed
    within a row) as ``shape``; never a copy (torch ``view``, numpy
    ``reshape`` checked to share memory)."""
    if hasattr(t, "view") and hasattr(t, "element_size"):  # torch
        return t.view(shape)
    v = t.reshape(shape)
    if v.size and v.__array_interface__["data"][0] != t.__array_interface__["data"][0]:
        raise ValueError("buffers: a slot's K or V is not a view of the buffer")
    return v


class ContiguousChunks(Layout):
    """One contiguous buffer per chunk and layer: per layer a tensor
    ``[num_slots, 2, kv_heads, chunk_tokens, head_dim]`` (K then V, each
    heads-major); chunk ``c`` of a request is slot ``placement[c]`` (slot
    ``c`` when ``placement`` is None), one segment of ``layer_chunk_bytes``.

    Flat form, for K and V of different shapes: per layer a tensor
    ``[num_slots, chunk_tokens * (kv_heads * head_dim + v_heads *
    v_head_dim)]`` with the sizes given as keywords (``v_heads`` and
    ``v_head_dim`` default to K's); each slot holds K ``[kv_heads,
    chunk_tokens, head_dim]`` then V ``[v_heads, chunk_tokens,
    v_head_dim]``. With V shaped as K the bytes, the name and so the keys
    are those of the 5-D form. ``key_view`` / ``value_view`` give a layer's
    K and V as ``[num_slots, heads, chunk_tokens, head_dim]`` views in
    either form.
    """

    def __init__(
        self,
        buffers: Sequence[Any],
        *,
        kv_heads: Optional[int] = None,
        chunk_tokens: Optional[int] = None,
        head_dim: Optional[int] = None,
        v_heads: Optional[int] = None,
        v_head_dim: Optional[int] = None,
    ) -> None:
        sizes = (kv_heads, chunk_tokens, head_dim, v_heads, v_head_dim)
        if buffers and len(tensor_info(buffers[0]).shape) == 2:
            if None in (kv_heads, chunk_tokens, head_dim):
                raise ValueError("buffers: the flat form [num_slots, n] needs kv_heads, chunk_tokens and head_dim")
            info = _same_tensors(buffers, "buffers", 2)
            slots, n = info.shape
            h, t, d = int(kv_heads), int(chunk_tokens), int(head_dim)  # type: ignore[arg-type]
            vh = h if v_heads is None else int(v_heads)
            vd = d if v_head_dim is None else int(v_head_dim)
            if min(h, t, d, vh, vd) < 1:
                raise ValueError(f"buffers: sizes must be positive, got kv_heads {h}, chunk_tokens {t}, head_dim {d}, v_heads {vh}, v_head_dim {vd}")
            if n != t * (h * d + vh * vd):
                raise ValueError(f"buffers: {n} elements per slot, but K [{h}, {t}, {d}] and V [{vh}, {t}, {vd}] need {t * (h * d + vh * vd)}")
            self.flat = True
        else:
            if any(x is not None for x in sizes):
                raise ValueError("buffers: kv_heads, chunk_tokens, head_dim, v_heads, v_head_dim are for the flat form [num_slots, n] only")
            info = _same_tensors(buffers, "buffers", 5)
            slots, two, h, t, d = info.shape
            if two != 2:
                raise ValueError(f"buffers: second dimension must be 2 (K, V), got shape {info.shape}")
            vh, vd = h, d
            self.flat = False
        self.itemsize, self.dtype = info.itemsize, info.dtype
        self.num_layers = len(buffers)
        self.tensors = list(buffers)
        self.num_slots, self.kv_heads, self.chunk_tokens, self.head_dim = slots, h, t, d
        if (vh, vd) != (h, d):
            self.v_heads, self.v_head_dim = vh, vd
        self.segments = 1

    @property
    def name(self) -> str:
        if self.v_heads is None and self.v_head_dim is None:
            return "chunk[2,h,t,d]"
        return "chunk[h,t,d|vh,t,vd]"

    @property
    def segment_bytes(self) -> int:
        return self.layer_chunk_bytes

    def key_view(self, layer: int) -> Any:
        """Layer ``layer``'s K: a ``[num_slots, kv_heads, chunk_tokens,
        head_dim]`` view of its buffer (writes go to the buffer)."""
        self._check_layer(layer)
        buf = self.tensors[layer]
        if not self.flat:
            return buf[:, 0]
        h, t, d = self.kv_heads, self.chunk_tokens, self.head_dim
        return _split_last(buf[:, : h * t * d], (self.num_slots, h, t, d))

    def value_view(self, layer: int) -> Any:
        """Layer ``layer``'s V: a ``[num_slots, v_heads, chunk_tokens,
        v_head_dim]`` view of its buffer (K's heads and head size unless
        set apart)."""
        self._check_layer(layer)
        buf = self.tensors[layer]
        if not self.flat:
            return buf[:, 1]
        vh, vd = self.value_shape
        k = self.kv_heads * self.chunk_tokens * self.head_dim
        return _split_last(buf[:, k:], (self.num_slots, vh, self.chunk_tokens, vd))

    def _slot(self, chunk: int, placement: Optional[Sequence[int]]) -> int:
        slot = chunk if placement is None else int(placement[chunk])
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"{self.name}: slot {slot} of chunk {chunk} out of range [0, {self.num_slots})")
        return slot

    def check_placement(self, placement: Optional[Sequence[int]], num_chunks: int) -> None:
        """Each of the first ``num_chunks`` chunks needs a distinct slot in
        ``[0, num_slots)``."""
        if placement is not None and len(placement) < num_chunks:
            raise ValueError(f"{self.name}: {num_chunks} chunks but {len(placement)} slots given")
        slots = [self._slot(c, placement) for c in range(num_chunks)]
        if len(set(slots)) != len(slots):
            raise ValueError(f"{self.name}: two chunks share a slot: {slots}")

    def ranges(self, layer: int, chunk: int, placement: Optional[Sequence[int]]) -> List[Range]:
        self._check_layer(layer)
        sb = self.segment_bytes
        return [Range(layer, self._slot(chunk, placement) * sb, sb)]
