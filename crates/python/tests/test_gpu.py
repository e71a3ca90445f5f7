"""GPU arrays (torch CUDA tensors, CuPy arrays, DLPack tensors) registered
with a runtime whose datapath has `execution: gpu`. Skipped cleanly without
torch or without a CUDA GPU."""

from __future__ import annotations

import pytest

import tutti

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

MiB = 1 << 20

GPU_YAML = """
drives:
  d0: { emulated: { namespaces: [{ capacity: 64MiB, block_size: 4096 }] } }
  d1: { emulated: { namespaces: [{ capacity: 64MiB, block_size: 4096 }] } }
resolvers:
  kv: { slab: { slot_size: 1MiB } }
datapaths:
  stripe:
    striped_local_nvme: { drives: [d0, d1], nsid: 1, stripe_unit: 128KiB, queues_per_drive: 2, queue_depth: 256, execution: gpu }
stores:
  kv: { resolver: kv, datapath: stripe }
"""


@pytest.fixture
def grt():
    try:
        rt = tutti.Runtime.from_yaml(GPU_YAML)
    except tutti.GpuError as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"the runtime cannot drive this GPU: {e}")
    with rt:
        yield rt


def random_bytes(n: int, device: str = "cuda:0"):
    g = torch.Generator(device=device).manual_seed(n)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=device, generator=g)


def test_torch_tensor_round_trip(grt):
    assert grt.has_gpu
    t = grt.open("tutti://kv/3")
    src = random_bytes(MiB)
    dst = torch.full((MiB,), 0xA5, dtype=torch.uint8, device="cuda:0")
    ms, md = grt.register(src), grt.register(dst)
    assert (ms.kind, ms.nbytes) == ("gpu", MiB)
    torch.cuda.synchronize()
    assert grt.submit([tutti.write(t, 0, MiB, ms)]).wait(timeout=10.0)[0].ok
    assert grt.submit([tutti.read(t, 0, MiB, md)]).wait(timeout=10.0)[0].ok
    assert torch.equal(src, dst)
    grt.unregister(ms)
    grt.unregister(md)


def test_float_tensor_counts_bytes_and_refuses_non_contiguous(grt):
    x = torch.zeros((256, 1024), dtype=torch.float16, device="cuda:0")
    assert grt.register(x).nbytes == 256 * 1024 * 2
    with pytest.raises(tutti.MemoryRegistrationError, match="not C-contiguous"):
        grt.register(x.t())


def test_cupy_array_round_trip(grt):
    cupy = pytest.importorskip("cupy")
    t = grt.open("tutti://kv/4")
    src = cupy.arange(MiB, dtype=cupy.uint8)
    dst = cupy.zeros(MiB, dtype=cupy.uint8)
    ms, md = grt.register(src), grt.register(dst)
    cupy.cuda.runtime.deviceSynchronize()
    assert grt.submit([tutti.write(t, 0, MiB, ms)]).wait(timeout=10.0)[0].ok
    assert grt.submit([tutti.read(t, 0, MiB, md)]).wait(timeout=10.0)[0].ok
    assert bool((src == dst).all())


class DlpackOnly:
    """Exposes a tensor through DLPack alone (no CUDA array interface)."""

    def __init__(self, tensor):
        self._t = tensor

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_dlpack_only_object(grt):
    t = grt.open("tutti://kv/5")
    src = random_bytes(MiB)
    dst = torch.zeros(MiB, dtype=torch.uint8, device="cuda:0")
    ms, md = grt.register(DlpackOnly(src)), grt.register(DlpackOnly(dst))
    assert ms.kind == "gpu" and ms.nbytes == MiB
    torch.cuda.synchronize()
    assert grt.submit([tutti.write(t, 0, MiB, ms)]).wait(timeout=10.0)[0].ok
    assert grt.submit([tutti.read(t, 0, MiB, md)]).wait(timeout=10.0)[0].ok
    assert torch.equal(src, dst)
    grt.unregister(ms)  # calls the DLPack deleter
    grt.unregister(md)


def test_tensor_on_another_gpu_is_refused(grt):
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    x = torch.zeros(MiB, dtype=torch.uint8, device="cuda:1")
    with pytest.raises(tutti.MemoryRegistrationError, match="GPU 1"):
        grt.register(x)
    with pytest.raises(tutti.MemoryRegistrationError, match="GPU 1"):
        grt.register(DlpackOnly(x))


def test_kv_put_get_on_cuda_tensors(grt):
    kv = tutti.KvStore.open(grt)
    ks = tutti.ChunkKeys(b"gpu-test").chain(list(range(64)), 16)
    block = 256 * 1024
    src = random_bytes(4 * block)
    dst = torch.zeros(4 * block, dtype=torch.uint8, device="cuda:0")
    ms, md = kv.register(src), kv.register(dst)
    assert ms.kind == "gpu"
    torch.cuda.synchronize()
    st = kv.put_sync([(k, ms, i * block, block) for i, k in enumerate(ks)], timeout=30.0)
    assert all(s.ok for s in st), st
    assert kv.lookup_prefix(ks) == 4
    got = kv.get_sync([(k, md, i * block, block) for i, k in enumerate(ks)], timeout=30.0)
    assert [s.kind for s in got] == ["hit"] * 4
    assert torch.equal(src, dst)
    kv.unregister(ms)
    kv.unregister(md)


def test_cpu_tensor_through_dlpack_is_host_memory():
    with tutti.Runtime.emulated(drives=2, drive_bytes=16 * MiB) as rt:
        x = torch.arange(4096, dtype=torch.uint8)
        m = rt.register(x)
        assert m.kind == "host" and m.nbytes == 4096
        t = rt.open("tutti://kv/0")
        assert rt.submit([tutti.write(t, 0, 4096, m)]).wait()[0].ok
        y = torch.zeros(4096, dtype=torch.uint8)
        assert rt.submit([tutti.read(t, 0, 4096, rt.register(y))]).wait()[0].ok
        assert torch.equal(x, y)


def test_gpu_batch_mixing_memory_regions_is_refused_per_request(grt):
    t0, t1 = grt.open("tutti://kv/0"), grt.open("tutti://kv/1")
    a = torch.zeros(4096, dtype=torch.uint8, device="cuda:0")
    b = torch.zeros(4096, dtype=torch.uint8, device="cuda:0")
    ma, mb = grt.register(a), grt.register(b)
    with pytest.raises(tutti.RequestError, match="one memory region") as e:
        grt.submit([tutti.read(t0, 0, 4096, ma), tutti.read(t1, 0, 4096, mb)])
    assert e.value.statuses[0] is None and e.value.statuses[1].kind == "not_accepted"
    final = e.value.operation.wait(timeout=10.0)
    assert [s.kind for s in final] == ["success", "not_accepted"]


def test_host_numpy_memory_on_a_gpu_runtime(grt):
    np = pytest.importorskip("numpy")
    t = grt.open("tutti://kv/6")
    src = np.arange(MiB, dtype=np.uint32).view(np.uint8)[:MiB].copy()
    dst = np.zeros(MiB, dtype=np.uint8)
    ms, md = grt.register(src), grt.register(dst)
    assert ms.kind == "host"
    assert grt.submit([tutti.write(t, 0, MiB, ms)]).wait(timeout=10.0)[0].ok
    assert grt.submit([tutti.read(t, 0, MiB, md)]).wait(timeout=10.0)[0].ok
    assert np.array_equal(src, dst)


def test_submit_on_a_torch_stream_orders_io_with_the_streams_work(grt):
    t = grt.open("tutti://kv/5")
    buf = torch.zeros(2 * MiB, dtype=torch.uint8, device="cuda:0")
    scratch = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
    m = grt.register(buf)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        scratch.fill_(1)  # queued first: milliseconds of work
        buf[:MiB].fill_(0x5A)  # what the write must see
    op = grt.submit([tutti.write(t, 0, MiB, m)], stream=s)
    assert op.stream is s
    assert op.cuda_event  # the launch's end event, while pending
    with torch.cuda.stream(s):
        buf[:MiB].fill_(0)  # queued after the write: not what it saw
    assert op.wait(timeout=10.0)[0].ok
    assert op.cuda_event is None
    back = grt.submit([tutti.read(t, 0, MiB, m, MiB)], stream=s)
    assert back.wait(timeout=10.0)[0].ok
    s.synchronize()
    assert bool((buf[MiB:] == 0x5A).all()), "the write ran before the work queued ahead of it"
    assert bool((buf[:MiB] == 0).all())
    # The legacy default stream fails the GPU request, per request.
    st = grt.submit([tutti.read(t, 0, 4096, m)], stream=0).wait(timeout=10.0)
    assert st[0].kind == "submit_failed", st[0]
    grt.unregister(m)
