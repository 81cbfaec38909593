#!/usr/bin/env python3
"""Summarize a cushim snapshot with the Python standard library only (no torch).

usage: snapinfo.py SNAPSHOT.pickle|.json
Prints one line:
  segments=N trace_events=M allocs=A frames=F named_frames=G device_allocs=D intercepted=yes|no
where frames counts frame dicts on trace entries, named_frames those with a symbol name
other than "??", device_allocs the shim's num_device_alloc (from the snapshot's cushim.stats)
and intercepted says whether the shim handled any device allocation of the program (a
segment, an alloc event or a device allocation counted). Exit status 1 if unreadable.
"""
import json
import pickle
import sys


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if path.endswith(".json"):
            snap = json.loads(raw)
        else:
            snap = pickle.loads(raw)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as e:
        print(f"unreadable: {e}")
        return 1
    segments = snap.get("segments", [])
    traces = snap.get("device_traces", [])
    events = [e for dev in traces for e in dev]
    allocs = sum(1 for e in events if e.get("action") == "alloc")
    frames = [fr for e in events for fr in e.get("frames", [])]
    named = sum(1 for fr in frames if fr.get("name") not in (None, "", "??"))
    stats = (snap.get("cushim") or {}).get("stats") or {}
    device_allocs = sum(int(d.get("num_device_alloc", 0)) for d in stats.get("devices", []))
    intercepted = bool(segments) or allocs > 0 or device_allocs > 0
    print(
        f"segments={len(segments)} trace_events={len(events)} allocs={allocs} "
        f"frames={len(frames)} named_frames={named} device_allocs={device_allocs} "
        f"intercepted={'yes' if intercepted else 'no'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
