/* Threads allocating without streams. Usage: shim_threads KIND
 *   legacy  the main thread, then a second thread (the first still alive, so the shim sees
 *           two), each: 50 x (cudaMalloc 1 MiB, cudaMemsetAsync on stream 0, cudaFree); no
 *           stream, no per-thread default stream
 *   handle  the same with the memsets on cudaStreamPerThread
 * Built with -DCUDA_API_PER_THREAD_DEFAULT_STREAM, "legacy" calls the runtime's _ptsz entry
 * points (stream 0 is then each thread's per-thread default stream).
 * Prints the shim's device allocations and allocations served. */
#include <pthread.h>
#include "shim_util.h"

static cudaStream_t stream;

static void *work(void *arg) {
    (void)arg;
    for (int i = 0; i < 50; i++) {
        void *p = NULL;
        CHECK(cudaMalloc(&p, MiB));
        CHECK(cudaMemsetAsync(p, i, MiB, stream));
        CHECK(cudaFree(p));
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "legacy";
    stream = strcmp(kind, "handle") == 0 ? cudaStreamPerThread : 0;
    work(NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, work, NULL) != 0)
        return 2;
    pthread_join(th, NULL);
    CHECK(cudaDeviceSynchronize());
    printf("device_allocs=%lld\n", shim_stat("num_device_alloc"));
    printf("shim_allocations=%lld\n", shim_stat("allocation.all.allocated"));
    return 0;
}
