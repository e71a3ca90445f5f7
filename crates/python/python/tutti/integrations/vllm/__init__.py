"""tutti.integrations.vllm: ``TuttiConnector``, vLLM's KV connector (v1 API)
over ``tutti.engine``; docs/vllm.md is the guide.

- ``connector.py``: ``TuttiConnector`` (the class vLLM loads through
  ``kv_connector_module_path``), a thin adapter;
- ``scheduler.py``: ``SchedulerLogic``, which tokens are cached and what to
  load and save per request (pure, no vLLM);
- ``worker.py``: ``WorkerLogic``, per-layer loads and saves and load errors
  (pure, no vLLM);
- ``layout.py``: ``VllmPagedKV``, vLLM's paged KV tensors as an engine layout;
- ``attention.py``: ``check_vllm_model``, the models the connector refuses
  when built (``tutti.engine.UnsupportedModel``);
- ``state.py``: one runtime per process; the worker as its store's one
  writer, the scheduler as a reader;
- ``reader.py``: ``StoreReader``, the scheduler's read-only view of a store
  a worker in another process writes, and the manifest of the worker's keys;
- ``locks.py``: ``WriterLock``/``StoreBusy``, one writing process per store;
- ``metadata.py``, ``config.py``, ``_compat.py`` (the optional vLLM import).

vLLM is optional: without it the classes work with duck-typed inputs.
"""

from __future__ import annotations

from tutti.engine.attention import UnsupportedModel
from tutti.integrations.vllm._compat import HAVE_VLLM, KVConnectorRole
from tutti.integrations.vllm.attention import check_vllm_model
from tutti.integrations.vllm.config import KEYS as EXTRA_CONFIG_KEYS
from tutti.integrations.vllm.config import TuttiVllmConfig
from tutti.integrations.vllm.connector import TuttiConnector
from tutti.integrations.vllm.layout import SCRATCH, VllmPagedKV, detect_form
from tutti.integrations.vllm.locks import StoreBusy
from tutti.integrations.vllm.reader import StoreReader
from tutti.integrations.vllm.metadata import LoadSpec, SaveSpec, TuttiConnectorMetadata
from tutti.integrations.vllm.scheduler import SchedulerLogic
from tutti.integrations.vllm.worker import WorkerLogic

VLLM_COMMIT = "003df2961dd8830c317a61f9745ccd557da9fa06"
"""The vLLM commit whose ``KVConnectorBase_V1`` (base.py) the interface matches."""

__all__ = [
    "EXTRA_CONFIG_KEYS",
    "HAVE_VLLM",
    "KVConnectorRole",
    "LoadSpec",
    "SCRATCH",
    "SaveSpec",
    "SchedulerLogic",
    "StoreBusy",
    "StoreReader",
    "TuttiConnector",
    "TuttiConnectorMetadata",
    "TuttiVllmConfig",
    "UnsupportedModel",
    "VLLM_COMMIT",
    "VllmPagedKV",
    "WorkerLogic",
    "check_vllm_model",
    "detect_form",
]
