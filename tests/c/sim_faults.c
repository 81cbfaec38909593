/* simcuda fault injection, latency model and report: argv[1] selects the case; the cases
 * print the return codes of a call sequence ("codes: a b c ...") or a timing, and the Rust
 * test checks them against the SIMCUDA_* settings it ran with. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <time.h>
#include "sim_check.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *exit_from_thread(void *arg) {
    (void)arg;
    exit(0);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CASE("create_codes") {
        CUcontext ctx;
        EXPECT(CUDA_SUCCESS, cuInit(0));
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, 0));
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(ctx));
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        printf("codes:");
        for (int i = 0; i < 8; i++) {
            CUmemGenericAllocationHandle h;
            CUresult rc = cuMemCreate(&h, 2 << 20, &prop, 0);
            printf(" %d", (int)rc);
            if (rc == CUDA_SUCCESS) EXPECT(CUDA_SUCCESS, cuMemRelease(h));
        }
        printf("\n");
    }
    CASE("malloc_codes") {
        int frees[6], nf = 0;
        printf("codes:");
        for (int i = 0; i < 6; i++) {
            void *p;
            cudaError_t rc = cudaMalloc(&p, 1024);
            printf(" %d", (int)rc);
            if (rc == cudaSuccess) frees[nf++] = (int)cudaFree(p);
        }
        printf("\nfrees:");
        for (int i = 0; i < nf; i++) printf(" %d", frees[i]);
        printf("\n");
        printf("last: %d\n", (int)cudaGetLastError());
    }
    CASE("malloc_timing") {
        void *p[10];
        EXPECT(cudaSuccess, cudaFree(0));
        double t0 = now_ms();
        for (int i = 0; i < 10; i++) EXPECT(cudaSuccess, cudaMalloc(&p[i], 1024));
        double t1 = now_ms();
        printf("ms: %.3f\n", t1 - t0);
    }
    CASE("report_workload") {
        void *a, *b, *h;
        EXPECT(cudaSuccess, cudaMalloc(&a, 3 << 20));
        EXPECT(cudaSuccess, cudaMalloc(&b, 1000));
        EXPECT(cudaSuccess, cudaFree(a));
        EXPECT(cudaSuccess, cudaMallocHost(&h, 8192));
        EXPECT(cudaErrorInvalidValue, cudaFree((void *)0x10));
        CUdeviceptr d;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, 512));
    }
    CASE("exit_from_other_thread") {
        void *a;
        EXPECT(cudaSuccess, cudaMalloc(&a, 4096));
        cudaStream_t s;
        EXPECT(cudaSuccess, cudaStreamCreate(&s));
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, exit_from_thread, NULL) == 0);
        pthread_join(t, NULL);
        return 3;
    }
    PASS_CASE();
    return 0;
}
