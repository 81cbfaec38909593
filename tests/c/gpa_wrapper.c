/* A minimal forwarding libcuda.so.1, the shape of GPU-sharing layers and version shims: it
 * exports only cuInit and cuGetProcAddress_v2 (all the CUDA runtime needs from a driver),
 * dlopens the real driver by path (WRAP_REAL_DRIVER) and forwards both to it. For
 * "cuMemAlloc" and "cuMemCreate" it hands out its own counting functions, so every device
 * allocation made through what it handed out is counted. WRAP_HIDE=name,... answers those
 * base names as not found, as an older driver would. At exit it writes
 * "gpa=N allocs=A creates=C" to WRAP_REPORT. Build with -shared -fPIC
 * -Wl,-soname,libcuda.so.1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*gpa_v2_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*init_t)(unsigned);
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*create_t)(unsigned long long *, size_t, const void *, unsigned long long);

static gpa_v2_t real_gpa;
static init_t real_init;
static alloc_t real_alloc;
static create_t real_create;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static unsigned long gpa_calls, allocs, creates;

static void open_real(void) {
    const char *path = getenv("WRAP_REAL_DRIVER");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!lib) {
        fprintf(stderr, "gpa_wrapper: cannot open the real driver %s: %s\n", path ? path : "(unset)", dlerror());
        abort();
    }
    real_gpa = (gpa_v2_t)dlsym(lib, "cuGetProcAddress_v2");
    real_init = (init_t)dlsym(lib, "cuInit");
    if (!real_gpa || !real_init) {
        fprintf(stderr, "gpa_wrapper: the real driver lacks cuInit or cuGetProcAddress_v2\n");
        abort();
    }
}

static int count_alloc(unsigned long long *p, size_t n) {
    __atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
    return __atomic_load_n(&real_alloc, __ATOMIC_ACQUIRE)(p, n);
}

static int count_create(unsigned long long *h, size_t n, const void *prop, unsigned long long flags) {
    __atomic_add_fetch(&creates, 1, __ATOMIC_RELAXED);
    return __atomic_load_n(&real_create, __ATOMIC_ACQUIRE)(h, n, prop, flags);
}

int cuInit(unsigned flags) {
    pthread_once(&once, open_real);
    return real_init(flags);
}

/* Whether WRAP_HIDE (a comma-separated list of base names) hides `sym`, as a driver too old
 * to have it would. */
static int hidden(const char *sym) {
    const char *list = getenv("WRAP_HIDE");
    size_t n = strlen(sym);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, sym, n))
            return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    pthread_once(&once, open_real);
    __atomic_add_fetch(&gpa_calls, 1, __ATOMIC_RELAXED);
    if (sym && pfn && hidden(sym)) {
        *pfn = NULL;
        if (status)
            *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
        return 500;      /* CUDA_ERROR_NOT_FOUND */
    }
    int rc = real_gpa(sym, pfn, ver, flags, status);
    if (rc == 0 && pfn && *pfn) {
        if (!strcmp(sym, "cuMemAlloc") && ver >= 3020) {
            __atomic_store_n(&real_alloc, (alloc_t)*pfn, __ATOMIC_RELEASE);
            *pfn = (void *)count_alloc;
        } else if (!strcmp(sym, "cuMemCreate")) {
            __atomic_store_n(&real_create, (create_t)*pfn, __ATOMIC_RELEASE);
            *pfn = (void *)count_create;
        }
    }
    return rc;
}

__attribute__((destructor)) static void write_report(void) {
    const char *path = getenv("WRAP_REPORT");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f)
        return;
    fprintf(f, "gpa=%lu allocs=%lu creates=%lu\n", gpa_calls, allocs, creates);
    fclose(f);
}
