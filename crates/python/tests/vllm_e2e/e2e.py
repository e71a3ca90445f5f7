"""vLLM end to end with TuttiConnector, on the CPU build of vLLM.

Run by run.sh (which makes the virtual environment). Each engine run is its
own process (``python e2e.py phase ...``), as a restarted server would be;
``python e2e.py`` drives the scenarios and checks them:

1. ``baseline``: no connector; the reference greedy outputs.
2. ``save``: the connector over file-backed emulated drives saves the
   prompts' whole chunks; outputs equal the baseline.
3. ``load``: a new process (a new ``LLM``) finds the prefixes through the
   connector: vLLM's own counters (``vllm:external_prefix_cache_hits``,
   ``RequestOutput.num_cached_tokens``) and the connector's stats show the
   tokens loaded, and the outputs equal the baseline token for token.
4. Faults, each in a new process with ``kv_load_failure_policy:
   recompute``: a corrupted object on the drive image, a missing layer
   object, a read fault on the drive; vLLM recomputes, outputs equal.
5. Variants: vLLM's prefix caching on, another block size, chunked prefill
   with a small token budget.
6. ``tensor_parallel_size`` 2: each rank's worker (a process each) saves
   its shard to its own store (``kv{rank}``, two drives each) and a new
   engine loads both shards; outputs equal the (single-worker) baseline.
7. ``daemon``: ``tensor_parallel_size`` 2 on ``daemon`` drives: one
   ``tuttid`` owns four file-backed emulated drives, the scheduler and both
   workers reach them through it (stores ``kv0`` on d0+d1, ``kv1`` on
   d2+d3), the workers staging vLLM's KV through shared memory; save, then
   load in a new engine; then a byte of a KV object flipped on a drive
   image (while the daemon runs) makes a third engine recompute, outputs
   still equal. Needs ``target/debug/tuttid`` (run.sh builds it) or
   ``TUTTID_BIN``.

``python e2e.py [basic|faults|variants|tp2|daemon|all]`` (default all;
every choice runs the baseline; tp2 or daemon alone skip the rest).

vLLM runs its scheduler (EngineCore) and its worker in separate processes
here (its default on CPU): the scheduler's lookups read the store the
worker writes (tutti.integrations.vllm.reader).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

VOCAB = 512
CHUNK = 64  # tokens per chunk (a multiple of every block size used)


def make_model(path: str) -> None:
    """A 2-layer random-weight Llama (GQA, head size 32), saved with
    ``save_pretrained``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
        torch_dtype="float32",
    )
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(path)


def prompts() -> List[List[int]]:
    """Six prompts: three share a 256-token prefix, two another 192-token
    one, each with its own tail; one stands alone."""
    import random

    rng = random.Random(7)
    seq = lambda n: [rng.randrange(1, VOCAB) for _ in range(n)]  # noqa: E731
    a, b = seq(256), seq(192)
    return [a + seq(40), a + seq(70), a + seq(5), b + seq(90), b + seq(33), seq(150)]


def runtime_yaml(images: str, faults: str = "", stores: int = 1) -> str:
    """Two file-backed emulated drives striped into store "kv" (64 KiB
    slots; ``faults`` on d0 only); with ``stores`` > 1, stores kv0, kv1, ...
    (one per tensor-parallel rank), each striped over its own two drives."""
    drive = "{ emulated: { namespaces: [{ capacity: 64MiB, block_size: 4096 }], backing: { file: %s }%s } }"
    f = f", faults: [{faults}]" if faults else ""
    lines = ["drives:"]
    lines += [f"  d{i}: {drive % (os.path.join(images, f'd{i}.img'), f if i == 0 else '')}" for i in range(2 * stores)]
    names = ["kv"] if stores == 1 else [f"kv{r}" for r in range(stores)]
    lines.append("resolvers:")
    lines += [f"  {n}: {{ slab: {{ slot_size: 64KiB }} }}" for n in names]
    lines.append("datapaths:")
    lines += [
        f"  p{r}: {{ striped_local_nvme: {{ drives: [d{2 * r}, d{2 * r + 1}], stripe_unit: 16KiB, queues_per_drive: 1, queue_depth: 64, execution: cpu }} }}"
        for r in range(stores)
    ]
    lines.append("stores:")
    lines += [f"  {n}: {{ resolver: {n}, datapath: p{r} }}" for r, n in enumerate(names)]
    return "\n".join(lines) + "\n"


def run_phase(a: argparse.Namespace) -> Dict[str, Any]:
    """One engine: generate greedily for ``prompts()``; return the outputs,
    vLLM's counters and the connector's stats."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw: Dict[str, Any] = dict(
        model=a.model, skip_tokenizer_init=True, block_size=a.block_size, max_model_len=1024,
        enable_prefix_caching=a.prefix_caching, enforce_eager=True, dtype="float32",
        disable_log_stats=False, seed=0, kv_cache_memory_bytes=64 << 20,
    )
    if a.chunked:
        kw.update(enable_chunked_prefill=True, max_num_batched_tokens=128)
    if a.tp > 1:
        # vLLM's CPU build binds each worker's threads to its own NUMA node
        # and refuses more workers than nodes (this machine has one).
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        kw.update(tensor_parallel_size=a.tp, distributed_executor_backend="mp")
    if a.connector:
        extra = {"runtime_config": a.runtime_config, "chunk_tokens": CHUNK, "timeout_s": 10.0, "lookup_refresh_s": 0.0, "stats_file": a.stats}
        if a.tp > 1:
            extra["store"] = "kv{rank}"
        kw["kv_transfer_config"] = {
            "kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.integrations.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra,
        }
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0.0, max_tokens=16, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts()], sp, use_tqdm=False)
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if "prefix_cache" in m.name}
    res = {
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "num_cached_tokens": [o.num_cached_tokens for o in outs],
        "metrics": metrics,
    }
    del llm
    return res


def phase(work: str, name: str, *, connector: bool, block_size: int = 32, prefix_caching: bool = False,
          chunked: bool = False, runtime_config: str = "", tp: int = 1) -> Dict[str, Any]:
    """Run one engine in a new process; return its result (and the
    connector's stats, scheduler and worker, when it ran)."""
    out = os.path.join(work, f"{name}.json")
    stats = os.path.join(work, f"{name}.stats")
    cmd = [sys.executable, os.path.abspath(__file__), "phase", "--model", os.path.join(work, "model"), "--out", out,
           "--block-size", str(block_size), "--stats", stats, "--runtime-config", runtime_config, "--tp", str(tp)]
    cmd += ["--connector"] * connector + ["--prefix-caching"] * prefix_caching + ["--chunked"] * chunked
    t0 = time.monotonic()
    log = os.path.join(work, f"{name}.log")
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        sys.stdout.write(open(log).read()[-6000:])
        raise SystemExit(f"phase {name} failed with status {rc} (log: {log})")
    res = json.load(open(out))
    for role in ("scheduler0", "worker0", "worker1"):
        p = f"{stats}.{role}.json"
        res[role] = json.load(open(p)) if os.path.exists(p) else {}
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def main_phase(argv: List[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--stats", required=True)
    p.add_argument("--runtime-config", default="")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--connector", action="store_true")
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--chunked", action="store_true")
    p.add_argument("--tp", type=int, default=1)
    a = p.parse_args(argv)
    res = run_phase(a)
    with open(a.out, "w") as f:
        json.dump(res, f)


def last_data_block(img: str) -> int:
    """The logical block (4 KiB) of the last nonzero block of a drive image
    that is not the worker's manifest (JSON): KV object payload (records
    and superblock sit at the store's start; nothing here is replaced or
    evicted, so no stale payload lies past the live objects)."""
    last = -1
    with open(img, "rb") as f:
        i = 0
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            for j in range(0, len(b), 4096):
                if any(b[j : j + 4096]) and not b[j : j + 2] == b'{"':
                    last = i + j // 4096
            i += len(b) // 4096
    assert last > 0, f"{img} holds no data"
    return last


def copy_images(src: str, dst: str) -> None:
    import shutil

    os.makedirs(dst, exist_ok=True)
    for n in ("d0.img", "d1.img"):
        shutil.copyfile(os.path.join(src, n), os.path.join(dst, n))


def write_config(work: str, name: str, images: str, faults: str = "", stores: int = 1) -> str:
    path = os.path.join(work, f"{name}.yaml")
    os.makedirs(images, exist_ok=True)
    with open(path, "w") as f:
        f.write(runtime_yaml(images, faults, stores))
    return path


def check(name: str, res: Dict[str, Any], base: Dict[str, Any], *, loaded: Optional[bool], errors: bool = False) -> Dict[str, Any]:
    """Outputs equal the baseline's; tokens loaded (or not; None: either,
    e.g. a first run whose later requests find the earlier ones' chunks);
    load errors (or not)."""
    same = res["outputs"] == base["outputs"]
    w, m = res.get("worker0", {}), res["metrics"]
    row = {
        "scenario": name, "outputs_equal": same, "tokens_loaded": w.get("tokens_loaded", 0),
        "load_error_blocks": w.get("load_error_blocks", 0), "objects_saved": w.get("objects_saved", 0),
        "staged_bytes": w.get("staged_bytes", 0),
        "lookup_tokens": res.get("scheduler0", {}).get("lookup_tokens", 0),
        "external_hits": m.get("vllm:external_prefix_cache_hits"), "num_cached_tokens": res["num_cached_tokens"],
        "seconds": res["seconds"],
    }
    print(json.dumps(row), flush=True)
    ok = same and loaded in (None, row["tokens_loaded"] > 0) and (row["load_error_blocks"] > 0) == errors
    ok = ok and (row["objects_saved"] > 0 or loaded is not None)
    if loaded:
        ok = ok and (row["external_hits"] or 0) > 0 and sum(res["num_cached_tokens"]) > 0
    if not ok:
        raise SystemExit(f"FAILED: {name}: {row}")
    return row


def main(only: List[str]) -> None:
    work = tempfile.mkdtemp(prefix="tutti-vllm-e2e-")
    print(f"work dir {work}", flush=True)
    make_model(os.path.join(work, "model"))
    rows, t0 = [], time.monotonic()
    base = phase(work, "baseline", connector=False)
    if only in (["tp2"], ["daemon"]):
        rows = tp_scenarios(work, base) if only == ["tp2"] else daemon_scenarios(work, base)
        print(f"{len(rows)} passed, 0 failed in {time.monotonic() - t0:.0f} s", flush=True)
        return
    cfg = write_config(work, "store", os.path.join(work, "store"))
    rows.append(check("save (process 1)", phase(work, "save", connector=True, runtime_config=cfg), base, loaded=None))
    rows.append(check("load (process 2)", phase(work, "load", connector=True, runtime_config=cfg), base, loaded=True))
    if "faults" in only or "all" in only:
        rows += fault_scenarios(work, base)
    if "variants" in only or "all" in only:
        rows += variant_scenarios(work, base)
    if "tp2" in only or "all" in only:
        rows += tp_scenarios(work, base)
    if "daemon" in only or "all" in only:
        rows += daemon_scenarios(work, base)
    print(f"{len(rows)} passed, 0 failed in {time.monotonic() - t0:.0f} s", flush=True)


def fault_scenarios(work: str, base: Dict[str, Any]) -> List[Dict[str, Any]]:
    """A corrupted object, a missing object, a read fault: vLLM recomputes."""
    rows = []
    src = os.path.join(work, "store")
    lba = last_data_block(os.path.join(src, "d0.img"))
    bad = os.path.join(work, "corrupt")
    copy_images(src, bad)
    with open(os.path.join(bad, "d0.img"), "r+b") as f:
        f.seek(lba * 4096 + 100)
        byte = f.read(1)
        f.seek(lba * 4096 + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    cfg = write_config(work, "corrupt", bad)
    rows.append(check("corrupted object", phase(work, "corrupt", connector=True, runtime_config=cfg), base, loaded=True, errors=True))
    miss = os.path.join(work, "missing")
    copy_images(src, miss)
    cfg = write_config(work, "missing", miss)
    remove_one_object(cfg, os.path.join(work, "model"))
    row = check("missing layer object", phase(work, "missing", connector=True, runtime_config=cfg), base, loaded=True)
    if row["lookup_tokens"] >= full_lookup(work):
        raise SystemExit(f"FAILED: the removed object did not shorten any hit: {row}")
    rows.append(row)
    flt = os.path.join(work, "fault")
    copy_images(src, flt)
    rule = "{ op: read, lba: [%d, %d], action: { fail: { sct: 2, sc: 0x81, dnr: true } } }" % (lba, lba + 1)
    cfg = write_config(work, "fault", flt, faults=rule)
    rows.append(check("drive read fault", phase(work, "fault", connector=True, runtime_config=cfg), base, loaded=True, errors=True))
    return rows


def full_lookup(work: str) -> int:
    """Tokens the scheduler offered in the plain load run."""
    return int(json.load(open(os.path.join(work, "load.stats.scheduler0.json")))["lookup_tokens"])


def remove_one_object(cfg: str, model: str, block_size: int = 32) -> None:
    """Remove the most recently saved KV object (one layer's piece of one
    chunk; not the worker's manifest) from the store, as an eviction would."""
    import tutti
    from tutti.integrations.vllm.reader import manifest_key

    rt = tutti.Runtime.from_file(cfg)
    try:
        kv = tutti.KvStore.open(rt, "kv", create="never")
        manifest = manifest_key(model, 0, 1, CHUNK, block_size, kv.key_size)
        keys = [k for k in kv.keys() if bytes(k) != manifest]  # least recently used first
        assert len(keys) > 2
        st = kv.remove([keys[-1]])
        assert st[0].ok, st[0].message
        kv.sync()
        del kv
    finally:
        rt.shutdown()


def variant_scenarios(work: str, base: Dict[str, Any]) -> List[Dict[str, Any]]:
    """vLLM prefix caching on, block size 64, chunked prefill: save in one
    process, load in the next, outputs equal the baseline."""
    rows = []
    for name, kw in (("prefix caching on", {"prefix_caching": True}), ("block size 64", {"block_size": 64}), ("chunked prefill", {"chunked": True})):
        tag = name.replace(" ", "_")
        cfg = write_config(work, tag, os.path.join(work, tag))
        rows.append(check(f"{name}: save", phase(work, f"{tag}_save", connector=True, runtime_config=cfg, **kw), base, loaded=None))
        rows.append(check(f"{name}: load", phase(work, f"{tag}_load", connector=True, runtime_config=cfg, **kw), base, loaded=True))
    return rows


def tp_scenarios(work: str, base: Dict[str, Any]) -> List[Dict[str, Any]]:
    """tensor_parallel_size 2: each rank's worker saves its shard into its
    own store (kv0, kv1); a new engine loads both shards."""
    cfg = write_config(work, "tp2", os.path.join(work, "tp2"), stores=2)
    rows = [check("tp 2: save", phase(work, "tp2_save", connector=True, runtime_config=cfg, tp=2), base, loaded=None)]
    res = phase(work, "tp2_load", connector=True, runtime_config=cfg, tp=2)
    rows.append(check("tp 2: load", res, base, loaded=True))
    if res["worker1"].get("tokens_loaded") != res["worker0"].get("tokens_loaded"):
        raise SystemExit(f"FAILED: the ranks loaded different token counts: {res['worker0']} {res['worker1']}")
    return rows


def daemon_scenarios(work: str, base: Dict[str, Any]) -> List[Dict[str, Any]]:
    """tensor_parallel_size 2 on daemon drives of one tuttid (scenario 7)."""
    import shutil
    import subprocess as sp

    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    binary = os.environ.get("TUTTID_BIN") or os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(repo, "target")), "debug", "tuttid")
    d = os.path.join(work, "daemon")
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "tutti.sock")
    lines = [f"socket: {sock}", 'socket_mode: "0660"', "lease_ms: 10000", "drives:"]
    for i in range(4):
        lines += [
            f"  d{i}:",
            f"    device: {{ emulated: {{ namespaces: [ {{ capacity: 64MiB, block_size: 4096 }} ], io_queues: 64, backing: {{ file: {d}/d{i}.img }} }} }}",
            f"    allow: {{ uids: [0, {os.getuid()}] }}",
            "    queues_per_client: 16",
        ]
    with open(os.path.join(d, "tuttid.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")
    daemon = sp.Popen([binary, "serve", "--config", os.path.join(d, "tuttid.yaml")], stdout=sp.PIPE, stderr=open(os.path.join(d, "tuttid.log"), "w"), text=True)
    try:
        assert daemon.stdout is not None and "listening" in daemon.stdout.readline(), "tuttid did not start"
        y = ["drives:"] + [f"  d{i}: {{ daemon: {{ socket: {sock}, drive: d{i} }} }}" for i in range(4)]
        y += ["resolvers:", "  kv0: { slab: { slot_size: 64KiB } }", "  kv1: { slab: { slot_size: 64KiB } }", "datapaths:"]
        y += [f"  p{r}: {{ striped_local_nvme: {{ drives: [d{2 * r}, d{2 * r + 1}], nsid: 1, stripe_unit: 16KiB, queues_per_drive: 1, queue_depth: 64, execution: cpu }} }}" for r in range(2)]
        y += ["stores:", "  kv0: { resolver: kv0, datapath: p0 }", "  kv1: { resolver: kv1, datapath: p1 }"]
        cfg = os.path.join(work, "daemon.yaml")
        with open(cfg, "w") as f:
            f.write("\n".join(y) + "\n")
        rows = []
        res = phase(work, "daemon_save", connector=True, runtime_config=cfg, tp=2)
        rows.append(check("daemon, tp 2: save", res, base, loaded=None))
        for r in ("worker0", "worker1"):
            if not res[r].get("staged_bytes") or not res[r].get("objects_saved"):
                raise SystemExit(f"FAILED: {r} saved nothing through the staging buffer: {res[r]}")
        res = phase(work, "daemon_load", connector=True, runtime_config=cfg, tp=2)
        rows.append(check("daemon, tp 2: load", res, base, loaded=True))
        if res["worker1"].get("tokens_loaded") != res["worker0"].get("tokens_loaded"):
            raise SystemExit(f"FAILED: the ranks loaded different token counts: {res['worker0']} {res['worker1']}")
        # A byte of the last KV object on d0 (rank 0's store), flipped in place.
        img = os.path.join(d, "d0.img")
        lba = last_data_block(img)
        with open(img, "r+b") as f:
            f.seek(lba * 4096 + 100)
            byte = f.read(1)
            f.seek(lba * 4096 + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        res = phase(work, "daemon_corrupt", connector=True, runtime_config=cfg, tp=2)
        rows.append(check("daemon, tp 2: corrupted object", res, base, loaded=True, errors=True))
        return rows
    finally:
        daemon.terminate()
        daemon.wait(30)
        shutil.rmtree(os.path.join(d, "tutti.sock"), ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "phase":
        main_phase(sys.argv[2:])
    else:
        main(sys.argv[1:] or ["all"])
