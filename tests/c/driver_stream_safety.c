/* The stream-safety scenario on the driver API: a slow "kernel" on a non-blocking stream
 * made with cuStreamCreate writes into p after p is freed; a block allocated right after the
 * free must not be overwritten by it. Prints "same_address=0|1" and "intact=0|1". The late
 * write is a host function (simcuda's device memory is host memory). */
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "driver_util.h"

/* With "race" (for free_sync:none), the slow kernel waits until the main thread's write
 * into the new block is done (a 60 s hang detector aside), so the late write lands after it
 * whatever the scheduling; otherwise it sleeps 300 ms. */
static atomic_int released;
static int race;

static void slow(void *arg) {
    (void)arg;
    if (!race) {
        usleep(300 * 1000);
        return;
    }
    time_t end = time(NULL) + 60;
    while (!atomic_load(&released) && time(NULL) < end) usleep(1000);
}

struct fill { CUdeviceptr p; size_t n; };

static void late_write(void *arg) {
    struct fill *f = arg;
    memset((void *)(uintptr_t)f->p, 0xAA, f->n);
}

int main(int argc, char **argv) {
    const size_t size = 4 * MiB;
    race = argc > 1 && !strcmp(argv[1], "race");
    if (race) require_cache_for_race();
    driver_init();
    CUstream s;
    DCHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr p = 0, q = 0;
    DCHECK(cuMemAlloc(&p, size));
    struct fill f = {p, size};
    DCHECK(cuLaunchHostFunc(s, slow, NULL));
    DCHECK(cuLaunchHostFunc(s, late_write, &f)); /* queued behind the slow kernel */
    DCHECK(cuMemFree(p));
    DCHECK(cuMemAlloc(&q, size));
    DCHECK(cuMemsetD8(q, 0x55, size));
    if (race) {
        /* The legacy stream does not wait for the non-blocking one: its memset is done. */
        DCHECK(cuStreamSynchronize(0));
        atomic_store(&released, 1);
    }
    DCHECK(cuStreamSynchronize(s));
    unsigned char *h = malloc(size);
    DCHECK(cuMemcpyDtoH(h, q, size));
    int intact = 1;
    for (size_t i = 0; i < size; i++)
        if (h[i] != 0x55) { intact = 0; break; }
    printf("same_address=%d\nintact=%d\n", p == q, intact);
    DCHECK(cuMemFree(q));
    DCHECK(cuStreamDestroy(s));
    free(h);
    return 0;
}
