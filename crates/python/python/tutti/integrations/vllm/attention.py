"""Which vLLM models the connector handles, checked when it is built.

The connector stores, per chunk and layer, the K and V blocks of the
request's block table (group 0 of vLLM's KV cache groups) in every
registered layer. That is exact for full attention in every layer, one KV
cache spec for all of them. ``check_vllm_model`` refuses the rest with
``tutti.engine.UnsupportedModel``, from the model's config
(``model_config.hf_config``, through ``tutti.engine.check_attention`` with
vLLM's ``max_model_len`` as the longest sequence) and from vLLM's
``KVCacheConfig`` (its ``kv_cache_groups`` and their specs):

- sliding-window or chunked-local attention with a window shorter than
  ``max_model_len``: vLLM frees (or never allocates) the blocks that left
  the window, so the block table names blocks that no longer hold the
  chunk's KV;
- multi-head latent attention (``MLAAttentionSpec``, ``use_mla``): one
  latent tensor per layer, not the K/V-per-head layouts ``VllmPagedKV``
  reads;
- hybrid models (``MambaSpec`` groups, linear-attention layers): a
  recurrent state, not per-token K and V;
- more than one KV cache group, or K and V of different head sizes
  (``head_size_v``): the connector reads one block table and one K/V shape.
"""

from __future__ import annotations

from typing import Any, List

from tutti.engine import UnsupportedModel, check_attention


def _spec_kind(spec: Any) -> str:
    """A KV cache spec's class name (vLLM's ``kv_cache_interface``)."""
    return type(spec).__name__


def check_vllm_model(vllm_config: Any, kv_cache_config: Any = None) -> None:
    """Raise ``UnsupportedModel`` unless the model of ``vllm_config`` (and
    the KV cache vLLM laid out for it, ``kv_cache_config``, when given) is
    one the connector restores exactly (module docstring). Attributes
    vLLM's objects lack are not checked."""
    mc = getattr(vllm_config, "model_config", None)
    hf = getattr(mc, "hf_text_config", None) or getattr(mc, "hf_config", None)
    max_len = getattr(mc, "max_model_len", None)
    if hf is not None:
        check_attention(hf, max_tokens=None if max_len is None else int(max_len), engine="vllm")
    if getattr(mc, "use_mla", False):
        raise UnsupportedModel(
            "mla",
            "vLLM runs the model with multi-head latent attention (model_config.use_mla)",
            "vLLM caches one latent tensor per layer; the connector's layout reads separate K and V per head only",
        )
    groups: List[Any] = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    for i, g in enumerate(groups):
        spec = getattr(g, "kv_cache_spec", None)
        specs = list(getattr(spec, "kv_cache_specs", {}).values()) if hasattr(spec, "kv_cache_specs") else [spec]
        for s in specs:
            kind = _spec_kind(s)
            if "Mamba" in kind:
                raise UnsupportedModel(
                    "hybrid",
                    f"KV cache group {i} is {kind} (Mamba or linear-attention state)",
                    "a recurrent state would need saving at every chunk boundary; the connector stores per-token K and V only",
                )
            if "MLA" in kind:
                raise UnsupportedModel(
                    "mla",
                    f"KV cache group {i} is {kind} (one latent tensor per layer)",
                    "a layout for vLLM's MLA cache ([num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]) would be needed",
                )
            window = getattr(s, "sliding_window", None) or getattr(s, "attention_chunk_size", None)
            windowed = "SlidingWindow" in kind or "ChunkedLocal" in kind
            if (windowed or window is not None) and (window is None or max_len is None or int(window) < int(max_len)):
                raise UnsupportedModel(
                    "sliding_window",
                    f"KV cache group {i} is {kind} with a {window}-token window, sequences of up to {max_len} tokens",
                    "vLLM drops the blocks that left the window, so a saved chunk would name blocks that no longer hold it",
                )
            if "CrossAttention" in kind or "EncoderOnly" in kind:
                raise UnsupportedModel("encoder_decoder", f"KV cache group {i} is {kind}", "the connector caches decoder self-attention only")
            hv = getattr(s, "head_size_v", None)
            hk = getattr(s, "head_size", None)
            if hv is not None and hk is not None and hv != hk:
                raise UnsupportedModel(
                    "kv_shapes",
                    f"KV cache group {i} ({kind}) has K head size {hk} and V head size {hv}",
                    "the connector's layout holds K and V of one head size",
                )
    if len(groups) > 1:
        kinds = ", ".join(f"{_spec_kind(getattr(g, 'kv_cache_spec', None))} ({len(getattr(g, 'layer_names', []) or [])} layers)" for g in groups)
        raise UnsupportedModel(
            "hybrid",
            f"vLLM laid out {len(groups)} KV cache groups ({kinds})",
            "the connector reads the block table of one group; a block table per group would be needed",
        )
