/* Helpers shared by the driver-API test programs (no CUDA runtime calls anywhere). */
#ifndef DRIVER_UTIL_H
#define DRIVER_UTIL_H
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DCHECK(call)                                                                      \
    do {                                                                                  \
        CUresult r_ = (call);                                                             \
        if (r_ != CUDA_SUCCESS) {                                                         \
            const char *n_ = NULL;                                                        \
            cuGetErrorName(r_, &n_);                                                      \
            fprintf(stderr, "%s failed at %s:%d: %d %s\n", #call, __FILE__, __LINE__,     \
                    (int)r_, n_ ? n_ : "?");                                              \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define MiB (1024ull * 1024ull)

static CUcontext driver_ctx;

/* cuInit, then device 0's primary context current on this thread. */
static inline void driver_init(void) {
    CUdevice d;
    DCHECK(cuInit(0));
    DCHECK(cuDeviceGet(&d, 0));
    DCHECK(cuDevicePrimaryCtxRetain(&driver_ctx, d));
    DCHECK(cuCtxSetCurrent(driver_ctx));
}

/* Device memory in use, as the device reports it. */
static inline unsigned long long used_bytes(void) {
    size_t free_b = 0, total_b = 0;
    DCHECK(cuMemGetInfo(&free_b, &total_b));
    return (unsigned long long)(total_b - free_b);
}

/* One integer statistic of device 0 from the shim's C API, -1 when absent. */
static inline long long shim_stat(const char *key) {
    static char buf[1 << 16];
    int (*fn)(char *, size_t) = (int (*)(char *, size_t))dlsym(RTLD_DEFAULT, "cushim_memory_stats_json");
    if (!fn || fn(buf, sizeof buf) < 0)
        return -1;
    char pat[256];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(buf, pat);
    return p ? atoll(p + strlen(pat)) : -1;
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
