"""Load a snapshot the way PyTorch's viewers do (standard pickle, or json) and print it as
JSON on stdout, so Rust tests can inspect it. Exits non-zero if it does not load."""
import json
import pickle
import sys

path = sys.argv[1]
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
json.dump(snap, sys.stdout)
