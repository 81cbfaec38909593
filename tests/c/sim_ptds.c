/* Built with -DCUDA_API_PER_THREAD_DEFAULT_STREAM: stream 0 is each thread's own per-thread
 * default stream, so a slow host function queued on "stream 0" by one thread does not delay
 * "stream 0" work of another thread. Without the define both threads share the legacy
 * stream and the reader waits. Prints "seen <flag>" then "PASS ptds".
 * In the per-thread build the slow host function is held by a gate (sim_gate.h) until the
 * reader has finished, so "seen 0" needs no timing luck; should the reader wrongly wait for
 * it, the gate gives up after 60 s and the reader sees 1. In the legacy build the gate is
 * open from the start: the reader must wait whatever the timing. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>
#include "sim_check.h"
#include "sim_gate.h"

static volatile int flag;
static int seen = -1;
static void slow_set(void *p) {
    (void)p;
    gate_wait();
    usleep(300 * 1000);
    flag = 1;
}
static void read_flag(void *p) { *(int *)p = flag; }

static void *reader(void *arg) {
    (void)arg;
    EXPECT(cudaSuccess, cudaLaunchHostFunc(0, read_flag, &seen));
    EXPECT(cudaSuccess, cudaStreamSynchronize(0));
    return NULL;
}

int main(void) {
#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
    gate_open();
#endif
    void *d;
    char h[64];
    EXPECT(cudaSuccess, cudaMalloc(&d, 64));
    EXPECT(cudaSuccess, cudaLaunchHostFunc(0, slow_set, NULL));
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, reader, NULL) == 0);
    pthread_join(t, NULL);
    gate_open();
    printf("seen %d\n", seen);
    EXPECT(cudaSuccess, cudaMemsetAsync(d, 9, 64, 0));
    EXPECT(cudaSuccess, cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost));
    REQUIRE(h[63] == 9);
    EXPECT(cudaSuccess, cudaDeviceSynchronize());
    printf("PASS ptds\n");
    return 0;
}
