"""bench/lmcache_bench.py as a smoke test: the small float32 model on CPU
with short prompts, tutti's variant through LMCache's GDS context with the
"tutti" backend (execution: cpu), LMCache's disk and CPU backends. Every
variant must run, restore the whole prefix, and give the first token's
logits a full prefill gives (tutti's staging buffer is overwritten before
every restore, so a read that moved nothing fails). Skipped without torch,
transformers and LMCache (crates/python/tests/lmcache/run.sh has them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

if os.environ.get("TUTTI_LMCACHE_REQUIRED") != "1":
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("lmcache.v1.storage_backend.local_disk_backend")

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "lmcache_bench.py")
VARIANTS = ["recompute", "lmcache_tutti", "lmcache_disk", "lmcache_cpu"]
CHUNK = 16
LENGTHS = [40, 64]  # prefixes of 32 and 48 tokens: 2 and 3 objects


def test_small_cpu_run_reports_every_variant_with_matching_logits(tmp_path):
    out = tmp_path / "lmcache.json"
    cmd = [
        sys.executable, BENCH, "--model", "small", "--device", "cpu",
        "--tokens", ",".join(map(str, LENGTHS)), "--chunk-tokens", str(CHUNK),
        "--reps", "2", "--warmup", "1", "--timeout", "60",
        "--dir", str(tmp_path / "disk"), "--out", str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    report = json.loads(p.stdout)
    assert json.loads(out.read_text()) == report
    cfg = report["config"]
    assert (cfg["device"], cfg["dtype"], cfg["execution"], cfg["lmcache"]) == ("cpu", "float32", "cpu", "0.5.6")
    # KV_2LTD objects: 2 (K, V) x 2 layers x 16 tokens x (2 heads x 16 dims) x 4 bytes.
    assert cfg["object_bytes"] == 2 * 2 * CHUNK * 32 * 4
    assert os.listdir(tmp_path / "disk"), "LMCache's disk backend wrote no files"
    for n in LENGTHS:
        run = report["runs"][str(n)]
        prefix = ((n - 1) // CHUNK) * CHUNK
        assert (run["prefix_tokens"], run["rest_tokens"]) == (prefix, n - prefix)
        assert set(run["variants"]) == set(VARIANTS)
        for name, v in run["variants"].items():
            assert v["status"] == "ok", (n, name, v)
            assert v["reps"] == 2 and all(t > 0 for t in v["ttft_s"])
            if name == "recompute":
                continue
            assert v["restored_tokens"] == prefix and v["restore_median_s"] > 0
            assert v["logits_allclose"] is True and v["logits_max_abs_diff"] < 1e-4, (name, v)
            assert v["argmax_equal"] is True
        assert set(report["ratios"][str(n)]) >= {"tutti_over_disk", "tutti_over_cpu_scaled", "goals"}


def _bench_module():
    sys.path.insert(0, os.path.dirname(BENCH))
    import lmcache_bench

    return lmcache_bench


def test_a_first_token_that_differs_fails_the_run_even_when_every_transfer_succeeded(capsys):
    bench = _bench_module()
    good = {"status": "ok", "argmax_equal": True, "logits_max_abs_diff": 0.01}
    report = {"runs": {"64": {"variants": {"recompute": {"status": "ok"}, "lmcache_tutti": dict(good)}}}}
    assert bench.verdict(report) == 0
    report["runs"]["64"]["variants"]["lmcache_tutti"].update(argmax_equal=False, logits_max_abs_diff=8.2)
    assert bench.verdict(report) == 1
    assert "64 tokens, lmcache_tutti: first token differs" in capsys.readouterr().err
    report["runs"]["64"]["variants"]["lmcache_tutti"] = dict(good, status="timeout")
    assert bench.verdict(report) == 1


def test_read_back_check_finds_every_object_equal(tmp_path):
    check = os.path.join(os.path.dirname(BENCH), "lmcache_check.py")
    cmd = [sys.executable, check, "--device", "cpu", "--tokens", "64,256", "--chunk-tokens", "16", "--object-mib", "1",
           "--drives-dir", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    runs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{\"run\"")]
    assert [r["objects"] for r in runs] == [3, 15]
    assert all(r["wrong_objects"] == 0 for r in runs)
    assert runs[1]["slab_first"] == runs[0]["slab_end"]


def test_read_back_check_names_a_wrong_page_and_where_its_bytes_came_from():
    import torch

    sys.path.insert(0, os.path.dirname(BENCH))
    import lmcache_check

    want = lmcache_check.pattern(2, 4 * 4096, torch.device("cpu"))
    got = want.clone()
    got[4096:8192] = lmcache_check.pattern(1, 8192, torch.device("cpu"))[4096:]  # run 1's bytes 4096..8191
    d = lmcache_check.describe(got, want, obj=1 << 20)
    assert d["bad_pages"] == 1
    assert d["first"][0]["page"] == 1
    assert (d["first"][0]["got_run"], d["first"][0]["got_offset"]) == (1, 4096)
    assert d["first"][0]["want_offset"] == (1 << 20) + 4096
