#!/usr/bin/env bash
# gpu-check.sh: check cushim end to end on one machine in one run (< 8 minutes), writing
# every log and number to RESULTS_DIR and printing a short table at the end.
#
#   scripts/gpu-check.sh RESULTS_DIR          # real NVIDIA GPU: nvcc, nvidia-smi, PyTorch
#   scripts/gpu-check.sh RESULTS_DIR --sim    # here, on simcuda: cc instead of nvcc, no torch
#
# The GPU machine needs no network and no Rust: copy this repository (its examples/,
# tests/c/, scripts/ and shim/include/) together with the files built here:
#   target/release/libcushim.so   (the shim; override with CUSHIM_LIB=/path/libcushim.so)
# Snapshots are read with python3 (scripts/snapinfo.py, standard library only).
# For --sim the default is target/release if it holds libcushim.so, else target/debug, and
# libsimcuda.so is taken from the same directory (SIMCUDA_SO=/path/libsimcuda.so).
#
# Steps (each under `timeout`, STEP_TIMEOUT seconds, default 120; no new step starts after
# BUDGET_S seconds, default 420, and no step runs past HARD_S, default 465, so the whole run
# stays under 8 minutes):
#  1. compile examples/demo.c, tests/c/shim_frag.c, examples/bench_alloc.c and
#     examples/bench_frag.c with `nvcc -cudart shared` and with nvcc's default static cudart
#     (--sim: `cc` against simcuda/include; the static variant links simcuda/static, the
#     stand-in for libcudart_static.a that reaches the driver only via cuGetProcAddress);
#  2. run each without and with LD_PRELOAD of the shim: exit status, wall time, whether the
#     output matches, and whether the shim intercepted (the shim writes an exit snapshot,
#     CUSHIM_SNAPSHOT, and scripts/snapinfo.py reads its segments, events and allocation
#     count; a static cudart is caught at the driver layer: cuGetProcAddress hands it the
#     shim's cuMemAlloc_v2 & co., shown as procaddr_hooks=N in the result column);
#  3. allocation pair cost (bench_alloc) and fragmentation (bench_frag: reserved from
#     cudaMemGetInfo over allocated; seed, reverse and a serving trace) without the shim,
#     with it, and with CUSHIM_ALLOC_CONF=expandable_segments:True;
#     and the calls simcuda's `cuda` latency profile models (examples/latency_probe.c: on a
#     GPU, CUDA's own costs; with --sim, the profile through the same probe);
#  4. PyTorch (scripts/gpu_train.py): caching allocator; PYTORCH_NO_CUDA_MEMORY_CACHING=1;
#     the same with the shim preloaded: ms per step and peak device memory;
#  5. snapshots with native stacks (demo, and the torch loop) loaded with the installed
#     torch.cuda._memory_viz (`stats`, `trace_plot`).
# Output: RESULTS_DIR/{table.txt,results.tsv,env.txt,logs/,bin/,snap/}.
set -u -o pipefail

usage() {
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RESULTS=""
SIM=0
for a in "$@"; do
  case "$a" in
    --sim) SIM=1 ;;
    -h | --help) usage ;;
    -*) echo "gpu-check: unknown option $a" >&2; usage ;;
    *) RESULTS=$a ;;
  esac
done
[ -n "$RESULTS" ] || usage
mkdir -p "$RESULTS"/{bin,logs,snap} || exit 2
R=$(cd "$RESULTS" && pwd)
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
BUDGET_S=${BUDGET_S:-420}
HARD_S=${HARD_S:-465} # no step runs past this many seconds after the start
PY=${PYTHON:-python3}
START=$SECONDS
: >"$R/results.tsv"
: >"$R/table.txt"

note() { echo "gpu-check: $*" | tee -a "$R/table.txt" >&2; }
row() { printf '%s\n' "$*" >>"$R/table.txt"; }
tsv() { local IFS=$'\t'; printf '%s\n' "$*" >>"$R/results.tsv"; }
over_budget() { [ $((SECONDS - START)) -ge "$BUDGET_S" ]; }

# ---- locate the built files -------------------------------------------------------------
if [ -z "${CUSHIM_LIB:-}" ]; then
  if [ "$SIM" = 1 ] && [ ! -e "$REPO/target/release/libcushim.so" ]; then
    CUSHIM_LIB=$REPO/target/debug/libcushim.so
  else
    CUSHIM_LIB=$REPO/target/release/libcushim.so
  fi
fi
if [ ! -e "$CUSHIM_LIB" ]; then
  echo "gpu-check: $CUSHIM_LIB not found (build it with cargo build --release -p cushim-shim, or set CUSHIM_LIB)" >&2
  exit 2
fi
CUSHIM_LIB=$(cd "$(dirname "$CUSHIM_LIB")" && pwd)/$(basename "$CUSHIM_LIB")
LIBDIR=$(dirname "$CUSHIM_LIB")
HAVE_PY=0
command -v "$PY" >/dev/null 2>&1 && HAVE_PY=1

SIM_ENV=()
if [ "$SIM" = 1 ]; then
  CC=${CC:-cc}
  SIMCUDA_SO=${SIMCUDA_SO:-$LIBDIR/libsimcuda.so}
  if [ ! -e "$SIMCUDA_SO" ] || [ ! -e "$REPO/simcuda/include/cuda_runtime.h" ]; then
    echo "gpu-check: --sim needs $SIMCUDA_SO and $REPO/simcuda/include (build with cargo build -p simcuda)" >&2
    exit 2
  fi
  # simcuda installed under NVIDIA's library names, in the results directory (same layout
  # as cushim::artifacts::sim_layout).
  SIMLIB=$R/simcuda-lib
  mkdir -p "$SIMLIB"
  for n in libcuda.so.1 libcuda.so libcudart.so.12 libcudart.so; do
    ln -sfn "$SIMCUDA_SO" "$SIMLIB/$n"
  done
  SIM_ENV=("LD_LIBRARY_PATH=$SIMLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  VARIANTS=(shared static)
else
  NVCC=${NVCC:-nvcc}
  if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "gpu-check: nvcc not found (set NVCC=/path/to/nvcc, or use --sim)" >&2
    exit 2
  fi
  VARIANTS=(shared static)
fi

# ---- environment ------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "mode: $([ "$SIM" = 1 ] && echo "sim (simcuda)" || echo "real GPU")"
  echo "shim: $CUSHIM_LIB ($(stat -c %s "$CUSHIM_LIB") bytes)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "mem: $(grep MemTotal /proc/meminfo | awk '{print $2" kB"}')"
  if [ "$SIM" = 1 ]; then
    echo "cc: $($CC --version 2>&1 | head -1)"
  else
    echo "nvcc: $($NVCC --version 2>&1 | tail -1)"
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  fi
  if [ "$HAVE_PY" = 1 ]; then
    echo "python: $($PY --version 2>&1)"
    timeout 60 "$PY" -c 'import torch; print("torch:", torch.__version__, "cuda:", torch.version.cuda, "available:", torch.cuda.is_available())' 2>&1 | tail -1
  fi
} >"$R/env.txt" 2>&1
sed 's/^/  /' "$R/env.txt" >&2

# ---- helpers ------------------------------------------------------------------------------
# run LABEL PRELOAD(0|1) [VAR=VALUE ...] -- PROGRAM ARGS...
# Runs under `timeout` with the sim environment, stdout/stderr to logs/LABEL.{out,err};
# sets RC, WALL (seconds). With PRELOAD=1 the shim is preloaded and writes an exit snapshot
# to snap/LABEL.pickle (unless the caller sets CUSHIM_SNAPSHOT itself).
run() {
  local label=$1 preload=$2
  shift 2
  local envs=("${SIM_ENV[@]}")
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if [ "$preload" = 1 ]; then
    envs+=("LD_PRELOAD=$CUSHIM_LIB")
    local has_snap=0 e
    for e in "${envs[@]}"; do case "$e" in CUSHIM_SNAPSHOT=*) has_snap=1 ;; esac; done
    [ "$has_snap" = 1 ] || envs+=("CUSHIM_SNAPSHOT=$R/snap/$label.pickle")
  fi
  local t0 t1 limit left
  left=$((HARD_S - (SECONDS - START)))
  limit=$STEP_TIMEOUT
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$left" -lt 5 ]; then
    : >"$R/logs/$label.out"
    echo "not run: the ${HARD_S}s limit of the whole check is reached" >"$R/logs/$label.err"
    RC=124 WALL=0
    return
  fi
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" env "${envs[@]}" "$@" >"$R/logs/$label.out" 2>"$R/logs/$label.err"
  RC=$?
  t1=$(date +%s.%N)
  WALL=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}')
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    echo "timed out after ${limit}s" >>"$R/logs/$label.err"
  fi
}

# intercepted LABEL: "yes (...)", "no (...)" or "-" for runs without the shim.
intercepted() {
  local snap=$R/snap/$1.pickle
  if [ ! -e "$snap" ]; then
    echo "no (no exit snapshot)"
  elif [ "$HAVE_PY" = 0 ]; then
    echo "? (snapshot written, no python to read it)"
  else
    local info
    info=$(timeout 60 "$PY" "$REPO/scripts/snapinfo.py" "$snap" 2>&1)
    echo "$info" >"$R/logs/$1.snapinfo"
    case "$info" in
      *intercepted=yes*) echo "yes ($(echo "$info" | grep -o 'device_allocs=[0-9]*'))" ;;
      *intercepted=no*) echo "no (shim loaded, saw no allocation)" ;;
      *) echo "? ($info)" ;;
    esac
  fi
}

# compile NAME SOURCE VARIANT -> bin/NAME.VARIANT
compile() {
  local name=$1 src=$2 variant=$3 out=$R/bin/$1.$3
  if [ "$SIM" = 1 ]; then
    # CUDART_CB is empty on Linux; simcuda's headers may not define it.
    local rt=(-L "$SIMLIB" -lcudart)
    if [ "$variant" = static ]; then
      # simcuda's static-runtime stand-in, archived once: the program links no libcudart.
      if [ ! -e "$R/bin/libcudart_static.a" ]; then
        "$CC" -c -O1 -g -fno-omit-frame-pointer -fPIC -I "$REPO/simcuda/include" \
          "$REPO/simcuda/static/cudart_static.c" -o "$R/bin/cudart_static.o" &&
          ar rcs "$R/bin/libcudart_static.a" "$R/bin/cudart_static.o" || return 1
      fi
      rt=("$R/bin/libcudart_static.a")
    fi
    timeout -k 5 "$STEP_TIMEOUT" "$CC" -O1 -g -fno-omit-frame-pointer -Wall -pthread -DCUDART_CB= \
      -I "$REPO/simcuda/include" -I "$REPO/shim/include" -I "$(dirname "$src")" \
      "$src" -o "$out" "${rt[@]}" -ldl >"$R/logs/cc-$name.$variant.log" 2>&1
  else
    local rt=()
    [ "$variant" = shared ] && rt=(-cudart shared)
    timeout -k 5 "$STEP_TIMEOUT" "$NVCC" -O2 -g -Xcompiler -fno-omit-frame-pointer,-pthread \
      "${rt[@]}" -I "$REPO/shim/include" -I "$(dirname "$src")" \
      "$src" -o "$out" -ldl -lpthread >"$R/logs/cc-$name.$variant.log" 2>&1
  fi
}

# snapline FILE: "snapshot: N bytes; <snapinfo>" or "no snapshot written".
snapline() {
  if [ ! -e "$1" ]; then
    echo "no snapshot written"
  elif [ "$HAVE_PY" = 1 ]; then
    echo "snapshot: $(stat -c %s "$1") bytes; $(timeout 60 "$PY" "$REPO/scripts/snapinfo.py" "$1" 2>&1)"
  else
    echo "snapshot: $(stat -c %s "$1") bytes"
  fi
}

field() { grep -o "$2=[^ ]*" "$1" 2>/dev/null | head -1 | cut -d= -f2; }

# ---- 1. compile -------------------------------------------------------------------------
PROGS=(demo:examples/demo.c shim_frag:tests/c/shim_frag.c bench_alloc:examples/bench_alloc.c bench_frag:examples/bench_frag.c)
declare -A BUILT
row "== compile"
for p in "${PROGS[@]}"; do
  name=${p%%:*} src=$REPO/${p#*:}
  for v in "${VARIANTS[@]}"; do
    if compile "$name" "$src" "$v"; then
      BUILT[$name.$v]=1
      row "built     $name.$v"
    else
      row "FAILED    $name.$v (see logs/cc-$name.$v.log)"
    fi
  done
done
for b in "$R"/bin/*.static; do
  [ -e "$b" ] || continue
  if ldd "$b" 2>/dev/null | grep -q libcudart; then row "WARNING   $(basename "$b") links libcudart"; fi
done

# ---- 2. examples without and with the shim ------------------------------------------------
row ""
row "== examples: without / with LD_PRELOAD=libcushim.so"
row "$(printf '%-22s %-7s %-4s %7s  %-40s %s' program runtime shim wall_s intercepted result)"
declare -A OUT # label -> exit status and digest of the output (minus the shim-dependent lines)
for spec in "demo:200" "shim_frag:forward" "shim_frag:reverse" "shim_frag:reuse"; do
  name=${spec%%:*} arg=${spec#*:}
  for v in "${VARIANTS[@]}"; do
    [ -n "${BUILT[$name.$v]:-}" ] || continue
    for pre in 0 1; do
      over_budget && { note "budget of ${BUDGET_S}s spent: skipping the remaining example runs"; break 3; }
      label=$name-$arg.$v.$([ $pre = 1 ] && echo shim || echo plain)
      extra=()
      # A static cudart: log what cuGetProcAddress handed out (the hooks it got).
      [ "$pre" = 1 ] && [ "$v" = static ] && extra=(CUSHIM_LOG_PROCADDR=1)
      run "$label" "$pre" "${extra[@]}" -- "$R/bin/$name.$v" "$arg"
      res="rc=$RC"
      [ "${#extra[@]}" -gt 0 ] && res="$res procaddr_hooks=$(grep -c ' hook ' "$R/logs/$label.err")"
      case "$name" in
        demo) res="$res $(grep -o 'ok: .*' "$R/logs/$label.out" | head -1)" ;;
        shim_frag) res="$res used_after=$(field "$R/logs/$label.out" used_after)" ;;
      esac
      icp=-
      [ "$pre" = 1 ] && icp=$(intercepted "$label")
      OUT[$label]=rc$RC-$(grep -v -e '^device_allocs=' -e '^used_after=' "$R/logs/$label.out" 2>/dev/null | md5sum | cut -c1-8)
      same=""
      if [ "$pre" = 1 ]; then
        plain=${label%.shim}.plain
        if [ "${OUT[$plain]:-x}" = "${OUT[$label]}" ]; then same=" same-output"; else same=" OUTPUT-DIFFERS"; fi
      fi
      row "$(printf '%-22s %-7s %-4s %7s  %-40s %s' "$name $arg" "$v" "$([ $pre = 1 ] && echo yes || echo no)" "$WALL" "$icp" "$res$same")"
      tsv example "$name" "$arg" "$v" "$pre" "$RC" "$WALL" "$icp" "$res$same"
    done
  done
done

# ---- 3a. allocation pair cost -------------------------------------------------------------
row ""
row "== cudaMalloc+cudaFree pair (bench_alloc; median ns per pair)"
row "   (driver = cuMemAlloc_v2+cuMemFree_v2 from dlopen/dlsym of libcuda.so.1: raw with shim=no;"
row "    with shim=yes the shim's dlsym hands out its driver-layer hooks, so it is cached too)"
for v in "${VARIANTS[@]}"; do
  [ -n "${BUILT[bench_alloc.$v]:-}" ] || continue
  for pre in 0 1; do
    over_budget && { note "budget spent: skipping bench_alloc"; break 2; }
    label=bench_alloc.$v.$([ $pre = 1 ] && echo shim || echo plain)
    run "$label" "$pre" -- "$R/bin/bench_alloc.$v" -r 5 -b 20
    icp=-
    [ "$pre" = 1 ] && icp=$(intercepted "$label")
    while read -r line; do
      k=$(echo "$line" | grep -o 'kind=[a-z]*' | cut -d= -f2)
      s=$(echo "$line" | grep -o 'size=[0-9]*' | cut -d= -f2)
      ns=$(echo "$line" | grep -o 'ns_per_pair=[0-9.]*' | cut -d= -f2)
      row "$(printf '%-8s %-6s shim=%-3s %-8s %10s B %12s ns   %s' "$v" "" "$([ $pre = 1 ] && echo yes || echo no)" "$k" "$s" "$ns" "$([ "$k" = runtime ] && echo "$icp")")"
      tsv alloc_pair "$v" "$pre" "$k" "$s" "$ns" "$icp"
    done < <(grep '^bench ' "$R/logs/$label.out")
    [ "$RC" = 0 ] || row "bench_alloc.$v shim=$pre failed rc=$RC (logs/$label.err)"
  done
  # Two threads against one, through the shim (runtime pairs of 1 MiB).
  over_budget && break
  label=bench_alloc.$v.shim.threads2
  run "$label" 1 -- "$R/bin/bench_alloc.$v" -m runtime -s 1048576 -t 2 -r 5 -b 20
  p2=$(field "$R/logs/$label.out" pairs_per_s)
  p1=$(grep 'kind=runtime size=1048576 ' "$R/logs/bench_alloc.$v.shim.out" 2>/dev/null | grep -o 'pairs_per_s=[0-9]*' | cut -d= -f2)
  row "$(printf '%-8s 2 threads vs 1 (1 MiB, shim): %s vs %s pairs/s' "$v" "${p2:-?}" "${p1:-?}")"
  tsv threads "$v" "${p2:-}" "${p1:-}"
done

# ---- 3b. fragmentation ------------------------------------------------------------------
row ""
row "== fragmentation: peak reserved (cudaMemGetInfo) / peak allocated"
row "$(printf '%-8s %-22s %-9s %10s %10s %7s' scenario config runtime alloc_MiB resv_MiB ratio)"
for v in "${VARIANTS[@]}"; do
  [ -n "${BUILT[bench_frag.$v]:-}" ] || continue
  for sc in seed reverse serving; do
    for cfg in plain shim shim+expandable; do
      over_budget && { note "budget spent: skipping fragmentation runs"; break 3; }
      label=bench_frag-$sc.$v.$cfg
      case $cfg in
        plain) run "$label" 0 -- "$R/bin/bench_frag.$v" "$sc" ;;
        shim) run "$label" 1 -- "$R/bin/bench_frag.$v" "$sc" ;;
        *) run "$label" 1 CUSHIM_ALLOC_CONF=expandable_segments:True -- "$R/bin/bench_frag.$v" "$sc" ;;
      esac
      a=$(field "$R/logs/$label.out" peak_allocated) r=$(field "$R/logs/$label.out" peak_reserved)
      ratio=$(field "$R/logs/$label.out" ratio)
      if [ "$RC" = 0 ] && [ -n "$a" ]; then
        row "$(printf '%-8s %-22s %-9s %10.1f %10.1f %7s' "$sc" "$cfg" "$v" "$(awk -v x="$a" 'BEGIN{print x/1048576}')" "$(awk -v x="$r" 'BEGIN{print x/1048576}')" "$ratio")"
      else
        row "$(printf '%-8s %-22s %-9s failed rc=%s (logs/%s.err)' "$sc" "$cfg" "$v" "$RC" "$label")"
      fi
      tsv frag "$sc" "$cfg" "$v" "$RC" "${a:-}" "${r:-}" "${ratio:-}"
    done
  done
done

# ---- 3c. latency profile check --------------------------------------------------------------
# The calls simcuda's `cuda` latency profile models (simcuda/src/profile.rs), timed on this
# machine by examples/latency_probe.c (median of 200; the device idle): on a GPU these are
# CUDA's own costs to hold the profile's figures against; with --sim, simcuda under
# SIMCUDA_LATENCY=cuda, i.e. the profile seen through the same probe.
row ""
row "== latency profile check (latency_probe: median ns per call; profile: simcuda/src/profile.rs)"
if over_budget; then
  note "budget spent: skipping the latency probe"
else
  if [ "$SIM" = 1 ]; then
    timeout -k 5 "$STEP_TIMEOUT" "$CC" -O2 -Wall -I "$REPO/simcuda/include" "$REPO/examples/latency_probe.c"       -o "$R/bin/latency_probe" -L "$SIMLIB" -lcudart -lcuda >"$R/logs/cc-latency_probe.log" 2>&1
  else
    timeout -k 5 "$STEP_TIMEOUT" "$NVCC" -O2 -cudart shared "$REPO/examples/latency_probe.c"       -o "$R/bin/latency_probe" -lcuda >"$R/logs/cc-latency_probe.log" 2>&1
  fi
  if [ $? != 0 ]; then
    row "FAILED    latency_probe (see logs/cc-latency_probe.log)"
  else
    if [ "$SIM" = 1 ]; then
      run latency_probe 0 SIMCUDA_LATENCY=cuda -- "$R/bin/latency_probe" 200
    else
      run latency_probe 0 -- "$R/bin/latency_probe" 200
    fi
    if [ "$RC" = 0 ]; then
      while read -r _ call size med; do
        row "$(printf '%-38s %-10s %s' "${call#call=}" "${size#size=}" "${med#median_ns=}")"
        tsv latency "${call#call=}" "${size#size=}" "${med#median_ns=}"
      done <"$R/logs/latency_probe.out"
    else
      row "latency_probe failed rc=$RC (logs/latency_probe.err)"
    fi
  fi
fi

# ---- 4. PyTorch -----------------------------------------------------------------------------
row ""
row "== PyTorch training loop (scripts/gpu_train.py, 50 steps, varying batch)"
TORCH=0
if [ "$SIM" = 1 ]; then
  row "skipped: no torch (--sim runs on simcuda, which PyTorch cannot use)"
elif [ "$HAVE_PY" = 0 ] || ! timeout 120 "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  row "skipped: no torch (python3 cannot import torch with CUDA available)"
else
  TORCH=1
  row "$(printf '%-34s %9s %9s %12s %12s %s' mode ms/step mean_ms peak_used_MiB torch_resv_MiB shim_allocs)"
  for mode in caching nocache nocache+shim; do
    over_budget && { note "budget spent: skipping torch mode $mode"; break; }
    label=torch-$mode
    case $mode in
      caching) run "$label" 0 -- "$PY" "$REPO/scripts/gpu_train.py" --mode "$mode" --out "$R/$label.json" ;;
      nocache) run "$label" 0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- "$PY" "$REPO/scripts/gpu_train.py" --mode "$mode" --out "$R/$label.json" ;;
      *) run "$label" 1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- "$PY" "$REPO/scripts/gpu_train.py" --mode "$mode" --out "$R/$label.json" ;;
    esac
    if [ "$RC" = 0 ] && [ -s "$R/$label.json" ]; then
      row "$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%-34s %9.2f %9.2f %12.1f %12.1f %s" % (d["mode"], d["ms_per_step_median"], d["ms_per_step_mean"], d["peak_device_used_bytes"]/2**20, d["torch_max_reserved_bytes"]/2**20, d["shim_device_allocs"]))' "$R/$label.json")"
      tsv torch "$mode" "$(cat "$R/$label.json")"
    else
      row "$(printf '%-34s failed rc=%s (logs/%s.err: %s)' "$mode" "$RC" "$label" "$(tail -1 "$R/logs/$label.err" 2>/dev/null)")"
      tsv torch "$mode" "rc=$RC"
    fi
  done
  if [ -s "$R/torch-caching.json" ] && [ -s "$R/torch-nocache+shim.json" ]; then
    row "loss (caching vs nocache+shim, same seed): $("$PY" -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); print(a["loss_last"], "vs", b["loss_last"])' "$R/torch-caching.json" "$R/torch-nocache+shim.json")"
  fi
fi

# ---- 5. snapshots with native stacks, read by torch's _memory_viz ------------------------
row ""
row "== snapshot with native stacks (CUSHIM_HISTORY=enabled=all,stacks=native)"
SNAPS=()
v=${VARIANTS[0]}
if [ -n "${BUILT[demo.$v]:-}" ] && ! over_budget; then
  label=demo-stacks.$v
  run "$label" 1 CUSHIM_HISTORY=enabled=all,stacks=native "CUSHIM_SNAPSHOT=$R/snap/$label.pickle" -- "$R/bin/demo.$v" 50
  row "demo.$v 50 steps: rc=$RC wall=${WALL}s $(snapline "$R/snap/$label.pickle")"
  SNAPS+=("$R/snap/$label.pickle")
fi
if [ "$TORCH" = 1 ] && ! over_budget; then
  label=torch-stacks
  run "$label" 1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUSHIM_HISTORY=enabled=all,stacks=native "CUSHIM_SNAPSHOT=$R/snap/$label.pickle" -- "$PY" "$REPO/scripts/gpu_train.py" --steps 10 --mode stacks --out "$R/$label.json"
  row "torch 10 steps: rc=$RC wall=${WALL}s $(snapline "$R/snap/$label.pickle")"
  SNAPS+=("$R/snap/$label.pickle")
fi
if [ "$HAVE_PY" = 1 ] && timeout 120 "$PY" -c 'import torch.cuda._memory_viz' >/dev/null 2>&1; then
  for s in "${SNAPS[@]}"; do
    over_budget && { note "budget spent: skipping _memory_viz"; break; }
    b=$(basename "$s" .pickle)
    [ -e "$s" ] || { row "_memory_viz $b: no snapshot"; continue; }
    timeout 120 "$PY" -m torch.cuda._memory_viz stats "$s" >"$R/logs/viz-$b.stats" 2>&1
    rc1=$?
    timeout 120 "$PY" -m torch.cuda._memory_viz trace_plot "$s" -o "$R/$b.trace_plot.html" >"$R/logs/viz-$b.trace_plot" 2>&1
    rc2=$?
    row "_memory_viz $b: stats rc=$rc1 ($(wc -l <"$R/logs/viz-$b.stats") lines), trace_plot rc=$rc2 ($([ -e "$R/$b.trace_plot.html" ] && stat -c %s "$R/$b.trace_plot.html" || echo 0) bytes html)"
    tsv memviz "$b" "$rc1" "$rc2"
  done
else
  row "skipped: no torch (torch.cuda._memory_viz not importable): snapshots checked with scripts/snapinfo.py only"
fi

row ""
row "total wall: $((SECONDS - START)) s; logs in $R/logs"
echo
cat "$R/table.txt"
