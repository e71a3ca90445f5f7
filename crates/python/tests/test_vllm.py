"""tutti.integrations.vllm (TuttiConnector) without vLLM: fake vLLM-shaped
inputs (the attribute names of vLLM's objects), numpy KV caches in vLLM's
layouts, emulated drives. What each test proves is in its docstring."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import pytest

from conftest import one_drive_yaml
from tutti.engine import BlockMajorPagedKV, StackedPagedKV
from tutti.integrations.vllm import (
    HAVE_VLLM,
    SCRATCH,
    KVConnectorRole,
    LoadSpec,
    SchedulerLogic,
    TuttiConnector,
    TuttiConnectorMetadata,
    TuttiVllmConfig,
    UnsupportedModel,
    VllmPagedKV,
    check_vllm_model,
    detect_form,
)

# A small model: 3 layers, 2 KV heads of 64 float32: a K (or V) block of 8
# tokens is 4 KiB. Chunks of 16 tokens are 2 blocks.
LAYERS, HEADS, DIM, BS, CT, NB = 3, 2, 64, 8, 16, 48
BPC = CT // BS
MODEL = "test/vllm-tiny"
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
POISON = np.float32(-7.25)
ALL_BYTES_SET = np.frombuffer(bytes([0x11, 0x22, 0x33, 0x44]), np.float32)[0]


# Fake vLLM objects (the attributes the connector reads) ------------------


@dataclass
class KVTransferConfig:
    kv_connector_extra_config: Dict[str, Any]
    kv_connector: str = "TuttiConnector"
    kv_connector_module_path: str = "tutti.integrations.vllm"
    kv_role: str = "kv_both"


@dataclass
class CacheConfig:
    block_size: int = BS


@dataclass
class ModelConfig:
    model: str = MODEL
    hf_config: Any = None
    max_model_len: Optional[int] = None


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)


@dataclass
class KVCacheConfig:
    num_blocks: int = NB
    kv_cache_groups: List[Any] = field(default_factory=list)


@dataclass
class Request:
    request_id: str
    prompt_token_ids: List[int]
    output_token_ids: List[int] = field(default_factory=list)
    num_computed_tokens: int = 0

    @property
    def all_token_ids(self) -> List[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass
class KVCacheBlocks:
    ids: List[int]

    def get_block_ids(self) -> Tuple[List[int], ...]:
        return (list(self.ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: Tuple[List[int], ...]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: List[str] = field(default_factory=list)
    resumed_req_ids: Set[str] = field(default_factory=set)
    new_block_ids: List[Optional[Tuple[List[int], ...]]] = field(default_factory=list)
    num_computed_tokens: List[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: Dict[str, int] = field(default_factory=dict)
    finished_req_ids: Set[str] = field(default_factory=set)


# KV caches in vLLM's layouts ----------------------------------------------

FORMS = ["flash_attn", "flash_attn_hnd", "flashinfer", "blocks_heads_interleaved"]


def make_caches(form: str, fill: Callable[[Tuple[int, ...]], np.ndarray]) -> List[np.ndarray]:
    """One per-layer tensor per layer, in the logical shape vLLM passes."""
    if form == "flash_attn":  # [2, nb, bs, h, d], NHD
        return [fill((2, NB, BS, HEADS, DIM)) for _ in range(LAYERS)]
    if form == "flash_attn_hnd":  # same logical shape, memory [2, nb, h, bs, d]
        return [fill((2, NB, HEADS, BS, DIM)).transpose(0, 1, 3, 2, 4) for _ in range(LAYERS)]
    if form == "flashinfer":  # [nb, 2, bs, h, d]
        return [fill((NB, 2, BS, HEADS, DIM)) for _ in range(LAYERS)]
    if form == "blocks_heads_interleaved":  # [nb, h, bs, 2d] views of one buffer [nb, L, h, bs, 2d]
        raw = fill((NB, LAYERS, HEADS, BS, 2 * DIM))
        return [raw[:, layer] for layer in range(LAYERS)]
    raise AssertionError(form)


def block(form: str, t: np.ndarray, b: int) -> np.ndarray:
    """Block ``b`` of a layer's tensor (numpy indexing, independent of the layout)."""
    return t[:, b] if form.startswith("flash_attn") else t[b]


def rand_fill(seed: int) -> Callable[[Tuple[int, ...]], np.ndarray]:
    rng = np.random.default_rng(seed)
    return lambda shape: rng.standard_normal(shape, dtype=np.float32)


def poison_fill(shape: Tuple[int, ...]) -> np.ndarray:
    return np.full(shape, POISON, dtype=np.float32)


def small_slot_yaml(**kw: Any) -> str:
    """One emulated drive, store "kv" with 16 KiB slots (objects here are 4
    or 8 KiB)."""
    return one_drive_yaml(**kw).replace("slot_size: 1MiB", "slot_size: 16KiB")


def vllm_config(extra: Optional[Dict[str, Any]] = None, yaml: Optional[str] = None, **kw: Any) -> VllmConfig:
    e = {"chunk_tokens": CT, "runtime_yaml": yaml or small_slot_yaml(), "timeout_s": 2.0}
    e.update(extra or {})
    return VllmConfig(KVTransferConfig(e), **kw)


class Engine:
    """A scheduler-side and a worker-side connector of one process, and a
    forward pass that calls them in vLLM's order."""

    def __init__(self, form: str, caches: List[np.ndarray], cfg: Optional[VllmConfig] = None, names: Sequence[str] = NAMES) -> None:
        self.form = form
        self.cfg = cfg or vllm_config()
        self.sched = TuttiConnector(self.cfg, KVConnectorRole.SCHEDULER, KVCacheConfig())
        self.worker = TuttiConnector(self.cfg, KVConnectorRole.WORKER, KVCacheConfig())
        self.caches = dict(zip(names, caches))
        self.worker.register_kv_caches(self.caches)

    @property
    def client(self):
        return self.worker._writer.client

    def step(self, out: SchedulerOutput, on_layer: Optional[Callable[[int], None]] = None) -> Tuple[TuttiConnectorMetadata, Set[int]]:
        meta = self.sched.build_connector_meta(out)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        for i, name in enumerate(sorted(self.caches, key=lambda n: NAMES.index(n) if n in NAMES else 0)):
            self.worker.wait_for_layer_load(name)
            if on_layer is not None:
                on_layer(i)
            self.worker.save_kv_layer(name, self.caches[name], None)
        self.worker.wait_for_save()
        assert self.worker.get_finished(set()) == (None, None)
        errors = self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        return meta, errors

    def prefill(self, req: Request, blocks: List[int], local: int = 0) -> Tuple[TuttiConnectorMetadata, Set[int], int]:
        """Schedule ``req`` whole (after ``local`` locally cached tokens) as
        vLLM does: lookup, allocation, one step."""
        ext, is_async = self.sched.get_num_new_matched_tokens(req, local)
        assert is_async is False
        self.sched.update_state_after_alloc(req, KVCacheBlocks(blocks), ext)
        done = local + ext
        out = SchedulerOutput([NewRequestData(req.request_id, req.prompt_token_ids, (blocks,), done)], num_scheduled_tokens={req.request_id: req.num_tokens - done})
        meta, errors = self.step(out)
        return meta, errors, ext

    def close(self) -> None:
        self.worker.shutdown()
        self.sched.shutdown()


def prompt(n: int, seed: int = 0) -> List[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 50000, n)]


def tables(seed: int = 9) -> Tuple[List[int], List[int]]:
    """Two disjoint shuffled block tables of 24 blocks each."""
    perm = [int(x) for x in np.random.default_rng(seed).permutation(NB)]
    return perm[:24], perm[24:]


def set_blocks(form: str, caches: List[np.ndarray], blocks: Sequence[int], value: np.float32) -> None:
    for t in caches:
        for b in blocks:
            block(form, t, b)[...] = value


# Tests ---------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_layout_ranges_are_exactly_the_blocks_bytes(form):
    """Each chunk's ranges cover exactly the bytes of its blocks (found by
    numpy indexing), without overlap; for contiguous FlashAttention and
    FlashInfer tensors they are the engine's StackedPagedKV and
    BlockMajorPagedKV ranges; SCRATCH goes to the scratch buffer."""
    caches = make_caches(form, lambda s: np.zeros(s, np.float32))
    lay = VllmPagedKV(caches, BS, CT, num_blocks=NB)
    assert lay.num_layers == LAYERS and (lay.kv_heads, lay.head_dim, lay.itemsize) == (HEADS, DIM, 4)
    assert lay.segments * lay.segment_bytes == lay.layer_chunk_bytes == 2 * CT * HEADS * DIM * 4
    shared = form == "blocks_heads_interleaved"
    assert len(lay.tensors) == (1 if shared else LAYERS) + 1, "each storage registered once, plus the scratch"
    place = [5, 17, 3, 40, 22, 9]
    for layer in range(LAYERS):
        for c in range(3):
            rs = lay.ranges(layer, c, place)
            assert len(rs) == lay.segments and all(r.length == lay.segment_bytes for r in rs)
            got: Set[Tuple[int, int]] = set()
            for r in rs:
                span = {(r.tensor, i) for i in range(r.offset, r.offset + r.length)}
                assert not span & got, "ranges overlap"
                got |= span
            for t in caches:
                t[...] = 0
            for b in place[c * BPC : (c + 1) * BPC]:
                block(form, caches[layer], b)[...] = ALL_BYTES_SET
            want = {(i, int(x)) for i, st in enumerate(lay.tensors[:-1]) for x in np.flatnonzero(st.view(np.uint8))}
            assert got == want, (form, layer, c)
    if form == "flash_attn":
        eng = StackedPagedKV(caches, CT)
        assert all(lay.ranges(layer, c, place) == eng.ranges(layer, c, place) for layer in range(LAYERS) for c in range(3))
    if form == "flashinfer":
        eng = BlockMajorPagedKV(caches, CT)
        assert all(lay.ranges(layer, c, place) == eng.ranges(layer, c, place) for layer in range(LAYERS) for c in range(3))
    scratch = lay.ranges(0, 0, [SCRATCH, 7])
    assert {r.tensor for r in scratch[:: BPC]} == {len(lay.tensors) - 1}
    lay.check_placement([SCRATCH, 7], 1)
    with pytest.raises(ValueError, match="out of range"):
        lay.check_placement([NB, 7], 1)


def test_layout_names_and_checks():
    """Different memory orders get different names (so key namespaces);
    bad shapes and block sizes are refused."""
    names = {VllmPagedKV(make_caches(f, poison_fill), BS, CT, num_blocks=NB).name for f in FORMS}
    assert len(names) == len(FORMS)
    assert detect_form((2, NB, BS, HEADS, DIM)) == "flash_attn"
    assert detect_form((NB, 2, BS, HEADS, DIM)) == "flashinfer"
    assert detect_form((NB, HEADS, BS, 2 * DIM), num_blocks=NB) == "blocks_heads"
    with pytest.raises(ValueError, match="cannot tell"):
        detect_form((2, 2, BS, HEADS, DIM))
    with pytest.raises(ValueError, match="vLLM allocated 7"):
        detect_form((2, NB, BS, HEADS, DIM), num_blocks=7)
    with pytest.raises(ValueError, match="block_size"):
        VllmPagedKV(make_caches("flash_attn", poison_fill), 16, 32)
    with pytest.raises(ValueError, match="multiple of block_size"):
        VllmPagedKV(make_caches("flash_attn", poison_fill), BS, 12)
    with pytest.raises(ValueError, match="expected 5 dimensions"):
        VllmPagedKV([np.zeros((4, 4, 4, 4, 4, 4), np.float32)], BS, CT)
    with pytest.raises(UnsupportedModel, match="latent") as e:
        VllmPagedKV([np.zeros((NB, BS, 576), np.float32)], BS, CT)
    assert e.value.feature == "mla"
    with pytest.raises(UnsupportedModel, match="differs") as e:
        VllmPagedKV(make_caches("flash_attn", poison_fill)[:2] + [np.zeros((2, NB, BS, HEADS, 2 * DIM), np.float32)], BS, CT)
    assert e.value.feature == "per_layer_shapes"


@pytest.mark.parametrize("form", FORMS)
def test_second_request_loads_bit_identical_blocks(form):
    """Request A saves its whole chunks (every layer, one step); request B
    with the same 3-chunk prefix is offered exactly those 48 tokens, and
    after the load its blocks hold A's bytes in every layer (each layer
    already when wait_for_layer_load returns); nothing else is written and
    no load error is reported; layer l + 1's reads are issued before layer l
    computes, layer l + 2's not. A prompt that is entirely cached is offered
    one chunk less (vLLM must compute its last token)."""
    caches = make_caches(form, rand_fill(1))
    ta, tb = tables()
    set_blocks(form, caches, tb, POISON)
    eng = Engine(form, caches)
    try:
        a = Request("A", prompt(3 * CT + 5, seed=2))
        meta, errors, ext = eng.prefill(a, ta)
        assert ext == 0 and errors == set() and meta.loads == []
        assert [(s.req_id, len(s.token_ids), s.first_chunk, s.block_ids) for s in meta.saves] == [("A", 3 * CT, 0, ta[: 3 * BPC])]
        assert eng.sched.request_finished(a, ta) == (False, None)
        assert eng.client.lookup(a.prompt_token_ids) == 3 * CT
        snapshot = [t.copy() for t in caches]

        b = Request("B", a.prompt_token_ids[: 3 * CT] + prompt(7, seed=3))
        assert eng.sched.get_num_new_matched_tokens(b, 0) == (3 * CT, False)
        assert eng.sched.get_num_new_matched_tokens(b, 0) == (3 * CT, False), "repeatable"
        assert eng.sched.get_num_new_matched_tokens(b, 3 * CT) == (0, False), "local hit as long"
        assert eng.sched.get_num_new_matched_tokens(b, BS) == (3 * CT - BS, False)
        whole = Request("W", a.prompt_token_ids[: 3 * CT])
        assert eng.sched.get_num_new_matched_tokens(whole, 0) == (2 * CT, False), "leave the last token"
        assert eng.sched.get_num_new_matched_tokens(Request("S", a.prompt_token_ids[: CT - 1]), 0) == (0, False)

        seen: List[int] = []

        def check_layer(layer: int) -> None:
            if layer + 1 < LAYERS:  # layer l + 1's reads are in flight while l computes, l + 2's not yet
                started = eng.worker._worker._loads[0].started
                assert started == set(range(layer + 2)), (layer, started)
            for j in range(3 * BPC):
                assert np.array_equal(block(form, caches[layer], tb[j]), block(form, caches[layer], ta[j]))
            seen.append(layer)

        ext, _ = eng.sched.get_num_new_matched_tokens(b, 0)
        eng.sched.update_state_after_alloc(b, KVCacheBlocks(tb), ext)
        out = SchedulerOutput([NewRequestData("B", b.prompt_token_ids, (tb,), ext)], num_scheduled_tokens={"B": b.num_tokens - ext})
        meta, errors = eng.step(out, on_layer=check_layer)
        assert seen == list(range(LAYERS))
        assert errors == set() and meta.saves == [], "B's whole chunks are all in the store"
        assert [(ld.req_id, ld.local_tokens, ld.end_tokens, ld.block_ids) for ld in meta.loads] == [("B", 0, 3 * CT, tb)]
        for layer in range(LAYERS):
            for j in range(3 * BPC):
                assert np.array_equal(block(form, caches[layer], tb[j]), block(form, snapshot[layer], ta[j]))
            for j in range(3 * BPC, len(tb)):
                assert np.all(block(form, caches[layer], tb[j]) == POISON), "a block past the load was written"
            for b_ in ta:
                assert np.array_equal(block(form, caches[layer], b_), block(form, snapshot[layer], b_))
        # Where the host time went, for runs that must say (the H200's vLLM TTFT).
        w, s_ = eng.worker.stats(), eng.sched.stats()
        assert w["tokens_loaded"] == 3 * CT
        assert w["load_start_us"] > 0 and w["load_wait_us"] > 0 and w["save_wait_us"] > 0 and w["save_issue_us"] > 0
        assert s_["lookups"] >= 6 and s_["lookup_us"] > 0
    finally:
        eng.close()


def test_local_prefix_blocks_are_never_written():
    """With vLLM's own prefix cache holding the first block, the connector
    offers the rest of the cached chunks, loads them, and leaves the local
    block untouched: it is neither read nor written, and the chunk holding
    it still counts as loaded; no object is dropped from the store."""
    form = "flash_attn"
    caches = make_caches(form, rand_fill(4))
    ta, tb = tables(5)
    set_blocks(form, caches, tb, POISON)
    set_blocks(form, caches, tb[:1], np.float32(3.5))
    eng = Engine(form, caches)
    try:
        a = Request("A", prompt(2 * CT + 3, seed=6))
        eng.prefill(a, ta)
        d = Request("D", a.prompt_token_ids[: 2 * CT] + [1, 2, 3, 4])
        meta, errors, ext = eng.prefill(d, tb, local=BS)
        assert ext == 2 * CT - BS and errors == set()
        assert [(ld.local_tokens, ld.end_tokens) for ld in meta.loads] == [(BS, 2 * CT)]
        for layer in range(LAYERS):
            assert np.all(block(form, caches[layer], tb[0]) == np.float32(3.5)), "the local block was overwritten"
            for j in range(1, 2 * BPC):
                assert np.array_equal(block(form, caches[layer], tb[j]), block(form, caches[layer], ta[j]))
        assert eng.client.lookup(a.prompt_token_ids) == 2 * CT
        placeholder = eng.client.layout.tensors[eng.client.layout.scratch_index]
        assert not placeholder.any(), "the placeholder block was written"
    finally:
        eng.close()


def test_chunked_prefill_saves_each_chunk_once():
    """A prompt prefilled over two steps saves the chunk completed in the
    first step, then the rest (from the next chunk on); decode steps save
    nothing unless save_decode_tokens."""
    form = "flash_attn"
    eng = Engine(form, make_caches(form, rand_fill(7)))
    try:
        e = Request("E", prompt(4 * CT + 3, seed=8))
        ta, _ = tables(10)
        ext, _ = eng.sched.get_num_new_matched_tokens(e, 0)
        eng.sched.update_state_after_alloc(e, KVCacheBlocks(ta[:3]), ext)
        meta, errors = eng.step(SchedulerOutput([NewRequestData("E", e.prompt_token_ids, (ta[:3],), 0)], num_scheduled_tokens={"E": 24}))
        assert [(len(s.token_ids), s.first_chunk, s.block_ids) for s in meta.saves] == [(CT, 0, ta[:2])]
        assert eng.client.lookup(e.prompt_token_ids) == CT
        cached = CachedRequestData(["E"], set(), [(ta[3:9],)], [24])
        meta, errors = eng.step(SchedulerOutput(scheduled_cached_reqs=cached, num_scheduled_tokens={"E": e.num_tokens - 24}))
        assert [(len(s.token_ids), s.first_chunk, s.block_ids) for s in meta.saves] == [(4 * CT, 1, ta[:8])]
        assert eng.client.lookup(e.prompt_token_ids) == 4 * CT
        assert eng.worker._worker.last_save_results[0].put_objects == 3 * LAYERS * 2 * BPC, "chunk 0 not put again"
        e.output_token_ids.extend(prompt(CT, seed=11))
        cached = CachedRequestData(["E"], set(), [None], [e.num_tokens - 1])
        meta, _ = eng.step(SchedulerOutput(scheduled_cached_reqs=cached, num_scheduled_tokens={"E": 1}))
        assert meta.saves == [], "decode tokens are not saved by default"
    finally:
        eng.close()
    logic = SchedulerLogic(lambda toks: 0, CT, BS, save_decode_tokens=True)
    r = Request("R", prompt(CT - 2, seed=12), output_token_ids=[1, 2, 3])
    logic.update_state_after_alloc(r, KVCacheBlocks([0, 1, 2]), 0)
    meta = logic.build_connector_meta(SchedulerOutput([NewRequestData("R", r.prompt_token_ids, ([0, 1, 2],), 0)], num_scheduled_tokens={"R": r.num_tokens}))
    assert [(s.token_ids, s.block_ids) for s in meta.saves] == [(r.all_token_ids[:CT], [0, 1])]


def saved_engine(form: str, caches, ta, chunks: int = 4, cfg=None) -> Tuple[Engine, Request]:
    eng = Engine(form, caches, cfg)
    a = Request("A", prompt(chunks * CT + 5, seed=13))
    meta, errors, _ = eng.prefill(a, ta)
    assert errors == set() and eng.client.lookup(a.prompt_token_ids) == chunks * CT
    eng.sched.request_finished(a, ta)
    return eng, a


def load_b(eng: Engine, a: Request, tb: List[int], before_load: Optional[Callable[[], None]] = None) -> Set[int]:
    b = Request("B", a.prompt_token_ids[: 4 * CT] + [7, 7, 7])
    ext, _ = eng.sched.get_num_new_matched_tokens(b, 0)
    assert ext == 4 * CT
    eng.sched.update_state_after_alloc(b, KVCacheBlocks(tb), ext)
    if before_load is not None:
        before_load()
    _, errors = eng.step(SchedulerOutput([NewRequestData("B", b.prompt_token_ids, (tb,), ext)], num_scheduled_tokens={"B": 3}))
    return errors


def test_a_prefix_shared_within_one_step_is_put_once():
    """Two requests scheduled in one step share their first 2 chunks: the
    second request's SaveSpec starts after them, the worker puts each
    object once (vLLM's batch of prompts with one system prompt), and both
    prompts are then found whole."""
    form = "flash_attn"
    eng = Engine(form, make_caches(form, rand_fill(51)))
    try:
        ta, tb = tables(52)
        shared = prompt(2 * CT, seed=53)
        a = Request("A", shared + prompt(CT + 3, seed=54))
        b = Request("B", shared + prompt(2 * CT + 3, seed=55))
        for r, t in ((a, ta), (b, tb)):
            eng.sched.update_state_after_alloc(r, KVCacheBlocks(t), eng.sched.get_num_new_matched_tokens(r, 0)[0])
        out = SchedulerOutput(
            [NewRequestData(r.request_id, r.prompt_token_ids, (t,), 0) for r, t in ((a, ta), (b, tb))],
            num_scheduled_tokens={"A": a.num_tokens, "B": b.num_tokens},
        )
        meta, errors = eng.step(out)
        assert errors == set()
        assert [(s.req_id, s.first_chunk, len(s.token_ids) // CT) for s in meta.saves] == [("A", 0, 3), ("B", 2, 4)]
        assert eng.worker.stats()["objects_saved"] == (3 + 2) * LAYERS * BPC * 2  # K and V of each block, not 3 + 4 chunks
        assert eng.client.lookup(a.prompt_token_ids) == 3 * CT and eng.client.lookup(b.prompt_token_ids) == 4 * CT
    finally:
        eng.close()


@pytest.mark.parametrize("what", ["one_layer_of_chunk_2", "all_of_chunk_3"])
def test_object_removed_after_lookup_reports_failed_and_later_chunks(what):
    """Objects removed between the scheduler's lookup and the load (a miss
    in one layer of chunk 2; chunk 3 gone entirely, so the load's own lookup
    finds fewer chunks): get_block_ids_with_load_errors names exactly the
    blocks of the failed chunk and every later one, once; the chunks before
    it hold A's bytes in every layer."""
    form = "flash_attn"
    caches = make_caches(form, rand_fill(14))
    ta, tb = tables(15)
    set_blocks(form, caches, tb, POISON)
    eng, a = saved_engine(form, caches, ta)
    try:
        cks = eng.client.chunk_keys(a.prompt_token_ids)
        bad = 2 if what == "one_layer_of_chunk_2" else 3

        def remove() -> None:
            if bad == 2:
                keys = eng.client.keys.layer_keys(cks[2], 1)
            else:
                keys = eng.client.keys.chunk_object_keys(cks[3])
            assert all(s.kind == "ok" for s in eng.worker._writer.store.remove(keys))

        errors = load_b(eng, a, tb, remove)
        assert errors == set(tb[bad * BPC : 4 * BPC])
        assert eng.worker.get_block_ids_with_load_errors() == set(), "reported once"
        for layer in range(LAYERS):
            for j in range(bad * BPC):
                assert np.array_equal(block(form, caches[layer], tb[j]), block(form, caches[layer], ta[j]))
    finally:
        eng.close()


def test_chunks_that_failed_to_load_are_saved_again_after_recompute():
    """A load whose chunk 2 fails (one layer's object removed after the
    lookup) reports chunks 2 and 3's blocks; vLLM passes them back to the
    scheduler side (update_connector_output, invalid_block_ids) and
    recomputes from chunk 2: that step's SaveSpec starts at chunk 2, the
    worker puts the removed object (the others are present), and the
    prompt is found whole again. Without the report the scheduler would
    count the loaded chunks as stored and save nothing."""
    from types import SimpleNamespace

    form = "flash_attn"
    caches = make_caches(form, rand_fill(16))
    ta, tb = tables(17)
    eng, a = saved_engine(form, caches, ta)
    try:
        cks = eng.client.chunk_keys(a.prompt_token_ids)
        b = Request("B", a.prompt_token_ids[: 4 * CT] + [7, 7, 7])
        ext, _ = eng.sched.get_num_new_matched_tokens(b, 0)
        eng.sched.update_state_after_alloc(b, KVCacheBlocks(tb), ext)
        assert all(st.ok for st in eng.worker._writer.store.remove(eng.client.keys.layer_keys(cks[2], 1)))
        _, errors = eng.step(SchedulerOutput([NewRequestData("B", b.prompt_token_ids, (tb,), ext)], num_scheduled_tokens={"B": 3}))
        assert errors == set(tb[2 * BPC : 4 * BPC])
        assert eng.client.lookup(b.prompt_token_ids) == 2 * CT
        eng.sched.update_connector_output(SimpleNamespace(invalid_block_ids=errors))
        # vLLM recomputes tokens [2 * CT, end) into the same blocks (A's bytes).
        for layer in range(LAYERS):
            for j in range(2 * BPC, 4 * BPC):
                block(form, caches[layer], tb[j])[...] = block(form, caches[layer], ta[j])
        before = eng.worker.stats()["objects_saved"]
        out = SchedulerOutput(scheduled_cached_reqs=CachedRequestData(["B"], set(), [None], [2 * CT]), num_scheduled_tokens={"B": b.num_tokens - 2 * CT})
        meta, errors = eng.step(out)
        assert errors == set() and [(sv.first_chunk, len(sv.token_ids) // CT) for sv in meta.saves] == [(2, 4)]
        assert eng.worker.stats()["objects_saved"] - before == BPC * 2  # layer 1 of chunk 2: K and V of each block
        assert eng.client.lookup(b.prompt_token_ids) == 4 * CT
    finally:
        eng.close()


def test_device_error_on_restart_reports_failed_and_later_chunks(tmp_path):
    """Restart: a new process-like runtime over the same file-backed drive
    finds A's prefix; a read fault on one object (the K block of chunk 1,
    layer 0) ends in load errors for exactly chunks 1..3's blocks of B,
    and chunk 0 loads bit-identical."""
    form = "flash_attn"
    img = tmp_path / "d0.img"
    yaml = small_slot_yaml(backing="{ file: " + str(img) + " }", capacity="32MiB")
    ta, tb = tables(16)
    caches = make_caches(form, rand_fill(17))
    eng, a = saved_engine(form, caches, ta, cfg=vllm_config(yaml=yaml))
    eng.close()
    payload = caches[0][0, ta[BPC]].tobytes()  # K of chunk 1's first block, layer 0
    data = img.read_bytes()
    at = data.find(payload)
    assert at >= 0 and at % 4096 == 0 and data.find(payload, at + 1) < 0
    lba = at // 4096
    rule = f"- {{ op: read, lba: [{lba}, {lba + 1}], action: {{ fail: {{ sct: 2, sc: 0x81, dnr: true }} }} }}"
    caches2 = make_caches(form, rand_fill(17))  # the same bytes as before the restart
    set_blocks(form, caches2, tb, POISON)
    eng = Engine(form, caches2, vllm_config(yaml=small_slot_yaml(backing="{ file: " + str(img) + " }", capacity="32MiB", faults=rule)))
    try:
        assert eng.client.lookup(a.prompt_token_ids) == 4 * CT, "the prefix survives the restart"
        errors = load_b(eng, a, tb)
        assert errors == set(tb[BPC : 4 * BPC])
        for layer in range(LAYERS):
            for j in range(BPC):
                assert np.array_equal(block(form, caches2[layer], tb[j]), block(form, caches2[layer], ta[j]))
    finally:
        eng.close()


def test_layer_order_fixes_which_object_is_which_layer(tmp_path):
    """Keys follow the layers' numbers, not the dict's order: a restart that
    registers the same layers in another dict order finds the prefix and
    loads each layer's bytes into the same layer; other layer names (another
    model definition) find nothing."""
    from tutti.integrations.vllm.connector import layer_order, namespace_model

    assert layer_order({"m.layers.10.attn": 0, "m.layers.2.attn": 0, "m.layers.0.attn": 0}) == ["m.layers.0.attn", "m.layers.2.attn", "m.layers.10.attn"]
    assert layer_order({"enc.1.x.3": 0, "enc.0.x.1": 0}) == ["enc.1.x.3", "enc.0.x.1"], "ambiguous names keep the dict order"
    assert namespace_model("m", NAMES) != namespace_model("m", NAMES[::-1])
    form = "flash_attn"
    yaml = small_slot_yaml(backing="{ file: " + str(tmp_path / "d0.img") + " }", capacity="32MiB")
    ta, tb = tables(24)
    caches = make_caches(form, rand_fill(25))
    eng, a = saved_engine(form, caches, ta, cfg=vllm_config(yaml=yaml))
    eng.close()
    again = make_caches(form, rand_fill(25))
    set_blocks(form, again, tb, POISON)
    eng = Engine(form, again[::-1], vllm_config(yaml=yaml), names=NAMES[::-1])  # reversed dict order
    try:
        assert list(eng.caches) == NAMES[::-1]
        assert load_b(eng, a, tb) == set()
        for layer in range(LAYERS):
            for j in range(4 * BPC):
                assert np.array_equal(block(form, again[layer], tb[j]), block(form, again[layer], ta[j])), (layer, j)
    finally:
        eng.close()
    renamed = [n.replace("self_attn", "attention") for n in NAMES]
    eng = Engine(form, make_caches(form, rand_fill(25)), vllm_config(yaml=yaml), names=renamed)
    try:
        assert eng.client.lookup(a.prompt_token_ids) == 0
    finally:
        eng.close()


def test_config_keys_and_checks(tmp_path):
    """Extra-config parsing: defaults, every key, and refusals (chunk size
    not a multiple of the block size, unknown keys, two runtime sources,
    tensor parallelism); a runtime YAML file path works end to end."""
    c = TuttiVllmConfig.from_extra_config({}, block_size=16, model="m")
    assert (c.chunk_tokens, c.store, c.model, c.timeout_s, c.save_decode_tokens) == (256, "kv", "m", 5.0, False)
    assert c.runtime_key[0] == "emulated"
    c = TuttiVllmConfig.from_extra_config(
        {"chunk_tokens": "64", "model": "ns", "store": "s", "timeout_s": 1, "save_decode_tokens": "true", "runtime_config": "/x.yaml"},
        block_size=16,
        model="m",
    )
    assert (c.chunk_tokens, c.model, c.store, c.timeout_s, c.save_decode_tokens, c.runtime_key) == (64, "ns", "s", 1.0, True, ("file", "/x.yaml"))
    with pytest.raises(ValueError, match="multiple of vLLM's block_size"):
        TuttiVllmConfig.from_extra_config({"chunk_tokens": 24}, block_size=16, model="m")
    with pytest.raises(ValueError, match="unknown"):
        TuttiVllmConfig.from_extra_config({"chunk_size": 64}, block_size=16, model="m")
    with pytest.raises(ValueError, match="not both"):
        TuttiVllmConfig.from_extra_config({"runtime_config": "a", "runtime_yaml": "b"}, block_size=16, model="m")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        TuttiConnector(vllm_config(parallel_config=ParallelConfig(tensor_parallel_size=2)), KVConnectorRole.WORKER, KVCacheConfig())
    path = tmp_path / "runtime.yaml"
    path.write_text(small_slot_yaml())
    cfg = VllmConfig(KVTransferConfig({"chunk_tokens": CT, "runtime_config": str(path)}))
    eng = Engine("flash_attn", make_caches("flash_attn", rand_fill(18)), cfg)
    try:
        assert eng.sched._shared is eng.worker._shared, "one runtime per process"
        ta, _ = tables(19)
        eng.prefill(Request("A", prompt(CT + 1, seed=20)), ta)
        assert eng.client.lookup(prompt(CT + 1, seed=20)) == CT
    finally:
        eng.close()
    # The scheduler without a registered worker finds nothing (never a wrong hit).
    s = TuttiConnector(vllm_config(), KVConnectorRole.SCHEDULER, KVCacheConfig())
    try:
        assert s.get_num_new_matched_tokens(Request("X", prompt(3 * CT)), 0) == (0, False)
    finally:
        s.shutdown()


# The interface of KVConnectorBase_V1 at vLLM commit
# 003df2961dd8830c317a61f9745ccd557da9fa06
# (vllm/distributed/kv_transfer/kv_connector/v1/base.py): the methods
# TuttiConnector implements, with their parameter names in order and, for
# the ones the brief pins, the return annotation.
PINNED: Dict[str, Tuple[List[str], Optional[str]]] = {
    "__init__": (["self", "vllm_config", "role", "kv_cache_config"], None),
    "register_kv_caches": (["self", "kv_caches"], None),
    "start_load_kv": (["self", "forward_context", "kwargs"], "None"),
    "wait_for_layer_load": (["self", "layer_name"], "None"),
    "save_kv_layer": (["self", "layer_name", "kv_layer", "attn_metadata", "kwargs"], "None"),
    "wait_for_save": (["self"], None),
    "get_finished": (["self", "finished_req_ids"], "tuple[set[str] | None, set[str] | None]"),
    "get_block_ids_with_load_errors": (["self"], "set[int]"),
    "shutdown": (["self"], None),
    "get_num_new_matched_tokens": (["self", "request", "num_computed_tokens"], "tuple[int | None, bool]"),
    "update_state_after_alloc": (["self", "request", "blocks", "num_external_tokens"], None),
    "build_connector_meta": (["self", "scheduler_output"], "KVConnectorMetadata"),
    "request_finished": (["self", "request", "block_ids"], "tuple[bool, dict[str, Any] | None]"),
    "update_connector_output": (["self", "connector_output"], None),
    "requires_piecewise_for_cudagraph": (["cls", "extra_config"], "bool"),
    "bind_connector_metadata": (["self", "connector_metadata"], "None"),
    "clear_connector_metadata": (["self"], "None"),
}


def _params(fn: Any) -> List[str]:
    sig = inspect.signature(fn)
    names = list(sig.parameters)
    if isinstance(inspect.getattr_static(TuttiConnector, fn.__name__, None), classmethod) or inspect.ismethod(fn):
        names = ["cls"] + names
    return names


def test_interface_matches_vllm():
    """Without vLLM: TuttiConnector's methods have the parameter names (in
    order) and return annotations pinned above from vLLM's base.py, the
    **kwargs are VAR_KEYWORD, and requires_kv_delivery is a property. With
    vLLM installed: TuttiConnector subclasses the real KVConnectorBase_V1 and
    every abstract method's parameters match the real signature."""
    for name, (params, ret) in PINNED.items():
        fn = getattr(TuttiConnector, name)
        assert _params(fn) == params, name
        if ret is not None:
            assert str(inspect.signature(fn).return_annotation) == ret, name
        sig = inspect.signature(fn)
        if "kwargs" in params:
            assert sig.parameters["kwargs"].kind is inspect.Parameter.VAR_KEYWORD, name
    assert isinstance(inspect.getattr_static(TuttiConnector, "requires_kv_delivery"), property)
    assert isinstance(TuttiConnectorMetadata(), __import__("tutti.integrations.vllm._compat", fromlist=["x"]).KVConnectorMetadata)
    if not HAVE_VLLM:
        return
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata  # pragma: no cover

    assert issubclass(TuttiConnector, KVConnectorBase_V1)  # pragma: no cover
    assert issubclass(TuttiConnectorMetadata, KVConnectorMetadata)  # pragma: no cover
    assert not getattr(TuttiConnector, "__abstractmethods__", set())  # pragma: no cover
    for name in PINNED:  # pragma: no cover
        if name in ("__init__",):
            continue
        base = getattr(KVConnectorBase_V1, name)
        assert list(inspect.signature(getattr(TuttiConnector, name)).parameters) == list(inspect.signature(base).parameters), name


def test_load_spec_rejects_short_tables():
    """A load whose block table or tokens cannot hold its tokens is refused
    at build time (a wrong table would load KV into the wrong blocks)."""
    logic = SchedulerLogic(lambda toks: 2 * CT, CT, BS)
    r = Request("R", prompt(2 * CT + 1, seed=21))
    assert logic.get_num_new_matched_tokens(r, 0) == (2 * CT, False)
    logic.update_state_after_alloc(r, KVCacheBlocks([1, 2]), 2 * CT)
    with pytest.raises(ValueError, match="cannot hold"):
        logic.build_connector_meta(SchedulerOutput([NewRequestData("R", r.prompt_token_ids, ([1, 2],), 2 * CT)], num_scheduled_tokens={"R": 1}))
    ok = SchedulerLogic(lambda toks: 2 * CT, CT, BS)
    ok.get_num_new_matched_tokens(r, 0)
    ok.update_state_after_alloc(r, KVCacheBlocks(list(range(5))), 2 * CT)
    meta = ok.build_connector_meta(SchedulerOutput([NewRequestData("R", r.prompt_token_ids, (list(range(5)),), 2 * CT)], num_scheduled_tokens={"R": 1}))
    assert meta.loads == [LoadSpec("R", r.prompt_token_ids[: 2 * CT], list(range(5)), 0, 2 * CT)]


# CUDA torch tensors (GPU machine only; skipped without torch and a GPU) ----

GPU_YAML = """
drives:
  d0: { emulated: { namespaces: [{ capacity: 64MiB, block_size: 4096 }] } }
  d1: { emulated: { namespaces: [{ capacity: 64MiB, block_size: 4096 }] } }
resolvers:
  kv: { slab: { slot_size: 64KiB } }
datapaths:
  stripe:
    striped_local_nvme: { drives: [d0, d1], nsid: 1, stripe_unit: 128KiB, queues_per_drive: 2, queue_depth: 256, execution: gpu }
stores:
  kv: { resolver: kv, datapath: stripe }
"""


@pytest.mark.parametrize("form", ["flash_attn", "flash_attn_hnd"])
def test_torch_cuda_kv_caches_load_bit_identical(form):
    """The same flow with vLLM-like CUDA tensors (bf16, 16-token blocks of 2
    heads x 128: 8 KiB pieces; NHD and HND memory orders) on a GPU-executed
    datapath: B's blocks equal A's (torch.equal) in every layer, nothing
    else written, no load error."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    import tutti

    bs, ct, h, d = 16, 32, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(0)

    def fill(shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    if form == "flash_attn":
        caches = [fill((2, NB, bs, h, d)) for _ in range(LAYERS)]
    else:
        caches = [fill((2, NB, h, bs, d)).permute(0, 1, 3, 2, 4) for _ in range(LAYERS)]
    assert caches[0].shape == (2, NB, bs, h, d)
    ta, tb = tables(22)
    poison = torch.tensor(-7.25, dtype=torch.bfloat16, device="cuda")
    for t in caches:
        t[:, tb] = poison
    cfg = vllm_config({"chunk_tokens": ct}, yaml=GPU_YAML, cache_config=CacheConfig(block_size=bs))
    try:
        eng = Engine(form, caches, cfg)
    except tutti.GpuError as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"the runtime cannot drive this GPU: {e}")
    try:
        a = Request("A", prompt(3 * ct + 5, seed=23))
        _, errors, _ = eng.prefill(a, ta)
        assert errors == set() and eng.client.lookup(a.prompt_token_ids) == 3 * ct
        snap = [t.clone() for t in caches]
        b = Request("B", a.prompt_token_ids[: 3 * ct] + [5, 6, 7])
        meta, errors, ext = eng.prefill(b, tb)
        assert ext == 3 * ct and errors == set() and len(meta.loads) == 1
        torch.cuda.synchronize()
        n = 3 * ct // bs
        for layer in range(LAYERS):
            for j in range(n):
                assert torch.equal(caches[layer][:, tb[j]], snap[layer][:, ta[j]]), (layer, j)
            for j in range(n, len(tb)):
                assert bool((caches[layer][:, tb[j]] == poison).all()), (layer, j)
            assert torch.equal(caches[layer][:, ta], snap[layer][:, ta])
    finally:
        eng.close()


# Attention kinds: refused when the connector is built --------------------


@dataclass
class FullAttentionSpec:
    block_size: int = BS
    num_kv_heads: int = HEADS
    head_size: int = DIM
    head_size_v: Optional[int] = None
    sliding_window: Optional[int] = None
    attention_chunk_size: Optional[int] = None


@dataclass
class SlidingWindowSpec(FullAttentionSpec):
    pass


@dataclass
class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclass
class MambaSpec:
    block_size: int = BS


@dataclass
class KVCacheGroupSpec:
    layer_names: List[str]
    kv_cache_spec: Any


def hf(**kw: Any) -> Any:
    """A transformers-shaped model config (Llama-like, 3 layers)."""
    from types import SimpleNamespace

    base = dict(model_type="llama", num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=HEADS, max_position_embeddings=4096)
    base.update(kw)
    return SimpleNamespace(**base)


def group(spec: Any, n: int = LAYERS) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(NAMES[:n], spec)


@pytest.mark.parametrize(
    "model,groups,feature",
    [
        # Mistral-style window shorter than max_model_len.
        (ModelConfig(hf_config=hf(model_type="mistral", sliding_window=1024), max_model_len=4096), [], "sliding_window"),
        # Gemma-style alternating layers: two groups in vLLM's hybrid manager.
        (
            ModelConfig(hf_config=hf(sliding_window=512, layer_types=["sliding_attention", "sliding_attention", "full_attention"]), max_model_len=4096),
            [group(SlidingWindowSpec(sliding_window=512), 2), group(FullAttentionSpec(), 1)],
            "sliding_window",
        ),
        # DeepSeek-V2/V3 with MLA: from the config, or from vLLM's spec alone.
        (ModelConfig(hf_config=hf(model_type="deepseek_v2", kv_lora_rank=512, qk_rope_head_dim=64)), [], "mla"),
        (ModelConfig(), [group(MLAAttentionSpec(head_size=576))], "mla"),
        # Hybrid: Qwen3-Next-style linear attention layers; a Mamba group.
        (ModelConfig(hf_config=hf(layer_types=["linear_attention", "linear_attention", "full_attention"])), [], "hybrid"),
        (ModelConfig(), [group(FullAttentionSpec(), 1), group(MambaSpec(), 2)], "hybrid"),
        # K and V of different head sizes; two groups of full attention.
        (ModelConfig(), [group(FullAttentionSpec(head_size=192, head_size_v=128))], "kv_shapes"),
        (ModelConfig(), [group(FullAttentionSpec(), 2), group(FullAttentionSpec(head_size=32), 1)], "hybrid"),
        (ModelConfig(), [group(SlidingWindowSpec(sliding_window=256))], "sliding_window"),
    ],
    ids=["mistral", "gemma", "mla-config", "mla-spec", "linear-attention", "mamba-group", "kv-head-sizes", "two-groups", "window-spec"],
)
def test_unsupported_attention_is_refused_when_the_connector_is_built(model, groups, feature):
    """Each kind the connector cannot restore exactly raises
    UnsupportedModel (a ValueError) from the constructor, scheduler and
    worker alike, before any runtime is opened."""
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        with pytest.raises(UnsupportedModel) as e:
            TuttiConnector(vllm_config(model_config=model), role, KVCacheConfig(kv_cache_groups=groups))
        assert e.value.feature == feature and isinstance(e.value, ValueError)


def test_supported_attention_is_accepted():
    """Full attention (GQA), a window no shorter than max_model_len, and
    Qwen2's switched-off window pass the check; one full-attention group
    of every layer is the layout the connector reads."""
    for model in (
        ModelConfig(hf_config=hf(), max_model_len=4096),
        ModelConfig(hf_config=hf(model_type="mistral", sliding_window=4096), max_model_len=4096),
        ModelConfig(hf_config=hf(model_type="qwen2", sliding_window=4096, use_sliding_window=False), max_model_len=32768),
    ):
        check_vllm_model(vllm_config(model_config=model), KVCacheConfig(kv_cache_groups=[group(FullAttentionSpec())]))
    eng = Engine("flash_attn", make_caches("flash_attn", rand_fill(3)), vllm_config(model_config=ModelConfig(hf_config=hf(), max_model_len=4096)))
    eng.close()


def test_a_writer_whose_tensor_stays_pinned_closes_without_raising_and_keeps_its_lock_until_shutdown(caplog):
    """On the H200 (2026-12-05) a save that timed out left one KV tensor
    pinned; the writer's close raised at engine shutdown. Now it logs,
    drops the store, and keeps the store's lock until the runtime has shut
    down (the abandoned I/O may still land until then); other errors
    still raise."""
    import tutti
    from tutti.integrations.vllm.state import SharedRuntime, Writer

    class Lock:
        released = 0

        def release(self):
            self.released += 1

    class Client:
        def __init__(self, error):
            self.error = error

        def close(self):
            raise self.error

    class Runtime:
        down = False

        def shutdown(self):
            assert lock.released == 0, "the lock is kept until the runtime is down"
            self.down = True

    lock = Lock()
    w = Writer(object(), lock)
    w.client = Client(tutti.MemoryRegistrationError("memory region is in use by 1 operation(s)"))
    with caplog.at_level("WARNING", logger="tutti.vllm"):
        assert w.close() is False
    assert (w.client, w.store, lock.released) == (None, None, 0)
    assert "in use by 1 operation" in caplog.text

    shared = SharedRuntime.__new__(SharedRuntime)  # without opening a runtime
    import threading

    shared._lock, shared.readers, shared.held_locks = threading.Lock(), {}, []
    shared.runtime = Runtime()
    w2 = Writer(object(), lock)
    w2.client = Client(tutti.MemoryRegistrationError("memory still used by a put that has not been waited on"))
    shared.writers = {"kv": w2}
    shared.close()
    assert shared.runtime.down and lock.released == 1 and shared.held_locks == []

    other = Lock()
    w3 = Writer(object(), other)
    w3.client = Client(RuntimeError("something else"))
    with pytest.raises(RuntimeError, match="something else"):
        w3.close()
    assert other.released == 0

    clean = Lock()
    w4 = Writer(object(), clean)
    assert w4.close() is True and clean.released == 1


def test_vllm_ttft_bench_sizes_slots_to_one_block_and_sets_the_engines_environment(monkeypatch):
    """bench/vllm_ttft.py (run on the H200): one slot holds K and V of one
    vLLM block of one layer (vLLM 0.26's FlashAttention cache), so a
    store of N bytes holds N bytes of KV; the engines get one hardware
    queue per stream and the PyTorch sampler unless told otherwise."""
    import importlib.util
    import os as _os

    path = _os.path.join(_os.path.dirname(__file__), "..", "bench", "vllm_ttft.py")
    spec = importlib.util.spec_from_file_location("vllm_ttft", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.slot_bytes(16) == 16 * 8 * 128 * 2 * 2 == 64 * 1024
    assert bench.slot_bytes(128) == 512 * 1024
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "1")
    env = bench.phase_env()
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "1", "a value already set is kept"


def test_the_stats_file_is_written_when_events_change_not_on_every_step(tmp_path, monkeypatch):
    """The host-time counters move on every step (vLLM calls wait_for_save
    each step, decode included): they alone must not rewrite the stats
    file; shutdown writes the final figures."""
    import os as _os

    path = str(tmp_path / "stats")
    form = "flash_attn"
    eng = Engine(form, make_caches(form, rand_fill(71)), cfg=vllm_config({"stats_file": path}))
    writes: List[str] = []
    real = _os.replace
    monkeypatch.setattr(_os, "replace", lambda a, b: (writes.append(b), real(a, b))[1])
    try:
        ta, _ = tables(72)
        meta, errors, _ = eng.prefill(Request("A", prompt(2 * CT + 1, seed=73)), ta)
        assert errors == set() and meta.saves
        after_save = len(writes)
        assert after_save >= 1
        empty = SchedulerOutput([], num_scheduled_tokens={})
        for _ in range(50):
            eng.step(empty)  # decode-like steps: nothing loaded or saved
        assert len(writes) - after_save <= 2, writes[after_save:]
    finally:
        eng.close()
    final = json.load(open(f"{path}.worker0.json"))
    assert final["objects_saved"] > 0 and final["save_wait_us"] > 0
