/* A training loop with NVTX ranges: four iterations, each a numbered range "step N" holding
 * "forward", "backward" and "optimizer" ranges. Per iteration: the forward pass makes a
 * 4 MiB activation (kept for the backward pass, which frees it) and a 1 MiB scratch buffer
 * (freed in the forward pass); the backward pass makes the 2 MiB gradient on the first
 * iteration (kept for the whole run) and a 3 MiB temporary it frees; the optimizer makes
 * its 4 MiB state on the first iteration (kept) and a 5 MiB temporary it frees; and each
 * iteration leaks 6 MiB outside every phase. So steps 2..4 each grow by 6 MiB. */
#include "shim_util.h"
#include <nvtx3/nvToolsExt.h>

static void *alloc(size_t mib) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, mib * MiB));
    return p;
}

int main(void) {
    void *grad = NULL, *state = NULL, *leak[4];
    char name[32];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "step %d", i);
        nvtxRangePushA(name);
        nvtxRangePushA("forward");
        void *act = alloc(4);
        CHECK(cudaFree(alloc(1)));
        nvtxRangePop();
        nvtxRangePushA("backward");
        if (i == 0)
            grad = alloc(2);
        CHECK(cudaFree(alloc(3)));
        CHECK(cudaFree(act));
        nvtxRangePop();
        nvtxRangePushA("optimizer");
        if (i == 0)
            state = alloc(4);
        CHECK(cudaFree(alloc(5)));
        nvtxRangePop();
        leak[i] = alloc(6);
        nvtxRangePop();
    }
    printf("ok %p %p %p\n", grad, state, leak[3]);
    return 0;
}
