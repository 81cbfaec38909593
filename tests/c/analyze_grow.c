/* Two allocation sites for `cushim diff`: weights() allocates 4 x 8 MiB, activations()
 * allocates (4 + EXTRA) x 4 MiB, where EXTRA is the first argument. Everything stays live
 * to the end, so the peak is at the end. */
#include "shim_util.h"

__attribute__((noinline)) static void *weights(size_t n) {
    void *p;
    CHECK(cudaMalloc(&p, n));
    return p;
}

__attribute__((noinline)) static void *activations(size_t n) {
    void *p;
    CHECK(cudaMalloc(&p, n));
    return p;
}

int main(int argc, char **argv) {
    int extra = argc > 1 ? atoi(argv[1]) : 0;
    void *w[4], *a[64];
    for (int i = 0; i < 4; i++)
        w[i] = weights(8 * MiB);
    for (int i = 0; i < 4 + extra && i < 64; i++)
        a[i] = activations(4 * MiB);
    printf("ok %p %p\n", w[0], a[0]);
    return 0;
}
