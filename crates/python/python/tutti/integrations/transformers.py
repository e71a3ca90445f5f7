"""A prefix cache for Hugging Face transformers (5.x) ``generate``.

After a prefill, ``PrefixCache.save`` stores the KV of the prompt's whole
chunks in a ``tutti.KvStore``; for a new prompt, ``PrefixCache.restore``
loads the longest cached prefix into a transformers ``DynamicCache`` in the
model's device memory, so that only the rest of the prompt is prefilled::

    pc = PrefixCache(model, store, model_id="my-model@rev", chunk_tokens=256)
    out, info = pc.generate(input_ids, max_new_tokens=32, do_sample=False)
    # info.cached_tokens: tokens restored instead of prefilled

How the bytes move: transformers keeps per layer ``keys`` and ``values`` of
shape ``[batch, heads, seq, head_dim]`` (K and V may differ in heads and
head size: DeepSeek-V2/V3's multi-head latent attention caches its latent
and rotary key there); a token slice of that is not contiguous across
heads, so each layer has a staging buffer on the model's device, per chunk
slot K ``[kv_heads, chunk_tokens, head_dim]`` then V ``[v_heads,
chunk_tokens, v_head_dim]`` (the engine's ``ContiguousChunks`` layout): a
save copies the cache into it (one device copy per layer and K or V) and
puts one store object per (chunk, layer); a restore gets the objects into
it layer by layer and copies them out into the new cache. A CUDA model
needs a runtime whose datapath has ``execution: gpu`` (docs/gpu.md); a CPU
model works with any runtime (host memory). On ``daemon`` drives (a
``tuttid`` owns the drives; they reach only shared memory) the staging
buffers' bytes are copied once more, through a shared-memory buffer
(``staging_bytes``), every object still checked by its CRC32C.

Which models: ``PrefixCache`` checks the model when it is built and raises
``UnsupportedModel`` (a ``ValueError``, from ``tutti.engine``) for what it
cannot restore exactly: sliding-window or chunked attention with a window
shorter than ``max_position_embeddings`` (Mistral-style
``sliding_window``, Gemma-style alternating layers, gpt-oss), hybrid models
(Mamba, linear-attention or convolution layers), layers sharing another's
cache, sparse attention with an indexer cache. Multi-head latent attention
(K and V of different sizes) is stored exactly. The shapes and dtypes
stored are those a one-token forward pass puts in a new cache, read once
at construction; docs/engines.md has the table of attention kinds.

Only batch size 1 is handled. Everything cached is keyed by ``model_id``
(with dtype, shape and chunk size): give each set of weights its own id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch
from transformers import DynamicCache

from tutti.engine import ContiguousChunks, KvCacheClient, LoadResult, SaveResult, UnsupportedModel, check_attention

__all__ = ["CACHE_KWARG", "KvShape", "PrefixCache", "RestoreInfo", "UnsupportedModel", "cache_of", "model_kv_shape", "probe_kv_shape"]


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
    """``(num_layers, kv_heads, head_dim)`` of a decoder-only transformers
    model, from its config (attention heads' sizes; for models whose cache
    holds something else, e.g. multi-head latent attention, see
    ``probe_kv_shape``)."""
    cfg = model.config
    if hasattr(cfg, "get_text_config"):
        cfg = cfg.get_text_config(decoder=True)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return int(cfg.num_hidden_layers), kv_heads, head_dim


@dataclass(frozen=True)
class KvShape:
    """What a model's cache holds per token in every layer: K ``[kv_heads,
    head_dim]``, V ``[v_heads, v_head_dim]``, of ``dtype``."""

    num_layers: int
    kv_heads: int
    head_dim: int
    v_heads: int
    v_head_dim: int
    dtype: Any


def probe_kv_shape(model: Any, cache: Any, num_layers: int) -> KvShape:
    """Run ``model`` on one token into ``cache`` (a new, empty Cache laid
    out for the model) and read what each of its ``num_layers`` layers
    cached. Raises
    ``UnsupportedModel`` when a layer cached no per-token K and V (a
    recurrent or convolution state), when layers differ in shape or dtype,
    or when K and V differ in dtype."""
    n = int(num_layers)
    ids = torch.zeros((1, 1), dtype=torch.long, device=model.device)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, **{CACHE_KWARG: cache})
    layers = list(getattr(cache, "layers", None) or [])
    if len(layers) != n:
        raise UnsupportedModel(
            "layer_type",
            f"the model's cache has {len(layers)} layers for {n} decoder layers",
            "one K/V cache layer per decoder layer",
        )
    first: Optional[Tuple[Any, ...]] = None
    for i, lay in enumerate(layers):
        k, v = getattr(lay, "keys", None), getattr(lay, "values", None)
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == 4 and v.dim() == 4):
            raise UnsupportedModel(
                "hybrid",
                f"layer {i}'s cache ({type(lay).__name__}) holds no per-token K and V after a forward pass",
                "the engine stores per-token K and V of every layer",
            )
        if k.shape[2] != 1 or v.shape[2] != 1:
            raise UnsupportedModel(
                "kv_shapes",
                f"layer {i} cached K {tuple(k.shape)} and V {tuple(v.shape)} for one token",
                "one cache entry per token ([batch, heads, seq, head_dim])",
            )
        if k.dtype != v.dtype:
            raise UnsupportedModel(
                "kv_shapes",
                f"layer {i} caches K as {k.dtype} and V as {v.dtype}",
                "K and V of one dtype (a staging buffer per dtype would be needed)",
            )
        shape = (int(k.shape[1]), int(k.shape[3]), int(v.shape[1]), int(v.shape[3]), k.dtype)
        if first is None:
            first = shape
        elif shape != first:
            raise UnsupportedModel(
                "per_layer_shapes",
                f"layer {i} caches K [{shape[0]}, {shape[1]}] V [{shape[2]}, {shape[3]}] {shape[4]} per token, "
                f"layer 0 K [{first[0]}, {first[1]}] V [{first[2]}, {first[3]}] {first[4]}",
                "every layer must cache K and V of one shape (a layout with per-layer object sizes would be needed)",
            )
    assert first is not None
    return KvShape(n, *first)


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

    ``model``: a decoder-only transformers model whose every layer caches
    per-token K and V of one shape (full attention, a window no shorter
    than ``max_position_embeddings``, or multi-head latent attention);
    anything else raises ``UnsupportedModel`` here (module docstring).
    ``store``: an open ``tutti.KvStore`` on a runtime that can reach
    the model's memory (``execution: gpu`` for CUDA). ``model_id``: names
    the weights in the key namespace (default: the config's
    ``_name_or_path``; required for a model built from a config, whose
    weights have no name). ``chunk_tokens``: tokens per chunk (a store
    object per chunk and layer holds ``chunk_tokens * (kv_heads * head_dim
    + v_heads * v_head_dim) * dtype bytes``, ``2 * chunk_tokens * kv_heads
    * head_dim * dtype bytes`` when K and V share a shape; it must fit the
    store's slot size). ``max_tokens``: longest prefix kept in the staging
    buffers (device memory: ``num_layers * max_tokens`` times the bytes per
    token above). ``timeout``: seconds per wait. ``staging_bytes``: on a
    store whose drives reach only shared memory (``daemon`` drives of a
    ``tuttid``) the staging buffers above are not registered; their bytes
    move through a shared-memory buffer of this size
    (``tutti.engine.StagingStore``; default None: 64 MiB, used only when
    the store refuses the buffers; 0: never, the refusal is raised).

    Construction runs the model once on one token (no gradients) to read
    the shapes and dtype its cache holds (``kv_shape``).
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
        staging_bytes: Optional[int] = None,
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
        self.staging_bytes = staging_bytes
        self.max_chunks = max_tokens // chunk_tokens
        if self.max_chunks < 1:
            raise ValueError(f"max_tokens ({max_tokens}) is less than one chunk ({chunk_tokens} tokens)")
        self.device = model.device
        attn = check_attention(model.config)
        self.kv_shape = probe_kv_shape(model, self._empty_cache(), attn.num_layers)
        shape = self.kv_shape
        self.num_layers, self.kv_heads, self.head_dim = shape.num_layers, shape.kv_heads, shape.head_dim
        self.v_heads, self.v_head_dim = shape.v_heads, shape.v_head_dim
        self.dtype = shape.dtype
        self._retired: List[Tuple[KvCacheClient, List[Tuple[torch.Tensor, torch.Tensor]]]] = []
        self._new_staging()

    def _new_staging(self) -> None:
        c = self.chunk_tokens
        per_slot = c * (self.kv_heads * self.head_dim + self.v_heads * self.v_head_dim)
        self.staging = [torch.zeros((self.max_chunks, per_slot), dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.layout = ContiguousChunks(
            self.staging, kv_heads=self.kv_heads, chunk_tokens=c, head_dim=self.head_dim, v_heads=self.v_heads, v_head_dim=self.v_head_dim
        )
        self._views = [(self.layout.key_view(i), self.layout.value_view(i)) for i in range(self.num_layers)]
        self.client = KvCacheClient(self.store, self.layout, self.model_id, timeout=self.timeout, staging_bytes=self.staging_bytes)

    def _retire_staging(self) -> None:
        """A get timed out: the drive may still write the staging buffers,
        so they are kept (registered, never reused) and new ones made."""
        self._retired.append((self.client, self._views))
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
        self._check_cache(cache, t)
        c = self.chunk_tokens
        s = self.client.start_save(tokens[:t])
        for layer in range(self.num_layers):
            lay = cache.layers[layer]
            for src, dst in zip((lay.keys, lay.values), self._views[layer]):
                # [1, h, t, d] -> [n, h, c, d] into slots [0, n) of K or V.
                h, d = int(src.shape[1]), int(src.shape[3])
                dst[:n].copy_(src[0, :, :t, :].reshape(h, n, c, d).permute(1, 0, 2, 3))
            s.save_layer(layer)
            if layers_in_flight is not None and (layer + 1) % max(1, layers_in_flight) == 0 and layer + 1 < self.num_layers:
                s.wait_puts()
        return s.wait()

    def _check_cache(self, cache: Any, t: int) -> None:
        """Before anything is stored: every layer of ``cache`` holds K and V
        of the probed shapes and dtype for (at least) the first ``t``
        tokens; raise ValueError naming the first layer that does not (a
        cache of another model or layout, a quantized cache, a sliding
        window that dropped tokens)."""
        layers = getattr(cache, "layers", None)
        if layers is None or len(layers) != self.num_layers:
            raise ValueError(f"the cache has {len(layers or [])} layers, the model {self.num_layers}")
        want = ((self.kv_heads, self.head_dim), (self.v_heads, self.v_head_dim))
        for i, lay in enumerate(layers):
            for what, x, (h, d) in zip("KV", (getattr(lay, "keys", None), getattr(lay, "values", None)), want):
                if not isinstance(x, torch.Tensor) or x.dim() != 4:
                    raise ValueError(f"layer {i} of the cache ({type(lay).__name__}) holds no {what} tensor [batch, heads, seq, head_dim]")
                if x.shape[0] != 1 or (int(x.shape[1]), int(x.shape[3])) != (h, d) or x.dtype != self.dtype:
                    raise ValueError(
                        f"layer {i}'s {what} is {tuple(x.shape)} {x.dtype}; this PrefixCache stores [1, {h}, seq, {d}] {self.dtype}"
                    )
                if int(x.shape[2]) < t:
                    raise ValueError(
                        f"layer {i}'s {what} holds {int(x.shape[2])} tokens but the cache counts {cache.get_seq_length()} "
                        f"({type(lay).__name__}: a window that dropped tokens?); nothing was stored"
                    )

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
            views = self._retired[-1][1]
        else:
            views = self._views
        n = result.cached_chunks
        info = RestoreInfo(n * self.chunk_tokens, len(tokens), result if result.found_chunks else None)
        if n == 0:
            return None, info
        cache = self._empty_cache()
        c, t = self.chunk_tokens, n * self.chunk_tokens
        for layer in range(self.num_layers):
            kv = []
            for src in views[layer]:  # [slots, h, c, d]
                h, d = int(src.shape[1]), int(src.shape[3])
                out = torch.empty((1, h, t, d), dtype=self.dtype, device=self.device)
                out[0].view(h, n, c, d).permute(1, 0, 2, 3).copy_(src[:n])
                kv.append(out)
            cache.update(kv[0], kv[1], layer)
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
