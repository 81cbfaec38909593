#!/bin/sh
# Sleep mode's cost on simcuda (examples/sleep_bench.c): pause/resume time per GiB and backup
# throughput against a plain pinned cudaMemcpy in the same run. Usage:
#   scripts/sleep-bench.sh [MiB] [profile dir: debug|release] [rounds, default 5]   (after cargo build -p cushim-shim -p simcuda)
# SIMCUDA_LATENCY is passed through (a latency model, not a GPU measurement).
set -eu
cd "$(dirname "$0")/.."
mib="${1:-1024}"
dir="target/${2:-debug}"
lib=$(mktemp -d)
trap 'rm -rf "$lib"' EXIT
cp "$dir/libsimcuda.so" "$lib/libcudart.so"
ln -s libcudart.so "$lib/libcudart.so.12"
ln -s libcudart.so "$lib/libcuda.so.1"
ln -s libcudart.so "$lib/libcuda.so"
cc -O2 -I simcuda/include examples/sleep_bench.c -o "$lib/sleep_bench" -L "$lib" -lcudart -ldl
SIMCUDA_MEM_MB=$((mib * 2 + 1024)) SIMCUDA_HOST_MEM_MB=$((mib * 4 + 1024)) \
CUSHIM_ALLOC_CONF=sleep_mode:True LD_LIBRARY_PATH="$lib" LD_PRELOAD="$PWD/$dir/libcushim.so" \
    "$lib/sleep_bench" "$mib" "${3:-5}"
