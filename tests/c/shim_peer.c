/* Peer access onto expandable segments, two simulated devices, one case per argv[1];
 * prints "PASS <case>". Run under the shim with expandable segments: cudaMalloc memory on
 * device 0 then lies in mapped virtual-memory pages, whose access cuMemGetAccess reports
 * per device (without the shim cudaMalloc memory is no mapping and cuMemGetAccess refuses
 * it, so these cases fail). "runtime": cudaDeviceEnablePeerAccess / Disable; "driver":
 * cuCtxEnablePeerAccess / Disable (and the matching asynchronous peer copy). Pages mapped
 * before and after enabling are checked. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include "sim_check.h"

#define MiB (1ull << 20)

static unsigned long long access_of(void *p, int dev) {
    CUmemLocation l;
    l.type = CU_MEM_LOCATION_TYPE_DEVICE;
    l.id = dev;
    unsigned long long f = 99;
    EXPECT(CUDA_SUCCESS, cuMemGetAccess(&f, &l, (CUdeviceptr)p));
    return f;
}

/* 40 MiB on device 0: more pages mapped by the cache */
static void *grow(void) {
    void *p;
    EXPECT(cudaSuccess, cudaSetDevice(0));
    EXPECT(cudaSuccess, cudaMalloc(&p, 40 * MiB));
    return p;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    int driver = !strcmp(argv[1], "driver");
    REQUIRE(driver || !strcmp(argv[1], "runtime"));
    void *before, *on1;
    EXPECT(cudaSuccess, cudaSetDevice(1));
    EXPECT(cudaSuccess, cudaMalloc(&on1, 4 * MiB));
    EXPECT(cudaSuccess, cudaSetDevice(0));
    EXPECT(cudaSuccess, cudaMalloc(&before, 4 * MiB));
    EXPECT(cudaSuccess, cudaMemset(before, 0x21, 4 * MiB));
    REQUIRE(access_of(before, 0) == 3);
    REQUIRE(access_of(before, 1) == 0);
    /* device 1 cannot write device 0's expandable pages before peer access */
    EXPECT(cudaSuccess, cudaSetDevice(1));
    EXPECT(cudaErrorIllegalAddress, cudaMemset(before, 0x21, 16));
    EXPECT(cudaSuccess, cudaSetDevice(0));
    /* copies between devices work without peer access (the driver stages them) */
    EXPECT(cudaSuccess, cudaMemcpyPeer(on1, 1, before, 0, 4 * MiB));

    CUcontext c0, c1;
    EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c0, 0));
    EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c1, 1));
    /* device 1 enables access to device 0's memory */
    EXPECT(cudaSuccess, cudaSetDevice(1));
    if (driver)
        EXPECT(CUDA_SUCCESS, cuCtxEnablePeerAccess(c0, 0));
    else
        EXPECT(cudaSuccess, cudaDeviceEnablePeerAccess(0, 0));
    REQUIRE(access_of(before, 1) == 3);
    REQUIRE(access_of((char *)before + 4 * MiB - 1, 1) == 3);
    EXPECT(cudaSuccess, cudaMemset(before, 0x21, 16));
    REQUIRE(access_of(before, 0) == 3);
    void *after = grow();
    REQUIRE(access_of(after, 1) == 3 && access_of((char *)after + 40 * MiB - 1, 1) == 3);
    REQUIRE(access_of(after, 0) == 3);
    EXPECT(cudaSuccess, cudaMemcpyPeer(after, 0, on1, 1, 4 * MiB));
    unsigned char x;
    EXPECT(cudaSuccess, cudaMemcpy(&x, (char *)after + 4 * MiB - 1, 1, cudaMemcpyDeviceToHost));
    REQUIRE(x == 0x21);
    /* asynchronous peer copies out of expandable pages, on a stream of device 0, in order */
    cudaStream_t s;
    EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    EXPECT(cudaSuccess, cudaMemsetAsync(after, 0x5a, 4 * MiB, s));
    if (driver)
        EXPECT(CUDA_SUCCESS, cuMemcpyPeerAsync((CUdeviceptr)on1, c1, (CUdeviceptr)after, c0, 4 * MiB, (CUstream)s));
    else
        EXPECT(cudaSuccess, cudaMemcpyPeerAsync(on1, 1, after, 0, 4 * MiB, s));
    EXPECT(cudaSuccess, cudaStreamSynchronize(s));
    EXPECT(cudaSuccess, cudaMemcpy(&x, (char *)on1 + 4 * MiB - 1, 1, cudaMemcpyDeviceToHost));
    REQUIRE(x == 0x5a);
    EXPECT(cudaSuccess, cudaStreamDestroy(s));
    /* a device's own pages are not its peer's business: device 0's access to device 1's
     * memory is unchanged */
    REQUIRE(access_of(on1, 0) == 0);

    EXPECT(cudaSuccess, cudaSetDevice(1));
    if (driver)
        EXPECT(CUDA_SUCCESS, cuCtxDisablePeerAccess(c0));
    else
        EXPECT(cudaSuccess, cudaDeviceDisablePeerAccess(0));
    REQUIRE(access_of(before, 1) == 0 && access_of(after, 1) == 0);
    REQUIRE(access_of(before, 0) == 3 && access_of(after, 0) == 3);
    void *later = grow();
    REQUIRE(access_of(later, 1) == 0 && access_of(later, 0) == 3);
    EXPECT(cudaSuccess, cudaFree(before));
    EXPECT(cudaSuccess, cudaFree(after));
    EXPECT(cudaSuccess, cudaFree(later));
    EXPECT(cudaSuccess, cudaSetDevice(1));
    EXPECT(cudaSuccess, cudaFree(on1));
    printf("PASS %s\n", argv[1]);
    return 0;
}
