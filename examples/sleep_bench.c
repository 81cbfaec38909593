/* Sleep mode's cost: pause and resume time per GiB, and backup throughput against a plain
 * pinned cudaMemcpy of the same bytes in the same run, for the whole pause and for the backup
 * alone (the pause with backup less the pause without). Run under the shim with
 * CUSHIM_ALLOC_CONF=sleep_mode:True (scripts/sleep-bench.sh). Arguments: MiB (default 1024),
 * rounds (default 5; each figure is the best round). */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(c) do { cudaError_t e_ = (c); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %d\n", #c, (int)e_); exit(1); } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef int (*pause_fn)(const char *, int);
typedef int (*resume_fn)(const char *);
typedef int (*push_fn)(const char *);
typedef int (*pop_fn)(void);

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 1024;
    size_t n = mib << 20;
    double gib = (double)n / (1 << 30);
    pause_fn do_pause = (pause_fn)dlsym(RTLD_DEFAULT, "cushim_pause");
    resume_fn do_resume = (resume_fn)dlsym(RTLD_DEFAULT, "cushim_resume");
    push_fn push = (push_fn)dlsym(RTLD_DEFAULT, "cushim_tag_push");
    pop_fn pop = (pop_fn)dlsym(RTLD_DEFAULT, "cushim_tag_pop");
    if (!do_pause || !do_resume || !push || !pop) {
        fprintf(stderr, "run under the shim\n");
        return 3;
    }
    void *d = NULL;
    push("bench");
    CHECK(cudaMalloc(&d, n));
    pop();
    CHECK(cudaMemset(d, 7, n));
    const int reps = argc > 2 ? atoi(argv[2]) : 5;
    double t_base_cold = 1e9, t_base_warm = 1e9, t_pb = 1e9, t_rb = 1e9, t_pd = 1e9, t_rd = 1e9;
    for (int r = 0; r < reps; r++) {
        /* baseline: a fresh pinned buffer, as each backup gets one, then the same again warm */
        void *h = NULL;
        double t0 = now();
        CHECK(cudaMallocHost(&h, n));
        CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
        double t1 = now();
        CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
        double t2 = now();
        CHECK(cudaFreeHost(h));
        if (t1 - t0 < t_base_cold) t_base_cold = t1 - t0;
        if (t2 - t1 < t_base_warm) t_base_warm = t2 - t1;
        t0 = now();
        if (do_pause("bench", 1)) return 4;
        t1 = now();
        if (do_resume("bench")) return 5;
        t2 = now();
        if (t1 - t0 < t_pb) t_pb = t1 - t0;
        if (t2 - t1 < t_rb) t_rb = t2 - t1;
        t0 = now();
        if (do_pause("bench", 0)) return 6;
        t1 = now();
        if (do_resume("bench")) return 7;
        t2 = now();
        if (t1 - t0 < t_pd) t_pd = t1 - t0;
        if (t2 - t1 < t_rd) t_rd = t2 - t1;
    }
    printf("bytes %zu (best of %d)\n", n, reps);
    printf("pause backup   %8.1f ms/GiB  (%.2f GiB/s)\n", t_pb / gib * 1e3, gib / t_pb);
    printf("resume backup  %8.1f ms/GiB  (%.2f GiB/s)\n", t_rb / gib * 1e3, gib / t_rb);
    printf("pause discard  %8.3f ms/GiB\n", t_pd / gib * 1e3);
    printf("resume discard %8.3f ms/GiB\n", t_rd / gib * 1e3);
    printf("pinned memcpy, fresh buffer  %.2f GiB/s\n", gib / t_base_cold);
    printf("pinned memcpy, warm buffer   %.2f GiB/s\n", gib / t_base_warm);
    /* The backup alone: what a pause with backup costs beyond the same pause without it (the
     * wait for the device and the unmapping are the same in both). */
    double t_backup = t_pb - t_pd;
    printf("backup alone   %8.1f ms/GiB  (%.2f GiB/s)\n", t_backup / gib * 1e3, gib / t_backup);
    printf("backup alone / fresh-buffer copy   %.0f%%\n", 100.0 * t_base_cold / t_backup);
    printf("backup / fresh-buffer copy   %.0f%%\n", 100.0 * t_base_cold / t_pb);
    printf("backup / warm-buffer copy    %.0f%%\n", 100.0 * t_base_warm / t_pb);
    CHECK(cudaFree(d));
    return 0;
}
