/* Address queries on cached allocations: the same output with and without
 * the shim. Two 4 MiB allocations (one 20 MiB segment under the shim, or one expandable
 * reservation), one of 1000 bytes; cuMemGetAddressRange on interior addresses reports each
 * allocation itself, and so do the pointer range attributes; clearing "the whole allocation" through that range leaves its neighbour
 * intact; a freed allocation is not found. Prints key=value lines with relative values only.
 */
#include <cuda.h>
#include "shim_util.h"

static void range(const char *name, void *alloc, size_t off) {
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult rc = cuMemGetAddressRange(&base, &size, (CUdeviceptr)alloc + off);
    printf("%s_rc=%d %s_base_off=%lld %s_size=%zu\n", name, (int)rc, name,
           rc == CUDA_SUCCESS ? (long long)(base - (CUdeviceptr)alloc) : 0LL, name,
           rc == CUDA_SUCCESS ? size : 0);
}

/* The range attributes, one by one and together. */
static void attrs(const char *name, void *alloc, size_t off) {
    CUdeviceptr p = (CUdeviceptr)alloc + off, start = 0;
    size_t size = 0;
    CUresult r1 = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    CUresult r2 = cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
    printf("%s_attr_rc=%d,%d %s_attr_start_off=%lld %s_attr_size=%zu\n", name, (int)r1, (int)r2,
           name, r1 == CUDA_SUCCESS ? (long long)(start - (CUdeviceptr)alloc) : 0LL, name,
           r2 == CUDA_SUCCESS ? size : 0);
    CUpointer_attribute which[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    CUdeviceptr start2 = 1;
    size_t size2 = 1;
    void *data[2] = {&start2, &size2};
    CUresult r3 = cuPointerGetAttributes(2, which, data, p);
    printf("%s_attrs_rc=%d %s_attrs_start_off=%lld %s_attrs_size=%zu\n", name, (int)r3, name,
           start2 ? (long long)(start2 - (CUdeviceptr)alloc) : -1LL, name, size2);
}

int main(void) {
    void *a, *b, *c;
    CHECK(cudaMalloc(&a, 4 * MiB));
    CHECK(cudaMalloc(&b, 4 * MiB));
    CHECK(cudaMalloc(&c, 1000));
    range("a_start", a, 0);
    range("a_end", a, 4 * MiB - 1);
    range("b_mid", b, 100);
    range("c_mid", c, 10);
    attrs("b_mid", b, 100);
    attrs("c_mid", c, 10);

    /* Clear b through the range the driver reports; a must keep its bytes. */
    CHECK(cudaMemset(a, 0xAA, 4 * MiB));
    CUdeviceptr base = 0;
    size_t size = 0;
    if (cuMemGetAddressRange(&base, &size, (CUdeviceptr)b + 12345) != CUDA_SUCCESS)
        return 1;
    CHECK(cudaMemset((void *)base, 0, size));
    unsigned char *host = malloc(4 * MiB);
    CHECK(cudaMemcpy(host, a, 4 * MiB, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < 4 * MiB; i++)
        bad += host[i] != 0xAA;
    printf("a_bytes_clobbered=%zu\n", bad);
    free(host);

    CHECK(cudaFree(b));
    range("b_freed", b, 0);
    attrs("b_freed", b, 0);
    CHECK(cudaFree(a));
    CHECK(cudaFree(c));
    return 0;
}
