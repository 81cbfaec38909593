/* A loop that leaks across iterations: each "train/iteration" range (NVTX v3 push/pop) makes
 * a 1 MiB scratch buffer it frees and a 2 MiB buffer it keeps and never frees. Five
 * iterations: five allocations made in the range outlive it, five do not. */
#include "shim_util.h"
#include <nvtx3/nvToolsExt.h>

int main(void) {
    void *kept[5];
    nvtxRangePushA("train");
    for (int i = 0; i < 5; i++) {
        nvtxRangePushA("iteration");
        void *scratch = NULL;
        CHECK(cudaMalloc(&scratch, 1 * MiB));
        CHECK(cudaMalloc(&kept[i], 2 * MiB));
        CHECK(cudaFree(scratch));
        nvtxRangePop();
    }
    nvtxRangePop();
    printf("ok %p\n", kept[4]);
    return 0;
}
