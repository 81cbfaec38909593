#!/usr/bin/env python3
"""Write a PyTorch-shaped snapshot pickle with N trace events and 32-frame stacks (64
distinct stacks, shared as Python shares them: each frame list and frame dict is pickled
once and referenced through the memo), for the big-file figures in BENCHMARKS.md.

usage: make-big-snapshot.py OUT [EVENTS=1000000] [SEED_GROWTH=0]
SEED_GROWTH > 0 makes one site allocate that many more 1 MiB blocks (for `cushim diff`)."""
import pickle
import sys

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
growth = int(sys.argv[3]) if len(sys.argv) > 3 else 0
MIB = 1 << 20

def stack(i):
    inner = [
        {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
        {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", "filename": "??", "line": 0},
    ]
    user = [{"name": f"layer{i}_{d}", "filename": f"/home/u/model/layer{i}.py", "line": 10 + d} for d in range(29)]
    return inner + user + [{"name": "main", "filename": "/home/u/train.py", "line": 1}]

stacks = [stack(i) for i in range(64)]
base = 0x7F0000000000
slots = 256  # blocks cycling through one 256 MiB segment
trace = [{"action": "segment_alloc", "addr": base, "size": slots * MIB, "stream": 0, "time_us": 0, "frames": stacks[0]}]
t = 1
k = 0
# Step k allocates slot k and frees the block allocated 128 steps before: 128 blocks live.
while len(trace) < n:
    slot = k % slots
    trace.append({"action": "alloc", "addr": base + slot * MIB, "size": MIB, "stream": 0, "time_us": t, "frames": stacks[k % 64]})
    if k >= 128 and len(trace) + 2 <= n:
        old = (k - 128) % slots
        for act in ("free_requested", "free_completed"):
            trace.append({"action": act, "addr": base + old * MIB, "size": MIB, "stream": 0, "time_us": t, "frames": stacks[(k - 128) % 64]})
    t += 1
    k += 1
# End state: whatever the cycle left live, plus `growth` extra blocks from stack 7.
live = {}
for e in trace[1:]:
    if e["action"] == "alloc":
        live[e["addr"]] = e["frames"]
    elif e["action"] == "free_completed":
        live.pop(e["addr"], None)
pending = {e["addr"] for e in trace[1:] if e["action"] == "free_requested"} - {e["addr"] for e in trace[1:] if e["action"] == "free_completed"}
blocks = []
for s in range(slots):
    a = base + s * MIB
    if a in live:
        st = "active_pending_free" if a in pending else "active_allocated"
        blocks.append({"address": a, "size": MIB, "requested_size": MIB, "state": st, "frames": live[a]})
    else:
        blocks.append({"address": a, "size": MIB, "requested_size": 0, "state": "inactive", "frames": []})
segs = [{"device": 0, "address": base, "total_size": slots * MIB, "allocated_size": 0, "active_size": 0,
         "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
         "is_expandable": False, "frames": stacks[0], "blocks": blocks}]
if growth:
    gbase = base + (1 << 32)
    trace.append({"action": "segment_alloc", "addr": gbase, "size": growth * MIB, "stream": 0, "time_us": t, "frames": stacks[7]})
    gblocks = []
    for k in range(growth):
        t += 1
        trace.append({"action": "alloc", "addr": gbase + k * MIB, "size": MIB, "stream": 0, "time_us": t, "frames": stacks[7]})
        gblocks.append({"address": gbase + k * MIB, "size": MIB, "requested_size": MIB, "state": "active_allocated", "frames": stacks[7]})
    segs.append({"device": 0, "address": gbase, "total_size": growth * MIB, "allocated_size": 0, "active_size": 0,
                 "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": stacks[7], "blocks": gblocks})
snap = {"segments": segs, "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False}}
with open(out, "wb") as fh:
    pickle.dump(snap, fh, protocol=4)
