#!/bin/sh
# Build the cushim wheel into target/wheels: the shim and simcuda first (cargo), laid out as
# the wheel's data (installed into <prefix>/lib/cushim), then the `cushim` binary and the
# wheel itself (maturin, bin bindings). Usage: scripts/build-wheel.sh [cargo profile]
# (default release; `dev` reuses a debug build). MATURIN names the maturin to run.
set -eu
cd "$(dirname "$0")/.."
profile="${1:-release}"
case "$profile" in
    dev) dir=debug ;;
    *) dir="$profile" ;;
esac
maturin="${MATURIN:-maturin}"
# The same package set as the tests' build, so that neither relinks the other's shim.
cargo build --profile "$profile" -p cushim-shim -p simcuda -p cushim-tools
data=target/wheel-data/data/lib/cushim
rm -rf target/wheel-data
mkdir -p "$data"
cp "target/$dir/libcushim.so" "target/$dir/libsimcuda.so" "$data/"
# The Python module (`import cushim`: sleep mode through ctypes), installed as pure Python.
mkdir -p target/wheel-data/purelib
cp -r python/cushim target/wheel-data/purelib/
"$maturin" build --profile "$profile" --out target/wheels
