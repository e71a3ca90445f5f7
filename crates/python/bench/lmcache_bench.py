#!/usr/bin/env python3
"""LMCache storing and retrieving a cached prompt prefix: through tutti
(LMCache's GPU-direct L1 data path with the ``tutti`` GDS backend), through
LMCache's local disk backend, and from LMCache's CPU-memory tier; retrieve
GB/s and TTFT (issue 26; docs/lmcache.md, docs/benchmarks.md).

    python crates/python/bench/lmcache_bench.py --dir /var/tmp/lmcache-disk      # GPU machine: Llama-3-8B shape, 8,192 and 32,768 tokens
    python crates/python/bench/lmcache_bench.py --model small --device cpu --tokens 40,64 --chunk-tokens 16   # smoke test anywhere

The model, prompts, reference prefill, timeouts and JSON shape are
``ttft.py``'s (read its docstring): ``--model llama3-8b-shape`` is bf16, 32
layers x 8 KV heads x 128 dims, 128 KiB of KV per token. For each prompt
length T the prefix P = ((T - 1) // chunk) * chunk tokens is stored in
LMCache's object format, one object per ``--chunk-tokens`` (256) tokens
holding every layer (``MemoryFormat.KV_2LTD``: [2 (K, V), layers, chunk,
kv_heads x head_dim], 32 MiB at 256 tokens), then each repetition
retrieves every object into GPU memory, rearranges them into a
``DynamicCache`` (one GPU copy, the same in every variant) and prefills the
R = T - P remaining tokens. Variants:

- ``recompute``: a full prefill of the T tokens (the reference).
- ``lmcache_tutti`` (a): LMCache's ``GDSContext`` (the data path of its GDS
  L1 tier) with ``backend: tutti`` on a slab ``tutti://kv`` of four emulated
  drives striped into one store, each with the timing model of a PCIe Gen4
  drive (``--drive-mb-s`` 7000, ``--drive-iops`` 1.5 M, ``--drive-latency-us``
  80), ``execution: gpu`` on CUDA: objects move between the drives and a
  registered GPU staging buffer on one CUDA stream, no host memory.
- ``lmcache_disk`` (b): LMCache's ``LocalDiskBackend`` (one file per
  object under ``--dir``; ``batched_get_blocking`` reads them into its
  pinned CPU buffers), then host-to-device copies. Before every repetition
  the files' pages are dropped from the page cache
  (``posix_fadvise(DONTNEED)`` after an ``fsync``; ``--page-cache keep``
  reads from memory); the JSON records ``--dir``'s file system type.
- ``lmcache_cpu`` (c): LMCache's ``LocalCPUBackend`` hot cache
  (``get_blocking``), then host-to-device copies: the upper bound of any
  path over the host-to-device link.

On CPU (``--device cpu``) LMCache has no stream handle, so the GDS context's
stream helpers are replaced by no-ops (as LMCache's own context tests do)
and tutti runs ``execution: cpu``: a smoke test of the plumbing and the
logits, not of speeds. On the GPU machine LMCache's compiled
``lmcache.cuda_ops`` does not load with torch 2.11 (built for 2.13); none
of these paths needs it (LMCache falls back to torch for its pinned
allocations).

Output: ttft.py's JSON (``config``, ``runs`` per T with per-variant
``ttft_median_s``, ``restore_median_s``, ``restore_gb_s``, logits against
``recompute``), and ``ratios`` per T: ``tutti_over_disk`` (restore time;
goal at 32,768: at most 0.2, i.e. 5x faster), ``cpu_scaled_restore_s``
(``lmcache_cpu``'s restore stretched to the drives' modelled bandwidth,
4 x ``--drive-mb-s``) and ``tutti_over_cpu_scaled`` (goal: at most 1.3).
Exit status: 0 when every variant is "ok", 1 otherwise, 3 when a timed-out
worker thread was left running.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

# A copy queued behind a running I/O kernel must not share the hardware
# queue of the emulator's copies (docs/gpu.md); set before CUDA starts.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import torch  # noqa: E402
import transformers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import lmcache  # noqa: E402
import tutti  # noqa: E402
import tutti.lmcache as tl  # noqa: E402
from prefix_cache_demo import build_model, runtime_yaml  # noqa: E402
from ttft import Prompt, VariantFailed, empty_cache, fs_type, run_with_timeout, stream_sync  # noqa: E402
from tutti.integrations.transformers import CACHE_KWARG, cache_of, model_kv_shape  # noqa: E402

MiB = 1 << 20
VARIANTS = ["recompute", "lmcache_tutti", "lmcache_disk", "lmcache_cpu"]


class Layout:
    """LMCache's per-chunk object layout (KV_2LTD) for one model and chunk size."""

    def __init__(self, model: Any, chunk: int) -> None:
        self.layers, self.heads, self.dim = model_kv_shape(model)
        self.dtype = model.dtype
        self.chunk = chunk
        self.shape = torch.Size([2, self.layers, chunk, self.heads * self.dim])
        self.obj_bytes = 2 * self.layers * chunk * self.heads * self.dim * (torch.finfo(self.dtype).bits // 8)

    def pack(self, cache: Any, prefix: int) -> torch.Tensor:
        """The prefix's objects, [chunks, 2, layers, chunk, heads x dim], on the cache's device."""
        c = prefix // self.chunk
        kv = torch.stack([torch.stack([cache.layers[i].keys[0, :, :prefix], cache.layers[i].values[0, :, :prefix]])
                          for i in range(self.layers)], dim=1)  # [2, L, h, P, d]
        kv = kv.view(2, self.layers, self.heads, c, self.chunk, self.dim).permute(3, 0, 1, 4, 2, 5)
        return kv.reshape(c, *self.shape).contiguous()

    def unpack(self, packed: torch.Tensor, model: Any) -> Any:
        """A DynamicCache of the prefix from its objects (one GPU copy)."""
        c = packed.shape[0]
        x = packed.view(c, 2, self.layers, self.chunk, self.heads, self.dim).permute(2, 1, 4, 0, 3, 5)
        x = x.reshape(self.layers, 2, self.heads, c * self.chunk, self.dim)
        cache = empty_cache(model)
        for i in range(self.layers):
            cache.update(x[i, 0].unsqueeze(0), x[i, 1].unsqueeze(0), i)
        return cache


class ChunkRef:
    """What LMCache's GDSContext.transfer_async reads of a GDSMemoryObject."""

    def __init__(self, slab_offset: int, size: int) -> None:
        self.slab_offset, self.size = slab_offset, size

    def get_size(self) -> int:
        return self.size


def cpu_streams() -> None:
    """On CPU LMCache has no native stream handle: its GDS context's stream
    helpers become no-ops (tutti's host path completes before returning)."""
    from lmcache.v1.gpu_connector import gds_context

    class Done:
        def is_complete(self) -> bool:
            return True

    ps = gds_context.platform_stream
    ps.current_stream = lambda device: None
    ps.stream_handle = lambda device, stream: 0
    ps.synchronize_stream = lambda device, stream: None
    ps.synchronize_device = lambda device: None
    ps.record_completion_event = lambda device, stream: Done()


class TuttiTier:
    """(a): LMCache's GDSContext with backend "tutti", a GPU staging buffer
    of ``staging_bytes`` and a slab of ``slab_bytes``."""

    def __init__(self, a: Any, device: torch.device, slab_bytes: int, staging_bytes: int) -> None:
        from lmcache.v1.distributed.config import GdsL1Config
        from lmcache.v1.gpu_connector.gds_context import GDSContext

        cuda = device.type == "cuda"
        if not cuda:
            cpu_streams()
        tl.install()
        drive_bytes = max(64 * MiB, (slab_bytes // 4 * 5 // 4 + 64 * MiB) // MiB * MiB)
        timing = f"{{ bandwidth_mb_s: {a.drive_mb_s}, iops: {a.drive_iops}, latency_us: {a.drive_latency_us} }}"
        self.rt = tutti.Runtime.from_yaml(runtime_yaml(a.drives_dir, drive_bytes, 64 * MiB, cuda, timing))
        tl.set_runtime(self.rt)
        self.stream = torch.cuda.Stream(device) if cuda else None
        self.ctx = GDSContext()
        self.ctx.initialize(GdsL1Config(file_location="tutti://kv", size_in_bytes=slab_bytes, backend="tutti"))
        self.staging = torch.empty(staging_bytes, dtype=torch.uint8, device=device)
        with self._on_stream():
            self.ctx.register_gpu_buffer(self.staging)
        self.next_offset = 0
        self.drive_bytes = drive_bytes

    def _on_stream(self) -> Any:
        import contextlib

        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def _sync(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def save(self, packed: torch.Tensor, order: bool = True) -> List[ChunkRef]:
        """Copy ``packed`` into the staging buffer and write it to the slab,
        on the tier's stream, after the work queued so far on the caller's
        (which made ``packed``); ``order=False`` leaves that wait out (only
        to show what it guards against: ``lmcache_check.py --no-order``)."""
        from lmcache.v1.gpu_connector.gds_context import SlabDirection

        n = packed.shape[0]
        obj = packed[0].numel() * packed.element_size()
        refs = [ChunkRef(self.next_offset + c * obj, obj) for c in range(n)]
        self.next_offset += -(-n * obj // 4096) * 4096
        flat = packed.view(-1).view(torch.uint8)
        if self.stream is not None and order:
            # ``packed`` was made on the caller's stream: without this wait
            # the copy below may read it before those kernels have written
            # it (at 32,768 tokens it did: wrong KV, every status ok).
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with self._on_stream():
            self.staging[: flat.numel()].copy_(flat)
            for c, r in enumerate(refs):
                self.ctx.transfer_async(r, self.staging[c * obj :], SlabDirection.WRITE)
        self._sync()
        return refs

    def poison(self) -> None:
        """Overwrite the staging buffer (untimed), so a read that moved nothing cannot pass."""
        with self._on_stream():
            self.staging.fill_(0x7F)
        self._sync()

    def load(self, refs: List[ChunkRef], layout: Layout, model: Any) -> Any:
        from lmcache.v1.gpu_connector.gds_context import SlabDirection

        obj = refs[0].size
        with self._on_stream():
            for c, r in enumerate(refs):
                self.ctx.transfer_async(r, self.staging[c * obj :], SlabDirection.READ)
            packed = self.staging[: len(refs) * obj].view(layout.dtype).view(len(refs), *layout.shape)
            cache = layout.unpack(packed, model)
        self._sync()
        return cache

    def close(self) -> None:
        with self._on_stream():
            self.ctx.deregister_gpu_buffer(self.staging)
        self.ctx.close()
        tl.set_runtime(None)
        self.rt.shutdown()


class LMCacheBackends:
    """(b) and (c): LMCache's LocalCPUBackend (hot cache on) and a
    LocalDiskBackend over its own LocalCPUBackend (hot cache off)."""

    def __init__(self, layout: Layout, model_name: str, cpu_bytes: int, disk_dir: str, variants: List[str]) -> None:
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

        gb = cpu_bytes / 1024**3
        md = LMCacheMetadata(model_name=model_name, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                             kv_dtype=layout.dtype, kv_shape=(layout.layers, 2, layout.chunk, layout.heads, layout.dim))
        self.layout, self.model_name, self.dir = layout, model_name, disk_dir
        self.cpu = self.disk = None
        self.loop = None
        if "lmcache_cpu" in variants:
            cfg = LMCacheEngineConfig.from_defaults(chunk_size=layout.chunk, local_cpu=True, max_local_cpu_size=gb)
            self.cpu = LocalCPUBackend(cfg, md)
        if "lmcache_disk" in variants:
            cfg = LMCacheEngineConfig.from_defaults(chunk_size=layout.chunk, local_cpu=False, max_local_cpu_size=gb,
                                                    local_disk=disk_dir.rstrip("/") + "/", max_local_disk_size=gb)
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, daemon=True).start()
            self.disk_cpu = LocalCPUBackend(cfg, md)
            self.disk = LocalDiskBackend(cfg, self.loop, self.disk_cpu, metadata=md)

    def keys(self, n_tokens: int, chunks: int) -> List[Any]:
        from lmcache.utils import CacheEngineKey

        return [CacheEngineKey(self.model_name, 1, 0, n_tokens * 100_000 + c, self.layout.dtype) for c in range(chunks)]

    def _objects(self, backend: Any, packed: torch.Tensor) -> List[Any]:
        from lmcache.v1.memory_management import MemoryFormat

        out = []
        for c in range(packed.shape[0]):
            o = backend.allocate(self.layout.shape, self.layout.dtype, MemoryFormat.KV_2LTD)
            if o is None:
                raise RuntimeError("LMCache's CPU allocator is full")
            o.tensor.copy_(packed[c])
            out.append(o)
        return out

    def save(self, which: str, keys: List[Any], packed: torch.Tensor, timeout: float) -> None:
        backend = self.cpu if which == "lmcache_cpu" else self.disk
        objs = self._objects(self.cpu if which == "lmcache_cpu" else self.disk_cpu, packed)
        for k, o in zip(keys, objs):
            backend.submit_put_task(k, o)
        end = time.monotonic() + timeout
        while not all(backend.contains(k) for k in keys):
            if time.monotonic() > end:
                raise VariantFailed("save_timeout", f"{which}: not every object stored after {timeout} s")
            time.sleep(0.005)
        for o in objs:
            o.ref_count_down()
        if which == "lmcache_disk":
            os.sync()

    def drop_pages(self) -> None:
        for name in os.listdir(self.dir):
            fd = os.open(os.path.join(self.dir, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def load(self, which: str, keys: List[Any], device: torch.device, model: Any) -> Any:
        if which == "lmcache_cpu":
            objs = [self.cpu.get_blocking(k) for k in keys]
        else:
            objs = self.disk.batched_get_blocking(keys)
        if any(o is None for o in objs):
            raise VariantFailed("partial", f"{which}: {sum(o is None for o in objs)} of {len(keys)} objects missing")
        packed = torch.empty((len(objs), *self.layout.shape), dtype=self.layout.dtype, device=device)
        for c, o in enumerate(objs):
            packed[c].copy_(o.tensor, non_blocking=True)
        cache = self.layout.unpack(packed, model)
        stream_sync(device)
        for o in objs:
            o.ref_count_down()
        return cache

    def close(self) -> None:
        for b in (self.disk, self.cpu):
            if b is not None:
                b.close()
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["small", "llama3-8b-shape"], default="llama3-8b-shape")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", default="8192,32768", help="prompt lengths, tokens, comma-separated")
    ap.add_argument("--chunk-tokens", type=int, default=None, help="tokens per LMCache object (small: 16, llama3-8b-shape: 256)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=5, help="counted repetitions per variant")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted repetitions per variant first")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one repetition of one variant may take")
    ap.add_argument("--save-timeout", type=float, default=300.0, help="seconds one variant's save of one prefix may take")
    ap.add_argument("--drives-dir", default="", help="folder for file-backed emulated drives (default: RAM)")
    ap.add_argument("--dir", default="", help="folder for LMCache's disk backend (default: a new folder under the temp dir)")
    ap.add_argument("--page-cache", choices=["drop", "keep"], default="drop")
    ap.add_argument("--drive-mb-s", type=int, default=7000, help="modelled bandwidth per drive, 10^6 bytes/s")
    ap.add_argument("--drive-iops", type=int, default=1_500_000, help="modelled commands per second per drive")
    ap.add_argument("--drive-latency-us", type=int, default=80, help="modelled latency per command, microseconds")
    ap.add_argument("--atol", type=float, default=None, help="logits tolerance (float32: 1e-4, bf16: 5e-2)")
    ap.add_argument("--rtol", type=float, default=None, help="logits tolerance (float32: 1e-4, bf16: 5e-2)")
    ap.add_argument("--seed", type=int, default=42, help="prompt seed (the prompt of length T uses seed + T)")
    ap.add_argument("--out", default="", help="also write the JSON here (rewritten after every repetition)")
    ap.add_argument("--deadline", type=float, default=0.0, help="seconds for the whole run (0: none)")
    return ap.parse_args()


def main() -> int:
    a = parse_args()
    if a.deadline > 0:
        faulthandler.dump_traceback_later(a.deadline, exit=True)
    lengths = [int(x) for x in a.tokens.split(",") if x]
    variants = [v for v in a.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants):
        sys.exit(f"unknown variant in {variants}; choose from {VARIANTS}")
    if "recompute" not in variants:
        variants.insert(0, "recompute")
    device = torch.device(a.device)
    chunk = a.chunk_tokens or (16 if a.model == "small" else 256)
    t = time.perf_counter()
    model = build_model(a.model, a.device, max(lengths))
    stream_sync(device)
    layout = Layout(model, chunk)
    total = sum(((n - 1) // chunk) * layout.obj_bytes for n in lengths)
    largest = max(((n - 1) // chunk) * layout.obj_bytes for n in lengths)
    work = a.dir or tempfile.mkdtemp(prefix="tutti-lmcache-")
    os.makedirs(work, exist_ok=True)
    atol = a.atol if a.atol is not None else (1e-4 if model.dtype == torch.float32 else 5e-2)
    rtol = a.rtol if a.rtol is not None else (1e-4 if model.dtype == torch.float32 else 5e-2)
    report: Dict[str, Any] = {"config": {
        "model": a.model, "device": str(device), "dtype": str(model.dtype).replace("torch.", ""),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__, "transformers": transformers.__version__, "lmcache": lmcache.__version__,
        "python": platform.python_version(), "layers": layout.layers, "kv_heads": layout.heads, "head_dim": layout.dim,
        "chunk_tokens": chunk, "object_bytes": layout.obj_bytes, "drives": 4,
        "drive_timing": {"bandwidth_mb_s": a.drive_mb_s, "iops": a.drive_iops, "latency_us": a.drive_latency_us},
        "modelled_bandwidth_gb_s": 4 * a.drive_mb_s / 1000, "execution": "gpu" if device.type == "cuda" else "cpu",
        "disk_dir": work, "disk_dir_fs": fs_type(work), "page_cache": a.page_cache, "reps": a.reps, "warmup": a.warmup,
        "timeout_s": a.timeout, "logits_atol": atol, "logits_rtol": rtol, "build_s": round(time.perf_counter() - t, 3),
        "variants": variants}, "runs": {}, "ratios": {}}
    hung: List[threading.Thread] = []

    def emit() -> None:
        if a.out:
            with open(a.out + ".tmp", "w") as f:
                json.dump(report, f, indent=2)
            os.replace(a.out + ".tmp", a.out)

    tiers = Tiers(a, device, layout, variants, total, largest, work, report)
    try:
        for n in lengths:
            run = measure(a, model, device, n, layout, variants, tiers, atol, rtol, report, emit, hung)
            report["runs"][str(n)] = run
            report["ratios"][str(n)] = ratios(run, 4 * a.drive_mb_s * 1e6)
            emit()
    finally:
        emit()
        print(json.dumps(report, indent=2), flush=True)
        if hung:
            sys.stderr.write(f"lmcache_bench: {len(hung)} variant thread(s) timed out; exiting without closing\n")
            sys.stderr.flush()
            os._exit(3)
        tiers.close()
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)
    return verdict(report)


def verdict(report: Dict[str, Any]) -> int:
    """Exit status: 0 when every variant of every length ran ("ok") and
    every restored variant's first token equals recompute's; 1 otherwise,
    naming on stderr what failed (a different first token is wrong KV, the
    worst outcome, even when every transfer reported success)."""
    bad = [f"{n} tokens, {name}: {v.get('status')}" for n, r in report["runs"].items()
           for name, v in r["variants"].items() if v.get("status") != "ok"]
    bad += [f"{n} tokens, {name}: first token differs from recompute (max logit diff {v.get('logits_max_abs_diff')})"
            for n, r in report["runs"].items() for name, v in r["variants"].items() if v.get("argmax_equal") is False]
    for line in bad:
        sys.stderr.write(f"lmcache_bench: {line}\n")
    return 1 if bad else 0


class Tiers:
    """The tiers the chosen variants need; a tier that cannot start marks its variant's error."""

    def __init__(self, a, device, layout, variants, total, largest, work, report) -> None:
        self.errors: Dict[str, str] = {}
        self.tutti: Optional[TuttiTier] = None
        self.lm: Optional[LMCacheBackends] = None
        if "lmcache_tutti" in variants:
            try:
                self.tutti = TuttiTier(a, device, total + 64 * MiB, largest)
                report["config"]["drive_bytes"] = self.tutti.drive_bytes
            except Exception as e:  # reported, never raised past the benchmark
                self.errors["lmcache_tutti"] = f"{type(e).__name__}: {e}"
        lm = [v for v in variants if v in ("lmcache_disk", "lmcache_cpu")]
        if lm:
            try:
                self.lm = LMCacheBackends(layout, f"bench-{a.model}", int(total * 1.25) + 64 * MiB, work, lm)
            except Exception as e:  # reported, never raised past the benchmark
                for v in lm:
                    self.errors[v] = f"{type(e).__name__}: {e}"

    def close(self) -> None:
        for t in (self.tutti, self.lm):
            if t is not None:
                t.close()


def measure(a, model, device, n, layout, variants, tiers, atol, rtol, report, emit, hung) -> Dict[str, Any]:
    """Prompt length ``n``: the reference, the saves (untimed), then
    ``--warmup`` + ``--reps`` repetitions, variants interleaved."""
    p = Prompt(model, n, layout.chunk, a.seed + n)
    run: Dict[str, Any] = {"tokens": n, "prefix_tokens": p.prefix, "rest_tokens": p.rest, "prefix_bytes": p.prefix_bytes, "variants": {}}
    res = {v: {"status": "ok", "ttft_s": [], "restore_s": [], "rest_prefill_s": []} for v in variants}
    run["variants"] = res
    report["runs"][str(n)] = run
    with torch.no_grad():
        out = model(p.ids, use_cache=True, logits_to_keep=1)
        stream_sync(device)
    ref = out.logits[0, -1].float().cpu()
    packed = layout.pack(cache_of(out), p.prefix)
    del out
    chunks = p.prefix // layout.chunk
    keys = tiers.lm.keys(n, chunks) if tiers.lm is not None else []
    refs: List[ChunkRef] = []
    for v in variants[1:]:
        if v in tiers.errors:
            res[v].update(status="error", error=tiers.errors[v])
            continue

        def save(v=v) -> None:
            nonlocal refs
            if v == "lmcache_tutti":
                refs = tiers.tutti.save(packed)
            else:
                tiers.lm.save(v, keys, packed.cpu(), a.save_timeout)

        t = time.perf_counter()
        status, value, th = run_with_timeout(save, a.save_timeout)
        if th is not None:
            hung.append(th)
        res[v]["save_s"] = round(time.perf_counter() - t, 4)
        if status != "ok":
            res[v].update(status=f"save_{status}", error=value)
    packed = None  # the saves are done: free it before the repetitions

    def restore(v: str) -> Optional[Any]:
        if v == "recompute":
            return None
        if v == "lmcache_tutti":
            return tiers.tutti.load(refs, layout, model)
        return tiers.lm.load(v, keys, device, model)

    def one(v: str) -> Tuple[float, float, float, torch.Tensor]:
        if v == "lmcache_disk" and a.page_cache == "drop":
            tiers.lm.drop_pages()
        if v == "lmcache_tutti":
            tiers.tutti.poison()
        stream_sync(device)
        with torch.no_grad():
            t0 = time.perf_counter()
            cache = restore(v)
            stream_sync(device)
            t1 = time.perf_counter()
            if cache is None:
                o = model(p.ids, use_cache=True, logits_to_keep=1)
            else:
                o = model(p.ids[:, p.prefix:], use_cache=True, logits_to_keep=1, **{CACHE_KWARG: cache})
            logits = o.logits[0, -1]
            stream_sync(device)
            t2 = time.perf_counter()
        return t2 - t0, t1 - t0, t2 - t1, logits.float().cpu()

    repeat(a, variants, res, one, ref, atol, rtol, emit, hung)
    summarize(res, p)
    return run


def repeat(a, variants, res, one: Callable, ref, atol, rtol, emit, hung) -> None:
    """``--warmup`` + ``--reps`` rounds over the variants still "ok"."""
    for rep in range(a.warmup + a.reps):
        for v in variants:
            r = res[v]
            if r["status"] != "ok":
                continue
            status, value, th = run_with_timeout(lambda v=v: one(v), a.timeout)
            if th is not None:
                hung.append(th)
            if status != "ok":
                r.update(status=status, error=value, failed_at_rep=rep)
                emit()
                continue
            ttft, rs, rest, logits = value
            if rep < a.warmup:
                continue
            r["ttft_s"].append(round(ttft, 5))
            r["restore_s"].append(round(rs, 5))
            r["rest_prefill_s"].append(round(rest, 5))
            if v != "recompute":
                r["logits_max_abs_diff"] = max(r.get("logits_max_abs_diff", 0.0), float((logits - ref).abs().max()))
                r["logits_allclose"] = r.get("logits_allclose", True) and bool(torch.allclose(logits, ref, atol=atol, rtol=rtol))
                r["argmax_equal"] = r.get("argmax_equal", True) and int(logits.argmax()) == int(ref.argmax())
            emit()


def summarize(res: Dict[str, Dict[str, Any]], p: Prompt) -> None:
    for v, r in res.items():
        if not r["ttft_s"]:
            continue
        r["reps"] = len(r["ttft_s"])
        r["ttft_median_s"] = round(statistics.median(r["ttft_s"]), 5)
        r["restore_median_s"] = round(statistics.median(r["restore_s"]), 5)
        r["rest_prefill_median_s"] = round(statistics.median(r["rest_prefill_s"]), 5)
        if v != "recompute" and r["restore_median_s"] > 0:
            r["restored_tokens"] = p.prefix
            r["restore_gb_s"] = round(p.prefix_bytes / r["restore_median_s"] / 1e9, 3)


def ratios(run: Dict[str, Any], bandwidth_b_s: float) -> Dict[str, Any]:
    """The issue's goals for one prompt length (None where a variant has no median)."""
    v = run["variants"]
    rs = {k: x.get("restore_median_s") for k, x in v.items()}
    ttft = {k: x.get("ttft_median_s") for k, x in v.items()}

    def ratio(x: Optional[float], y: Optional[float]) -> Optional[float]:
        return None if x is None or not y else round(x / y, 4)

    out: Dict[str, Any] = {"tutti_over_disk": ratio(rs.get("lmcache_tutti"), rs.get("lmcache_disk")),
                           "tutti_over_disk_ttft": ratio(ttft.get("lmcache_tutti"), ttft.get("lmcache_disk")),
                           "tutti_over_recompute_ttft": ratio(ttft.get("lmcache_tutti"), ttft.get("recompute"))}
    c = rs.get("lmcache_cpu")
    out["cpu_scaled_restore_s"] = None if c is None else round(max(c, run["prefix_bytes"] / bandwidth_b_s), 5)
    out["tutti_over_cpu_scaled"] = ratio(rs.get("lmcache_tutti"), out["cpu_scaled_restore_s"])
    out["goals"] = {
        "tutti_at_least_5x_faster_than_disk": None if out["tutti_over_disk"] is None else out["tutti_over_disk"] <= 0.2,
        "tutti_within_1.3x_cpu_scaled": None if out["tutti_over_cpu_scaled"] is None else out["tutti_over_cpu_scaled"] <= 1.3,
    }
    return out


if __name__ == "__main__":
    sys.exit(main())
