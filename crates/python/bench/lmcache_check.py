"""Read-back check of the LMCache benchmark's tutti tier, byte for byte.

Does what ``lmcache_bench.py``'s ``lmcache_tutti`` variant does with the
KV of each prompt length (LMCache's ``GDSContext`` with backend ``tutti``,
one staging buffer registered as LMCache's 16 MiB regions, one slab over
four emulated drives, every object written then read back on one stream),
but with a known pattern instead of a model's KV: every 8-byte word holds
its run and its byte offset, so a wrong word names where it came from.
Prints one JSON report; exits 0 only when every object read back equal.

    python crates/python/bench/lmcache_check.py --device cuda --tokens 8192,32768
    python crates/python/bench/lmcache_check.py --device cpu --tokens 64,256 --object-mib 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, List

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lmcache_bench import MiB, ChunkRef, TuttiTier  # noqa: E402

RUN_SHIFT = 48
"""Bits of a pattern word below its run number (the byte offset's room)."""


def pattern(run: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """``nbytes`` (a multiple of 8) bytes whose word ``i`` is ``run << 48 | 8 i``."""
    words = torch.arange(0, nbytes, 8, dtype=torch.int64, device=device)
    return (words | (run << RUN_SHIFT)).view(torch.uint8)


def describe(got: torch.Tensor, want: torch.Tensor, obj: int, limit: int = 8) -> Dict[str, Any]:
    """The wrong 4 KiB pages of one object's read-back: how many, and where
    the first few came from (run and byte offset decoded from their first word)."""
    g = got.view(torch.int64).view(-1, 512)
    w = want.view(torch.int64).view(-1, 512)
    bad = (g != w).any(dim=1).nonzero().flatten().cpu()
    out: Dict[str, Any] = {"bad_pages": int(bad.numel()), "first": []}
    for p in bad[:limit].tolist():
        word = int(g[p, 0].item())
        out["first"].append({"page": p, "byte_in_object": p * 4096, "got_run": word >> RUN_SHIFT,
                             "got_offset": word & ((1 << RUN_SHIFT) - 1), "got_hex": f"{word & (2**64 - 1):016x}",
                             "want_offset": p * 4096 + obj})
    return out


def check_run(tier: TuttiTier, run: int, chunks: int, obj: int, device: torch.device, sync_each: bool = False,
              order: bool = True) -> Dict[str, Any]:
    """Save ``chunks`` objects of ``obj`` bytes (pattern ``run``), poison the
    staging buffer, read them back, compare object by object."""
    from lmcache.v1.gpu_connector.gds_context import SlabDirection

    want = pattern(run, chunks * obj, device)
    t = time.perf_counter()
    refs = tier.save(want.view(chunks, obj), order=order)
    save_s = time.perf_counter() - t
    tier.poison()
    t = time.perf_counter()
    with tier._on_stream():
        for c, r in enumerate(refs):
            tier.ctx.transfer_async(r, tier.staging[c * obj :], SlabDirection.READ)
            if sync_each:
                tier._sync()
    tier._sync()
    load_s = time.perf_counter() - t
    got = tier.staging[: chunks * obj]
    wrong = {}
    for c in range(chunks):
        a, b = c * obj, (c + 1) * obj
        if not torch.equal(got[a:b], want[a:b]):
            wrong[str(c)] = dict(describe(got[a:b], want[a:b], a), slab_offset=refs[c].slab_offset)
    return {"run": run, "objects": chunks, "object_bytes": obj, "slab_first": refs[0].slab_offset,
            "slab_end": refs[-1].slab_offset + obj, "save_s": round(save_s, 3), "load_s": round(load_s, 3),
            "gb_s": round(chunks * obj / load_s / 1e9, 2), "wrong_objects": len(wrong), "wrong": dict(list(wrong.items())[:16])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", default="8192,32768", help="prompt lengths, tokens, comma-separated (one run each, in order)")
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--object-mib", type=int, default=32, help="bytes per object, MiB (Llama-3-8B bf16, 256 tokens: 32)")
    ap.add_argument("--region-mib", type=int, default=0, help="LMCache's registration size, MiB (0: its own, 16)")
    ap.add_argument("--no-order", action="store_true", help="save without ordering the tier's stream after the pattern's (diagnosis)")
    ap.add_argument("--sync-each", action="store_true", help="wait for the stream after every object read (diagnosis)")
    ap.add_argument("--drives-dir", default="")
    ap.add_argument("--drive-mb-s", type=int, default=7000)
    ap.add_argument("--drive-iops", type=int, default=1_500_000)
    ap.add_argument("--drive-latency-us", type=int, default=80)
    a = ap.parse_args()
    device = torch.device(a.device)
    if a.region_mib:
        from lmcache.v1.gpu_connector import gds_context

        gds_context._MAX_GDS_REGION = a.region_mib * MiB
    obj = a.object_mib * MiB
    lengths = [int(x) for x in a.tokens.split(",")]
    chunks = [(n - 1) // a.chunk_tokens for n in lengths]
    total, largest = sum(chunks) * obj, max(chunks) * obj
    args = SimpleNamespace(drives_dir=a.drives_dir, drive_mb_s=a.drive_mb_s, drive_iops=a.drive_iops,
                           drive_latency_us=a.drive_latency_us)
    tier = TuttiTier(args, device, total + 64 * MiB, largest)
    report: Dict[str, Any] = {"device": str(device), "slab_bytes": total + 64 * MiB, "staging_bytes": largest,
                              "drive_bytes": tier.drive_bytes, "runs": []}
    ok = True
    try:
        for run, (n, c) in enumerate(zip(lengths, chunks), start=1):
            r = check_run(tier, run, c, obj, device, a.sync_each, not a.no_order)
            r["tokens"] = n
            report["runs"].append(r)
            ok = ok and r["wrong_objects"] == 0
            print(json.dumps(r), flush=True)
    finally:
        tier.close()
    report["ok"] = ok
    print(json.dumps({"ok": ok}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
