"""TuttiConnector with the scheduler and the worker in different processes
(vLLM's multiprocess executor) and with tensor-parallel ranks, without
vLLM: the fake vLLM objects of test_vllm.py, file-backed emulated drives.
What each test proves is in its docstring."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List

import numpy as np
import pytest

from conftest import one_drive_yaml
from test_vllm import (
    BPC,
    CT,
    POISON,
    Engine,
    KVCacheBlocks,
    KVCacheConfig,
    KVConnectorRole,
    NewRequestData,
    ParallelConfig,
    Request,
    SchedulerOutput,
    TuttiConnector,
    block,
    make_caches,
    prompt,
    rand_fill,
    set_blocks,
    tables,
    vllm_config,
)
from tutti.integrations.vllm.locks import StoreBusy, lock_paths

HERE = os.path.dirname(os.path.abspath(__file__))


def file_yaml(path: str) -> str:
    return one_drive_yaml(backing="{ file: " + path + " }", capacity="32MiB").replace("slot_size: 1MiB", "slot_size: 16KiB")


def child_saves(yaml: str) -> None:
    """Run in a child process: one process's scheduler and worker save
    request A's 4 chunks, print "saved", then hold the store (and its writer
    lock) until stdin closes."""
    ta, _ = tables(31)
    eng = Engine("flash_attn", make_caches("flash_attn", rand_fill(32)), vllm_config(yaml=yaml))
    a = Request("A", prompt(4 * CT + 5, seed=33))
    _, errors, _ = eng.prefill(a, ta)
    assert errors == set()
    print("saved", flush=True)
    sys.stdin.read()
    eng.close()


def test_scheduler_in_another_process_finds_what_the_worker_stored(tmp_path):
    """A worker in a child process saves A's chunks to a file-backed drive
    and keeps it open. In this process a scheduler-only connector (vLLM's
    EngineCore) finds them through a read-only view of the store: it offers
    4 chunks for B, whose first 4 chunks are A's, and 0 for an unrelated
    prompt. A second writer of the same store is refused (StoreBusy) while
    the child holds it, and allowed after the child exits."""
    yaml = file_yaml(str(tmp_path / "d0.img"))
    code = f"import sys; sys.path.insert(0, {HERE!r}); import test_vllm_multiprocess as t; t.child_saves({yaml!r})"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "saved"
        cfg = vllm_config({"lookup_refresh_s": 0.0}, yaml=yaml)
        s = TuttiConnector(cfg, KVConnectorRole.SCHEDULER, KVCacheConfig())
        try:
            a = prompt(4 * CT + 5, seed=33)
            assert s.get_num_new_matched_tokens(Request("B", a[: 4 * CT] + [7, 7]), 0) == (4 * CT, False)
            assert s.get_num_new_matched_tokens(Request("B2", a[: 2 * CT] + [7] * 40), 0) == (2 * CT, False)
            assert s.get_num_new_matched_tokens(Request("C", prompt(4 * CT, seed=99)), 0) == (0, False)
            with pytest.raises(StoreBusy):
                TuttiConnector(cfg, KVConnectorRole.WORKER, KVCacheConfig())
        finally:
            s.shutdown()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(timeout=60) == 0
    w = TuttiConnector(vllm_config(yaml=yaml), KVConnectorRole.WORKER, KVCacheConfig())
    w.shutdown()


def test_scheduler_before_the_worker_sees_a_blank_store(tmp_path):
    """A scheduler that starts before any worker formatted the store (a
    blank drive) offers nothing and writes nothing (the image stays all
    zeros)."""
    img = tmp_path / "d0.img"
    s = TuttiConnector(vllm_config({"lookup_refresh_s": 0.0}, yaml=file_yaml(str(img))), KVConnectorRole.SCHEDULER, KVCacheConfig())
    try:
        assert s.get_num_new_matched_tokens(Request("B", prompt(4 * CT + 1)), 0) == (0, False)
    finally:
        s.shutdown()
    assert not any(img.read_bytes())


def tp_yaml(tmp_path) -> str:
    """Two file-backed drives, store kv0 on d0 and kv1 on d1 (16 KiB slots)."""
    drives = "".join(
        f"  d{r}: {{ emulated: {{ namespaces: [{{ capacity: 32MiB, block_size: 4096 }}], backing: {{ file: {tmp_path}/d{r}.img }} }} }}\n" for r in (0, 1)
    )
    return (
        f"drives:\n{drives}resolvers:\n  r0: {{ slab: {{ slot_size: 16KiB }} }}\n  r1: {{ slab: {{ slot_size: 16KiB }} }}\n"
        "datapaths:\n  p0: { local_nvme: { drive: d0 } }\n  p1: { local_nvme: { drive: d1 } }\n"
        "stores:\n  kv0: { resolver: r0, datapath: p0 }\n  kv1: { resolver: r1, datapath: p1 }\n"
    )


def test_tensor_parallel_ranks_save_and_load_their_own_shards(tmp_path):
    """tensor_parallel_size 2, store "kv{rank}": each rank's worker saves its
    own shard into its own store under rank-qualified keys and loads only
    its own shard back (bit-identical, the other rank's bytes differ); the
    scheduler offers the chunks every rank holds: after rank 1 loses chunk
    2, only 2 chunks. A store name without {rank} is refused."""
    yaml = tp_yaml(tmp_path)
    assert lock_paths(yaml, "kv1") == [f"{tmp_path}/d1.img"]
    with pytest.raises(ValueError, match="tensor_parallel_size 2"):
        TuttiConnector(vllm_config(yaml=yaml, parallel_config=ParallelConfig(tensor_parallel_size=2)), KVConnectorRole.WORKER, KVCacheConfig())
    ta, tb = tables(41)
    caches: List[List[np.ndarray]] = [make_caches("flash_attn", rand_fill(42 + r)) for r in (0, 1)]
    for c in caches:
        set_blocks("flash_attn", c, tb, POISON)
    sched = TuttiConnector(vllm_config({"store": "kv{rank}"}, yaml=yaml, parallel_config=ParallelConfig(2)), KVConnectorRole.SCHEDULER, KVCacheConfig())
    engines = []
    for r in (0, 1):
        par = ParallelConfig(2)
        par.rank = r  # type: ignore[attr-defined]
        w = TuttiConnector(vllm_config({"store": "kv{rank}"}, yaml=yaml, parallel_config=par), KVConnectorRole.WORKER, KVCacheConfig())
        e = Engine.__new__(Engine)
        e.form, e.sched, e.worker = "flash_attn", sched, w
        e.caches = dict(zip([f"model.layers.{i}.self_attn.attn" for i in range(3)], caches[r]))
        w.register_kv_caches(e.caches)
        engines.append(e)
    try:
        a = Request("A", prompt(4 * CT + 5, seed=43))
        sched.update_state_after_alloc(a, KVCacheBlocks(ta), sched.get_num_new_matched_tokens(a, 0)[0])
        meta = sched.build_connector_meta(SchedulerOutput([NewRequestData("A", a.prompt_token_ids, (ta,), 0)], num_scheduled_tokens={"A": a.num_tokens}))
        for e in engines:
            assert run_step(e, meta) == set()
        b = Request("B", a.prompt_token_ids[: 4 * CT] + [7, 7, 7])
        assert sched.get_num_new_matched_tokens(b, 0) == (4 * CT, False)
        sched.update_state_after_alloc(b, KVCacheBlocks(tb), 4 * CT)
        meta = sched.build_connector_meta(SchedulerOutput([NewRequestData("B", b.prompt_token_ids, (tb,), 4 * CT)], num_scheduled_tokens={"B": 3}))
        for r, e in enumerate(engines):
            assert run_step(e, meta) == set()
            for layer in range(3):
                for j in range(4 * BPC):
                    assert np.array_equal(block("flash_attn", caches[r][layer], tb[j]), block("flash_attn", caches[r][layer], ta[j]))
                    assert not np.array_equal(block("flash_attn", caches[r][layer], tb[j]), block("flash_attn", caches[1 - r][layer], ta[j]))
        c1 = engines[1].worker._writer.client
        assert all(s.ok for s in c1.store.remove(c1.keys.chunk_object_keys(c1.chunk_keys(a.prompt_token_ids)[2])))
        assert sched.get_num_new_matched_tokens(Request("B3", b.prompt_token_ids), 0) == (2 * CT, False)
    finally:
        for e in engines:
            e.worker.shutdown()
        sched.shutdown()


def run_step(e: Engine, meta) -> set:
    """One forward pass of one rank's worker, in vLLM's order."""
    e.worker.bind_connector_metadata(meta)
    e.worker.start_load_kv(None)
    for name in e.caches:
        e.worker.wait_for_layer_load(name)
        e.worker.save_kv_layer(name, e.caches[name], None)
    e.worker.wait_for_save()
    errors = e.worker.get_block_ids_with_load_errors()
    e.worker.clear_connector_metadata()
    return errors


def test_writer_lock_paths(tmp_path, monkeypatch):
    """The writer lock covers exactly the store's drives: its file
    backings, a lock file per daemon drive, nothing for RAM drives; without
    PyYAML, every file backing of the config (coarser, still safe)."""
    from tutti.integrations.vllm import locks

    yaml = tp_yaml(tmp_path)
    assert lock_paths(yaml, "kv0") == [f"{tmp_path}/d0.img"]
    assert lock_paths(one_drive_yaml(), "kv") == []
    daemon = "drives:\n  d0: { daemon: { socket: /run/tutti.sock, drive: d0 } }\ndatapaths:\n  p: { local_nvme: { drive: d0 } }\nstores:\n  kv: { resolver: r, datapath: p }\n"
    (p,) = lock_paths(daemon, "kv")
    assert p.endswith(".lock") and p != lock_paths(daemon.replace("/run/tutti.sock", "/run/other.sock"), "kv")[0]
    monkeypatch.setattr(locks, "_parse", lambda text: None)
    assert lock_paths(yaml, "kv0") == [f"{tmp_path}/d0.img", f"{tmp_path}/d1.img"]


def test_a_restarted_worker_does_not_rewrite_its_manifest(tmp_path):
    """The manifest is put when the store lacks it (first start) and not
    again by a restart with the same layout (no put at all); the restarted
    scheduler-side reader still decodes it into the worker's key scheme."""
    from tutti.integrations.vllm.reader import StoreReader

    yaml = file_yaml(str(tmp_path / "d0.img"))
    for start in range(2):
        eng = Engine("flash_attn", make_caches("flash_attn", rand_fill(61)), vllm_config(yaml=yaml))
        try:
            assert eng.worker._writer.store.stats()["puts"] == (1 if start == 0 else 0)
            scheme = eng.client.keys
        finally:
            eng.close()
    s = TuttiConnector(vllm_config({"lookup_refresh_s": 0.0}, yaml=yaml), KVConnectorRole.SCHEDULER, KVCacheConfig())
    try:
        assert s.get_num_new_matched_tokens(Request("X", prompt(CT + 1)), 0) == (0, False)
        reader = s._shared.readers["kv"]
        assert isinstance(reader, StoreReader) and reader.scheme == scheme
    finally:
        s.shutdown()
