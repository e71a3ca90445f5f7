"""What the scheduler-side connector tells the worker-side one each step.

Token counts are tokens; block ids are vLLM's KV block ids (of KV cache
group 0), block ``j`` of a request holding its tokens ``[j * block_size,
(j + 1) * block_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from tutti.integrations.vllm._compat import KVConnectorMetadata


@dataclass
class LoadSpec:
    """Load the request's tokens ``[local_tokens, end_tokens)`` from tutti.

    ``token_ids``: the request's first ``end_tokens`` token ids (the keys of
    its chunks); ``block_ids``: its block table (at least ``end_tokens /
    block_size`` blocks); ``local_tokens``: tokens vLLM already holds in
    its own cache (a multiple of the block size; those blocks are never
    written); ``end_tokens``: a multiple of the chunk size.
    """

    req_id: str
    token_ids: List[int]
    block_ids: List[int]
    local_tokens: int
    end_tokens: int


@dataclass
class SaveSpec:
    """Save the whole chunks ``[first_chunk, len(token_ids) / chunk_tokens)``
    of a request once this step has computed them.

    ``token_ids``: the request's first ``num_chunks * chunk_tokens`` token
    ids; ``block_ids``: the blocks holding them; chunks before
    ``first_chunk`` were saved (or loaded) in earlier steps, or are saved
    by another request's ``SaveSpec`` of the same step (a shared prefix):
    the worker does not put them.
    """

    req_id: str
    token_ids: List[int]
    block_ids: List[int]
    first_chunk: int


@dataclass
class TuttiConnectorMetadata(KVConnectorMetadata):
    """One step's loads and saves (a ``KVConnectorMetadata`` when vLLM is
    installed)."""

    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)
