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
Drives are emulated (RAM; no timing model unless `--latency-us`): the
numbers measure software cost, not a device. Without a timing model an
emulated controller that found nothing to do for 30 us naps 50 us, so a
loop whose host side takes a little longer can meet a sleeping controller
(the round trip jumps from ~40 to ~135 us on the GPU machine, for Rust and
Python alike, depending on how long the host paused); `--idle-spin-us
10000` keeps the emulated drives awake through the host's pauses, so the
two loops meet the same device; `--latency-us 80` adds a Gen4 drive's
latency per command.
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
    py_us, rust_us, py_sub_us, rust_sub_us = [], [], [], []
    for _ in range(rounds):
        in_submit = 0.0
        start = time.perf_counter()
        for _ in range(iterations):
            t = time.perf_counter()
            op = rt.submit(reqs)
            in_submit += time.perf_counter() - t
            st = op.wait()
            if not all(s.ok for s in st):
                raise RuntimeError(st)
        py_us.append((time.perf_counter() - start) / iterations * 1e6)
        py_sub_us.append(in_submit / iterations * 1e6)
        total, rust_submit = _tutti._rust_roundtrip(rt, reqs, iterations)
        rust_us.append(total / iterations * 1e6)
        rust_sub_us.append(rust_submit / iterations * 1e6)
    rt.unregister(mem)
    py, rust = statistics.median(py_us), statistics.median(rust_us)
    return {
        "batch": batch,
        "request_bytes": 4096,
        "iterations_per_round": iterations,
        "rounds": rounds,
        "python_us_per_batch": round(py, 2),
        "rust_us_per_batch": round(rust, 2),
        "python_submit_us": round(statistics.median(py_sub_us), 2),
        "rust_submit_us": round(statistics.median(rust_sub_us), 2),
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


def timed_runtime(latency_us: int, idle_spin_us: int = 0) -> tutti.Runtime:
    """Four emulated RAM drives of 256 MiB striped into store "kv" (1 MiB
    slots), each with a timing model of `latency_us` per command (0: none)
    and `idle_spin_us` of polling before the controller naps (0: its
    default); both 0: the built-in default runtime."""
    if latency_us == 0 and idle_spin_us == 0:
        return tutti.Runtime.emulated(drives=4, drive_bytes=256 * MiB, slot_bytes=MiB)
    extra = f", timing: {{ latency_us: {latency_us} }}" if latency_us else ""
    extra += f", idle_spin_us: {idle_spin_us}" if idle_spin_us else ""
    drive = f"{{ emulated: {{ namespaces: [{{ capacity: 256MiB, block_size: 4096 }}]{extra} }} }}"
    yaml = (
        "drives:\n"
        + "".join(f"  d{i}: {drive}\n" for i in range(4))
        + "resolvers:\n  kv: { slab: { slot_size: 1MiB } }\n"
        "datapaths:\n  stripe: { striped_local_nvme: { drives: [d0, d1, d2, d3], nsid: 1, stripe_unit: 128KiB } }\n"
        "stores:\n  kv: { resolver: kv, datapath: stripe }\n"
    )
    return tutti.Runtime.from_yaml(yaml)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--kv-batch", type=int, default=16)
    p.add_argument(
        "--latency-us",
        type=int,
        default=0,
        help="round trip on drives with a timing model of this latency per command (0: none)",
    )
    p.add_argument(
        "--idle-spin-us",
        type=int,
        default=0,
        help="round trip on drives that poll this long before napping (0: the emulator's 30 us)",
    )
    a = p.parse_args()
    out = {}
    with timed_runtime(a.latency_us, a.idle_spin_us) as rt:
        out["roundtrip"] = roundtrip(rt, a.batch, a.iterations, a.rounds)
        out["roundtrip"]["drive_latency_us"] = a.latency_us
        out["roundtrip"]["drive_idle_spin_us"] = a.idle_spin_us
    with tutti.Runtime.emulated(drives=4, drive_bytes=256 * MiB, slot_bytes=MiB) as rt:
        out["kv"] = kv_throughput(rt, a.blocks, a.kv_batch)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
