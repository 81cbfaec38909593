/* simcuda stream capture, one case per argv[1]; prints "PASS <case>" on success. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include "sim_check.h"

static int ran;
static void mark(void *p) { (void)p; ran = 1; }

static int other_rc = -1;
static void *other_malloc(void *arg) {
    (void)arg;
    void *p;
    other_rc = (int)cudaMalloc(&p, 256);
    return NULL;
}

static cudaStream_t shared;
static int other_end_rc = -1;
static void *other_end(void *arg) {
    (void)arg;
    cudaGraph_t g;
    other_end_rc = (int)cudaStreamEndCapture(shared, &g);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    cudaStream_t s;
    cudaGraph_t g = (cudaGraph_t)0x1;
    void *p;
    enum cudaStreamCaptureStatus st;
    EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CASE("malloc_in_global_capture_fails_and_invalidates") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        EXPECT(cudaSuccess, cudaStreamIsCapturing(s, &st));
        REQUIRE(st == cudaStreamCaptureStatusActive);
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaMalloc(&p, 256));
        EXPECT(cudaSuccess, cudaStreamIsCapturing(s, &st));
        REQUIRE(st == cudaStreamCaptureStatusInvalidated);
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
        REQUIRE(g == NULL);
        EXPECT(cudaSuccess, cudaStreamIsCapturing(s, &st));
        REQUIRE(st == cudaStreamCaptureStatusNone);
        EXPECT(cudaSuccess, cudaMalloc(&p, 256));
    }
    CASE("driver_alloc_in_global_capture_fails") {
        CUdeviceptr d;
        EXPECT(cudaSuccess, cudaFree(0));
        EXPECT(CUDA_SUCCESS, cuStreamBeginCapture((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        EXPECT(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&d, 256));
        CUgraph cg;
        EXPECT(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture((CUstream)s, &cg));
    }
    CASE("relaxed_thread_mode_allows_malloc") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        EXPECT(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
        REQUIRE(mode == cudaStreamCaptureModeGlobal);
        EXPECT(cudaSuccess, cudaMalloc(&p, 256));
        EXPECT(cudaSuccess, cudaFree(p));
        EXPECT(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
        REQUIRE(mode == cudaStreamCaptureModeRelaxed);
        EXPECT(cudaSuccess, cudaStreamEndCapture(s, &g));
        REQUIRE(g != NULL);
    }
    CASE("event_query_in_global_capture_fails") {
        cudaEvent_t ev;
        EXPECT(cudaSuccess, cudaEventCreate(&ev));
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaEventQuery(ev));
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaEventSynchronize(ev));
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
    }
    CASE("captured_work_does_not_run") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, mark, NULL));
        EXPECT(cudaSuccess, cudaStreamEndCapture(s, &g));
        REQUIRE(g != NULL);
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
        REQUIRE(ran == 0);
    }
    CASE("sync_of_capturing_stream_fails") {
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaStreamSynchronize(s));
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
    }
    CASE("legacy_stream_cannot_capture") {
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal));
        EXPECT(cudaErrorIllegalState, cudaStreamEndCapture(s, &g));
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        EXPECT(cudaErrorIllegalState, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        EXPECT(cudaErrorInvalidValue, cudaStreamIsCapturing(s, NULL));
    }
    CASE("legacy_use_during_blocking_capture_is_implicit_dependency") {
        cudaStream_t b;
        EXPECT(cudaSuccess, cudaStreamCreate(&b));
        EXPECT(cudaSuccess, cudaStreamBeginCapture(b, cudaStreamCaptureModeRelaxed));
        EXPECT(cudaErrorStreamCaptureImplicit, cudaLaunchHostFunc(0, mark, NULL));
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(b, &g));
    }
    CASE("global_capture_blocks_other_threads") {
        pthread_t t;
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        REQUIRE(pthread_create(&t, NULL, other_malloc, NULL) == 0);
        pthread_join(t, NULL);
        REQUIRE(other_rc == cudaErrorStreamCaptureUnsupported);
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
    }
    CASE("thread_local_capture_allows_other_threads") {
        pthread_t t;
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        REQUIRE(pthread_create(&t, NULL, other_malloc, NULL) == 0);
        pthread_join(t, NULL);
        REQUIRE(other_rc == cudaSuccess);
        EXPECT(cudaErrorStreamCaptureUnsupported, cudaMalloc(&p, 256));
        EXPECT(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
    }
    CASE("end_capture_from_another_thread_is_wrong_thread") {
        pthread_t t;
        shared = s;
        EXPECT(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        REQUIRE(pthread_create(&t, NULL, other_end, NULL) == 0);
        pthread_join(t, NULL);
        REQUIRE(other_end_rc == cudaErrorStreamCaptureWrongThread);
        EXPECT(cudaSuccess, cudaStreamEndCapture(s, &g));
    }
    PASS_CASE();
    return 0;
}
