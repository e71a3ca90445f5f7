"""Scheduler-side logic of the connector, pure (no vLLM, no store): which
tokens are cached, what to load and save per request, and the block ids of
each request after allocation.

Inputs are duck-typed with the attribute names of vLLM's objects:

- a request (``vllm.v1.request.Request``): ``request_id``,
  ``prompt_token_ids``, ``all_token_ids`` (prompt and output tokens),
  ``num_tokens``;
- blocks (``KVCacheBlocks``): ``get_block_ids()`` -> one list of block ids
  per KV cache group;
- the scheduler output (``SchedulerOutput``): ``scheduled_new_reqs`` (each
  with ``req_id``, ``prompt_token_ids``, ``block_ids``,
  ``num_computed_tokens``), ``scheduled_cached_reqs`` (``req_ids``,
  ``resumed_req_ids``, ``new_block_ids``, ``num_computed_tokens``),
  ``num_scheduled_tokens`` and ``finished_req_ids``.

Only KV cache group 0 is used (models with one group of full attention
layers).
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from tutti.integrations.vllm.metadata import LoadSpec, SaveSpec, TuttiConnectorMetadata


def request_tokens(request: Any) -> List[int]:
    """The request's token ids: ``all_token_ids`` (prompt and outputs) when
    it has them, else ``prompt_token_ids``."""
    toks = getattr(request, "all_token_ids", None)
    if toks is None:
        toks = getattr(request, "prompt_token_ids", None) or []
    return list(toks)


def chunk_digests(tokens: Sequence[int], chunk_tokens: int) -> List[bytes]:
    """One digest per whole chunk of ``tokens``, naming the whole prefix up
    to the chunk's end (chained, like the store's chunk keys)."""
    out: List[bytes] = []
    prev = b""
    for c in range(len(tokens) // chunk_tokens):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(array("I", tokens[c * chunk_tokens : (c + 1) * chunk_tokens]).tobytes())
        prev = h.digest()
        out.append(prev)
    return out


def _group0(block_ids: Any) -> List[int]:
    """Block ids of KV cache group 0 from vLLM's ``tuple[list[int], ...]``
    (a flat list is taken as group 0 itself)."""
    if block_ids is None:
        return []
    if len(block_ids) and isinstance(block_ids[0], (list, tuple)):
        return [int(b) for b in block_ids[0]]
    return [int(b) for b in block_ids]


@dataclass
class _Pending:
    """A load decided by ``update_state_after_alloc``: tokens ``[local, end)``."""

    local_tokens: int
    end_tokens: int
    block_ids: List[int]


@dataclass
class _Tracker:
    """A running request: its token source, block table and the chunks
    already in the store (saved or loaded)."""

    req_id: str
    prompt: List[int]
    request: Any
    block_ids: List[int]
    stored_chunks: int = 0


class SchedulerLogic:
    """The scheduler side.

    ``lookup(tokens) -> int``: tokens of the longest cached prefix of
    ``tokens`` (``KvCacheClient.lookup``; a multiple of ``chunk_tokens``).
    ``chunk_tokens``, ``block_size``: tokens. ``save_decode_tokens``: also
    save whole chunks of generated tokens.
    """

    def __init__(self, lookup: Callable[[Sequence[int]], int], chunk_tokens: int, block_size: int, *, save_decode_tokens: bool = False) -> None:
        if chunk_tokens % block_size:
            raise ValueError(f"chunk_tokens ({chunk_tokens}) must be a multiple of block_size ({block_size})")
        self.lookup = lookup
        self.chunk_tokens = chunk_tokens
        self.block_size = block_size
        self.save_decode_tokens = save_decode_tokens
        self._hits: Dict[str, Tuple[int, int]] = {}  # req -> (local tokens, cached tokens)
        self._requests: Dict[str, Any] = {}
        self._pending: Dict[str, _Pending] = {}
        self._trackers: Dict[str, _Tracker] = {}
        self._step_chunks: Set[bytes] = set()  # chunks saved by this step's SaveSpecs

    # vLLM's scheduler calls ---------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        """Tokens beyond ``num_computed_tokens`` (vLLM's local prefix-cache
        hit) that tutti holds: the longest cached prefix of whole chunks of
        the request's first ``num_tokens - 1`` tokens (vLLM must compute at
        least the last token to sample from it), minus the local hit; 0 when
        the local hit is as long. Loads are synchronous (the second value is
        always False). Repeated calls give the same answer while the store
        is unchanged."""
        toks = request_tokens(request)
        n = int(getattr(request, "num_tokens", len(toks)))
        toks = toks[: max(0, n - 1)]
        ct = self.chunk_tokens
        cached = (int(self.lookup(toks)) // ct) * ct if len(toks) >= ct else 0
        self._hits[request.request_id] = (int(num_computed_tokens), cached)
        ext = cached - num_computed_tokens if cached > num_computed_tokens else 0
        return ext, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Remember the request and, when ``num_external_tokens > 0``, the
        load of tokens ``[local, local + num_external_tokens)`` into its
        blocks (``blocks.get_block_ids()[0]``; ``build_connector_meta``
        takes the final table from the scheduler output)."""
        rid = request.request_id
        self._requests[rid] = request
        if num_external_tokens <= 0:
            self._pending.pop(rid, None)
            return
        local, cached = self._hits.get(rid, (None, None))  # type: ignore[assignment]
        if local is None or local + num_external_tokens != cached:
            # vLLM asked for a different count than we offered: trust its
            # count when it ends on a chunk boundary (it cannot exceed ours).
            local = int(getattr(request, "num_computed_tokens", 0) or 0)
        end = local + num_external_tokens
        if end % self.chunk_tokens or local % self.block_size:
            raise ValueError(f"request {rid}: external tokens [{local}, {end}) are not chunk/block aligned")
        get = getattr(blocks, "get_block_ids", None)
        ids = _group0(get()) if callable(get) else []
        self._pending[rid] = _Pending(local, end, ids)

    def build_connector_meta(self, scheduler_output: Any) -> TuttiConnectorMetadata:
        """This step's loads (requests with external tokens, now scheduled)
        and saves (whole chunks that this step completes). Resets the
        per-step state; does not modify ``scheduler_output``."""
        meta = TuttiConnectorMetadata()
        self._step_chunks = set()
        sched = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        for new in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            rid = new.req_id
            prompt = list(new.prompt_token_ids or [])
            tr = _Tracker(rid, prompt, self._requests.get(rid), _group0(new.block_ids))
            self._trackers[rid] = tr
            self._add_load(meta, tr)
            self._add_save(meta, tr, int(new.num_computed_tokens) + int(sched.get(rid, 0)))
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
            for i, rid in enumerate(cached.req_ids):
                tr = self._trackers.get(rid)
                if tr is None:
                    continue
                new_ids = cached.new_block_ids[i]
                if rid in resumed:
                    tr.block_ids = _group0(new_ids)
                    tr.stored_chunks = 0
                elif new_ids is not None:
                    tr.block_ids.extend(_group0(new_ids))
                self._add_load(meta, tr)
                self._add_save(meta, tr, int(cached.num_computed_tokens[i]) + int(sched.get(rid, 0)))
        for rid in getattr(scheduler_output, "finished_req_ids", ()) or ():
            self._forget(rid)
        self._hits.clear()
        return meta

    def request_finished(self, request: Any, block_ids: Sequence[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """Forget the request. Saves finish within the step that computed
        them (``wait_for_save``), so vLLM may free the blocks now: returns
        ``(False, None)``."""
        self._forget(request.request_id)
        return False, None

    def note_load_errors(self, block_ids: Any) -> None:
        """Blocks the workers failed to load (vLLM's
        ``KVConnectorOutput.invalid_block_ids``; vLLM recomputes them): a
        running request holding one no longer counts the chunks from the
        first failed one on as stored, so once vLLM has recomputed them
        they are saved again (before, a loaded chunk that failed was never
        saved by the request that recomputed it)."""
        bad = {int(b) for b in block_ids or ()}
        if not bad:
            return
        bpc = self.chunk_tokens // self.block_size
        for tr in self._trackers.values():
            for j, b in enumerate(tr.block_ids[: tr.stored_chunks * bpc]):
                if b in bad:
                    tr.stored_chunks = min(tr.stored_chunks, j // bpc)
                    break

    # Helpers ----------------------------------------------------------------

    def _forget(self, rid: str) -> None:
        for d in (self._trackers, self._requests, self._pending, self._hits):
            d.pop(rid, None)  # type: ignore[attr-defined]

    def _add_load(self, meta: TuttiConnectorMetadata, tr: _Tracker) -> None:
        p = self._pending.pop(tr.req_id, None)
        if p is None:
            return
        blocks = tr.block_ids or p.block_ids
        toks = request_tokens(tr.request) if tr.request is not None else tr.prompt
        if len(blocks) * self.block_size < p.end_tokens or len(toks) < p.end_tokens:
            raise ValueError(f"request {tr.req_id}: {len(blocks)} blocks / {len(toks)} tokens cannot hold {p.end_tokens} tokens")
        meta.loads.append(LoadSpec(tr.req_id, toks[: p.end_tokens], list(blocks), p.local_tokens, p.end_tokens))
        tr.stored_chunks = max(tr.stored_chunks, p.end_tokens // self.chunk_tokens)

    def _add_save(self, meta: TuttiConnectorMetadata, tr: _Tracker, computed_end: int) -> None:
        """Save the whole chunks of tokens ``[0, computed_end)`` (capped at
        the prompt unless ``save_decode_tokens``) not yet in the store."""
        toks = request_tokens(tr.request) if tr.request is not None else tr.prompt
        limit = len(toks) if self.save_decode_tokens else len(tr.prompt)
        whole = min(computed_end, limit, len(toks)) // self.chunk_tokens
        bpc = self.chunk_tokens // self.block_size
        whole = min(whole, len(tr.block_ids) // bpc)
        if whole <= tr.stored_chunks:
            return
        first = tr.stored_chunks
        # Leading chunks another request of this step already saves (a
        # shared prefix: the same tokens, so the same keys and bytes) are
        # not put twice.
        digests = chunk_digests(toks[: whole * self.chunk_tokens], self.chunk_tokens)
        while first < whole and digests[first] in self._step_chunks:
            first += 1
        self._step_chunks.update(digests[first:whole])
        if first < whole:
            meta.saves.append(SaveSpec(tr.req_id, toks[: whole * self.chunk_tokens], tr.block_ids[: whole * bpc], first))
        tr.stored_chunks = whole
