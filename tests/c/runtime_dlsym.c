/* A program that reaches the runtime only through a library handle, as Python's ctypes
 * does: dlopen("libcudart.so.12", RTLD_LOCAL) and dlsym for cudaMalloc/cudaFree/
 * cudaGetLastError. Prints where cudaMalloc came from (module=shim|cuda) and result=ok. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*malloc_t)(void **, size_t);
typedef int (*free_t)(void *);
typedef int (*err_t)(void);

int main(void) {
    void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!rt) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    malloc_t m = (malloc_t)dlsym(rt, "cudaMalloc");
    free_t f = (free_t)dlsym(rt, "cudaFree");
    err_t e = (err_t)dlsym(rt, "cudaGetLastError");
    if (!m || !f || !e)
        return 1;
    Dl_info i;
    const char *module = dladdr((void *)m, &i) && strstr(i.dli_fname, "cushim") ? "shim" : "cuda";
    for (int round = 0; round < 10; round++) {
        void *p[4];
        for (int k = 0; k < 4; k++)
            if (m(&p[k], (size_t)(k + 1) << 20) != 0)
                return 1;
        for (int k = 0; k < 4; k++)
            if (f(p[k]) != 0)
                return 1;
    }
    int bad = f((void *)0x1234);   /* not an allocation: an error either way */
    int last = e();
    printf("module=%s bad_free=%d last_error=%d\nresult=ok\n", module, bad, last);
    return 0;
}
