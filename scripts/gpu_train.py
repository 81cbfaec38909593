#!/usr/bin/env python3
"""A small PyTorch training loop for scripts/gpu-check.sh: time per step and peak device memory.

A few-layer MLP trained for --steps steps on random data whose batch size and width change
every step (so an allocator sees many distinct sizes), seeded so every allocator mode computes
the same losses. Run it under PyTorch's caching allocator, with PYTORCH_NO_CUDA_MEMORY_CACHING=1,
and with that plus LD_PRELOAD=libcushim.so; it prints one JSON line (and writes it to --out):

  mode, steps, ms_per_step_median (steps after the first 5), ms_per_step_mean,
  peak_device_used_bytes (cudaMemGetInfo total-free, sampled after forward, backward and
  step, minus what was in use right after CUDA initialized), torch_max_reserved_bytes
  (PyTorch's own counter; 0 when its cache is off), loss_first, loss_last, and
  shim_device_allocs (the shim's num_device_alloc, or null when the shim is not loaded).
"""
import argparse
import ctypes
import json
import statistics
import sys
import time


def shim_device_allocs():
    try:
        fn = ctypes.CDLL(None).cushim_memory_stats_json
    except (AttributeError, OSError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(1 << 20)
    if fn(buf, len(buf)) < 0:
        return None
    try:
        stats = json.loads(buf.value.decode())
        return sum(int(d.get("num_device_alloc", 0)) for d in stats.get("devices", []))
    except (ValueError, AttributeError, TypeError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="caching")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("gpu_train: no CUDA device visible to torch", file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = False
    free0, total = torch.cuda.mem_get_info()
    base_used = total - free0
    peak = 0

    def sample():
        nonlocal peak
        free, tot = torch.cuda.mem_get_info()
        peak = max(peak, tot - free - base_used)

    w = args.width
    layers = []
    for i in range(args.layers):
        layers += [torch.nn.Linear(w, w), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(w, 16)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(99)
    times, losses = [], []
    for step in range(args.steps):
        batch = int(torch.randint(32, 1024, (1,), generator=gen))
        x = torch.randn(batch, w, generator=gen).to(dev, non_blocking=False)
        y = torch.randint(0, 16, (batch,), generator=gen).to(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        sample()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sample()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        sample()
        losses.append(float(loss))
    timed = times[5:] if len(times) > 5 else times
    result = {
        "mode": args.mode,
        "steps": args.steps,
        "ms_per_step_median": round(statistics.median(timed) * 1e3, 3),
        "ms_per_step_mean": round(statistics.fmean(timed) * 1e3, 3),
        "peak_device_used_bytes": int(peak),
        "torch_max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "shim_device_allocs": shim_device_allocs(),
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
