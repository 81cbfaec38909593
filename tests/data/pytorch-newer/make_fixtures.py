#!/usr/bin/env python3
"""Writes the small snapshots in this folder, shaped as PyTorch writes them.

Run from anywhere: `python3 tests/data/pytorch-newer/make_fixtures.py`. Standard library
only (no torch); the pickles are what `pickle.dump(torch.cuda.memory._snapshot(), f)`
writes for these contents (protocol 4, plain dicts, lists, tuples, str, int, float, bool).

Shapes, from PyTorch's source:
- trace entries: `action, addr, size, stream, time_us, frames` (torch/csrc/cuda/
  memory_snapshot.cpp), frames `{name, filename, line}`;
- record_function annotations (memory_snapshot.cpp `_initRecordAnnotations`, USER_SCOPE):
  PyTorch >= 2.5 writes `external_annotations`, one dict per start or end with `name`,
  `stage` ("START"/"END"), `device`, `time_us`; PyTorch 2.4 wrote a trace entry
  `{"action": "user_defined", frames: [{"name": NAME, "filename": "START"|"END", "line": 0}]}`;
- `allocator_settings` (memory_snapshot.cpp): `PYTORCH_CUDA_ALLOC_CONF`, `max_split_size`,
  `garbage_collection_threshold`, `expandable_segments`, `pinned_num_register_threads`,
  `release_lock_on_cudamalloc`, `pinned_use_cuda_host_register`, `roundup_power2_divisions`
  (a dict "1", "2", "4", ... to divisions);
- FX augmentation (torch/cuda/memory.py `_augment_frames`, `_snapshot(augment_with_fx_traces
  =True)`): a frame of an `fx_generated_*.py` module gains `fx_node_op`, `fx_node_name`,
  `fx_node_target` (str of the target) and `fx_original_trace` (the node's stack trace);
- pinned host memory as `host_segments` / `host_traces`, segments and trace entries shaped
  as the device ones (the names cushim's writer uses beside PyTorch's keys).
"""

import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
KIB = 1 << 10
BASE = 0x7F0000000000


def frames(line, fn="train_step"):
    return [
        {"name": fn, "filename": "/work/train.py", "line": line},
        {"name": "main", "filename": "/work/train.py", "line": 90},
    ]


class Trace:
    """A device trace with one 16 MiB segment, the clock in microseconds."""

    def __init__(self, inline):
        self.inline = inline
        self.t = 1000
        self.entries = []
        self.annotations = []
        self.next = BASE
        self.live = {}
        self.add("segment_alloc", BASE, 16 * MIB, frames(10))

    def add(self, action, addr, size, fr):
        self.t += 10
        self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0,
                             "time_us": self.t, "frames": fr})

    def alloc(self, size, line):
        addr = self.next
        self.next += size
        self.add("alloc", addr, size, frames(line))
        self.live[addr] = (size, frames(line))
        return addr

    def free(self, addr):
        size = self.live.pop(addr)[0]
        self.add("free_requested", addr, size, frames(60))
        self.add("free_completed", addr, size, frames(60))

    def mark(self, name, stage):
        self.t += 10
        if self.inline:
            self.entries.append({"action": "user_defined", "addr": 0, "size": 0, "stream": 0,
                                 "time_us": self.t,
                                 "frames": [{"name": name, "filename": stage, "line": 0}]})
        else:
            self.annotations.append({"name": name, "stage": stage, "device": 0,
                                     "time_us": self.t})

    def segments(self):
        blocks, at = [], BASE
        for addr in sorted(self.live):
            size, fr = self.live[addr]
            if addr > at:
                blocks.append({"address": at, "size": addr - at, "requested_size": 0,
                               "state": "inactive", "frames": []})
            blocks.append({"address": addr, "size": size, "requested_size": size,
                           "state": "active_allocated", "frames": fr})
            at = addr + size
        end = BASE + 16 * MIB
        if at < end:
            blocks.append({"address": at, "size": end - at, "requested_size": 0,
                           "state": "inactive", "frames": []})
        used = sum(s for s, _ in self.live.values())
        return [{"device": 0, "address": BASE, "total_size": 16 * MIB,
                 "allocated_size": used, "active_size": used, "requested_size": used,
                 "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": frames(10), "blocks": blocks}]


SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False,max_split_size_mb:64",
    "max_split_size": 64 * MIB,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
    "release_lock_on_cudamalloc": False,
    "pinned_use_cuda_host_register": False,
    "roundup_power2_divisions": {"1": 0, "2": 0, "4": 0, "8": 0},
}


def training(inline):
    """Three steps under the profiler: forward (1 MiB kept for backward, 256 KiB
    temporary), backward (frees the activation; 1 MiB of gradients made once and kept),
    the optimizer (2 MiB of state made once and kept, 512 KiB temporary)."""
    tr = Trace(inline)
    grads = state = None
    for step in range(3):
        tr.mark(f"ProfilerStep#{step}", "START")
        tr.mark("## forward ##", "START")
        act = tr.alloc(1 * MIB, 21)
        tmp = tr.alloc(256 * KIB, 22)
        tr.free(tmp)
        tr.mark("## forward ##", "END")
        tr.mark("## backward ##", "START")
        if grads is None:
            grads = tr.alloc(1 * MIB, 31)
        tr.free(act)
        tr.mark("## backward ##", "END")
        tr.mark("Optimizer.step#AdamW.step", "START")
        if state is None:
            state = tr.alloc(2 * MIB, 41)
        tmp = tr.alloc(512 * KIB, 42)
        tr.free(tmp)
        tr.mark("Optimizer.step#AdamW.step", "END")
        tr.mark(f"ProfilerStep#{step}", "END")
    snap = {"segments": tr.segments(), "device_traces": [tr.entries],
            "allocator_settings": SETTINGS}
    if not inline:
        snap["external_annotations"] = tr.annotations
    return snap


def fx_augmented():
    """A compiled step (aot_eager): two FX nodes' outputs from the generated module."""
    tr = Trace(False)
    gen = "/tmp/torchinductor_u/fx/fx_generated_3f2a.py"

    def node(line, name, target, trace):
        return [
            {"name": "forward", "filename": gen, "line": line, "fx_node_op": "call_function",
             "fx_node_name": name, "fx_node_target": target, "fx_original_trace": trace},
            {"name": "train_step", "filename": "/work/train.py", "line": 50},
            {"name": "main", "filename": "/work/train.py", "line": 90},
        ]

    addmm = node(7, "addmm", "aten.addmm.default",
                 '  File "/work/train.py", line 50, in train_step\n    out = model(x)\n'
                 '  File "/work/model.py", line 12, in forward\n    a = self.net1(x)\n')
    relu = node(8, "relu", "aten.relu.default",
                '  File "/work/model.py", line 13, in forward\n    b = self.relu(a)\n')
    for fr, size in ((addmm, 3 * MIB), (relu, 1 * MIB)):
        addr = tr.next
        tr.next += size
        tr.add("alloc", addr, size, fr)
        tr.live[addr] = (size, fr)
    return {"segments": tr.segments(), "device_traces": [tr.entries],
            "allocator_settings": SETTINGS}


def pinned_host():
    """2 MiB live on the device, 4 MiB of pinned host memory (one 8 MiB host segment)."""
    tr = Trace(False)
    tr.alloc(2 * MIB, 21)
    host = 0x7E0000000000
    host_seg = {"device": 0, "address": host, "total_size": 8 * MIB,
                "allocated_size": 4 * MIB, "active_size": 4 * MIB,
                "requested_size": 4 * MIB, "stream": 0, "segment_type": "large",
                "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames(70),
                "blocks": [
                    {"address": host, "size": 4 * MIB, "requested_size": 4 * MIB,
                     "state": "active_allocated", "frames": frames(71, "load_batch")},
                    {"address": host + 4 * MIB, "size": 4 * MIB, "requested_size": 0,
                     "state": "inactive", "frames": []}]}
    host_traces = [
        {"action": "segment_alloc", "addr": host, "size": 8 * MIB, "stream": 0,
         "time_us": 1005, "frames": frames(70)},
        {"action": "alloc", "addr": host, "size": 4 * MIB, "stream": 0, "time_us": 1006,
         "frames": frames(71, "load_batch")},
    ]
    return {"segments": tr.segments(), "device_traces": [tr.entries],
            "allocator_settings": SETTINGS, "host_segments": [host_seg],
            "host_traces": host_traces}


def main():
    for name, snap in (("record-function-2.5.pickle", training(False)),
                       ("record-function-2.4.pickle", training(True)),
                       ("fx-augmented.pickle", fx_augmented()),
                       ("pinned-host.pickle", pinned_host())):
        with open(os.path.join(HERE, name), "wb") as f:
            pickle.dump(snap, f, protocol=4)


if __name__ == "__main__":
    main()
