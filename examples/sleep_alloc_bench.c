/* The cost of one allocation in sleep mode against the plain cache: PAIRS cudaMalloc+cudaFree
 * pairs cycling over sizes from 512 B to 8 MiB (after one warm-up round, so every pair is
 * served from the cache), the time per pair printed. Run under the shim with and without
 * CUSHIM_ALLOC_CONF=sleep_mode:True (scripts/sleep-alloc-bench.sh, which also counts the
 * driver calls from SIMCUDA_REPORT). Argument: pairs (default 1000000). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(c) do { cudaError_t e_ = (c); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %d\n", #c, (int)e_); exit(1); } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 1000000;
    static const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 8 << 20};
    const int ns = sizeof sizes / sizeof sizes[0];
    void *keep = NULL, *p = NULL;
    CHECK(cudaMalloc(&keep, 1 << 20)); /* a live neighbour, as a program has */
    for (int i = 0; i < ns; i++) {
        CHECK(cudaMalloc(&p, sizes[i]));
        CHECK(cudaFree(p));
    }
    double t0 = now();
    for (long i = 0; i < pairs; i++) {
        CHECK(cudaMalloc(&p, sizes[i % ns]));
        CHECK(cudaFree(p));
    }
    double t = now() - t0;
    printf("pairs %ld  %.1f ns per malloc+free pair\n", pairs, t / pairs * 1e9);
    CHECK(cudaFree(keep));
    return 0;
}
