/* A slow kernel on a non-blocking stream writes into p after p is freed; a block allocated
 * right after the free must not be overwritten by it. Prints "intact=1" or "intact=0". */
#include <unistd.h>
#include "shim_util.h"

static void CUDART_CB slow(void *arg) {
    (void)arg;
    usleep(300 * 1000);
}

int main(void) {
    const size_t size = 4 * MiB;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *p = NULL, *q = NULL;
    CHECK(cudaMalloc(&p, size));
    CHECK(cudaLaunchHostFunc(s, slow, NULL));
    CHECK(cudaMemsetAsync(p, 0xAA, size, s)); /* queued behind the slow kernel */
    CHECK(cudaFree(p));
    CHECK(cudaMalloc(&q, size));
    CHECK(cudaMemset(q, 0x55, size));
    CHECK(cudaStreamSynchronize(s));
    unsigned char *h = malloc(size);
    CHECK(cudaMemcpy(h, q, size, cudaMemcpyDeviceToHost));
    int intact = 1;
    for (size_t i = 0; i < size; i++)
        if (h[i] != 0x55) { intact = 0; break; }
    printf("same_address=%d\nintact=%d\n", p == q, intact);
    CHECK(cudaFree(q));
    CHECK(cudaStreamDestroy(s));
    free(h);
    return 0;
}
