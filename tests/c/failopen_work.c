/* A bit of everything the shim intercepts, with results that depend only on CUDA's answers:
 * runtime allocations and frees (also stream-ordered), pinned host memory through both
 * APIs, driver allocations, and the program's own VMM mappings. Prints one line per phase
 * with a checksum of the data it wrote and read back, and the device memory in use at the
 * end, after everything was freed ("used_end": without the shim, or with caching off, what
 * the driver still holds for the program). */
#include <cuda.h>
#include "shim_util.h"

static unsigned char host[16 * MiB];

static unsigned long long sum(const unsigned char *p, size_t n) {
    unsigned long long s = 0;
    for (size_t i = 0; i < n; i += 4093)
        s = s * 31 + p[i] + i;
    return s + p[n - 1];
}

static unsigned long long dev_sum(const void *d, size_t n) {
    CHECK(cudaMemcpy(host, d, n, cudaMemcpyDeviceToHost));
    return sum(host, n);
}

int main(void) {
    DCHECK(cuInit(0));
    /* Runtime: allocate, fill, free half, allocate again. */
    void *a[6];
    size_t sz[6];
    unsigned long long s = 0;
    for (int i = 0; i < 6; i++) {
        sz[i] = (size_t)(2 * i + 1) * MiB;
        CHECK(cudaMalloc(&a[i], sz[i]));
        CHECK(cudaMemset(a[i], i + 1, sz[i]));
    }
    for (int i = 0; i < 6; i += 2)
        CHECK(cudaFree(a[i]));
    for (int i = 0; i < 6; i += 2) {
        sz[i] = sz[i] / 2 + 4096;
        CHECK(cudaMalloc(&a[i], sz[i]));
        CHECK(cudaMemset(a[i], i + 7, sz[i]));
    }
    for (int i = 0; i < 6; i++)
        s = s * 7 + dev_sum(a[i], sz[i]);
    printf("runtime=%llu\n", s);
    /* Stream-ordered. */
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *b;
    CHECK(cudaMallocAsync(&b, 3 * MiB, st));
    CHECK(cudaMemsetAsync(b, 0x5a, 3 * MiB, st));
    CHECK(cudaStreamSynchronize(st));
    printf("async=%llu\n", dev_sum(b, 3 * MiB));
    CHECK(cudaFreeAsync(b, st));
    CHECK(cudaStreamSynchronize(st));
    /* Pinned host memory, runtime and driver. */
    void *h1, *h2, *h3;
    CHECK(cudaMallocHost(&h1, 1 * MiB));
    CHECK(cudaHostAlloc(&h2, 3 * MiB, cudaHostAllocDefault));
    DCHECK(cuMemAllocHost(&h3, 2 * MiB));
    memset(h1, 0x11, 1 * MiB);
    memset(h2, 0x22, 3 * MiB);
    memset(h3, 0x33, 2 * MiB);
    CHECK(cudaMemcpy(a[5], h1, 1 * MiB, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy((char *)a[5] + MiB, h2, 3 * MiB, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy((char *)a[5] + 4 * MiB, h3, 2 * MiB, cudaMemcpyHostToDevice));
    printf("pinned=%llu\n", dev_sum(a[5], sz[5]));
    CHECK(cudaFreeHost(h1));
    CHECK(cudaFreeHost(h2));
    DCHECK(cuMemFreeHost(h3));
    /* Driver allocations. */
    CUdeviceptr d[4];
    for (int i = 0; i < 4; i++) {
        DCHECK(cuMemAlloc(&d[i], (size_t)(i + 1) * MiB));
        DCHECK(cuMemsetD8(d[i], (unsigned char)(0x40 + i), (size_t)(i + 1) * MiB));
    }
    DCHECK(cuMemFree(d[1]));
    DCHECK(cuMemAlloc(&d[1], 5 * MiB / 2));
    DCHECK(cuMemsetD8(d[1], 0x77, 5 * MiB / 2));
    s = 0;
    for (int i = 0; i < 4; i++)
        s = s * 7 + dev_sum((void *)d[i], i == 1 ? 5 * MiB / 2 : (size_t)(i + 1) * MiB);
    printf("driver=%llu\n", s);
    for (int i = 0; i < 4; i++)
        DCHECK(cuMemFree(d[i]));
    /* The program's own VMM mapping. */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemAccessDesc rw;
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t g = 0;
    DCHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va;
    CUmemGenericAllocationHandle h[2];
    DCHECK(cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
    for (int i = 0; i < 2; i++) {
        DCHECK(cuMemCreate(&h[i], 2 * g, &prop, 0));
        DCHECK(cuMemMap(va + (size_t)i * 2 * g, 2 * g, 0, h[i], 0));
    }
    DCHECK(cuMemSetAccess(va, 4 * g, &rw, 1));
    DCHECK(cuMemsetD8(va, 0x6b, 4 * g));
    printf("vmm=%llu\n", dev_sum((void *)va, 4 * g));
    for (int i = 0; i < 2; i++) {
        DCHECK(cuMemUnmap(va + (size_t)i * 2 * g, 2 * g));
        DCHECK(cuMemRelease(h[i]));
    }
    DCHECK(cuMemAddressFree(va, 4 * g));
    for (int i = 0; i < 6; i++)
        CHECK(cudaFree(a[i]));
    CHECK(cudaStreamDestroy(st));
    printf("used_end=%llu\n", used_bytes());
    return 0;
}
