"""bench/ttft.py, the TTFT benchmark, as a smoke test: the small float32
model on CPU with short prompts. Every variant must run, take positive
time, restore the whole cached prefix, and give the first token's logits
that a full prefill gives. Skipped without torch and transformers (CI has
neither)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "ttft.py")
VARIANTS = ["recompute", "tutti", "posix_pinned", "posix_pageable", "pinned"]
CHUNK = 16
LENGTHS = [40, 64]  # prefixes of 32 and 48 tokens: 2 and 3 chunks cached, 8 and 16 tokens prefilled


def test_small_cpu_run_reports_every_variant_with_matching_logits(tmp_path):
    out = tmp_path / "ttft.json"
    cmd = [
        sys.executable, BENCH, "--model", "small", "--device", "cpu",
        "--tokens", ",".join(map(str, LENGTHS)), "--chunk-tokens", str(CHUNK),
        "--reps", "2", "--warmup", "1", "--timeout", "60",
        "--dir", str(tmp_path / "files"), "--out", str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    report = json.loads(p.stdout)
    assert json.loads(out.read_text()) == report
    assert report["config"]["device"] == "cpu" and report["config"]["dtype"] == "float32"
    assert report["config"]["drive_timing"] == {"bandwidth_mb_s": 7000, "iops": 1500000, "latency_us": 80}
    for n in LENGTHS:
        run = report["runs"][str(n)]
        prefix = ((n - 1) // CHUNK) * CHUNK
        assert (run["prefix_tokens"], run["rest_tokens"]) == (prefix, n - prefix)
        # 2 layers x 2 (K, V) x 2 KV heads x 16 dims x 4 bytes per token.
        assert run["prefix_bytes"] == prefix * 2 * 2 * 2 * 16 * 4
        assert set(run["variants"]) == set(VARIANTS)
        for name, v in run["variants"].items():
            assert v["status"] == "ok", (n, name, v)
            assert v["reps"] == 2 and len(v["ttft_s"]) == 2
            assert all(t > 0 for t in v["ttft_s"]), (name, v["ttft_s"])
            assert v["ttft_median_s"] > 0 and v["rest_prefill_median_s"] > 0
            if name == "recompute":
                assert v["restore_median_s"] < v["ttft_median_s"]
                continue
            assert v["restored_tokens"] == prefix
            assert v["restore_median_s"] > 0
            assert v["logits_allclose"] is True, (name, v["logits_max_abs_diff"])
            assert v["logits_max_abs_diff"] < 1e-4
            assert v["argmax_equal"] is True
        assert run["variants"]["tutti"]["save"]["stored_tokens"] == prefix
        assert run["variants"]["tutti"]["save"]["failures"] == []
        r = report["ratios"][str(n)]
        for k in ("tutti_over_recompute", "tutti_over_posix_pinned", "tutti_over_posix_pageable", "tutti_over_pinned_scaled"):
            assert r[k] is not None and r[k] > 0, (k, r)
        assert set(r["goals"]) == {"tutti_at_most_0.15x_recompute", "tutti_faster_than_posix_pinned", "tutti_within_1.2x_pinned_scaled"}
    # The tutti store holds both prompts' prefixes: (2 + 3) chunks x 2 layers.
    assert report["store_stats"]["objects"] == (2 + 3) * 2


def test_a_variant_that_times_out_is_reported_not_waited_for(tmp_path):
    """A one-millisecond limit per repetition: the slow variants come back
    as "timeout" in the JSON, and the process still ends (exit status 3
    when a worker thread was left running, 1 otherwise)."""
    cmd = [
        sys.executable, BENCH, "--model", "small", "--device", "cpu", "--tokens", "40",
        "--chunk-tokens", str(CHUNK), "--reps", "1", "--warmup", "0", "--timeout", "0.001",
        "--variants", "recompute,pinned", "--dir", str(tmp_path / "files"),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode in (1, 3), p.stdout[-4000:] + p.stderr[-4000:]
    report = json.loads(p.stdout)
    statuses = {k: v["status"] for k, v in report["runs"]["40"]["variants"].items()}
    assert set(statuses) == {"recompute", "pinned"}
    assert "timeout" in statuses.values(), statuses
    assert all(s in ("ok", "timeout") for s in statuses.values()), statuses
