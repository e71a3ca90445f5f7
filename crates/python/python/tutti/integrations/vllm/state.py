"""One tutti runtime and store per process, shared by the connector's
scheduler-side and worker-side instances.

vLLM creates the connector twice: with role SCHEDULER (in the engine-core
process) and with role WORKER (in each worker). With one GPU, vLLM's
uniprocess executor runs the worker in the engine-core process, so both
instances live in one process: they share the runtime (a tutti runtime owns
its drives; two runtimes must not open the same drives at once) and the
scheduler's lookups use the worker's ``KvCacheClient`` (its key namespace
depends on the KV cache layout, which only the worker sees).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Tuple

from tutti.integrations.vllm.config import TuttiVllmConfig


class SharedStore:
    """A runtime, its ``KvStore``, and the worker's client once registered.

    ``client``: set by the worker's ``register_kv_caches``; None before.
    """

    def __init__(self, cfg: TuttiVllmConfig) -> None:
        import tutti

        self.key = (cfg.runtime_key, cfg.store)
        self.runtime = cfg.open_runtime()
        try:
            self.store = tutti.KvStore.open(self.runtime, cfg.store)
        except Exception:
            self.runtime.shutdown()
            raise
        self.client: Optional[Any] = None
        self.users = 0

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        self.store = None
        self.runtime.shutdown()


_lock = threading.Lock()
_shared: Dict[Tuple[Any, ...], SharedStore] = {}


def acquire(cfg: TuttiVllmConfig) -> SharedStore:
    """The process's shared store for ``cfg`` (opened on first use)."""
    key = (cfg.runtime_key, cfg.store)
    with _lock:
        s = _shared.get(key)
        if s is None:
            s = _shared[key] = SharedStore(cfg)
        s.users += 1
        return s


def release(s: SharedStore) -> None:
    """Drop one user; the last one closes the client and shuts the runtime down."""
    with _lock:
        s.users -= 1
        if s.users > 0:
            return
        if _shared.get(s.key) is s:
            del _shared[s.key]
    s.close()
