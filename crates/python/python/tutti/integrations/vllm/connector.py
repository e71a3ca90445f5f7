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

import hashlib
import logging
import re
from typing import Any, Dict, List, Optional, Set

from tutti.engine import KvCacheClient
from tutti.integrations.vllm import state
from tutti.integrations.vllm._compat import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole
from tutti.integrations.vllm.attention import check_vllm_model
from tutti.integrations.vllm.config import TuttiVllmConfig
from tutti.integrations.vllm.layout import VllmPagedKV
from tutti.integrations.vllm.metadata import TuttiConnectorMetadata
from tutti.integrations.vllm.scheduler import SchedulerLogic
from tutti.integrations.vllm.worker import WorkerLogic

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


class TuttiConnector(KVConnectorBase_V1):  # type: ignore[misc,valid-type]
    """tutti's KV connector: vLLM's KV blocks saved to and loaded from NVMe.

    ``vllm_config``: vLLM's ``VllmConfig`` (read: ``kv_transfer_config.
    kv_connector_extra_config``, ``cache_config.block_size``,
    ``model_config.model``, ``parallel_config``); ``role``:
    ``KVConnectorRole.SCHEDULER`` or ``WORKER``; ``kv_cache_config``: vLLM's
    ``KVCacheConfig`` (its ``num_blocks`` is read when present).

    Supports one tensor-parallel and pipeline-parallel rank (the scheduler
    and the worker in one process, see state.py) and models whose
    attention layers share one KV cache shape. Raises
    ``tutti.engine.UnsupportedModel`` (a ``ValueError``) for models it
    cannot restore exactly (sliding windows shorter than ``max_model_len``,
    MLA, hybrid models; attention.py), before opening anything.
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        par = getattr(vllm_config, "parallel_config", None)
        for what in ("tensor_parallel_size", "pipeline_parallel_size"):
            n = int(getattr(par, what, 1) or 1)
            if n != 1:
                raise ValueError(f"TuttiConnector supports {what} 1 only (got {n})")
        check_vllm_model(vllm_config, kv_cache_config)
        model = getattr(getattr(vllm_config, "model_config", None), "model", None) or "unknown-model"
        self.tutti_config = TuttiVllmConfig.from_extra_config(
            extra, block_size=int(vllm_config.cache_config.block_size), model=str(model)
        )
        self._num_blocks: Optional[int] = getattr(kv_cache_config, "num_blocks", None)
        self._shared: Optional[state.SharedStore] = state.acquire(self.tutti_config)
        self._is_scheduler = _role_name(role) == "SCHEDULER"
        self._warned = False
        self._scheduler: Optional[SchedulerLogic] = None
        self._worker: Optional[WorkerLogic] = None
        if self._is_scheduler:
            c = self.tutti_config
            self._scheduler = SchedulerLogic(self._lookup, c.chunk_tokens, c.block_size, save_decode_tokens=c.save_decode_tokens)

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
        layer ``l`` of the keys is the ``l``-th name in ``layer_order``."""
        if self._worker is not None:
            raise RuntimeError("register_kv_caches called twice")
        assert self._shared is not None
        if self._shared.client is not None:
            raise RuntimeError("another TuttiConnector of this process already registered its KV caches")
        names = layer_order(kv_caches)
        c = self.tutti_config
        layout = VllmPagedKV([kv_caches[n] for n in names], c.block_size, c.chunk_tokens, num_blocks=self._num_blocks)
        client = KvCacheClient(self._shared.store, layout, namespace_model(c.model, names), timeout=c.timeout_s)
        self._shared.client = client
        self._worker = WorkerLogic(client, names, timeout=c.timeout_s)
        log.info("tutti: registered %d layers (%s), %d B objects", len(names), layout.name, layout.segment_bytes)

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
        """Release the shared runtime (the last user shuts it down)."""
        if self._shared is not None:
            if self._worker is not None:
                self._worker.finish_loads()
                if self._shared.client is self._worker.client:
                    self._shared.client.close()
                    self._shared.client = None
                self._worker = None
            state.release(self._shared)
            self._shared = None

    # Scheduler side ------------------------------------------------------------

    def _lookup(self, tokens: Any) -> int:
        client = self._shared.client if self._shared is not None else None
        if client is None:
            if not self._warned:
                log.warning("tutti: no KV caches registered in this process; lookups find nothing")
                self._warned = True
            return 0
        return int(client.lookup(tokens))

    def _sched(self) -> SchedulerLogic:
        if self._scheduler is None:
            raise RuntimeError("a scheduler-side method called on the worker-side connector")
        return self._scheduler

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens beyond vLLM's local hit that tutti holds (whole chunks,
        leaving the last prompt token to compute); loads are synchronous."""
        return self._sched().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Record the request and its load of ``num_external_tokens`` tokens."""
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """This step's loads and saves, a ``TuttiConnectorMetadata``."""
        return self._sched().build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; blocks may be freed now: ``(False, None)``."""
        return self._sched().request_finished(request, block_ids)
