/* latency_probe: the median cost of each call simcuda's `cuda` latency profile models
 * (simcuda/src/profile.rs), measured the same way on a GPU and on simcuda, so a lent GPU
 * checks the profile (scripts/gpu-check.sh, step 3c). Without a GPU, run it on simcuda with
 * SIMCUDA_LATENCY=cuda to see the profile's figures through the same probe.
 *
 * usage: latency_probe [REPEATS]   (default 200)
 * output, one line per call: latency call=NAME size=BYTES median_ns=X
 * The device is idle throughout (no kernels): a synchronization measures its fixed cost.
 * Builds with `cc` against simcuda's headers (-lcudart -lcuda) and with nvcc (-lcuda).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int reps = 200;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *name, size_t size, double *v) {
    qsort(v, reps, sizeof *v, cmp);
    printf("latency call=%s size=%zu median_ns=%.0f\n", name, size, v[reps / 2]);
}

#define TIME(dst, call)                                                         \
    do {                                                                        \
        double t0_ = now_ns();                                                  \
        int rc_ = (int)(call);                                                  \
        (dst) = now_ns() - t0_;                                                 \
        if (rc_ != 0) {                                                         \
            fprintf(stderr, "latency_probe: %s returned %d\n", #call, rc_);     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

int main(int argc, char **argv) {
    if (argc > 1) reps = atoi(argv[1]);
    if (reps < 3 || reps > 100000) {
        fprintf(stderr, "usage: latency_probe [REPEATS 3..100000]\n");
        return 2;
    }
    double *a = calloc(reps, sizeof *a), *b = calloc(reps, sizeof *b);
    if (!a || !b || cudaFree(0) != cudaSuccess) return 1;
    size_t sizes[] = {512, 1 << 20, 64 << 20};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < reps; i++) {
            void *p;
            TIME(a[i], cudaMalloc(&p, sizes[k]));
            TIME(b[i], cudaFree(p));
        }
        report("cudaMalloc", sizes[k], a);
        report("cudaFree", sizes[k], b);
    }
    cudaStream_t s;
    cudaEvent_t e;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess)
        return 1;
    for (int i = 0; i < reps; i++) TIME(a[i], cudaDeviceSynchronize());
    report("cudaDeviceSynchronize", 0, a);
    for (int i = 0; i < reps; i++) {
        TIME(a[i], cudaEventRecord(e, s));
        TIME(b[i], cudaStreamWaitEvent(0, e, 0));
    }
    report("cudaEventRecord", 0, a);
    report("cudaStreamWaitEvent", 0, b);
    cudaDeviceSynchronize();
    for (int i = 0; i < reps; i++) {
        TIME(a[i], cudaStreamQuery(s));
        TIME(b[i], cudaEventQuery(e));
    }
    report("cudaStreamQuery", 0, a);
    report("cudaEventQuery", 0, b);
    for (int i = 0; i < reps; i++) {
        enum cudaStreamCaptureStatus st;
        CUcontext ctx;
        TIME(a[i], cudaStreamIsCapturing(s, &st));
        TIME(b[i], cuCtxGetCurrent(&ctx));
    }
    report("cudaStreamIsCapturing", 0, a);
    report("cuCtxGetCurrent", 0, b);
    for (int i = 0; i < reps; i++) {
        enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
        TIME(a[i], cudaThreadExchangeStreamCaptureMode(&m));
        cudaThreadExchangeStreamCaptureMode(&m);
    }
    report("cudaThreadExchangeStreamCaptureMode", 0, a);
    for (int i = 0; i < reps; i++) {
        cudaEvent_t x;
        TIME(a[i], cudaEventCreateWithFlags(&x, cudaEventDisableTiming));
        TIME(b[i], cudaEventDestroy(x));
    }
    report("cudaEventCreateWithFlags", 0, a);
    report("cudaEventDestroy", 0, b);
    int hreps = reps < 20 ? reps : 20, saved = reps;
    reps = hreps;
    for (int i = 0; i < reps; i++) {
        void *p;
        TIME(a[i], cudaMallocHost(&p, 1 << 20));
        TIME(b[i], cudaFreeHost(p));
    }
    report("cudaMallocHost", 1 << 20, a);
    report("cudaFreeHost", 1 << 20, b);
    reps = saved;
    /* Virtual memory management: one 2 MiB-granular mapping, made and undone. */
    CUdevice dev;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    if (cuCtxGetDevice(&dev) != CUDA_SUCCESS) return 1;
    prop.location.id = dev;
    size_t gran = 0;
    if (cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS || gran == 0) {
        printf("latency call=vmm size=0 median_ns=unsupported\n");
        return 0;
    }
    double *c = calloc(reps, sizeof *c), *d = calloc(reps, sizeof *d), *f = calloc(reps, sizeof *f),
           *g = calloc(reps, sizeof *g), *h = calloc(reps, sizeof *h);
    if (!c || !d || !f || !g || !h) return 1;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < reps; i++) {
        CUdeviceptr va;
        CUmemGenericAllocationHandle hd;
        TIME(a[i], cuMemAddressReserve(&va, gran, 0, 0, 0));
        TIME(b[i], cuMemCreate(&hd, gran, &prop, 0));
        TIME(c[i], cuMemMap(va, gran, 0, hd, 0));
        TIME(d[i], cuMemSetAccess(va, gran, &acc, 1));
        TIME(f[i], cuMemUnmap(va, gran));
        TIME(g[i], cuMemRelease(hd));
        TIME(h[i], cuMemAddressFree(va, gran));
    }
    report("cuMemAddressReserve", gran, a);
    report("cuMemCreate", gran, b);
    report("cuMemMap", gran, c);
    report("cuMemSetAccess", gran, d);
    report("cuMemUnmap", gran, f);
    report("cuMemRelease", gran, g);
    report("cuMemAddressFree", gran, h);
    return 0;
}
