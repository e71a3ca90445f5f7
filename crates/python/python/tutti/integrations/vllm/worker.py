"""Worker-side logic of the connector, pure (no vLLM): the KV cache
registered with tutti once, per-layer loads that overlap compute, per-layer
saves, and the block ids of chunks that failed to load.

Per step (vLLM's forward pass)::

    start_load(meta)            # lookups; layer 0's reads issued
    for l, name in enumerate(layers):
        wait_layer(name)        # issues layer l + 1's reads, waits for l's
        ... attention of layer l ...
        save_layer(name)        # puts layer l's objects of the saved chunks
    wait_for_save()             # every put done; loads finalised
    load_errors()               # blocks vLLM must recompute

Failure handling: a chunk of a load that failed in any layer (miss,
checksum mismatch, device error, timeout, or gone from the store since the
scheduler's lookup) makes every block from that chunk to the end of the
load a load error; vLLM recomputes those tokens. Blocks before it hold
KV that loaded in every layer.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set

from tutti.engine import KvCacheClient, LayerLoad, LayerSave, SaveResult
from tutti.integrations.vllm.layout import SCRATCH, VllmPagedKV
from tutti.integrations.vllm.metadata import LoadSpec, TuttiConnectorMetadata

log = logging.getLogger("tutti.vllm")


class _SpanLoad(LayerLoad):
    """A ``LayerLoad`` that reads only chunks ``[first_chunk, found)`` and,
    in them, no block marked ``SCRATCH`` in the placement: those are vLLM's
    own (its prefix cache) and are neither read nor written. A chunk counts
    as loaded when every item read for it was a hit."""

    def __init__(self, client: KvCacheClient, tokens: Sequence[int], placement: Sequence[int], first_chunk: int, max_chunks: int) -> None:
        super().__init__(client, tokens, placement, max_chunks)
        self.first_chunk = min(first_chunk, self.found_chunks)

    def start_layer(self, layer: int) -> None:
        if self._batches[layer] is not None:
            raise RuntimeError(f"layer {layer} already started")
        groups = self.client._items(self._cks, layer, range(self.first_chunk, self.found_chunks), self.placement)
        # Items of SCRATCH blocks (vLLM's own blocks) are not read at all.
        skip = self.client.layout.scratch_index
        self._batches[layer] = [(self.client.store.get(items), tags) for t, (items, tags) in groups.items() if t != skip]


@dataclass
class _ActiveLoad:
    spec: LoadSpec
    load: _SpanLoad
    started: Set[int]


WORKER_COUNTERS = ("loads", "tokens_loaded", "load_error_blocks", "objects_saved",
                   "load_start_us", "load_wait_us", "save_issue_us", "save_wait_us")
"""The worker side's counters; the ``_us`` ones are host time spent in
``start_load`` (vLLM's ``start_load_kv``), ``wait_layer``
(``wait_for_layer_load``), ``save_layer`` (``save_kv_layer``) and
``wait_for_save``, microseconds."""


class WorkerLogic:
    """The worker side over one ``KvCacheClient``.

    ``client``: a client whose layout is a ``VllmPagedKV`` over the layers
    named ``layer_names`` (in that order); ``timeout``: seconds per layer
    wait and per step's saves.
    """

    def __init__(self, client: KvCacheClient, layer_names: Sequence[str], *, timeout: Optional[float] = None) -> None:
        if not isinstance(client.layout, VllmPagedKV):
            raise TypeError("the client's layout must be a VllmPagedKV")
        if len(layer_names) != client.layout.num_layers:
            raise ValueError(f"{len(layer_names)} layer names for {client.layout.num_layers} layers")
        self.client = client
        self.layout: VllmPagedKV = client.layout
        self.layer_index: Dict[str, int] = {n: i for i, n in enumerate(layer_names)}
        self.timeout = client.timeout if timeout is None else timeout
        self._loads: List[_ActiveLoad] = []
        self._saves: List[LayerSave] = []
        self._save_specs: List[Any] = []
        self._saved_layers: Set[int] = set()
        self._errors: Set[int] = set()
        self.last_save_results: List[SaveResult] = []
        self.step_meta: Optional[TuttiConnectorMetadata] = None
        self.counters: Dict[str, int] = dict.fromkeys(WORKER_COUNTERS, 0)
        """Requests loaded, tokens loaded in every layer, blocks reported
        as load errors, objects put by saves, and the host time of the
        connector's calls in microseconds (cumulative; ``WORKER_COUNTERS``)."""
        self._ns: Dict[str, int] = {}

    @contextmanager
    def _timed(self, counter: str) -> Iterator[None]:
        """Adds the block's wall time to ``counter`` (microseconds, from a
        nanosecond sum, so that short calls are not rounded away)."""
        t = time.perf_counter_ns()
        try:
            yield
        finally:
            self._ns[counter] = self._ns.get(counter, 0) + time.perf_counter_ns() - t
            self.counters[counter] = self._ns[counter] // 1000

    # Loads -------------------------------------------------------------------

    def begin_step(self, meta: TuttiConnectorMetadata) -> None:
        """Take this step's saves (``start_load`` does it too)."""
        self.step_meta = meta
        self._saves, self._saved_layers, self._save_specs = [], set(), list(meta.saves)

    def start_load(self, meta: TuttiConnectorMetadata) -> None:
        """Begin the step: look up each load's chunks and issue layer 0's
        reads. Blocks of vLLM's local tokens are never written (``SCRATCH``
        in the table).

        vLLM calls ``start_load_kv`` before the forward pass only in steps
        with synchronous loads; in other steps it calls it after the
        forward, when this step's saves are already in flight: those are
        kept (``begin_step`` only for a new step). Loads of a step whose
        layers already ran would come too late: they are reported as load
        errors (vLLM does not do this)."""
        with self._timed("load_start_us"):
            self._start_load(meta)

    def _start_load(self, meta: TuttiConnectorMetadata) -> None:
        if self.step_meta is meta:
            if meta.loads:
                log.warning("tutti: loads bound after the forward pass; recomputing them")
                for spec in meta.loads:
                    self._fail(spec, spec.local_tokens)
            return
        self.begin_step(meta)
        ct, bs = self.layout.chunk_tokens, self.layout.block_size
        for spec in meta.loads:
            placement = list(spec.block_ids)
            first_chunk = spec.local_tokens // ct
            for j in range(first_chunk * (ct // bs), spec.local_tokens // bs):
                placement[j] = SCRATCH
            try:
                ld = _SpanLoad(self.client, spec.token_ids[: spec.end_tokens], placement, first_chunk, spec.end_tokens // ct)
            except Exception as e:  # a bad table, a store error: recompute all of it
                log.warning("tutti: load of request %s not started (%s); recomputing", spec.req_id, e)
                self._fail(spec, spec.local_tokens)
                continue
            act = _ActiveLoad(spec, ld, set())
            self._loads.append(act)
            self._start(act, 0)

    def _start(self, act: _ActiveLoad, layer: int) -> None:
        if layer < self.layout.num_layers and layer not in act.started:
            act.started.add(layer)
            act.load.start_layer(layer)

    def wait_layer(self, layer_name: str) -> None:
        """Issue the next layer's reads, then wait for this layer's (so that
        layer ``l + 1`` loads while layer ``l`` computes). Unknown layer
        names (layers without a registered KV cache) are ignored."""
        with self._timed("load_wait_us"):
            self._wait_layer(layer_name)

    def _wait_layer(self, layer_name: str) -> None:
        layer = self.layer_index.get(layer_name)
        if layer is None or not self._loads:
            return
        for act in self._loads:
            self._start(act, layer + 1)
            self._start(act, layer)
            act.load.wait_layer(layer, self.timeout)
        if layer == self.layout.num_layers - 1:
            self.finish_loads()

    def finish_loads(self) -> None:
        """Wait for every layer not waited on yet and record the blocks of
        failed chunks (see the module docstring)."""
        ct = self.layout.chunk_tokens
        for act in self._loads:
            for layer in range(self.layout.num_layers):
                self._start(act, layer)
            res = act.load.result()
            spec = act.spec
            good = min(res.cached_chunks * ct, spec.end_tokens)
            if res.cached_chunks < act.load.first_chunk or good < spec.local_tokens:
                good = spec.local_tokens
            self.counters["loads"] += 1
            self.counters["tokens_loaded"] += good - spec.local_tokens
            if good < spec.end_tokens:
                log.warning(
                    "tutti: request %s loaded %d of tokens [%d, %d): %s; recomputing the rest",
                    spec.req_id, good - spec.local_tokens, spec.local_tokens, spec.end_tokens,
                    [(f.chunk, f.layer, f.kind) for f in res.failures][:4] or "chunks gone from the store",
                )
                self._fail(spec, good)
        self._loads = []

    def _fail(self, spec: LoadSpec, good_tokens: int) -> None:
        bs = self.layout.block_size
        failed = spec.block_ids[good_tokens // bs : spec.end_tokens // bs]
        self.counters["load_error_blocks"] += len(failed)
        self._errors.update(int(b) for b in failed)

    def load_errors(self) -> Set[int]:
        """Block ids whose load failed since the last call (then cleared)."""
        self.finish_loads()
        out, self._errors = self._errors, set()
        return out

    # Saves -------------------------------------------------------------------

    def save_layer(self, layer_name: str) -> None:
        """Put layer ``layer_name``'s objects of this step's saved chunks
        (objects already in the store are skipped)."""
        with self._timed("save_issue_us"):
            self._save_layer(layer_name)

    def _save_layer(self, layer_name: str) -> None:
        layer = self.layer_index.get(layer_name)
        if layer is None or not self._save_specs or layer in self._saved_layers:
            return
        if not self._saves:
            for spec in self._save_specs:
                n = len(spec.token_ids) // self.layout.chunk_tokens
                self._saves.append(self.client.start_save(spec.token_ids, spec.block_ids, max_chunks=n, skip_chunks=spec.first_chunk))
        self._saved_layers.add(layer)
        for s in self._saves:
            s.save_layer(layer)

    def wait_for_save(self) -> List[SaveResult]:
        """Finish this step's puts (and any load not finalised yet); return
        the save results (also in ``last_save_results``)."""
        with self._timed("save_wait_us"):
            return self._wait_for_save()

    def _wait_for_save(self) -> List[SaveResult]:
        self.finish_loads()
        results = [s.wait(self.timeout) for s in self._saves]
        for spec, r in zip(self._save_specs, results):
            self.counters["objects_saved"] += r.put_objects
            if r.failures:
                log.warning("tutti: request %s saved %d chunks; failures: %s", spec.req_id, r.stored_chunks, [(f.chunk, f.layer, f.kind) for f in r.failures][:4])
        self._saves, self._save_specs, self._saved_layers = [], [], set()
        self.step_meta = None
        self.last_save_results = results
        return results
