/* pair_loop: N cached cudaMalloc+cudaFree pairs of one size, nothing else; the fixed-count
 * loop scripts/pair-instructions.sh runs under callgrind to count instructions per pair
 * (a figure that, unlike time, does not move with the machine's load).
 *
 * usage: pair_loop [SIZE] [N]    (defaults 512, 100000)
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    size_t size = argc > 1 ? strtoull(argv[1], 0, 0) : 512;
    long n = argc > 2 ? atol(argv[2]) : 100000;
    void *p;
    cudaMalloc(&p, size); cudaFree(p);
    for (long i = 0; i < n; i++) {
        if (cudaMalloc(&p, size) != cudaSuccess) return 1;
        if (cudaFree(p) != cudaSuccess) return 1;
    }
    return 0;
}
