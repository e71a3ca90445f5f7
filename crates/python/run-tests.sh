#!/usr/bin/env bash
# Builds the Python extension (debug profile) into a virtual environment and
# runs the pytest suite of crates/python/tests against emulated drives.
#
#   crates/python/run-tests.sh [pytest args...]
#
# TUTTI_PY_VENV: the virtual environment (default <repo>/target/py-venv),
#   created when missing; PYTHON: the interpreter that creates it (python3).
# The extension is built by maturin into the workspace's target directory
# (CARGO_TARGET_DIR when set). GPU tests (tests/test_gpu.py) skip without
# torch and a CUDA GPU.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${TUTTI_PY_VENV:-$repo/target/py-venv}"
python="${PYTHON:-python3}"

# Pinned test tools; each has wheels for CPython 3.9 through 3.12.
maturin_pin="maturin==1.16.0"
pytest_pin="pytest==8.3.5"
numpy_pin="numpy==2.0.2"
# The vLLM connector maps a store to its drives' files with PyYAML (vLLM
# depends on it; locks.py has a coarser fallback without it).
pyyaml_pin="pyyaml==6.0.2"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating $venv" >&2
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$maturin_pin" "$pytest_pin" "$numpy_pin" "$pyyaml_pin"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
(
    cd "$here"
    VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --quiet
)

cd "$repo"
exec "$venv/bin/python" -m pytest crates/python/tests -q "$@"
