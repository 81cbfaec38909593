/* The seed fragmentation scenario on the driver API (cuMemAlloc_v2 / cuMemFree_v2 directly).
 * Modes: forward (8 x 16 MiB, free all, 4 x 32 MiB), reverse (4 x 32 MiB, free all,
 * 8 x 16 MiB), reuse (8 x 16 MiB, free all, 1 x 16 MiB). Prints the device memory in use
 * after the last phase. */
#include "driver_util.h"

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "forward";
    int first_n = 8, second_n = 4;
    size_t first = 16 * MiB, second = 32 * MiB;
    if (!strcmp(mode, "reverse")) {
        first_n = 4; second_n = 8; first = 32 * MiB; second = 16 * MiB;
    } else if (!strcmp(mode, "reuse")) {
        second_n = 1; second = 16 * MiB;
    } else if (strcmp(mode, "forward")) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    driver_init();
    CUdeviceptr a[8], b[8];
    for (int i = 0; i < first_n; i++)
        DCHECK(cuMemAlloc(&a[i], first));
    for (int i = 0; i < first_n; i++)
        DCHECK(cuMemFree(a[i]));
    for (int i = 0; i < second_n; i++)
        DCHECK(cuMemAlloc(&b[i], second));
    printf("used_after=%llu\n", used_bytes());
    printf("device_allocs=%lld\n", shim_stat("num_device_alloc"));
    for (int i = 0; i < second_n; i++)
        DCHECK(cuMemFree(b[i]));
    return 0;
}
