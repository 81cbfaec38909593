/* shim_trace.c on the driver API, for the history/snapshot tests (compiled with -g).
 *   sites:        allocations from two named functions, some freed, some live at exit.
 *   many N:       N alloc/free pairs from one call site.
 *   threads N:    two threads allocating and freeing N times each; prints "ready" first,
 *                 "joined" when both are done, then waits for a line on stdin (or EOF)
 *                 and prints "result=<checksum>" (the test signals it meanwhile). */
#include <pthread.h>
#include <unistd.h>
#include "driver_util.h"

__attribute__((noinline)) CUdeviceptr load_weights(size_t size) {
    CUdeviceptr p = 0;
    DCHECK(cuMemAlloc(&p, size));
    return p;
}

__attribute__((noinline)) CUdeviceptr make_activation(size_t size) {
    CUdeviceptr p = 0;
    DCHECK(cuMemAlloc(&p, size));
    return p;
}

__attribute__((noinline)) void release(CUdeviceptr p) { DCHECK(cuMemFree(p)); }

static int sites(void) {
    CUdeviceptr w = load_weights(24 * MiB);
    void *h = NULL;
    DCHECK(cuMemAllocHost(&h, 1 << 20));
    for (int i = 0; i < 10; i++) {
        CUdeviceptr a = make_activation((size_t)(i + 1) * MiB);
        release(a);
    }
    CUdeviceptr live = make_activation(3 * MiB);
    (void)live;
    (void)w;
    DCHECK(cuMemFreeHost(h));
    printf("done\n");
    return 0;
}

static int many(long n) {
    for (long i = 0; i < n; i++) {
        CUdeviceptr a = make_activation(4096);
        release(a);
    }
    printf("done\n");
    return 0;
}

static long iters;

static void *churn(void *arg) {
    DCHECK(cuCtxSetCurrent(driver_ctx));
    uint64_t sum = 0, x = (uintptr_t)arg + 1;
    for (long i = 0; i < iters; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t size = 512 + (size_t)(x >> 44);
        unsigned char *p = (unsigned char *)(uintptr_t)make_activation(size);
        p[0] = (unsigned char)i; /* simcuda device memory is host memory */
        p[size - 1] = (unsigned char)(i >> 8);
        sum += p[0] + p[size - 1];
        release((CUdeviceptr)(uintptr_t)p);
    }
    return (void *)(uintptr_t)sum;
}

static int threads(long n) {
    iters = n;
    release(make_activation(1024)); /* the shim is live before we say ready */
    printf("ready\n");
    fflush(stdout);
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, churn, (void *)i);
    uint64_t total = 0;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (uintptr_t)r;
    }
    /* The test may hold the exit until it has seen a live dump: wait for a line (or EOF). */
    printf("joined\n");
    fflush(stdout);
    char go[16];
    if (!fgets(go, sizeof go, stdin)) go[0] = 0;
    uint64_t expect = 0;
    for (long k = 0; k < 2; k++)
        for (long i = 0; i < n; i++)
            expect += (unsigned char)i + (unsigned char)(i >> 8);
    printf("result=%s\n", total == expect ? "correct" : "WRONG");
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "sites";
    long n = argc > 2 ? atol(argv[2]) : 1000;
    driver_init();
    if (!strcmp(mode, "sites")) return sites();
    if (!strcmp(mode, "many")) return many(n);
    if (!strcmp(mode, "threads")) return threads(n);
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
