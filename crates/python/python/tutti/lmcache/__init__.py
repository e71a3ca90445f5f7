"""tutti as LMCache's NVMe tier (LMCache 0.5.6; docs/lmcache.md is the guide).

LMCache's GPU-direct L1 (``lmcache.v1.gpu_connector.gds_context``) moves
chunks between GPU staging buffers and a "slab" through a ``GDSBackend``
chosen by name (``GdsL1Config.backend``). LMCache finds backends by listing
the modules of its package ``lmcache.v1.gpu_connector.gds_backends``; it has
no entry point or registry a third party can add to. ``install()`` is the
shim: it appends this package's ``gds_backends`` folder (one module,
``tutti.py``) to that package's ``__path__`` in the running process, the
same way LMCache's own tests add a backend, so ``backend: "tutti"`` resolves
to :class:`tutti.lmcache.gds.TuttiGDSBackend`. No LMCache file is changed.

The slab is a tutti store: ``file_location`` is ``tutti://<store>``, on the
runtime given to :func:`set_runtime` (or, when none was given, one built
from the YAML file named by the environment variable ``TUTTI_CONFIG``).
Nothing here imports torch or LMCache until ``install()`` or
``tutti.lmcache.gds`` is imported.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import tutti

__all__ = ["BACKEND_NAME", "CONFIG_ENV", "get_runtime", "install", "installed", "set_runtime"]

BACKEND_NAME = "tutti"
"""The name to give LMCache (``GdsL1Config.backend``, ``--l1-manager``'s ``backend``)."""

CONFIG_ENV = "TUTTI_CONFIG"
"""Environment variable naming a runtime YAML file (docs/config.md), read
when no runtime was given to :func:`set_runtime`."""

_lock = threading.Lock()
_runtime: Optional[tutti.Runtime] = None
_BACKENDS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gds_backends")


def install() -> None:
    """Make ``"tutti"`` a GDS backend name LMCache resolves, in this process.

    Appends this package's ``gds_backends`` folder to
    ``lmcache.v1.gpu_connector.gds_backends.__path__`` (once; repeated calls
    do nothing). Call it in every process that builds LMCache's GDS L1
    before the L1 is built (for vLLM: in the worker, e.g. from the module
    that builds the connector). Raises ``ImportError`` when LMCache (or
    torch, which it imports) is missing.
    """
    from lmcache.v1.gpu_connector import gds_backends  # noqa: PLC0415 (optional dependency)

    with _lock:
        if _BACKENDS_DIR not in list(gds_backends.__path__):
            gds_backends.__path__.append(_BACKENDS_DIR)


def installed() -> bool:
    """Whether :func:`install` ran in this process (LMCache imported and
    its backend folder list holds tutti's)."""
    import sys

    mod = sys.modules.get("lmcache.v1.gpu_connector.gds_backends")
    return mod is not None and _BACKENDS_DIR in list(mod.__path__)


def set_runtime(runtime: Optional[tutti.Runtime]) -> None:
    """Use ``runtime`` for every tutti slab this process opens from now on
    (``None`` forgets it). The runtime stays the caller's: it is not shut
    down here."""
    global _runtime
    if runtime is not None and not isinstance(runtime, tutti.Runtime):
        raise tutti.ConfigError(f"set_runtime: expected a tutti.Runtime, got {type(runtime).__name__}")
    with _lock:
        _runtime = runtime


def get_runtime() -> tutti.Runtime:
    """The process's runtime for LMCache: the one given to
    :func:`set_runtime`, else one built (once) from the YAML file named by
    ``$TUTTI_CONFIG``. Raises ``tutti.ConfigError`` when there is neither,
    or when the file is refused."""
    global _runtime
    with _lock:
        if _runtime is not None:
            return _runtime
        path = os.environ.get(CONFIG_ENV, "")
        if not path:
            raise tutti.ConfigError(
                "LMCache's tutti backend has no runtime: call tutti.lmcache.set_runtime(rt) "
                f"or set {CONFIG_ENV} to a runtime YAML file (docs/lmcache.md)"
            )
        _runtime = tutti.Runtime.from_file(path)
        return _runtime
