/* Allocation under stream capture, one case per argv[1]; prints "PASS <case>". Each case
 * expects exactly what CUDA documents, so it passes with and without the shim. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include "sim_check.h"

#define MiB (1024ull * 1024ull)

static int other_rc = -1;
static void *other_malloc(void *arg) {
    (void)arg;
    void *p = NULL;
    other_rc = (int)cudaMalloc(&p, 1 << 20);
    if (other_rc == 0) cudaFree(p);
    return NULL;
}

/* Give every cached byte back to the device when a cache is in the process, so that a
 * block it handed to the capture would come back from the device at its old address. */
static void empty_cache(void) {
    int (*fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "cushim_empty_cache");
    if (fn) fn();
}

/* The allocations the shim counted (its statistics' allocation.all.allocated), or -1 when
 * no shim answers: under the shim, the codes the cases expect came from the cache's path. */
static long long shim_allocations(void) {
    static char buf[1 << 16];
    int (*fn)(char *, size_t) =
        (int (*)(char *, size_t))dlsym(RTLD_DEFAULT, "cushim_memory_stats_json");
    if (!fn || fn(buf, sizeof buf) < 0) return -1;
    const char *key = "\"allocation.all.allocated\":";
    const char *at = strstr(buf, key);
    return at ? atoll(at + strlen(key)) : -1;
}

static void in_other_thread(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, other_malloc, NULL) != 0) exit(1);
    pthread_join(t, NULL);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    cudaStream_t s;
    cudaGraph_t g = (cudaGraph_t)0x1;
    void *p = NULL, *q = NULL;
    EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    EXPECT(cudaSuccess, cudaMalloc(&q, 2 * MiB)); /* context, and a cached segment */
    EXPECT(cudaSuccess, cudaFree(q));
    CASE("malloc_in_global_capture") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaMalloc(&p, 1 * MiB));
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
        REQUIRE(g == NULL);
        EXPECT(cudaSuccess, cudaMalloc(&p, 1 * MiB));
        EXPECT(cudaSuccess, cudaFree(p));
    }
    CASE("malloc_in_thread_local_capture") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaMalloc(&p, 1 * MiB));
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
    }
    CASE("free_in_global_capture") {
        EXPECT(cudaSuccess, cudaMalloc(&p, 1 * MiB));
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaFree(p));
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
        EXPECT(cudaSuccess, cudaFree(p)); /* the refused free left it allocated */
    }
    CASE("free_in_thread_local_capture") {
        EXPECT(cudaSuccess, cudaMalloc(&p, 1 * MiB));
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaFree(p));
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
        EXPECT(cudaSuccess, cudaFree(p));
    }
    CASE("relaxed_thread_mode_allows_malloc_and_free") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        EXPECT(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
        EXPECT(cudaSuccess, cudaMalloc(&p, 1 * MiB));
        EXPECT(cudaSuccess, cudaFree(p));
        EXPECT(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
        EXPECT(cudaSuccess, cudaStreamEndCapture(s, &g));
        REQUIRE(g != NULL);
    }
    CASE("global_capture_forbids_other_threads") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        in_other_thread();
        EXPECT(cudaErrorStreamCaptureUnsupported, other_rc);
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
    }
    CASE("thread_local_capture_allows_other_threads") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        in_other_thread();
        EXPECT(cudaSuccess, other_rc);
        EXPECT(cudaSuccess, cudaStreamEndCapture(s, &g));
        REQUIRE(g != NULL);
    }
    CASE("driver_alloc_and_free_in_global_capture") {
        CUdeviceptr d = 0, e = 0;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&e, 1 * MiB));
        EXPECT(CUDA_SUCCESS, cuStreamBeginCapture((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        EXPECT(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&d, 1 * MiB));
        CUgraph cg;
        EXPECT(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture((CUstream)s, &cg));
        EXPECT(CUDA_SUCCESS, cuStreamBeginCapture((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        EXPECT(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemFree(e));
        EXPECT(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture((CUstream)s, &cg));
        EXPECT(CUDA_SUCCESS, cuMemFree(e));
    }
    CASE("capture_allocation_is_never_handed_out_again") {
        /* An allocation made by a capture belongs to the graph: no ordinary allocation may
         * receive its address while the graph exists (here: for the whole program). */
        void *in_graph[4];
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < 4; i++)
            EXPECT(cudaSuccess, cudaMallocAsync(&in_graph[i], (i + 1) * 512 * 1024, s));
        for (int i = 0; i < 4; i++)
            EXPECT(cudaSuccess, cudaFreeAsync(in_graph[i], s));
        EXPECT(cudaSuccess, cudaStreamEndCapture(s, &g));
        REQUIRE(g != NULL);
        for (int i = 0; i < 4; i++) {
            void *x = NULL;
            EXPECT(cudaSuccess, cudaMallocAsync(&x, (i + 1) * 512 * 1024, s));
            for (int j = 0; j < 4; j++)
                REQUIRE(x != in_graph[j]);
            EXPECT(cudaSuccess, cudaFreeAsync(x, s));
        }
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
        for (int round = 0; round < 16; round++) {
            void *mine[8];
            empty_cache();
            for (int k = 0; k < 8; k++) {
                EXPECT(cudaSuccess, cudaMalloc(&mine[k], (k + 1) * 512 * 1024));
                for (int i = 0; i < 4; i++)
                    REQUIRE(mine[k] != in_graph[i]);
            }
            for (int k = 0; k < 8; k++)
                EXPECT(cudaSuccess, cudaFree(mine[k]));
        }
    }
    CASE("free_async_on_a_destroyed_stream_fails") {
        cudaStream_t s2;
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaMallocAsync(&p, 1 * MiB, s2));
        EXPECT(cudaSuccess, cudaStreamSynchronize(s2));
        EXPECT(cudaSuccess, cudaStreamDestroy(s2));
        EXPECT(cudaErrorInvalidResourceHandle, cudaFreeAsync(p, s2));
        void *r = NULL;
        EXPECT(cudaErrorInvalidResourceHandle, cudaMallocAsync(&r, 1 * MiB, s2));
        EXPECT(cudaSuccess, cudaFreeAsync(p, s)); /* still allocated: free it properly */
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
    }
    CASES_END();
    printf("shim_allocations=%lld\n", shim_allocations());
    PASS_CASE();
    return 0;
}
