/* simcuda runtime behaviours, one case per argv[1]; prints "PASS <case>" on success. */
#include <cuda.h>
#include <cuda_runtime.h>
#include "sim_check.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *p = NULL, *q = NULL;
    CASE("malloc_zero") {
        p = (void *)0x1;
        EXPECT(cudaSuccess, cudaMalloc(&p, 0));
        REQUIRE(p == NULL);
    }
    CASE("free_unknown_and_double") {
        EXPECT(cudaErrorInvalidValue, cudaFree((void *)0x12345));
        EXPECT(cudaSuccess, cudaMalloc(&p, 100));
        EXPECT(cudaSuccess, cudaFree(p));
        EXPECT(cudaErrorInvalidValue, cudaFree(p));
        EXPECT(cudaSuccess, cudaFree(NULL));
    }
    CASE("last_error_sticky") {
        EXPECT(cudaSuccess, cudaGetLastError());
        EXPECT(cudaErrorInvalidValue, cudaFree((void *)0x12345));
        EXPECT(cudaSuccess, cudaMalloc(&p, 64));
        EXPECT(cudaErrorInvalidValue, cudaPeekAtLastError());
        EXPECT(cudaErrorInvalidValue, cudaPeekAtLastError());
        EXPECT(cudaErrorInvalidValue, cudaGetLastError());
        EXPECT(cudaSuccess, cudaGetLastError());
        EXPECT(cudaSuccess, cudaPeekAtLastError());
    }
    CASE("null_out_pointers") {
        EXPECT(cudaErrorInvalidValue, cudaMalloc(NULL, 16));
        EXPECT(cudaErrorInvalidValue, cudaGetDevice(NULL));
        EXPECT(cudaErrorInvalidValue, cudaGetDeviceCount(NULL));
        EXPECT(cudaErrorInvalidValue, cudaStreamCreate(NULL));
        EXPECT(cudaErrorInvalidValue, cudaEventCreate(NULL));
        EXPECT(cudaErrorInvalidValue, cudaMallocHost(NULL, 16));
        EXPECT(cudaErrorInvalidValue, cudaPointerGetAttributes(NULL, &p));
        size_t t;
        EXPECT(cudaErrorInvalidValue, cudaMemGetInfo(NULL, &t));
    }
    CASE("memcpy_memset_roundtrip") {
        unsigned char h[1000], back[1000];
        for (int i = 0; i < 1000; i++) h[i] = (unsigned char)i;
        EXPECT(cudaSuccess, cudaMalloc(&p, 1000));
        EXPECT(cudaSuccess, cudaMalloc(&q, 1000));
        EXPECT(cudaSuccess, cudaMemcpy(p, h, 1000, cudaMemcpyHostToDevice));
        REQUIRE(memcmp(p, h, 1000) == 0); /* device memory is host-readable in simcuda */
        EXPECT(cudaSuccess, cudaMemcpy(q, p, 1000, cudaMemcpyDeviceToDevice));
        EXPECT(cudaSuccess, cudaMemcpy(back, q, 1000, cudaMemcpyDeviceToHost));
        REQUIRE(memcmp(back, h, 1000) == 0);
        EXPECT(cudaSuccess, cudaMemset(q, 0xab, 1000));
        EXPECT(cudaSuccess, cudaMemcpy(back, q, 1000, cudaMemcpyDefault));
        for (int i = 0; i < 1000; i++) REQUIRE(back[i] == 0xab);
    }
    CASE("memcpy_bad_arguments") {
        unsigned char h[64];
        EXPECT(cudaSuccess, cudaMalloc(&p, 64));
        EXPECT(cudaErrorInvalidMemcpyDirection, cudaMemcpy(p, h, 64, (enum cudaMemcpyKind)7));
        EXPECT(cudaErrorInvalidValue, cudaMemcpy(h, h, 64, cudaMemcpyHostToDevice));
        EXPECT(cudaErrorInvalidValue, cudaMemcpy(p, h, 4096, cudaMemcpyHostToDevice));
        EXPECT(cudaErrorInvalidValue, cudaMemset(h, 0, 64));
    }
    CASE("capacity_oom_and_exact_info") { /* SIMCUDA_MEM_MB=64 */
        size_t f, t;
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(t == 64u << 20 && f == t);
        EXPECT(cudaErrorMemoryAllocation, cudaMalloc(&p, (64u << 20) + 1));
        EXPECT(cudaErrorMemoryAllocation, cudaGetLastError());
        EXPECT(cudaSuccess, cudaMalloc(&p, 1000));
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(f == t - 1024);
        EXPECT(cudaSuccess, cudaMalloc(&q, (64u << 20) - 1024));
        EXPECT(cudaErrorMemoryAllocation, cudaMalloc(&p, 1));
        EXPECT(cudaSuccess, cudaFree(q));
        EXPECT(cudaSuccess, cudaMalloc(&q, 1 << 20));
    }
    CASE("error_names_and_strings") {
        REQUIRE(!strcmp(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation"));
        REQUIRE(!strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory"));
        REQUIRE(!strcmp(cudaGetErrorName(cudaErrorStreamCaptureUnsupported), "cudaErrorStreamCaptureUnsupported"));
        REQUIRE(!strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument"));
        REQUIRE(!strcmp(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady"));
        REQUIRE(!strcmp(cudaGetErrorString((cudaError_t)12345), "unrecognized error code"));
    }
    CASE("device_properties") { /* SIMCUDA_MEM_MB=1024 */
        struct cudaDeviceProp prop;
        memset(&prop, 0x5a, sizeof prop);
        EXPECT(cudaSuccess, cudaGetDeviceProperties(&prop, 0));
        REQUIRE(!strcmp(prop.name, "simcuda Device 0"));
        REQUIRE(prop.totalGlobalMem == 1024ull << 20);
        REQUIRE(prop.major == 9 && prop.warpSize == 32 && prop.multiProcessorCount > 0);
        REQUIRE(prop.reserved[62] == 0);
        EXPECT(cudaErrorInvalidDevice, cudaGetDeviceProperties(&prop, 1));
    }
    CASE("multi_device") { /* SIMCUDA_DEVICES=2 */
        int n = 0, d = -1;
        EXPECT(cudaSuccess, cudaGetDeviceCount(&n));
        REQUIRE(n == 2);
        EXPECT(cudaErrorInvalidDevice, cudaSetDevice(2));
        EXPECT(cudaSuccess, cudaSetDevice(1));
        EXPECT(cudaSuccess, cudaGetDevice(&d));
        REQUIRE(d == 1);
        EXPECT(cudaSuccess, cudaMalloc(&p, 4096));
        struct cudaPointerAttributes a;
        EXPECT(cudaSuccess, cudaPointerGetAttributes(&a, p));
        REQUIRE(a.type == cudaMemoryTypeDevice && a.device == 1 && a.devicePointer == p);
        CUcontext cur = NULL, prim = NULL;
        EXPECT(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&prim, 1));
        REQUIRE(cur != NULL && cur == prim);
        size_t f0, f1, t;
        EXPECT(cudaSuccess, cudaMemGetInfo(&f1, &t));
        EXPECT(cudaSuccess, cudaSetDevice(0));
        EXPECT(cudaSuccess, cudaMemGetInfo(&f0, &t));
        REQUIRE(f0 == t && f1 == t - 4096);
        EXPECT(cudaSuccess, cudaFree(p));
    }
    CASE("runtime_makes_primary_context_current") {
        CUcontext cur = (CUcontext)0x1, prim = NULL;
        EXPECT(cudaSuccess, cudaFree(0));
        EXPECT(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&prim, 0));
        REQUIRE(cur != NULL && cur == prim);
        CUdeviceptr dp;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&dp, 256));
        EXPECT(cudaSuccess, cudaFree((void *)dp));
    }
    CASE("pointer_attributes") {
        int local;
        struct cudaPointerAttributes a;
        EXPECT(cudaSuccess, cudaMalloc(&p, 1024));
        EXPECT(cudaSuccess, cudaMallocHost(&q, 1024));
        EXPECT(cudaSuccess, cudaPointerGetAttributes(&a, (char *)p + 100));
        REQUIRE(a.type == cudaMemoryTypeDevice && a.device == 0);
        EXPECT(cudaSuccess, cudaPointerGetAttributes(&a, q));
        REQUIRE(a.type == cudaMemoryTypeHost && a.hostPointer == q);
        EXPECT(cudaSuccess, cudaPointerGetAttributes(&a, &local));
        REQUIRE(a.type == cudaMemoryTypeUnregistered);
    }
    CASE("versions") {
        int v = 0;
        EXPECT(cudaSuccess, cudaDriverGetVersion(&v));
        REQUIRE(v == CUDA_VERSION);
        EXPECT(cudaSuccess, cudaRuntimeGetVersion(&v));
        REQUIRE(v == CUDART_VERSION);
    }
    CASE("pinned_host_flags_and_capacity") { /* SIMCUDA_HOST_MEM_MB=8 */
        unsigned flags[] = {0, cudaHostAllocPortable, cudaHostAllocMapped, cudaHostAllocWriteCombined, 7};
        for (int i = 0; i < 5; i++) {
            EXPECT(cudaSuccess, cudaHostAlloc(&p, 4096, flags[i]));
            REQUIRE(((size_t)p & 4095) == 0);
            memset(p, 1, 4096);
            EXPECT(cudaSuccess, cudaFreeHost(p));
        }
        EXPECT(cudaErrorInvalidValue, cudaHostAlloc(&p, 4096, 8));
        EXPECT(cudaErrorMemoryAllocation, cudaMallocHost(&p, 9u << 20));
        EXPECT(cudaSuccess, cudaMallocHost(&p, 4u << 20));
        EXPECT(cudaErrorInvalidValue, cudaFreeHost((char *)p + 1));
        EXPECT(cudaSuccess, cudaFreeHost(p));
        EXPECT(cudaErrorInvalidValue, cudaFreeHost(p));
    }
    CASE("device_reset_frees_allocations") {
        size_t f, t;
        EXPECT(cudaSuccess, cudaMalloc(&p, 1 << 20));
        EXPECT(cudaSuccess, cudaDeviceReset());
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(f == t);
        EXPECT(cudaErrorInvalidValue, cudaFree(p));
    }
    CASE("no_devices") { /* SIMCUDA_DEVICES=0 */
        int n = 5;
        EXPECT(cudaErrorNoDevice, cudaGetDeviceCount(&n));
        REQUIRE(n == 0);
        EXPECT(cudaErrorNoDevice, cudaMalloc(&p, 16));
        EXPECT(CUDA_ERROR_NO_DEVICE, cuInit(0));
    }
    PASS_CASE();
    return 0;
}
