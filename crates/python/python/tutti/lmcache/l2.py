"""LMCache L2 adapter over tutti-kv (``tutti.KvStore``): LMCache's
persistent tier on tutti (docs/lmcache.md).

LMCache's distributed storage manager keeps an L1 (pinned DRAM) and hands
objects to L2 adapters for persistence and sharing. Its ``plugin`` adapter
type loads a class from a module named in the configuration, so this needs
no shim::

    {"type": "plugin", "module_path": "tutti.lmcache.l2", "class_name": "TuttiL2Adapter",
     "adapter_params": {"store": "kv", "timeout_s": 30}}

(``TuttiL2AdapterConfig`` is found by LMCache's naming convention.) Unlike
the GDS L1 slab, which LMCache clears at every start, what this adapter
stores survives a restart and a crash: tutti-kv is crash-consistent and
checksums every object (docs/kv-store.md).

Keys: an ``ObjectKey`` becomes a tutti-kv key of the store's key size
(16 or 32 bytes): BLAKE2b of its fields, tagged and length-prefixed.
Objects: the memory objects' tensors (host memory, LMCache's L1) are
registered with the store for the duration of a task. Tasks run in order
on one worker thread; each signals its event fd when done.

Failure semantics (LMCache's): a store task succeeds only if every object
was stored (``L2StoreResult``); lookups and loads report per key in a
``Bitmap``: a miss, a checksum mismatch, a drive error or a timeout clears
the key's bit. Locks are counted but do not pin objects: tutti-kv evicts
only when a put finds the store full.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from typing import Any, Callable, Dict, List, Optional

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.platform import create_event_notifier

import torch

import tutti
from tutti.lmcache import get_runtime

__all__ = ["TuttiL2Adapter", "TuttiL2AdapterConfig", "object_key_bytes"]


class TuttiL2AdapterConfig(L2AdapterConfigBase):
    """``adapter_params``: ``store`` (runtime store name, default "kv"),
    ``timeout_s`` (seconds one batch may take, default 30),
    ``max_capacity_bytes`` (0: LMCache does no global eviction; tutti-kv
    evicts its least recently used objects when full)."""

    def __init__(self, store: str = "kv", timeout_s: float = 30.0, max_capacity_bytes: int = 0) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.max_capacity_bytes = max_capacity_bytes

    @classmethod
    def from_dict(cls, d: dict) -> "TuttiL2AdapterConfig":
        store = d.get("store", "kv")
        timeout_s = d.get("timeout_s", 30.0)
        cap = d.get("max_capacity_bytes", 0)
        if not isinstance(store, str) or not store:
            raise tutti.ConfigError(f"tutti L2 adapter: store must be a non-empty string, got {store!r}")
        if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise tutti.ConfigError(f"tutti L2 adapter: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not isinstance(cap, int) or cap < 0:
            raise tutti.ConfigError(f"tutti L2 adapter: max_capacity_bytes must be an int >= 0, got {cap!r}")
        return cls(store, float(timeout_s), cap)

    @classmethod
    def help(cls) -> str:
        return ("tutti L2 adapter (tutti-kv) adapter_params:\n- store (str): runtime store name (default kv)\n"
                "- timeout_s (float): seconds one batch may take (default 30)\n"
                "- max_capacity_bytes (int): 0 = no global eviction by LMCache (default)")


def object_key_bytes(key: Any, key_size: int) -> bytes:
    """The tutti-kv key of an LMCache ``ObjectKey``: BLAKE2b (``key_size``
    bytes) over its fields, each tagged and length-prefixed."""
    h = hashlib.blake2b(digest_size=key_size, person=b"tutti-lmcache1")
    chunk = key.chunk_hash if isinstance(key.chunk_hash, bytes) else bytes(key.chunk_hash)
    for field in (chunk, key.model_name.encode(), str(key.kv_rank).encode(),
                  str(key.object_group_id).encode(), key.cache_salt.encode()):
        h.update(len(field).to_bytes(4, "little"))
        h.update(field)
    return h.digest()


class TuttiL2Adapter(L2AdapterInterface):
    """LMCache ``L2AdapterInterface`` over a ``tutti.KvStore`` of the
    process's runtime (``tutti.lmcache.set_runtime`` or ``$TUTTI_CONFIG``)."""

    def __init__(self, config: Any, l1_memory_desc: Any = None, kv: Optional[tutti.KvStore] = None) -> None:
        if isinstance(config, dict):
            config = TuttiL2AdapterConfig.from_dict(config)
        super().__init__(max_capacity_bytes=config.max_capacity_bytes)
        self._config = config
        self._kv = kv if kv is not None else tutti.KvStore.open(get_runtime(), store=config.store)
        info = self._kv.runtime.store_info(config.store)
        self._block = int(info["block_size"]) if info else 4096
        self._efd = {name: create_event_notifier() for name in ("store", "lookup", "load")}
        self._lock = threading.Lock()
        self._next_id = 0
        self._stores: Dict[L2TaskId, L2StoreResult] = {}
        self._lookups: Dict[L2TaskId, Bitmap] = {}
        self._loads: Dict[L2TaskId, Bitmap] = {}
        self._locks: Dict[bytes, int] = {}
        self._sizes: Dict[bytes, int] = {}  # tutti-kv key -> bytes stored, for LMCache's accounting
        self._work: "queue.SimpleQueue[Optional[Callable[[], None]]]" = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._run, name="tutti-l2", daemon=True)
        self._worker.start()

    # Event fds: one per kind of task, distinct as LMCache requires.
    def get_store_event_fd(self) -> int:
        return self._efd["store"].fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._efd["lookup"].fileno()

    def get_load_event_fd(self) -> int:
        return self._efd["load"].fileno()

    def _task(self, fn: Callable[[L2TaskId], None]) -> L2TaskId:
        with self._lock:
            task_id = self._next_id
            self._next_id += 1
        self._work.put(lambda: fn(task_id))
        return task_id

    def _run(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            job()

    def _key(self, key: Any) -> bytes:
        return object_key_bytes(key, self._kv.key_size)

    def _batch(self, keys: List[Any], objects: List[Any], put: bool) -> List[Optional[tutti.ItemStatus]]:
        """Put or get ``objects`` under ``keys``: one status per key (None
        where the object has no host tensor or could not be registered).
        tutti-kv moves whole logical blocks: an object whose size is not a
        multiple of the block size goes through a padded copy, so a get
        never writes past it into its neighbours in LMCache's L1."""
        regs: List[Any] = []
        items, index, copies = [], [], []
        block = self._block
        try:
            for i, (k, o) in enumerate(zip(keys, objects)):
                t = getattr(o, "tensor", None)
                if t is None:
                    continue
                flat = t.reshape(-1).view(torch.uint8)
                n = flat.numel()
                if n % block:
                    pad = torch.empty(-(-n // block) * block, dtype=torch.uint8)
                    if put:
                        pad[:n].copy_(flat)
                    copies.append((i, flat, pad))
                    flat = pad
                try:
                    m = self._kv.register(flat)
                except tutti.TuttiError:
                    continue
                regs.append(m)
                items.append((self._key(k), m, 0, n if put else m.nbytes))
                index.append(i)
            out: List[Optional[tutti.ItemStatus]] = [None] * len(keys)
            if items:
                batch = self._kv.put(items) if put else self._kv.get(items)
                for i, st in zip(index, batch.wait(timeout=self._config.timeout_s)):
                    out[i] = st
            for i, flat, pad in copies:
                st = out[i]
                if not put and st is not None and st.kind == "hit":
                    flat.copy_(pad[: flat.numel()])
            return out
        finally:
            for m in regs:
                try:
                    self._kv.unregister(m)
                except tutti.TuttiError:
                    pass  # still busy after a timeout: the binding unregisters it later

    def submit_store_task(self, keys: List[Any], objects: List[Any]) -> L2TaskId:
        def run(task_id: L2TaskId) -> None:
            ok, stored, sizes = len(keys) == len(objects), [], []
            try:
                for k, o, st in zip(keys, objects, self._batch(keys, objects, True)):
                    if st is not None and st.ok:
                        stored.append(k)
                        sizes.append(o.get_size())
                        with self._lock:
                            self._sizes[self._key(k)] = o.get_size()
                    else:
                        ok = False
            except Exception:  # a task reports; it never raises into the worker
                ok = False
            with self._lock:
                self._stores[task_id] = L2StoreResult(ok, sum(sizes))
            if stored:
                self._notify_keys_stored(stored, sizes)
            self._efd["store"].notify()

        return self._task(run)

    def pop_completed_store_tasks(self) -> Dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._stores = self._stores, {}
        return done

    def submit_lookup_and_lock_task(self, keys: List[Any], group_layout_descs: Any = None) -> L2TaskId:
        def run(task_id: L2TaskId) -> None:
            bitmap = Bitmap(len(keys))
            try:
                tk = [self._key(k) for k in keys]
                for i, (k, there) in enumerate(zip(tk, self._kv.contains(tk))):
                    if there:
                        bitmap.set(i)
                        with self._lock:
                            self._locks[k] = self._locks.get(k, 0) + 1
            except Exception:  # no bits set: every key counts as a miss
                pass
            with self._lock:
                self._lookups[task_id] = bitmap
            self._efd["lookup"].notify()

        return self._task(run)

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Optional[Bitmap]:
        with self._lock:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: List[Any]) -> None:
        with self._lock:
            for k in keys:
                tk = self._key(k)
                n = self._locks.get(tk, 0)
                if n <= 1:
                    self._locks.pop(tk, None)
                else:
                    self._locks[tk] = n - 1

    def submit_load_task(self, keys: List[Any], objects: List[Any]) -> L2TaskId:
        def run(task_id: L2TaskId) -> None:
            bitmap, hit = Bitmap(len(keys)), []
            try:
                for i, st in enumerate(self._batch(keys, objects, False)):
                    if st is not None and st.kind == "hit":
                        bitmap.set(i)
                        hit.append(keys[i])
            except Exception:  # the bits set so far stand; the rest are misses
                pass
            if hit:
                self._notify_keys_accessed(hit)
            with self._lock:
                self._loads[task_id] = bitmap
            self._efd["load"].notify()

        return self._task(run)

    def query_load_result(self, task_id: L2TaskId) -> Optional[Bitmap]:
        with self._lock:
            return self._loads.pop(task_id, None)

    def delete(self, keys: List[Any]) -> None:
        """Remove objects (durable after the store's next sync)."""
        tk = [self._key(k) for k in keys]
        gone, sizes = [], []
        for k, t, st in zip(keys, tk, self._kv.remove(tk)):
            if st.ok:
                with self._lock:
                    size = self._sizes.pop(t, None)
                if size is not None:
                    gone.append(k)
                    sizes.append(size)
        if gone:
            self._notify_keys_deleted(gone, sizes)

    def report_status(self) -> Dict[str, Any]:
        stats = self._kv.stats()
        return {"is_healthy": self._worker.is_alive(), "type": "TuttiL2Adapter", "store": self._config.store,
                "objects": stats.get("objects"), "locked_keys": len(self._locks)}

    def close(self) -> None:
        """Finish queued tasks, stop the worker, close the event fds."""
        self._work.put(None)
        self._worker.join(timeout=self._config.timeout_s * 2)
        for e in self._efd.values():
            e.close()
