/* simcuda virtual memory management, one case per argv[1]; prints "PASS <case>" on success.
 * The touch_* cases are meant to die of SIGSEGV, as a GPU program touching unmapped memory
 * would fault. */
#include <cuda.h>
#include <cuda_runtime.h>
#include "sim_check.h"

#define MiB (1ull << 20)

static CUmemAllocationProp prop0(void) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

static CUmemAccessDesc rw0(void) {
    CUmemAccessDesc d;
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUcontext ctx;
    EXPECT(CUDA_SUCCESS, cuInit(0));
    EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, 0));
    EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(ctx));
    CUmemAllocationProp prop = prop0();
    CUmemAccessDesc rw = rw0();
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    size_t g = 0, f0, f, t;
    EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f0, &t));
    CASE("map_access_unmap_roundtrip") {
        EXPECT(CUDA_SUCCESS, cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        REQUIRE(g == 2 * MiB);
        EXPECT(CUDA_SUCCESS, cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        REQUIRE(g == 2 * MiB);
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
        REQUIRE(va % (2 * MiB) == 0);
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 4 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
        REQUIRE(f == f0 - 4 * MiB);
        EXPECT(CUDA_SUCCESS, cuMemMap(va + 2 * MiB, 4 * MiB, 0, h, 0));
        EXPECT(CUDA_SUCCESS, cuMemSetAccess(va + 2 * MiB, 4 * MiB, &rw, 1));
        memset((void *)(va + 2 * MiB), 0x3c, 4 * MiB);
        unsigned char back[16];
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(back, va + 6 * MiB - 16, 16));
        REQUIRE(back[15] == 0x3c);
        EXPECT(cudaSuccess, cudaMemset((void *)(va + 2 * MiB), 1, 4096));
        REQUIRE(((unsigned char *)va)[2 * MiB + 4095] == 1);
        CUdeviceptr base;
        size_t size;
        EXPECT(CUDA_SUCCESS, cuMemGetAddressRange(&base, &size, va + 3 * MiB));
        REQUIRE(base == va + 2 * MiB && size == 4 * MiB);
        EXPECT(CUDA_SUCCESS, cuMemUnmap(va + 2 * MiB, 4 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemRelease(h));
        EXPECT(CUDA_SUCCESS, cuMemAddressFree(va, 8 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
        REQUIRE(f == f0);
    }
    CASE("remap_physical_memory_keeps_contents") {
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        EXPECT(CUDA_SUCCESS, cuMemSetAccess(va, 2 * MiB, &rw, 1));
        ((int *)va)[100] = 4242;
        EXPECT(CUDA_SUCCESS, cuMemUnmap(va, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemMap(va + 6 * MiB, 2 * MiB, 0, h, 0));
        EXPECT(CUDA_SUCCESS, cuMemSetAccess(va + 6 * MiB, 2 * MiB, &rw, 1));
        REQUIRE(((int *)(va + 6 * MiB))[100] == 4242);
    }
    CASE("bad_maps_are_rejected") {
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, 3 * MiB, 0, 0, 0));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(NULL, 2 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 3 * MiB, &prop, 0));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 0, &prop, 0));
        CUmemAllocationProp bad = prop;
        bad.location.id = 5;
        EXPECT(CUDA_ERROR_INVALID_DEVICE, cuMemCreate(&h, 2 * MiB, &bad, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 4096, 2 * MiB, 0, h, 0));      /* misaligned */
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 8 * MiB, 2 * MiB, 0, h, 0));   /* outside */
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 6 * MiB, 4 * MiB, 0, h, 0));   /* too big */
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 2 * MiB, 0, 0xdead, 0));        /* no handle */
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 2 * MiB, 2 * MiB, h, 0));       /* offset */
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h2, 2 * MiB, &prop, 0));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 2 * MiB, 0, h2, 0));            /* overlap */
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va + 2 * MiB, 2 * MiB));          /* not mapped */
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, 4 * MiB));                    /* part unmapped */
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va + 2 * MiB, 2 * MiB, &rw, 1));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va, 2 * MiB, NULL, 1));
        /* mapped but not accessible: copies are refused, not crashes */
        char buf[16];
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyDtoH(buf, va, 16));
        /* accessible mapping, but the copy reaches into the unmapped rest of the reservation */
        EXPECT(CUDA_SUCCESS, cuMemSetAccess(va, 2 * MiB, &rw, 1));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(buf, va + 2 * MiB - 16, 16));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyDtoH(buf, va + 2 * MiB - 8, 16));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyDtoH(buf, va + 2 * MiB + 64, 16));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, 4 * MiB));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemRelease(0xdead));
        EXPECT(CUDA_SUCCESS, cuMemRelease(h2));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h2));
    }
    CASE("release_while_mapped_frees_at_unmap") {
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        EXPECT(CUDA_SUCCESS, cuMemRelease(h));
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
        REQUIRE(f == f0 - 2 * MiB);
        EXPECT(CUDA_SUCCESS, cuMemSetAccess(va, 2 * MiB, &rw, 1));
        ((char *)va)[0] = 1;
        EXPECT(CUDA_SUCCESS, cuMemUnmap(va, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
        REQUIRE(f == f0);
    }
    CASE("physical_memory_counts_against_capacity") { /* SIMCUDA_MEM_MB=5 */
        CUdeviceptr d;
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h2, 2 * MiB, &prop, 0));
        EXPECT(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc(&d, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, 1 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemRelease(h2));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h2, 2 * MiB, &prop, 0));
    }
    CASE("touch_mapped_without_access") {
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        fprintf(stderr, "touching\n");
        ((volatile char *)va)[0] = 1;
        printf("survived\n");
        return 0;
    }
    CASE("touch_after_unmap") {
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        EXPECT(CUDA_SUCCESS, cuMemSetAccess(va, 2 * MiB, &rw, 1));
        ((volatile char *)va)[0] = 1;
        EXPECT(CUDA_SUCCESS, cuMemUnmap(va, 2 * MiB));
        fprintf(stderr, "touching\n");
        printf("read %d\n", ((volatile char *)va)[0]);
        printf("survived\n");
        return 0;
    }
    CASE("unmapped_reservation_copies_fail_with_illegal_address") {
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        EXPECT(CUDA_SUCCESS, cuMemSetAccess(va, 2 * MiB, &rw, 1));
        EXPECT(CUDA_SUCCESS, cuMemsetD8(va, 7, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemUnmap(va, 2 * MiB));
        static char host[4096];
        void *pv = (void *)va;
        /* every way a copy or a set can reach the unmapped range: an error, not a fault */
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyHtoD(va, host, 64));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyDtoH(host, va, 64));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpy(va, (CUdeviceptr)host, 64));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpy((CUdeviceptr)host, va, 64));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemcpyHtoDAsync(va, host, 64, 0));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemsetD8(va, 1, 64));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemsetD32(va + 2 * MiB, 1, 16)); /* never mapped */
        EXPECT(cudaErrorIllegalAddress, cudaMemcpy(pv, host, 64, cudaMemcpyDefault));
        EXPECT(cudaErrorIllegalAddress, cudaMemcpy(host, pv, 64, cudaMemcpyDeviceToHost));
        EXPECT(cudaErrorIllegalAddress, cudaMemcpy(pv, host, 64, cudaMemcpyHostToHost));
        EXPECT(cudaErrorIllegalAddress, cudaMemset(pv, 0, 64));
        /* the process stays usable: mapped again at the same address, it works */
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        EXPECT(CUDA_SUCCESS, cuMemSetAccess(va, 2 * MiB, &rw, 1));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(host, va, 64));
        REQUIRE(host[63] == 7);
        EXPECT(cudaSuccess, cudaMemset(pv, 3, 64));
        EXPECT(CUDA_SUCCESS, cuMemUnmap(va, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemRelease(h));
        EXPECT(CUDA_SUCCESS, cuMemAddressFree(va, 4 * MiB));
    }
    CASE("shared_hold") { /* argv[2] MiB held (half cuMemAlloc, half cuMemCreate) until stdin closes */
        REQUIRE(argc > 2);
        size_t held = (size_t)atoi(argv[2]) * MiB;
        CUdeviceptr d;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, held / 2));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, held - held / 2, &prop, 0));
        printf("HELD\n");
        fflush(stdout);
        while (getchar() != EOF) {}
    }
    CASE("shared_expect") { /* argv[2]: the free MiB cuMemGetInfo must show; more must not fit */
        REQUIRE(argc > 2);
        size_t want = (size_t)atoi(argv[2]) * MiB;
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
        if (f != want) { fprintf(stderr, "free %zu MiB, expected %zu MiB\n", f / MiB, want / MiB); exit(1); }
        CUdeviceptr d;
        EXPECT(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc(&d, want + 2 * MiB));
        EXPECT(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h, want + 2 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, want, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
        REQUIRE(f == 0);
        EXPECT(CUDA_SUCCESS, cuMemRelease(h));
        size_t fr;
        EXPECT(cudaSuccess, cudaMemGetInfo(&fr, &t));
        REQUIRE(fr == want);
    }
    CASE("leave_vmm_objects_live") { /* for the report */
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &prop, 0));
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        CUdeviceptr d;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, 1000));
    }
    PASS_CASE();
    return 0;
}
