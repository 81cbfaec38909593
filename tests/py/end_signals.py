"""Ending signals in Python under the shim: `int` sends SIGINT to itself (Python's own
handler, installed before the shim starts, turns it into KeyboardInterrupt; the program
goes on, allocates 2 MiB more and exits 0); `term` sends SIGTERM (default action: the
process dies of it). 4 MiB are allocated first in both.
"""
import ctypes
import os
import signal
import sys

rt = ctypes.CDLL("libcudart.so.12", mode=ctypes.RTLD_GLOBAL)
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]


def alloc(size):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), size) == 0
    return p


kept = [alloc(4 << 20)]
if sys.argv[1] == "int":
    try:
        os.kill(os.getpid(), signal.SIGINT)
        signal.pause()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    kept.append(alloc(2 << 20))
elif sys.argv[1] == "term":
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
