/* bench_nvtx: what NVTX ranges cost a program under the shim, through NVTX's own dispatch
 * and the shim's injection callbacks (NVIDIA's NVTX v3 headers; run with
 * NVTX_INJECTION64_PATH naming libcushim.so), timed with clock_gettime:
 *   push_pop   one nvtxRangePushA + nvtxRangePop pair
 *   outside    one cached 512-byte cudaMalloc + cudaFree pair outside every range
 *   inside     the same pair inside a three-level range path
 * `outside` and `inside` batches alternate, so load changes hit them alike. Each figure is
 * the median over REPEATS batches of PAIRS pairs. Output, one line:
 *   nvtx push_pop_ns=X outside_ns=Y inside_ns=Z
 * usage: bench_nvtx [PAIRS] [REPEATS] [ONLY]
 * ONLY (`push_pop`, `outside` or `inside`) runs that loop alone, PAIRS times, and prints
 * nothing: a fixed-count loop to count instructions under callgrind (a figure that, unlike
 * time, does not move with the machine's load). */
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

static double pairs(long n) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, 512) != cudaSuccess || cudaFree(p) != cudaSuccess) {
            fprintf(stderr, "cudaMalloc/cudaFree failed\n");
            exit(1);
        }
    }
    return (now_ns() - t0) / (double)n;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (n <= 0 || reps <= 0 || reps > 64) {
        fprintf(stderr, "usage: bench_nvtx [PAIRS] [REPEATS<=64]\n");
        return 2;
    }
    double pp[64], out[64], in[64];
    pairs(1000); /* the cache warm, the shim's state built */
    if (argc > 3) {
        const char *only = argv[3];
        if (strcmp(only, "push_pop") == 0) {
            for (long i = 0; i < n; i++) {
                nvtxRangePushA("forward");
                nvtxRangePop();
            }
        } else if (strcmp(only, "outside") == 0) {
            pairs(n);
        } else if (strcmp(only, "inside") == 0) {
            nvtxRangePushA("step");
            nvtxRangePushA("forward");
            nvtxRangePushA("layer");
            pairs(n);
        } else {
            fprintf(stderr, "unknown case %s\n", only);
            return 2;
        }
        return 0;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            nvtxRangePushA("forward");
            nvtxRangePop();
        }
        pp[r] = (now_ns() - t0) / (double)n;
        out[r] = pairs(n);
        nvtxRangePushA("step");
        nvtxRangePushA("forward");
        nvtxRangePushA("layer");
        in[r] = pairs(n);
        nvtxRangePop();
        nvtxRangePop();
        nvtxRangePop();
    }
    printf("nvtx push_pop_ns=%.1f outside_ns=%.1f inside_ns=%.1f\n", median(pp, reps),
           median(out, reps), median(in, reps));
    return 0;
}
