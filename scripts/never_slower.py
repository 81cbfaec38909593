#!/usr/bin/env python3
"""The "never slower" matrix: a program's time with the shim against its time without it,
on simcuda under CUDA's modelled costs (the `cuda` latency profile, simcuda/src/profile.rs).

usage: scripts/never_slower.py [BUILD_DIR] [--pairs N] [--before LIB] [--quick]
  BUILD_DIR   holds libsimcuda.so and libcushim.so (default target/release:
              cargo build --release -p cushim-shim -p simcuda)
  --pairs N   cudaMalloc+cudaFree pairs a cell (default 20000)
  --before L  a second libcushim.so (e.g. an older build) measured in the same run, as a
              "before" column
  --quick     only the 1-thread cells and the demo

A cell's time is simcuda's modelled time (SIMCUDA_LATENCY=cuda,virtual: every driver and
runtime call charges its profile figure to a clock and does not wait; the clock is in
SIMCUDA_REPORT) plus CPU time: for the pairs, the CPU time of the program's own threads
(the loop, the shim in it, simcuda's bookkeeping of each call, start-up and exit), which
never_slower.c reports; for the demo and Caffe, the whole process's (user + system, every
thread, simcuda's stream workers included). Neither side counts the simulated GPU's work
(the model has no GPU time). The modelled part is deterministic; the CPU part is measured
and overstates both sides a little (simcuda's CPU for a call is not CUDA's).
The ratio is with / without: at most 1.0x means the shim made the program no slower under
this model. It is a model, not a GPU.

Rows: 0, 1 and 8 idle non-blocking streams x 1, 2 and 8 threads x 512 B, 1 MiB and 64 MiB
(examples/never_slower.c), then the demo (examples/demo.c, 200 steps) and the Caffe workload
(examples/caffe_blobs.c, 4 epochs of 20 iterations). Prints a markdown table.
"""
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

SIZES = [("512 B", 512), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]
STREAMS = [0, 1, 8]
THREADS = [1, 2, 8]
LATENCY = "cuda,virtual"


def fail(msg):
    print(f"never_slower: {msg}", file=sys.stderr)
    sys.exit(2)


def compile_c(root, libdir, src, exe):
    cmd = ["cc", "-O2", "-Wall", "-pthread", "-I", os.path.join(root, "simcuda", "include"),
           os.path.join(root, "examples", src), "-o", exe, "-L", libdir, "-lcudart"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"compiling {src}: {r.stderr.strip()}")


def run(exe, args, libdir, shim, tmp):
    """One run: (modelled ns, cpu ns, wall s, driver calls, stdout)."""
    report = os.path.join(tmp, "report.json")
    if os.path.exists(report):
        os.remove(report)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUSHIM_", "SIMCUDA_")) and k != "LD_PRELOAD"}
    env["LD_LIBRARY_PATH"] = libdir
    env["SIMCUDA_REPORT"] = report
    env["SIMCUDA_LATENCY"] = LATENCY
    env["SIMCUDA_MEM_MB"] = "8192"
    if shim:
        env["LD_PRELOAD"] = shim
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    r = subprocess.run([exe] + args, env=env, capture_output=True, text=True, cwd=tmp)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        fail(f"{os.path.basename(exe)} {' '.join(args)} (shim {shim}) exited "
             f"{r.returncode}: {r.stderr.strip()[-400:]}")
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1e9
    # A program that reports its own threads' CPU (never_slower.c) leaves out simcuda's
    # stream workers, the simulated GPU, whose time the model does not count on either side.
    m = re.search(r"program_cpu_ns=(\d+)", r.stdout)
    if m:
        cpu = float(m.group(1))
    try:
        with open(report) as f:
            rep = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"reading simcuda's report {report}: {e}")
    if "modelled_ns" not in rep:
        fail(f"{report} has no modelled_ns: libsimcuda.so predates the latency profile")
    return rep["modelled_ns"], cpu, wall, sum(rep["calls"].values()), r.stdout


def cell(exe, args, libdir, shims, tmp):
    """Runs without the shim and with each shim: a list of (modelled, cpu, wall, calls)."""
    return [run(exe, args, libdir, s, tmp)[:4] for s in [None] + shims]


def fmt_ms(ns):
    return f"{ns / 1e6:.1f}"


def main():
    argv = sys.argv[1:]
    build, pairs, before, quick = "target/release", 20000, None, False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--pairs" and i + 1 < len(argv):
            pairs = int(argv[i + 1])
            i += 1
        elif a == "--before" and i + 1 < len(argv):
            before = os.path.abspath(argv[i + 1])
            i += 1
        elif a == "--quick":
            quick = True
        elif a.startswith("-"):
            fail(f"unknown option {a} (see the head of this script)")
        else:
            build = a
        i += 1
    build = os.path.abspath(build)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shim = os.path.join(build, "libcushim.so")
    for f in (shim, os.path.join(build, "libsimcuda.so")) + ((before,) if before else ()):
        if not os.path.exists(f):
            fail(f"{f} not found (cargo build --release -p cushim-shim -p simcuda)")
    libdir = os.path.join(build, "simcuda-lib")
    os.makedirs(libdir, exist_ok=True)
    for name in ("libcuda.so", "libcuda.so.1", "libcudart.so", "libcudart.so.12"):
        link = os.path.join(libdir, name)
        if not os.path.islink(link):
            os.symlink("../libsimcuda.so", link)
    tmp = tempfile.mkdtemp(prefix="never-slower-")
    exes = {}
    for src in ("never_slower.c", "demo.c", "caffe_blobs.c"):
        exes[src] = os.path.join(tmp, src[:-2])
        compile_c(root, libdir, src, exes[src])
    shims = ([before] if before else []) + [shim]
    labels = (["before", "after"] if before else ["shim"])
    load = os.getloadavg()
    print(f"SIMCUDA_LATENCY={LATENCY}; {pairs} pairs a cell; load average at the start "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    head = "| workload | idle streams | threads | size | driver calls without | "
    head += " | ".join(f"driver calls {l}" for l in labels)
    head += " | modelled + CPU ms without | "
    head += " | ".join(f"modelled + CPU ms {l}" for l in labels)
    head += " | " + " | ".join(f"ratio {l}" for l in labels) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    worst = 0.0

    def emit(name, streams, threads, size, res):
        nonlocal worst
        base = res[0][0] + res[0][1]
        calls = " | ".join(str(r[3]) for r in res[1:])
        times = " | ".join(f"{fmt_ms(r[0])} + {fmt_ms(r[1])}" for r in res[1:])
        ratios = [(r[0] + r[1]) / base for r in res[1:]]
        worst = max(worst, ratios[-1])
        rs = " | ".join(f"{x:.3f}x" for x in ratios)
        print(f"| {name} | {streams} | {threads} | {size} | {res[0][3]} | {calls} | "
              f"{fmt_ms(res[0][0])} + {fmt_ms(res[0][1])} | {times} | {rs} |", flush=True)

    for streams in STREAMS:
        for threads in THREADS[:1] if quick else THREADS:
            for label, size in SIZES:
                args = ["-s", str(size), "-S", str(streams), "-t", str(threads),
                        "-n", str(pairs)]
                emit("pairs", streams, threads, label,
                     cell(exes["never_slower.c"], args, libdir, shims, tmp))
    emit("demo (200 steps)", 1, 1, "-", cell(exes["demo.c"], ["200"], libdir, shims, tmp))
    if not quick:
        emit("Caffe blobs (4 x 20)", 0, 1, "-",
             cell(exes["caffe_blobs.c"], ["4", "20"], libdir, shims, tmp))
    load = os.getloadavg()
    print(f"\nworst ratio ({labels[-1]}): {worst:.3f}x; load average at the end "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
