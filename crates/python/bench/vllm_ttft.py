"""vLLM with TuttiConnector on a GPU: time to first token with and without
the connector, for a Llama-3-8B-shaped model (random weights, bf16).

Each engine is its own process (``python vllm_ttft.py phase ...``), as a
restarted server would be; ``python vllm_ttft.py`` drives three of them:

1. ``baseline``: no connector; every prompt is prefilled.
2. ``save``: the connector over four file-backed emulated drives (each
   modelled as a PCIe Gen4 drive, ``--drive-mb-s``), ``execution: gpu``
   (GPU threads submit; bytes land in vLLM's CUDA KV tensors); the prompts'
   whole chunks are saved.
3. ``load``: a new engine finds the prefixes through the connector and
   loads them instead of prefilling them.

The model is vLLM's ``load_format="dummy"`` (weights drawn from a fixed
seed, the same in every process) over a ``config.json`` written here: no
download, no tokenizer (token-id prompts, ``skip_tokenizer_init``).
vLLM's own prefix caching is off, so every repetition of the load phase
reads from the drives and every repetition of the baseline prefills.

TTFT is the wall time of ``LLM.generate`` for one prompt with
``max_tokens=1`` (scheduling, prefill or load, the first token), measured
``--reps`` times after a warm-up; the report gives medians, the ratio
load/baseline per prompt length, vLLM's ``num_cached_tokens`` and the
connector's counters, and whether the first token equals the baseline's.

Needs vLLM (0.26.0 with torch 2.11 was used on the H200: docs/vllm.md),
CUDA and the tutti wheel. Exit status 0 when every phase ran, every load
found its prefix and the first tokens are equal; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

MiB = 1 << 20
CHUNK = 256  # tokens per connector chunk
WARM_TOKENS = 512  # the warm-up prompt of each phase


def write_model(path: str, max_len: int) -> None:
    """``config.json`` of the Llama-3-8B shape (32 layers, 8 KV heads of
    128, bf16: 128 KiB of KV per token)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
        max_position_embeddings=max(8192, max_len), torch_dtype="bfloat16",
    )
    cfg.save_pretrained(path)


def prompts(sizes: List[int]) -> List[List[int]]:
    """One prompt of each size, seeded, no two sharing a prefix."""
    rng = random.Random(11)
    return [[rng.randrange(1000, 120000) for _ in range(n)] for n in sizes]


def engine(a: argparse.Namespace) -> Any:
    """The ``LLM`` of one phase."""
    from vllm import LLM

    max_len = max(a.sizes) + 64
    kw: Dict[str, Any] = dict(
        model=a.model, skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16", max_model_len=max_len,
        max_num_batched_tokens=max_len, enable_prefix_caching=False, enforce_eager=True, seed=0,
        block_size=a.block_size,
        gpu_memory_utilization=a.gpu_memory_utilization, kv_cache_memory_bytes=a.kv_cache_gib << 30,
        disable_log_stats=False,
    )
    if a.connector:
        extra = {"runtime_config": a.runtime_config, "chunk_tokens": CHUNK, "timeout_s": 60.0,
                 "lookup_refresh_s": 0.0, "stats_file": a.stats}
        kw["kv_transfer_config"] = {
            "kv_connector": "TuttiConnector", "kv_connector_module_path": "tutti.integrations.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra,
        }
    return LLM(**kw)


def top_logprobs(completion: Any) -> List[Any]:
    """The first token's two most likely (token, logprob) pairs, to tell
    a near tie from a real difference; [] where vLLM gave none."""
    try:
        lp = completion.logprobs[0] if completion.logprobs else {}
        return sorted(((int(tok), float(v.logprob)) for tok, v in lp.items()), key=lambda x: -x[1])[:2]
    except (AttributeError, IndexError, TypeError):
        return []


def run_phase(a: argparse.Namespace) -> Dict[str, Any]:
    """Warm up, then time ``generate`` per prompt, ``--reps`` times."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = engine(a)
    start_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False, logprobs=2)
    rng = random.Random(5)
    warm = [rng.randrange(1000, 120000) for _ in range(WARM_TOKENS)]
    llm.generate([TokensPrompt(prompt_token_ids=warm)], sp, use_tqdm=False)
    rows = []
    for size, p in zip(a.sizes, prompts(a.sizes)):
        times, first, cached, top = [], None, [], None
        for _ in range(a.reps):
            t = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)[0]
            times.append(time.perf_counter() - t)
            first = out.outputs[0].token_ids[0]
            cached.append(out.num_cached_tokens)
            top = top_logprobs(out.outputs[0])
        rows.append({"tokens": size, "ttft_s": times, "ttft_median_s": statistics.median(times), "first_token": first,
                     "num_cached_tokens": cached, "top_logprobs": top})
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if "prefix_cache" in m.name}
    return {"engine_start_s": round(start_s, 1), "prompts": rows, "metrics": metrics}


def phase_env() -> Dict[str, str]:
    """The engines' environment: one CUDA hardware queue per stream
    (``CUDA_DEVICE_MAX_CONNECTIONS=32``: with emulated drives, whose copies
    run on streams of their own, a shared hardware queue can hold those
    copies behind vLLM's kernels that wait for the I/O; docs/gpu.md, "Under
    load") and vLLM's PyTorch sampler (``VLLM_USE_FLASHINFER_SAMPLER=0``:
    FlashInfer is not in the carried set); values already set are kept."""
    env = dict(os.environ)
    env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    return env


def phase(work: str, name: str, a: argparse.Namespace, connector: bool, runtime_config: str = "") -> Dict[str, Any]:
    """Run one engine in a new process; return its result with the
    connector's counters."""
    out, stats, log = (os.path.join(work, f"{name}.{e}") for e in ("json", "stats", "log"))
    cmd = [sys.executable, os.path.abspath(__file__), "phase", "--model", os.path.join(work, "model"), "--out", out,
           "--stats", stats, "--runtime-config", runtime_config, "--sizes", ",".join(map(str, a.sizes)),
           "--reps", str(a.reps), "--gpu-memory-utilization", str(a.gpu_memory_utilization),
           "--kv-cache-gib", str(a.kv_cache_gib), "--block-size", str(a.block_size)]
    cmd += ["--connector"] * connector
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=phase_env())
    if rc != 0:
        sys.stdout.write(open(log).read()[-8000:])
        raise SystemExit(f"phase {name} failed with status {rc} (log: {log})")
    res = json.load(open(out))
    for role in ("scheduler0", "worker0"):
        p = f"{stats}.{role}.json"
        res[role] = json.load(open(p)) if os.path.exists(p) else {}
    res["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps({"phase": name, "seconds": res["seconds"], "engine_start_s": res["engine_start_s"],
                      "ttft_median_s": [r["ttft_median_s"] for r in res["prompts"]],
                      "worker": res["worker0"]}), flush=True)
    return res


def slot_bytes(block_size: int) -> int:
    """One store object: K and V of one vLLM block of one layer (8 KV
    heads of 128, bf16), the piece the connector saves of vLLM 0.26's
    FlashAttention cache (its ``blocks_heads`` form: K and V side by side);
    the slab's slots are that size, so none of the store's capacity goes
    unused (at vLLM's default 16-token blocks, 64 KiB: 1 MiB slots filled
    the store after 1/16 of its bytes in the first H200 run)."""
    return block_size * 8 * 128 * 2 * 2


def runtime_config(work: str, a: argparse.Namespace) -> str:
    """Four file-backed emulated drives under ``--drives-dir`` (old images
    there are removed: a blank store) striped into store "kv", slots of
    :func:`slot_bytes`, Gen4 timing, ``execution: gpu``."""
    from prefix_cache_demo import runtime_yaml

    per_token = 32 * 2 * 8 * 128 * 2
    need = (sum(a.sizes) + WARM_TOKENS) * per_token * 5 // 4
    drive_bytes = max(1024 * MiB, (need // 4 + 1023 * MiB) // (1024 * MiB) * (1024 * MiB))
    os.makedirs(a.drives_dir, exist_ok=True)
    for i in range(4):
        img = os.path.join(a.drives_dir, f"d{i}.img")
        if os.path.exists(img):
            os.remove(img)
    timing = f"{{ bandwidth_mb_s: {a.drive_mb_s}, iops: 1500000, latency_us: 80 }}"
    path = os.path.join(work, "runtime.yaml")
    with open(path, "w") as f:
        f.write(runtime_yaml(a.drives_dir, drive_bytes, slot_bytes(a.block_size), True, timing))
    return path


def compare(base: Dict[str, Any], load: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per prompt: TTFT medians, load/baseline, first tokens equal, tokens
    found in tutti."""
    rows = []
    for b, l in zip(base["prompts"], load["prompts"]):
        rows.append({
            "tokens": b["tokens"], "baseline_ttft_s": round(b["ttft_median_s"], 4),
            "tutti_ttft_s": round(l["ttft_median_s"], 4),
            "tutti_over_baseline": round(l["ttft_median_s"] / b["ttft_median_s"], 3),
            "first_token_equal": b["first_token"] == l["first_token"],
            "baseline_top": b["top_logprobs"], "tutti_top": l["top_logprobs"],
            "num_cached_tokens": l["num_cached_tokens"],
        })
    return rows


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8192,32768", help="prompt lengths, tokens, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--drives-dir", default="/var/tmp/tutti-vllm-drives", help="folder of the drive images (on disk; its d0.img..d3.img are replaced by blank ones)")
    ap.add_argument("--drive-mb-s", type=int, default=7000, help="modelled bandwidth per drive, 10^6 bytes/s")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--kv-cache-gib", type=int, default=8, help="vLLM's KV cache, GiB (what the connector registers)")
    ap.add_argument("--block-size", type=int, default=16, help="vLLM's KV block, tokens (its default on CUDA: 16)")
    ap.add_argument("--out", default="", help="write the report here too (JSON)")
    a = ap.parse_args(argv)
    a.sizes = [int(s) for s in a.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="tutti-vllm-ttft-")
    write_model(os.path.join(work, "model"), max(a.sizes) + 64)
    cfg = runtime_config(work, a)
    base = phase(work, "baseline", a, connector=False)
    save = phase(work, "save", a, connector=True, runtime_config=cfg)
    load = phase(work, "load", a, connector=True, runtime_config=cfg)
    rows = compare(base, load)
    loaded = load["worker0"].get("tokens_loaded", 0)
    ok = all(r["first_token_equal"] for r in rows) and loaded > 0 and save["worker0"].get("objects_saved", 0) > 0
    report = {"rows": rows, "tokens_loaded": loaded, "load_error_blocks": load["worker0"].get("load_error_blocks", 0),
              "save": save["worker0"], "engine_start_s": {k: r["engine_start_s"] for k, r in (("baseline", base), ("save", save), ("load", load))},
              "drive_mb_s": a.drive_mb_s, "ok": ok}
    print(json.dumps(report, indent=2), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"report": report, "baseline": base, "save": save, "load": load}, f, indent=2)
    return 0 if ok else 1


def main_phase(argv: List[str]) -> None:
    p = argparse.ArgumentParser()
    for k in ("--model", "--out", "--stats", "--sizes"):
        p.add_argument(k, required=True)
    p.add_argument("--runtime-config", default="")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--kv-cache-gib", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--connector", action="store_true")
    a = p.parse_args(argv)
    a.sizes = [int(s) for s in a.sizes.split(",")]
    res = run_phase(a)
    with open(a.out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    if sys.argv[1:2] == ["phase"]:
        main_phase(sys.argv[2:])
    else:
        sys.exit(main(sys.argv[1:]))
