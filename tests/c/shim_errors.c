/* Error codes of the allocation API, one line per case: name=code. */
#include <cuda.h>
#include <stdint.h>
#include "shim_util.h"

int main(void) {
    void *p = NULL;
    int x = 0;
    printf("null_out=%d\n", (int)cudaMalloc(NULL, 1024));
    (void)cudaGetLastError();
    p = (void *)1;
    int zero_rc = (int)cudaMalloc(&p, 0);
    printf("zero_size=%d null=%d\n", zero_rc, p == NULL);
    printf("free_null=%d\n", (int)cudaFree(NULL));
    printf("free_unknown=%d\n", (int)cudaFree(&x));
    (void)cudaGetLastError();
    CHECK(cudaMalloc(&p, 4096));
    printf("free_first=%d\n", (int)cudaFree(p));
    printf("free_double=%d\n", (int)cudaFree(p));
    printf("last_error=%d\n", (int)cudaGetLastError());
    printf("last_error_cleared=%d\n", (int)cudaGetLastError());
    CHECK(cudaMalloc(&p, 3 * MiB));
    printf("free_interior=%d\n", (int)cudaFree((char *)p + 512));
    (void)cudaGetLastError();
    CHECK(cudaFree(p));
    printf("host_null_out=%d\n", (int)cudaMallocHost(NULL, 64));
    (void)cudaGetLastError();
    printf("host_free_unknown=%d\n", (int)cudaFreeHost(&x));
    (void)cudaGetLastError();
    printf("meminfo_null=%d\n", (int)cudaMemGetInfo(NULL, NULL));
    (void)cudaGetLastError();

    /* Memory from the driver API: with CUSHIM_INTERCEPT=runtime it is not the cache's, and
     * cudaFree hands it to the real runtime, which frees it; by default the shim's driver
     * hook caches it and cudaFree returns it to the cache. Either way: 0, then 1. */
    CUdeviceptr d = 0;
    CHECK((cudaError_t)cuMemAlloc(&d, 8 * MiB));
    printf("free_foreign=%d\n", (int)cudaFree((void *)(uintptr_t)d));
    printf("free_foreign_again=%d\n", (int)cudaFree((void *)(uintptr_t)d));
    return 0;
}
