"""Allocate through the simulated runtime with the GIL released, for the GIL-less Python
stacks tests: `ctypes.CDLL` releases the GIL around each call (as Cython `nogil` calls
such as cuda.bindings' driver calls do), so the shim reads the thread's frames without it.

`python3 alloc_nogil.py main` allocates 3 MiB from `load_weights` on the main thread;
`python3 alloc_nogil.py thread` allocates 4 MiB from `worker` on a second thread, which
stays blocked in the allocation's caller until the main thread has joined it. Both keep
their memory. Prints "done".
"""
import ctypes
import sys
import threading

ctypes.CDLL("libcudart.so.12", mode=ctypes.RTLD_GLOBAL)
rt = ctypes.CDLL(None)  # releases the GIL around each call
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]

kept = []


def load_weights(nbytes):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), nbytes)  # MAIN-ALLOC
    if rc != 0:
        sys.exit(f"cudaMalloc failed: {rc}")
    kept.append(p)


def worker():
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), 4 << 20)  # THREAD-ALLOC
    if rc != 0:
        sys.exit(f"cudaMalloc failed: {rc}")
    kept.append(p)


def start_worker():
    t = threading.Thread(target=worker)
    t.start()
    t.join()


if sys.argv[1] == "main":
    load_weights(3 << 20)
else:
    start_worker()
print("done")
