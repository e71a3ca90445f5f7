"""TuttiConnector on ``daemon`` drives: one ``tuttid`` owns four file-backed
emulated drives; tensor-parallel workers in their own processes reach them
through it (stores ``kv0`` on d0+d1, ``kv1`` on d2+d3), staging vLLM's KV
blocks through shared memory (vLLM's tensors, here numpy arrays the
workers allocate, are not memory a daemon drive can reach); the scheduler
in this process reads the stores through the daemon too. Without vLLM: the
fake vLLM objects of test_vllm.py. What each test proves is in its
docstring. Skips without a tuttid binary (``cargo build -p tuttid``)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

import tutti
from test_vllm import (
    BPC,
    CT,
    LAYERS,
    NAMES,
    POISON,
    KVCacheBlocks,
    KVCacheConfig,
    KVConnectorRole,
    CachedRequestData,
    NewRequestData,
    ParallelConfig,
    Request,
    SchedulerOutput,
    TuttiConnector,
    block,
    make_caches,
    poison_fill,
    prompt,
    rand_fill,
    tables,
    vllm_config,
)
from tuttid_helper import Daemon, tuttid_binary
from tutti.engine import KvCacheClient, StagingStore
from tutti.engine.layouts import ContiguousChunks
from tutti.integrations.vllm.locks import StoreBusy

HERE = os.path.dirname(os.path.abspath(__file__))
FORM = "flash_attn"
WORLD = 2


@pytest.fixture
def daemon(tmp_path):
    binary = tuttid_binary()
    if binary is None:
        pytest.skip("no tuttid binary (cargo build -p tuttid)")
    d = Daemon(binary, tmp_path)
    yield d
    d.stop()


def rank_config(yaml: str, rank: Optional[int], extra: Optional[Dict[str, Any]] = None):
    par = ParallelConfig(WORLD)
    if rank is not None:
        par.rank = rank  # type: ignore[attr-defined]
    e = {"store": "kv{rank}", "lookup_refresh_s": 0.0, "timeout_s": 5.0}
    e.update(extra or {})
    return vllm_config(e, yaml=yaml, parallel_config=par)


def saved_caches(rank: int) -> List[np.ndarray]:
    """The KV caches rank ``rank``'s saving worker computes (deterministic)."""
    return make_caches(FORM, rand_fill(700 + rank))


# The worker process ---------------------------------------------------------


def worker_main(yaml: str, rank: int, fill: str, extra_json: str) -> None:
    """A worker process of rank ``rank``: its caches (``saved``: rank's
    random KV; ``poison``: all POISON), a worker-side connector registered
    on them; then one command per stdin line: ``step <pickled metadata>``
    (one forward pass in vLLM's order; prints the load-error blocks as
    JSON), ``poison <json block ids>`` (those blocks of every layer set to
    POISON), ``recompute <json [[dst, src], ...]>`` (block dst of every
    layer set to what this rank computed for block src, as vLLM's
    recompute would), ``dump <path>`` (np.save of the caches), ``stats``, ``quit``."""
    caches = saved_caches(rank) if fill == "saved" else make_caches(FORM, poison_fill)
    w = TuttiConnector(rank_config(yaml, rank, json.loads(extra_json)), KVConnectorRole.WORKER, KVCacheConfig())
    named = dict(zip(NAMES, caches))
    w.register_kv_caches(named)
    staging = w._writer.client.staging
    print(json.dumps({"ready": True, "staged": staging is not None and staging.nbytes}), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "step":
            meta = pickle.loads(base64.b64decode(arg))
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            for name in NAMES:
                w.wait_for_layer_load(name)
                w.save_kv_layer(name, named[name], None)
            w.wait_for_save()
            errors = sorted(w.get_block_ids_with_load_errors())
            w.clear_connector_metadata()
            print(json.dumps({"errors": errors}), flush=True)
        elif cmd == "dump":
            np.save(arg, np.stack(caches))
            print(json.dumps({"dumped": arg}), flush=True)
        elif cmd == "poison":
            for b in json.loads(arg):
                for t in caches:
                    block(FORM, t, b)[...] = POISON
            print(json.dumps({"poisoned": True}), flush=True)
        elif cmd == "recompute":  # vLLM recomputing blocks: the saved KV of (dst, src) pairs
            ref = saved_caches(rank)
            for dst, src in json.loads(arg):
                for t, r in zip(caches, ref):
                    block(FORM, t, dst)[...] = block(FORM, r, src)
            print(json.dumps({"recomputed": True}), flush=True)
        elif cmd == "stats":
            print(json.dumps(w.stats()), flush=True)
        elif cmd == "quit":
            break
    w.shutdown()
    print(json.dumps({"bye": True}), flush=True)


class Worker:
    """A worker process (``worker_main``) driven over its stdin/stdout."""

    def __init__(self, yaml: str, rank: int, fill: str, extra: Optional[Dict[str, Any]] = None) -> None:
        code = (
            f"import sys; sys.path.insert(0, {HERE!r}); import test_vllm_daemon as t; "
            f"t.worker_main({yaml!r}, {rank}, {fill!r}, {json.dumps(extra or {})!r})"
        )
        self.rank = rank
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
        self.hello = self.reply()

    def reply(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker {self.rank} exited with {self.proc.wait(30)}")
        return json.loads(line)

    def send(self, cmd: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.reply()

    def step(self, meta: Any) -> List[int]:
        return self.send("step " + base64.b64encode(pickle.dumps(meta)).decode())["errors"]

    def caches(self, tmp: Path) -> np.ndarray:
        path = str(tmp / f"caches{self.rank}-{self.proc.pid}.npy")
        self.send("dump " + path)
        return np.load(path)

    def quit(self) -> None:
        assert self.send("quit") == {"bye": True}
        assert self.proc.wait(60) == 0


def schedule(sched: TuttiConnector, req: Request, blocks: List[int], local: int = 0):
    """vLLM's scheduler for one new request: lookup, allocation, the step's metadata."""
    ext, is_async = sched.get_num_new_matched_tokens(req, local)
    assert is_async is False
    sched.update_state_after_alloc(req, KVCacheBlocks(blocks), ext)
    done = local + ext
    out = SchedulerOutput([NewRequestData(req.request_id, req.prompt_token_ids, (blocks,), done)], num_scheduled_tokens={req.request_id: req.num_tokens - done})
    return ext, sched.build_connector_meta(out)


def find_object(d: Daemon, drives: List[str], payload: bytes):
    """(image path, byte offset) of ``payload``'s one copy on ``drives``."""
    hits = []
    for dr in drives:
        data = d.image(dr).read_bytes()
        at = data.find(payload)
        while at >= 0:
            hits.append((d.image(dr), at))
            at = data.find(payload, at + 1)
    assert len(hits) == 1, hits
    return hits[0]


# Tests ------------------------------------------------------------------------


def test_staging_store_round_trips_through_a_daemon_drive(daemon):
    """KvCacheClient over numpy arrays on daemon drives: the store refuses
    the arrays (not shared memory), so the client stages them through a
    SharedBuffer; a save and a load in several rounds (a 48 KiB buffer,
    16 KiB objects) bring back every byte, and a byte flipped on the drive
    image makes that chunk a checksum_mismatch whose bytes are never copied
    out (the destination keeps its old bytes). staging_bytes=0 raises the
    refusal."""
    yaml = daemon.client_yaml([["d0", "d1"], ["d2", "d3"]])
    rt = tutti.Runtime.from_yaml(yaml)
    try:
        kv = tutti.KvStore.open(rt, "kv0")
        with pytest.raises(tutti.MemoryRegistrationError, match="shared"):
            kv.register(np.zeros(4096, np.uint8))
        rng = np.random.default_rng(5)
        src = [rng.standard_normal((6, 2 * 2 * CT * 64)).astype(np.float32) for _ in range(3)]
        dst = [np.full_like(x, POISON) for x in src]
        toks = prompt(5 * CT + 3, seed=6)
        with pytest.raises(tutti.MemoryRegistrationError):
            KvCacheClient(kv, ContiguousChunks(src, kv_heads=2, chunk_tokens=CT, head_dim=64), "m", staging_bytes=0)
        save = KvCacheClient(kv, ContiguousChunks(src, kv_heads=2, chunk_tokens=CT, head_dim=64), "m")
        assert isinstance(save.staging, StagingStore) and save.staging.nbytes == 64 << 20
        assert save.save(toks).stored_chunks == 5
        load = KvCacheClient(kv, ContiguousChunks(dst, kv_heads=2, chunk_tokens=CT, head_dim=64), "m", staging_bytes=48 << 10)
        r = load.load(toks)
        assert (r.cached_chunks, r.failures) == (5, [])
        for layer in range(3):
            assert np.array_equal(dst[layer][:5], src[layer][:5])
            assert (dst[layer][5:] == POISON).all()
        assert load.staging is not None and load.staging.copied_bytes == 5 * 3 * src[0][0].nbytes
        # Corrupt chunk 3 of layer 1 on the drive image (the daemon reads the file in place).
        img, at = find_object(daemon, ["d0", "d1"], src[1][3].tobytes()[:4096])
        with open(img, "r+b") as f:
            f.seek(at + 100)
            b = f.read(1)
            f.seek(at + 100)
            f.write(bytes([b[0] ^ 0x5A]))
        for layer in range(3):
            dst[layer][:] = POISON
        r = load.load(toks)
        assert r.cached_chunks == 3 and [(f.chunk, f.layer, f.kind) for f in r.failures] == [(3, 1, "checksum_mismatch")]
        assert (dst[1][3] == POISON).all(), "a corrupted object's bytes are never copied out"
        for layer in range(3):
            assert np.array_equal(dst[layer][:3], src[layer][:3])
        save.close()
        load.close()
    finally:
        rt.shutdown()


def test_tensor_parallel_workers_share_one_daemon(daemon, tmp_path):
    """tensor_parallel_size 2 on one tuttid: two worker processes (ranks 0
    and 1, stores kv0 on d0+d1 and kv1 on d2+d3, each its own writer) save
    request A's 4 chunks, staging through shared memory. The scheduler in
    this process (a third process) sees them through the daemon's drives
    (4 chunks offered for B). Then both workers exit, and two new worker
    processes with poisoned caches load B: each rank's blocks equal what
    that rank saved (bit for bit, every layer) and differ from the other
    rank's, and no other block is written. A second writer of a rank's
    store is refused (StoreBusy) while its worker lives. Then a byte of one
    of rank 1's objects (chunk 2, layer 1) is flipped on the drive image:
    a third load reports rank 1's blocks of chunks 2 and 3 as load errors
    (vLLM recomputes them), rank 1's chunks 0 and 1 and all of rank 0's
    load exactly (into blocks poisoned first), and the corrupted object's
    bytes (K of that block) are not written (still poisoned: never the
    corrupted bytes). The removal is durable (the scheduler then offers 2
    chunks); once vLLM reports the failed blocks
    (``update_connector_output``) and recomputes them, the next step saves
    chunks 2 and 3 again (rank 1 puts the one missing object), the
    scheduler offers 4 chunks, and a last load brings back every byte."""
    yaml = daemon.client_yaml([["d0", "d1"], ["d2", "d3"]])
    ta, tb = tables(61)
    a = Request("A", prompt(4 * CT + 5, seed=62))
    sched = TuttiConnector(rank_config(yaml, None), KVConnectorRole.SCHEDULER, KVCacheConfig())
    try:
        savers = [Worker(yaml, r, "saved") for r in range(WORLD)]
        try:
            assert all(w.hello["staged"] == 64 << 20 for w in savers)
            ext, meta = schedule(sched, a, ta)
            assert ext == 0 and [len(s.token_ids) // CT for s in meta.saves] == [4]
            assert [w.step(meta) for w in savers] == [[], []]
            assert [w.send("stats")["objects_saved"] for w in savers] == [4 * BPC * 2 * LAYERS] * 2
            sched.request_finished(a, ta)
            with pytest.raises(StoreBusy):
                TuttiConnector(rank_config(yaml, 1), KVConnectorRole.WORKER, KVCacheConfig())
        finally:
            for w in savers:
                w.quit()

        def load_b(name: str, finish: bool = True):
            b = Request(name, a.prompt_token_ids[: 4 * CT] + [7, 7, 7])
            ext, meta = schedule(sched, b, tb)
            assert ext == 4 * CT and [(ld.local_tokens, ld.end_tokens) for ld in meta.loads] == [(0, 4 * CT)]
            errors = [w.step(meta) for w in loaders]
            if finish:
                sched.request_finished(b, tb)
            return b, errors

        saved = [saved_caches(r) for r in range(WORLD)]
        loaders = [Worker(yaml, r, "poison") for r in range(WORLD)]
        try:
            assert load_b("B")[1] == [[], []]
            got = [w.caches(tmp_path) for w in loaders]
            for r in range(WORLD):
                for layer in range(LAYERS):
                    for j in range(4 * BPC):
                        assert np.array_equal(block(FORM, got[r][layer], tb[j]), block(FORM, saved[r][layer], ta[j])), (r, layer, j)
                        assert not np.array_equal(block(FORM, got[r][layer], tb[j]), block(FORM, saved[1 - r][layer], ta[j]))
                    others = [x for x in range(got[r][layer].shape[1]) if x not in tb[: 4 * BPC]]
                    assert (got[r][layer][:, others] == POISON).all()
            assert [w.send("stats")["tokens_loaded"] for w in loaders] == [4 * CT, 4 * CT]

            # Corrupt rank 1's K of chunk 2's first block in layer 1.
            j = 2 * BPC
            img, at = find_object(daemon, ["d2", "d3"], block(FORM, saved[1][1], ta[j])[0].tobytes())
            with open(img, "r+b") as f:
                f.seek(at + 8)
                byte = f.read(1)
                f.seek(at + 8)
                f.write(bytes([byte[0] ^ 0xFF]))
            for w in loaders:
                w.send("poison " + json.dumps(tb))
            b2, errors = load_b("B2", finish=False)
            assert errors == [[], sorted(tb[2 * BPC : 4 * BPC])]
            again = [w.caches(tmp_path) for w in loaders]
            # K of that block is the corrupted object: never copied out.
            assert (block(FORM, again[1][1], tb[j])[0] == POISON).all(), "the corrupted object's bytes were not copied"
            for r in range(WORLD):
                for layer in range(LAYERS):
                    for jj in range(2 * BPC if r == 1 else 4 * BPC):
                        assert np.array_equal(block(FORM, again[r][layer], tb[jj]), block(FORM, saved[r][layer], ta[jj]))
            # The corrupt object was removed (durably: the scheduler's view
            # from the media misses it too), so every rank holds 2 chunks.
            c = Request("C", a.prompt_token_ids[: 4 * CT] + [9])
            assert sched.get_num_new_matched_tokens(c, 0) == (2 * CT, False)

            # vLLM recomputes the failed blocks (every rank) and tells the
            # scheduler which blocks failed: the recomputed chunks are saved
            # again, the removed object only (the rest is present).
            sched.update_connector_output(SimpleNamespace(invalid_block_ids=set(errors[1])))
            for w in loaders:
                w.send("recompute " + json.dumps([[tb[x], ta[x]] for x in range(2 * BPC, 4 * BPC)]))
            before = [w.send("stats")["objects_saved"] for w in loaders]
            out = SchedulerOutput(
                scheduled_cached_reqs=CachedRequestData(["B2"], set(), [None], [2 * CT]), num_scheduled_tokens={"B2": b2.num_tokens - 2 * CT}
            )
            meta = sched.build_connector_meta(out)
            assert [(sv.first_chunk, len(sv.token_ids) // CT) for sv in meta.saves] == [(2, 4)]
            assert [w.step(meta) for w in loaders] == [[], []]
            assert [w.send("stats")["objects_saved"] - x for w, x in zip(loaders, before)] == [0, 1]
            sched.request_finished(b2, tb)
            assert sched.get_num_new_matched_tokens(c, 0) == (4 * CT, False)
            for w in loaders:
                w.send("poison " + json.dumps(tb))
            assert load_b("B3")[1] == [[], []]
            final = [w.caches(tmp_path) for w in loaders]
            for r in range(WORLD):
                for layer in range(LAYERS):
                    for jj in range(4 * BPC):
                        assert np.array_equal(block(FORM, final[r][layer], tb[jj]), block(FORM, saved[r][layer], ta[jj]))
        finally:
            for w in loaders:
                w.quit()
    finally:
        sched.shutdown()


def test_transformers_prefix_cache_on_a_daemon_drive(daemon):
    """transformers' PrefixCache (tiny random-weight Llama on CPU) over a
    daemon drive: its staging buffers are refused by the store and staged
    through shared memory; the restored K and V equal the saved ones in
    every layer and greedy generation with the restored prefix equals
    generation from scratch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tutti.integrations.transformers import PrefixCache, cache_of

    torch.manual_seed(1234)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512
    )
    model = transformers.LlamaForCausalLM(cfg).to(dtype=torch.float32).eval()
    ids = torch.randint(0, 128, (1, 3 * CT + 5), generator=torch.Generator().manual_seed(1))
    rt = tutti.Runtime.from_yaml(daemon.client_yaml([["d0", "d1"]]))
    try:
        kv = tutti.KvStore.open(rt, "kv0")
        pc = PrefixCache(model, kv, model_id="tiny-llama-seed1234", chunk_tokens=CT, max_tokens=8 * CT, timeout=10.0)
        assert pc.client.staging is not None
        with torch.no_grad():
            saved = cache_of(model(ids, use_cache=True))
            assert pc.save(ids, saved).stored_chunks == 3
            cache, info = pc.restore(ids)
            assert info.cached_tokens == 3 * CT
            for layer in range(cfg.num_hidden_layers):
                assert torch.equal(cache.layers[layer].keys, saved.layers[layer].keys[:, :, : 3 * CT, :])
                assert torch.equal(cache.layers[layer].values, saved.layers[layer].values[:, :, : 3 * CT, :])
            scratch = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
            out, info = pc.generate(ids, max_new_tokens=8, do_sample=False)
        assert info.cached_tokens == 3 * CT and torch.equal(out.sequences, scratch)
        pc.close()
        del kv
    finally:
        rt.shutdown()
