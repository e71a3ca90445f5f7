"""LMCache's GDS backend contract (lmcache/v1/gpu_connector/gds_backends/
base.py) for tutti's backend, on emulated drives with host memory
(``execution: cpu``): found by name without changing LMCache's files, reads
give back what was written at odd offsets and sizes without touching the
bytes around them, threads in parallel, drive faults and timeouts in
``bytes_done``, bad input raised at submit, and LMCache's own GDSContext
driving it. Skipped without LMCache and torch (crates/python/tests/
lmcache/run.sh installs them; with TUTTI_LMCACHE_REQUIRED=1 a skip fails).
The CUDA variant is test_lmcache_gds_cuda.py."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

import tutti
from conftest import one_drive_yaml

if os.environ.get("TUTTI_LMCACHE_REQUIRED") == "1":
    import lmcache  # noqa: F401  (must import: no skip)
    import torch
else:
    torch = pytest.importorskip("torch")
    pytest.importorskip("lmcache.v1.gpu_connector.gds_backends.base")

import tutti.lmcache as tl  # noqa: E402
from lmcache.v1.gpu_connector import _gds_backends, gds_backends  # noqa: E402

tl.install()
from tutti.lmcache.gds import BOUNCE_BYTES, SlabError, TuttiGDSBackend, TuttiSubmission, plan  # noqa: E402

MiB = 1 << 20
BLOCK = 4096


@pytest.fixture
def rt():
    """Four emulated drives striped into store "kv" with 1 MiB slots."""
    with tutti.Runtime.emulated(drives=4, drive_bytes=16 * MiB, slot_bytes=MiB) as r:
        tl.set_runtime(r)
        yield r
        tl.set_runtime(None)


def random_bytes(n: int, seed: int) -> "torch.Tensor":
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


class Slab:
    """A backend, an open slab of ``size`` bytes and two registered buffers."""

    def __init__(self, size: int = 8 * MiB, buf_bytes: int = 4 * MiB, backend=None) -> None:
        self.backend = backend or _gds_backends.create_backend("tutti")
        self.handle = self.backend.open_slab("tutti://kv", size, True)
        self.src = random_bytes(buf_bytes, 1)
        self.dst = torch.full((buf_bytes,), 0xA5, dtype=torch.uint8)
        self.backend.register_buffer(self.src)
        self.backend.register_buffer(self.dst)

    def write(self, n: int, file_offset: int, buf_offset: int = 0, buf=None) -> TuttiSubmission:
        b = self.src if buf is None else buf
        return self.handle.write_async(b.data_ptr(), n, file_offset, buf_offset, 0)

    def read(self, n: int, file_offset: int, buf_offset: int = 0, buf=None) -> TuttiSubmission:
        b = self.dst if buf is None else buf
        return self.handle.read_async(b.data_ptr(), n, file_offset, buf_offset, 0)

    def close(self) -> None:
        self.backend.deregister_buffer(self.src)
        self.backend.deregister_buffer(self.dst)
        self.handle.close()
        self.handle.close()  # repeated: nothing
        self.backend.close_driver()


def test_install_adds_the_backend_by_name_without_changing_lmcache_files(rt):
    folder = gds_backends.__path__[0]
    before = sorted(os.listdir(folder))
    tl.install()
    tl.install()
    assert tl.installed()
    assert sum(1 for p in gds_backends.__path__ if p.endswith(os.path.join("tutti", "lmcache", "gds_backends"))) == 1
    assert sorted(os.listdir(folder)) == before and "tutti.py" not in before
    assert "tutti" in _gds_backends.available_backends()
    backend = _gds_backends.create_backend("tutti")
    assert isinstance(backend, TuttiGDSBackend) and backend.name == "tutti"
    assert TuttiGDSBackend.is_default() is False  # never picked by "auto"


def test_plan_covers_the_range_once_with_whole_blocks():
    for file_offset, size, buf_offset, addr in [(0, 8192, 0, 0), (1, 1, 0, 0), (4095, 2, 0, 0), (100, 3 * MiB, 100, 4096),
                                                 (5, 9000, 0, 1), (0, 2 * MiB + 3, 1, 0)]:
        pieces = plan(file_offset, size, buf_offset, addr, BLOCK)
        covered = []
        for p in pieces:
            assert p.file_start % BLOCK == 0 and p.file_len % BLOCK == 0 and 0 < p.file_len <= BOUNCE_BYTES + BLOCK or p.direct
            assert p.skip + p.nbytes <= p.file_len
            if p.direct:
                assert p.skip == 0 and p.nbytes == p.file_len and (addr + p.buf_offset) % 4 == 0
            covered.append((p.file_start + p.skip, p.nbytes, p.buf_offset))
        pos = file_offset
        for start, n, bo in covered:
            assert start == pos and bo == buf_offset + (start - file_offset)
            pos += n
        assert pos == file_offset + size


# (file offset, size, buffer offset): whole blocks, one byte, a block's
# last byte and the next's first, partial head and tail around whole
# blocks, a range across a 1 MiB slot (and so a drive), a buffer offset
# that is not 4-byte aligned (all bounced), more than one bounce buffer.
ODD = [
    (0, 4 * BLOCK, 0),
    (7, 1, 0),
    (BLOCK - 1, 2, 3),
    (1000, 3 * BLOCK + 77, 1000),
    (MiB - 5000, 10_001, 12),
    (3 * MiB + 17, 12_345, 1),
    (123, 2 * MiB + 3, 2),
    (4 * MiB, MiB, 4),
]


@pytest.mark.parametrize("file_offset,size,buf_offset", ODD)
def test_read_back_what_was_written_at_odd_offsets_and_sizes(rt, file_offset, size, buf_offset):
    s = Slab()
    try:
        # The slab's bytes around the range are known: whole blocks of random
        # bytes from a block before it to a block after it.
        base = max(0, file_offset - file_offset % BLOCK - BLOCK)
        top = min(8 * MiB, -(-(file_offset + size) // BLOCK) * BLOCK + BLOCK)
        fill = random_bytes(top - base, 7)
        s.backend.register_buffer(fill)
        assert s.write(top - base, base, buf=fill).bytes_done == top - base
        model = fill.clone()
        sub = s.write(size, file_offset, buf_offset)
        assert isinstance(sub, TuttiSubmission) and sub.bytes_done == size
        assert all(st.ok for st in sub.statuses)
        model[file_offset - base : file_offset - base + size] = s.src[buf_offset : buf_offset + size]
        # The exact range, into the destination at another odd offset.
        r = s.read(size, file_offset, buf_offset + 1)
        assert r.bytes_done == size
        assert torch.equal(s.dst[buf_offset + 1 : buf_offset + 1 + size], s.src[buf_offset : buf_offset + size])
        assert bool((s.dst[: buf_offset + 1] == 0xA5).all()), "bytes before the destination range changed"
        assert bool((s.dst[buf_offset + 1 + size :] == 0xA5).all()), "bytes after the destination range changed"
        # The blocks around it: the neighbours' bytes survived the read-modify-write.
        around = torch.zeros_like(model)
        s.backend.register_buffer(around)
        assert s.read(top - base, base, buf=around).bytes_done == top - base
        assert torch.equal(around, model)
        s.backend.deregister_buffer(around)
        s.backend.deregister_buffer(fill)
    finally:
        s.close()


def test_threads_in_parallel_each_read_back_their_own_bytes(rt):
    s = Slab(size=12 * MiB)
    errors = []

    def worker(i: int) -> None:
        try:
            n = 200_000 + 4099 * i
            src, dst = random_bytes(n + 8, 100 + i), torch.zeros(n + 8, dtype=torch.uint8)
            s.backend.register_buffer(src)
            s.backend.register_buffer(dst)
            for rep in range(3):
                off = i * MiB + 13 * rep + i  # odd, and its own MiB per thread
                assert s.write(n, off, rep, buf=src).bytes_done == n
                assert s.read(n, off, rep + 1, buf=dst).bytes_done == n
                assert torch.equal(dst[rep + 1 : rep + 1 + n], src[rep : rep + n]), (i, rep)
            s.backend.deregister_buffer(src)
            s.backend.deregister_buffer(dst)
        except BaseException as e:  # reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    s.close()
    assert errors == []
    assert not any(t.is_alive() for t in threads)


FAULT_LBA = "- { lba: [256, 260], op: %s, action: { fail: { sct: 2, sc: 0x81, dnr: true } } }"


@pytest.mark.parametrize("op", ["read", "write"])
def test_a_drive_fault_shows_as_negative_bytes_done(op):
    # One drive, 1 MiB slots: slab bytes [1 MiB, 1 MiB + 16 KiB) are LBAs 256..260.
    with tutti.Runtime.from_yaml(one_drive_yaml(faults=FAULT_LBA % op)) as r:
        s = Slab(size=4 * MiB, backend=TuttiGDSBackend(r))
        try:
            ok_w = s.write(BLOCK, 0)
            assert ok_w.bytes_done == BLOCK
            bad = s.write(2 * BLOCK, MiB + BLOCK) if op == "write" else s.read(2 * BLOCK, MiB + BLOCK)
            assert bad.bytes_done == -errno.EIO
            failed = [st for st in bad.statuses if not st.ok]
            assert failed and failed[0].kind == "nvme" and (failed[0].sct, failed[0].sc, failed[0].dnr) == (2, 0x81, True)
            # An odd range over the faulty block, through the bounce buffer.
            odd = s.write(100, MiB + 3) if op == "write" else s.read(100, MiB + 3)
            assert odd.bytes_done == -errno.EIO
            if op == "read":
                assert bool((s.dst[:100] == 0xA5).all()), "a failed read must not copy bounce bytes out"
            # The rest of the slab still works.
            assert s.read(BLOCK, 0).bytes_done == BLOCK
            assert torch.equal(s.dst[:BLOCK], s.src[:BLOCK])
        finally:
            s.close()


def test_a_timed_out_wait_shows_as_etimedout():
    with tutti.Runtime.from_yaml(one_drive_yaml(faults="- { op: read, action: { delay_us: 300000 }, times: 1 }")) as r:
        backend = TuttiGDSBackend(r)
        backend.timeout_s = 0.05
        s = Slab(size=2 * MiB, backend=backend)
        assert s.read(BLOCK, 0).bytes_done == -errno.ETIMEDOUT
        time.sleep(0.5)  # the drive finishes; the memory is free again
        backend.timeout_s = 30.0
        assert s.write(BLOCK, 0).bytes_done == BLOCK
        assert s.read(BLOCK, 0).bytes_done == BLOCK
        assert torch.equal(s.dst[:BLOCK], s.src[:BLOCK])
        s.close()


def test_bad_requests_raise_at_submit(rt):
    s = Slab(size=2 * MiB)
    try:
        for args in [(BLOCK, 2 * MiB - 100), (0, 0), (-1, 0), (BLOCK, -4096)]:
            with pytest.raises(SlabError) as e:
                s.write(*args)
            assert isinstance(e.value, ValueError) and isinstance(e.value, tutti.RequestError)
        with pytest.raises(SlabError, match="outside the registered"):
            s.read(BLOCK, 0, buf_offset=s.dst.numel() - 10)
        with pytest.raises(tutti.MemoryRegistrationError, match="no buffer registered"):
            s.handle.read_async(s.dst.data_ptr() + 1, BLOCK, 0, 0, 0)
        with pytest.raises(tutti.MemoryRegistrationError, match="already registered"):
            s.backend.register_buffer(s.dst)
        with pytest.raises(tutti.MemoryRegistrationError):
            s.backend.register_buffer(torch.zeros((64, 64), dtype=torch.uint8).t())
        for loc in ["/tmp/slab", "tutti://", "tutti://kv/3", "tutti://nope"]:
            with pytest.raises(SlabError):
                s.backend.open_slab(loc, MiB, True)
        with pytest.raises(SlabError, match="exceeds"):
            s.backend.open_slab("tutti://kv", 1 << 40, True)
        s.handle.close()
        with pytest.raises(SlabError, match="closed"):
            s.write(BLOCK, 0)
    finally:
        s.close()


def test_no_runtime_is_a_config_error_and_a_value_error(monkeypatch):
    tl.set_runtime(None)
    monkeypatch.delenv(tl.CONFIG_ENV, raising=False)
    with pytest.raises(ValueError) as e:
        _gds_backends.create_backend("tutti")
    assert isinstance(e.value, tutti.ConfigError)
    with pytest.raises(tutti.ConfigError):
        tl.set_runtime("not a runtime")


def test_runtime_from_the_config_file_named_by_the_environment(monkeypatch, tmp_path):
    path = tmp_path / "rt.yaml"
    path.write_text(one_drive_yaml())
    tl.set_runtime(None)
    monkeypatch.setenv(tl.CONFIG_ENV, str(path))
    try:
        s = Slab(size=MiB)
        assert s.write(5000, 3).bytes_done == 5000 and s.read(5000, 3).bytes_done == 5000
        assert torch.equal(s.dst[:5000], s.src[:5000])
        s.close()
    finally:
        rt = tl.get_runtime()
        tl.set_runtime(None)
        rt.shutdown()


def test_lmcache_gds_context_moves_chunks_through_the_backend(rt, monkeypatch):
    """LMCache's own L1 data path (GDSContext: slab by config name, buffer
    registration in <= 16 MiB regions, transfer_async) over tutti. On CPU
    LMCache has no native stream handle, so its stream helpers are
    replaced by stand-ins (as LMCache's own context tests do)."""
    from lmcache.v1.distributed.config import GdsL1Config
    from lmcache.v1.gpu_connector import gds_context
    from lmcache.v1.gpu_connector.gds_context import GDSContext, SlabDirection

    class Done:
        def is_complete(self) -> bool:
            return True

    ps = gds_context.platform_stream
    monkeypatch.setattr(ps, "current_stream", lambda device: object())
    monkeypatch.setattr(ps, "stream_handle", lambda device, stream: 0)
    monkeypatch.setattr(ps, "synchronize_stream", lambda device, stream: None)
    monkeypatch.setattr(ps, "synchronize_device", lambda device: None)
    monkeypatch.setattr(ps, "record_completion_event", lambda device, stream: Done())

    class Chunk:  # what transfer_async reads of a GDSMemoryObject
        def __init__(self, slab_offset: int, size: int) -> None:
            self.slab_offset, self.size = slab_offset, size

        def get_size(self) -> int:
            return self.size

    ctx = GDSContext()
    ctx.initialize(GdsL1Config(file_location="tutti://kv", size_in_bytes=20 * MiB + 1, backend="tutti"))
    assert isinstance(ctx.backend, TuttiGDSBackend)
    staging = torch.zeros(20 * MiB, dtype=torch.uint8)  # two registered regions: 16 MiB + 4 MiB
    ctx.register_gpu_buffer(staging)
    chunks = [Chunk(0, 3 * MiB), Chunk(4 * MiB, 12345), Chunk(8 * MiB + BLOCK, 6 * MiB)]
    data = [random_bytes(c.size, 50 + i) for i, c in enumerate(chunks)]
    at = [0, 3 * MiB, 13 * MiB]  # the last chunk crosses the 16 MiB region boundary
    for c, d, o in zip(chunks, data, at):
        staging[o : o + c.size] = d
        ctx.transfer_async(c, staging[o:], SlabDirection.WRITE)
    staging.zero_()
    for c, o in zip(chunks, at):
        ctx.transfer_async(c, staging[o:], SlabDirection.READ)
    for c, d, o in zip(chunks, data, at):
        assert torch.equal(staging[o : o + c.size], d)
    ctx.deregister_gpu_buffer(staging)
    ctx.close()
    assert not ctx.initialized


def test_lmcache_arguments_offer_tutti_as_a_gds_backend():
    import argparse

    from lmcache.v1.distributed.config import add_storage_manager_args, parse_args_to_config

    parser = add_storage_manager_args(argparse.ArgumentParser())
    args = parser.parse_args(["--gds-l1-path", "tutti://kv", "--gds-l1-backend", "tutti", "--l1-size-gb", "1",
                              "--eviction-policy", "LRU"])
    cfg = parse_args_to_config(args)
    found = [m.gds_l1_config for m in getattr(cfg, "l1_manager_configs", [])] or [cfg.l1_manager_config.gds_l1_config]
    assert [(g.file_location, g.backend) for g in found] == [("tutti://kv", "tutti")]


def test_module_runner_installs_before_running_the_module(tmp_path):
    import subprocess
    import sys

    (tmp_path / "show_backends.py").write_text(
        "import os\n"
        "from lmcache.v1.gpu_connector._gds_backends import available_backends\n"
        "print(','.join(available_backends()), os.environ.get('TUTTI_CONFIG'))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "tutti.lmcache", "--runtime", "/x.yaml", "show_backends"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    names, config = p.stdout.split()[-2:]
    assert "tutti" in names.split(",") and config == "/x.yaml"
