"""One tutti runtime per process, shared by the connector's instances, and
the two ways a connector reaches a store: as its one writer, or as a reader.

vLLM creates the connector with role SCHEDULER (in the engine-core process)
and with role WORKER (in each worker). With vLLM's uniprocess executor both
live in one process; with the multiprocess executor (vLLM's default on its
CPU backend, and with more than one worker) they do not.

- A process opens each runtime config once (a tutti runtime owns the
  drives it opens; two runtimes of one process must not open the same
  drives): ``acquire``/``release``.
- The worker of tensor-parallel rank ``r`` is the one writer of its store
  (``TuttiVllmConfig.store_name(r)``): ``SharedRuntime.open_writer`` takes
  an exclusive lock on the store's drives (``locks.py``), then opens the
  ``KvStore`` (formatting it when blank). tutti-kv keeps its index in the
  writer's memory, so a second writer would reuse the first one's slots;
  the lock refuses it (``StoreBusy``).
- The scheduler reads: in the writer's process it asks the writer's
  ``KvCacheClient``; in another process a ``StoreReader`` (reader.py) opens
  the same store read-only from the media (never formatting, never
  writing) and re-reads its records at most every ``lookup_refresh_s``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional, Tuple

from tutti.integrations.vllm.config import TuttiVllmConfig
from tutti.integrations.vllm.locks import WriterLock

log = logging.getLogger("tutti.vllm")


class Writer:
    """The writer's side of one store: the ``KvStore``, the lock that makes
    this process its only writer, and the worker's client once registered
    (``client``: None before ``register_kv_caches``)."""

    def __init__(self, store: Any, lock: WriterLock) -> None:
        self.store = store
        self.lock = lock
        self.client: Optional[Any] = None

    def close(self) -> bool:
        """Close the client (unregisters the KV tensors), drop the store,
        release the lock; True when all of that was done.

        A tensor the runtime refuses to unregister
        (``tutti.MemoryRegistrationError``: a request that timed out, or one
        never waited on, still uses it) does not raise: it is logged, the
        store is dropped, and the lock is kept (False): the caller releases
        it once the runtime has shut down (``SharedRuntime.close``), so no
        other process writes the store while this one's I/O may still land
        (process exit releases it too). Other errors are raised, the lock
        kept until the process exits."""
        import tutti

        try:
            if self.client is not None:
                self.client.close()
        except tutti.MemoryRegistrationError as e:
            log.warning("tutti: closing the store's writer: %s; the store's lock is kept until the runtime shuts down", e)
            self.client = None
            self.store = None
            return False
        self.client = None
        self.store = None
        self.lock.release()
        return True


class SharedRuntime:
    """A runtime of this process and the stores it has open on it."""

    def __init__(self, cfg: TuttiVllmConfig) -> None:
        self.key: Tuple[str, str] = cfg.runtime_key
        self.cfg = cfg
        self.runtime = cfg.open_runtime()
        self.writers: Dict[str, Writer] = {}
        self.held_locks: List[WriterLock] = []
        self.readers: Dict[str, Any] = {}
        self.users = 0
        self._lock = threading.Lock()

    def open_writer(self, store: str) -> Writer:
        """Become ``store``'s one writer: lock its drives, open it
        (formatting a blank store). Raises ``StoreBusy`` when another
        process writes it, ``tutti.KvError`` when it cannot be opened."""
        import tutti

        with self._lock:
            if store in self.writers:
                raise RuntimeError(f"store {store!r} already has a writer in this process")
            lock = WriterLock.for_store(self.cfg, store)
            reader = self.readers.get(store)
            if reader is not None:
                reader.close()  # one KvStore per runtime store in a process
            try:
                w = Writer(tutti.KvStore.open(self.runtime, store), lock)
            except BaseException:
                lock.release()
                raise
            self.writers[store] = w
            return w

    def reader(self, store: str, refresh_s: float) -> Any:
        """This process's reader of ``store`` (made on first use)."""
        from tutti.integrations.vllm.reader import StoreReader

        with self._lock:
            r = self.readers.get(store)
            if r is None:
                r = self.readers[store] = StoreReader(self, store, refresh_s)
            return r

    def close_writer(self, store: str) -> None:
        """Close ``store``'s writer of this process, if any (its lock kept
        until ``close`` when I/O may still use its memory: ``Writer.close``)."""
        with self._lock:
            w = self.writers.pop(store, None)
        if w is not None and not w.close():
            with self._lock:
                self.held_locks.append(w.lock)

    def close(self) -> None:
        """Close the readers and writers, shut the runtime down, then
        release the writer locks kept while their I/O might still land."""
        for r in list(self.readers.values()):
            r.close()
        self.readers.clear()
        for name in list(self.writers):
            self.close_writer(name)
        self.runtime.shutdown()  # raises: the kept locks stay until the process exits
        with self._lock:
            held, self.held_locks = self.held_locks, []
        for lock in held:
            lock.release()


_lock = threading.Lock()
_shared: Dict[Tuple[str, str], SharedRuntime] = {}


def acquire(cfg: TuttiVllmConfig) -> SharedRuntime:
    """The process's runtime for ``cfg`` (opened on first use)."""
    with _lock:
        s = _shared.get(cfg.runtime_key)
        if s is None:
            s = _shared[cfg.runtime_key] = SharedRuntime(cfg)
        s.users += 1
        return s


def release(s: SharedRuntime) -> None:
    """Drop one user; the last one closes its stores and shuts the runtime down."""
    with _lock:
        s.users -= 1
        if s.users > 0:
            return
        if _shared.get(s.key) is s:
            del _shared[s.key]
    s.close()
