"""tutti.engine: chunking, keys, layout plans, save/load round trips,
per-layer overlap order, failure handling and restart, on host memory
(numpy) and emulated drives."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

import tutti
from conftest import MiB, one_drive_yaml
from tutti.engine import (
    LAYER_TAG,
    BlockMajorPagedKV,
    Chunking,
    ContiguousChunks,
    KeyScheme,
    KvCacheClient,
    ObjectTooLargeError,
    PagedKV,
    StackedPagedKV,
)

# A small model: 3 layers, 2 KV heads of 64 float32 -> 512 B of K (and of
# V) per token and layer. Blocks of 8 tokens are 4 KiB; chunks of 16
# tokens are 2 blocks, 16 KiB of K and V per layer.
LAYERS, HEADS, DIM, BS, CT = 3, 2, 64, 8, 16
NBLOCKS = 24
MODEL = "test/tiny"


def kv_data(shape: Tuple[int, ...], seed: int) -> np.ndarray:
    """Random float32 (no two equal with high probability)."""
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def poison(shape: Tuple[int, ...]) -> np.ndarray:
    return np.full(shape, np.float32(-7.25), dtype=np.float32)


# Engines' tensors per layout, and how to read K/V of token t of a request
# with block table (or slot list) `place` out of them.
def make_tensors(kind: str, fill: Callable[[Tuple[int, ...], int], np.ndarray]) -> Dict[str, Any]:
    if kind == "paged":
        k = [fill((NBLOCKS, BS, HEADS, DIM), 10 + i) for i in range(LAYERS)]
        v = [fill((NBLOCKS, BS, HEADS, DIM), 20 + i) for i in range(LAYERS)]
        return {"k": k, "v": v}
    if kind == "stacked":
        return {"kv": [fill((2, NBLOCKS, BS, HEADS, DIM), 30 + i) for i in range(LAYERS)]}
    if kind == "block_major":
        return {"kv": [fill((NBLOCKS, 2, BS, HEADS, DIM), 40 + i) for i in range(LAYERS)]}
    if kind == "contiguous":
        return {"kv": [fill((6, 2, HEADS, CT, DIM), 50 + i) for i in range(LAYERS)]}
    raise AssertionError(kind)


def make_layout(kind: str, t: Dict[str, Any]):
    if kind == "paged":
        return PagedKV(t["k"], t["v"], CT)
    if kind == "stacked":
        return StackedPagedKV(t["kv"], CT)
    if kind == "block_major":
        return BlockMajorPagedKV(t["kv"], CT)
    return ContiguousChunks(t["kv"])


def token_kv(kind: str, t: Dict[str, Any], layer: int, tok: int, place) -> Tuple[np.ndarray, np.ndarray]:
    """K and V ([HEADS, DIM]) of token `tok` of a request in `layer`,
    read by numpy indexing (independent of the plans)."""
    if kind == "contiguous":
        slot = tok // CT if place is None else place[tok // CT]
        return t["kv"][layer][slot, 0, :, tok % CT, :], t["kv"][layer][slot, 1, :, tok % CT, :]
    b, o = place[tok // BS], tok % BS
    if kind == "paged":
        return t["k"][layer][b, o], t["v"][layer][b, o]
    if kind == "stacked":
        return t["kv"][layer][0, b, o], t["kv"][layer][1, b, o]
    return t["kv"][layer][b, 0, o], t["kv"][layer][b, 1, o]


KINDS = ["paged", "stacked", "block_major", "contiguous"]


def placement(kind: str, seed: int, chunks: int):
    """A shuffled block table (paged) or slot list (contiguous)."""
    rng = np.random.default_rng(seed)
    if kind == "contiguous":
        return [int(x) for x in rng.permutation(6)[:chunks]]
    return [int(x) for x in rng.permutation(NBLOCKS)[: chunks * (CT // BS) + 1]]


def prompt(n: int, seed: int = 0) -> List[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 50000, n)]


# Chunking -----------------------------------------------------------------


def test_chunking_whole_chunks_only():
    c = Chunking(16)
    toks = list(range(40))
    assert c.whole_chunks(40) == 2 and c.remainder(40) == 8
    assert c.split(toks) == [list(range(16)), list(range(16, 32))]
    assert c.span(2) == (32, 48) and c.tokens_of(3) == 48
    assert c.split(toks[:15]) == [] and c.whole_chunks(0) == 0
    for bad in (0, -1):
        with pytest.raises(ValueError):
            Chunking(bad)
    with pytest.raises(ValueError):
        c.whole_chunks(-1)


# Keys ---------------------------------------------------------------------


def scheme(**kw) -> KeyScheme:
    args = dict(model=MODEL, dtype="float32", num_layers=LAYERS, kv_heads=HEADS, head_dim=DIM, layout="L", chunk_tokens=CT, segments=2)
    args.update(kw)
    return KeyScheme(**args)


def test_keys_prefix_property_and_derivation():
    s = scheme()
    toks = prompt(5 * CT + 3)
    cks = s.chunk_keys(toks)
    assert len(cks) == 5, "the partial chunk has no key"
    assert cks == tutti.ChunkKeys(s.namespace.encode()).chain(toks, CT)
    assert s.chunk_keys(toks[: 3 * CT]) == cks[:3], "a prefix's keys are a prefix"
    changed = list(toks)
    changed[2 * CT + 1] += 1
    kc = s.chunk_keys(changed)
    assert kc[:2] == cks[:2] and all(a != b for a, b in zip(kc[2:], cks[2:]))
    # Object keys: the documented derivation, all distinct, none a chunk key.
    objs = [s.object_key(ck, layer, seg) for ck in cks for layer in range(LAYERS) for seg in range(2)]
    assert objs[1] == tutti.ChunkKeys(s.namespace.encode()).next(cks[0], [LAYER_TAG, 0, 1] + [0] * (CT - 2))
    assert len(set(objs)) == len(objs) == 5 * LAYERS * 2
    assert not set(objs) & set(cks)
    assert s.chunk_object_keys(cks[1]) == objs[LAYERS * 2 : 2 * LAYERS * 2]
    assert [s.object_key(ck, 1, 0) for ck in kc[2:]] != [s.object_key(ck, 1, 0) for ck in cks[2:]]
    with pytest.raises(ValueError):
        s.object_key(cks[0], LAYERS, 0)
    with pytest.raises(ValueError):
        s.object_key(cks[0], 0, 2)
    # chunk_tokens of 1 still keeps object and chunk inputs apart (3 words vs 1).
    one = scheme(chunk_tokens=1)
    assert one.object_key(one.chunk_keys([5])[0], 0, 0) not in one.chunk_keys([5, LAYER_TAG])


def test_keys_namespace_separates_models_dtypes_layouts_chunk_sizes():
    toks = prompt(4 * CT)
    base = scheme().chunk_keys(toks)
    assert scheme().chunk_keys(toks) == base, "deterministic"
    for kw in (
        {"model": "test/other"},
        {"dtype": "bfloat16"},
        {"layout": "M"},
        {"num_layers": LAYERS + 1},
        {"kv_heads": 4},
        {"head_dim": 128},
        {"segments": 1},
    ):
        other = scheme(**kw).chunk_keys(toks)
        assert not set(other) & set(base), kw
    assert not set(scheme(chunk_tokens=2 * CT).chunk_keys(toks)) & set(base)
    assert scheme(key_size=16).chunk_keys(toks)[0] == base[0][:16]
    with pytest.raises(ValueError):
        scheme(key_size=20)


# Plans ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_plan_names_exactly_the_chunks_bytes(kind):
    t = make_tensors(kind, kv_data)
    lay = make_layout(kind, t)
    chunks = 3
    place = placement(kind, 1, chunks)
    lay.check_placement(place, chunks)
    assert lay.num_layers == LAYERS and (lay.kv_heads, lay.head_dim, lay.itemsize) == (HEADS, DIM, 4)
    assert lay.layer_chunk_bytes == 2 * CT * HEADS * DIM * 4
    raw = [x.view(np.uint8).reshape(-1) for x in lay.tensors]
    for layer in range(LAYERS):
        for c in range(chunks):
            rs = lay.ranges(layer, c, place)
            assert len(rs) == lay.segments and all(r.length == lay.segment_bytes for r in rs)
            got = b"".join(raw[r.tensor][r.offset : r.offset + r.length].tobytes() for r in rs)
            assert len(got) == lay.layer_chunk_bytes
            toks = range(c * CT, (c + 1) * CT)
            kv = [token_kv(kind, t, layer, tok, place) for tok in toks]
            if kind == "contiguous":  # [2, h, t, d]
                want = np.stack([np.stack([k for k, _ in kv], 1), np.stack([v for _, v in kv], 1)])
            elif kind == "block_major":  # per block: K of its tokens, then V
                want = np.concatenate(
                    [np.stack([np.stack([k for k, _ in kv[j : j + BS]]), np.stack([v for _, v in kv[j : j + BS]])]).reshape(-1) for j in range(0, CT, BS)]
                )
            else:  # K of every token of the chunk, then V
                want = np.concatenate([np.stack([k for k, _ in kv]).reshape(-1), np.stack([v for _, v in kv]).reshape(-1)])
            assert got == want.tobytes(), (kind, layer, c)


def test_plan_checks():
    t = make_tensors("paged", kv_data)
    lay = PagedKV(t["k"], t["v"], CT)
    with pytest.raises(ValueError, match="block table"):
        lay.check_placement([0, 1, 2], 2)
    with pytest.raises(ValueError, match="out of range"):
        lay.check_placement([0, NBLOCKS], 1)
    with pytest.raises(ValueError, match="multiple of block_size"):
        PagedKV(t["k"], t["v"], 12)
    with pytest.raises(ValueError, match="differs"):
        PagedKV(t["k"], t["v"][:-1] + [t["v"][0][:, :4].copy()], CT)
    with pytest.raises(ValueError, match="not contiguous"):
        StackedPagedKV([np.zeros((2, 4, BS, HEADS, DIM), np.float32).transpose(0, 1, 3, 2, 4)], CT)
    with pytest.raises(ValueError, match="first dimension must be 2"):
        StackedPagedKV([np.zeros((3, 4, BS, HEADS, DIM), np.float32)], CT)
    c = ContiguousChunks(make_tensors("contiguous", kv_data)["kv"])
    with pytest.raises(ValueError, match="share a slot"):
        c.check_placement([1, 1], 2)
    with pytest.raises(ValueError, match="out of range"):
        c.check_placement([6], 1)


def test_objects_must_fit_the_slot_and_whole_blocks(rt):
    kv = tutti.KvStore.open(rt)
    # 1 MiB slots: a contiguous chunk of 8 KV heads x 128 x 2 B (4 KiB per
    # token and layer, Llama-3-8B in bf16 as uint16 here) fits at 256 tokens...
    ok = ContiguousChunks([np.zeros((1, 2, 8, 256, 128), np.uint16)])
    KvCacheClient(kv, ok, "llama-3-8b-shape").close()
    # ...but not at 512 (2 MiB per layer).
    big = ContiguousChunks([np.zeros((1, 2, 8, 512, 128), np.uint16)])
    with pytest.raises(ObjectTooLargeError, match=r"2097152 bytes .* at most 1048576"):
        KvCacheClient(kv, big, "llama-3-8b-shape")
    odd = ContiguousChunks([np.zeros((1, 2, 1, 3, 100), np.float32)])
    with pytest.raises(ObjectTooLargeError, match="logical block"):
        KvCacheClient(kv, odd, "odd")


def test_an_object_much_smaller_than_the_slot_is_warned_about(rt, caplog):
    """vLLM's 16-token paged blocks (64 KiB objects) in 1 MiB slots (the
    first vLLM run on the H200) fill the store after 1/16 of its bytes:
    say so up front."""
    kv = tutti.KvStore.open(rt)
    small = ContiguousChunks([np.zeros((1, 2, 8, 16, 128), np.uint16)])  # 32 KiB per layer and chunk
    with caplog.at_level("WARNING", logger="tutti.engine"):
        KvCacheClient(kv, small, "small").close()
    assert "65536 bytes but takes a whole 1048576-byte slot" in caplog.text
    assert "94% of the store's capacity stays unused" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="tutti.engine"):
        KvCacheClient(kv, ContiguousChunks([np.zeros((1, 2, 8, 256, 128), np.uint16)]), "fits").close()
    assert "slot" not in caplog.text


class _RefusingStore:
    """A KvStore whose unregister refuses one memory, as the runtime does
    for memory a timed-out request still pins."""

    def __init__(self, kv, refuse_first: int):
        self._kv, self.refuse, self.calls = kv, refuse_first, 0

    def __getattr__(self, name):
        return getattr(self._kv, name)

    def unregister(self, m):
        self.calls += 1
        if self.refuse > 0:
            self.refuse -= 1
            raise tutti.MemoryRegistrationError("memory region is in use by 1 operation(s)")
        self._kv.unregister(m)


def test_close_tries_every_tensor_and_raises_the_refusal_after_them(rt):
    kv = tutti.KvStore.open(rt)
    t = make_tensors("paged", kv_data)
    store = _RefusingStore(kv, refuse_first=1)
    client = KvCacheClient(store, make_layout("paged", t), MODEL)
    n = len(client._memories)
    assert n == 2 * LAYERS
    with pytest.raises(tutti.MemoryRegistrationError, match="in use"):
        client.close()
    assert store.calls == n, "every tensor was tried"
    assert len(client._memories) == 1, "the refused one stays registered"
    client.close()  # the pin is gone: closing again unregisters it
    assert client._memories == [] and store.calls == n + 1


# Round trips ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_save_then_load_round_trip_bit_exact(rt, kind):
    kv = tutti.KvStore.open(rt)
    src = make_tensors(kind, kv_data)
    chunks = 3
    toks = prompt(chunks * CT + 5, seed=2)
    src_place = placement(kind, 3, chunks)
    with KvCacheClient(kv, make_layout(kind, src), MODEL) as client:
        assert client.lookup(toks) == 0
        res = client.save(toks, src_place)
        assert (res.stored_chunks, res.stored_tokens, res.failures) == (chunks, chunks * CT, [])
        assert res.put_objects == chunks * LAYERS * make_layout(kind, src).segments
        assert client.lookup(toks) == chunks * CT
        assert client.lookup(toks[: 2 * CT + 3]) == 2 * CT
        again = client.save(toks, src_place)
        assert (again.put_objects, again.skipped_objects, again.stored_chunks) == (0, res.put_objects, chunks)
    dst = make_tensors(kind, lambda shape, seed: poison(shape))
    dst_place = placement(kind, 4, chunks)
    with KvCacheClient(kv, make_layout(kind, dst), MODEL) as client:
        r = client.load(toks + [1, 2, 3], dst_place)
        assert (r.found_chunks, r.cached_chunks, r.cached_tokens, r.failures) == (chunks, chunks, chunks * CT, [])
        for layer in range(LAYERS):
            for tok in range(chunks * CT):
                ks, vs = token_kv(kind, src, layer, tok, src_place)
                kd, vd = token_kv(kind, dst, layer, tok, dst_place)
                assert ks.tobytes() == kd.tobytes() and vs.tobytes() == vd.tobytes()
        # Nothing outside the plan was written.
        written = sum(int(np.count_nonzero(x != np.float32(-7.25))) for x in make_layout(kind, dst).tensors)
        assert written == chunks * LAYERS * CT * HEADS * DIM * 2


def test_partial_chunks_and_other_prompts(rt):
    kv = tutti.KvStore.open(rt)
    src = make_tensors("contiguous", kv_data)
    with KvCacheClient(kv, ContiguousChunks(src["kv"]), MODEL) as client:
        toks = prompt(2 * CT + CT // 2, seed=5)
        assert client.save(toks).stored_chunks == 2, "the trailing half chunk is not saved"
        assert client.lookup(toks + prompt(CT, seed=6)) == 2 * CT
        other = list(toks)
        other[CT + 3] += 1
        assert client.lookup(other) == CT, "a changed token ends the prefix at its chunk"
        assert client.lookup(toks[: CT - 1]) == 0
        # The same tokens under another model id are not found.
    with KvCacheClient(kv, ContiguousChunks(src["kv"]), "test/other-weights") as client:
        assert client.lookup(toks) == 0


# Overlap order -------------------------------------------------------------


class RecordingStore:
    """A KvStore proxy that records get batches and waits by layer."""

    def __init__(self, store: tutti.KvStore, events: List[Tuple[str, int]]) -> None:
        self._store = store
        self.events = events
        self.layer_of: Dict[bytes, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @property
    def key_size(self) -> int:
        return self._store.key_size

    def get(self, items):
        layers = {self.layer_of[it[0]] for it in items}
        assert len(layers) == 1, "one batch holds one layer"
        layer = layers.pop()
        self.events.append(("get", layer))
        batch = self._store.get(items)
        events = self.events

        class Batch:
            def wait(self, timeout: float = 5.0):
                st = batch.wait(timeout)
                events.append(("waited", layer))
                return st

        return Batch()


def test_load_overlaps_layer_l_plus_1_with_layer_l(rt):
    kv = tutti.KvStore.open(rt)
    src = make_tensors("paged", kv_data)
    toks = prompt(2 * CT, seed=7)
    place = placement("paged", 8, 2)
    with KvCacheClient(kv, PagedKV(src["k"], src["v"], CT), MODEL) as c:
        assert c.save(toks, place).stored_chunks == 2
    events: List[Tuple[str, int]] = []
    rec = RecordingStore(kv, events)
    dst = make_tensors("paged", lambda s, seed: poison(s))
    client = KvCacheClient(rec, PagedKV(dst["k"], dst["v"], CT), MODEL)
    for ck in client.chunk_keys(toks):
        for layer in range(LAYERS):
            for k in client.keys.layer_keys(ck, layer):
                rec.layer_of[k] = layer

    def compute(layer: int) -> None:
        # While layer `layer` computes, the next layer's gets are issued.
        events.append(("compute", layer))
        k, _ = token_kv("paged", dst, layer, 5, place)
        assert k.tobytes() == token_kv("paged", src, layer, 5, place)[0].tobytes(), "layer loaded before compute"

    r = client.load(toks, place, on_layer=compute)
    assert r.cached_tokens == 2 * CT
    # PagedKV: two tensors (K, V) per layer, one batch each.
    want: List[Tuple[str, int]] = [("get", 0), ("get", 0)]
    for layer in range(LAYERS):
        if layer + 1 < LAYERS:
            want += [("get", layer + 1), ("get", layer + 1)]
        want += [("waited", layer), ("waited", layer), ("compute", layer)]
    assert events == want
    client.close()


class RecordingPutStore(RecordingStore):
    """A KvStore proxy that records put batches and their waits by layer."""

    def put(self, items):
        layer = self.layer_of[items[0][0]]
        self.events.append(("put", layer))
        batch = self._store.put(items)
        events = self.events

        class Batch:
            def wait(self, timeout: float = 5.0):
                st = batch.wait(timeout)
                events.append(("put_waited", layer))
                return st

        return Batch()


@pytest.mark.parametrize("in_flight", [None, 1, 2])
def test_save_bounds_the_layers_in_flight(rt, in_flight):
    kv = tutti.KvStore.open(rt)
    src = make_tensors("contiguous", kv_data)
    toks = prompt(2 * CT, seed=13)
    events: List[Tuple[str, int]] = []
    rec = RecordingPutStore(kv, events)
    client = KvCacheClient(rec, ContiguousChunks(src["kv"]), MODEL)
    for ck in client.chunk_keys(toks):
        for layer in range(LAYERS):
            for k in client.keys.layer_keys(ck, layer):
                rec.layer_of[k] = layer
    r = client.save(toks, layers_in_flight=in_flight)
    assert r.stored_chunks == 2 and r.put_objects == 2 * LAYERS and not r.failures
    group = LAYERS if in_flight is None else in_flight
    want: List[Tuple[str, int]] = []
    for start in range(0, LAYERS, group):
        layers = range(start, min(LAYERS, start + group))
        want += [("put", layer) for layer in layers] + [("put_waited", layer) for layer in layers]
    assert events == want
    # Every layer's bytes went in: a fresh client loads them back.
    dst = make_tensors("contiguous", lambda s, seed: poison(s))
    with KvCacheClient(kv, ContiguousChunks(dst["kv"]), MODEL) as c2:
        assert c2.load(toks).cached_tokens == 2 * CT
    check_loaded(dst, src, 2)
    client.close()


# Failures ------------------------------------------------------------------


def file_yaml(tmp_path, faults: str = "") -> str:
    return one_drive_yaml(backing="{ file: " + str(tmp_path / "d0.img") + " }", capacity="32MiB", faults=faults)


FCHUNKS = 4


def save_to_file(tmp_path) -> Tuple[List[int], Dict[str, Any]]:
    """Four chunks of a contiguous-layout prompt saved to a file-backed drive."""
    src = make_tensors("contiguous", kv_data)
    toks = prompt(FCHUNKS * CT + 7, seed=11)
    with tutti.Runtime.from_yaml(file_yaml(tmp_path)) as rt:
        kv = tutti.KvStore.open(rt)
        with KvCacheClient(kv, ContiguousChunks(src["kv"]), MODEL) as client:
            assert client.save(toks).stored_chunks == FCHUNKS
        del kv
    return toks, src


def object_lba(tmp_path, src, layer: int, chunk: int) -> Tuple[int, int]:
    """The byte offset in the drive image of (chunk, layer)'s payload, as
    [first LBA, end LBA) of 4 KiB blocks."""
    payload = src["kv"][layer][chunk].tobytes()
    data = (tmp_path / "d0.img").read_bytes()
    at = data.find(payload)
    assert at >= 0 and at % 4096 == 0 and data.find(payload, at + 1) < 0
    return at // 4096, (at + len(payload)) // 4096


def check_loaded(dst, src, chunks: int) -> None:
    for layer in range(LAYERS):
        assert np.array_equal(dst["kv"][layer][:chunks], src["kv"][layer][:chunks])


def load_after(tmp_path, toks, yaml: str, timeout: float = 5.0, before=None):
    dst = make_tensors("contiguous", lambda s, seed: poison(s))
    rt = tutti.Runtime.from_yaml(yaml)
    kv = tutti.KvStore.open(rt, create="never")
    client = KvCacheClient(kv, ContiguousChunks(dst["kv"]), MODEL, timeout=timeout)
    assert client.lookup(toks) == FCHUNKS * CT
    ld = client.start_load(toks)
    if before is not None:
        before(kv, client)
    for layer in range(LAYERS):
        ld.start_layer(layer)
    for layer in range(LAYERS):
        ld.wait_layer(layer)
    return rt, kv, client, dst, ld.result()


def test_miss_after_lookup_recomputes_from_that_chunk(tmp_path):
    toks, src = save_to_file(tmp_path)

    def remove_chunk2_layer1(kv, client):
        ck = client.chunk_keys(toks)[2]
        assert [s.kind for s in kv.remove(client.keys.layer_keys(ck, 1))] == ["ok"]

    rt, kv, client, dst, r = load_after(tmp_path, toks, file_yaml(tmp_path), before=remove_chunk2_layer1)
    assert (r.found_chunks, r.cached_chunks, r.cached_tokens) == (FCHUNKS, 2, 2 * CT)
    assert [(f.chunk, f.layer, f.kind) for f in r.failures] == [(2, 1, "miss")]
    check_loaded(dst, src, 2)
    assert client.lookup(toks) == 2 * CT
    client.close()
    rt.shutdown()


def test_checksum_mismatch_recomputes_and_drops_the_object(tmp_path):
    toks, src = save_to_file(tmp_path)
    first, _ = object_lba(tmp_path, src, layer=2, chunk=1)
    img = tmp_path / "d0.img"
    data = bytearray(img.read_bytes())
    data[first * 4096 + 777] ^= 0x40
    img.write_bytes(bytes(data))
    rt, kv, client, dst, r = load_after(tmp_path, toks, file_yaml(tmp_path))
    assert (r.cached_chunks, r.cached_tokens) == (1, CT)
    assert [(f.chunk, f.layer, f.kind) for f in r.failures] == [(1, 2, "checksum_mismatch")]
    check_loaded(dst, src, 1)
    # The corrupt object is gone: the prefix now ends before it, and a
    # save writes it again.
    assert client.lookup(toks) == CT
    with KvCacheClient(kv, ContiguousChunks(src["kv"]), MODEL) as again:
        s = again.save(toks)
        assert (s.put_objects, s.stored_chunks) == (1, FCHUNKS)
    assert client.load(toks).cached_chunks == FCHUNKS
    check_loaded(dst, src, FCHUNKS)
    client.close()
    rt.shutdown()


def test_device_error_recomputes_from_that_chunk(tmp_path):
    toks, src = save_to_file(tmp_path)
    a, b = object_lba(tmp_path, src, layer=0, chunk=3)
    rule = f"- {{ op: read, lba: [{a}, {b}], action: {{ fail: {{ sct: 2, sc: 0x81, dnr: true }} }} }}"
    rt, kv, client, dst, r = load_after(tmp_path, toks, file_yaml(tmp_path, rule))
    assert (r.found_chunks, r.cached_chunks, r.cached_tokens) == (FCHUNKS, 3, 3 * CT)
    assert [(f.chunk, f.layer, f.kind) for f in r.failures] == [(3, 0, "device")]
    check_loaded(dst, src, 3)
    assert client.lookup(toks) == FCHUNKS * CT, "a device error does not drop the object"
    client.close()
    rt.shutdown()


def test_timeout_recomputes_and_reports_unsafe_memory(tmp_path):
    toks, src = save_to_file(tmp_path)
    a, b = object_lba(tmp_path, src, layer=1, chunk=2)
    rule = f"- {{ op: read, lba: [{a}, {b}], action: {{ delay_us: 1500000 }} }}"
    rt, kv, client, dst, r = load_after(tmp_path, toks, file_yaml(tmp_path, rule), timeout=0.3)
    assert (r.cached_chunks, r.cached_tokens) == (2, 2 * CT)
    assert [(f.chunk, f.layer, f.kind) for f in r.failures] == [(2, 1, "timeout")]
    assert [(u.tensor, u.offset, u.length) for u in r.unsafe_ranges] == [(1, 2 * client.layout.segment_bytes, client.layout.segment_bytes)]
    check_loaded(dst, src, 2)
    rt.shutdown(drain=5.0)


def test_failures_in_several_layers_take_the_earliest_chunk(tmp_path):
    toks, src = save_to_file(tmp_path)

    def remove(kv, client):
        cks = client.chunk_keys(toks)
        kv.remove(client.keys.layer_keys(cks[3], 0) + client.keys.layer_keys(cks[1], 2))

    rt, kv, client, dst, r = load_after(tmp_path, toks, file_yaml(tmp_path), before=remove)
    assert r.cached_chunks == 1
    assert sorted((f.chunk, f.layer) for f in r.failures) == [(1, 2), (3, 0)]
    client.close()
    rt.shutdown()


def test_restart_finds_the_prefix(tmp_path):
    toks, src = save_to_file(tmp_path)
    rt, kv, client, dst, r = load_after(tmp_path, toks, file_yaml(tmp_path))
    assert (r.found_chunks, r.cached_chunks, r.failures) == (FCHUNKS, FCHUNKS, [])
    check_loaded(dst, src, FCHUNKS)
    assert kv.stats()["recovered"] == FCHUNKS * LAYERS
    client.close()
    rt.shutdown()


def test_max_chunks_and_empty_prompt(rt):
    kv = tutti.KvStore.open(rt)
    src = make_tensors("contiguous", kv_data)
    toks = prompt(3 * CT, seed=12)
    with KvCacheClient(kv, ContiguousChunks(src["kv"]), MODEL) as client:
        assert client.save(toks, max_chunks=2).stored_chunks == 2
        assert client.lookup(toks) == 2 * CT
        r = client.load(toks, max_chunks=1)
        assert (r.found_chunks, r.cached_chunks) == (1, 1)
        assert client.load([]).cached_tokens == 0
        assert client.save([]).stored_chunks == 0
