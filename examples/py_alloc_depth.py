"""cudaMalloc+cudaFree pairs from Python at a given call depth, for `cushim bench` (the cost
of recording Python frames). usage: py_alloc_depth.py DEPTH PAIRS REPEATS

Calls the preloaded shim's cudaMalloc/cudaFree through ctypes.PyDLL(None) (the GIL stays
held, so Python frames are recorded), DEPTH Python frames deep. Prints the median over
REPEATS batches: "pydepth depth=D ns_per_pair=X".
"""
import ctypes
import sys
import time

ctypes.CDLL("libcudart.so.12", mode=ctypes.RTLD_GLOBAL)
rt = ctypes.PyDLL(None)
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]


def pairs(n):
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)
    t = time.perf_counter_ns()
    for _ in range(n):
        rt.cudaMalloc(ref, 512)
        rt.cudaFree(p)
    return (time.perf_counter_ns() - t) / n


def at_depth(d, n):
    if d <= 1:
        return pairs(n)
    return at_depth(d - 1, n)


depth, n, repeats = (int(a) for a in sys.argv[1:4])
at_depth(depth, n // 10 + 1)  # warm up: every frame interned once
runs = sorted(at_depth(depth, n) for _ in range(repeats))
print(f"pydepth depth={depth} ns_per_pair={runs[len(runs) // 2]:.1f}")
