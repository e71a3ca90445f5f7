"""tutti.engine.check_attention on configs shaped like transformers' (plain
namespaces with the same attribute names, no torch needed), and the
engine's layout for K and V of different shapes (multi-head latent
attention) on host memory and emulated drives. Real tiny transformers
models of the same kinds are in test_transformers_attention.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import tutti
from tutti.engine import ContiguousChunks, KeyScheme, KvCacheClient, UnsupportedModel, check_attention


def config(**kw: Any) -> SimpleNamespace:
    """A Llama-shaped decoder config (8 layers, GQA), overridden by ``kw``."""
    base = dict(
        model_type="llama",
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        hidden_size=256,
        max_position_embeddings=4096,
    )
    base.update(kw)
    return SimpleNamespace(**base)


def refused(cfg: Any, feature: str, **kw: Any) -> UnsupportedModel:
    with pytest.raises(UnsupportedModel) as e:
        check_attention(cfg, **kw)
    assert e.value.feature == feature, e.value
    assert isinstance(e.value, ValueError)
    assert e.value.detail in str(e.value) and e.value.needed in str(e.value)
    return e.value


# Accepted ---------------------------------------------------------------------


def test_full_attention_models_are_accepted():
    info = check_attention(config())
    assert (info.num_layers, info.mla, info.max_tokens) == (8, False, 4096)
    # transformers 5.x writes layer_types for most models.
    assert check_attention(config(layer_types=["full_attention"] * 8)).num_layers == 8
    # Mistral v0.2+ (no window), Qwen2 with its window switched off.
    assert check_attention(config(model_type="mistral", sliding_window=None)).num_layers == 8
    qwen2 = config(model_type="qwen2", sliding_window=4096, use_sliding_window=False, max_window_layers=28)
    assert check_attention(qwen2).num_layers == 8


def test_a_window_no_shorter_than_the_longest_sequence_is_full_attention():
    # Never drops a token of a sequence the model runs.
    assert check_attention(config(model_type="mistral", sliding_window=4096)).num_layers == 8
    gemma = config(model_type="gemma3_text", sliding_window=8192, layer_types=["sliding_attention", "full_attention"] * 4)
    assert check_attention(gemma).num_layers == 8
    # ...but a longer limit than the window is refused.
    refused(config(model_type="mistral", sliding_window=4096), "sliding_window", max_tokens=8192)


def test_multimodal_configs_are_checked_through_their_text_config():
    text = config(model_type="gemma3_text", sliding_window=512, layer_types=["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2)

    class Outer:
        model_type = "gemma3"

        def get_text_config(self, decoder: bool = False) -> Any:
            assert decoder
            return text

    e = refused(Outer(), "sliding_window")
    assert "[0, 1, 2, 3, 4, 6, 7]" in str(e) and "512-token window" in str(e)


def test_mla_is_exact_for_transformers_and_refused_for_vllm():
    ds = config(
        model_type="deepseek_v2",
        num_key_value_heads=8,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        head_dim=64,
    )
    assert check_attention(ds).mla
    e = refused(ds, "mla", engine="vllm")
    assert "kv_lora_rank 512" in str(e) and "latent" in str(e)
    # The same refusals apply to vLLM; a full-attention model passes.
    assert not check_attention(config(), engine="vllm").mla
    with pytest.raises(ValueError, match="engine"):
        check_attention(config(), engine="sglang")


# Sliding windows --------------------------------------------------------------


def test_mistral_style_window_shorter_than_the_context_is_refused():
    e = refused(config(model_type="mistral", sliding_window=4096, max_position_embeddings=32768), "sliding_window")
    assert "4096-token window" in str(e) and "32768 tokens" in str(e)
    assert "last window" in e.needed
    # A window but no max_position_embeddings: the longest prompt is unknown.
    cfg = config(model_type="mistral", sliding_window=4096)
    del cfg.max_position_embeddings
    refused(cfg, "sliding_window")


def test_gemma_and_gpt_oss_style_alternating_layers_are_refused():
    gemma2 = config(model_type="gemma2", sliding_window=4096, max_position_embeddings=8192, layer_types=["sliding_attention", "full_attention"] * 4)
    e = refused(gemma2, "sliding_window")
    assert "layers [0, 2, 4, 6] of 8" in str(e)
    gpt_oss = config(model_type="gpt_oss", sliding_window=128, max_position_embeddings=131072, layer_types=["sliding_attention", "full_attention"] * 4)
    refused(gpt_oss, "sliding_window")
    # Qwen2 with its window on for the layers from max_window_layers (no layer_types).
    qwen2 = config(model_type="qwen2", sliding_window=1024, use_sliding_window=True, max_window_layers=6)
    assert "layers [6, 7] of 8" in str(refused(qwen2, "sliding_window"))


def test_chunked_attention_is_refused():
    llama4 = config(model_type="llama4_text", attention_chunk_size=8192, max_position_embeddings=131072, layer_types=["chunked_attention"] * 3 + ["full_attention"])
    llama4.num_hidden_layers = 4
    e = refused(llama4, "sliding_window")
    assert "chunked attention with a 8192-token window" in str(e)
    assert "chunked" in str(refused(config(attention_chunk_size=1024), "sliding_window"))


# Hybrid and other kinds ---------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        # Qwen3-Next: gated delta net layers, full attention every 4th.
        dict(model_type="qwen3_next", layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2),
        # Jamba (no layer_types in older configs): attention every attn_layer_period.
        dict(model_type="jamba", attn_layer_period=8, attn_layer_offset=4),
        # Zamba: layers_block_type.
        dict(model_type="zamba", layers_block_type=["mamba"] * 5 + ["hybrid"] * 3),
        # Bamba: attention layer indices.
        dict(model_type="bamba", attn_layer_indices=[3, 7]),
        # Nemotron-H: pattern of M (Mamba), * (attention), - (MLP).
        dict(model_type="nemotron_h", hybrid_override_pattern="M-M*M-M*"),
        # LFM2: short convolutions.
        dict(model_type="lfm2", layer_types=["conv", "conv", "full_attention", "conv"] * 2),
        # MiniMax: lightning (linear) attention.
        dict(model_type="minimax", layer_types=["linear_attention"] * 7 + ["full_attention"]),
    ],
    ids=["qwen3_next", "jamba", "zamba", "bamba", "nemotron_h", "lfm2", "minimax"],
)
def test_hybrid_models_are_refused_with_the_reason(kw):
    e = refused(config(**kw), "hybrid")
    assert "recurrent or convolution state" in e.needed
    assert "hybrid model" in str(e)


def test_state_space_models_are_refused():
    e = refused(config(model_type="mamba"), "hybrid")
    assert "state-space" in str(e)
    refused(config(model_type="mamba2", layer_types=["linear_attention"] * 8), "hybrid")


def test_other_kinds_are_refused():
    refused(config(layer_types=["full_attention", "indexed_attention"] * 4), "sparse_attention")
    refused(config(layer_types=["full_attention", "moe"] * 4), "hybrid")
    refused(config(layer_types=["full_attention", "some_new_attention"] * 4), "layer_type")
    refused(config(layer_types=["full_attention"] * 7), "layer_type")
    refused(config(num_kv_shared_layers=4), "kv_sharing")
    e = refused(config(kv_sharing_modes=["own"] * 6 + ["reuse"] * 2), "kv_sharing")
    assert "layers [6, 7]" in str(e)
    refused(config(num_key_value_heads=[2, 2, 4, 4, 2, 2, 4, 4]), "per_layer_shapes")
    assert check_attention(config(num_key_value_heads=[2] * 8)).num_layers == 8
    refused(config(block_configs=[{}] * 8), "per_layer_shapes")
    refused(config(is_encoder_decoder=True), "encoder_decoder")
    cfg = config()
    del cfg.num_hidden_layers
    refused(cfg, "layer_type")


# K and V of different shapes in the engine ---------------------------------------

H, T, D, VH, VD, SLOTS = 1, 16, 32, 1, 8, 3


def test_flat_contiguous_chunks_with_equal_shapes_are_the_5d_layout():
    five = np.random.default_rng(1).standard_normal((SLOTS, 2, 2, T, 64), dtype=np.float32)
    flat = five.reshape(SLOTS, -1).copy()
    a = ContiguousChunks([five])
    b = ContiguousChunks([flat], kv_heads=2, chunk_tokens=T, head_dim=64)
    assert a.name == b.name == "chunk[2,h,t,d]"
    assert (b.v_heads, b.v_head_dim, b.value_shape) == (None, None, (2, 64))
    assert a.segment_bytes == b.segment_bytes == 2 * T * 2 * 64 * 4
    assert [a.ranges(0, c, None) for c in range(SLOTS)] == [b.ranges(0, c, None) for c in range(SLOTS)]
    assert np.array_equal(a.key_view(0), b.key_view(0)) and np.array_equal(a.value_view(0), b.value_view(0))
    args = dict(model="m", dtype="float32", num_layers=1, kv_heads=2, head_dim=64, layout=a.name, chunk_tokens=T)
    assert KeyScheme(**args).namespace == KeyScheme(**args, v_heads=2, v_head_dim=64).namespace
    assert "v_head_dim" not in KeyScheme(**args).namespace


def test_flat_contiguous_chunks_hold_k_and_v_of_their_own_shapes():
    buf = np.zeros((SLOTS, T * (H * D + VH * VD)), np.float32)
    lay = ContiguousChunks([buf], kv_heads=H, chunk_tokens=T, head_dim=D, v_heads=VH, v_head_dim=VD)
    assert lay.name == "chunk[h,t,d|vh,t,vd]" and lay.value_shape == (VH, VD)
    assert lay.segment_bytes == lay.layer_chunk_bytes == T * (H * D + VH * VD) * 4
    k, v = lay.key_view(0), lay.value_view(0)
    assert k.shape == (SLOTS, H, T, D) and v.shape == (SLOTS, VH, T, VD)
    assert np.shares_memory(k, buf) and np.shares_memory(v, buf)
    k[1] = 1.0
    v[1] = 2.0
    r = lay.ranges(0, 1, None)[0]
    got = buf.view(np.uint8).reshape(-1)[r.offset : r.offset + r.length].view(np.float32)
    assert np.array_equal(got, np.concatenate([np.ones(H * T * D, np.float32), np.full(VH * T * VD, 2.0, np.float32)]))
    with pytest.raises(ValueError, match="need"):
        ContiguousChunks([buf], kv_heads=H, chunk_tokens=T, head_dim=D, v_heads=VH, v_head_dim=VD + 1)
    with pytest.raises(ValueError, match="needs kv_heads"):
        ContiguousChunks([buf])
    with pytest.raises(ValueError, match="flat form"):
        ContiguousChunks([np.zeros((SLOTS, 2, H, T, D), np.float32)], kv_heads=H)
    # V's shape is in the key namespace: another V never shares keys.
    args = dict(model="m", dtype="float32", num_layers=1, kv_heads=H, head_dim=D, layout=lay.name, chunk_tokens=T)
    toks = list(range(T))
    assert KeyScheme(**args, v_head_dim=VD).chunk_keys(toks) != KeyScheme(**args, v_head_dim=VD * 2).chunk_keys(toks)
    assert "v_heads=1|v_head_dim=8" in KeyScheme(**args, v_heads=VH, v_head_dim=VD).namespace


def test_k_and_v_of_different_shapes_round_trip(rt):
    kv = tutti.KvStore.open(rt)
    rng = np.random.default_rng(7)
    # 128 tokens x (32 + 8) x 4 B = 20 KiB per object: whole 4 KiB blocks.
    t = 128
    layers = [rng.standard_normal((2, t * (H * D + VH * VD)), dtype=np.float32) for _ in range(2)]
    src = ContiguousChunks(layers, kv_heads=H, chunk_tokens=t, head_dim=D, v_heads=VH, v_head_dim=VD)
    toks = list(range(2 * t + 3))
    with KvCacheClient(kv, src, "mla-shaped") as client:
        assert client.save(toks).stored_chunks == 2
    dst_bufs = [np.full_like(x, -1.0) for x in layers]
    dst = ContiguousChunks(dst_bufs, kv_heads=H, chunk_tokens=t, head_dim=D, v_heads=VH, v_head_dim=VD)
    with KvCacheClient(kv, dst, "mla-shaped") as client:
        res = client.load(toks)
        assert (res.cached_chunks, res.failures) == (2, [])
    for a, b in zip(layers, dst_bufs):
        assert np.array_equal(a, b)
    # A layout whose V differs in size finds nothing of it.
    other = ContiguousChunks([np.zeros((2, t * (H * D + VH * 2 * VD)), np.float32)], kv_heads=H, chunk_tokens=t, head_dim=D, v_heads=VH, v_head_dim=2 * VD)
    with KvCacheClient(kv, other, "mla-shaped") as client:
        assert client.lookup(toks) == 0
