"""PrefixCache over the attention kinds, with tiny random-weight
transformers models built from configs (float32; on CPU, and on CUDA
with ``execution: gpu`` where a GPU is present): what is exact
restores equal K/V and equal greedy generation; what is not is refused
with ``UnsupportedModel`` when the PrefixCache is built, before anything
is stored. Skips without torch and transformers (the refusal logic itself
is tested on plain configs in test_attention.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tutti  # noqa: E402
from conftest import MiB, one_drive_yaml  # noqa: E402
from tutti.engine import UnsupportedModel  # noqa: E402

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
# DeepSeek-V2/V3 with multi-head latent attention: the cache holds, per
# token and layer, a 32-wide latent (K) and an 8-wide rotary key (V) in
# transformers 5.x.
MLA = dict(
    COMMON,
    num_key_value_heads=4,
    kv_lora_rank=32,
    q_lora_rank=None,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
)


# The device of the running test (set by the ``device`` fixture): every
# test runs on CPU, and again on CUDA (models, prompts and the store's
# datapath on the GPU) where one is present.
_DEVICE = ["cpu"]


def _devices():
    gpu = torch.cuda.is_available()
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not gpu, reason="no CUDA GPU"))]


@pytest.fixture(params=_devices(), autouse=True)
def device(request):
    _DEVICE[0] = request.param
    yield request.param
    _DEVICE[0] = "cpu"


def build(name: str, **kw):
    """A tiny model of a transformers class pair, or skip where this
    transformers lacks it."""
    cfg_cls = getattr(transformers, name + "Config", None)
    model_cls = getattr(transformers, name + "ForCausalLM", None)
    if cfg_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    torch.manual_seed(1234)
    model = model_cls(cfg_cls(**kw)).to(dtype=torch.float32, device=_DEVICE[0])
    model.eval()
    return model


@pytest.fixture
def kv(device):
    """One emulated drive, 1 MiB slots; GPU-executed on CUDA."""
    if device == "cuda":
        with tutti.Runtime.from_yaml(one_drive_yaml(capacity="64MiB", execution="gpu")) as rt:
            yield tutti.KvStore.open(rt)
        return
    with tutti.Runtime.emulated(drives=1, drive_bytes=64 * MiB, slot_bytes=MiB) as rt:
        yield tutti.KvStore.open(rt)


def prompt(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (1, n), generator=g).to(_DEVICE[0])


def check_exact(model, kv, chunk: int) -> None:
    """Save a prompt's KV, restore it (K/V equal per layer), and generate
    greedily from the restored prefix (equal to generating from scratch)."""
    from tutti.integrations.transformers import PrefixCache, cache_of

    ids = prompt(3 * chunk + 5, seed=3)
    with torch.no_grad():
        scratch = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
        saved = cache_of(model(ids, use_cache=True))
    pc = PrefixCache(model, kv, model_id="tiny", chunk_tokens=chunk, max_tokens=8 * chunk)
    try:
        res = pc.save(ids, saved)
        assert (res.stored_chunks, res.failures) == (3, [])
        cache, info = pc.restore(ids)
        assert info.cached_tokens == 3 * chunk
        for layer in range(pc.num_layers):
            got, want = cache.layers[layer], saved.layers[layer]
            assert torch.equal(got.keys, want.keys[:, :, : 3 * chunk])
            assert torch.equal(got.values, want.values[:, :, : 3 * chunk])
        with torch.no_grad():
            out, info = pc.generate(ids, max_new_tokens=8, do_sample=False)
        assert info.cached_tokens == 3 * chunk
        assert torch.equal(out.sequences, scratch)
    finally:
        pc.close()


def check_refused(model, kv, feature: str) -> UnsupportedModel:
    from tutti.integrations.transformers import PrefixCache

    with pytest.raises(UnsupportedModel) as e:
        PrefixCache(model, kv, model_id="tiny", chunk_tokens=16, max_tokens=128)
    assert e.value.feature == feature, e.value
    assert kv.stats()["objects"] == 0
    return e.value


# Exact ---------------------------------------------------------------------------


def test_gqa_llama_is_accepted_and_keeps_its_keys(kv):
    from tutti.integrations.transformers import PrefixCache

    model = build("Llama", **COMMON)
    pc = PrefixCache(model, kv, model_id="tiny", chunk_tokens=16, max_tokens=128)
    s = pc.kv_shape
    assert (s.num_layers, s.kv_heads, s.head_dim, s.v_heads, s.v_head_dim) == (2, 2, 16, 2, 16)
    # K and V of one shape: the layout and key namespace of earlier releases.
    assert pc.layout.name == "chunk[2,h,t,d]" and "v_head_dim" not in pc.client.keys.namespace
    pc.close()
    check_exact(model, kv, chunk=16)


@pytest.mark.parametrize(
    "name,kw",
    [
        ("Qwen2", COMMON),  # GQA with q/k/v bias, window switched off
        ("GPTNeoX", {k: v for k, v in COMMON.items() if k != "num_key_value_heads"}),  # MHA, partial rotary
    ],
)
def test_other_full_attention_families_are_exact(kv, name, kw):
    check_exact(build(name, **kw), kv, chunk=16)


@pytest.mark.parametrize("name,extra", [("DeepseekV2", {}), ("DeepseekV3", {"q_lora_rank": 16, "n_group": 1, "topk_group": 1})])
def test_mla_stores_k_and_v_with_their_own_shapes(kv, name, extra):
    from tutti.integrations.transformers import PrefixCache

    model = build(name, **dict(MLA, **extra))
    pc = PrefixCache(model, kv, model_id="tiny", chunk_tokens=128, max_tokens=512)
    s = pc.kv_shape
    assert (s.kv_heads, s.head_dim) != (s.v_heads, s.v_head_dim), s
    assert "v_head_dim" in pc.client.keys.namespace
    pc.close()
    # 128 tokens: each object whole 4 KiB blocks whichever shapes are cached.
    check_exact(model, kv, chunk=128)


def test_window_no_shorter_than_the_context_is_exact(kv):
    # A 512-token window on a 512-position model never drops a token.
    model = build("Mistral", **dict(COMMON, sliding_window=512))
    check_exact(model, kv, chunk=16)


# Refused at construction -----------------------------------------------------------


def test_mistral_sliding_window_shorter_than_the_context_is_refused(kv):
    model = build("Mistral", **dict(COMMON, sliding_window=16))
    e = check_refused(model, kv, "sliding_window")
    assert "16-token window" in str(e) and "512 tokens" in str(e)


def test_gemma3_alternating_sliding_layers_are_refused(kv):
    cfg_cls = getattr(transformers, "Gemma3TextConfig", None)
    if cfg_cls is None:
        pytest.skip("no Gemma3TextConfig")
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(cfg_cls(**dict(COMMON, head_dim=16, sliding_window=16, num_hidden_layers=3))).to(_DEVICE[0]).eval()
    check_refused(model, kv, "sliding_window")


def test_gpt_oss_sliding_layers_are_refused(kv):
    model = build("GptOss", **dict(COMMON, head_dim=16, sliding_window=16, num_local_experts=4, num_experts_per_tok=2))
    check_refused(model, kv, "sliding_window")


def test_hybrid_models_are_refused(kv):
    qwen3_next = build(
        "Qwen3Next",
        **dict(
            COMMON,
            num_hidden_layers=4,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            linear_num_value_heads=2,
            linear_num_key_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
        ),
    )
    e = check_refused(qwen3_next, kv, "hybrid")
    assert "layers [0, 1, 2] of 4 are linear_attention" in str(e)
    jamba = build(
        "Jamba",
        **dict(
            COMMON,
            num_experts=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=2,
            expert_layer_offset=1,
            mamba_d_state=4,
            mamba_d_conv=2,
            mamba_expand=2,
            mamba_dt_rank=4,
        ),
    )
    check_refused(jamba, kv, "hybrid")


def test_a_cache_of_another_shape_is_refused_before_anything_is_stored(kv):
    from tutti.integrations.transformers import PrefixCache, cache_of

    model = build("Llama", **COMMON)
    other = build("Llama", **dict(COMMON, num_key_value_heads=4))
    ids = prompt(2 * 16 + 1, seed=5)
    with torch.no_grad():
        wrong = cache_of(other(ids, use_cache=True))
    pc = PrefixCache(model, kv, model_id="tiny", chunk_tokens=16, max_tokens=128)
    with pytest.raises(ValueError, match=r"layer 0's K is \(1, 4, 33, 16\)"):
        pc.save(ids, wrong)
    assert kv.stats()["objects"] == 0 and pc.lookup(ids) == 0
    pc.close()
