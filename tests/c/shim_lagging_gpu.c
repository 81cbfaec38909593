/* A GPU that lags behind the CPU: two non-blocking streams each get a host function that
 * sleeps LAG_MS before every step's work, so every free is still in flight at the next
 * malloc. Each of STEPS steps allocates 8 x 16 MiB with cudaMalloc, sets them with
 * cudaMemsetAsync on the two streams, and frees them. Usage: shim_lagging_gpu [STEPS] [LAG_MS]
 * Prints the shim's peak allocated and reserved bytes and the wall time. */
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include "shim_util.h"

static void CUDART_CB lag(void *arg) {
    usleep((useconds_t)(uintptr_t)arg * 1000);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 50;
    int lag_ms = argc > 2 ? atoi(argv[2]) : 10;
    cudaStream_t s[2];
    for (int i = 0; i < 2; i++)
        CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    void *warm = NULL; /* context and first segment outside the timed part */
    CHECK(cudaMalloc(&warm, 512));
    double t0 = now_ms();
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < 2; i++)
            CHECK(cudaLaunchHostFunc(s[i], lag, (void *)(uintptr_t)lag_ms));
        void *p[8];
        for (int k = 0; k < 8; k++) {
            CHECK(cudaMalloc(&p[k], 16 * MiB));
            CHECK(cudaMemsetAsync(p[k], step & 0xff, 16 * MiB, s[k % 2]));
        }
        for (int k = 0; k < 8; k++)
            CHECK(cudaFree(p[k]));
    }
    CHECK(cudaDeviceSynchronize());
    double t1 = now_ms();
    printf("peak_allocated=%lld\npeak_reserved=%lld\nwall_ms=%.1f\n",
           shim_stat("allocated_bytes.all.peak"), shim_stat("reserved_bytes.all.peak"), t1 - t0);
    CHECK(cudaFree(warm));
    for (int i = 0; i < 2; i++)
        CHECK(cudaStreamDestroy(s[i]));
    return 0;
}
