"""Edges of Python stacks, for the Python-stacks test: a ctypes.CDLL call (the GIL released
around it: its frames are read without the GIL), on a second thread too, and a cudaMalloc
from a __del__ that runs while the interpreter finalizes (no Python frames taken). Prints
"done" before finalization; the test checks the snapshot written at exit.
"""
import ctypes
import threading

ctypes.CDLL("libcudart.so.12", mode=ctypes.RTLD_GLOBAL)
nogil = ctypes.CDLL(None)  # releases the GIL around each call
gil = ctypes.PyDLL(None)
for lib in (nogil, gil):
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]


def released(size):
    p = ctypes.c_void_p()
    assert nogil.cudaMalloc(ctypes.byref(p), size) == 0
    return p


class AtExit:
    def __del__(self):
        p = ctypes.c_void_p()
        gil.cudaMalloc(ctypes.byref(p), 3 << 20)


kept = [released(1 << 20)]
t = threading.Thread(target=lambda: kept.append(released(2 << 20)))
t.start()
t.join()
holder = AtExit()  # collected during finalization
print("done")
