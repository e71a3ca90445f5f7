#!/usr/bin/env python3
"""Python binding benchmarks; prints one JSON object.

(a) roundtrip: the cost of one submit + wait of a batch of `--batch` reads
    (4 KiB each) from Python, against the same loop run in Rust inside the
    extension (`tutti._tutti._rust_roundtrip`) on the same runtime and drives,
    in the same process. Rounds alternate between the two; medians of the
    per-round means are reported, and their ratio (the binding's overhead).
(b) kv: GB/s of a Python loop saving (`put_sync`) and then loading
    (`get_sync`, verified byte for byte) `--blocks` distinct 1 MiB numpy blocks
    through a KvStore, `--kv-batch` blocks per call.

Build the extension with `maturin develop --release` first (crates/python).
Drives are emulated (RAM, no timing model): the numbers measure software
cost, not a device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import tutti
from tutti import _tutti

MiB = 1 << 20


def roundtrip(rt: tutti.Runtime, batch: int, iterations: int, rounds: int) -> dict:
    targets = rt.open_batch([f"tutti://kv/{i}" for i in range(batch)])
    buf = np.zeros(batch * 4096, dtype=np.uint8)
    mem = rt.register(buf)
    reqs = [tutti.read(t, 0, 4096, mem, i * 4096) for i, t in enumerate(targets)]
    # Warm up both paths.
    _tutti._rust_roundtrip(rt, reqs, iterations)
    for _ in range(iterations):
        rt.submit(reqs).wait()
    py_us, rust_us = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iterations):
            st = rt.submit(reqs).wait()
            if not all(s.ok for s in st):
                raise RuntimeError(st)
        py_us.append((time.perf_counter() - start) / iterations * 1e6)
        rust_us.append(_tutti._rust_roundtrip(rt, reqs, iterations) / iterations * 1e6)
    rt.unregister(mem)
    py, rust = statistics.median(py_us), statistics.median(rust_us)
    return {
        "batch": batch,
        "request_bytes": 4096,
        "iterations_per_round": iterations,
        "rounds": rounds,
        "python_us_per_batch": round(py, 2),
        "rust_us_per_batch": round(rust, 2),
        "python_over_rust": round(py / rust, 3),
        "binding_overhead_us_per_batch": round(py - rust, 2),
    }


def kv_throughput(rt: tutti.Runtime, blocks: int, per_call: int) -> dict:
    kv = tutti.KvStore.open(rt)
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, blocks * MiB, dtype=np.uint8)
    dst = np.zeros(blocks * MiB, dtype=np.uint8)
    ms, md = kv.register(src), kv.register(dst)
    keys = tutti.ChunkKeys(b"bench").chain(list(range(blocks)), 1)
    items = lambda m, lo, hi: [(keys[i], m, i * MiB, MiB) for i in range(lo, hi)]  # noqa: E731
    start = time.perf_counter()
    for lo in range(0, blocks, per_call):
        st = kv.put_sync(items(ms, lo, min(lo + per_call, blocks)), timeout=30.0)
        if not all(s.ok for s in st):
            raise RuntimeError(st)
    put_s = time.perf_counter() - start
    start = time.perf_counter()
    for lo in range(0, blocks, per_call):
        st = kv.get_sync(items(md, lo, min(lo + per_call, blocks)), timeout=30.0)
        if not all(s.kind == "hit" for s in st):
            raise RuntimeError(st)
    get_s = time.perf_counter() - start
    if not np.array_equal(src, dst):
        raise RuntimeError("loaded bytes differ from saved bytes")
    total = blocks * MiB
    return {
        "blocks": blocks,
        "block_bytes": MiB,
        "blocks_per_call": per_call,
        "put_gb_s": round(total / put_s / 1e9, 3),
        "get_gb_s": round(total / get_s / 1e9, 3),
        "verified": True,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--kv-batch", type=int, default=16)
    a = p.parse_args()
    out = {}
    with tutti.Runtime.emulated(drives=4, drive_bytes=256 * MiB, slot_bytes=MiB) as rt:
        out["roundtrip"] = roundtrip(rt, a.batch, a.iterations, a.rounds)
    with tutti.Runtime.emulated(drives=4, drive_bytes=256 * MiB, slot_bytes=MiB) as rt:
        out["kv"] = kv_throughput(rt, a.blocks, a.kv_batch)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
