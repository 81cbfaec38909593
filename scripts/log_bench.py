#!/usr/bin/env python3
"""Measure the whole-run event log: recording cost with the log against the ring only,
bytes per event, and how fast the readers take a log.

usage: scripts/log_bench.py [BUILD_DIR] [PAIRS] [RUNS]
  BUILD_DIR  target/release (needs cushim, libcushim.so and libsimcuda.so: cargo build
             --release -p cushim -p cushim-shim -p simcuda)
  PAIRS      cudaMalloc+cudaFree pairs of 1 KiB per run (default 1000000: about 3M events)
  RUNS       runs per configuration; the median is printed (default 3)

The program is tests/c/shim_end.c's `loop` case on simcuda; it times its own loop
(ns_per_pair, wall) and the loop thread's CPU time (thread_cpu_per_pair_ns: what the
program's thread pays, whatever else runs on the cores). The whole process's CPU time
(user + system, every thread: the log's writer too, start-up and exit included) comes
from wait4. Each pair records 3 events (alloc, free_requested, free_completed).
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release"))
PAIRS = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
CUSHIM = os.path.join(BUILD, "cushim")
SIMLIB = os.path.join(BUILD, "simcuda-lib")


def sh(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def main():
    if not os.path.isdir(SIMLIB):
        sh([CUSHIM, "run", "--sim", "true"])  # lays simcuda out as a CUDA installation
    work = tempfile.mkdtemp(prefix="cushim-logbench-")
    exe = os.path.join(work, "shim_end")
    sh(["cc", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread",
        "-I", os.path.join(ROOT, "simcuda/include"), "-I", os.path.join(ROOT, "shim/include"),
        os.path.join(ROOT, "tests/c/shim_end.c"), "-o", exe,
        "-L", SIMLIB, "-Wl,-rpath," + SIMLIB, "-lcudart", "-ldl"])
    base = dict(os.environ, LD_LIBRARY_PATH=SIMLIB, LD_PRELOAD=os.path.join(BUILD, "libcushim.so"),
                SHIM_END_EXIT="1")
    for k in list(base):
        if k.startswith("CUSHIM_") or k.startswith("SIMCUDA_"):
            del base[k]
    rows = []
    for stacks in ["none", "native"]:
        for log in [False, True]:
            ns, thread_cpu, proc_cpu, sizes = [], [], [], []
            for r in range(RUNS):
                env = dict(base, CUSHIM_HISTORY=f"enabled=all,stacks={stacks}")
                path = os.path.join(work, f"run-{stacks}-{r}.log")
                if log:
                    env["CUSHIM_LOG"] = path
                p = subprocess.Popen([exe, str(PAIRS), "loop"], env=env,
                                     stdout=subprocess.PIPE, text=True)
                out = p.stdout.read()
                _, status, ru = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                if p.returncode != 0:
                    sys.exit(f"{exe} {PAIRS} loop exited {p.returncode}")
                ns.append(float(re.search(r"ns_per_pair=([0-9.]+)", out).group(1)))
                thread_cpu.append(float(re.search(r"thread_cpu_per_pair_ns=([0-9.]+)",
                                                  out).group(1)))
                proc_cpu.append((ru.ru_utime + ru.ru_stime) * 1e9 / PAIRS)
                if log:
                    sizes.append(os.path.getsize(path))
            events = 3 * PAIRS
            spread = lambda v: f"{min(v) / 3:.1f}-{max(v) / 3:.1f}"
            row = {"stacks": stacks, "log": log, "ns_per_event": statistics.median(ns) / 3,
                   "thread_cpu": statistics.median(thread_cpu) / 3,
                   "proc_cpu": statistics.median(proc_cpu) / 3,
                   "spreads": (spread(ns), spread(thread_cpu), spread(proc_cpu))}
            if log:
                row["bytes_per_event"] = statistics.median(sizes) / events
                row["log"] = path
            rows.append(row)
    print(f"Per event, median of {RUNS} (min-max): wall; the program thread's CPU; the whole "
          "process's CPU")
    print("| stacks | log | wall ns | program thread CPU ns | process CPU ns | bytes per event |")
    print("|---|---|---|---|---|---|")
    ring = {}
    for r in rows:
        b = f"{r['bytes_per_event']:.2f}" if "bytes_per_event" in r else "-"
        cells = []
        for key, sp in zip(("ns_per_event", "thread_cpu", "proc_cpu"), r["spreads"]):
            if not r["log"]:
                ring[(r["stacks"], key)] = r[key]
                cells.append(f"{r[key]:.1f} ({sp})")
            else:
                ratio = r[key] / ring[(r["stacks"], key)]
                cells.append(f"{r[key]:.1f} ({sp}, {ratio:.2f}x)")
        print(f"| {r['stacks']} | {'ring + log' if r['log'] else 'ring only'} | "
              f"{' | '.join(cells)} | {b} |")
    print(f"load average: {os.getloadavg()}")
    for r in rows:
        if r["log"] is True or not isinstance(r["log"], str):
            continue
        for cmd in (["summary"], ["replay", "--conf", "expandable_segments:False"]):
            t0 = time.monotonic()
            sh([CUSHIM, *cmd[:1], r["log"], *cmd[1:]])
            dt = time.monotonic() - t0
            print(f"cushim {cmd[0]} of the {r['stacks']}-stacks log ({3 * PAIRS} events): "
                  f"{dt:.2f} s, {3 * PAIRS / dt / 1e6:.2f} M events/s")
        t0 = time.monotonic()
        snap = os.path.join(work, "peak.pickle")
        sh([CUSHIM, "snapshot", r["log"], "--peak", "--events", "100000", "-o", snap])
        dt = time.monotonic() - t0
        print(f"cushim snapshot --peak of the {r['stacks']}-stacks log: {dt:.2f} s, "
              f"{os.path.getsize(snap)} bytes")


if __name__ == "__main__":
    main()
