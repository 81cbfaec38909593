/* bench_frag: peak reserved / peak allocated device memory for two workloads.
 *   seed     8 x 16 MiB, free all, 4 x 32 MiB (the design's seed fragmentation example)
 *   reverse  4 x 32 MiB, free all, 8 x 16 MiB
 *   serving  a synthetic inference server: model weights, then many requests, each with a
 *            KV cache that grows with its sequence length and per-step activations of
 *            varying size, several requests live at once (deterministic xorshift RNG)
 * "reserved" is what the device reports in use (cudaMemGetInfo: total - free) above what
 * was in use at start, sampled after every allocation; "allocated" is the sum of the sizes
 * the program holds. Run it with and without the shim, and with
 * CUSHIM_ALLOC_CONF=expandable_segments:True, to compare.
 *
 * usage: bench_frag seed|reverse|serving [REQUESTS]
 * Output: frag scenario=serving peak_allocated=A peak_reserved=R ratio=R/A allocs=N
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)
#define KiB 1024ull

static unsigned long long base_used, peak_reserved, allocated, peak_allocated, n_allocs;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static unsigned long long used_now(void) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        fprintf(stderr, "bench_frag: cudaMemGetInfo failed\n");
        exit(1);
    }
    return (unsigned long long)(total_b - free_b);
}

static void *dalloc(size_t size) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
        fprintf(stderr, "bench_frag: cudaMalloc(%zu) failed: %s\n", size, cudaGetErrorString(e));
        exit(1);
    }
    n_allocs++;
    allocated += size;
    if (allocated > peak_allocated)
        peak_allocated = allocated;
    unsigned long long used = used_now();
    if (used > base_used && used - base_used > peak_reserved)
        peak_reserved = used - base_used;
    return p;
}

static void dfree(void *p, size_t size) {
    if (cudaFree(p) != cudaSuccess) {
        fprintf(stderr, "bench_frag: cudaFree failed\n");
        exit(1);
    }
    allocated -= size;
}

/* n1 x s1, free all, n2 x s2, free all. */
static void two_phase(int n1, size_t s1, int n2, size_t s2) {
    void *a[8];
    for (int i = 0; i < n1; i++)
        a[i] = dalloc(s1);
    for (int i = 0; i < n1; i++)
        dfree(a[i], s1);
    for (int i = 0; i < n2; i++)
        a[i] = dalloc(s2);
    for (int i = 0; i < n2; i++)
        dfree(a[i], s2);
}

#define N_WEIGHTS 48
#define MAX_LIVE 8
#define LAYERS 8

struct request {
    void *kv[LAYERS];
    size_t kv_size;
    int steps_left;
};

static void serving(int requests) {
    void *w[N_WEIGHTS];
    size_t ws[N_WEIGHTS];
    for (int i = 0; i < N_WEIGHTS; i++) {
        ws[i] = (1 + next_rand() % 12) * MiB + (next_rand() % 512) * KiB;
        w[i] = dalloc(ws[i]);
    }
    struct request live[MAX_LIVE];
    int n_live = 0, started = 0;
    while (started < requests || n_live > 0) {
        /* Admit new requests while there is room: KV cache per layer, sized by prompt. */
        while (n_live < MAX_LIVE && started < requests && (next_rand() % 3 != 0 || n_live == 0)) {
            struct request *r = &live[n_live++];
            size_t seq = 16 + next_rand() % 2048;
            r->kv_size = seq * 2 * KiB; /* 32 KiB .. 4 MiB per layer */
            for (int l = 0; l < LAYERS; l++)
                r->kv[l] = dalloc(r->kv_size);
            r->steps_left = 1 + (int)(next_rand() % 24);
            started++;
        }
        /* One decode step for the live batch: activations sized by the batch's tokens. */
        size_t tokens = 0;
        for (int i = 0; i < n_live; i++)
            tokens += live[i].kv_size / (2 * KiB);
        void *act[LAYERS], *tmp[LAYERS];
        size_t as[LAYERS], ts[LAYERS];
        for (int l = 0; l < LAYERS; l++) {
            as[l] = tokens * (1 + l % 3) * 256 + 512;
            act[l] = dalloc(as[l]);
            ts[l] = 4 * KiB + (next_rand() % 256) * KiB;
            tmp[l] = dalloc(ts[l]);
            dfree(tmp[l], ts[l]);
        }
        for (int l = LAYERS - 1; l >= 0; l--)
            dfree(act[l], as[l]);
        /* Finished requests give their KV cache back. */
        for (int i = 0; i < n_live;) {
            if (--live[i].steps_left > 0) {
                i++;
                continue;
            }
            for (int l = 0; l < LAYERS; l++)
                dfree(live[i].kv[l], live[i].kv_size);
            live[i] = live[--n_live];
        }
    }
    for (int i = 0; i < N_WEIGHTS; i++)
        dfree(w[i], ws[i]);
}

int main(int argc, char **argv) {
    const char *scenario = argc > 1 ? argv[1] : "seed";
    int requests = argc > 2 ? atoi(argv[2]) : 200;
    if (cudaFree(0) != cudaSuccess) {
        fprintf(stderr, "bench_frag: no CUDA device\n");
        return 1;
    }
    base_used = used_now();
    if (!strcmp(scenario, "seed"))
        two_phase(8, 16 * MiB, 4, 32 * MiB);
    else if (!strcmp(scenario, "reverse"))
        two_phase(4, 32 * MiB, 8, 16 * MiB);
    else if (!strcmp(scenario, "serving"))
        serving(requests);
    else {
        fprintf(stderr, "bench_frag: unknown scenario %s (seed|reverse|serving)\n", scenario);
        return 2;
    }
    printf("frag scenario=%s peak_allocated=%llu peak_reserved=%llu ratio=%.3f allocs=%llu\n",
           scenario, peak_allocated, peak_reserved,
           peak_allocated ? (double)peak_reserved / (double)peak_allocated : 0.0, n_allocs);
    return 0;
}
