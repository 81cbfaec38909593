"""Sleep mode from Python: memory allocated in cushim.region(tag) is paused and resumed by
the cushim module (ctypes over the preloaded shim), keeping its address and, backed up, its
bytes. Prints one line per step."""
import ctypes
import os
import sys

import cushim

rt = ctypes.CDLL("libcudart.so.12")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]
rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
H2D, D2H = 1, 2
n = 4 << 20
p = ctypes.c_void_p()
with cushim.region("weights"):
    assert rt.cudaMalloc(ctypes.byref(p), n) == 0
src = (ctypes.c_ubyte * n)(*([7] * 16))
assert rt.cudaMemcpy(p, src, n, H2D) == 0
print("available", cushim.available())
print("paused", cushim.pause("weights", backup=True))
print("again", cushim.pause("weights"))
print("unknown", cushim.pause("no_such_tag"))
snap = os.environ.get("SLEEP_SNAPSHOT")
if snap:
    ctypes.CDLL(None).cushim_dump_snapshot(snap.encode())
cushim.resume()
print("after resume", cushim.paused_bytes())
back = (ctypes.c_ubyte * n)()
assert rt.cudaMemcpy(back, p, n, D2H) == 0
print("identical", bytes(back) == bytes(src))
assert rt.cudaFree(p) == 0
try:
    cushim.tag_pop()
except cushim.CushimError as e:
    print("pop error", e.code)
sys.stdout.flush()
