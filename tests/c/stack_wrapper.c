/* A forwarding libcuda.so.1, as GPU-sharing interposers (HAMi-core's libvgpu.so) are built:
 * it dlopens the real driver by path (WRAP_REAL_DRIVER), looks every function up with dlsym
 * on that handle (cuGetProcAddress_v2 included), exports the same names and forwards to
 * them, and hands out its own cuMemAlloc_v2 from cuGetProcAddress. At exit it writes
 * "forwarded=N gpa=M allocs=K" to WRAP_REPORT. WRAP_NAMES (a header of FWD(name) lines) lists
 * the functions to forward; all take at most six integer or pointer arguments, so one
 * generic forwarder passes them through unchanged (x86-64 System V). Build with
 * -shared -fPIC -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uintptr_t (*fwd_t)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);
typedef int (*gpa_v2_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*gpa_t)(const char *, void **, int, unsigned long long);

static void *real_lib;
static gpa_v2_t real_gpa_v2;
static gpa_t real_gpa;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static unsigned long forwarded, gpa_calls, alloc_calls;

static void open_real(void) {
    const char *path = getenv("WRAP_REAL_DRIVER");
    real_lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!real_lib) {
        fprintf(stderr, "wrapper: cannot open the real driver %s: %s\n", path ? path : "(unset)", dlerror());
        abort();
    }
    real_gpa_v2 = (gpa_v2_t)dlsym(real_lib, "cuGetProcAddress_v2");
    real_gpa = (gpa_t)dlsym(real_lib, "cuGetProcAddress");
    if (!real_gpa_v2 || !real_gpa) {
        fprintf(stderr, "wrapper: no cuGetProcAddress in the real driver\n");
        abort();
    }
}

static fwd_t real_sym(const char *name) {
    pthread_once(&once, open_real);
    void *p = dlsym(real_lib, name);
    if (!p) {
        fprintf(stderr, "wrapper: the real driver has no %s\n", name);
        abort();
    }
    return (fwd_t)p;
}

#define FWD(name)                                                                          \
    uintptr_t name(uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t d, uintptr_t e,        \
                   uintptr_t f) {                                                          \
        static fwd_t r;                                                                    \
        if (!r)                                                                            \
            r = real_sym(#name);                                                           \
        __atomic_add_fetch(&forwarded, 1, __ATOMIC_RELAXED);                               \
        if (!strcmp(#name, "cuMemAlloc_v2"))                                               \
            __atomic_add_fetch(&alloc_calls, 1, __ATOMIC_RELAXED);                           \
        return r(a, b, c, d, e, f);                                                        \
    }
#include WRAP_NAMES

uintptr_t cuMemAlloc_v2(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);

/* Hands out its own cuMemAlloc_v2 for "cuMemAlloc", the real driver's answer otherwise. */
static int own_answer(const char *sym, void **pfn, int rc) {
    if (rc == 0 && pfn && *pfn && !strcmp(sym, "cuMemAlloc"))
        *pfn = (void *)cuMemAlloc_v2;
    return rc;
}

int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    pthread_once(&once, open_real);
    __atomic_add_fetch(&gpa_calls, 1, __ATOMIC_RELAXED);
    return own_answer(sym, pfn, real_gpa_v2(sym, pfn, ver, flags, status));
}

int cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
    pthread_once(&once, open_real);
    __atomic_add_fetch(&gpa_calls, 1, __ATOMIC_RELAXED);
    return own_answer(sym, pfn, real_gpa(sym, pfn, ver, flags));
}

__attribute__((destructor)) static void write_report(void) {
    const char *path = getenv("WRAP_REPORT");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f)
        return;
    fprintf(f, "forwarded=%lu gpa=%lu allocs=%lu\n", forwarded, gpa_calls, alloc_calls);
    fclose(f);
}
