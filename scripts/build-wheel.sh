#!/bin/sh
# Build the cushim wheel into target/wheels with maturin (bin bindings); the same wheel
# `pip wheel .` builds. The `cushim` binary carries the shim and simcuda (tools/build.rs builds
# them inside the build), so there is nothing to prepare first.
# Usage: scripts/build-wheel.sh [cargo profile] (default release; `dev` is a debug build that
# still embeds the libraries). MATURIN names the maturin to run.
set -eu
cd "$(dirname "$0")/.."
profile="${1:-release}"
maturin="${MATURIN:-maturin}"
CUSHIM_EMBED_LIBS=1 "$maturin" build --profile "$profile" --out target/wheels
