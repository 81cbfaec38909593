/* caffe_blobs: Caffe's SyncedMemory allocation pattern, on the blobs of a small
 * convolutional net (Caffe's CIFAR-10 "quick" net: three 5x5 convolutions with pooling,
 * two inner products, softmax loss), as an unmodified Caffe build makes its CUDA calls.
 *
 * What Caffe does, and this program does the same way:
 * - A Blob holds two SyncedMemory objects (data and diff) of capacity * sizeof(float).
 *   Nothing is allocated until first use: the first GPU access does cudaMalloc and a
 *   cudaMemset to zero (SyncedMemory::to_gpu from UNINITIALIZED); the first CPU access
 *   allocates a host buffer with cudaMallocHost (CaffeMallocHost in GPU mode).
 * - Blob::Reshape keeps the buffers when the new count fits the capacity and otherwise
 *   replaces both SyncedMemory objects (freeing their buffers: cudaFree, cudaFreeHost).
 * - Destroying a net frees every buffer of every blob.
 * - Layers own internal blobs reshaped with their tops: im2col buffers and bias
 *   multipliers of convolutions, argmax indices of max pooling, softmax scratch.
 * - The data layer prefetches 3 batches, each with host (pinned) and device buffers for
 *   the images and the labels.
 *
 * The workload: EPOCHS times, a training net is built, runs ITERS iterations whose batch
 * size is drawn from 32..256 (so blobs grow by Reshape during the epoch), and every 5
 * iterations a test net (batch 100) is built, runs one forward pass and is destroyed, as
 * scripts that evaluate with a fresh caffe.Net do; then the training net is destroyed.
 *
 * usage: caffe_blobs [EPOCHS [ITERS]]   (default 4 20)
 * Output (key=value): device_mallocs, device_frees, host_mallocs, host_frees (calls the
 * program made), peak_used (cudaMemGetInfo in-use above the start, sampled after each
 * allocation), wall_ms (the whole workload, CLOCK_MONOTONIC).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned long long n_dmalloc, n_dfree, n_hmalloc, n_hfree, base_used, peak_used;
static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "caffe_blobs: %s failed: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

static unsigned long long used_now(void) {
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return (unsigned long long)(total_b - free_b);
}

static void sample_peak(void) {
    unsigned long long u = used_now();
    if (u > base_used && u - base_used > peak_used)
        peak_used = u - base_used;
}

/* ---------------------------------------------------------------- SyncedMemory */

typedef struct {
    size_t size;
    void *cpu, *gpu;
} Synced;

static void *synced_gpu(Synced *s) {
    if (!s->gpu && s->size) {
        check(cudaMalloc(&s->gpu, s->size), "cudaMalloc");
        n_dmalloc++;
        sample_peak();
        check(cudaMemset(s->gpu, 0, s->size), "cudaMemset");
    }
    return s->gpu;
}

static void *synced_cpu(Synced *s) {
    if (!s->cpu && s->size) {
        check(cudaMallocHost(&s->cpu, s->size), "cudaMallocHost");
        n_hmalloc++;
        memset(s->cpu, 0, s->size);
    }
    return s->cpu;
}

static void synced_release(Synced *s) {
    if (s->cpu) {
        check(cudaFreeHost(s->cpu), "cudaFreeHost");
        n_hfree++;
    }
    if (s->gpu) {
        check(cudaFree(s->gpu), "cudaFree");
        n_dfree++;
    }
    s->cpu = s->gpu = NULL;
}

/* ------------------------------------------------------------------------ Blob */

typedef struct {
    size_t count, capacity;
    Synced data, diff;
} Blob;

static void blob_reshape(Blob *b, size_t count) {
    b->count = count;
    if (count > b->capacity) {
        b->capacity = count;
        synced_release(&b->data);
        synced_release(&b->diff);
        b->data.size = b->diff.size = count * sizeof(float);
    }
}

static void blob_reset(Blob *b) {
    synced_release(&b->data);
    synced_release(&b->diff);
    memset(b, 0, sizeof *b);
}

/* ------------------------------------------------------------------------- Net */

enum {
    /* activations (tops) */
    DATA, LABEL, CONV1, POOL1, CONV2, POOL2, CONV3, POOL3, IP1, IP2, PROB, LOSS,
    /* layer-internal blobs */
    COL1, COL2, COL3, BIASM1, BIASM2, BIASM3, BIASM_IP, IDX1, IDX2, IDX3, SCALE,
    /* parameters (weights, biases) */
    W1, B1, W2, B2, W3, B3, W4, B4, W5, B5,
    /* prefetch: 3 batches of images and labels */
    PF_DATA0, PF_LABEL0, PF_DATA1, PF_LABEL1, PF_DATA2, PF_LABEL2,
    NBLOBS
};

typedef struct {
    Blob b[NBLOBS];
    int prefetch_next;
} Net;

static void net_reshape(Net *n, size_t N) {
    Blob *b = n->b;
    blob_reshape(&b[DATA], N * 3 * 32 * 32);
    blob_reshape(&b[LABEL], N);
    blob_reshape(&b[CONV1], N * 32 * 32 * 32);
    blob_reshape(&b[POOL1], N * 32 * 16 * 16);
    blob_reshape(&b[CONV2], N * 32 * 16 * 16);
    blob_reshape(&b[POOL2], N * 32 * 8 * 8);
    blob_reshape(&b[CONV3], N * 64 * 8 * 8);
    blob_reshape(&b[POOL3], N * 64 * 4 * 4);
    blob_reshape(&b[IP1], N * 64);
    blob_reshape(&b[IP2], N * 10);
    blob_reshape(&b[PROB], N * 10);
    blob_reshape(&b[LOSS], 1);
    /* im2col buffers: one image at a time (kernel*kernel*channels_in x out_h*out_w) */
    blob_reshape(&b[COL1], 3 * 25 * 32 * 32);
    blob_reshape(&b[COL2], 32 * 25 * 16 * 16);
    blob_reshape(&b[COL3], 32 * 25 * 8 * 8);
    blob_reshape(&b[BIASM1], 32 * 32);
    blob_reshape(&b[BIASM2], 16 * 16);
    blob_reshape(&b[BIASM3], 8 * 8);
    blob_reshape(&b[BIASM_IP], N);
    blob_reshape(&b[IDX1], N * 32 * 16 * 16);
    blob_reshape(&b[IDX2], N * 32 * 8 * 8);
    blob_reshape(&b[IDX3], N * 64 * 4 * 4);
    blob_reshape(&b[SCALE], N);
    for (int i = 0; i < 3; i++) {
        blob_reshape(&b[PF_DATA0 + 2 * i], N * 3 * 32 * 32);
        blob_reshape(&b[PF_LABEL0 + 2 * i], N);
    }
}

static void net_build(Net *n) {
    memset(n, 0, sizeof *n);
    Blob *b = n->b;
    blob_reshape(&b[W1], 32 * 3 * 25);
    blob_reshape(&b[B1], 32);
    blob_reshape(&b[W2], 32 * 32 * 25);
    blob_reshape(&b[B2], 32);
    blob_reshape(&b[W3], 64 * 32 * 25);
    blob_reshape(&b[B3], 64);
    blob_reshape(&b[W4], 64 * 64 * 4 * 4);
    blob_reshape(&b[B4], 64);
    blob_reshape(&b[W5], 10 * 64);
    blob_reshape(&b[B5], 10);
    /* Filler: parameters are initialised on the CPU, then pushed to the GPU. */
    for (int i = W1; i <= B5; i++) {
        synced_cpu(&b[i].data);
        synced_gpu(&b[i].data);
    }
}

static void net_destroy(Net *n) {
    for (int i = 0; i < NBLOBS; i++)
        blob_reset(&n->b[i]);
}

/* One pass: the prefetched batch (filled on the CPU, pushed to the GPU) feeds the data
 * blobs; every layer touches its tops and internal blobs on the GPU; backward touches the
 * diffs and the parameter gradients; the loss is read on the CPU. */
static void net_step(Net *n, int backward) {
    Blob *b = n->b;
    int pf = n->prefetch_next;
    n->prefetch_next = (pf + 1) % 3;
    Blob *pd = &b[PF_DATA0 + 2 * pf], *pl = &b[PF_LABEL0 + 2 * pf];
    memset(synced_cpu(&pd->data), 1, pd->count * sizeof(float));
    memset(synced_cpu(&pl->data), 0, pl->count * sizeof(float));
    check(cudaMemcpy(synced_gpu(&pd->data), pd->data.cpu, pd->count * sizeof(float),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
    check(cudaMemcpy(synced_gpu(&pl->data), pl->data.cpu, pl->count * sizeof(float),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
    /* Data layer forward: copy the batch into the net's input blobs (device to device). */
    check(cudaMemcpy(synced_gpu(&b[DATA].data), pd->data.gpu, pd->count * sizeof(float),
                     cudaMemcpyDeviceToDevice),
          "cudaMemcpy");
    check(cudaMemcpy(synced_gpu(&b[LABEL].data), pl->data.gpu, pl->count * sizeof(float),
                     cudaMemcpyDeviceToDevice),
          "cudaMemcpy");
    for (int i = CONV1; i <= SCALE; i++)
        synced_gpu(&b[i].data);
    for (int i = W1; i <= B5; i++)
        synced_gpu(&b[i].data);
    synced_cpu(&b[LOSS].data);
    if (backward) {
        for (int i = CONV1; i <= PROB; i++)
            synced_gpu(&b[i].diff);
        for (int i = W1; i <= B5; i++)
            synced_gpu(&b[i].diff);
    }
}

int main(int argc, char **argv) {
    int epochs = argc > 1 ? atoi(argv[1]) : 4;
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    check(cudaSetDevice(0), "cudaSetDevice");
    base_used = used_now();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    static const size_t batches[] = {32, 64, 96, 128, 160, 192, 224, 256};
    for (int e = 0; e < epochs; e++) {
        Net train;
        net_build(&train);
        for (int it = 0; it < iters; it++) {
            size_t N = batches[next_rand() % (sizeof batches / sizeof batches[0])];
            net_reshape(&train, N);
            net_step(&train, 1);
            if ((it + 1) % 5 == 0) {
                Net test;
                net_build(&test);
                net_reshape(&test, 100);
                net_step(&test, 0);
                net_destroy(&test);
            }
        }
        net_destroy(&train);
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("device_mallocs=%llu\ndevice_frees=%llu\nhost_mallocs=%llu\nhost_frees=%llu\n",
           n_dmalloc, n_dfree, n_hmalloc, n_hfree);
    printf("peak_used=%llu\nwall_ms=%.1f\n", peak_used, ms);
    return 0;
}
