/* simcuda's managed, pitched/3D, pool and host-registration entry points, one case per
 * argv[1]; prints "PASS <case>" on success. Behaviour as CUDA documents it. */
#include <cuda.h>
#include <cuda_runtime.h>
#include "sim_check.h"

#define MiB (1ull << 20)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    size_t f0, f, t;
    EXPECT(cudaSuccess, cudaMemGetInfo(&f0, &t));
    CASE("managed") {
        void *p = NULL;
        EXPECT(cudaErrorInvalidValue, cudaMallocManaged(&p, 0, cudaMemAttachGlobal));
        EXPECT(cudaErrorInvalidValue, cudaMallocManaged(&p, 4096, 3));
        EXPECT(cudaSuccess, cudaMallocManaged(&p, 1 * MiB, cudaMemAttachHost));
        memset(p, 5, 1 * MiB); /* the host can touch it */
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(f == f0 - 1 * MiB);
        CUdeviceptr d = 0;
        EXPECT(CUDA_SUCCESS, cuMemAllocManaged(&d, 4096, CU_MEM_ATTACH_GLOBAL));
        EXPECT(CUDA_SUCCESS, cuMemFree(d));
        EXPECT(cudaSuccess, cudaFree(p));
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(f == f0);
    }
    CASE("pitched") {
        void *p = NULL;
        size_t pitch = 0;
        EXPECT(cudaSuccess, cudaMallocPitch(&p, &pitch, 1000, 10));
        REQUIRE(pitch == 1024 && p != NULL);
        EXPECT(cudaSuccess, cudaMemset(p, 1, pitch * 10));
        struct cudaPitchedPtr pp;
        EXPECT(cudaSuccess, cudaMalloc3D(&pp, make_cudaExtent(513, 4, 3)));
        REQUIRE(pp.pitch == 1024 && pp.xsize == 513 && pp.ysize == 4 && pp.ptr != NULL);
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(f == f0 - 1024 * 10 - 1024 * 12);
        CUdeviceptr d = 0;
        size_t dp = 0;
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemAllocPitch(&d, &dp, 100, 10, 3));
        EXPECT(CUDA_SUCCESS, cuMemAllocPitch(&d, &dp, 100, 10, 4));
        REQUIRE(dp == 512);
        EXPECT(CUDA_SUCCESS, cuMemFree(d));
        EXPECT(cudaSuccess, cudaFree(p));
        EXPECT(cudaSuccess, cudaFree(pp.ptr));
    }
    CASE("pools") {
        cudaMemPool_t pool;
        EXPECT(cudaSuccess, cudaDeviceGetDefaultMemPool(&pool, 0));
        EXPECT(cudaErrorInvalidDevice, cudaDeviceGetDefaultMemPool(&pool, 7));
        cudaStream_t s;
        EXPECT(cudaSuccess, cudaStreamCreate(&s));
        void *p = NULL;
        EXPECT(cudaSuccess, cudaMallocFromPoolAsync(&p, 8192, pool, s));
        EXPECT(cudaErrorInvalidValue, cudaMallocFromPoolAsync(&p, 8192, (cudaMemPool_t)0x1234, s));
        EXPECT(cudaSuccess, cudaFreeAsync(p, s));
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        CUmemoryPool mine;
        EXPECT(CUDA_SUCCESS, cuMemPoolCreate(&mine, &props));
        CUdeviceptr d = 0;
        EXPECT(CUDA_SUCCESS, cuMemAllocFromPoolAsync(&d, 4096, mine, NULL));
        EXPECT(CUDA_SUCCESS, cuMemFreeAsync(d, NULL));
        EXPECT(CUDA_SUCCESS, cuCtxSynchronize());
        EXPECT(CUDA_SUCCESS, cuMemPoolDestroy(mine));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemPoolDestroy(mine));
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(f == f0);
    }
    CASE("host_register") {
        char *buf = aligned_alloc(4096, 65536);
        EXPECT(cudaSuccess, cudaHostRegister(buf, 65536, cudaHostRegisterDefault));
        EXPECT(712, cudaHostRegister(buf + 4096, 4096, 0)); /* already registered */
        EXPECT(cudaErrorInvalidValue, cudaHostRegister(buf, 0, 0));
        EXPECT(713, cudaHostUnregister(buf + 4096)); /* not the start of a registration */
        EXPECT(cudaSuccess, cudaHostUnregister(buf));
        EXPECT(713, cudaHostUnregister(buf));
        EXPECT(CUDA_SUCCESS, cuMemHostRegister(buf, 8192, CU_MEMHOSTREGISTER_PORTABLE));
        EXPECT(CUDA_SUCCESS, cuMemHostUnregister(buf));
        free(buf);
    }
    PASS_CASE();
    return 0;
}
