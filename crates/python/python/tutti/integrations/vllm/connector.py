"""``TuttiConnector``: vLLM's KV connector (v1 API) over ``tutti.engine``.

Enable with::

    --kv-transfer-config '{"kv_connector":"TuttiConnector",
        "kv_connector_module_path":"tutti.integrations.vllm",
        "kv_role":"kv_both", "kv_connector_extra_config":{...}}'

The methods and signatures follow ``KVConnectorBase_V1`` of vLLM
(``vllm/distributed/kv_transfer/kv_connector/v1/base.py``, commit
003df2961dd8830c317a61f9745ccd557da9fa06; docs/vllm.md). Each method is a
thin call into ``SchedulerLogic`` (scheduler side) or ``WorkerLogic``
(worker side), which are plain Python over the engine core.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import time
from typing import Any, Dict, List, Optional, Set

from tutti.engine import KvCacheClient
from tutti.integrations.vllm import state
from tutti.integrations.vllm._compat import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole
from tutti.integrations.vllm.attention import check_vllm_model
from tutti.integrations.vllm.config import TuttiVllmConfig
from tutti.integrations.vllm.layout import VllmPagedKV
from tutti.integrations.vllm.metadata import TuttiConnectorMetadata
from tutti.integrations.vllm.reader import manifest_key, put_manifest
from tutti.integrations.vllm.scheduler import SchedulerLogic
from tutti.integrations.vllm.worker import WORKER_COUNTERS, WorkerLogic

log = logging.getLogger("tutti.vllm")


def layer_order(kv_caches: Dict[str, Any]) -> List[str]:
    """The layer names in key order: by the one integer in each name
    (``model.layers.7.self_attn.attn`` -> 7) when every name has exactly
    one and they are distinct, else in the dict's order. The order fixes
    which stored object belongs to which layer, so it must not depend on
    how vLLM happens to order the dict."""
    names = list(kv_caches)
    nums = [re.findall(r"\d+", n) for n in names]
    if all(len(x) == 1 for x in nums) and len({int(x[0]) for x in nums}) == len(names):
        return [n for _, n in sorted(zip((int(x[0]) for x in nums), names))]
    return names


def namespace_model(model: str, names: List[str]) -> str:
    """The model part of the key namespace: the configured model id and a
    digest of the ordered layer names, so that another layer naming (another
    vLLM version, another model definition) misses instead of loading one
    layer's KV into another."""
    digest = hashlib.blake2b("\n".join(names).encode(), digest_size=8).hexdigest()
    return f"{model}|vllm-layers={len(names)}:{digest}"


def _role_name(role: Any) -> str:
    return str(getattr(role, "name", role)).upper()


def tp_rank(vllm_config: Any) -> int:
    """This worker's tensor-parallel rank: vLLM's process group when it is
    initialised, else ``parallel_config.rank`` (0 without either)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore[import-not-found]

        return int(get_tensor_model_parallel_rank())
    except Exception:  # no vLLM, or its groups are not initialised here
        par = getattr(vllm_config, "parallel_config", None)
        return int(getattr(par, "rank", 0) or 0)


COUNTERS = ("lookups", "lookup_tokens", "lookup_us") + WORKER_COUNTERS + ("staged_bytes",)
"""The connector's counters (``TuttiConnector.stats``): scheduler side,
``lookups`` (calls of ``get_num_new_matched_tokens``), ``lookup_tokens``
(tokens offered to vLLM, summed) and ``lookup_us`` (host time in those
lookups, microseconds); worker side, ``loads`` (requests loaded),
``tokens_loaded`` (tokens whose KV was loaded in every layer),
``load_error_blocks`` (blocks reported to vLLM to recompute),
``objects_saved`` (store objects put), the host time of the load and save
calls (``load_start_us``, ``load_wait_us``, ``save_issue_us``,
``save_wait_us``: ``worker.WORKER_COUNTERS``) and ``staged_bytes`` (bytes
copied between vLLM's KV tensors and the shared-memory staging buffer,
both ways; 0 when the tensors are registered directly)."""


class TuttiConnector(KVConnectorBase_V1):  # type: ignore[misc,valid-type]
    """tutti's KV connector: vLLM's KV blocks saved to and loaded from NVMe.

    ``vllm_config``: vLLM's ``VllmConfig`` (read: ``kv_transfer_config.
    kv_connector_extra_config``, ``cache_config.block_size``,
    ``model_config.model``, ``parallel_config``: tensor-parallel size, and
    the worker's rank when vLLM's process groups are not up); ``role``:
    ``KVConnectorRole.SCHEDULER`` or ``WORKER``; ``kv_cache_config``: vLLM's
    ``KVCacheConfig`` (its ``num_blocks`` is read when present).

    The scheduler and the workers may live in different processes (vLLM's
    multiprocess executor): each worker is the one writer of its rank's
    store, the scheduler reads the stores from the drives (state.py,
    reader.py), so the drives must be reachable from both (file-backed
    emulated drives or ``daemon`` drives of one ``tuttid``, not RAM drives;
    on daemon drives the worker stages its blocks through shared memory,
    ``staging_bytes``). Tensor-parallel
    ranks write their own stores (``store`` containing ``{rank}``) under
    rank-qualified keys; pipeline-parallel size 1 only. Models whose
    attention layers share one KV cache shape. Raises
    ``tutti.engine.UnsupportedModel`` (a ``ValueError``) for models it
    cannot restore exactly (sliding windows shorter than ``max_model_len``,
    MLA, hybrid models; attention.py), before opening anything;
    ``ValueError`` for pipeline parallelism or a tensor-parallel store name
    without ``{rank}``; ``StoreBusy`` (locks.py) when another process
    writes the worker's store.
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        par = getattr(vllm_config, "parallel_config", None)
        pp = int(getattr(par, "pipeline_parallel_size", 1) or 1)
        if pp != 1:
            raise ValueError(f"TuttiConnector supports pipeline_parallel_size 1 only (got {pp})")
        self._world = int(getattr(par, "tensor_parallel_size", 1) or 1)
        check_vllm_model(vllm_config, kv_cache_config)
        model = getattr(getattr(vllm_config, "model_config", None), "model", None) or "unknown-model"
        self.tutti_config = c = TuttiVllmConfig.from_extra_config(
            extra, block_size=int(vllm_config.cache_config.block_size), model=str(model)
        )
        if self._world > 1 and "{rank}" not in c.store:
            raise ValueError(
                f"tensor_parallel_size {self._world}: each rank writes its own store, so the store name must "
                f"contain {{rank}} (got {c.store!r}; e.g. \"kv{{rank}}\" with stores kv0..kv{self._world - 1})"
            )
        self._num_blocks: Optional[int] = getattr(kv_cache_config, "num_blocks", None)
        self._is_scheduler = _role_name(role) == "SCHEDULER"
        self._rank = 0 if self._is_scheduler else tp_rank(vllm_config)
        self._shared: Optional[state.SharedRuntime] = state.acquire(c)
        self._writer: Optional[state.Writer] = None
        self.counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._lookup_ns = 0
        self._dumped: Optional[Dict[str, int]] = None
        self._warned = False
        self._scheduler: Optional[SchedulerLogic] = None
        self._worker: Optional[WorkerLogic] = None
        try:
            if self._is_scheduler:
                self._scheduler = SchedulerLogic(self._lookup, c.chunk_tokens, c.block_size, save_decode_tokens=c.save_decode_tokens)
            else:
                self._writer = self._shared.open_writer(c.store_name(self._rank))
        except BaseException:
            state.release(self._shared)
            self._shared = None
            raise

    # Properties and class methods --------------------------------------------

    @property
    def requires_kv_delivery(self) -> bool:
        """False: tutti is a best-effort cache; a dropped save is a later miss."""
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        """True: ``wait_for_layer_load`` and ``save_kv_layer`` run per layer
        and must not be captured into a full CUDA graph."""
        return True

    # Worker side ---------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """Register the KV cache storage with tutti, once: one tensor per
        layer name (``VllmPagedKV`` reads their form and memory order);
        layer ``l`` of the keys is the ``l``-th name in ``layer_order``.
        Then put the manifest (reader.py) through which a scheduler in
        another process finds this worker's keys. On drives that reach only
        shared memory (``daemon`` drives) the tensors are not registered:
        blocks are copied through a shared-memory staging buffer
        (``staging_bytes``, ``tutti.engine.StagingStore``)."""
        if self._worker is not None or self._writer is None:
            raise RuntimeError("register_kv_caches called twice, or on the scheduler-side connector")
        names = layer_order(kv_caches)
        c = self.tutti_config
        layout = VllmPagedKV([kv_caches[n] for n in names], c.block_size, c.chunk_tokens, num_blocks=self._num_blocks)
        model = f"{namespace_model(c.model, names)}|tp={self._rank}/{self._world}"
        client = KvCacheClient(self._writer.store, layout, model, timeout=c.timeout_s, staging_bytes=c.staging_bytes)
        self._writer.client = client
        self._worker = WorkerLogic(client, names, timeout=c.timeout_s)
        key = manifest_key(c.model, self._rank, self._world, c.chunk_tokens, c.block_size, client.keys.key_size)
        put_manifest(self._writer.store, key, client.keys, c.timeout_s)
        log.info(
            "tutti: rank %d registered %d layers (%s), %d B objects, store %s%s", self._rank, len(names), layout.name,
            layout.segment_bytes, c.store_name(self._rank),
            f", staged through {client.staging.nbytes} B of shared memory" if client.staging is not None else "",
        )

    def stats(self) -> Dict[str, int]:
        """This instance's counters (``COUNTERS``), updated as it runs."""
        if self._worker is not None:
            for k, v in self._worker.counters.items():
                self.counters[k] = v
            staging = self._worker.client.staging
            if staging is not None:
                self.counters["staged_bytes"] = int(staging.copied_bytes)
        return dict(self.counters)

    def _dump_stats(self, force: bool = False) -> None:
        """Write ``stats()`` to the ``stats_file`` (when configured) if a
        counter other than the host times (``*_us``, which move on every
        step) changed, or with ``force`` (at shutdown)."""
        path = self.tutti_config.stats_file
        if path is None:
            return
        st = self.stats()
        events = {k: v for k, v in st.items() if not k.endswith("_us")}
        if events == self._dumped and not force:
            return
        self._dumped = events
        role = "scheduler" if self._is_scheduler else "worker"
        tmp = f"{path}.{role}{self._rank}.json.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(st, f)
        os.replace(tmp, f"{path}.{role}{self._rank}.json")

    def _meta(self) -> Optional[TuttiConnectorMetadata]:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        if not isinstance(meta, TuttiConnectorMetadata):
            raise TypeError(f"expected TuttiConnectorMetadata, got {type(meta).__name__}")
        return meta

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Begin this step: look up each load and issue layer 0's reads."""
        meta = self._meta()
        if self._worker is not None and meta is not None:
            self._worker.start_load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Issue the next layer's reads; wait for ``layer_name``'s."""
        if self._worker is not None:
            self._worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """Put ``layer_name``'s objects of the chunks this step completes.
        ``kv_layer`` is the registered cache of that layer (not read here:
        the registered storage is)."""
        meta = self._meta()
        if self._worker is None or meta is None:
            return
        if self._worker.step_meta is not meta:
            self._worker.begin_step(meta)
        self._worker.save_layer(layer_name)

    def wait_for_save(self) -> None:
        """Wait for this step's puts (and finalise its loads)."""
        if self._worker is not None:
            self._worker.wait_for_save()
            self._dump_stats()

    def get_finished(self, finished_req_ids: Set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Loads and saves complete within their step: nothing finishes
        asynchronously, ``(None, None)``."""
        if self._worker is not None:
            self._worker.finish_loads()
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Block ids of chunks that failed to load (and every later chunk
        of the same request) since the last call; vLLM recomputes them."""
        if self._worker is None:
            return set()
        return self._worker.load_errors()

    def shutdown(self) -> None:
        """Close this instance's store (the worker's) and release the shared
        runtime (the last user shuts it down)."""
        if self._shared is None:
            return
        log.info("tutti: %s rank %d stats %s", "scheduler" if self._is_scheduler else "worker", self._rank, self.stats())
        self._dump_stats(force=True)
        if self._worker is not None:
            self._worker.finish_loads()
            self._worker = None
        if self._writer is not None:
            self._shared.close_writer(self.tutti_config.store_name(self._rank))
            self._writer = None
        state.release(self._shared)
        self._shared = None

    # Scheduler side ------------------------------------------------------------

    def _lookup(self, tokens: Any) -> int:
        """The tokens every rank's store holds (the shortest of them): one
        rank's shard without the others' cannot be used."""
        t = time.perf_counter_ns()
        try:
            return self._lookup_ranks(tokens)
        finally:
            self._lookup_ns += time.perf_counter_ns() - t
            self.counters["lookup_us"] = self._lookup_ns // 1000

    def _lookup_ranks(self, tokens: Any) -> int:
        if self._shared is None:
            return 0
        c = self.tutti_config
        if c.runtime_config is None and c.runtime_yaml is None and not self._shared.writers:
            if not self._warned:
                log.warning(
                    "tutti: the worker is in another process and the drives are emulated RAM drives, private to each "
                    "process: lookups find nothing (use file-backed or daemon drives, docs/vllm.md)"
                )
                self._warned = True
            return 0
        found: Optional[int] = None
        for r in range(self._world):
            reader = self._shared.reader(c.store_name(r), c.lookup_refresh_s)
            n = reader.lookup(tokens, functools.partial(manifest_key, c.model, r, self._world, c.chunk_tokens, c.block_size))
            found = n if found is None else min(found, n)
            if not found:
                break
        self.counters["lookups"] += 1
        return int(found or 0)

    def _sched(self) -> SchedulerLogic:
        if self._scheduler is None:
            raise RuntimeError("a scheduler-side method called on the worker-side connector")
        return self._scheduler

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens beyond vLLM's local hit that tutti holds (whole chunks,
        leaving the last prompt token to compute); loads are synchronous."""
        ext, is_async = self._sched().get_num_new_matched_tokens(request, num_computed_tokens)
        self.counters["lookup_tokens"] += int(ext or 0)
        return ext, is_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Record the request and its load of ``num_external_tokens`` tokens."""
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """This step's loads and saves, a ``TuttiConnectorMetadata``."""
        meta = self._sched().build_connector_meta(scheduler_output)
        self._dump_stats()
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        """vLLM's ``KVConnectorOutput`` of the workers: the blocks whose load
        failed (``invalid_block_ids``) are saved again once vLLM has
        recomputed them (``SchedulerLogic.note_load_errors``)."""
        if self._scheduler is not None:
            self._scheduler.note_load_errors(getattr(connector_output, "invalid_block_ids", None))

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; blocks may be freed now: ``(False, None)``."""
        return self._sched().request_finished(request, block_ids)
