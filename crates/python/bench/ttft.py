#!/usr/bin/env python3
"""Time to first token (TTFT) with a cached prompt prefix: tutti against
recomputing it, against POSIX file reads, and against pinned host memory
(issue 12, "Benchmark"; docs/benchmarks.md, "TTFT").

    python crates/python/bench/ttft.py                                # GPU machine: Llama-3-8B shape, 8,192 and 32,768 tokens
    python crates/python/bench/ttft.py --model small --device cpu --tokens 300,600   # smoke test anywhere

The model is built from a config with random weights (seed 0; nothing is
downloaded): ``--model llama3-8b-shape`` (bf16; 32 layers x 8 KV heads x
128 dims x 2 (K, V) x 2 bytes = 128 KiB of KV per token, 4 GiB at 32,768
tokens) or ``--model small`` (the 2-layer float32 config of
examples/prefix_cache_demo.py, whose ``build_model`` and ``runtime_yaml``
this reuses). For each prompt length T (``--tokens``, tokens) a random
prompt of T tokens is cut into chunks of ``--chunk-tokens`` tokens; every
chunk but the last is cached: the prefix is P = ((T - 1) // chunk) * chunk
tokens and R = T - P tokens are prefilled (256 of 8,192 with the default
256-token chunks).

TTFT of one repetition, seconds: from holding the prompt's token ids to
holding the logits of the first generated token (the last prompt
position's, ``logits_to_keep=1``) on the model's device, i.e. restoring the
prefix (or recomputing it) plus prefilling the rest. Variants, each in the
same process, over the same prompt:

- ``recompute`` (a): a full prefill of the T tokens.
- ``tutti`` (b): ``PrefixCache.restore`` of the P cached tokens from four
  emulated drives striped into one store (``striped_local_nvme``, RAM
  backing or files under ``--drives-dir``), each drive with the timing
  model of a PCIe Gen4 drive (``--drive-mb-s`` 7000 MB/s,
  ``--drive-iops`` 1.5 M IOPS, ``--drive-latency-us`` 80 us per command;
  docs/config.md, ``timing``), ``execution: gpu`` on CUDA (GPU threads
  submit; the bytes land in GPU memory) and ``execution: cpu`` on CPU; then
  the R-token prefill over the restored ``DynamicCache``.
- ``posix_pinned`` and ``posix_pageable`` (c): the prefix's K and V saved
  beforehand to one ordinary file per layer under ``--dir``; each
  repetition opens the files and reads them with ``os.preadv`` (one
  thread, layer by layer) into a pinned (page-locked) or pageable host
  buffer, copies each layer to the model's device (from pinned memory
  asynchronously, so layer l's copy overlaps layer l + 1's read) and
  builds the cache, then prefills the rest: what an engine without tutti
  does. With ``--posix-page-cache drop`` (default)
  each file is ``fsync``ed when written and its pages are dropped from the
  OS page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``) before every
  repetition, so the reads go to the file system's device; ``keep`` reads
  from the page cache (memory speed). The JSON records the file system
  type of ``--dir`` (on tmpfs the pages cannot be dropped: they are memory).
- ``pinned`` (d): the prefix's K and V kept in pinned host memory; a
  restore is host-to-device copies only: the upper bound for any storage
  path over the same host-to-device link.

On CPU (``--device cpu``) there is no pinned memory and no copy to a
device: ``posix_pinned`` and ``pinned`` use ordinary host memory; the
smoke test checks the plumbing and the logits, not the speeds.

Correctness: each restored variant's first-token logits are compared with
``recompute``'s (``logits_max_abs_diff``, ``logits_allclose`` within
``--atol``/``--rtol``, ``argmax_equal``); a tutti restore that restores
fewer than P tokens (a failed or timed-out item: the engine recomputes from
there) counts as a failed repetition ("partial").

Robustness (the benchmark must report, never hang): on the GPU machine,
several GPU-executed kv puts in flight at once timed out
(test_engine_torch.py's CUDA variants, docs/engines.md) and the
Llama-3-8B-shape demo at 8,192 tokens did not finish within 80 s. So

- the prefix is saved to tutti layer by layer, waiting for each layer's
  puts before the next layer's (``--save-layers-at-once 1``, the default:
  one GPU-executed put batch in flight at a time, the pattern the passing
  transformers CUDA tests use); a larger N keeps N layers' puts in flight;
- every repetition of every variant, and the save, run in a worker thread
  given ``--timeout`` (``--save-timeout``) seconds: one that has not
  finished by then is reported as ``"status": "timeout"`` and that variant
  is not run again (its thread may still hold the store; the process ends
  with ``os._exit`` after writing the JSON, so a stuck wait cannot keep it
  alive); an exception is reported as ``"status": "error"`` with its text;
- tutti's own waits time out after ``--io-timeout`` seconds per wait;
- timing synchronises the current CUDA stream, not the device, so a stuck
  I/O kernel on the runtime's stream cannot stall the other variants;
- the JSON is rewritten to ``--out`` after every variant's repetition, so
  a run killed from outside still leaves what it measured; ``--deadline``
  bounds the whole run (the model build, the reference prefill and the
  runtime's start are not under a variant's timeout).

Output: one JSON object (stdout, and ``--out`` if given): ``config``,
``runs`` keyed by T, each with ``prefix_tokens``, ``rest_tokens``,
``prefix_bytes`` and per variant ``status``, ``ttft_s`` (every counted
repetition), ``ttft_median_s``, ``restore_median_s`` (restore only),
``rest_prefill_median_s``, ``restore_gb_s`` (prefix bytes / restore
median, 10^9 bytes/s), the logits comparison; and ``ratios`` keyed by T:
``tutti_over_recompute`` (goal at 32,768: at most 0.15),
``tutti_over_posix_pinned`` / ``_pageable`` (goal: below 1),
``pinned_scaled_ttft_s`` (``pinned``'s TTFT with its restore stretched to
the drives' modelled bandwidth, 4 x ``--drive-mb-s``: rest prefill +
max(restore, prefix_bytes / bandwidth)) and ``tutti_over_pinned_scaled``
(goal: at most 1.2).

Exit status: 0 when every variant of every prompt length is "ok", 1
otherwise, 3 when a timed-out worker thread was left running.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import tutti  # noqa: E402
from prefix_cache_demo import build_model, runtime_yaml  # noqa: E402
from tutti.integrations.transformers import CACHE_KWARG, PrefixCache, cache_of, model_kv_shape  # noqa: E402
from transformers import DynamicCache  # noqa: E402

MiB = 1 << 20
VARIANTS = ["recompute", "tutti", "posix_pinned", "posix_pageable", "pinned"]
RESTORED = [v for v in VARIANTS if v != "recompute"]


class VariantFailed(RuntimeError):
    """A repetition that ran but did not measure the configuration (e.g. a
    partial restore); ``status`` names why."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def run_with_timeout(fn: Callable[[], Any], timeout_s: float) -> Tuple[str, Any, Optional[threading.Thread]]:
    """Run ``fn`` in a daemon thread for at most ``timeout_s`` seconds.
    Returns ``(status, value, thread)``: ``("ok", result, None)``,
    ``("timeout", None, thread)`` (the thread is left running), or
    (``"error"`` or a ``VariantFailed`` status, message, None)."""
    box: Dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except VariantFailed as e:
            box["status"], box["value"] = e.status, str(e)
        except BaseException as e:  # reported, never raised past the benchmark
            box["status"], box["value"] = "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        return "timeout", None, th
    return box.get("status", "ok"), box.get("value"), None


def stream_sync(device: torch.device) -> None:
    """Wait for the work queued on the current CUDA stream (not the whole
    device: a stuck kernel on tutti's stream must not stall the timing)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def empty_cache(model: Any) -> DynamicCache:
    """An empty DynamicCache laid out for ``model`` (as PrefixCache makes)."""
    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def fs_type(path: str) -> str:
    """File system type of the mount holding ``path`` (from /proc/mounts)."""
    path = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """``nbytes`` bytes of host memory as a uint8 tensor, page-locked when
    ``pinned`` (CUDA only)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view (any dtype, bf16 too)."""
    return t.contiguous().view(-1).view(torch.uint8)


class Prompt:
    """One prompt length: token ids, the cached prefix's extent, the
    recompute reference (last-position logits, float32 on the CPU) and the
    prefix's K/V per layer as ``[1, kv_heads, P, head_dim]`` tensors."""

    def __init__(self, model: Any, tokens: int, chunk: int, seed: int) -> None:
        self.tokens = tokens
        self.prefix = ((tokens - 1) // chunk) * chunk
        self.rest = tokens - self.prefix
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g).to(model.device)
        layers, h, d = model_kv_shape(model)
        elem = torch.finfo(model.dtype).bits // 8
        self.layer_bytes = 2 * h * self.prefix * d * elem  # K and V of the prefix, one layer
        self.prefix_bytes = layers * self.layer_bytes


def parse_args(argv: Optional[List[str]] = None) -> Tuple[argparse.Namespace, List[int], List[str]]:
    """The options, the prompt lengths (tokens) and the variants to run
    (``recompute`` first when not asked for: every comparison's reference)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["small", "llama3-8b-shape"], default="llama3-8b-shape")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", default="8192,32768", help="prompt lengths, tokens, comma-separated")
    ap.add_argument("--chunk-tokens", type=int, default=None, help="tokens per chunk (small: 16, llama3-8b-shape: 256)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=5, help="counted repetitions per variant")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted repetitions per variant first")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one repetition of one variant may take")
    ap.add_argument("--save-timeout", type=float, default=300.0, help="seconds the save of one prompt's prefix to tutti may take")
    ap.add_argument("--io-timeout", type=float, default=60.0, help="seconds one tutti wait (a layer's gets or puts) may take")
    ap.add_argument("--save-layers-at-once", type=int, default=1, help="layers whose puts are in flight at once while saving to tutti")
    ap.add_argument("--drives-dir", default="", help="folder for file-backed emulated drives (default: RAM)")
    ap.add_argument("--dir", default="", help="folder for variant (c)'s files (default: a new folder under the temp dir)")
    ap.add_argument("--posix-page-cache", choices=["drop", "keep"], default="drop")
    ap.add_argument("--drive-mb-s", type=int, default=7000, help="modelled bandwidth per drive, 10^6 bytes/s")
    ap.add_argument("--drive-iops", type=int, default=1_500_000, help="modelled commands per second per drive")
    ap.add_argument("--drive-latency-us", type=int, default=80, help="modelled latency per command, microseconds")
    ap.add_argument("--atol", type=float, default=None, help="logits tolerance (float32: 1e-4, bf16: 5e-2)")
    ap.add_argument("--rtol", type=float, default=None, help="logits tolerance (float32: 1e-4, bf16: 5e-2)")
    ap.add_argument("--seed", type=int, default=42, help="prompt seed (the prompt of length T uses seed + T)")
    ap.add_argument("--out", default="", help="also write the JSON here (rewritten after every repetition)")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="seconds for the whole run (0: none); past it the process prints every thread's stack and exits, "
                         "leaving --out as last written")
    a = ap.parse_args(argv)
    if a.deadline > 0:
        faulthandler.dump_traceback_later(a.deadline, exit=True)

    lengths = [int(x) for x in a.tokens.split(",") if x]
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}")
    if "recompute" not in variants:
        variants.insert(0, "recompute")  # the reference of every comparison
    return a, lengths, variants


def tolerances(a: argparse.Namespace, dtype: torch.dtype) -> Tuple[float, float]:
    """``(atol, rtol)`` for the logits: the options, else 1e-4 for float32
    and 5e-2 for anything narrower."""
    atol = a.atol if a.atol is not None else (1e-4 if dtype == torch.float32 else 5e-2)
    rtol = a.rtol if a.rtol is not None else (1e-4 if dtype == torch.float32 else 5e-2)
    return atol, rtol


class StoreLayout:
    """The tutti store's sizes: one (chunk, layer) object's bytes, the slot
    it takes, and each of the 4 drives' bytes, sized so that every prompt's
    prefix stays stored."""

    def __init__(self, model: Any, chunk: int, lengths: List[int]) -> None:
        self.layers, self.kv_heads, self.head_dim = model_kv_shape(model)
        self.elem = torch.finfo(model.dtype).bits // 8
        self.obj = 2 * chunk * self.kv_heads * self.head_dim * self.elem  # one (chunk, layer) store object, bytes
        self.slot = max(MiB, 1 << math.ceil(math.log2(self.obj)))
        objects = sum(((n - 1) // chunk) * self.layers for n in lengths)
        # Every prompt's prefix stays stored; 25% and 64 MiB per drive for the store's own blocks.
        self.drive_bytes = max(64 * MiB, ((objects * self.slot) // 4 * 5 // 4 + 64 * MiB) // MiB * MiB)


class Bench:
    """What every prompt length shares: the options, the model, the tutti
    store (``kv``, None without the ``tutti`` variant), the folder of the
    POSIX variants' files, the report and the worker threads that timed out."""

    def __init__(self, a: argparse.Namespace, model: Any, device: torch.device, chunk: int, variants: List[str],
                 work: str, atol: float, rtol: float) -> None:
        self.a, self.model, self.device, self.chunk, self.variants = a, model, device, chunk, variants
        self.cuda = device.type == "cuda"
        self.work, self.atol, self.rtol = work, atol, rtol
        self.kv: Optional[Any] = None
        self.report: Dict[str, Any] = {}
        self.hung: List[threading.Thread] = []

    def emit(self) -> None:
        """Rewrite ``--out`` (if given) with the report as it stands."""
        if self.a.out:
            tmp = self.a.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.report, f, indent=2)
            os.replace(tmp, self.a.out)

    def left_running(self, th: Optional[threading.Thread]) -> None:
        """Note a worker thread that timed out (None: none did)."""
        if th is not None:
            self.hung.append(th)


def config_report(b: Bench, layout: StoreLayout, build_s: float) -> Dict[str, Any]:
    """The report's ``config``: the model, the store, the drives' timing
    model and the options the run was measured with."""
    a, model, work = b.a, b.model, b.work
    return {
        "model": a.model, "device": str(b.device), "dtype": str(model.dtype).replace("torch.", ""),
        "gpu": torch.cuda.get_device_name(b.device) if b.cuda else None,
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "layers": layout.layers, "kv_heads": layout.kv_heads, "head_dim": layout.head_dim,
        "kv_bytes_per_token": layout.layers * 2 * layout.kv_heads * layout.head_dim * layout.elem,
        "chunk_tokens": b.chunk, "object_bytes": layout.obj, "slot_bytes": layout.slot,
        "drives": 4, "drive_bytes": layout.drive_bytes, "drives_dir": a.drives_dir or None,
        "drive_timing": {"bandwidth_mb_s": a.drive_mb_s, "iops": a.drive_iops, "latency_us": a.drive_latency_us},
        "modelled_bandwidth_gb_s": 4 * a.drive_mb_s / 1000,
        "execution": "gpu" if b.cuda else "cpu",
        "save_layers_at_once": a.save_layers_at_once,
        "posix_dir": work, "posix_dir_fs": fs_type(work), "posix_page_cache": a.posix_page_cache,
        "reps": a.reps, "warmup": a.warmup, "timeout_s": a.timeout, "io_timeout_s": a.io_timeout,
        "logits_atol": b.atol, "logits_rtol": b.rtol, "build_s": round(build_s, 3), "variants": b.variants,
    }


def open_store(b: Bench, layout: StoreLayout) -> Optional[Any]:
    """The runtime over the 4 emulated drives and its kv store in ``b.kv``,
    when the ``tutti`` variant runs; returns the runtime (or None)."""
    a = b.a
    if "tutti" not in b.variants:
        return None
    timing = f"{{ bandwidth_mb_s: {a.drive_mb_s}, iops: {a.drive_iops}, latency_us: {a.drive_latency_us} }}"
    rt = tutti.Runtime.from_yaml(runtime_yaml(a.drives_dir, layout.drive_bytes, layout.slot, b.cuda, timing))
    b.kv = tutti.KvStore.open(rt)
    return rt


def finish(b: Bench, rt: Optional[Any]) -> None:
    """Add the store's counters, write and print the report, remove the
    files' folder if it was made here, then shut the runtime down; with a
    worker thread left running, leave at once instead (exit status 3)."""
    kv = b.kv
    b.report["store_stats"] = None if kv is None else {k: v for k, v in kv.stats().items() if k in ("objects", "puts", "hits", "misses", "checksum_mismatches")}
    b.emit()
    print(json.dumps(b.report, indent=2), flush=True)
    if not b.a.dir:
        shutil.rmtree(b.work, ignore_errors=True)
    if b.hung:
        # A thread still waits on the store or the GPU: closing the
        # runtime could wait for it forever. The JSON is out; leave.
        sys.stderr.write(f"ttft: {len(b.hung)} variant thread(s) timed out; exiting without closing the runtime\n")
        sys.stderr.flush()
        os._exit(3)
    del kv
    b.kv = None
    if rt is not None:
        rt.__exit__(None, None, None)  # shuts the runtime down, as `with` does


def all_ok(report: Dict[str, Any]) -> bool:
    """Whether every variant of every prompt length has status "ok"."""
    return all(v.get("status") == "ok" for r in report["runs"].values() for v in r["variants"].values())


def main(argv: Optional[List[str]] = None) -> int:
    a, lengths, variants = parse_args(argv)
    device = torch.device(a.device)
    chunk = a.chunk_tokens or (16 if a.model == "small" else 256)

    t = time.perf_counter()
    model = build_model(a.model, a.device, max(lengths))
    stream_sync(device)
    build_s = time.perf_counter() - t
    layout = StoreLayout(model, chunk, lengths)
    atol, rtol = tolerances(a, model.dtype)
    work = a.dir or tempfile.mkdtemp(prefix="tutti-ttft-")
    os.makedirs(work, exist_ok=True)
    if a.drives_dir:
        os.makedirs(a.drives_dir, exist_ok=True)

    b = Bench(a, model, device, chunk, variants, work, atol, rtol)
    b.report = {"config": config_report(b, layout, build_s), "runs": {}, "ratios": {}}

    with torch.no_grad():
        model(torch.zeros((1, min(64, max(lengths))), dtype=torch.long, device=device), use_cache=True, logits_to_keep=1)
        stream_sync(device)

    rt = open_store(b, layout)
    try:
        for n in lengths:
            run = measure_prompt(b, n)
            b.report["runs"][str(n)] = run
            b.report["ratios"][str(n)] = ratios(run, 4 * a.drive_mb_s * 1e6)
            b.emit()
    finally:
        finish(b, rt)
    return 0 if all_ok(b.report) else 1


class PrefixSources:
    """Where each restored variant of one prompt takes the prefix's K and V
    from: tutti (``pc``), the POSIX variants' per-layer files (``files``)
    read into host buffers, or host buffers alone (``host``, keyed by
    variant); and one timed repetition of a variant."""

    def __init__(self, b: Bench, p: Prompt) -> None:
        self.b, self.model, self.device, self.p = b, b.model, b.device, p
        self.layers, self.h, self.d = model_kv_shape(b.model)
        self.pc: Optional[PrefixCache] = None
        self.files: List[str] = []
        self.host: Dict[str, List[torch.Tensor]] = {}

    def kv_of(self, buf: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """K and V ([1, h, P, d], model dtype) of one layer's bytes."""
        half = buf.numel() // 2
        shape = (1, self.h, self.p.prefix, self.d)
        return buf[:half].view(self.model.dtype).view(shape), buf[half:].view(self.model.dtype).view(shape)

    def from_host(self, bufs: List[torch.Tensor], read: Optional[Callable[[int], None]]) -> DynamicCache:
        """A cache of the prefix from per-layer host buffers, each filled by
        ``read(layer)`` first when given, copied to the model's device."""
        cache = empty_cache(self.model)
        for i in range(self.layers):
            if read is not None:
                read(i)
            k, v = self.kv_of(bufs[i].to(self.device, non_blocking=True))
            cache.update(k, v, i)
        return cache

    def posix_reader(self, bufs: List[torch.Tensor]) -> Callable[[int], None]:
        """``read(layer)``: the layer's file into ``bufs[layer]`` with ``os.preadv``."""
        files = self.files

        def read(i: int) -> None:
            fd = os.open(files[i], os.O_RDONLY)
            try:
                mv = memoryview(bufs[i].numpy())
                got = 0
                while got < len(mv):
                    r = os.preadv(fd, [mv[got:]], got)
                    if r <= 0:
                        raise OSError(f"{files[i]}: short read at {got} of {len(mv)} bytes")
                    got += r
            finally:
                os.close(fd)

        return read

    def restore(self, v: str) -> Tuple[Optional[DynamicCache], int]:
        """The variant's restore: (cache of the prefix, tokens restored)."""
        p = self.p
        if v == "recompute":
            return None, 0
        if v == "tutti":
            cache, info = self.pc.restore(p.ids)
            if info.cached_tokens != p.prefix:
                kinds = [] if info.load is None else sorted({f.kind for f in info.load.failures})
                raise VariantFailed("partial", f"restored {info.cached_tokens} of {p.prefix} tokens ({kinds})")
            return cache, info.cached_tokens
        if v == "pinned":
            return self.from_host(self.host[v], None), p.prefix
        return self.from_host(self.host[v], self.posix_reader(self.host[v])), p.prefix

    def drop_page_cache(self) -> None:
        """Drop the POSIX files' pages from the OS page cache."""
        for path in self.files:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)

    def one(self, v: str) -> Tuple[float, float, float, torch.Tensor]:
        """One timed repetition: (ttft, restore, rest prefill) seconds and the logits."""
        model, device, p = self.model, self.device, self.p
        if v.startswith("posix_") and self.b.a.posix_page_cache == "drop":
            self.drop_page_cache()
        stream_sync(device)
        with torch.no_grad():
            t0 = time.perf_counter()
            cache, got = self.restore(v)
            stream_sync(device)
            t1 = time.perf_counter()
            if cache is None:
                out = model(p.ids, use_cache=True, logits_to_keep=1)
            else:
                out = model(p.ids[:, got:], use_cache=True, logits_to_keep=1, **{CACHE_KWARG: cache})
            logits = out.logits[0, -1]
            stream_sync(device)
            t2 = time.perf_counter()
        return t2 - t0, t1 - t0, t2 - t1, logits.float().cpu()

    def close(self) -> None:
        """Close tutti's prefix cache (unless a worker thread may still use
        it), drop the host buffers and remove the prompt's files."""
        if self.pc is not None and not self.b.hung:
            self.pc.close()
        self.host.clear()
        if self.files:
            shutil.rmtree(os.path.dirname(self.files[0]), ignore_errors=True)


def reference_prefill(b: Bench, p: Prompt) -> Tuple[torch.Tensor, Any, List[torch.Tensor], List[torch.Tensor]]:
    """A full prefill of the prompt: its last-position logits (float32, on
    the CPU), its cache, and the prefix's K and V per layer (copies)."""
    layers = model_kv_shape(b.model)[0]
    with torch.no_grad():
        out = b.model(p.ids, use_cache=True, logits_to_keep=1)
        stream_sync(b.device)
    ref_logits = out.logits[0, -1].float().cpu()
    full = cache_of(out)
    del out
    prefix_k = [full.layers[i].keys[:, :, : p.prefix].contiguous() for i in range(layers)]
    prefix_v = [full.layers[i].values[:, :, : p.prefix].contiguous() for i in range(layers)]
    return ref_logits, full, prefix_k, prefix_v


def save_to_tutti(b: Bench, p: Prompt, full: Any, r: Dict[str, Any]) -> PrefixCache:
    """Save the prompt's prefix from ``full`` through a new PrefixCache, in
    a worker thread under ``--save-timeout``; the outcome goes into the
    tutti variant's result ``r`` (a failed or partial save stops the variant)."""
    a = b.a
    pc = PrefixCache(b.model, b.kv, model_id=f"ttft-random-{a.model}-seed0", chunk_tokens=b.chunk, max_tokens=p.prefix, timeout=a.io_timeout)

    def save() -> Dict[str, Any]:
        t = time.perf_counter()
        with torch.no_grad():
            s = pc.save(p.ids, full, layers_in_flight=a.save_layers_at_once)
        return {"save_s": round(time.perf_counter() - t, 4), "stored_tokens": s.stored_tokens, "put_objects": s.put_objects,
                "failures": sorted({f.kind for f in s.failures})}

    status, value, th = run_with_timeout(save, a.save_timeout)
    b.left_running(th)
    if status != "ok":
        r.update(status=f"save_{status}", error=value)
    else:
        r["save"] = value
        if value["stored_tokens"] < p.prefix:
            r.update(status="save_partial", error=f"stored {value['stored_tokens']} of {p.prefix} tokens: {value['failures']}")
    b.emit()
    return pc


def write_layer_files(folder: str, prefix_k: List[torch.Tensor], prefix_v: List[torch.Tensor]) -> List[str]:
    """One file per layer under ``folder``, K then V ([kv_heads, P,
    head_dim] each), each ``fsync``ed; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    files: List[str] = []
    for i in range(len(prefix_k)):
        path = os.path.join(folder, f"layer{i:03d}.kv")
        with open(path, "wb") as f:  # K then V, [kv_heads, P, head_dim] each
            f.write(as_bytes(prefix_k[i]).cpu().numpy().tobytes())
            f.write(as_bytes(prefix_v[i]).cpu().numpy().tobytes())
            f.flush()
            os.fsync(f.fileno())
        files.append(path)
    return files


def pinned_copies(cuda: bool, prefix_k: List[torch.Tensor], prefix_v: List[torch.Tensor]) -> List[torch.Tensor]:
    """The ``pinned`` variant's host copy of the prefix: one buffer per
    layer, K ([kv_heads, P, head_dim]) then V, as in the files; page-locked
    on CUDA."""
    kv_bytes = [as_bytes(torch.cat([prefix_k[i], prefix_v[i]], dim=0)).cpu() for i in range(len(prefix_k))]
    return [b.pin_memory() if cuda else b.clone() for b in kv_bytes]


def record_rep(r: Dict[str, Any], v: str, value: Tuple[float, float, float, torch.Tensor], ref_logits: torch.Tensor,
               atol: float, rtol: float) -> None:
    """Add one counted repetition of variant ``v`` to its result ``r``:
    the times and, for a restored variant, the logits against the reference."""
    ttft, rs, rest, logits = value
    r["ttft_s"].append(round(ttft, 5))
    r["restore_s"].append(round(rs, 5))
    r["rest_prefill_s"].append(round(rest, 5))
    if v != "recompute":
        diff = float((logits - ref_logits).abs().max())
        r["logits_max_abs_diff"] = max(r.get("logits_max_abs_diff", 0.0), diff)
        ok = bool(torch.allclose(logits, ref_logits, atol=atol, rtol=rtol))
        r["logits_allclose"] = r.get("logits_allclose", True) and ok
        r["argmax_equal"] = r.get("argmax_equal", True) and int(logits.argmax()) == int(ref_logits.argmax())


def run_reps(b: Bench, src: PrefixSources, res: Dict[str, Dict[str, Any]], ref_logits: torch.Tensor) -> None:
    """``--warmup`` + ``--reps`` repetitions, variants interleaved, each in
    a worker thread under ``--timeout``; a variant that fails once is not
    run again. The report is rewritten after every repetition."""
    a = b.a
    for rep in range(a.warmup + a.reps):
        for v in b.variants:
            r = res[v]
            if r["status"] != "ok":
                continue
            status, value, th = run_with_timeout(lambda v=v: src.one(v), a.timeout)
            b.left_running(th)
            if status != "ok":
                r.update(status=status, error=value, failed_at_rep=rep)
                b.emit()
                continue
            if rep < a.warmup:
                continue
            record_rep(r, v, value, ref_logits, b.atol, b.rtol)
            b.emit()


def summarise(res: Dict[str, Dict[str, Any]], prefix_tokens: int, prefix_bytes: int) -> None:
    """Each variant's medians (and a restored variant's restore bandwidth,
    10^9 bytes/s) from its counted repetitions, added to its result."""
    for v, r in res.items():
        if r["ttft_s"]:
            r["reps"] = len(r["ttft_s"])
            r["ttft_median_s"] = round(statistics.median(r["ttft_s"]), 5)
            r["restore_median_s"] = round(statistics.median(r["restore_s"]), 5)
            r["rest_prefill_median_s"] = round(statistics.median(r["rest_prefill_s"]), 5)
            if v != "recompute" and r["restore_median_s"] > 0:
                r["restored_tokens"] = prefix_tokens
                r["restore_gb_s"] = round(prefix_bytes / r["restore_median_s"] / 1e9, 3)


def measure_prompt(b: Bench, n: int) -> Dict[str, Any]:
    """Everything for prompt length ``n`` tokens: the reference prefill, the
    per-variant setup (tutti save, files, pinned copies; untimed), then
    ``--warmup`` + ``--reps`` repetitions, variants interleaved."""
    p = Prompt(b.model, n, b.chunk, b.a.seed + n)
    layers = model_kv_shape(b.model)[0]
    run: Dict[str, Any] = {"tokens": n, "prefix_tokens": p.prefix, "rest_tokens": p.rest, "prefix_bytes": p.prefix_bytes, "variants": {}}
    b.report["runs"][str(n)] = run
    res: Dict[str, Dict[str, Any]] = {v: {"status": "ok", "ttft_s": [], "restore_s": [], "rest_prefill_s": []} for v in b.variants}
    run["variants"] = res

    # Reference: a full prefill; its KV is what the other variants restore.
    ref_logits, full, prefix_k, prefix_v = reference_prefill(b, p)
    src = PrefixSources(b, p)
    if "tutti" in b.variants:
        src.pc = save_to_tutti(b, p, full, res["tutti"])
    posix = [v for v in b.variants if v.startswith("posix_")]
    if posix:
        t = time.perf_counter()
        src.files = write_layer_files(os.path.join(b.work, str(n)), prefix_k, prefix_v)
        run["posix_write_s"] = round(time.perf_counter() - t, 4)
        for v in posix:
            src.host[v] = [host_buffer(p.layer_bytes, b.cuda and v == "posix_pinned") for _ in range(layers)]
    if "pinned" in b.variants:
        src.host["pinned"] = pinned_copies(b.cuda, prefix_k, prefix_v)
    del full, prefix_k, prefix_v

    run_reps(b, src, res, ref_logits)
    summarise(res, p.prefix, p.prefix_bytes)
    src.close()
    return run


def ratios(run: Dict[str, Any], bandwidth_b_s: float) -> Dict[str, Any]:
    """The issue's goals for one prompt length, from the medians (None
    where a variant has no median). ``bandwidth_b_s``: the drives' modelled
    bandwidth together, bytes/s."""
    med = {v: r.get("ttft_median_s") for v, r in run["variants"].items()}
    out: Dict[str, Any] = {}
    b = med.get("tutti")

    def ratio(x: Optional[float], y: Optional[float]) -> Optional[float]:
        return None if x is None or not y else round(x / y, 4)

    out["tutti_over_recompute"] = ratio(b, med.get("recompute"))
    for v in ("posix_pinned", "posix_pageable"):
        out[f"tutti_over_{v}"] = ratio(b, med.get(v))
    d = run["variants"].get("pinned", {})
    if d.get("ttft_median_s") is not None:
        scaled = d["rest_prefill_median_s"] + max(d["restore_median_s"], run["prefix_bytes"] / bandwidth_b_s)
        out["pinned_scaled_ttft_s"] = round(scaled, 5)
        out["tutti_over_pinned_scaled"] = ratio(b, scaled)
    else:
        out["pinned_scaled_ttft_s"] = out["tutti_over_pinned_scaled"] = None
    out["goals"] = {
        "tutti_at_most_0.15x_recompute": None if out["tutti_over_recompute"] is None else out["tutti_over_recompute"] <= 0.15,
        "tutti_faster_than_posix_pinned": None if out["tutti_over_posix_pinned"] is None else out["tutti_over_posix_pinned"] < 1,
        "tutti_within_1.2x_pinned_scaled": None if out["tutti_over_pinned_scaled"] is None else out["tutti_over_pinned_scaled"] <= 1.2,
    }
    return out


if __name__ == "__main__":
    sys.exit(main())
