/* A loop with no NVTX range and no phase in its frames: four iterations, each making a
 * 1 MiB scratch buffer it frees and a 2 MiB buffer it keeps. The steps can only be found
 * from the repetition of the allocation pattern; each step grows by 2 MiB. */
#include "shim_util.h"

static void iteration(void **kept) {
    void *scratch = NULL;
    CHECK(cudaMalloc(&scratch, 1 * MiB));
    CHECK(cudaMalloc(kept, 2 * MiB));
    CHECK(cudaFree(scratch));
}

int main(void) {
    void *kept[4];
    for (int i = 0; i < 4; i++)
        iteration(&kept[i]);
    printf("ok %p\n", kept[3]);
    return 0;
}
