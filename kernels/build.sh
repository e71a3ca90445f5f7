#!/usr/bin/env bash
# Rebuilds the committed PTX from its CUDA source. Needs nvcc (CUDA 12 or
# 13); run it on the GPU machine. The first line of each PTX records the
# SHA-256 of the source it was built from (with the local headers it
# includes); `cargo test -p gpu-io` fails when the committed PTX is older
# than its source.
#
#   kernels/build.sh           rebuild
#   kernels/build.sh --check   rebuild into a temporary file and fail if the
#                              committed PTX differs (stale or hand-edited)
set -euo pipefail
cd "$(dirname "$0")"
# compute_75 (Turing): the oldest target CUDA 13 still accepts; the kernels
# need sm_70 or later for __nanosleep and %globaltimer. The driver
# JIT-compiles them for the GPU at hand (sm_90 on an H200).
ARCH=${ARCH:-compute_75}
build() {
    local src=$1 out=$2
    local sum
    # The source and the local headers it includes (`#include "..."`), in
    # the order it names them: a header edit makes the PTX stale too.
    sum=$(cat "$src" $(sed -n 's/^#include "\(.*\)"$/\1/p' "$src") | sha256sum | cut -d' ' -f1)
    {
        echo "// tutti source sha256: $sum"
        nvcc -arch="$ARCH" -O3 -ptx "$src" -o -
    } > "$out"
}
for src in *.cu; do
    ptx=${src%.cu}.ptx
    if [ "${1:-}" = "--check" ]; then
        tmp=$(mktemp)
        build "$src" "$tmp"
        if ! diff -q <(tail -n +2 "$tmp" | grep -v '^//') <(tail -n +2 "$ptx" | grep -v '^//') >/dev/null \
            || [ "$(head -1 "$tmp")" != "$(head -1 "$ptx")" ]; then
            echo "kernels/$ptx is stale: rebuild with kernels/build.sh" >&2
            exit 1
        fi
        rm -f "$tmp"
        echo "kernels/$ptx is up to date"
    else
        build "$src" "$ptx"
        echo "built kernels/$ptx"
    fi
done
