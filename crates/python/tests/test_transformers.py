"""tutti.integrations.transformers: a prefix cache for transformers'
generate, with a tiny random-weight Llama (float32). Runs on CPU (host
memory runtime) wherever torch and transformers import, and on CUDA (GPU
runtime, execution: gpu) where a GPU is present; skips otherwise."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tutti  # noqa: E402
from conftest import MiB, one_drive_yaml  # noqa: E402

CHUNK = 16


def tiny_llama(device: str):
    torch.manual_seed(1234)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=torch.float32)
    model.eval()
    return model


def devices():
    out = [pytest.param("cpu", id="cpu")]
    gpu = torch.cuda.is_available()
    out.append(pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not gpu, reason="no CUDA GPU")))
    return out


# Seconds per wait: a GPU runtime's first batches load its kernels.
TIMEOUT = 30.0


def runtime_for(device: str, tmp_path=None):
    """One emulated drive (RAM, or a file under tmp_path); GPU execution
    for a CUDA model. Skips when the runtime cannot drive this GPU."""
    backing = "ram" if tmp_path is None else "{ file: " + str(tmp_path / "d0.img") + " }"
    yaml = one_drive_yaml(backing=backing, capacity="64MiB", execution="gpu" if device == "cuda" else "cpu")
    try:
        return tutti.Runtime.from_yaml(yaml)
    except tutti.GpuError as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"the runtime cannot drive this GPU: {e}")


def prompt(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (1, n), generator=g)


@pytest.mark.parametrize("device", devices())
def test_restored_kv_equals_saved_kv_per_layer(device):
    from tutti.integrations.transformers import PrefixCache, cache_of

    model = tiny_llama(device)
    ids = prompt(3 * CHUNK + 5, seed=1).to(device)
    with runtime_for(device) as rt:
        kv = tutti.KvStore.open(rt)
        pc = PrefixCache(model, kv, model_id="tiny-llama-seed1234", chunk_tokens=CHUNK, max_tokens=8 * CHUNK, timeout=TIMEOUT)
        with torch.no_grad():
            out = model(ids, use_cache=True)
        saved = cache_of(out)
        res = pc.save(ids, saved)
        assert (res.stored_chunks, res.failures) == (3, [])
        assert pc.lookup(ids) == 3 * CHUNK
        # A new prompt sharing the first 2 chunks and then diverging.
        other = torch.cat([ids[:, : 2 * CHUNK], prompt(CHUNK + 3, seed=2).to(device)], dim=1)
        cache, info = pc.restore(other)
        assert info.cached_tokens == 2 * CHUNK and cache is not None
        assert cache.get_seq_length() == 2 * CHUNK
        for layer in range(model.config.num_hidden_layers):
            k, v = cache.layers[layer].keys, cache.layers[layer].values
            assert k.device.type == device and k.dtype == torch.float32
            assert torch.equal(k, saved.layers[layer].keys[:, :, : 2 * CHUNK, :])
            assert torch.equal(v, saved.layers[layer].values[:, :, : 2 * CHUNK, :])
        # The whole prompt: all 3 chunks restored (the 5 trailing tokens are prefilled).
        cache, info = pc.restore(ids)
        assert info.cached_tokens == 3 * CHUNK
        for layer in range(model.config.num_hidden_layers):
            assert torch.equal(cache.layers[layer].keys, saved.layers[layer].keys[:, :, : 3 * CHUNK, :])
        # Another model id never sees these chunks.
        other_pc = PrefixCache(model, kv, model_id="another-model", chunk_tokens=CHUNK, max_tokens=8 * CHUNK, timeout=TIMEOUT)
        assert other_pc.lookup(ids) == 0
        pc.close()
        other_pc.close()


@pytest.mark.parametrize("device", devices())
def test_greedy_generation_with_restored_prefix_matches_scratch(device):
    from tutti.integrations.transformers import PrefixCache, cache_of

    model = tiny_llama(device)
    ids = prompt(4 * CHUNK + 7, seed=3).to(device)
    with torch.no_grad():
        scratch = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    with runtime_for(device) as rt:
        kv = tutti.KvStore.open(rt)
        pc = PrefixCache(model, kv, model_id="tiny-llama-seed1234", chunk_tokens=CHUNK, max_tokens=8 * CHUNK, timeout=TIMEOUT)
        with torch.no_grad():
            first, info1 = pc.generate(ids, max_new_tokens=12, do_sample=False)
            assert info1.cached_tokens == 0 and info1.saved.stored_chunks == 4
            second, info2 = pc.generate(ids, max_new_tokens=12, do_sample=False)
        assert info2.cached_tokens == 4 * CHUNK and info2.saved.put_objects == 0
        assert torch.equal(first.sequences, scratch)
        assert torch.equal(second.sequences, scratch)
        pc.close()


@pytest.mark.parametrize("device", devices())
def test_second_runtime_over_file_backed_drive_reuses_the_prefix(device, tmp_path):
    from tutti.integrations.transformers import PrefixCache, cache_of

    model = tiny_llama(device)
    ids = prompt(2 * CHUNK + 1, seed=4).to(device)
    with runtime_for(device, tmp_path) as rt:
        kv = tutti.KvStore.open(rt)
        pc = PrefixCache(model, kv, model_id="tiny-llama-seed1234", chunk_tokens=CHUNK, max_tokens=4 * CHUNK, timeout=TIMEOUT)
        with torch.no_grad():
            saved = cache_of(model(ids, use_cache=True))
        assert pc.save(ids, saved).stored_chunks == 2
        pc.close()
        del pc, kv
    with runtime_for(device, tmp_path) as rt:
        kv = tutti.KvStore.open(rt, create="never")
        pc = PrefixCache(model, kv, model_id="tiny-llama-seed1234", chunk_tokens=CHUNK, max_tokens=4 * CHUNK, timeout=TIMEOUT)
        cache, info = pc.restore(ids)
        assert info.cached_tokens == 2 * CHUNK
        for layer in range(model.config.num_hidden_layers):
            assert torch.equal(cache.layers[layer].values, saved.layers[layer].values[:, :, : 2 * CHUNK, :])
        pc.close()


def test_missing_chunk_is_recomputed_not_used():
    from tutti.integrations.transformers import PrefixCache, cache_of

    model = tiny_llama("cpu")
    ids = prompt(3 * CHUNK + 2, seed=5)
    with runtime_for("cpu") as rt:
        kv = tutti.KvStore.open(rt)
        pc = PrefixCache(model, kv, model_id="tiny-llama-seed1234", chunk_tokens=CHUNK, max_tokens=8 * CHUNK, timeout=TIMEOUT)
        with torch.no_grad():
            saved = cache_of(model(ids, use_cache=True))
        assert pc.save(ids, saved).stored_chunks == 3
        ck = pc.client.chunk_keys(ids[0].tolist())[1]
        kv.remove(pc.client.keys.layer_keys(ck, 1))
        cache, info = pc.restore(ids)
        assert info.cached_tokens == CHUNK, "chunk 1 lost layer 1: only chunk 0 is usable"
        assert cache.get_seq_length() == CHUNK
        with torch.no_grad():
            scratch = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
            out, info = pc.generate(ids, max_new_tokens=6, do_sample=False)
        assert info.cached_tokens == CHUNK and info.saved.put_objects == 1
        assert torch.equal(out.sequences, scratch)
        pc.close()


def test_model_without_a_name_needs_a_model_id():
    from tutti.integrations.transformers import PrefixCache, cache_of

    model = tiny_llama("cpu")
    with tutti.Runtime.emulated(drives=2, drive_bytes=32 * MiB) as rt:
        kv = tutti.KvStore.open(rt)
        with pytest.raises(ValueError, match="model_id"):
            PrefixCache(model, kv, chunk_tokens=CHUNK)
