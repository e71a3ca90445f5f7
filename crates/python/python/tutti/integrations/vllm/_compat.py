"""Optional vLLM: the real base classes when vLLM is importable, stand-ins
with the same names and behaviour otherwise.

vLLM is imported here and nowhere else. Without it, ``KVConnectorBase_V1``
is a plain class holding the metadata binding (``bind_connector_metadata``,
``clear_connector_metadata``, ``has_connector_metadata``,
``_get_connector_metadata``) and ``role``, ``KVConnectorMetadata`` a plain
class, and ``KVConnectorRole`` an enum with ``SCHEDULER`` and ``WORKER``, so
the connector runs with duck-typed inputs (what the CI tests do).
"""

from __future__ import annotations

import enum
from typing import Any, Optional

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found]
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except Exception:  # ImportError, or a vLLM that fails to import here
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        """Stand-in for vLLM's ``KVConnectorRole``."""

        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``KVConnectorMetadata`` (an empty base)."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """Stand-in for vLLM's ``KVConnectorBase_V1``: the parts the
        connector inherits (metadata binding, role, configs)."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
            if self._kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> Any:
            return self._role

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None


__all__ = ["HAVE_VLLM", "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole"]
