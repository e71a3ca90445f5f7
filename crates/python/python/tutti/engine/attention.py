"""Which attention kinds the engine can cache exactly, decided from a model's
config before anything is stored.

The engine stores, per (chunk, layer), the K and V of every token of the
chunk, and restores them by position. That is exact when each attention
layer keeps the K and V of every token before the current one, in a cache
entry of one shape per token in every layer. It is not when a layer keeps
fewer tokens (a sliding window shorter than the prompt), keeps something
other than per-token K and V (a recurrent or convolution state, an
indexer's keys), or shares another layer's cache. ``check_attention``
reads a config (a transformers ``PretrainedConfig``, vLLM's ``hf_config``,
or any object with the same attributes) and raises ``UnsupportedModel``
for those; docs/engines.md has the table of kinds.

The config attributes read, as transformers names them:

- ``layer_types`` (or ``layers_block_type``): per layer ``"full_attention"``,
  ``"sliding_attention"``, ``"chunked_attention"``, ``"linear_attention"``
  (Mamba, gated delta net, lightning attention), ``"conv"``, ``"hybrid"``,
  ...; without it, a layer is sliding when ``sliding_window`` is set (and
  ``use_sliding_window`` is not False), chunked when
  ``attention_chunk_size`` is set, else full (transformers'
  ``get_layer_types_and_kwargs``);
- ``sliding_window``, ``attention_chunk_size`` (tokens) against
  ``max_position_embeddings`` (tokens): a window at least as long as the
  longest sequence the model runs never drops a token;
- hybrid markers of configs without ``layer_types`` (``attn_layer_period``,
  ``attn_layer_indices``, ``hybrid_override_pattern``, a state-space
  ``model_type``);
- ``kv_lora_rank`` (multi-head latent attention, DeepSeek-V2/V3): K and V
  of different sizes per token;
- ``kv_sharing_modes``, ``num_kv_shared_layers``: layers that read another
  layer's cache; ``num_key_value_heads`` given per layer, ``block_configs``:
  layers of different shapes; ``is_encoder_decoder``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

__all__ = ["AttentionInfo", "UnsupportedModel", "check_attention", "text_config"]


class UnsupportedModel(ValueError):
    """A model whose KV the engine cannot store and restore exactly,
    refused before anything is stored.

    ``feature``: the model feature, one of ``"sliding_window"``,
    ``"hybrid"``, ``"mla"`` (vLLM only), ``"sparse_attention"``,
    ``"kv_sharing"``, ``"per_layer_shapes"``, ``"kv_shapes"``,
    ``"encoder_decoder"``, ``"layer_type"``; ``detail``: what the model has
    (layer indices, sizes); ``needed``: what the engine would need to
    handle it. The message holds all three. A ``ValueError``.
    """

    def __init__(self, feature: str, detail: str, needed: str) -> None:
        self.feature = feature
        self.detail = detail
        self.needed = needed
        super().__init__(f"unsupported model ({feature}): {detail}; {needed}")


@dataclass(frozen=True)
class AttentionInfo:
    """What ``check_attention`` found: ``num_layers`` attention layers, each
    full attention (or a window no shorter than ``max_tokens``, so none is
    ever dropped); ``mla``: multi-head latent attention (``kv_lora_rank``
    set), whose cached K and V differ in size per token; ``max_tokens``: the
    longest sequence the check assumed (tokens, None when the config names
    none)."""

    num_layers: int
    mla: bool
    max_tokens: Optional[int]


# Layer types whose cache holds per-token K and V; the windowed ones keep
# only the last window's tokens.
_FULL = {"full_attention", "attention"}
_WINDOWED = {"sliding_attention", "chunked_attention", "window_attention", "reference_sliding_attention"}
# Layer types whose cache holds a recurrent or convolution state (or both
# that and attention KV), or no cache at all.
_STATEFUL = {"linear_attention", "mamba", "mamba2", "conv", "hybrid", "hybrid_sliding", "rwkv", "recurrent"}
_NO_ATTENTION = {"moe", "mlp", "dense", "sparse", "dummy"}
# Sparse attention with an indexer or compressed cache besides K and V.
_SPARSE = {"indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse"}
# model_type of configs of models with no attention KV at all (state-space or recurrent).
_SSM_MODEL_TYPES = {"mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm"}

_HYBRID_NEEDED = (
    "a layer that keeps a recurrent or convolution state instead of per-token K and V "
    "would need that state saved at every chunk boundary and restored with the KV; "
    "the engine stores per-token K and V only"
)


def text_config(config: Any) -> Any:
    """The decoder's config of a (possibly multimodal) transformers config
    (``get_text_config(decoder=True)``), else ``config`` itself."""
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except TypeError:
            return get()
    return config


def _indices(xs: List[int]) -> str:
    """``[0, 2, 4]`` as text, shortened past 8 entries."""
    if len(xs) > 8:
        return f"{xs[:8]} and {len(xs) - 8} more"
    return str(xs)


def _layer_types(cfg: Any, n: int) -> List[str]:
    """Per-layer types as transformers derives them (module docstring)."""
    model_type = str(getattr(cfg, "model_type", "") or "")
    types = getattr(cfg, "layer_types", None)
    if types is None:
        types = getattr(cfg, "layers_block_type", None)
    if types is not None:
        return [str(t) for t in types]
    if model_type in _SSM_MODEL_TYPES:
        return ["linear_attention"] * n
    period = getattr(cfg, "attn_layer_period", None)
    if period:  # Jamba: attention in layers i % period == offset, Mamba elsewhere.
        offset = int(getattr(cfg, "attn_layer_offset", 0) or 0)
        return ["full_attention" if i % int(period) == offset else "linear_attention" for i in range(n)]
    attn_idx = getattr(cfg, "attn_layer_indices", None)
    if attn_idx is not None:  # Bamba
        return ["full_attention" if i in set(attn_idx) else "linear_attention" for i in range(n)]
    pattern = getattr(cfg, "hybrid_override_pattern", None)
    if pattern:  # Nemotron-H: M (Mamba), * (attention), - or E (MLP/MoE)
        kinds = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
        return [kinds.get(ch, ch) for ch in str(pattern)]
    sliding = getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True) is not False
    chunked = getattr(cfg, "attention_chunk_size", None) is not None
    max_window_layers = getattr(cfg, "max_window_layers", None)
    out = []
    for i in range(n):
        if sliding and (max_window_layers is None or not getattr(cfg, "use_sliding_window", False) or i >= int(max_window_layers)):
            out.append("sliding_attention")
        elif chunked:
            out.append("chunked_attention")
        else:
            out.append("full_attention")
    return out


def check_attention(config: Any, *, max_tokens: Optional[int] = None, engine: str = "transformers") -> AttentionInfo:
    """Check that every layer of the model ``config`` describes can be
    cached exactly; raise ``UnsupportedModel`` naming the first feature that
    cannot.

    ``max_tokens``: the longest sequence the engine will run (tokens;
    default the config's ``max_position_embeddings``): a sliding or chunked
    window at least that long never drops a token and counts as full
    attention. ``engine``: ``"transformers"`` (multi-head latent attention
    is exact: transformers caches its K and V with their own shapes, stored
    as such) or ``"vllm"`` (refused: vLLM's MLA cache is one latent tensor
    per layer, which the vLLM layout does not read).
    """
    if engine not in ("transformers", "vllm"):
        raise ValueError(f"engine must be 'transformers' or 'vllm', got {engine!r}")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModel(
            "encoder_decoder",
            "an encoder-decoder model (its decoder also attends to the encoder's output)",
            "the engine caches decoder-only prompts",
        )
    cfg = text_config(config)
    n = getattr(cfg, "num_hidden_layers", None)
    if n is None:
        raise UnsupportedModel("layer_type", "the config has no num_hidden_layers", "a decoder-only model config")
    n = int(n)
    model_type = str(getattr(cfg, "model_type", "") or "")

    _check_shapes(cfg)
    types = _layer_types(cfg, n)
    if len(types) != n:
        raise UnsupportedModel("layer_type", f"{len(types)} layer types for {n} layers", "one layer type per layer")
    _check_layer_types(types, model_type, n)
    limit = max_tokens if max_tokens is not None else getattr(cfg, "max_position_embeddings", None)
    limit = None if limit is None else int(limit)
    _check_windows(cfg, types, limit, n)
    return AttentionInfo(n, _check_mla(cfg, engine), limit)


def _check_shapes(cfg: Any) -> None:
    """Every layer caches K and V of one shape, its own (no per-layer
    block configs, KV head counts or shared caches)."""
    if getattr(cfg, "block_configs", None) is not None:
        raise UnsupportedModel(
            "per_layer_shapes",
            "per-layer block_configs (layers with different attention shapes, or none)",
            "every layer must cache K and V of one shape",
        )
    heads = getattr(cfg, "num_key_value_heads", None)
    if isinstance(heads, (list, tuple)) and len(set(heads)) > 1:
        raise UnsupportedModel(
            "per_layer_shapes",
            f"KV head counts that differ per layer ({_indices(list(heads))})",
            "every layer must cache K and V of one shape (a layout with per-layer object sizes would be needed)",
        )
    sharing = getattr(cfg, "kv_sharing_modes", None)
    shared = [i for i, m in enumerate(sharing or []) if m == "reuse"]
    if shared or int(getattr(cfg, "num_kv_shared_layers", 0) or 0) > 0:
        which = f"layers {_indices(shared)}" if shared else f"the last {int(getattr(cfg, 'num_kv_shared_layers'))} layers"
        raise UnsupportedModel(
            "kv_sharing",
            f"{which} reuse another layer's KV cache",
            "the engine stores one KV cache per layer; shared layers would need mapping to their source layer",
        )


def _check_layer_types(types: List[str], model_type: str, n: int) -> None:
    """Every one of the ``n`` layers is an attention layer the engine
    caches: no state-space or attention-free layers, no sparse attention
    with its own indexer cache, no unknown layer type."""
    stateful = [i for i, t in enumerate(types) if t in _STATEFUL]
    if stateful or model_type in _SSM_MODEL_TYPES:
        kinds = sorted({types[i] for i in stateful})
        pure = model_type in _SSM_MODEL_TYPES or not any(t in _FULL or t in _WINDOWED or t.startswith("hybrid") for t in types)
        raise UnsupportedModel(
            "hybrid",
            f"a {'state-space' if pure else 'hybrid'} model ({model_type or 'model'}): "
            f"layers {_indices(stateful)} of {n} are {'/'.join(kinds)} layers",
            _HYBRID_NEEDED,
        )
    none = [i for i, t in enumerate(types) if t in _NO_ATTENTION]
    if none:
        raise UnsupportedModel(
            "hybrid",
            f"layers {_indices(none)} of {n} have no attention (layer types {sorted({types[i] for i in none})})",
            "the engine stores K and V for every layer (skipping layers without a cache would be needed)",
        )
    sparse = [i for i, t in enumerate(types) if t in _SPARSE]
    if sparse:
        raise UnsupportedModel(
            "sparse_attention",
            f"layers {_indices(sparse)} use {sorted({types[i] for i in sparse})} "
            "(an indexer or compressed cache besides K and V)",
            "the engine stores per-token K and V only; the indexer's cache would need its own objects",
        )
    unknown = [i for i, t in enumerate(types) if t not in _FULL and t not in _WINDOWED]
    if unknown:
        raise UnsupportedModel(
            "layer_type",
            f"layers {_indices(unknown)} have layer types {sorted({types[i] for i in unknown})}",
            "only full-attention layers (and windows no shorter than the longest sequence) are cached",
        )


def _check_windows(cfg: Any, types: List[str], limit: Optional[int], n: int) -> None:
    """Sliding or chunked windows at least ``limit`` tokens long (the
    longest sequence), so they never drop a token."""
    windowed = [i for i, t in enumerate(types) if t in _WINDOWED]
    if windowed:
        window = getattr(cfg, "sliding_window", None)
        if types[windowed[0]] == "chunked_attention" and getattr(cfg, "attention_chunk_size", None) is not None:
            window = cfg.attention_chunk_size
        if window is None or limit is None or int(window) < limit:
            what = "chunked attention" if all(types[i] == "chunked_attention" for i in windowed) else "sliding-window attention"
            size = "no window size" if window is None else f"a {int(window)}-token window"
            longest = "no max_position_embeddings" if limit is None else f"sequences of up to {limit} tokens"
            raise UnsupportedModel(
                "sliding_window",
                f"layers {_indices(windowed)} of {n} use {what} with {size}, {longest}",
                "a windowed layer keeps only its last window's K and V, so a prefix longer than the window "
                "cannot be saved whole; it would need the engine to save and restore each windowed layer's "
                "last window only (or a cache keeping every token of those layers)",
            )


def _check_mla(cfg: Any, engine: str) -> bool:
    """Whether the model uses multi-head latent attention; refused for
    ``engine`` ``"vllm"``."""
    mla = getattr(cfg, "kv_lora_rank", None) is not None
    if mla and engine == "vllm":
        raise UnsupportedModel(
            "mla",
            f"multi-head latent attention (kv_lora_rank {int(cfg.kv_lora_rank)}, "
            f"qk_rope_head_dim {getattr(cfg, 'qk_rope_head_dim', '?')})",
            "vLLM caches one latent tensor per layer ([num_blocks, block_size, kv_lora_rank + "
            "qk_rope_head_dim]); the connector's layout reads separate K and V per head only",
        )
    return mla
