/* Helpers shared by the shim's C test programs. */
#ifndef SHIM_UTIL_H
#define SHIM_UTIL_H
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        cudaError_t err_ = (call);                                                        \
        if (err_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s failed at %s:%d: %d %s\n", #call, __FILE__, __LINE__,     \
                    (int)err_, cudaGetErrorName(err_));                                   \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* The driver API's twin of CHECK, for programs that include <cuda.h> first. */
#ifdef __cuda_cuda_h__
#define DCHECK(call)                                                                      \
    do {                                                                                  \
        CUresult r_ = (call);                                                             \
        if (r_ != CUDA_SUCCESS) {                                                         \
            fprintf(stderr, "%s failed at %s:%d: %d\n", #call, __FILE__, __LINE__, (int)r_); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#endif

#define MiB (1024ull * 1024ull)

/* Device memory in use, as the device reports it. */
static inline unsigned long long used_bytes(void) {
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    return (unsigned long long)(total_b - free_b);
}

/* The shim's statistics as JSON, or "{}" when the shim is not loaded. */
static inline const char *shim_stats(void) {
    static char buf[1 << 16];
    int (*fn)(char *, size_t) = (int (*)(char *, size_t))dlsym(RTLD_DEFAULT, "cushim_memory_stats_json");
    if (!fn || fn(buf, sizeof buf) < 0)
        return "{}";
    return buf;
}

/* One integer statistic of device 0 (or the pinned cache when key starts with "host:"),
 * found by name in the JSON text (flat keys, so a string search is enough). -1 if absent. */
static inline long long shim_stat(const char *key) {
    const char *json = shim_stats();
    const char *scope = json;
    if (strncmp(key, "host:", 5) == 0) {
        key += 5;
        scope = strstr(json, "\"host\"");
        if (!scope)
            return -1;
    }
    char pat[256];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(scope, pat);
    return p ? atoll(p + strlen(pat)) : -1;
}

/* The stream-safety verdict: reads the `size` bytes at `q` back and prints whether `q` is the
 * freed block `p` handed out again (same_address) and whether every byte still holds 0x55,
 * the value the program last wrote there (intact=0: a late write from the freed block's
 * pending work landed in the new owner's memory), and how many allocations the shim served. */
static inline void print_reuse_verdict(const void *p, const void *q, size_t size) {
    unsigned char *h = malloc(size);
    CHECK(cudaMemcpy(h, q, size, cudaMemcpyDeviceToHost));
    int intact = 1;
    for (size_t i = 0; i < size; i++)
        if (h[i] != 0x55) { intact = 0; break; }
    printf("same_address=%d\nintact=%d\n", p == q, intact);
    /* The allocations the shim served (-1 when no shim answers): a verdict reached without
     * the cache proves nothing about it. */
    printf("shim_allocations=%lld\n", shim_stat("allocation.all.allocated"));
    free(h);
}

static inline int shim_call(const char *name) {
    int (*fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, name);
    return fn ? fn() : -1;
}
/* The race scenario's handshake needs a cache: the late write waits until the new owner's
 * write is done, which a free that synchronizes (no cache in the process) would wait for in
 * turn. Without one the program says so and fails at once instead of deadlocking until the
 * hang detector. */
static inline void require_cache_for_race(void) {
    if (!dlsym(RTLD_DEFAULT, "cushim_memory_stats_json")) {
        fprintf(stderr, "race mode needs the cache: no cushim in this process\n");
        exit(3);
    }
}
#endif
