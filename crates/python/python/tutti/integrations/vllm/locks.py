"""One writer per store, across processes: ``WriterLock``.

tutti-kv keeps a store's index (which slot holds which key, which slots are
free) in the memory of the process that opened it, and nothing on the media
stops a second process from opening the same drives (docs/kv-store.md,
"What is not guaranteed"). Two writers would hand out each other's slots
and overwrite each other's records. So the connector's writer (the worker
of one tensor-parallel rank) takes an exclusive ``flock`` on each drive of
its store before opening it, and holds it until it closes:

- a file-backed emulated drive (``backing: { file: PATH }``): the lock is
  on ``PATH`` itself (an advisory lock: the emulator's reads and writes are
  not affected, a reader in another process takes none);
- a ``daemon`` drive: on a lock file in the temporary directory named by a
  digest of the daemon's socket path and the drive name;
- RAM drives (and RAM disks) are private to their process: no lock;
- ``pci`` drives: VFIO binds a function to one process: no lock.

A second writer gets ``StoreBusy`` at once (never waits). Only the stores
opened through this module are covered: another program opening the same
drive files is not stopped (tutti-kv itself has no cross-process claim).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import tempfile
from typing import Any, Dict, List, Optional


class StoreBusy(RuntimeError):
    """Another process holds the writer lock of a store's drive.

    ``store``: the store name; ``path``: the locked file."""

    def __init__(self, store: str, path: str) -> None:
        super().__init__(
            f"store {store!r}: {path} is locked by another writer (tutti-kv allows one writing process per store; "
            "give each tensor-parallel rank its own store, e.g. store: \"kv{rank}\")"
        )
        self.store = store
        self.path = path


def _parse(text: str) -> Optional[Dict[str, Any]]:
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        return None
    doc = yaml.safe_load(text)
    return doc if isinstance(doc, dict) else None


def _store_drives(doc: Dict[str, Any], store: str) -> List[Dict[str, Any]]:
    """The drive entries under ``store``'s datapath (empty when unknown)."""
    dp_name = ((doc.get("stores") or {}).get(store) or {}).get("datapath")
    dp = (doc.get("datapaths") or {}).get(dp_name) or {}
    names: List[str] = []
    for kind in dp.values():
        if isinstance(kind, dict):
            names += list(kind.get("drives") or []) + ([kind["drive"]] if "drive" in kind else [])
    drives = doc.get("drives") or {}
    return [drives[n] for n in names if isinstance(drives.get(n), dict)]


def lock_paths(config_text: str, store: str) -> List[str]:
    """The files to lock for writing ``store`` of the runtime YAML
    ``config_text`` (see the module docstring). Without PyYAML, every file
    backing in the text is locked (safe, but two stores of one config then
    cannot have writers in two processes)."""
    doc = _parse(config_text)
    if doc is None:
        files = re.findall(r"\bfile:\s*[\"']?([^\s,}\"']+)", config_text)
        daemons = re.findall(r"\bsocket:\s*[\"']?([^\s,}\"']+)", config_text)
        return sorted({os.path.realpath(f) for f in files} | {_daemon_lock(s, "*") for s in daemons})
    out = set()
    for d in _store_drives(doc, store):
        backing = (d.get("emulated") or {}).get("backing")
        if isinstance(backing, dict) and "file" in backing:
            out.add(os.path.realpath(str(backing["file"])))
        daemon = d.get("daemon")
        if isinstance(daemon, dict):
            out.add(_daemon_lock(str(daemon.get("socket")), str(daemon.get("drive"))))
    return sorted(out)


def _daemon_lock(socket: str, drive: str) -> str:
    """The lock file of ``drive`` of the daemon at ``socket`` for this uid
    (the daemon gives each uid its own partition): named from the socket's
    real path, in ``$XDG_RUNTIME_DIR`` when set (private to the user), else
    the temporary directory."""
    key = f"{os.path.realpath(socket)}\0{drive}\0{os.getuid()}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(base, f"tutti-writer-{os.getuid()}-{digest}.lock")


class WriterLock:
    """Exclusive ``flock``s on ``paths``, taken at construction (raises
    ``StoreBusy`` when one is held elsewhere) and given back by
    ``release`` (or when the process exits)."""

    def __init__(self, store: str, paths: List[str]) -> None:
        self._fds: List[int] = []
        try:
            for p in paths:
                fd = os.open(p, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
                self._fds.append(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise StoreBusy(store, p) from e
                    raise
        except BaseException:
            self.release()
            raise
        self.paths = list(paths)

    @classmethod
    def for_store(cls, cfg: Any, store: str) -> "WriterLock":
        """The lock for writing ``store`` of the runtime ``cfg``
        (``TuttiVllmConfig``) opens: none for emulated RAM drives."""
        text = cfg.runtime_text()
        return cls(store, lock_paths(text, store) if text is not None else [])

    def release(self) -> None:
        """Unlock and close (idempotent)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)
