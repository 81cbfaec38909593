"""Allocate through the simulated runtime from Python functions, for the Python-stacks test.

The runtime is loaded into the global namespace and its entry points are called through
ctypes.PyDLL(None): the preloaded shim's cudaMalloc/cudaFree, called with the GIL held (a
ctypes.CDLL call releases the GIL, and the shim records Python frames only when the
allocating thread holds it). Prints "ptr=0x..." and "done".
"""
import ctypes
import sys

ctypes.CDLL("libcudart.so.12", mode=ctypes.RTLD_GLOBAL)
rt = ctypes.PyDLL(None)
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]


def allocate_weights(nbytes):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), nbytes)  # ALLOC-LINE
    if rc != 0:
        sys.exit(f"cudaMalloc failed: {rc}")
    return p


def train_step(step):
    return allocate_weights((step + 1) << 20)  # STEP-LINE


def main():
    kept = [train_step(i) for i in range(3)]  # MAIN-LINE
    rt.cudaFree(kept.pop())
    print(f"ptr={kept[0].value:#x}")


main()  # MODULE-LINE
print("done")
