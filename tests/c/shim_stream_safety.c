/* A slow kernel on a non-blocking stream writes into p after p is freed; a block allocated
 * right after the free must not be overwritten by it. Prints "intact=1" or "intact=0".
 * With the argument "race" (for free_sync:none, which must be seen to race), the slow kernel
 * waits until the main thread's write into the new block is done, so the late write lands
 * after it whatever the scheduling; otherwise it sleeps 300 ms (a protected mode must keep
 * the block intact whatever the timing). */
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "shim_util.h"

static atomic_int released;
static int race;

static void CUDART_CB slow(void *arg) {
    (void)arg;
    if (!race) {
        usleep(300 * 1000);
        return;
    }
    /* Hang detector only: a stuck handshake fails the check after 60 s instead of hanging. */
    time_t end = time(NULL) + 60;
    while (!atomic_load(&released) && time(NULL) < end) usleep(1000);
}

int main(int argc, char **argv) {
    race = argc > 1 && !strcmp(argv[1], "race");
    if (race) require_cache_for_race();
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
    if (race) {
        /* The legacy stream does not wait for the non-blocking one: its memset is done. */
        CHECK(cudaStreamSynchronize(0));
        atomic_store(&released, 1);
    }
    CHECK(cudaStreamSynchronize(s));
    print_reuse_verdict(p, q, size);
    CHECK(cudaFree(q));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
