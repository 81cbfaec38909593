/* A program that never creates a stream: under free_sync:auto the cache reuses freed blocks
 * at once and makes no event calls at all. */
#include "shim_util.h"

int main(void) {
    void *p[16];
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 16; i++) {
            CHECK(cudaMalloc(&p[i], (size_t)(i + 1) * 256 * 1024));
            CHECK(cudaMemset(p[i], i, 512));
        }
        for (int i = 0; i < 16; i++)
            CHECK(cudaFree(p[i]));
    }
    printf("device_allocs=%lld\n", shim_stat("num_device_alloc"));
    return 0;
}
