/* Measures cuMemAlloc_v2 + cuMemFree_v2 pairs on simcuda: prints "ns_per_pair: <n>" for
 * argv[1] pairs (default 200000) of argv[2]-byte allocations (default 4096), with a live
 * background population so the allocator is not trivially empty. The figure is this
 * thread's CPU time, not wall time: other processes on a busy machine do not inflate it. */
#include <cuda.h>
#include <time.h>
#include "sim_check.h"

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 200000;
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 4096;
    CUcontext ctx;
    EXPECT(CUDA_SUCCESS, cuInit(0));
    EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, 0));
    EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(ctx));
    static CUdeviceptr bg[1000];
    for (int i = 0; i < 1000; i++) EXPECT(CUDA_SUCCESS, cuMemAlloc(&bg[i], 512 + (size_t)i * 512));
    for (int i = 0; i < 1000; i += 2) EXPECT(CUDA_SUCCESS, cuMemFree(bg[i]));
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (long i = 0; i < iters; i++) {
        CUdeviceptr d;
        if (cuMemAlloc(&d, size) != CUDA_SUCCESS) return 1;
        if (cuMemFree(d) != CUDA_SUCCESS) return 1;
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)iters;
    printf("ns_per_pair: %.1f\n", ns);
    return 0;
}
