"""``kv_connector_extra_config`` of the tutti connector.

Keys (all optional; docs/vllm.md has the table):

- ``runtime_config``: path of a tutti runtime YAML file
  (``tutti.Runtime.from_file``).
- ``runtime_yaml``: the runtime YAML itself, inline
  (``tutti.Runtime.from_yaml``). At most one of the two; with neither, the
  runtime is ``tutti.Runtime.emulated`` (RAM drives, lost at exit) sized by
  ``emulated_drives``, ``emulated_drive_bytes`` and ``emulated_slot_bytes``.
- ``store``: the store name in the runtime (default ``"kv"``). With
  tensor parallelism each rank writes its own store: the name must then
  contain ``{rank}`` (``"kv{rank}"`` -> ``kv0``, ``kv1``, ...), since a store
  has one writing process (locks.py).
- ``chunk_tokens``: tokens per chunk (default 256); a positive multiple of
  vLLM's block size (``--block-size``, tokens per KV block).
- ``model``: the model namespace of the keys (default: vLLM's model name).
  Chunks saved under one namespace are never loaded under another.
- ``timeout_s``: seconds one layer's loads (or one step's saves) may take
  (default 5.0).
- ``save_decode_tokens``: also save whole chunks of generated tokens (default
  false: whole chunks of the prompt only).
- ``lookup_refresh_s``: with the scheduler and the worker in different
  processes, how old (seconds) the scheduler's read-only view of the store
  may get before it is read again from the media (default 1.0; reader.py).
- ``stats_file``: a path prefix; each connector instance writes its
  counters (``TuttiConnector.stats``) as JSON to
  ``<stats_file>.<scheduler|worker><rank>.json`` whenever they change (for
  tests and debugging; default: not written).
- ``staging_bytes``: the worker's shared-memory staging buffer, for drives
  that reach only shared memory (``daemon`` drives of a ``tuttid``, which
  cannot reach vLLM's own KV tensors): blocks are copied between vLLM's
  tensors and the buffer (``tutti.engine.StagingStore``). Absent (None):
  staged through 64 MiB only when the store refuses vLLM's tensors; 0:
  never (the refusal is raised); a positive size: always staged through
  that many bytes (at least one store object).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

KEYS = (
    "runtime_config",
    "runtime_yaml",
    "emulated_drives",
    "emulated_drive_bytes",
    "emulated_slot_bytes",
    "store",
    "chunk_tokens",
    "model",
    "timeout_s",
    "save_decode_tokens",
    "lookup_refresh_s",
    "stats_file",
    "staging_bytes",
)


@dataclass(frozen=True)
class TuttiVllmConfig:
    """The parsed extra config (see the module docstring); sizes in bytes,
    ``chunk_tokens`` and ``block_size`` in tokens."""

    block_size: int
    model: str
    chunk_tokens: int = 256
    store: str = "kv"
    runtime_config: Optional[str] = None
    runtime_yaml: Optional[str] = None
    emulated_drives: int = 4
    emulated_drive_bytes: int = 1 << 30
    emulated_slot_bytes: int = 1 << 20
    timeout_s: float = 5.0
    save_decode_tokens: bool = False
    lookup_refresh_s: float = 1.0
    stats_file: Optional[str] = None
    staging_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")
        if not isinstance(self.chunk_tokens, int) or self.chunk_tokens < 1 or self.chunk_tokens % self.block_size:
            raise ValueError(
                f"chunk_tokens ({self.chunk_tokens!r}) must be a positive multiple of vLLM's block_size ({self.block_size})"
            )
        if self.runtime_config is not None and self.runtime_yaml is not None:
            raise ValueError("give runtime_config (a path) or runtime_yaml (inline YAML), not both")
        if not self.model:
            raise ValueError("model (the key namespace) must not be empty")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.lookup_refresh_s < 0:
            raise ValueError(f"lookup_refresh_s must be >= 0, got {self.lookup_refresh_s}")
        if self.staging_bytes is not None and self.staging_bytes < 0:
            raise ValueError(f"staging_bytes must be >= 0, got {self.staging_bytes}")

    @classmethod
    def from_extra_config(cls, extra: Optional[Mapping[str, Any]], *, block_size: int, model: str) -> "TuttiVllmConfig":
        """Parse ``kv_connector_extra_config``; ``block_size`` and ``model``
        come from vLLM's cache and model configs. Unknown keys are an error
        (a typo must not fall back to a default silently)."""
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(KEYS))
        if unknown:
            raise ValueError(f"unknown kv_connector_extra_config keys for TuttiConnector: {unknown}; known: {list(KEYS)}")
        kw: dict = {"block_size": int(block_size), "model": str(extra.pop("model", None) or model)}
        for k in ("chunk_tokens", "emulated_drives", "emulated_drive_bytes", "emulated_slot_bytes"):
            if k in extra:
                kw[k] = int(extra.pop(k))
        if extra.get("staging_bytes") is not None:
            kw["staging_bytes"] = int(extra.pop("staging_bytes"))
        for k in ("timeout_s", "lookup_refresh_s"):
            if k in extra:
                kw[k] = float(extra.pop(k))
        if "save_decode_tokens" in extra:
            v = extra.pop("save_decode_tokens")
            if isinstance(v, str):
                v = v.strip().lower() in ("1", "true", "yes", "on")
            kw["save_decode_tokens"] = bool(v)
        for k in ("store", "runtime_config", "runtime_yaml", "stats_file"):
            if k in extra and extra[k] is not None:
                kw[k] = str(extra.pop(k))
        return cls(**kw)

    @property
    def runtime_key(self) -> Tuple[str, str]:
        """What identifies the runtime this config opens (for sharing one
        runtime between the connectors of one process)."""
        if self.runtime_config is not None:
            return ("file", self.runtime_config)
        if self.runtime_yaml is not None:
            return ("yaml", self.runtime_yaml)
        return ("emulated", f"{self.emulated_drives}x{self.emulated_drive_bytes}/{self.emulated_slot_bytes}")

    def store_name(self, rank: int) -> str:
        """The store tensor-parallel rank ``rank`` writes (``store`` with
        ``{rank}`` replaced)."""
        return self.store.replace("{rank}", str(rank))

    def runtime_text(self) -> Optional[str]:
        """The runtime YAML this config opens (None for emulated RAM drives)."""
        if self.runtime_config is not None:
            with open(self.runtime_config, encoding="utf-8") as f:
                return f.read()
        return self.runtime_yaml

    def open_runtime(self) -> Any:
        """Open the tutti runtime this config names."""
        import tutti

        if self.runtime_config is not None:
            return tutti.Runtime.from_file(self.runtime_config)
        if self.runtime_yaml is not None:
            return tutti.Runtime.from_yaml(self.runtime_yaml)
        return tutti.Runtime.emulated(
            drives=self.emulated_drives, drive_bytes=self.emulated_drive_bytes, slot_bytes=self.emulated_slot_bytes
        )
