#!/usr/bin/env bash
# The GPU gate (CONTRIBUTING.md): a change to kernels/ or crates/gpu-io
# lands only after every stage below ran on the H200 on that commit.
#
#   tools/gpu-gate.sh build [DIR]          on a machine with cargo (no GPU needed):
#                                          stripped release binaries and the Python
#                                          wheel into DIR (default devbin/gate)
#   tools/gpu-gate.sh run STAGE... [-- DIR] on the GPU machine, from the repository
#                                          root, with DIR carried there
#
# Stages (each prints its own lines; the script's exit status is non-zero
# when any stage failed):
#   ptx        kernels/build.sh --check (needs nvcc)
#   suites     the GPU test suites: gpu-io, CRC32C, runtime, tutti-kv, the
#              load test (every stream on one hardware queue), the Python GPU
#              tests (torch, CuPy)
#   soak       tutti-bench gpu-soak (full sweep), then --short with every CUDA
#              stream on one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1)
#   sanitizer  compute-sanitizer memcheck, racecheck, synccheck on
#              tutti-bench gpu-soak --short --time-scale 10 --one-in-flight
#              (170 s each at most; the tools serialise GPU work, so cells
#              with several batches in flight cannot pass under them)
#   ttft       crates/python/bench/ttft.py at 8,192, 16,384 and 32,768 tokens
#   bench      the headline benchmarks: stripe --gpu (default batch), replay
#              GPU and CPU (default workload, and the Mooncake trace when
#              DIR holds a copy of ../shared/traces/mooncake_conversation_trace.jsonl)
# Logs go to $OUT when set (the device tool's folder), else to DIR/logs.
set -uo pipefail

cmd=${1:-}
shift || true

build() {
    local dir=${1:-devbin/gate}
    mkdir -p "$dir"
    local json
    json=$(mktemp)
    cargo test --release --locked -p gpu-io -p tutti -p tutti-kv --no-run --message-format=json >"$json" || {
        echo "cargo test --no-run failed" >&2
        return 1
    }
    # Test binaries by crate folder and test target.
    python3 - "$dir" "$json" <<'PY'
import json, shutil, sys
import os
# (crate folder, test target) -> name in DIR
want = {("gpu-io", "gpu"): "gpuio-gpu", ("gpu-io", "crc32c"): "gpuio-crc",
        ("runtime", "gpu"): "rt-gpu", ("kv", "gpu"): "kv-gpu", ("kv", "gpu_load"): "kv-gpu-load"}
for line in open(sys.argv[2]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    crate = os.path.basename(os.path.dirname(m["manifest_path"]))
    name = want.get((crate, m["target"]["name"]))
    if name:
        shutil.copy(m["executable"], f"{sys.argv[1]}/{name}")
PY
    cargo build --release --locked -p tutti-bench || return 1
    cp target/release/tutti-bench "$dir/"
    strip "$dir"/* 2>/dev/null
    local venv=target/py-venv
    [ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q maturin==1.16.0; } || return 1
    rm -rf "$dir/wheels"
    (cd crates/python && VIRTUAL_ENV="$PWD/../../$venv" PATH="$PWD/../../$venv/bin:$PATH" \
        maturin build --release --strip --compatibility linux -o "../../$dir/wheels") || return 1
    if [ -f ../shared/traces/mooncake_conversation_trace.jsonl ]; then
        cp ../shared/traces/mooncake_conversation_trace.jsonl "$dir/"
    fi
    git rev-parse HEAD > "$dir/COMMIT"
    ls -la "$dir" "$dir/wheels"
}

run() {
    local stages=() dir=devbin/gate
    while [ $# -gt 0 ]; do
        if [ "$1" = "--" ]; then dir=$2; break; fi
        stages+=("$1")
        shift
    done
    local B
    B=$(cd "$dir" && pwd)
    local logs=${OUT:-$B/logs}
    mkdir -p "$logs"
    export PYTHONUNBUFFERED=1
    echo "gate: binaries of commit $(cat "$B/COMMIT" 2>/dev/null), tree at $(git rev-parse HEAD 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    local failed=0
    for s in "${stages[@]}"; do
        echo "== stage $s"
        "stage_$s" "$B" "$logs" || { echo "== stage $s FAILED"; failed=1; }
    done
    return $failed
}

wheel_on_path() {
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/gate-site "$1"/wheels/*.whl &&
        export PYTHONPATH=/tmp/gate-site
}

stage_ptx() { kernels/build.sh --check; }

stage_suites() {
    local B=$1 L=$2 rc=0
    for t in gpuio-gpu gpuio-crc rt-gpu kv-gpu kv-gpu-load; do
        "$B/$t" --test-threads=1 --nocapture >"$L/$t.log" 2>&1 || rc=1
        grep -E "^test result|panicked|^cell|worst" "$L/$t.log" | sed "s/^/$t: /"
    done
    wheel_on_path "$B" || return 1
    python3 -m pytest -q crates/python/tests/test_gpu.py crates/python/tests/test_engine_torch.py \
        crates/python/tests/test_transformers.py crates/python/tests/test_transformers_attention.py \
        crates/python/tests/test_vllm.py crates/python/tests/test_staging.py >"$L/pytest-gpu.log" 2>&1 || rc=1
    tail -3 "$L/pytest-gpu.log"
    return $rc
}

stage_soak() {
    local rc=0
    "$1/tutti-bench" gpu-soak --json "$2/gpu-soak.json" >"$2/gpu-soak.log" 2>&1 || rc=1
    grep -E "FAIL|HANG|^gpu-soak:" "$2/gpu-soak.log"
    # Every stream on one hardware queue: a GPU-side wait for an I/O kernel shows at once.
    CUDA_DEVICE_MAX_CONNECTIONS=1 "$1/tutti-bench" gpu-soak --short >"$2/gpu-soak-1queue.log" 2>&1 || rc=1
    grep -E "FAIL|HANG|^gpu-soak:" "$2/gpu-soak-1queue.log" | sed "s/^/1 hardware queue: /"
    return $rc
}

stage_sanitizer() {
    local B=$1 L=$2 rc=0
    for tool in ${GATE_SANITIZERS:-memcheck racecheck synccheck}; do
        timeout 170 compute-sanitizer --tool "$tool" --error-exitcode 9 "$B/tutti-bench" gpu-soak --short \
            --time-scale 10 --one-in-flight >"$L/sanitizer-$tool.log" 2>&1 || rc=1
        echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^gpu-soak:" "$L/sanitizer-$tool.log" | tr '\n' ' ')"
    done
    return $rc
}

stage_ttft() {
    wheel_on_path "$1" || return 1
    python3 crates/python/bench/ttft.py --tokens 8192,16384,32768 --variants recompute,tutti,pinned \
        --reps "${GATE_TTFT_REPS:-3}" --warmup 1 --dir /var/tmp/ttft-files --out "$2/ttft.json" --deadline 480 >"$2/ttft.log" 2>&1
    local rc=$?
    python3 - "$2/ttft.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for n, run in d.get("runs", {}).items():
    for v, r in run.get("variants", {}).items():
        keep = {k: r[k] for k in r if not isinstance(r[k], list)}
        print(n, v, json.dumps(keep))
    print(n, "ratios", json.dumps(d.get("ratios", {}).get(n)))
print("store", json.dumps(d.get("store_stats")))
PY
    return $rc
}

stage_bench() {
    local B=$1 L=$2 G="--drive-iops 1500000 --latency-us 80 --seconds 1 --drive-mb-s 7000"
    "$B/tutti-bench" stripe $G --gpu 2>&1 | tee "$L/stripe-gpu.log" | tail -5
    "$B/tutti-bench" stripe $G 2>&1 | tee "$L/stripe-cpu.log" | tail -5
    "$B/tutti-bench" replay --gpu 2>&1 | tee "$L/replay-gpu.log" | grep -E "save|load|verified|elapsed"
    "$B/tutti-bench" replay 2>&1 | tee "$L/replay-cpu.log" | grep -E "save|load|verified|elapsed"
    # The trace: copied into DIR (../shared does not travel), or shared/ in the tree.
    local trace=$B/mooncake_conversation_trace.jsonl
    [ -f "$trace" ] || trace=shared/traces/mooncake_conversation_trace.jsonl
    if [ -f "$trace" ]; then
        "$B/tutti-bench" replay --gpu --trace "$trace" --requests 300 2>&1 | tee "$L/trace-gpu.log" | grep -E "save |load |verified"
        "$B/tutti-bench" replay --trace "$trace" --requests 300 2>&1 | tee "$L/trace-cpu.log" | grep -E "save |load |verified"
    fi
}

case "$cmd" in
    build) build "$@" ;;
    run) run "$@" ;;
    *)
        sed -n 2,28p "$0"
        exit 2
        ;;
esac
