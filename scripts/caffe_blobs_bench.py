#!/usr/bin/env python3
"""Measure examples/caffe_blobs.c on simcuda with a latency model, without and with the shim.

usage: scripts/caffe_blobs_bench.py [BUILD_DIR] [RUNS] [EPOCHS] [ITERS]
  BUILD_DIR  target/release (needs libsimcuda.so and libcushim.so: cargo build --release
             -p cushim-shim -p simcuda)
  RUNS       runs per configuration; the table gives the median wall time (default 3)

Prints one markdown table row per configuration: the calls the program made, the
allocation calls that reached the (simulated) driver, simcuda's peak bytes in use, and the
wall time. The latency model (LATENCY below) is a model with cited figures, not a GPU.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

# Figures and their sources (see BENCHMARKS.md, "Caffe blobs"):
# - cudaMalloc / cuMemAlloc_v2: 50 us, "a relatively constant overhead of about 50
#   microseconds up to 512 KB" (more above it), cs.virginia.edu/~mwb7w/cuda_support/
#   memory_management_overhead.html.
# - cudaMallocHost / cuMemHostAlloc: 2,300 us, "approximately 2,300 microseconds per call
#   until around 1 MB" (same page).
# - Frees: no published per-call figure found; modelled at the cost of the matching
#   allocation (cudaFree also synchronizes the device, per NVIDIA's RMM blog post, which
#   this model does not add). cuMemCreate / cuMemRelease (expandable segments) likewise 50 us.
LAT_DEVICE = "50us"
LAT_HOST = "2300us"
LATENCY = ",".join(
    [f"{n}:{LAT_DEVICE}" for n in ("cudaMalloc", "cuMemAlloc_v2", "cudaFree", "cuMemFree_v2",
                                   "cuMemCreate", "cuMemRelease")]
    + [f"{n}:{LAT_HOST}" for n in ("cudaMallocHost", "cudaHostAlloc", "cuMemHostAlloc",
                                   "cuMemAllocHost_v2", "cudaFreeHost", "cuMemFreeHost")]
)
# CAFFE_BLOBS_LATENCY replaces the model (e.g. to add cuMemMap / cuMemSetAccess figures).
LATENCY = os.environ.get("CAFFE_BLOBS_LATENCY", LATENCY)

CONFIGS = [
    ("without the shim", None),
    ("shim, defaults", ""),
    ("shim, expandable_segments:True", "expandable_segments:True"),
    ("shim, max_cached_mb:64", "max_cached_mb:64"),
    ("shim, expandable + max_cached_mb:64", "expandable_segments:True,max_cached_mb:64"),
]

DEVICE_ALLOC = ("cudaMalloc", "cuMemAlloc_v2", "cuMemCreate")
DEVICE_FREE = ("cudaFree", "cuMemFree_v2", "cuMemRelease")
HOST_ALLOC = ("cudaMallocHost", "cudaHostAlloc", "cuMemHostAlloc", "cuMemAllocHost_v2")
HOST_FREE = ("cudaFreeHost", "cuMemFreeHost")


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release")
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    args = sys.argv[3:5]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    libdir = os.path.join(build, "simcuda-lib")
    os.makedirs(libdir, exist_ok=True)
    for name in ("libcuda.so", "libcuda.so.1", "libcudart.so", "libcudart.so.12"):
        link = os.path.join(libdir, name)
        if not os.path.islink(link):
            os.symlink("../libsimcuda.so", link)
    tmp = tempfile.mkdtemp(prefix="caffe-blobs-")
    exe = os.path.join(tmp, "caffe_blobs")
    subprocess.run(["cc", "-O2", "-g", "-Wall", "-pthread", "-I",
                    os.path.join(root, "simcuda", "include"),
                    os.path.join(root, "examples", "caffe_blobs.c"), "-o", exe,
                    "-L", libdir, "-lcudart"], check=True)
    print(f"latency model: SIMCUDA_LATENCY={LATENCY}")
    print("| configuration | program cudaMalloc / cudaMallocHost | device alloc / free calls "
          "reaching the driver | pinned alloc / free calls reaching the driver | peak "
          "reserved (MiB) | wall time (ms, median of %d) |" % runs)
    print("|---|---|---|---|---|---|")
    for label, conf in CONFIGS:
        walls = []
        for r in range(runs):
            report = os.path.join(tmp, f"report-{len(walls)}.json")
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("CUSHIM_", "SIMCUDA_")) and k != "LD_PRELOAD"}
            env["LD_LIBRARY_PATH"] = libdir
            env["SIMCUDA_REPORT"] = report
            env["SIMCUDA_LATENCY"] = LATENCY
            if conf is not None:
                env["LD_PRELOAD"] = os.path.join(build, "libcushim.so")
                env["CUSHIM_ALLOC_CONF"] = conf
            out = subprocess.run([exe] + args, env=env, check=True, capture_output=True,
                                 text=True).stdout
            kv = dict(line.split("=", 1) for line in out.split() if "=" in line)
            walls.append(float(kv["wall_ms"]))
            rep = json.load(open(report))
        calls = rep["calls"]
        dev_a = sum(calls.get(n, 0) for n in DEVICE_ALLOC)
        dev_f = sum(calls.get(n, 0) for n in DEVICE_FREE)
        host_a = sum(calls.get(n, 0) for n in HOST_ALLOC)
        host_f = sum(calls.get(n, 0) for n in HOST_FREE)
        peak = rep["devices"][0]["peak_bytes_in_use"] / (1 << 20)
        print(f"| {label} | {kv['device_mallocs']} / {kv['host_mallocs']} | {dev_a} / {dev_f} "
              f"| {host_a} / {host_f} | {peak:.0f} | {statistics.median(walls):.0f} |")


if __name__ == "__main__":
    main()
