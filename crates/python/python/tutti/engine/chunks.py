"""Chunking of token sequences into whole chunks.

A chunk is ``chunk_tokens`` consecutive token ids starting at a multiple of
``chunk_tokens``. Only whole chunks are ever saved or loaded: a trailing
partial chunk has no key (``tutti.ChunkKeys.chain`` gives it none) and is
always recomputed by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple


@dataclass(frozen=True)
class Chunking:
    """Cuts token sequences into chunks of ``chunk_tokens`` tokens.

    ``chunk_tokens`` is a count of tokens (not bytes), at least 1.
    """

    chunk_tokens: int

    def __post_init__(self) -> None:
        if not isinstance(self.chunk_tokens, int) or self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be a positive int, got {self.chunk_tokens!r}")

    def whole_chunks(self, num_tokens: int) -> int:
        """Number of whole chunks in a sequence of ``num_tokens`` tokens."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return num_tokens // self.chunk_tokens

    def tokens_of(self, num_chunks: int) -> int:
        """Number of tokens in ``num_chunks`` whole chunks."""
        return num_chunks * self.chunk_tokens

    def span(self, chunk: int) -> Tuple[int, int]:
        """Token range ``[start, end)`` of chunk ``chunk``."""
        if chunk < 0:
            raise ValueError(f"chunk must be >= 0, got {chunk}")
        return chunk * self.chunk_tokens, (chunk + 1) * self.chunk_tokens

    def split(self, tokens: Sequence[int]) -> List[List[int]]:
        """The whole chunks of ``tokens``, as lists of token ids; the trailing
        partial chunk (``len(tokens) % chunk_tokens`` tokens) is left out."""
        n = self.whole_chunks(len(tokens))
        t = self.chunk_tokens
        return [list(tokens[i * t : (i + 1) * t]) for i in range(n)]

    def remainder(self, num_tokens: int) -> int:
        """Tokens after the last whole chunk (never saved)."""
        return num_tokens - self.tokens_of(self.whole_chunks(num_tokens))
