#!/usr/bin/env bash
# tutti under LMCache: the GDS backend's contract tests
# (test_lmcache_gds.py on CPU; test_lmcache_gds_cuda.py, which skips
# without a CUDA GPU), the L2 adapter's (test_lmcache_l2.py) and the
# benchmark's smoke test (test_lmcache_bench.py), against LMCache 0.5.6
# from the package index. Makes its own virtual environment, installs what
# it needs, builds tutti into it, runs pytest (extra arguments go to it).
#
#   crates/python/tests/lmcache/run.sh [pytest args...]
#
# TUTTI_LMCACHE_VENV: the virtual environment (default
#   <repo>/target/lmcache-venv), created when missing; PYTHON: the
#   interpreter that creates it (python3, 3.10 to 3.13: LMCache's wheels).
#   Needs about 5.3 GiB of disk (torch with its CUDA libraries).
#
# Measured on the 2-core CPU machine (shared, under load), 2026-12-04: a
# cold run (new environment) 349 s to install, then about 2 min to build
# tutti and run the tests; a warm run (environment in place) about 2 min.
#
# What is installed, and why this way: LMCache 0.5.6 (the newest on PyPI)
# is built against torch 2.13 (its lmcache.cuda_ops loads with
# torch==2.13.0+cu130 and not with 2.11); PyPI's default Linux torch wheel is
# the CUDA build, which imports on a machine without a GPU. LMCache is
# installed with --no-deps: its declared requirements pull in dozens of
# packages (fastapi, grpcio, redis, cupy-cuda13x, ...) these paths never
# import; requirements.txt has those they do.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
venv="${TUTTI_LMCACHE_VENV:-$repo/target/lmcache-venv}"
python="${PYTHON:-python3}"

torch_pin="torch==2.13.0"
lmcache_pin="lmcache==0.5.6"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating $venv" >&2
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# Installed once per environment: a stamp names what was installed.
stamp="$venv/.tutti-lmcache-installed"
want="$torch_pin $lmcache_pin $(sha256sum "$here/requirements.txt" | cut -c1-16)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    start=$SECONDS
    "${pip[@]}" "$torch_pin"
    "${pip[@]}" -r "$here/requirements.txt"
    "${pip[@]}" --no-deps "$lmcache_pin"
    echo "$want" > "$stamp"
    echo "installed in $((SECONDS - start)) s" >&2
fi

# tutti itself, built from this checkout (debug profile, as run-tests.sh).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
(
    cd "$repo/crates/python"
    VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --quiet
)

# A skip for a missing LMCache or torch is a failure here.
export TUTTI_LMCACHE_REQUIRED=1
# GPU runs: a copy queued behind a running I/O kernel must not share the
# emulator's hardware queue (docs/gpu.md).
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}"
cd "$repo"
exec "$venv/bin/python" -m pytest -q \
    crates/python/tests/test_lmcache_gds.py \
    crates/python/tests/test_lmcache_gds_cuda.py \
    crates/python/tests/test_lmcache_l2.py \
    crates/python/tests/test_lmcache_bench.py \
    "$@"
