"""A prefix cache for Hugging Face transformers (5.x) ``generate``.

After a prefill, ``PrefixCache.save`` stores the KV of the prompt's whole
chunks in a ``tutti.KvStore``; for a new prompt, ``PrefixCache.restore``
loads the longest cached prefix into a transformers ``DynamicCache`` in the
model's device memory, so that only the rest of the prompt is prefilled::

    pc = PrefixCache(model, store, model_id="my-model@rev", chunk_tokens=256)
    out, info = pc.generate(input_ids, max_new_tokens=32, do_sample=False)
    # info.cached_tokens: tokens restored instead of prefilled

How the bytes move: transformers keeps per layer ``keys`` and ``values`` of
shape ``[batch, kv_heads, seq, head_dim]``; a token slice of that is not
contiguous across heads, so each layer has a staging buffer ``[max_chunks,
2, kv_heads, chunk_tokens, head_dim]`` on the model's device (the engine's
``ContiguousChunks`` layout): a save copies the cache into it (one device
copy per layer) and puts one store object per (chunk, layer); a restore
gets the objects into it layer by layer and copies them out into the new
cache. A CUDA model needs a runtime whose datapath has ``execution: gpu``
(docs/gpu.md); a CPU model works with any runtime (host memory).

Only batch size 1 is handled. Everything cached is keyed by ``model_id``
(with dtype, shape and chunk size): give each set of weights its own id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch
from transformers import DynamicCache

from tutti.engine import ContiguousChunks, KvCacheClient, LoadResult, SaveResult

__all__ = ["CACHE_KWARG", "PrefixCache", "RestoreInfo", "cache_of", "model_kv_shape"]


def _cache_field() -> str:
    """The name transformers gives the cache in outputs and arguments:
    "past_key_values" up to some 5.x release, "cache" after it (the old
    name still works there, with a deprecation warning)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    names = {f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)}
    return "cache" if "cache" in names else "past_key_values"


CACHE_KWARG: str = _cache_field()
"""The keyword that passes a Cache to ``model(...)`` and ``model.generate``
in the installed transformers ("cache" or "past_key_values")."""


def cache_of(output: Any) -> Any:
    """The Cache of a model or generate output of the installed transformers."""
    return getattr(output, CACHE_KWARG)


def model_kv_shape(model: Any) -> Tuple[int, int, int]:
    """``(num_layers, kv_heads, head_dim)`` of a decoder-only transformers model."""
    cfg = model.config
    if hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config(decoder=True)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return int(cfg.num_hidden_layers), kv_heads, head_dim


def _tokens(input_ids: Any) -> List[int]:
    """Token ids of a ``[1, n]`` or ``[n]`` tensor, or a list."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"only batch size 1 is handled, got input_ids of shape {tuple(input_ids.shape)}")
            input_ids = input_ids[0]
        return [int(x) for x in input_ids.tolist()]
    return [int(x) for x in input_ids]


@dataclass
class RestoreInfo:
    """What a restore did: ``cached_tokens`` restored (the model prefills
    the rest), ``prompt_tokens``, and the engine's ``LoadResult`` (failures,
    or None when nothing was found)."""

    cached_tokens: int
    prompt_tokens: int
    load: Optional[LoadResult]
    saved: Optional[SaveResult] = None


class PrefixCache:
    """Saves and restores a transformers model's prompt KV through tutti.

    ``model``: a decoder-only transformers model (full attention in every
    layer). ``store``: an open ``tutti.KvStore`` on a runtime that can reach
    the model's memory (``execution: gpu`` for CUDA). ``model_id``: names
    the weights in the key namespace (default: the config's
    ``_name_or_path``; required for a model built from a config, whose
    weights have no name). ``chunk_tokens``: tokens per chunk (a store
    object per chunk and layer holds ``2 * chunk_tokens * kv_heads *
    head_dim * dtype bytes``; it must fit the store's slot size).
    ``max_tokens``: longest prefix kept in the staging buffers (device
    memory: ``num_layers * max_tokens * 2 * kv_heads * head_dim * dtype
    bytes``). ``timeout``: seconds per wait.
    """

    def __init__(
        self,
        model: Any,
        store: Any,
        *,
        model_id: Optional[str] = None,
        chunk_tokens: int = 256,
        max_tokens: int = 8192,
        timeout: float = 5.0,
    ) -> None:
        self.model = model
        self.store = store
        if model_id is None:
            model_id = getattr(model.config, "_name_or_path", "") or None
            if not model_id:
                raise ValueError("the model has no name (built from a config): pass model_id naming its weights")
        self.model_id = model_id
        self.chunk_tokens = chunk_tokens
        self.timeout = timeout
        self.num_layers, self.kv_heads, self.head_dim = model_kv_shape(model)
        cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ValueError(f"only full-attention layers are handled, the model has {sorted(kinds)}")
        self.max_chunks = max_tokens // chunk_tokens
        if self.max_chunks < 1:
            raise ValueError(f"max_tokens ({max_tokens}) is less than one chunk ({chunk_tokens} tokens)")
        self.dtype = model.dtype
        self.device = model.device
        self._retired: List[Tuple[KvCacheClient, List[torch.Tensor]]] = []
        self._new_staging()

    def _new_staging(self) -> None:
        shape = (self.max_chunks, 2, self.kv_heads, self.chunk_tokens, self.head_dim)
        self.staging = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.client = KvCacheClient(self.store, ContiguousChunks(self.staging), self.model_id, timeout=self.timeout)

    def _retire_staging(self) -> None:
        """A get timed out: the drive may still write the staging buffers,
        so they are kept (registered, never reused) and new ones made."""
        self._retired.append((self.client, self.staging))
        self._new_staging()

    def _empty_cache(self) -> DynamicCache:
        """An empty DynamicCache laid out for the model (its config names
        each layer's kind); without a config where transformers takes none."""
        try:
            return DynamicCache(config=self.model.config)
        except TypeError:
            return DynamicCache()

    def lookup(self, input_ids: Any) -> int:
        """Tokens of the longest cached prefix of the prompt (a multiple of
        ``chunk_tokens``, at most ``max_tokens``)."""
        tokens = _tokens(input_ids)
        return min(self.client.lookup(tokens), self.max_chunks * self.chunk_tokens)

    def save(self, input_ids: Any, cache: Any, *, layers_in_flight: Optional[int] = None) -> SaveResult:
        """Store the KV of the whole chunks of the prompt ``input_ids``
        (``[1, n]`` or ``[n]``) held by ``cache`` (a transformers Cache
        whose first ``n`` positions are the prompt's, e.g. after prefill or
        ``generate``). Chunks already stored are not written again.
        ``layers_in_flight``: at most that many layers' puts outstanding at
        once (the save waits for each group, ``timeout`` seconds per
        group); None (default) puts every layer before waiting on any."""
        tokens = _tokens(input_ids)
        have = cache.get_seq_length()
        n = min(len(tokens), have) // self.chunk_tokens
        n = min(n, self.max_chunks)
        if n == 0:
            return SaveResult(self.chunk_tokens, 0, 0, 0)
        t = n * self.chunk_tokens
        h, d, c = self.kv_heads, self.head_dim, self.chunk_tokens
        s = self.client.start_save(tokens[:t])
        for layer in range(self.num_layers):
            lay = cache.layers[layer]
            for i, src in enumerate((lay.keys, lay.values)):
                # [1, h, t, d] -> [n, h, c, d] into slots [0, n) of K (i=0) or V (i=1).
                part = src[0, :, :t, :].reshape(h, n, c, d).permute(1, 0, 2, 3)
                self.staging[layer][:n, i].copy_(part)
            s.save_layer(layer)
            if layers_in_flight is not None and (layer + 1) % max(1, layers_in_flight) == 0 and layer + 1 < self.num_layers:
                s.wait_puts()
        return s.wait()

    def restore(self, input_ids: Any) -> Tuple[Optional[DynamicCache], RestoreInfo]:
        """Load the longest cached prefix of ``input_ids`` that leaves at
        least one token to prefill. Returns ``(cache, info)``: a
        ``DynamicCache`` holding ``info.cached_tokens`` tokens (None when
        nothing usable was found) and what happened."""
        tokens = _tokens(input_ids)
        limit = min(self.max_chunks, max(0, len(tokens) - 1) // self.chunk_tokens)
        result = self.client.load(tokens, max_chunks=limit)
        if result.unsafe_ranges:
            self._retire_staging()
            # The usable chunks were complete before the timeout; their
            # bytes are still in the retired buffers.
            staging = self._retired[-1][1]
        else:
            staging = self.staging
        n = result.cached_chunks
        info = RestoreInfo(n * self.chunk_tokens, len(tokens), result if result.found_chunks else None)
        if n == 0:
            return None, info
        cache = self._empty_cache()
        h, d, t = self.kv_heads, self.head_dim, n * self.chunk_tokens
        for layer in range(self.num_layers):
            buf = staging[layer][:n]  # [n, 2, h, c, d]
            k = buf[:, 0].permute(1, 0, 2, 3).reshape(1, h, t, d)
            v = buf[:, 1].permute(1, 0, 2, 3).reshape(1, h, t, d)
            cache.update(k.clone(), v.clone(), layer)
        return cache, info

    def generate(self, input_ids: Any, **kwargs: Any) -> Tuple[Any, RestoreInfo]:
        """``model.generate`` with the prompt's cached prefix restored first
        and the prompt's whole chunks saved afterwards. ``kwargs`` go to
        ``generate`` (``return_dict_in_generate`` is forced on, to reach the
        cache). Returns ``(generate's output, info)``."""
        if not isinstance(input_ids, torch.Tensor):
            input_ids = torch.tensor([_tokens(input_ids)], device=self.device)
        cache, info = self.restore(input_ids)
        if cache is None:
            cache = self._empty_cache()
        kwargs.setdefault("attention_mask", torch.ones_like(input_ids))
        kwargs[CACHE_KWARG] = cache
        out = self.model.generate(input_ids, return_dict_in_generate=True, **kwargs)
        info.saved = self.save(input_ids, cache_of(out))
        return out, info

    def close(self) -> None:
        """Unregister the staging buffers (not those retired after a timeout)."""
        self.client.close()
