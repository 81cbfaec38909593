#!/usr/bin/env python3
"""Check a cushim snapshot as PyTorch's viewers read it.

Usage: snapshot_check.py FILE [--expect-frame SUBSTRING]...

Loads FILE with the standard library only (pickle, or json for .json), checks the schema of
torch.cuda.memory._snapshot(), that blocks are contiguous and sum to their segment, and
replays every device trace backwards from the segments (the way _memory_viz.py and
MemoryViz.js do), failing on any event the state at that point contradicts. Prints one
JSON line of facts on success; exits 1 with a message on the first problem.
"""
import json
import pickle
import sys

BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}
SEG_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
            "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
            "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
# cushim's own keys on observed segments (the viewers ignore keys they do not know).
SEG_OPTIONAL = {"kind", "flags"}


def fail(msg):
    print("snapshot_check: " + msg, file=sys.stderr)
    sys.exit(1)


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool) and -(1 << 63) <= x < (1 << 63)


def check_frames(frames, where, names):
    if not isinstance(frames, list):
        fail(f"{where}: frames is {type(frames).__name__}, not a list")
    for f in frames:
        if not isinstance(f, dict) or set(f) != {"name", "filename", "line"}:
            fail(f"{where}: bad frame {f!r}")
        if not isinstance(f["name"], str) or not isinstance(f["filename"], str) or not is_int(f["line"]):
            fail(f"{where}: bad frame types {f!r}")
        names.append(f)


def check_segment(s, i, names, is_pickle):
    where = f"segment {i}"
    if not SEG_KEYS <= set(s) or set(s) - SEG_KEYS - SEG_OPTIONAL:
        fail(f"{where}: keys {sorted(set(s) ^ SEG_KEYS)} differ")
    for k in ("device", "address", "total_size", "allocated_size", "active_size",
              "requested_size", "stream"):
        if not is_int(s[k]):
            fail(f"{where}: {k} is not an int64")
    if s["segment_type"] not in ("small", "large"):
        fail(f"{where}: segment_type {s['segment_type']!r}")
    pool = s["segment_pool_id"]
    if (is_pickle and not isinstance(pool, tuple)) or len(pool) != 2:
        fail(f"{where}: segment_pool_id {pool!r} is not a 2-tuple")
    if not isinstance(s["is_expandable"], bool):
        fail(f"{where}: is_expandable not a bool")
    check_frames(s["frames"], where, names)
    addr, alloc, active, req = s["address"], 0, 0, 0
    for j, b in enumerate(s["blocks"]):
        if set(b) != BLOCK_KEYS:
            fail(f"{where} block {j}: keys {sorted(set(b) ^ BLOCK_KEYS)} differ")
        if b["address"] != addr:
            fail(f"{where} block {j}: at {b['address']:#x}, expected {addr:#x} (not contiguous)")
        if b["state"] not in BLOCK_STATES:
            fail(f"{where} block {j}: state {b['state']!r}")
        check_frames(b["frames"], f"{where} block {j}", names)
        addr += b["size"]
        if b["state"] == "active_allocated":
            alloc += b["size"]
        if b["state"] != "inactive":
            active += b["size"]
            req += b["requested_size"]
    if addr - s["address"] != s["total_size"]:
        fail(f"{where}: blocks sum to {addr - s['address']}, total_size {s['total_size']}")
    if (alloc, active, req) != (s["allocated_size"], s["active_size"], s["requested_size"]):
        fail(f"{where}: allocated/active/requested sizes disagree with blocks")


def replay(device, segments, trace):
    """Walk the trace backwards from the final state; return the number of events undone."""
    segs = sorted([[s["address"], s["total_size"]] for s in segments if s["device"] == device])
    live = {}  # addr -> (size, pending)
    for s in segments:
        if s["device"] != device:
            continue
        for b in s["blocks"]:
            if b["state"] != "inactive":
                live[b["address"]] = (b["size"], b["state"] == "active_pending_free")

    def inside(addr, size):
        return any(a <= addr and addr + size <= a + n for a, n in segs)

    def unmap(addr, size, merge):
        for k, (a, n) in enumerate(segs):
            if merge and a <= addr and addr + size <= a + n:
                pieces = [[a, addr - a], [addr + size, a + n - addr - size]]
                segs[k:k + 1] = [p for p in pieces if p[1] > 0]
                return True
            if not merge and a == addr and n == size:
                del segs[k]
                return True
        return False

    def map_(addr, size, merge):
        if any(a < addr + size and addr < a + n for a, n in segs):
            return False
        segs.append([addr, size])
        segs.sort()
        if merge:
            # Only the remapped range joins the ranges it touches (an expandable segment's
            # neighbours); other adjacent segments stay apart.
            k = next(j for j, (a, _) in enumerate(segs) if a == addr)
            if k + 1 < len(segs) and segs[k][0] + segs[k][1] == segs[k + 1][0]:
                segs[k][1] += segs[k + 1][1]
                del segs[k + 1]
            if k > 0 and segs[k - 1][0] + segs[k - 1][1] == segs[k][0]:
                segs[k - 1][1] += segs[k][1]
                del segs[k]
        return True

    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        act = e["action"]
        where = f"device {device} event {i} ({act})"
        if act not in ACTIONS:
            fail(f"{where}: unknown action")
        need = {"action", "size", "stream", "time_us", "frames"} | ({"device_free"} if act == "oom" else {"addr"})
        if set(e) != need:
            fail(f"{where}: keys {sorted(set(e) ^ need)} differ")
        if i > 0 and trace[i - 1]["time_us"] > e["time_us"]:
            fail(f"{where}: time_us goes backwards (traces must be oldest first)")
        if act in ("oom", "snapshot"):
            continue
        addr, size = e["addr"], e["size"]
        if act == "alloc":
            if addr not in live or live[addr][1]:
                fail(f"{where}: {addr:#x} is not live-and-allocated after its alloc")
            del live[addr]
        elif act == "free_requested":
            if addr not in live or not live[addr][1]:
                fail(f"{where}: {addr:#x} is not pending-free after free_requested")
            live[addr] = (live[addr][0], False)
        elif act == "free_completed":
            if addr in live:
                fail(f"{where}: {addr:#x} still live after free_completed")
            live[addr] = (size, True)
        elif act in ("segment_alloc", "segment_map"):
            if any(addr <= a < addr + size for a in live):
                fail(f"{where}: blocks live inside {addr:#x} before it existed")
            if not unmap(addr, size, act == "segment_map"):
                fail(f"{where}: no segment {addr:#x}+{size} to undo")
        elif act in ("segment_free", "segment_unmap"):
            if not map_(addr, size, act == "segment_unmap"):
                fail(f"{where}: {addr:#x}+{size} overlaps a segment")
        for a, (n, _) in live.items():
            if not inside(a, n):
                fail(f"{where}: live block {a:#x}+{n} outside every segment")
    return len(trace)


def check_batches(data):
    """Every APPENDS adds <= 1000 items and every SETITEMS <= 1000 pairs."""
    import pickletools
    counts = [0]
    for op, _arg, pos in pickletools.genops(data):
        name = op.name
        if name == "MARK":
            counts.append(0)
        elif name in ("APPENDS", "SETITEMS"):
            n = counts.pop()
            items = n if name == "APPENDS" else n // 2
            if items > 1000:
                fail(f"{name} at byte {pos} carries {items} items (> 1000)")
        elif name in ("TUPLE", "LIST", "DICT", "POP_MARK"):
            counts.pop()
            counts[-1] += 0 if name == "POP_MARK" else 1
        else:
            before = [x for x in op.stack_before if x is not pickletools.markobject]
            counts[-1] += len(op.stack_after) - len(before)


def main():
    args = sys.argv[1:]
    path, expect, batches = args[0], [], False
    while len(args) > 1:
        if args[1] == "--expect-frame":
            expect.append(args[2])
            args = args[2:]
        elif args[1] == "--check-batches":
            batches = True
            args = args[1:]
        else:
            fail(f"unknown option {args[1]}")
    with open(path, "rb") as f:
        head = f.read(1)
        f.seek(0)
        is_pickle = head == b"\x80"
        snap = pickle.load(f) if is_pickle else json.load(f)
    if batches and is_pickle:
        with open(path, "rb") as f:
            check_batches(f.read())
    for k in ("segments", "device_traces", "allocator_settings"):
        if k not in snap:
            fail(f"missing top-level key {k}")
    if not isinstance(snap["allocator_settings"], dict):
        fail("allocator_settings is not a dict")
    frames = []
    for i, s in enumerate(snap["segments"]):
        check_segment(s, i, frames, is_pickle)
    events = []
    for d, trace in enumerate(snap["device_traces"]):
        if not isinstance(trace, list):
            fail(f"device_traces[{d}] is not a list")
        for e in trace:
            check_frames(e.get("frames"), f"device {d} trace", frames)
        events.append(replay(d, snap["segments"], trace))
    if "host_segments" in snap:
        for i, s in enumerate(snap["host_segments"]):
            check_segment(s, i, frames, is_pickle)
    for want in expect:
        if not any(want in f["name"] for f in frames):
            fail(f"no frame names {want!r}")
    lists = {id(e["frames"]) for t in snap["device_traces"] for e in t if e["frames"]}
    print(json.dumps({
        "devices": len(snap["device_traces"]),
        "events": events,
        "segments": len(snap["segments"]),
        "expandable": any(s["is_expandable"] for s in snap["segments"]),
        "actions": sorted({e["action"] for t in snap["device_traces"] for e in t}),
        "distinct_trace_frame_lists": len(lists),
        "frames_seen": len(frames),
        "cushim": sorted(snap.get("cushim", {})),
    }))


main()
