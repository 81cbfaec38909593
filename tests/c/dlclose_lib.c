/* A library that allocates, built twice under two names (-DFN=...) so that the second can be
 * mapped where the first was after a dlclose. */
#include <cuda_runtime.h>

volatile int dlclose_lib_sink;

__attribute__((noinline)) int FN(void **p, size_t n) {
    int r = (int)cudaMalloc(p, n);
    dlclose_lib_sink = r; /* keeps the call from being a tail call: FN stays on the stack */
    return r;
}
