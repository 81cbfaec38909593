/* Stream-ordered allocation through the per-thread default stream entry points: built with
 * -DCUDA_API_PER_THREAD_DEFAULT_STREAM, simcuda's headers turn cudaMallocAsync,
 * cudaFreeAsync, cudaMallocFromPoolAsync, cuMemAllocAsync, cuMemFreeAsync and
 * cuMemAllocFromPoolAsync into their _ptsz names (stream 0 is then the calling thread's
 * per-thread default stream), as nvcc --default-stream per-thread does with NVIDIA's.
 * Prints a checksum of what each phase wrote and read back, and the allocations the shim
 * served (-1 without the shim). */
#include <cuda.h>
#include "shim_util.h"

static unsigned char host[4 * MiB];

static unsigned long long dev_sum(const void *d, size_t n) {
    CHECK(cudaMemcpy(host, d, n, cudaMemcpyDeviceToHost));
    unsigned long long s = 0;
    for (size_t i = 0; i < n; i += 4093)
        s = s * 31 + host[i] + i;
    return s + host[n - 1];
}

int main(void) {
    DCHECK(cuInit(0));
    /* Runtime: four rounds of four blocks, each round reusing what the last one freed. */
    unsigned long long s = 0;
    for (int round = 0; round < 4; round++) {
        void *p[4];
        for (int i = 0; i < 4; i++) {
            CHECK(cudaMallocAsync(&p[i], (size_t)(i + 1) * MiB, 0));
            CHECK(cudaMemsetAsync(p[i], round * 4 + i + 1, (size_t)(i + 1) * MiB, 0));
        }
        CHECK(cudaStreamSynchronize(0));
        for (int i = 0; i < 4; i++) {
            s = s * 7 + dev_sum(p[i], (size_t)(i + 1) * MiB);
            CHECK(cudaFreeAsync(p[i], 0));
        }
    }
    CHECK(cudaStreamSynchronize(0));
    printf("runtime=%llu\n", s);
    /* A pool allocation (CUDA's own pool: recorded, not cached). */
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    void *pp;
    CHECK(cudaMallocFromPoolAsync(&pp, 2 * MiB, pool, 0));
    CHECK(cudaMemsetAsync(pp, 0x3c, 2 * MiB, 0));
    CHECK(cudaStreamSynchronize(0));
    printf("pool=%llu\n", dev_sum(pp, 2 * MiB));
    CHECK(cudaFreeAsync(pp, 0));
    /* Driver. */
    CUdeviceptr d, dp;
    DCHECK(cuMemAllocAsync(&d, 3 * MiB, 0));
    DCHECK(cuMemsetD8(d, 0x21, 3 * MiB));
    DCHECK(cuMemAllocFromPoolAsync(&dp, MiB, (CUmemoryPool)pool, 0));
    DCHECK(cuMemsetD8(dp, 0x43, MiB));
    printf("driver=%llu\n", dev_sum((void *)d, 3 * MiB) * 7 + dev_sum((void *)dp, MiB));
    DCHECK(cuMemFreeAsync(d, 0));
    DCHECK(cuMemFreeAsync(dp, 0));
    CHECK(cudaStreamSynchronize(0));
    printf("shim_allocations=%lld\n", shim_stat("allocation.all.allocated"));
    return 0;
}
