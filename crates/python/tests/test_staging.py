"""tutti.engine.StagingStore on an emulated drive (staging forced with
``staging_bytes``; the daemon-drive case, where the store refuses the
tensors, is test_vllm_daemon.py). What each test proves is in its
docstring."""

from __future__ import annotations

from typing import List

import numpy as np
import pytest

import tutti
from conftest import one_drive_yaml
from tutti.engine import ContiguousChunks, KvCacheClient, StagingStore

LAYERS, CT, H, D, SLOTS = 4, 16, 2, 64, 6
OBJ = CT * 2 * H * D * 4  # one (chunk, layer) object: 16 KiB
MODEL = "test/staging"


def tensors(fill: float = None, seed: int = 1) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    if fill is None:
        return [rng.standard_normal((SLOTS, OBJ // 4)).astype(np.float32) for _ in range(LAYERS)]
    return [np.full((SLOTS, OBJ // 4), fill, np.float32) for _ in range(LAYERS)]


def client(kv, ts, staging_bytes) -> KvCacheClient:
    return KvCacheClient(kv, ContiguousChunks(ts, kv_heads=H, chunk_tokens=CT, head_dim=D), MODEL, staging_bytes=staging_bytes)


@pytest.mark.parametrize("order", ["in_order", "reverse"])
def test_batches_larger_than_the_buffer_share_it_without_deadlock(order):
    """A staging buffer of two objects, every layer's load issued before any
    is waited on (so later layers' batches hold no room, or all of it):
    waiting in layer order or in reverse finishes every batch (a wait with
    no free slot finishes other batches' rounds), and every byte equals the
    saved bytes; the buffer is all free afterwards."""
    rt = tutti.Runtime.from_yaml(one_drive_yaml())
    try:
        kv = tutti.KvStore.open(rt)
        src, dst = tensors(), tensors(-1.0)
        toks = list(range(5 * CT + 1))
        save = client(kv, src, 2 * OBJ)
        assert save.save(toks).stored_chunks == 5
        load = client(kv, dst, 2 * OBJ)
        assert isinstance(load.staging, StagingStore) and load.staging.round_bytes == OBJ
        ld = load.start_load(toks)
        for layer in range(LAYERS):
            ld.start_layer(layer)
        for layer in range(LAYERS) if order == "in_order" else reversed(range(LAYERS)):
            assert ld.wait_layer(layer) == 5
        assert ld.result().cached_chunks == 5
        for layer in range(LAYERS):
            assert np.array_equal(dst[layer][:5], src[layer][:5])
            assert (dst[layer][5:] == -1.0).all()
        assert load.staging.slots.free == [[0, 2 * OBJ]] and not load.staging.inflight
        assert load.staging.copied_bytes == 5 * LAYERS * OBJ
        save.close()
        load.close()
    finally:
        rt.shutdown()


def test_staging_with_registered_memory_and_sizes():
    """staging_bytes smaller than one object is refused; a StagingStore
    passes the store's other methods through (lookup_prefix, contains,
    stats, key_size); its batch of a miss leaves the destination as it was;
    get_sync/put_sync round-trip a 4 KiB object."""
    rt = tutti.Runtime.from_yaml(one_drive_yaml())
    try:
        kv = tutti.KvStore.open(rt)
        with pytest.raises(ValueError, match="less than one object"):
            client(kv, tensors(0.0), OBJ // 2)
        st = StagingStore(kv, 3 * 4096)
        assert st.key_size == kv.key_size and st.stats()["object_size"] == kv.stats()["object_size"]
        a = np.arange(2048, dtype=np.float32)
        b = np.full(2048, 5.0, np.float32)
        ma, mb = st.register(a), st.register(b)
        key = bytes(range(32))[: kv.key_size]
        assert [s.kind for s in st.put_sync([(key, ma, 4096, 4096)], 5.0)] == ["ok"]
        assert st.contains([key]) == [True] and st.lookup_prefix([key]) == 1
        other = bytes(32 - i for i in range(32))[: kv.key_size]
        assert [s.kind for s in st.get_sync([(other, mb, 0, 4096), (key, mb, 4096, 4096)], 5.0)] == ["miss", "hit"]
        assert (b[:1024] == 5.0).all() and np.array_equal(b[1024:], a[1024:])
        st.unregister(ma)
        st.unregister(mb)
        st.close()
        assert st.memory is None
    finally:
        rt.shutdown()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_tensors_are_staged(device):
    """torch tensors, on CPU and on CUDA (the copies are torch copies,
    device to host and back for CUDA): save and load through a one-object
    buffer, bytes equal."""
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    rt = tutti.Runtime.from_yaml(one_drive_yaml())
    try:
        kv = tutti.KvStore.open(rt)
        g = torch.Generator().manual_seed(3)
        src = [torch.randn((SLOTS, OBJ // 4), generator=g).to(device) for _ in range(LAYERS)]
        dst = [torch.zeros_like(t) for t in src]
        toks = list(range(3 * CT))
        assert client(kv, src, OBJ).save(toks).stored_chunks == 3
        assert client(kv, dst, OBJ).load(toks).cached_chunks == 3
        for s, d in zip(src, dst):
            assert torch.equal(s[:3], d[:3]) and not d[3:].any()
    finally:
        rt.shutdown()
