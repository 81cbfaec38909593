/* Result codes of the driver allocation API, one line per case: name=code. The same
 * program run on the bare driver and with the shim must print the same lines. */
#include <pthread.h>
#include "driver_util.h"

/* The per-thread-default-stream variants (what cuda.h maps to under
 * CUDA_API_PER_THREAD_DEFAULT_STREAM). */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

static void *no_context(void *arg) {
    CUdeviceptr p = 0;
    void *h = NULL;
    ((int *)arg)[0] = (int)cuMemAlloc(&p, 4096);
    ((int *)arg)[1] = (int)cuMemAllocHost(&h, 4096);
    return NULL;
}

int main(void) {
    CUdeviceptr p = 0;
    int x = 0;
    printf("before_init=%d\n", (int)cuMemAlloc(&p, 4096));
    driver_init();
    printf("null_out=%d\n", (int)cuMemAlloc(NULL, 1024));
    int zero = (int)cuMemAlloc(&p, 0);
    printf("zero_size=%d\n", zero);
    printf("free_null=%d\n", (int)cuMemFree(0));
    printf("free_unknown=%d\n", (int)cuMemFree((CUdeviceptr)(uintptr_t)&x));
    DCHECK(cuMemAlloc(&p, 4096));
    printf("free_first=%d\n", (int)cuMemFree(p));
    printf("free_double=%d\n", (int)cuMemFree(p));
    DCHECK(cuMemAlloc(&p, 3 * MiB));
    printf("free_interior=%d\n", (int)cuMemFree(p + 512));
    DCHECK(cuMemFree(p));
    printf("host_null_out=%d\n", (int)cuMemAllocHost(NULL, 64));
    printf("host_alloc_null_out=%d\n", (int)cuMemHostAlloc(NULL, 64, 0));
    printf("host_free_unknown=%d\n", (int)cuMemFreeHost(&x));
    printf("meminfo_null=%d\n", (int)cuMemGetInfo(NULL, NULL));
    printf("async_null_out=%d\n", (int)cuMemAllocAsync(NULL, 64, NULL));
    int rc[2] = {-1, -1};
    pthread_t t;
    pthread_create(&t, NULL, no_context, rc);
    pthread_join(t, NULL);
    printf("no_context=%d\n", rc[0]);
    printf("no_context_host=%d\n", rc[1]);
    /* Stream-ordered allocation on a stream, on the legacy stream and, through the _ptsz
     * entry points, on the per-thread default stream. */
    CUstream st;
    DCHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CUdeviceptr a = 0;
    printf("async_alloc=%d\n", (int)cuMemAllocAsync(&a, 1 << 20, st));
    printf("async_free=%d\n", (int)cuMemFreeAsync(a, st));
    printf("async_legacy_alloc=%d\n", (int)cuMemAllocAsync(&a, 1 << 20, NULL));
    printf("async_legacy_free=%d\n", (int)cuMemFreeAsync(a, NULL));
    printf("ptsz_alloc=%d\n", (int)cuMemAllocAsync_ptsz(&a, 1 << 20, NULL));
    printf("ptsz_free=%d\n", (int)cuMemFreeAsync_ptsz(a, NULL));
    DCHECK(cuStreamSynchronize(st));
    DCHECK(cuStreamDestroy(st));
    void *h = NULL;
    DCHECK(cuMemAllocHost(&h, 1000));
    memset(h, 7, 1000);
    printf("host_free_first=%d\n", (int)cuMemFreeHost(h));
    return 0;
}
