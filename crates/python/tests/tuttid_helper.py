"""Starting a ``tuttid`` (tools/tuttid) for the Python tests: file-backed
emulated drives owned by the daemon, and the runtime YAML of a client that
reaches them as ``daemon`` drives.

The binary is ``$TUTTID_BIN``, else ``<repo>/target/{debug,release}/tuttid``
(built with ``cargo build -p tuttid``; ``tuttid_binary`` builds the debug
one when neither exists and cargo is on the PATH). Tests skip without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[3]


def tuttid_binary() -> Optional[str]:
    """The tuttid binary, built (debug) when missing and cargo is available."""
    env = os.environ.get("TUTTID_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for prof in ("debug", "release"):
        p = target / prof / "tuttid"
        if os.access(p, os.X_OK):
            return str(p)
    if shutil.which("cargo") is None:
        return None
    r = subprocess.run(["cargo", "build", "-q", "-p", "tuttid"], cwd=REPO, capture_output=True, text=True)
    p = target / "debug" / "tuttid"
    return str(p) if r.returncode == 0 and os.access(p, os.X_OK) else None


class Daemon:
    """A running ``tuttid serve`` over ``drives`` file-backed emulated
    drives ``d0..`` (images ``<dir>/d<i>.img``, ``capacity`` each) that this
    uid may use, ``queues`` queue pairs per client uid and drive."""

    def __init__(self, binary: str, directory: Path, drives: int = 4, capacity: str = "64MiB", queues: int = 16) -> None:
        self.dir = Path(directory)
        self.socket = self.dir / "tutti.sock"
        self.drives = [f"d{i}" for i in range(drives)]
        uid = os.getuid()
        lines = [f"socket: {self.socket}", 'socket_mode: "0660"', "lease_ms: 5000", "drives:"]
        for d in self.drives:
            lines += [
                f"  {d}:",
                f"    device: {{ emulated: {{ namespaces: [ {{ capacity: {capacity}, block_size: 4096 }} ], io_queues: 64, backing: {{ file: {self.image(d)} }} }} }}",
                f"    allow: {{ uids: [0, {uid}] }}",
                f"    queues_per_client: {queues}",
            ]
        self.config = self.dir / "tuttid.yaml"
        self.config.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen([binary, "serve", "--config", str(self.config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"tuttid did not start: {line!r} {err[-2000:]}")

    def image(self, drive: str) -> Path:
        """The backing file of ``drive`` (the daemon reads and writes it in place)."""
        return self.dir / f"{drive}.img"

    def client_yaml(self, stores: List[List[str]], slot: str = "64KiB", stripe_unit: str = "16KiB", queues_per_drive: int = 2) -> str:
        """A client runtime: every daemon drive, and store ``kv<i>``
        striped over ``stores[i]``'s drives."""
        s = "drives:\n"
        for d in self.drives:
            s += f"  {d}: {{ daemon: {{ socket: {self.socket}, drive: {d} }} }}\n"
        s += "resolvers:\n"
        for i in range(len(stores)):
            s += f"  r{i}: {{ slab: {{ slot_size: {slot} }} }}\n"
        s += "datapaths:\n"
        for i, ds in enumerate(stores):
            s += f"  p{i}: {{ striped_local_nvme: {{ drives: [{', '.join(ds)}], nsid: 1, stripe_unit: {stripe_unit}, queues_per_drive: {queues_per_drive}, queue_depth: 64 }} }}\n"
        s += "stores:\n"
        for i in range(len(stores)):
            s += f"  kv{i}: {{ resolver: r{i}, datapath: p{i} }}\n"
        return s

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
