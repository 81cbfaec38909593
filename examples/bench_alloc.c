/* bench_alloc: cost of one allocate+free pair, timed with clock_gettime, for
 *   glibc    malloc + free                     (the baseline every interposer is held to)
 *   runtime  cudaMalloc + cudaFree             (cached when libcushim.so is preloaded)
 *   driver   cuMemAlloc_v2 + cuMemFree_v2      (dlopen("libcuda.so.1") + dlsym: the raw driver
 *                                               when run without the shim; under the shim its
 *                                               dlsym hands back its driver-layer hooks)
 * at the sizes given, on 1..T threads. Builds with `cc` against simcuda's headers and with
 * `nvcc` against the real toolkit (no kernels, plain runtime API).
 *
 * usage: bench_alloc [-t THREADS] [-m glibc,runtime,driver] [-s 512,1048576,67108864]
 *                    [-b BATCH_MS] [-r REPEATS] [-S STREAMS]
 * -S creates that many non-blocking streams first (idle, kept alive): a program that has
 * streams, whose frees a stream-safe cache must treat differently.
 * Output, one line per measurement (median over REPEATS batches of ~BATCH_MS each; for each
 * size the kinds' batches alternate, so load changes hit them alike):
 *   bench kind=runtime size=512 threads=1 pairs=N ns_per_pair=X pairs_per_s=Y
 * and one line saying whether the shim is in the process, how many device allocations
 * it made (0 with a statically linked cudart: those calls never reach the shim) and how
 * many runtime pairs the whole run made (warm-up and calibration included; to turn a count
 * of driver calls into calls per pair):
 *   shim loaded=1 device_allocs=K runtime_pairs=P
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SIZES 16
#define MAX_THREADS 64

typedef int (*cu_alloc_fn)(unsigned long long *, size_t);
typedef int (*cu_free_fn)(unsigned long long);
typedef int (*cu_init_fn)(unsigned int);

static cu_alloc_fn cu_alloc;
static cu_free_fn cu_free;

enum kind { GLIBC, RUNTIME, DRIVER };
static const char *kind_name[] = {"glibc", "runtime", "driver"};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static volatile uintptr_t sink;
static long runtime_pairs; /* every runtime pair made, on every thread */

/* n pairs of `kind` at `size`; returns 0 on success. */
static int pairs(enum kind k, size_t size, long n) {
    for (long i = 0; i < n; i++) {
        if (k == GLIBC) {
            char *p = malloc(size);
            if (!p)
                return 1;
            p[0] = 1; /* touch, so the compiler cannot drop the pair */
            sink += (uintptr_t)p;
            free(p);
        } else if (k == RUNTIME) {
            void *p = NULL;
            if (cudaMalloc(&p, size) != cudaSuccess)
                return 1;
            sink += (uintptr_t)p;
            if (cudaFree(p) != cudaSuccess)
                return 1;
        } else {
            unsigned long long p = 0;
            if (cu_alloc(&p, size) != 0)
                return 1;
            sink += (uintptr_t)p;
            if (cu_free(p) != 0)
                return 1;
        }
    }
    return 0;
}

struct job {
    enum kind k;
    size_t size;
    long n;
    pthread_barrier_t *start;
    int err;
};

static void *worker(void *arg) {
    struct job *j = arg;
    if (j->k == RUNTIME)
        cudaSetDevice(0);
    pthread_barrier_wait(j->start);
    j->err = pairs(j->k, j->size, j->n);
    return NULL;
}

/* Seconds for `threads` threads doing n pairs each, started together. */
static double timed(enum kind k, size_t size, long n, int threads, int *err) {
    if (k == RUNTIME)
        runtime_pairs += n * threads;
    if (threads == 1) {
        double t0 = now_s();
        *err = pairs(k, size, n);
        return now_s() - t0;
    }
    pthread_t tid[MAX_THREADS];
    struct job jobs[MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, threads + 1);
    for (int i = 0; i < threads; i++) {
        jobs[i] = (struct job){k, size, n, &start, 0};
        pthread_create(&tid[i], NULL, worker, &jobs[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = now_s();
    *err = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        *err |= jobs[i].err;
    }
    double t = now_s() - t0;
    pthread_barrier_destroy(&start);
    return t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The shim's num_device_alloc for device 0, or -1 when the shim is not in the process. */
static long long shim_device_allocs(void) {
    int (*fn)(char *, size_t) =
        (int (*)(char *, size_t))dlsym(RTLD_DEFAULT, "cushim_memory_stats_json");
    static char buf[1 << 16];
    if (!fn || fn(buf, sizeof buf) < 0)
        return -1;
    const char *p = strstr(buf, "\"num_device_alloc\":");
    return p ? atoll(p + strlen("\"num_device_alloc\":")) : -1;
}

int main(int argc, char **argv) {
    int threads = 1, repeats = 5, nstreams = 0;
    double batch_ms = 20;
    const char *modes = "glibc,runtime,driver";
    size_t sizes[MAX_SIZES] = {512, 1 << 20, 64 << 20};
    int nsizes = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-m"))
            modes = argv[i + 1];
        else if (!strcmp(argv[i], "-b"))
            batch_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-S"))
            nstreams = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-s")) {
            nsizes = 0;
            char *list = strdup(argv[i + 1]);
            for (char *tok = strtok(list, ","); tok && nsizes < MAX_SIZES; tok = strtok(NULL, ","))
                sizes[nsizes++] = strtoull(tok, NULL, 10);
            free(list);
        } else {
            fprintf(stderr, "bench_alloc: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (threads < 1 || threads > MAX_THREADS || repeats < 1 || repeats > 99 || nstreams < 0 ||
        nstreams > 64) {
        fprintf(stderr, "bench_alloc: threads must be 1..%d, repeats 1..99, streams 0..64\n",
                MAX_THREADS);
        return 2;
    }
    /* Context first: the runtime creates the primary context and makes it current. */
    if (cudaFree(0) != cudaSuccess) {
        fprintf(stderr, "bench_alloc: no CUDA device\n");
        return 1;
    }
    cudaStream_t streams[64];
    for (int i = 0; i < nstreams; i++)
        if (cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "bench_alloc: cudaStreamCreateWithFlags failed\n");
            return 1;
        }
    int want_driver = strstr(modes, "driver") != NULL;
    if (want_driver) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        cu_init_fn init = h ? (cu_init_fn)dlsym(h, "cuInit") : NULL;
        cu_alloc = h ? (cu_alloc_fn)dlsym(h, "cuMemAlloc_v2") : NULL;
        cu_free = h ? (cu_free_fn)dlsym(h, "cuMemFree_v2") : NULL;
        if (!init || !cu_alloc || !cu_free || init(0) != 0) {
            fprintf(stderr, "bench_alloc: driver API unavailable, skipping driver rows\n");
            want_driver = 0;
        }
    }
    /* Per size, the kinds' batches are interleaved (glibc, runtime, driver, glibc, ...) so
     * that a change in the machine's load hits every kind alike and the ratios between them
     * hold even when the absolute figures move. */
    int on[DRIVER + 1];
    for (int k = GLIBC; k <= DRIVER; k++)
        on[k] = strstr(modes, kind_name[k]) && (k != DRIVER || want_driver);
    for (int s = 0; s < nsizes; s++) {
        long n[DRIVER + 1] = {0};
        double secs[DRIVER + 1][100];
        int err = 0;
        for (int k = GLIBC; k <= DRIVER; k++) {
            if (!on[k])
                continue;
            /* The driver API needs the context current on each thread: one thread only. */
            int t = k == DRIVER ? 1 : threads;
            /* Warm up (fills the cache), then calibrate a batch to ~batch_ms. */
            double one = timed(k, sizes[s], 1, t, &err);
            double probe = timed(k, sizes[s], 16, t, &err) / 16;
            if (probe < one)
                one = probe;
            n[k] = (long)(batch_ms * 1e-3 / (one > 1e-9 ? one : 1e-9));
            if (n[k] < 4)
                n[k] = 4;
            if (n[k] > 20000000)
                n[k] = 20000000;
        }
        for (int r = 0; r < repeats && !err; r++)
            for (int k = GLIBC; k <= DRIVER && !err; k++)
                if (on[k])
                    secs[k][r] = timed(k, sizes[s], n[k], k == DRIVER ? 1 : threads, &err);
        if (err) {
            fprintf(stderr, "bench_alloc: a pair of %zu bytes failed\n", sizes[s]);
            return 1;
        }
        for (int k = GLIBC; k <= DRIVER; k++) {
            if (!on[k])
                continue;
            int t = k == DRIVER ? 1 : threads;
            qsort(secs[k], repeats, sizeof secs[k][0], cmp_double);
            double med = secs[k][repeats / 2];
            printf("bench kind=%s size=%zu threads=%d pairs=%ld ns_per_pair=%.1f pairs_per_s=%.0f\n",
                   kind_name[k], sizes[s], t, n[k] * t, med / n[k] * 1e9, n[k] * t / med);
            fflush(stdout);
        }
    }
    long long allocs = shim_device_allocs();
    printf("shim loaded=%d device_allocs=%lld runtime_pairs=%ld\n", allocs >= 0,
           allocs < 0 ? 0 : allocs, runtime_pairs);
    return 0;
}
