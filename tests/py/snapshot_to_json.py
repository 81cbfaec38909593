"""Load a snapshot the way PyTorch's viewers do (standard pickle, or json) and print it as
JSON on stdout, so Rust tests can inspect it. Exits non-zero if it does not load.
With --counts, print only the number of trace events per device and of segments."""
import json
import pickle
import sys

counts = "--counts" in sys.argv[1:]
path = [a for a in sys.argv[1:] if a != "--counts"][0]
if path.endswith(".json"):
    with open(path) as f:
        snap = json.load(f)
else:
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        if head[:1] == b"\x80" and head[1] > 4:
            sys.exit("pickle protocol %d is newer than 4" % head[1])
        snap = pickle.load(f)
if counts:
    snap = {
        "device_traces": [len(t) for t in snap["device_traces"]],
        "segments": len(snap["segments"]),
    }
json.dump(snap, sys.stdout)
