"""LMCache's L2 adapter contract (lmcache/v1/distributed/l2_adapters/
base.py) for tutti's adapter over tutti-kv, on emulated drives: loaded by
LMCache's plugin factory from its module path, store / lookup-and-lock /
load through event fds and task ids, bytes read back equal, per-key misses,
a drive fault that clears a load's bit, objects surviving a new runtime on
the same drives. Skipped without LMCache and torch (TUTTI_LMCACHE_REQUIRED=1
makes that a failure: crates/python/tests/lmcache/run.sh)."""

from __future__ import annotations

import os
import select

import pytest

import tutti
from conftest import one_drive_yaml

if os.environ.get("TUTTI_LMCACHE_REQUIRED") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")
    pytest.importorskip("lmcache.v1.distributed.l2_adapters.plugin_l2_adapter")

import tutti.lmcache as tl  # noqa: E402
from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import PluginL2AdapterConfig, _create_plugin_adapter  # noqa: E402
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj  # noqa: E402
from tutti.lmcache.l2 import TuttiL2Adapter, TuttiL2AdapterConfig, object_key_bytes  # noqa: E402

KiB = 1 << 10
OBJ = 64 * KiB


def key(i: int, salt: str = "") -> ObjectKey:
    return ObjectKey(chunk_hash=i.to_bytes(8, "little") * 4, model_name="m/x", kv_rank=0, cache_salt=salt)


def obj(t: "torch.Tensor") -> TensorMemoryObj:
    meta = MemoryObjMetadata(shape=t.shape, dtype=t.dtype, address=0, phy_size=t.numel() * t.element_size(), ref_count=1)
    return TensorMemoryObj(raw_data=t, metadata=meta, parent_allocator=None)


def payload(n: int, seed: int) -> "torch.Tensor":
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def wait_fd(fd: int, timeout: float = 10.0) -> None:
    r, _, _ = select.select([fd], [], [], timeout)
    assert r, "the event fd was not signalled"
    os.read(fd, 8)  # eventfd: reset the counter


def bits(bitmap, n: int):
    return [bool(bitmap.test(i)) for i in range(n)]


@pytest.fixture
def rt():
    with tutti.Runtime.emulated(drives=2, drive_bytes=64 << 20, slot_bytes=1 << 20) as r:
        tl.set_runtime(r)
        yield r
        tl.set_runtime(None)


def store(adapter, keys, objs) -> int:
    tid = adapter.submit_store_task(keys, objs)
    wait_fd(adapter.get_store_event_fd())
    done = adapter.pop_completed_store_tasks()
    assert list(done) == [tid]
    return done[tid]


def test_plugin_factory_builds_it_from_its_module_path(rt):
    cfg = PluginL2AdapterConfig.from_dict({"type": "plugin", "module_path": "tutti.lmcache.l2",
                                           "class_name": "TuttiL2Adapter", "adapter_params": {"store": "kv", "timeout_s": 10}})
    a = _create_plugin_adapter(cfg)
    assert isinstance(a, TuttiL2Adapter) and isinstance(a._config, TuttiL2AdapterConfig)
    fds = {a.get_store_event_fd(), a.get_lookup_and_lock_event_fd(), a.get_load_event_fd()}
    assert len(fds) == 3
    assert a.report_status()["is_healthy"] is True
    a.close()
    for bad in [{"store": ""}, {"timeout_s": 0}, {"max_capacity_bytes": -1}]:
        with pytest.raises(tutti.ConfigError):
            TuttiL2AdapterConfig.from_dict(bad)


def test_store_lookup_load_read_back_the_bytes(rt):
    a = TuttiL2Adapter({"store": "kv"})
    keys = [key(i) for i in range(4)]
    srcs = [payload(OBJ - 100 * i, i) for i in range(4)]  # sizes not whole blocks
    result = store(a, keys[:3], [obj(t) for t in srcs[:3]])
    assert result.is_successful() and result.bytes_transferred() == sum(t.numel() for t in srcs[:3])
    assert a.get_usage().total_bytes_used == result.bytes_transferred()
    tid = a.submit_lookup_and_lock_task(keys, {})
    wait_fd(a.get_lookup_and_lock_event_fd())
    found = a.query_lookup_and_lock_result(tid)
    assert bits(found, 4) == [True, True, True, False]
    assert a.query_lookup_and_lock_result(tid) is None  # reported once
    dsts = [torch.full((OBJ,), 0xA5, dtype=torch.uint8)[: t.numel()].clone() for t in srcs]
    tid = a.submit_load_task(keys, [obj(t) for t in dsts])
    wait_fd(a.get_load_event_fd())
    loaded = a.query_load_result(tid)
    assert bits(loaded, 4) == [True, True, True, False]
    for s, d in zip(srcs[:3], dsts[:3]):
        assert torch.equal(s, d)
    assert bool((dsts[3] == 0xA5).all()), "a miss must leave its buffer alone"
    a.submit_unlock(keys[:3])
    a.delete(keys[:1])
    assert a.get_usage().total_bytes_used == result.bytes_transferred() - srcs[0].numel()
    a.close()


def test_keys_differ_by_every_field():
    base = object_key_bytes(key(1), 32)
    assert len(base) == 32 and len(object_key_bytes(key(1), 16)) == 16
    others = [key(2), key(1, salt="u"), ObjectKey(chunk_hash=key(1).chunk_hash, model_name="m/y", kv_rank=0),
              ObjectKey(chunk_hash=key(1).chunk_hash, model_name="m/x", kv_rank=1),
              ObjectKey(chunk_hash=key(1).chunk_hash, model_name="m/x", kv_rank=0, object_group_id=1)]
    assert len({base, *[object_key_bytes(k, 32) for k in others]}) == 6


def test_a_slow_drive_clears_the_loads_bit_and_a_refused_store_fails_the_task():
    import time

    with tutti.Runtime.from_yaml(one_drive_yaml(faults="- { op: read, action: { delay_us: 300000 } }")) as r:
        a = TuttiL2Adapter(TuttiL2AdapterConfig(timeout_s=0.05), kv=tutti.KvStore.open(r))
        assert store(a, [key(1)], [obj(payload(OBJ, 1))]).is_successful()
        # An object larger than a slot cannot be stored: the whole task fails.
        big = store(a, [key(2), key(3)], [obj(payload(OBJ, 2)), obj(payload(2 << 20, 3))])
        assert not big.is_successful() and big.bytes_transferred() == 0
        dst = torch.zeros(OBJ, dtype=torch.uint8)
        tid = a.submit_load_task([key(1)], [obj(dst)])
        wait_fd(a.get_load_event_fd())
        assert bits(a.query_load_result(tid), 1) == [False], "a timed-out get must not count as loaded"
        time.sleep(0.5)  # the drive finishes before the runtime shuts down
        a.close()


def test_objects_survive_a_new_runtime_on_the_same_drives(tmp_path):
    yaml = one_drive_yaml(backing="{ file: " + str(tmp_path / "d0.img") + " }", capacity="32MiB")
    src = payload(OBJ, 9)
    with tutti.Runtime.from_yaml(yaml) as r:
        a = TuttiL2Adapter(TuttiL2AdapterConfig(), kv=tutti.KvStore.open(r))
        assert store(a, [key(7)], [obj(src)]).is_successful()
        a.close()
        del a
    with tutti.Runtime.from_yaml(yaml) as r:
        a = TuttiL2Adapter(TuttiL2AdapterConfig(), kv=tutti.KvStore.open(r, create="never"))
        dst = torch.zeros(OBJ, dtype=torch.uint8)
        tid = a.submit_load_task([key(7), key(8)], [obj(dst), obj(torch.zeros(OBJ, dtype=torch.uint8))])
        wait_fd(a.get_load_event_fd())
        assert bits(a.query_load_result(tid), 2) == [True, False]
        assert torch.equal(dst, src)
        a.close()
