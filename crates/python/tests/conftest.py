"""Shared fixtures: emulated runtimes (RAM or file-backed drives, optional
fault rules) and numpy host buffers."""

from __future__ import annotations

import textwrap
from typing import Iterator, Optional

import numpy as np
import pytest

import tutti

MiB = 1 << 20
SLOT = MiB


def one_drive_yaml(
    faults: str = "",
    backing: str = "ram",
    capacity: str = "64MiB",
    execution: str = "cpu",
) -> str:
    """A runtime with one emulated drive d0 and store "kv" (1 MiB slots on
    a local_nvme datapath, so slot s is LBAs [256 s, 256 s + 256))."""
    fault_block = ""
    if faults:
        fault_block = "      faults:\n" + textwrap.indent(textwrap.dedent(faults).strip("\n"), "        ") + "\n"
    return (
        "drives:\n"
        "  d0:\n"
        "    emulated:\n"
        f"      namespaces: [{{ capacity: {capacity}, block_size: 4096 }}]\n"
        f"      backing: {backing}\n"
        f"{fault_block}"
        "resolvers:\n"
        "  kv: { slab: { slot_size: 1MiB } }\n"
        "datapaths:\n"
        f"  local: {{ local_nvme: {{ drive: d0, nsid: 1, queues: 2, queue_depth: 256, execution: {execution} }} }}\n"
        "stores:\n"
        "  kv: { resolver: kv, datapath: local }\n"
    )


@pytest.fixture
def rt() -> Iterator[tutti.Runtime]:
    """Four emulated RAM drives, 64 MiB each, striped into store "kv"."""
    with tutti.Runtime.emulated(drives=4, drive_bytes=64 * MiB, slot_bytes=SLOT) as r:
        yield r


def pattern(n: int, seed: int = 1) -> np.ndarray:
    """`n` pseudo-random bytes."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def poisoned(n: int) -> np.ndarray:
    """`n` bytes of 0xA5, to tell a read that moved nothing from one that did."""
    return np.full(n, 0xA5, dtype=np.uint8)


def wait_until(cond, timeout: float = 5.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def statuses_kinds(statuses) -> list:
    return [None if s is None else s.kind for s in statuses]


def only(xs, kind: Optional[str] = None):
    assert len(xs) == 1, xs
    if kind is not None:
        assert xs[0].kind == kind, xs[0]
    return xs[0]
