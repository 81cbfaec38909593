/* Every allocation family, through the runtime and the driver API, for the observing-mode
 * and unexplained-memory tests. Prints device pointers and results as key=value words (the
 * same with and without the shim when it only observes), "hidden=" the bytes the driver-API
 * part leaves allocated, and "done". Each family allocates in its own function, so a
 * snapshot's stacks can be checked by name. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1ull << 20)
#define CK(x)                                                          \
    do {                                                               \
        int rc_ = (int)(x);                                            \
        if (rc_) {                                                     \
            printf("FAIL %s = %d at line %d\n", #x, rc_, __LINE__);    \
            exit(1);                                                   \
        }                                                              \
    } while (0)
#define NOINLINE __attribute__((noinline))

NOINLINE void *alloc_plain(size_t n) {
    void *p = NULL;
    CK(cudaMalloc(&p, n));
    return p;
}

NOINLINE void *alloc_managed(size_t n) {
    void *p = NULL;
    CK(cudaMallocManaged(&p, n, cudaMemAttachGlobal));
    return p;
}

NOINLINE void *alloc_pitched(size_t w, size_t h, size_t *pitch) {
    void *p = NULL;
    CK(cudaMallocPitch(&p, pitch, w, h));
    return p;
}

NOINLINE struct cudaPitchedPtr alloc_3d(size_t w, size_t h, size_t d) {
    struct cudaPitchedPtr pp;
    CK(cudaMalloc3D(&pp, make_cudaExtent(w, h, d)));
    return pp;
}

NOINLINE void *alloc_from_pool(cudaMemPool_t pool, size_t n, cudaStream_t s) {
    void *p = NULL;
    CK(cudaMallocFromPoolAsync(&p, n, pool, s));
    return p;
}

NOINLINE void register_host(void *buf, size_t n) { CK(cudaHostRegister(buf, n, 0)); }

NOINLINE CUdeviceptr map_physical(CUdeviceptr va, size_t n, CUmemGenericAllocationHandle *h) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CK(cuMemCreate(h, n, &prop, 0));
    CK(cuMemMap(va, n, 0, *h, 0));
    CUmemAccessDesc rw;
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(va, n, &rw, 1));
    return va;
}

NOINLINE CUdeviceptr driver_managed(size_t n) {
    CUdeviceptr p = 0;
    CK(cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL));
    return p;
}

NOINLINE CUdeviceptr driver_pitched(size_t w, size_t h, size_t *pitch) {
    CUdeviceptr p = 0;
    CK(cuMemAllocPitch(&p, pitch, w, h, 4));
    return p;
}

int main(void) {
    cudaStream_t s;
    void *a = alloc_plain(3 * MiB);
    void *b = alloc_plain(1000);
    printf("plain=%p plain2=%p\n", a, b);
    CK(cudaFree(b));
    CK(cudaStreamCreate(&s));
    void *c = NULL;
    CK(cudaMallocAsync(&c, 4096, s));
    printf("async=%p\n", c);
    CK(cudaFreeAsync(c, s));
    CK(cudaStreamSynchronize(s));

    void *m = alloc_managed(2 * MiB);
    ((char *)m)[0] = 1; /* managed memory is host-accessible */
    size_t pitch = 0;
    void *p = alloc_pitched(1000, 64, &pitch);
    struct cudaPitchedPtr pp = alloc_3d(700, 8, 4);
    printf("managed=%p pitched=%p pitch=%zu p3d=%p pitch3d=%zu\n", m, p, pitch, pp.ptr, pp.pitch);
    CK(cudaFree(pp.ptr));

    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    void *q = alloc_from_pool(pool, 8192, s);
    void *q2 = alloc_from_pool(pool, 4096, s);
    printf("pool=%p pool2=%p\n", q, q2);
    CK(cudaFreeAsync(q2, s));
    CK(cudaStreamSynchronize(s));

    void *buf = aligned_alloc(4096, 65536);
    register_host(buf, 65536);
    void *pinned = NULL;
    CK(cudaHostAlloc(&pinned, 4096, 0));

    /* The driver-API part (hidden from a shim that intercepts only the runtime). */
    CUdeviceptr va = 0;
    CK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
    CUmemGenericAllocationHandle h1, h2;
    map_physical(va, 2 * MiB, &h1);
    map_physical(va + 2 * MiB, 2 * MiB, &h2);
    CK(cudaMemset((void *)va, 7, 4 * MiB));
    CK(cuMemRelease(h1)); /* still mapped: its memory stays */
    CK(cuMemUnmap(va + 2 * MiB, 2 * MiB));
    CK(cuMemRelease(h2)); /* unmapped and released: gone */
    CUdeviceptr dm = driver_managed(1 * MiB);
    size_t dpitch = 0;
    CUdeviceptr dp = driver_pitched(100, 10, &dpitch);
    CUdeviceptr dp2 = driver_pitched(100, 3, &dpitch);
    CK(cuMemFree(dp2));
    CUdeviceptr dq = 0;
    CK(cuMemAllocFromPoolAsync(&dq, 4096, (CUmemoryPool)pool, NULL));
    CK(cuMemFreeAsync(dq, NULL));
    char *buf2 = aligned_alloc(4096, 8192);
    CK(cuMemHostRegister(buf2, 8192, 0));
    CK(cuMemHostUnregister(buf2));
    printf("va=%#llx dmanaged=%#llx dpitched=%#llx dpitch=%zu dpool=%#llx\n",
           (unsigned long long)va, (unsigned long long)dm, (unsigned long long)dp, dpitch,
           (unsigned long long)dq);
    printf("hidden=%zu\n", (size_t)(2 * MiB + 1 * MiB + dpitch * 10));
    CK(cudaDeviceSynchronize()); /* the stream-ordered frees are done */

    size_t f = 0, t = 0;
    CK(cudaMemGetInfo(&f, &t));
    printf("free=%zu total=%zu\n", f, t);
    printf("done\n");
    return 0;
}
