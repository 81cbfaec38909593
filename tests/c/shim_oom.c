/* Out of memory on a 1 GiB device: 600 MiB allocated and freed, then 700 MiB must succeed by
 * releasing the cache; a request beyond capacity fails with cudaErrorMemoryAllocation and
 * allocation goes on normally afterwards. */
#include "shim_util.h"

int main(void) {
    void *p = NULL, *q = NULL, *big = (void *)1, *r = NULL;
    CHECK(cudaMalloc(&p, 600 * MiB));
    CHECK(cudaFree(p));
    CHECK(cudaMalloc(&q, 700 * MiB));
    printf("retries=%lld\n", shim_stat("num_alloc_retries"));
    cudaError_t e = cudaMalloc(&big, 2048 * MiB);
    int is_null = big == NULL;
    printf("beyond=%d null=%d\n", (int)e, is_null);
    printf("last_error=%d\n", (int)cudaGetLastError());
    printf("ooms=%lld\n", shim_stat("num_ooms"));
    CHECK(cudaFree(q));
    CHECK(cudaMalloc(&r, 100 * MiB));
    memset(r, 0x5a, 100 * MiB); /* simcuda device memory is host memory */
    CHECK(cudaFree(r));
    printf("after=ok\n");
    return 0;
}
