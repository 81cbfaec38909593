/* Built with -DCUDA_API_PER_THREAD_DEFAULT_STREAM: stream 0 is each thread's own per-thread
 * default stream, so a slow host function queued on "stream 0" by one thread does not delay
 * "stream 0" work of another thread. Without the define both threads share the legacy
 * stream and the reader waits. Prints "seen <flag>" then "PASS ptds". */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>
#include "sim_check.h"

static volatile int flag;
static int seen = -1;
static void slow_set(void *p) { (void)p; usleep(300 * 1000); flag = 1; }
static void read_flag(void *p) { *(int *)p = flag; }

static void *reader(void *arg) {
    (void)arg;
    EXPECT(cudaSuccess, cudaLaunchHostFunc(0, read_flag, &seen));
    EXPECT(cudaSuccess, cudaStreamSynchronize(0));
    return NULL;
}

int main(void) {
    void *d;
    char h[64];
    EXPECT(cudaSuccess, cudaMalloc(&d, 64));
    EXPECT(cudaSuccess, cudaLaunchHostFunc(0, slow_set, NULL));
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, reader, NULL) == 0);
    pthread_join(t, NULL);
    printf("seen %d\n", seen);
    EXPECT(cudaSuccess, cudaMemsetAsync(d, 9, 64, 0));
    EXPECT(cudaSuccess, cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost));
    REQUIRE(h[63] == 9);
    EXPECT(cudaSuccess, cudaDeviceSynchronize());
    printf("PASS ptds\n");
    return 0;
}
