"""Drive the parts of PyTorch's own torch/cuda/_memory_viz.py that its command line cannot
reach here, and print what they produced as one JSON line for the Rust test to check.

Usage: memviz_api.py MEMORY_VIZ_PY SNAPSHOT [OTHER_SNAPSHOT]

- `segments` and `memory` build flamegraph input lines, then pipe them to flamegraph.pl,
  which the script downloads from GitHub (no network in tests): we pass a formatter that
  returns the lines themselves, so PyTorch's own code walks our segments and blocks and we
  check what it wrote (bytes per segment prefix, frames named).
- `compare` as its command line calls it fails with a TypeError on any input in the torch
  2.15 script (it iterates the snapshot dicts' keys); we call the function with the segment
  lists, as its body expects.
- `trace_plot` / `segment_plot` (called through the command line by the test) embed the
  pickled snapshot in an HTML page; `--embedded HTML` decodes it and says whether it equals
  the snapshot file (the page is only a loader for MemoryViz.js from a CDN).
"""
import base64
import contextlib
import importlib.util
import io
import json
import pickle
import re
import sys


def load_module(path):
    spec = importlib.util.spec_from_file_location("pytorch_memory_viz", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def read(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def sums(lines):
    """Bytes per flamegraph line prefix (up to the state) and every frame fragment."""
    by_prefix, frames, total = {}, set(), 0
    for line in lines.splitlines():
        stack, _, n = line.rpartition(" ")
        parts = stack.split(";")
        key = ";".join(parts[:2]) if parts[1].startswith("seg_") else parts[0]
        by_prefix[key] = by_prefix.get(key, 0) + int(n)
        total += int(n)
        frames.update(p for p in parts[2:] if ":" in p)
    return {"by_prefix": by_prefix, "total": total, "frames": sorted(frames)}


def main():
    if sys.argv[1] == "--embedded":
        html, snap = sys.argv[2], sys.argv[3]
        with open(html) as f:
            page = f.read()
        m = re.search(r"const local_files = (\[.*?\])\n", page)
        files = json.loads(m.group(1))
        data = pickle.loads(base64.b64decode(files[0]["base64"]))
        print(json.dumps({"equal": data == read(snap)}))
        return
    mod = load_module(sys.argv[1])
    snap = read(sys.argv[2])
    same = lambda lines: lines  # noqa: E731 (the formatter: return flamegraph input)
    out = {
        "segments": sums(mod.segments(snap, format_flamegraph=same)),
        "memory": sums(mod.memory(snap, format_flamegraph=same)),
    }
    if len(sys.argv) > 3:
        other = read(sys.argv[3])
        printed = io.StringIO()  # compare prints only_before/only_after lists first
        with contextlib.redirect_stdout(printed):
            lines = mod.compare(snap["segments"], other["segments"], format_flamegraph=same)
        out["compare"] = sums(lines)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
