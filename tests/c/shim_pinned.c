/* Pinned host memory: blocks are reused without new host allocations, and flag combinations
 * are kept apart (a write-combined block never serves a default request). */
#include "shim_util.h"

int main(void) {
    void *a = NULL, *b = NULL, *wc = NULL, *c = NULL;
    CHECK(cudaMallocHost(&a, 100000));
    memset(a, 1, 100000);
    CHECK(cudaFreeHost(a));
    CHECK(cudaMallocHost(&b, 90000));
    printf("reused=%d\n", a == b);
    CHECK(cudaFreeHost(b));
    CHECK(cudaHostAlloc(&wc, 100000, cudaHostAllocWriteCombined));
    CHECK(cudaFreeHost(wc));
    CHECK(cudaHostAlloc(&c, 100000, cudaHostAllocDefault));
    printf("wc_kept_apart=%d\n", c != wc);
    printf("default_reuses_default=%d\n", c == a);
    CHECK(cudaFreeHost(c));
    return 0;
}
