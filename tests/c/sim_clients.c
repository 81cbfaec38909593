/* simcuda toward published clients: self-bound entry points, device UUIDs, every device
 * attribute of CUDA 12.9, pageable-memory asynchronous copies and unified-addressing copies
 * (cuMemcpy, cudaMemcpyDefault). Usage: sim_clients CASE; prints "PASS CASE". */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include "sim_check.h"
#include "sim_ctx.h"

#define MiB (1024u * 1024u)

static atomic_int released;

static void block_until_released(void *arg) {
    (void)arg;
    while (!atomic_load(&released))
        usleep(100);
}

static void *release_later(void *arg) {
    (void)arg;
    usleep(100 * 1000);
    atomic_store(&released, 1);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    CASE("self_bound") {
        /* The driver's own cuGetProcAddress, looked up on its handle, hands out the
         * driver's own functions, even when an interposer exports the same names. */
        void *h = dlopen("libcuda.so.1", RTLD_NOW);
        REQUIRE(h);
        CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
            dlsym(h, "cuGetProcAddress_v2");
        REQUIRE(gpa);
        Dl_info gpa_info, info;
        REQUIRE(dladdr((void *)gpa, &gpa_info));
        const char *names[] = {"cuMemAlloc", "cuMemFree", "cuStreamCreate", "cuGetProcAddress", "cuMemGetInfo"};
        for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
            void *fn = NULL;
            CUdriverProcAddressQueryResult st;
            EXPECT(CUDA_SUCCESS, gpa(names[i], &fn, 12090, 0, &st));
            REQUIRE(fn && dladdr(fn, &info));
            if (info.dli_fbase != gpa_info.dli_fbase) {
                fprintf(stderr, "%s came from %s, not the driver %s\n", names[i], info.dli_fname, gpa_info.dli_fname);
                return 1;
            }
        }
        /* Whether an interposer is in the process: the global cuMemAlloc_v2 lies outside
         * the driver (under the shim, the shim's export). */
        void *global = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
        int interposed = global && dladdr(global, &info) && info.dli_fbase != gpa_info.dli_fbase;
        printf("interposed=%d\n", interposed);
        printf("PASS self_bound\n");
    }
    CASE("uuid") {
        EXPECT(CUDA_SUCCESS, cuInit(0));
        int n = 0;
        EXPECT(CUDA_SUCCESS, cuDeviceGetCount(&n));
        REQUIRE(n == 2);
        CUuuid a, a2, b, zero;
        memset(&zero, 0, sizeof zero);
        EXPECT(CUDA_SUCCESS, cuDeviceGetUuid(&a, 0));
        EXPECT(CUDA_SUCCESS, cuDeviceGetUuid_v2(&a2, 0));
        EXPECT(CUDA_SUCCESS, cuDeviceGetUuid_v2(&b, 1));
        EXPECT(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetUuid_v2(&b, 2));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuDeviceGetUuid_v2(NULL, 0));
        REQUIRE(!memcmp(&a, &a2, sizeof a));
        REQUIRE(memcmp(&a, &b, sizeof a) && memcmp(&a, &zero, sizeof a));
        REQUIRE((a.bytes[6] & 0xf0) == 0x40);
        struct cudaDeviceProp p;
        EXPECT(cudaSuccess, cudaGetDeviceProperties(&p, 1));
        REQUIRE(!memcmp(&p.uuid, &b, sizeof b));
        for (int i = 0; i < 16; i++)
            printf("%02x", (unsigned char)a.bytes[i]);
        printf("\nPASS uuid\n");
    }
    CASE("attributes") {
        EXPECT(CUDA_SUCCESS, cuInit(0));
        int count = 0;
        for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; a++) {
            int v = -7, rv = -8;
            EXPECT(CUDA_SUCCESS, cuDeviceGetAttribute(&v, (CUdevice_attribute)a, 0));
            EXPECT(cudaSuccess, cudaDeviceGetAttribute(&rv, (enum cudaDeviceAttr)a, 0));
            REQUIRE(v == rv);
            count++;
        }
        int v;
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuDeviceGetAttribute(&v, (CUdevice_attribute)0, 0));
        EXPECT(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
        REQUIRE(v == 9);
        EXPECT(CUDA_SUCCESS, cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
        REQUIRE(v == 132);
        printf("attributes=%d\nPASS attributes\n", count);
    }
    CASE("pageable_htod_consumes_its_source") {
        /* The stream is held by a host function until after the copy call returned and
         * the program overwrote its buffer: the copy must still deliver the old bytes. */
        init_ctx();
        CUstream s;
        EXPECT(CUDA_SUCCESS, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CUdeviceptr d;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, MiB));
        unsigned char *buf = malloc(MiB), *back = malloc(MiB);
        /* round 0: the driver's copy (bytes 5); round 1: the runtime's twin (bytes 6) */
        for (int round = 0; round < 2; round++) {
            unsigned char want = round == 0 ? 5 : 6;
            memset(buf, want, MiB);
            atomic_store(&released, 0);
            EXPECT(CUDA_SUCCESS, cuLaunchHostFunc(s, block_until_released, NULL));
            if (round == 0)
                EXPECT(CUDA_SUCCESS, cuMemcpyHtoDAsync(d, buf, MiB, s));
            else
                EXPECT(cudaSuccess, cudaMemcpyAsync((void *)d, buf, MiB, cudaMemcpyHostToDevice, (cudaStream_t)s));
            memset(buf, 9, MiB);
            atomic_store(&released, 1);
            if (round == 0)
                EXPECT(CUDA_SUCCESS, cuStreamSynchronize(s));
            else
                EXPECT(cudaSuccess, cudaStreamSynchronize((cudaStream_t)s));
            EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(back, d, MiB));
            for (unsigned i = 0; i < MiB; i++)
                REQUIRE(back[i] == want);
        }
        printf("PASS pageable_htod_consumes_its_source\n");
    }
    CASE("pageable_dtoh_is_done_on_return") {
        /* The stream is held by a host function that another thread releases later; the
         * copy into pageable memory must not return before it ran (a copy that returned
         * at once would leave the buffer unwritten: then the check below fails). */
        init_ctx();
        CUstream s;
        EXPECT(CUDA_SUCCESS, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CUdeviceptr d;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, MiB));
        EXPECT(CUDA_SUCCESS, cuMemsetD8(d, 7, MiB));
        unsigned char *buf = calloc(1, MiB);
        for (int round = 0; round < 2; round++) {
            memset(buf, 0, MiB);
            atomic_store(&released, 0);
            pthread_t t;
            EXPECT(CUDA_SUCCESS, cuLaunchHostFunc(s, block_until_released, NULL));
            REQUIRE(pthread_create(&t, NULL, release_later, NULL) == 0);
            if (round == 0)
                EXPECT(CUDA_SUCCESS, cuMemcpyDtoHAsync(buf, d, MiB, s));
            else
                EXPECT(cudaSuccess, cudaMemcpyAsync(buf, (void *)d, MiB, cudaMemcpyDeviceToHost, (cudaStream_t)s));
            for (unsigned i = 0; i < MiB; i++)
                REQUIRE(buf[i] == 7);
            EXPECT(CUDA_SUCCESS, cuStreamQuery(s));
            pthread_join(t, NULL);
        }
        /* pinned memory stays asynchronous: the copy is queued behind the held host function */
        void *pinned;
        EXPECT(CUDA_SUCCESS, cuMemAllocHost(&pinned, MiB));
        atomic_store(&released, 0);
        EXPECT(CUDA_SUCCESS, cuLaunchHostFunc(s, block_until_released, NULL));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoHAsync(pinned, d, MiB, s));
        EXPECT(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
        atomic_store(&released, 1);
        EXPECT(CUDA_SUCCESS, cuStreamSynchronize(s));
        REQUIRE(((unsigned char *)pinned)[MiB - 1] == 7);
        printf("PASS pageable_dtoh_is_done_on_return\n");
    }
    CASE("versions") {
        int drv = 0, rt = 0, cdrv = 0;
        EXPECT(cudaSuccess, cudaDriverGetVersion(&drv));
        EXPECT(cudaSuccess, cudaRuntimeGetVersion(&rt));
        EXPECT(CUDA_SUCCESS, cuDriverGetVersion(&cdrv));
        REQUIRE(drv == cdrv && rt == drv);
        printf("version=%d\nPASS versions\n", drv);
    }
    CASE("unified_copies") {
        init_ctx();
        CUdeviceptr a, b;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&a, MiB));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&b, MiB));
        unsigned char *h = malloc(MiB), *h2 = malloc(MiB);
        for (unsigned i = 0; i < MiB; i++)
            h[i] = (unsigned char)(i * 7);
        EXPECT(CUDA_SUCCESS, cuMemcpy(a, (CUdeviceptr)h, MiB));          /* host to device */
        EXPECT(CUDA_SUCCESS, cuMemcpy(b, a, MiB));                       /* device to device */
        EXPECT(CUDA_SUCCESS, cuMemcpy((CUdeviceptr)h2, b, MiB));         /* device to host */
        REQUIRE(!memcmp(h, h2, MiB));
        memset(h2, 0, MiB);
        EXPECT(CUDA_SUCCESS, cuMemcpyAsync((CUdeviceptr)h2, b, MiB, NULL)); /* pageable: done on return */
        REQUIRE(!memcmp(h, h2, MiB));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemcpy(a, b + MiB - 16, 32)); /* past the block's end */
        memset(h2, 0, MiB);
        EXPECT(cudaSuccess, cudaMemcpy((void *)b, h2, MiB, cudaMemcpyDefault));
        EXPECT(cudaSuccess, cudaMemcpy(h2, (void *)a, MiB, cudaMemcpyDefault));
        REQUIRE(!memcmp(h, h2, MiB));
        EXPECT(cudaSuccess, cudaMemcpy(h2, (void *)b, MiB, cudaMemcpyDefault));
        REQUIRE(h2[1] == 0 && h2[MiB - 1] == 0);
        EXPECT(cudaSuccess, cudaMemcpyAsync(h2, h, MiB, cudaMemcpyDefault, 0)); /* host to host */
        REQUIRE(!memcmp(h, h2, MiB));
        printf("PASS unified_copies\n");
    }
    CASES_END();
    return 0;
}
