"""A numba-cuda device-array workload (no kernels): to_device, device_array, copy_to_host,
a second stream. Prints one line of checksums, so runs with and without cushim compare."""
import numpy as np
from numba import cuda

n = 1 << 16
host = np.arange(n, dtype=np.float32)
sums = []
d = cuda.to_device(host)
scratch = cuda.device_array(n, dtype=np.float32)
scratch.copy_to_device(d)
sums.append(float(scratch.copy_to_host().sum()))
s = cuda.stream()
for step in range(8):
    act = cuda.device_array(n * (step % 3 + 1), dtype=np.float32, stream=s)
    act[:n].copy_to_device(host * step, stream=s)
    out = act[:n].copy_to_host(stream=s)
    s.synchronize()
    sums.append(float(out.sum()))
    del act
back = d.copy_to_host()
assert (back == host).all()
print("numba_workload sums=" + ",".join("%.1f" % x for x in sums))
