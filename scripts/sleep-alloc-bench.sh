#!/bin/sh
# A cached allocation in sleep mode against the plain cache (examples/sleep_alloc_bench.c):
# the time per cudaMalloc+cudaFree pair and the driver calls of the whole run, with
# CUSHIM_ALLOC_CONF unset and with sleep_mode:True. Usage:
#   scripts/sleep-alloc-bench.sh [pairs] [profile dir: debug|release]   (after cargo build -p cushim-shim -p simcuda)
set -eu
cd "$(dirname "$0")/.."
pairs="${1:-1000000}"
dir="target/${2:-debug}"
lib=$(mktemp -d)
trap 'rm -rf "$lib"' EXIT
cp "$dir/libsimcuda.so" "$lib/libcudart.so"
ln -s libcudart.so "$lib/libcudart.so.12"
ln -s libcudart.so "$lib/libcuda.so.1"
ln -s libcudart.so "$lib/libcuda.so"
cc -O2 -I simcuda/include examples/sleep_alloc_bench.c -o "$lib/bench" -L "$lib" -lcudart
for conf in "" "sleep_mode:True"; do
    printf '%-16s ' "${conf:-plain cache}"
    CUSHIM_ALLOC_CONF="$conf" SIMCUDA_REPORT="$lib/r.json" LD_LIBRARY_PATH="$lib" \
        LD_PRELOAD="$PWD/$dir/libcushim.so" "$lib/bench" "$pairs" | tr -d '\n'
    python3 -c 'import json,sys
c = json.load(open(sys.argv[1]))["calls"]
names = ["cuMemAlloc_v2", "cuMemFree_v2", "cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate",
         "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuCtxSynchronize"]
print("  driver allocation calls %d" % sum(c.get(n, 0) for n in names))' "$lib/r.json"
done
