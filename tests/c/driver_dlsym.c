/* What dlsym and cuGetProcAddress hand out, one line per lookup: name=MODULE[:symbol], where
 * MODULE is shim (libcushim.so), cuda (the driver library), libm, libc, other or null.
 * Unrelated libraries and non-allocation names must always get the real functions; only the
 * exact allocation entry points may come from the shim. Ends by allocating through the
 * pointers it got, so handing out a hook must also work. Link with -lcuda -lm. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include "driver_util.h"

static const char *module_of(void *p, const char **sym) {
    Dl_info i;
    *sym = "";
    if (!p)
        return "null";
    if (!dladdr(p, &i) || !i.dli_fname)
        return "other";
    if (i.dli_sname && i.dli_saddr == p)
        *sym = i.dli_sname;
    const char *f = strrchr(i.dli_fname, '/');
    f = f ? f + 1 : i.dli_fname;
    if (strstr(f, "cushim"))
        return "shim";
    if (strstr(f, "cuda"))
        return "cuda";
    if (!strncmp(f, "libm.", 5) || !strncmp(f, "libm-", 5))
        return "libm";
    if (!strncmp(f, "libc.", 5) || !strncmp(f, "libc-", 5))
        return "libc";
    return "other";
}

static void show(const char *label, void *p) {
    const char *sym;
    const char *m = module_of(p, &sym);
    printf("%s=%s%s%s\n", label, m, *sym ? ":" : "", sym);
}

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t,
                          CUdriverProcAddressQueryResult *);

static void ask(gpa_t gpa, const char *name, int version, int flags) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    gpa(name, &fn, version, (cuuint64_t)flags, &st);
    char label[128];
    snprintf(label, sizeof label, "gpa:%s:%d:%d", name, version, flags);
    show(label, fn);
}

int main(void) {
    void *libm = dlopen("libm.so.6", RTLD_NOW);
    void *libc = dlopen("libc.so.6", RTLD_NOW);
    double (*my_cos)(double) = cos;
    printf("libm_cos_same=%d\n", dlsym(libm, "cos") == (void *)my_cos);
    printf("libc_malloc_same=%d\n", dlsym(libc, "malloc") == (void *)malloc);
    printf("default_printf_same=%d\n", dlsym(RTLD_DEFAULT, "printf") == (void *)printf);
    printf("next_puts_same=%d\n", dlsym(RTLD_NEXT, "puts") == (void *)puts);
    show("libm:cuMemAlloc_v2", dlsym(libm, "cuMemAlloc_v2"));
    show("libc:cuMemFree_v2", dlsym(libc, "cuMemFree_v2"));
    /* RTLD_NEXT from the program: the first definition after it, i.e. the preloaded shim's
     * when there is one (dlsym must answer for the program, not for itself). */
    show("next:cudaMalloc", dlsym(RTLD_NEXT, "cudaMalloc"));
    show("default:cudaMalloc", dlsym(RTLD_DEFAULT, "cudaMalloc"));

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    const char *names[] = {"cuInit", "cuDeviceGetCount", "cuMemAddressReserve",
                           "cuMemGetAddressRange_v2", "cuMemcpyHtoD_v2", "cuStreamSynchronize",
                           "cuStreamDestroy", "cuGetExportTable", "cudnnCreate", "cuMemAlloc",
                           "cuMemAllocPitch_v2", "cuMemAlloc_v2x", "cuMemAlloc_v2",
                           "cuMemFree_v2", "cuMemAllocHost_v2", "cuMemHostAlloc",
                           "cuMemFreeHost", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
                           "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemGetInfo_v2",
                           "cuStreamCreate", "cuStreamCreateWithPriority", "cuStreamDestroy_v2",
                           "cuGetProcAddress", "cuGetProcAddress_v2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char label[128];
        snprintf(label, sizeof label, "cuda:%s", names[i]);
        show(label, dlsym(cuda, names[i]));
    }

    gpa_t gpa = (gpa_t)dlsym(cuda, "cuGetProcAddress_v2");
    ask(gpa, "cuMemAlloc", 3020, 0);
    ask(gpa, "cuMemAlloc", 12090, 0);
    ask(gpa, "cuMemAlloc", 2000, 0);
    ask(gpa, "cuMemFree", 3020, 0);
    ask(gpa, "cuMemHostAlloc", 2020, 0);
    ask(gpa, "cuMemFreeHost", 2000, 0);
    ask(gpa, "cuMemGetInfo", 3020, 0);
    ask(gpa, "cuMemAllocAsync", 11020, 0);
    ask(gpa, "cuMemAllocAsync", 11020, 2);
    ask(gpa, "cuMemFreeAsync", 11020, 2);
    ask(gpa, "cuStreamDestroy", 2000, 0);
    ask(gpa, "cuStreamDestroy", 4000, 0);
    ask(gpa, "cuDeviceGetCount", 2000, 0);
    ask(gpa, "cuMemcpyHtoD", 7000, 2);
    ask(gpa, "cuGetExportTable", 3000, 0);
    ask(gpa, "cuGetProcAddress", 12000, 0);
    ask(gpa, "cuGetProcAddress", 11030, 0);
    ask(gpa, "cudnnCreate", 12000, 0);
    ask(gpa, "cuMemAlloc_v2", 12000, 0);

    /* Use what was handed out. */
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(cuda, "cuInit");
    CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
    CUresult (*release)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(cuda, "cuMemFree_v2");
    CUdriverProcAddressQueryResult st;
    gpa("cuMemAlloc", (void **)&alloc, 3020, 0, &st);
    CUdevice d;
    DCHECK(init(0));
    DCHECK(cuDeviceGet(&d, 0));
    DCHECK(cuDevicePrimaryCtxRetain(&driver_ctx, d));
    DCHECK(cuCtxSetCurrent(driver_ctx));
    CUdeviceptr p = 0;
    CUresult a = alloc(&p, 1 << 20);
    CUresult f = release(p);
    printf("use_alloc=%d\n", (int)a);
    printf("use_free=%d\n", (int)f);
    return 0;
}
