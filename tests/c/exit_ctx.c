/* Pushes and pops a context once, allocates 3 MiB in it and frees 1 MiB of it, then exits:
 * the C library destroys the main thread's local storage before the exit handlers run, so
 * whatever the shim asks the driver at exit is asked from there. Prints
 * "result=ok used=N" (device memory in use before exit). */
#include "driver_util.h"

int main(void) {
    CUdevice d;
    CUcontext ctx, old;
    CUdeviceptr a, b;
    DCHECK(cuInit(0));
    DCHECK(cuDeviceGet(&d, 0));
    DCHECK(cuDevicePrimaryCtxRetain(&ctx, d));
    DCHECK(cuCtxPushCurrent(ctx));
    DCHECK(cuMemAlloc(&a, 2 * MiB));
    DCHECK(cuMemAlloc(&b, 1 * MiB));
    DCHECK(cuMemFree(b));
    printf("result=ok used=%llu\n", used_bytes());
    DCHECK(cuCtxPopCurrent(&old));
    return 0;
}
