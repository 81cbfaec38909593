/* cushim's demo workload: a small inference/training-style loop written against the plain
 * CUDA runtime API (the same source builds with nvcc against the real toolkit).
 *
 * - loads "model weights": 32 tensors of 1..40 MiB, staged through pinned host memory;
 * - runs STEPS steps on two streams (a compute stream and a non-blocking copy stream):
 *   each step stages an input batch of varying size in pinned memory, copies it up,
 *   allocates per-layer activations whose size follows the batch, small per-layer buffers,
 *   "runs kernels" (cudaLaunchHostFunc), and frees everything at the end of the step;
 * - checks that the weights survived, prints how many allocation calls it issued.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) {                                               \
            fprintf(stderr, "demo: %s failed at %s:%d: %s\n", #call, __FILE__,   \
                    __LINE__, cudaGetErrorString(err_));                         \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#define MiB (1024u * 1024u)
#define N_WEIGHTS 32
#define LAYERS 12

static unsigned long n_malloc, n_free, n_host_alloc, n_host_free;
static uint64_t rng = 88172645463325252ull;

static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void *dev_alloc(size_t size) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, size));
    n_malloc++;
    return p;
}

static void dev_free(void *p) {
    CHECK(cudaFree(p));
    n_free++;
}

/* A "kernel": runs in stream order on the device's worker. */
static void CUDART_CB layer_kernel(void *arg) {
    volatile uint32_t *counter = (volatile uint32_t *)arg;
    *counter += 1;
}

static void *stage_weights(void **weights, size_t *sizes, cudaStream_t copy) {
    void *staging = NULL;
    CHECK(cudaHostAlloc(&staging, 40 * MiB, cudaHostAllocDefault));
    n_host_alloc++;
    for (int i = 0; i < N_WEIGHTS; i++) {
        sizes[i] = (1 + next_rand() % 40) * MiB;
        weights[i] = dev_alloc(sizes[i]);
        memset(staging, 0x40 + i, sizes[i]);
        CHECK(cudaMemcpyAsync(weights[i], staging, sizes[i], cudaMemcpyHostToDevice, copy));
        CHECK(cudaStreamSynchronize(copy));
    }
    return staging;
}

static void run_step(int step, cudaStream_t compute, cudaStream_t copy, uint32_t *counter) {
    size_t batch = 1 + next_rand() % 64; /* sequences in this batch */
    void *input_host = NULL;
    CHECK(cudaMallocHost(&input_host, batch * 64 * 1024));
    n_host_alloc++;
    memset(input_host, step & 0xff, batch * 64 * 1024);
    void *input = dev_alloc(batch * 64 * 1024);
    CHECK(cudaMemcpyAsync(input, input_host, batch * 64 * 1024, cudaMemcpyHostToDevice, copy));
    CHECK(cudaStreamSynchronize(copy));

    void *acts[LAYERS];
    void *small[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        acts[l] = dev_alloc(batch * (96 + 32 * (l % 4)) * 1024);
        small[l] = dev_alloc(4096 + (next_rand() % 64) * 1024);
        CHECK(cudaMemsetAsync(small[l], 0, 4096, compute));
        CHECK(cudaLaunchHostFunc(compute, layer_kernel, counter));
    }
    CHECK(cudaStreamSynchronize(compute));
    for (int l = LAYERS - 1; l >= 0; l--) {
        dev_free(small[l]);
        dev_free(acts[l]);
    }
    dev_free(input);
    CHECK(cudaFreeHost(input_host));
    n_host_free++;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 200;
    cudaStream_t compute, copy;
    CHECK(cudaStreamCreate(&compute));
    CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));

    void *weights[N_WEIGHTS];
    size_t sizes[N_WEIGHTS];
    void *staging = stage_weights(weights, sizes, copy);

    uint32_t *counter = NULL;
    CHECK(cudaMallocHost((void **)&counter, sizeof *counter));
    n_host_alloc++;
    *counter = 0;
    for (int s = 0; s < steps; s++)
        run_step(s, compute, copy, counter);

    /* The weights must be intact after all that churn. */
    int bad = 0;
    for (int i = 0; i < N_WEIGHTS; i++) {
        unsigned char probe[2];
        CHECK(cudaMemcpy(&probe[0], weights[i], 1, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(&probe[1], (char *)weights[i] + sizes[i] - 1, 1, cudaMemcpyDeviceToHost));
        if (probe[0] != 0x40 + i || probe[1] != 0x40 + i)
            bad++;
    }
    if (bad || *counter != (uint32_t)(steps * LAYERS)) {
        fprintf(stderr, "demo: FAILED: %d corrupted weights, %u kernels of %d\n", bad, *counter,
                steps * LAYERS);
        return 1;
    }
    for (int i = 0; i < N_WEIGHTS; i++)
        dev_free(weights[i]);
    CHECK(cudaFreeHost(staging));
    CHECK(cudaFreeHost(counter));
    n_host_free += 2;
    CHECK(cudaStreamDestroy(compute));
    CHECK(cudaStreamDestroy(copy));
    printf("demo: ok: %d steps, %lu cudaMalloc, %lu cudaFree, %lu pinned allocs, %lu pinned frees\n",
           steps, n_malloc, n_free, n_host_alloc, n_host_free);
    return 0;
}
