/* Loads simcuda by each of NVIDIA's library names, the way loaders do (cudarc opens
 * "libcuda.so", the runtime's users "libcudart.so.12", the runtime itself "libcuda.so.1"),
 * and checks they are one library with one process state: memory allocated through the
 * driver name is seen by the runtime name. Prints "PASS dlopen". */
#include <dlfcn.h>
#include <stddef.h>
#include "sim_check.h"

typedef int (*init_t)(unsigned);
typedef int (*retain_t)(void **, int);
typedef int (*set_t)(void *);
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*info_t)(size_t *, size_t *);

int main(void) {
    void *cuda = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    void *cuda1 = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    void *rt0 = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(cuda && cuda1 && rt && rt0);
    REQUIRE(cuda == cuda1 && cuda == rt && cuda == rt0);
    init_t init = (init_t)dlsym(cuda, "cuInit");
    retain_t retain = (retain_t)dlsym(cuda, "cuDevicePrimaryCtxRetain");
    set_t set = (set_t)dlsym(cuda, "cuCtxSetCurrent");
    alloc_t alloc = (alloc_t)dlsym(cuda, "cuMemAlloc_v2");
    info_t info = (info_t)dlsym(rt, "cudaMemGetInfo");
    REQUIRE(init && retain && set && alloc && info);
    void *ctx;
    unsigned long long d;
    size_t f, t;
    EXPECT(0, init(0));
    EXPECT(0, retain(&ctx, 0));
    EXPECT(0, set(ctx));
    EXPECT(0, alloc(&d, 1 << 20));
    EXPECT(0, info(&f, &t));
    REQUIRE(f == t - (1 << 20));
    printf("PASS dlopen\n");
    return 0;
}
