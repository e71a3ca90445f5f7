"""tutti.engine over torch tensors: vLLM's paged layouts and separate K/V in
bfloat16, saved and loaded bit-exact through the engine core, on CPU
tensors (host memory) and, where a GPU is present, CUDA tensors with a
runtime whose datapath has `execution: gpu`. Skipped without torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tutti  # noqa: E402
from conftest import one_drive_yaml  # noqa: E402
from tutti.engine import BlockMajorPagedKV, KvCacheClient, PagedKV, StackedPagedKV  # noqa: E402

# 4 layers, 2 KV heads of 128 in bf16: a 16-token block is 8 KiB of K.
LAYERS, HEADS, DIM, BS, CT, NB = 4, 2, 128, 16, 32, 20


def devices():
    gpu = torch.cuda.is_available()
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not gpu, reason="no CUDA GPU")),
    ]


def runtime_for(device: str):
    yaml = one_drive_yaml(capacity="64MiB", execution="gpu" if device == "cuda" else "cpu")
    try:
        return tutti.Runtime.from_yaml(yaml)
    except tutti.GpuError as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"the runtime cannot drive this GPU: {e}")


def tensors(kind: str, device: str, seed: int, fill: bool):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def t(shape):
        x = torch.randn(shape, generator=g, dtype=torch.float32) if fill else torch.full(shape, -3.5)
        return x.to(dtype=torch.bfloat16, device=device)

    if kind == "paged":
        return {"k": [t((NB, BS, HEADS, DIM)) for _ in range(LAYERS)], "v": [t((NB, BS, HEADS, DIM)) for _ in range(LAYERS)]}
    if kind == "stacked":
        return {"kv": [t((2, NB, BS, HEADS, DIM)) for _ in range(LAYERS)]}
    return {"kv": [t((NB, 2, BS, HEADS, DIM)) for _ in range(LAYERS)]}


def layout(kind: str, ts):
    if kind == "paged":
        return PagedKV(ts["k"], ts["v"], CT)
    if kind == "stacked":
        return StackedPagedKV(ts["kv"], CT)
    return BlockMajorPagedKV(ts["kv"], CT)


def token_kv(kind: str, ts, layer: int, tok: int, table):
    b, o = table[tok // BS], tok % BS
    if kind == "paged":
        return ts["k"][layer][b, o], ts["v"][layer][b, o]
    if kind == "stacked":
        return ts["kv"][layer][0, b, o], ts["kv"][layer][1, b, o]
    return ts["kv"][layer][b, 0, o], ts["kv"][layer][b, 1, o]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kind", ["paged", "stacked", "block_major"])
def test_paged_bf16_round_trip(device, kind):
    chunks = 3
    tokens = list(range(1000, 1000 + chunks * CT + 9))
    src_table = [7, 2, 19, 0, 11, 5, 3]
    dst_table = [1, 4, 6, 8, 9, 10, 12]
    src = tensors(kind, device, 1, True)
    dst = tensors(kind, device, 2, False)
    with runtime_for(device) as rt:
        kv = tutti.KvStore.open(rt)
        with KvCacheClient(kv, layout(kind, src), "test/bf16", timeout=30.0) as c:
            assert c.keys.dtype == "bfloat16"
            res = c.save(tokens, src_table)
            assert (res.stored_chunks, res.failures) == (chunks, [])
        with KvCacheClient(kv, layout(kind, dst), "test/bf16", timeout=30.0) as c:
            r = c.load(tokens, dst_table)
            assert (r.cached_tokens, r.failures) == (chunks * CT, [])
        for layer in range(LAYERS):
            for tok in range(chunks * CT):
                ks, vs = token_kv(kind, src, layer, tok, src_table)
                kd, vd = token_kv(kind, dst, layer, tok, dst_table)
                assert torch.equal(ks, kd) and torch.equal(vs, vd), (layer, tok)
        # Blocks outside the destination's table were not written.
        used = set(dst_table[: chunks * CT // BS])
        for b in range(NB):
            if b not in used:
                kd, _ = token_kv(kind, dst, 0, 0, [b])
                assert bool((kd == -3.5).all()), b
