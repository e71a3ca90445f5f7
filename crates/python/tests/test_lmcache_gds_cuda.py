"""LMCache's GDS backend contract for tutti with CUDA tensors on a runtime
whose datapath has ``execution: gpu``: I/O queued on the caller's stream
(no host synchronisation between a write and the read that checks it),
odd offsets and sizes through the per-stream bounce buffer, several streams
at once, the legacy default stream, a drive fault in ``bytes_done``, and
LMCache's GDSContext on a real stream. Skipped without LMCache, torch or a
CUDA GPU (test_lmcache_gds.py is the CPU variant). Not yet run on a GPU:
docs/status.md."""

from __future__ import annotations

import errno
import os

import pytest

# A copy queued behind a running I/O kernel must not share the hardware
# queue of the emulator's copies (docs/gpu.md); only effective before CUDA starts.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

torch = pytest.importorskip("torch")
pytest.importorskip("lmcache.v1.gpu_connector.gds_backends.base")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import tutti  # noqa: E402
import tutti.lmcache as tl  # noqa: E402

tl.install()
from tutti.lmcache.gds import TuttiGDSBackend, TuttiSubmission  # noqa: E402

MiB = 1 << 20
BLOCK = 4096


def gpu_yaml(faults: str = "") -> str:
    """Two emulated drives striped into store "kv" (1 MiB slots), GPU-executed."""
    fault = f", faults: [{faults}]" if faults else ""
    return (
        "drives:\n"
        f"  d0: {{ emulated: {{ namespaces: [{{ capacity: 64MiB, block_size: 4096 }}]{fault} }} }}\n"
        "  d1: { emulated: { namespaces: [{ capacity: 64MiB, block_size: 4096 }] } }\n"
        "resolvers:\n  kv: { slab: { slot_size: 1MiB } }\n"
        "datapaths:\n"
        "  stripe:\n"
        "    striped_local_nvme: { drives: [d0, d1], nsid: 1, stripe_unit: 128KiB, queues_per_drive: 2, queue_depth: 256, execution: gpu }\n"
        "stores:\n  kv: { resolver: kv, datapath: stripe }\n"
    )


@pytest.fixture
def grt():
    try:
        rt = tutti.Runtime.from_yaml(gpu_yaml())
    except tutti.GpuError as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"the runtime cannot drive this GPU: {e}")
    with rt:
        tl.set_runtime(rt)
        yield rt
        tl.set_runtime(None)


def random_bytes(n: int, seed: int) -> "torch.Tensor":
    g = torch.Generator(device="cuda:0").manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda:0", generator=g)


def slab(backend: TuttiGDSBackend, size: int = 8 * MiB):
    h = backend.open_slab("tutti://kv", size, True)
    src, dst = random_bytes(4 * MiB, 1), torch.full((4 * MiB,), 0xA5, dtype=torch.uint8, device="cuda:0")
    backend.register_buffer(src)
    backend.register_buffer(dst)
    torch.cuda.synchronize()
    return h, src, dst


@pytest.mark.parametrize("file_offset,size,buf_offset", [(0, 4 * BLOCK, 0), (7, 1, 0), (1000, 3 * BLOCK + 77, 1000),
                                                         (MiB - 5000, 10_001, 12), (123, 2 * MiB + 3, 2)])
def test_write_then_read_on_one_stream_without_host_sync(grt, file_offset, size, buf_offset):
    b = TuttiGDSBackend()
    h, src, dst = slab(b)
    s = torch.cuda.Stream()
    b.register_stream(s.cuda_stream)
    w = h.write_async(src.data_ptr(), size, file_offset, buf_offset, s.cuda_stream)
    r = h.read_async(dst.data_ptr(), size, file_offset, buf_offset + 1, s.cuda_stream)
    assert isinstance(w, TuttiSubmission)
    s.synchronize()
    assert (w.wait(), r.wait()) == (size, size)
    assert torch.equal(dst[buf_offset + 1 : buf_offset + 1 + size], src[buf_offset : buf_offset + size])
    assert bool((dst[: buf_offset + 1] == 0xA5).all()) and bool((dst[buf_offset + 1 + size :] == 0xA5).all())
    b.deregister_stream(s.cuda_stream)
    b.deregister_buffer(src)
    b.deregister_buffer(dst)
    h.close()


def test_write_sees_the_work_queued_before_it_on_the_stream(grt):
    b = TuttiGDSBackend()
    h, src, dst = slab(b)
    scratch = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        scratch.fill_(1)  # milliseconds of work first
        src[:MiB].fill_(0x5A)  # what the write must see
    w = h.write_async(src.data_ptr(), MiB, 0, 0, s.cuda_stream)
    with torch.cuda.stream(s):
        src[:MiB].fill_(0)  # queued after the write: not what it saw
    r = h.read_async(dst.data_ptr(), MiB, 0, 0, s.cuda_stream)
    s.synchronize()
    assert (w.wait(), r.wait()) == (MiB, MiB)
    assert bool((dst[:MiB] == 0x5A).all())
    h.close()


def test_several_streams_at_once_each_read_back_their_bytes(grt):
    b = TuttiGDSBackend()
    h, _, _ = slab(b)
    streams = [torch.cuda.Stream() for _ in range(4)]
    bufs = [(random_bytes(300_000, 10 + i), torch.zeros(300_008, dtype=torch.uint8, device="cuda:0")) for i in range(4)]
    for src, dst in bufs:
        b.register_buffer(src)
        b.register_buffer(dst)
    torch.cuda.synchronize()
    subs = []
    for i, (s, (src, dst)) in enumerate(zip(streams, bufs)):
        off = i * MiB + 3 * i + 1
        subs.append(h.write_async(src.data_ptr(), src.numel(), off, 0, s.cuda_stream))
        subs.append(h.read_async(dst.data_ptr(), src.numel(), off, 5, s.cuda_stream))
    for s in streams:
        s.synchronize()
    assert [x.wait() for x in subs] == [300_000] * 8
    for src, dst in bufs:
        assert torch.equal(dst[5 : 5 + src.numel()], src)
    h.close()


def test_legacy_default_stream_runs_synchronously(grt):
    b = TuttiGDSBackend()
    h, src, dst = slab(b)
    assert h.write_async(src.data_ptr(), 5000, 3, 0, 0).bytes_done == 5000
    assert h.read_async(dst.data_ptr(), 5000, 3, 0, 0).bytes_done == 5000
    assert torch.equal(dst[:5000], src[:5000])
    h.close()


def test_a_drive_fault_shows_as_negative_bytes_done():
    # 128 KiB stripe units over 2 drives: slab byte 1 MiB starts stripe unit 8,
    # d0's unit 4, its LBAs [128, 160).
    try:
        rt = tutti.Runtime.from_yaml(gpu_yaml("{ lba: [128, 160], op: read, action: { fail: { sct: 2, sc: 0x81, dnr: true } } }"))
    except tutti.GpuError as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"the runtime cannot drive this GPU: {e}")
    with rt:
        b = TuttiGDSBackend(rt)
        h, src, dst = slab(b)
        s = torch.cuda.Stream()
        w = h.write_async(src.data_ptr(), 2 * BLOCK, MiB, 0, s.cuda_stream)
        r = h.read_async(dst.data_ptr(), 2 * BLOCK, MiB, 0, s.cuda_stream)
        s.synchronize()
        assert w.wait() == 2 * BLOCK
        assert r.wait() == -errno.EIO
        assert any(st.kind == "nvme" and st.sc == 0x81 for st in r.statuses)
        ok = h.read_async(dst.data_ptr(), BLOCK, 0, 0, s.cuda_stream)
        s.synchronize()
        assert ok.wait() == BLOCK
        h.close()


def test_lmcache_gds_context_on_a_cuda_stream(grt):
    from lmcache.v1.distributed.config import GdsL1Config
    from lmcache.v1.gpu_connector.gds_context import GDSContext, SlabDirection

    class Chunk:  # what transfer_async reads of a GDSMemoryObject
        def __init__(self, slab_offset: int, size: int) -> None:
            self.slab_offset, self.size = slab_offset, size

        def get_size(self) -> int:
            return self.size

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        ctx = GDSContext()
        ctx.initialize(GdsL1Config(file_location="tutti://kv", size_in_bytes=20 * MiB, backend="tutti"))
        staging = torch.zeros(20 * MiB, dtype=torch.uint8, device="cuda:0")
        ctx.register_gpu_buffer(staging)
        chunks = [Chunk(0, 3 * MiB), Chunk(4 * MiB, 12345), Chunk(8 * MiB + BLOCK, 6 * MiB)]
        at = [0, 3 * MiB, 13 * MiB]
        data = [random_bytes(c.size, 50 + i) for i, c in enumerate(chunks)]
        for c, d, o in zip(chunks, data, at):
            staging[o : o + c.size].copy_(d)
            ctx.transfer_async(c, staging[o:], SlabDirection.WRITE)
        staging.zero_()  # stream-ordered after the writes
        for c, o in zip(chunks, at):
            ctx.transfer_async(c, staging[o:], SlabDirection.READ)
    s.synchronize()
    for c, d, o in zip(chunks, data, at):
        assert torch.equal(staging[o : o + c.size], d)
    with torch.cuda.stream(s):
        ctx.deregister_gpu_buffer(staging)
    ctx.close()
