#!/usr/bin/env python3
"""Prefix cache demo: a random-weight transformers model's prompt KV saved
to tutti and restored in place of a prefill (docs/engines.md).

    python crates/python/examples/prefix_cache_demo.py --model small --tokens 300
    python crates/python/examples/prefix_cache_demo.py --model llama3-8b-shape --tokens 8192 \
        --drives-dir /tmp/tutti-demo      # run twice: the second process reuses the prefix

It builds the model from a config with random weights (seed 0; nothing is
downloaded), prefills a random prompt from scratch (timed), saves its whole
chunks (unless a store on --drives-dir holds them already, from an earlier
process), restores the cached prefix into a DynamicCache and prefills only
the rest (timed), and prints one JSON object: restored-vs-scratch KV
equality per layer, greedy-generation equality (--new-tokens), timings.

Drives: four emulated drives striped into store "kv", in RAM, or in files
under --drives-dir (so a second process finds what the first saved). On
CUDA the datapath runs with `execution: gpu` (GPU threads submit; needs the
runtime built with the GPU path), on CPU with `execution: cpu`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict

import torch
import transformers

import tutti
from tutti.integrations.transformers import CACHE_KWARG, PrefixCache, cache_of

MiB = 1 << 20


def build_model(kind: str, device: str, tokens: int):
    torch.manual_seed(0)
    if kind == "small":
        cfg = transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max(512, tokens + 64),
        )
        dtype = torch.float32
    else:  # Llama-3-8B's shape
        cfg = transformers.LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
            max_position_embeddings=max(8192, tokens + 64),
        )
        dtype = torch.bfloat16
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def runtime_yaml(drives_dir: str, drive_bytes: int, slot_bytes: int, gpu: bool, timing: str = "") -> str:
    """Four emulated drives of ``drive_bytes`` bytes (in RAM, or files under
    ``drives_dir``) striped into store "kv" with slab slots of
    ``slot_bytes`` bytes; ``timing``: a flow-style YAML timing model for
    every drive (docs/config.md), e.g. ``{ bandwidth_mb_s: 7000, iops:
    1500000, latency_us: 80 }``; empty for none."""
    lines = ["drives:"]
    timing_entry = f", timing: {timing}" if timing else ""
    for i in range(4):
        backing = "ram" if not drives_dir else "{ file: " + os.path.join(drives_dir, f"d{i}.img") + " }"
        lines.append(f"  d{i}: {{ emulated: {{ namespaces: [{{ capacity: {drive_bytes // MiB}MiB, block_size: 4096 }}], backing: {backing}{timing_entry} }} }}")
    lines += [
        "resolvers:",
        f"  kv: {{ slab: {{ slot_size: {slot_bytes // 1024}KiB }} }}",
        "datapaths:",
        "  stripe: { striped_local_nvme: { drives: [d0, d1, d2, d3], nsid: 1, stripe_unit: 128KiB, "
        f"queues_per_drive: 2, queue_depth: 256, execution: {'gpu' if gpu else 'cpu'} }} }}",
        "stores:",
        "  kv: { resolver: kv, datapath: stripe }",
    ]
    return "\n".join(lines) + "\n"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["small", "llama3-8b-shape"], default="small")
    ap.add_argument("--tokens", type=int, default=300, help="prompt length, tokens")
    ap.add_argument("--chunk-tokens", type=int, default=None, help="tokens per chunk (small: 16, llama3-8b-shape: 256)")
    ap.add_argument("--drives-dir", default="", help="folder for file-backed drives (default: RAM)")
    ap.add_argument("--new-tokens", type=int, default=16, help="greedy tokens generated for the equality check (0: skip)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per wait")
    a = ap.parse_args()

    chunk = a.chunk_tokens or (16 if a.model == "small" else 256)
    t0 = time.perf_counter()
    model = build_model(a.model, a.device, a.tokens)
    sync(a.device)
    build_s = time.perf_counter() - t0
    layers = model.config.num_hidden_layers
    kv_heads = model.config.num_key_value_heads
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    elem = torch.finfo(model.dtype).bits // 8
    obj = 2 * chunk * kv_heads * head_dim * elem  # one (chunk, layer) object, bytes
    slot = max(MiB, 1 << math.ceil(math.log2(obj)))
    chunks = a.tokens // chunk
    drive_bytes = max(64 * MiB, ((chunks * layers * slot) // 4 * 5 // 4 + 64 * MiB) // MiB * MiB)
    if a.drives_dir:
        os.makedirs(a.drives_dir, exist_ok=True)

    g = torch.Generator().manual_seed(42)
    ids = torch.randint(0, model.config.vocab_size, (1, a.tokens), generator=g).to(a.device)
    report: Dict[str, Any] = {
        "model": a.model, "device": a.device, "dtype": str(model.dtype), "tokens": a.tokens,
        "chunk_tokens": chunk, "object_bytes": obj, "slot_bytes": slot, "drive_bytes": drive_bytes,
        "drives_dir": a.drives_dir or None, "build_s": round(build_s, 3),
    }
    with tutti.Runtime.from_yaml(runtime_yaml(a.drives_dir, drive_bytes, slot, a.device == "cuda")) as rt:
        kv = tutti.KvStore.open(rt)
        report["recovered_objects"] = kv.stats().get("recovered", 0)
        pc = PrefixCache(model, kv, model_id=f"random-{a.model}-seed0", chunk_tokens=chunk,
                         max_tokens=max(chunk, chunks * chunk), timeout=a.timeout)
        report["found_before_tokens"] = pc.lookup(ids)

        with torch.no_grad():
            model(ids[:, : min(a.tokens, 64)], use_cache=True)  # warm-up (kernels, allocator)
            sync(a.device)
            t = time.perf_counter()
            scratch = model(ids, use_cache=True)
            sync(a.device)
            report["recompute_prefill_s"] = round(time.perf_counter() - t, 4)
            if report["found_before_tokens"] < chunks * chunk:
                t = time.perf_counter()
                s = pc.save(ids, cache_of(scratch))
                report["save_s"] = round(time.perf_counter() - t, 4)
                report["saved_chunks"] = s.stored_chunks
                report["save_failures"] = [f.kind for f in s.failures]

            sync(a.device)
            t = time.perf_counter()
            cache, info = pc.restore(ids)
            sync(a.device)
            report["restore_s"] = round(time.perf_counter() - t, 4)
            report["restored_tokens"] = info.cached_tokens
            report["load_failures"] = [] if info.load is None else [f.kind for f in info.load.failures]
            n = info.cached_tokens
            t = time.perf_counter()
            rest = model(ids[:, n:], use_cache=True, **{CACHE_KWARG: cache})
            sync(a.device)
            report["rest_prefill_s"] = round(time.perf_counter() - t, 4)
            report["restore_plus_rest_s"] = round(report["restore_s"] + report["rest_prefill_s"], 4)
            report["speedup_vs_recompute"] = round(report["recompute_prefill_s"] / report["restore_plus_rest_s"], 2)
            if n:
                rc, sc = cache_of(rest), cache_of(scratch)
                eq = [
                    bool(torch.equal(rc.layers[i].keys[:, :, :n], sc.layers[i].keys[:, :, :n])
                         and torch.equal(rc.layers[i].values[:, :, :n], sc.layers[i].values[:, :, :n]))
                    for i in range(layers)
                ]
                report["restored_equals_scratch_all_layers"] = all(eq)
                report["restored_equal_layers"] = sum(eq)
                # Last-position logits of the two prefills (float differences only).
                report["last_logits_max_abs_diff"] = float((rest.logits[0, -1].float() - scratch.logits[0, -1].float()).abs().max())
            del scratch, rest, cache

            if a.new_tokens:
                mask = torch.ones_like(ids)
                ref = model.generate(ids, attention_mask=mask, max_new_tokens=a.new_tokens, do_sample=False)
                out, ginfo = pc.generate(ids, max_new_tokens=a.new_tokens, do_sample=False)
                report["generate_restored_tokens"] = ginfo.cached_tokens
                report["generation_equal"] = bool(torch.equal(out.sequences, ref))
        pc.close()
        report["store_stats"] = {k: v for k, v in kv.stats().items() if k in ("objects", "puts", "hits", "misses", "checksum_mismatches", "recovered")}
    print(json.dumps(report, indent=2))
    ok = report.get("restored_equals_scratch_all_layers", True) and report.get("generation_equal", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
