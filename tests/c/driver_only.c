/* A driver-API program that loads the CUDA runtime library (as numba-cuda's process does:
 * something dlopens libcudart.so.12) but never calls it, allocating with the driver in the
 * primary context it made current itself. Prints "result=ok allocs=N". */
#include "driver_util.h"

int main(void) {
    void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_GLOBAL);
    if (!rt) {
        fprintf(stderr, "dlopen libcudart.so.12: %s\n", dlerror());
        return 1;
    }
    driver_init();
    CUdeviceptr p[4];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 4; i++) {
            DCHECK(cuMemAlloc(&p[i], (size_t)(i + 1) * MiB));
            DCHECK(cuMemsetD8(p[i], (unsigned char)i, (size_t)(i + 1) * MiB));
        }
        for (int i = 0; i < 4; i++)
            DCHECK(cuMemFree(p[i]));
    }
    printf("result=ok\n");
    return 0;
}
