"""tutti.engine: the serving-engine-independent core of KV-cache offload.

- ``Chunking`` (chunks.py): token sequences cut into whole chunks of
  ``chunk_tokens`` tokens; a trailing partial chunk is never saved.
- ``KeyScheme`` (keys.py): chained chunk keys in a namespace naming the
  model, dtype, shape, layout and chunk size, and one key per (chunk, layer,
  segment) object derived from the chunk key.
- Layouts (layouts.py): ``PagedKV``, ``StackedPagedKV``,
  ``BlockMajorPagedKV``, ``ContiguousChunks``: the byte ranges of chunk
  ``c`` of layer ``l`` in an engine's KV tensors.
- ``check_attention`` (attention.py): whether a model's attention kinds
  can be cached exactly, from its config; ``UnsupportedModel`` (a
  ``ValueError``) names the feature that cannot and what would be needed.
- ``KvCacheClient`` (cache.py): ``lookup``, ``save`` / ``start_save``,
  ``load`` / ``start_load`` with per-layer ``start_layer`` / ``wait_layer``
  so that loading layer ``l + 1`` overlaps computing layer ``l``; a failed
  item of chunk ``c`` makes the usable prefix the chunks before ``c``.
- ``StagingStore`` (staging.py): a store seen through a shared-memory
  staging buffer, for memory the store's drives cannot reach (an engine's
  own tensors on ``daemon`` drives); ``KvCacheClient`` uses one when the
  store refuses the tensors, or when given ``staging_bytes``.

docs/engines.md is the guide.
"""

from __future__ import annotations

from tutti.engine.attention import AttentionInfo, UnsupportedModel, check_attention, text_config
from tutti.engine.cache import (
    DEFAULT_TIMEOUT,
    ItemFailure,
    KvCacheClient,
    LayerLoad,
    LayerSave,
    LoadResult,
    ObjectTooLargeError,
    SaveResult,
)
from tutti.engine.chunks import Chunking
from tutti.engine.keys import LAYER_TAG, KeyScheme
from tutti.engine.staging import DEFAULT_STAGING_BYTES, StagedStatus, StagingStore
from tutti.engine.layouts import (
    BlockMajorPagedKV,
    ContiguousChunks,
    Layout,
    PagedKV,
    Range,
    StackedPagedKV,
    TensorInfo,
    tensor_info,
)

__all__ = [
    "DEFAULT_STAGING_BYTES",
    "DEFAULT_TIMEOUT",
    "LAYER_TAG",
    "AttentionInfo",
    "BlockMajorPagedKV",
    "Chunking",
    "ContiguousChunks",
    "ItemFailure",
    "KeyScheme",
    "KvCacheClient",
    "LayerLoad",
    "LayerSave",
    "Layout",
    "LoadResult",
    "ObjectTooLargeError",
    "PagedKV",
    "Range",
    "SaveResult",
    "StackedPagedKV",
    "StagedStatus",
    "StagingStore",
    "TensorInfo",
    "UnsupportedModel",
    "check_attention",
    "tensor_info",
    "text_config",
]
