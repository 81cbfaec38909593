/* simcuda driver behaviours, one case per argv[1]; prints "PASS <case>" on success. */
#include <cuda.h>
#include <stdint.h>
#include "sim_check.h"

static void ctx0(void) {
    CUcontext ctx;
    EXPECT(CUDA_SUCCESS, cuInit(0));
    EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, 0));
    EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(ctx));
}

#include <pthread.h>

static CUcontext shared_ctx;
static void *churn(void *arg) {
    int id = (int)(size_t)arg;
    EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(shared_ctx));
    CUdeviceptr keep[16];
    for (int round = 0; round < 2000; round++) {
        for (int i = 0; i < 16; i++) {
            size_t size = 512 + (size_t)((round * 31 + i * 7 + id) % 64) * 512;
            EXPECT(CUDA_SUCCESS, cuMemAlloc(&keep[i], size));
            memset((void *)keep[i], id, 512);
        }
        for (int i = 0; i < 16; i++) {
            REQUIRE(((unsigned char *)keep[i])[511] == (unsigned char)id);
            EXPECT(CUDA_SUCCESS, cuMemFree(keep[i]));
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUdeviceptr d = 0, e = 0;
    CASE("calls_before_init_fail") {
        int n;
        EXPECT(CUDA_ERROR_NOT_INITIALIZED, cuMemAlloc(&d, 16));
        EXPECT(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&n));
        EXPECT(CUDA_ERROR_NOT_INITIALIZED, cuCtxSynchronize());
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuInit(1));
        EXPECT(CUDA_SUCCESS, cuInit(0));
        EXPECT(CUDA_SUCCESS, cuDeviceGetCount(&n));
        REQUIRE(n == 1);
    }
    CASE("memory_calls_need_a_context") {
        size_t f, t;
        CUcontext cur = (CUcontext)0x1;
        EXPECT(CUDA_SUCCESS, cuInit(0));
        EXPECT(CUDA_SUCCESS, cuCtxGetCurrent(&cur));
        REQUIRE(cur == NULL);
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&d, 16));
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuMemGetInfo(&f, &t));
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuCtxSetCurrent((CUcontext)0x1234));
        ctx0();
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, 16));
        int dev = -1;
        EXPECT(CUDA_SUCCESS, cuCtxGetDevice(&dev));
        REQUIRE(dev == 0);
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(NULL));
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuMemFree(d));
    }
    CASE("alloc_free_errors") {
        ctx0();
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&d, 0));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(NULL, 16));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemFree(0x12345));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, 1000));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemFree(d + 512));
        EXPECT(CUDA_SUCCESS, cuMemFree(d));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemFree(d));
    }
    CASE("allocations_are_aligned_and_disjoint") {
        ctx0();
        CUdeviceptr ptrs[200];
        size_t sizes[200];
        for (int i = 0; i < 200; i++) {
            sizes[i] = 1 + (size_t)i * 37 % 5000;
            EXPECT(CUDA_SUCCESS, cuMemAlloc(&ptrs[i], sizes[i]));
            REQUIRE(ptrs[i] % 512 == 0);
            memset((void *)ptrs[i], i & 0xff, sizes[i]);
        }
        for (int i = 0; i < 200; i++) {
            unsigned char *c = (unsigned char *)ptrs[i];
            for (size_t j = 0; j < sizes[i]; j++) REQUIRE(c[j] == (i & 0xff));
        }
        for (int i = 0; i < 200; i += 2) EXPECT(CUDA_SUCCESS, cuMemFree(ptrs[i]));
        size_t f, t;
        for (int i = 1; i < 200; i += 2) EXPECT(CUDA_SUCCESS, cuMemFree(ptrs[i]));
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
        REQUIRE(f == t);
    }
    CASE("address_range_of_interior_pointer") {
        ctx0();
        CUdeviceptr base = 0;
        size_t size = 0;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, 1000));
        EXPECT(CUDA_SUCCESS, cuMemGetAddressRange(&base, &size, d + 999));
        REQUIRE(base == d && size == 1024);
        EXPECT(CUDA_SUCCESS, cuMemGetAddressRange(NULL, &size, d));
        EXPECT(CUDA_ERROR_NOT_FOUND, cuMemGetAddressRange(&base, &size, 0x1000));
    }
    CASE("copies_and_sets") {
        ctx0();
        char h[256], back[256];
        for (int i = 0; i < 256; i++) h[i] = (char)i;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, 256));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&e, 256));
        EXPECT(CUDA_SUCCESS, cuMemcpyHtoD(d, h, 256));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoD(e, d, 256));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(back, e, 256));
        REQUIRE(memcmp(h, back, 256) == 0);
        EXPECT(CUDA_SUCCESS, cuMemsetD8(e, 7, 256));
        REQUIRE(((char *)e)[255] == 7);
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD((CUdeviceptr)(uintptr_t)back, h, 256));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(d, 0, 513));
    }
    CASE("error_names") {
        const char *s = NULL;
        EXPECT(CUDA_SUCCESS, cuGetErrorName(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, &s));
        REQUIRE(!strcmp(s, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"));
        EXPECT(CUDA_SUCCESS, cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
        REQUIRE(!strcmp(s, "out of memory"));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuGetErrorName((CUresult)12345, &s));
        REQUIRE(s == NULL);
    }
    CASE("device_queries") { /* SIMCUDA_MEM_MB=512 */
        int v = -1;
        char name[64];
        size_t total = 0;
        EXPECT(CUDA_SUCCESS, cuInit(0));
        EXPECT(CUDA_SUCCESS, cuDriverGetVersion(&v));
        REQUIRE(v == 12090);
        EXPECT(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&v, 1));
        EXPECT(CUDA_SUCCESS, cuDeviceGet(&v, 0));
        EXPECT(CUDA_SUCCESS, cuDeviceGetName(name, sizeof name, 0));
        REQUIRE(!strcmp(name, "simcuda Device 0"));
        EXPECT(CUDA_SUCCESS, cuDeviceTotalMem(&total, 0));
        REQUIRE(total == 512u << 20);
        EXPECT(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
        REQUIRE(v == 1);
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(&v, (CUdevice_attribute)100000, 0));
    }
    CASE("vmm_disabled") { /* SIMCUDA_VMM=0 */
        int v = -1;
        ctx0();
        EXPECT(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
        REQUIRE(v == 0);
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUmemGenericAllocationHandle h;
        EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemCreate(&h, 2 << 20, &prop, 0));
        EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemAddressReserve(&d, 2 << 20, 0, 0, 0));
    }
    CASE("primary_context_refcount") {
        CUcontext a, b;
        unsigned flags;
        int active = -1;
        EXPECT(CUDA_SUCCESS, cuInit(0));
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxGetState(0, &flags, &active));
        REQUIRE(active == 0);
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&a, 0));
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&b, 0));
        REQUIRE(a == b);
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxGetState(0, &flags, &active));
        REQUIRE(active == 1);
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRelease(0));
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRelease(0));
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuDevicePrimaryCtxRelease(0));
    }
    CASE("concurrent_alloc_free") {
        ctx0();
        EXPECT(CUDA_SUCCESS, cuCtxGetCurrent(&shared_ctx));
        pthread_t t[8];
        for (int i = 0; i < 8; i++) REQUIRE(pthread_create(&t[i], NULL, churn, (void *)(size_t)(i + 1)) == 0);
        for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
        size_t f, tot;
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &tot));
        REQUIRE(f == tot);
    }
    PASS_CASE();
    return 0;
}
