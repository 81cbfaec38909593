"""NVTX ranges from NVIDIA's `nvtx` Python package around cudaMalloc calls made through
ctypes, for the shim's NVTX test. Each allocation's size names the range it is made in:
  "train" (1 MiB), three "train/iteration" ranges in category "loop", each keeping 2 MiB
  (never freed) and freeing 3 MiB inside, "eval" in domain "infer" (4 MiB, freed inside),
  and a push_range/pop_range "cleanup" (5 MiB, freed inside).
Prints "done".
"""
import ctypes

import nvtx

cudart = ctypes.CDLL("libcudart.so.12", mode=ctypes.RTLD_GLOBAL)
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cudart.cudaFree.argtypes = [ctypes.c_void_p]


def alloc(mib):
    p = ctypes.c_void_p()
    assert cudart.cudaMalloc(ctypes.byref(p), mib << 20) == 0
    return p


def free(p):
    assert cudart.cudaFree(p) == 0


kept = []
with nvtx.annotate("train"):
    kept.append(alloc(1))
    for _ in range(3):
        with nvtx.annotate("iteration", category="loop"):
            kept.append(alloc(2))
            free(alloc(3))
with nvtx.annotate("eval", domain="infer"):
    free(alloc(4))
nvtx.push_range("cleanup")
free(alloc(5))
nvtx.pop_range()
print("done")
