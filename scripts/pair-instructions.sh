#!/usr/bin/env bash
# Instructions per cached cudaMalloc+cudaFree pair through the preloaded shim on simcuda,
# counted by callgrind: the difference between runs of 200,000 and 100,000 pairs, divided
# by 100,000 (so start-up and exit cancel out). Needs valgrind and a release build
# (`cargo build --release -p cushim-shim -p simcuda`).
#
# usage: scripts/pair-instructions.sh [SIZE...]     (default: 512 1048576 67108864)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rel="$root/target/release"
lib="$rel/simcuda-lib"
[ -e "$rel/libcushim.so" ] && [ -e "$rel/libsimcuda.so" ] ||
    { echo "run 'cargo build --release -p cushim-shim -p simcuda' first" >&2; exit 1; }
# simcuda laid out as a CUDA installation in $lib (as `cushim run --sim` does).
mkdir -p "$lib"
for n in libcuda.so libcuda.so.1 libcudart.so libcudart.so.12; do
    [ -e "$lib/$n" ] || ln -s ../libsimcuda.so "$lib/$n"
done
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -I"$root/simcuda/include" "$root/examples/pair_loop.c" -o "$work/pair_loop" -L"$lib" -lcudart
count() { # size n -> total instructions
    LD_LIBRARY_PATH="$lib" LD_PRELOAD="$rel/libcushim.so" valgrind --tool=callgrind \
        --callgrind-out-file="$work/cg.out" "$work/pair_loop" "$1" "$2" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(512 1048576 67108864)
for size in "${sizes[@]}"; do
    a=$(count "$size" 100000)
    b=$(count "$size" 200000)
    echo "size=$size instructions_per_pair=$(( (b - a) / 100000 ))"
done
