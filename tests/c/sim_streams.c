/* simcuda stream, event and host-function behaviours, one case per argv[1]; prints
 * "PASS <case>" on success. A "slow kernel" is a host function that sleeps, then writes: the
 * cases that check something WAITED for it pass whatever the timing (the sleep only makes a
 * missing wait likely to show). A case that checks something did NOT wait holds its stream
 * with `held_set` (sim_gate.h) and opens the gate after the check, so no timing is assumed. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>
#include "sim_check.h"
#include "sim_gate.h"

static volatile int flag;
static void slow_set(void *p) { usleep(300 * 1000); *(volatile int *)p = 1; }
/* Held until the gate opens, then 300 ms of stream time: event timing has a lower bound. */
static void held_slow_set(void *p) { gate_wait(); slow_set(p); }
static void read_flag(void *p) { *(int *)p = flag; }

static int order[16];
static int order_n;
static void push(void *p) { order[order_n++] = (int)(size_t)p; }

static cudaStream_t pt_stream_result;
static void *ptds_thread(void *arg) {
    (void)arg;
    cudaEvent_t ev;
    EXPECT(cudaSuccess, cudaEventCreate(&ev));
    EXPECT(cudaSuccess, cudaEventRecord(ev, cudaStreamPerThread));
    EXPECT(cudaSuccess, cudaEventSynchronize(ev));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    cudaStream_t s;
    cudaEvent_t ev;
    int seen = -1;
    CASE("legacy_does_not_wait_for_non_blocking") {
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, held_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(0, read_flag, &seen));
        EXPECT(cudaSuccess, cudaEventCreate(&ev));
        EXPECT(cudaSuccess, cudaEventRecord(ev, 0));
        EXPECT(cudaSuccess, cudaEventSynchronize(ev));
        REQUIRE(flag == 0 && seen == 0);
        gate_open();
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
        REQUIRE(flag == 1);
    }
    CASE("legacy_waits_for_blocking") {
        EXPECT(cudaSuccess, cudaStreamCreate(&s));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, slow_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(0, read_flag, &seen));
        EXPECT(cudaSuccess, cudaEventCreate(&ev));
        EXPECT(cudaSuccess, cudaEventRecord(ev, 0));
        EXPECT(cudaSuccess, cudaEventSynchronize(ev));
        REQUIRE(flag == 1 && seen == 1);
    }
    CASE("blocking_stream_waits_for_legacy") {
        EXPECT(cudaSuccess, cudaStreamCreate(&s));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(0, slow_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, read_flag, &seen));
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
        REQUIRE(seen == 1);
    }
    CASE("non_blocking_stream_does_not_wait_for_legacy") {
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(0, held_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, read_flag, &seen));
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
        REQUIRE(seen == 0);
        gate_open();
        EXPECT(cudaSuccess, cudaDeviceSynchronize());
        REQUIRE(flag == 1);
    }
    CASE("per_thread_stream_syncs_with_legacy_only") {
        EXPECT(cudaSuccess, cudaStreamCreate(&s));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, held_set, (void *)&flag));
        /* another thread's per-thread stream does not wait for a blocking user stream */
        pthread_t t;
        REQUIRE(pthread_create(&t, NULL, ptds_thread, NULL) == 0);
        pthread_join(t, NULL);
        REQUIRE(flag == 0);
        gate_open();
        EXPECT(cudaSuccess, cudaDeviceSynchronize());
        flag = 0;
        /* but it does wait for the legacy stream */
        EXPECT(cudaSuccess, cudaLaunchHostFunc(0, slow_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(cudaStreamPerThread, read_flag, &seen));
        EXPECT(cudaSuccess, cudaStreamSynchronize(cudaStreamPerThread));
        REQUIRE(seen == 1);
        (void)pt_stream_result;
    }
    CASE("event_readiness") {
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaEventCreate(&ev));
        EXPECT(cudaSuccess, cudaEventQuery(ev)); /* never recorded: complete */
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, held_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaEventRecord(ev, s));
        EXPECT(cudaErrorNotReady, cudaEventQuery(ev));
        EXPECT(cudaErrorNotReady, cudaStreamQuery(s));
        gate_open();
        EXPECT(cudaSuccess, cudaEventSynchronize(ev));
        REQUIRE(flag == 1);
        EXPECT(cudaSuccess, cudaEventQuery(ev));
        EXPECT(cudaSuccess, cudaStreamQuery(s));
        EXPECT(cudaSuccess, cudaEventDestroy(ev));
        EXPECT(cudaErrorInvalidResourceHandle, cudaEventDestroy(ev));
        EXPECT(cudaErrorInvalidValue, cudaEventCreateWithFlags(&ev, 0x100));
    }
    CASE("work_runs_in_stream_order") {
        EXPECT(cudaSuccess, cudaStreamCreate(&s));
        int *h;
        void *dbuf;
        EXPECT(cudaSuccess, cudaMallocHost((void **)&h, 4096));
        EXPECT(cudaSuccess, cudaMalloc(&dbuf, 4096));
        for (int i = 0; i < 1024; i++) h[i] = i;
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, push, (void *)1));
        EXPECT(cudaSuccess, cudaMemcpyAsync(dbuf, h, 4096, cudaMemcpyHostToDevice, s));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, push, (void *)2));
        EXPECT(cudaSuccess, cudaMemsetAsync(dbuf, 0, 2048, s));
        EXPECT(cudaSuccess, cudaMemcpyAsync(h, dbuf, 4096, cudaMemcpyDeviceToHost, s));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, push, (void *)3));
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
        REQUIRE(order_n == 3 && order[0] == 1 && order[1] == 2 && order[2] == 3);
        REQUIRE(h[0] == 0 && h[511] == 0 && h[512] == 512 && h[1023] == 1023);
    }
    CASE("free_synchronizes_the_device") {
        void *a, *b;
        EXPECT(cudaSuccess, cudaMalloc(&a, 256));
        EXPECT(cudaSuccess, cudaMalloc(&b, 256));
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, slow_set, a));
        EXPECT(cudaSuccess, cudaFree(b));
        REQUIRE(*(volatile int *)a == 1);
    }
    CASE("device_synchronize_waits_for_all_streams") {
        cudaStream_t t;
        static int f2;
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaStreamCreate(&t));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, slow_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(t, slow_set, &f2));
        EXPECT(cudaSuccess, cudaDeviceSynchronize());
        REQUIRE(flag == 1 && f2 == 1);
    }
    CASE("stream_wait_event_orders_streams") {
        cudaStream_t t;
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaEventCreate(&ev));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, slow_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaEventRecord(ev, s));
        EXPECT(cudaSuccess, cudaStreamWaitEvent(t, ev, 0));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(t, read_flag, &seen));
        EXPECT(cudaSuccess, cudaStreamSynchronize(t));
        REQUIRE(seen == 1);
    }
    CASE("bad_stream_handles") {
        EXPECT(cudaErrorInvalidResourceHandle, cudaStreamDestroy((cudaStream_t)0x4321));
        EXPECT(cudaSuccess, cudaStreamCreate(&s));
        EXPECT(cudaSuccess, cudaStreamDestroy(s));
        EXPECT(cudaErrorInvalidResourceHandle, cudaStreamDestroy(s));
        EXPECT(cudaErrorInvalidResourceHandle, cudaStreamSynchronize(s));
        EXPECT(cudaErrorInvalidValue, cudaStreamCreateWithFlags(&s, 0x10));
        EXPECT(cudaErrorInvalidValue, cudaLaunchHostFunc(0, NULL, NULL));
    }
    CASE("destroyed_stream_finishes_its_work") {
        EXPECT(cudaSuccess, cudaStreamCreate(&s));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, slow_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaStreamDestroy(s));
        EXPECT(cudaSuccess, cudaDeviceSynchronize());
        REQUIRE(flag == 1);
    }
    CASE("driver_streams_and_host_funcs") {
        CUcontext ctx;
        CUstream cs;
        CUevent ce;
        EXPECT(CUDA_SUCCESS, cuInit(0));
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, 0));
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(ctx));
        EXPECT(CUDA_SUCCESS, cuStreamCreateWithPriority(&cs, CU_STREAM_NON_BLOCKING, -1));
        EXPECT(CUDA_SUCCESS, cuEventCreate(&ce, CU_EVENT_DISABLE_TIMING));
        EXPECT(CUDA_SUCCESS, cuLaunchHostFunc(cs, held_set, (void *)&flag));
        EXPECT(CUDA_SUCCESS, cuEventRecord(ce, cs));
        EXPECT(CUDA_ERROR_NOT_READY, cuEventQuery(ce));
        EXPECT(CUDA_ERROR_NOT_READY, cuStreamQuery(cs));
        gate_open();
        EXPECT(CUDA_SUCCESS, cuStreamSynchronize(cs));
        REQUIRE(flag == 1);
        EXPECT(CUDA_SUCCESS, cuEventQuery(ce));
        EXPECT(CUDA_SUCCESS, cuEventDestroy(ce));
        EXPECT(CUDA_SUCCESS, cuStreamDestroy(cs));
        EXPECT(CUDA_ERROR_INVALID_HANDLE, cuStreamDestroy(cs));
    }
    CASE("malloc_async_free_async_in_stream_order") {
        void *p;
        size_t f0, f, t;
        EXPECT(cudaSuccess, cudaMemGetInfo(&f0, &t));
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaMallocAsync(&p, 1 << 20, s));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(s, held_set, p));
        EXPECT(cudaSuccess, cudaFreeAsync(p, s));
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(f == f0 - (1 << 20)); /* not yet freed: the stream has not got there */
        gate_open();
        EXPECT(cudaSuccess, cudaStreamSynchronize(s));
        EXPECT(cudaSuccess, cudaMemGetInfo(&f, &t));
        REQUIRE(f == f0);
        EXPECT(cudaErrorInvalidValue, cudaFreeAsync((void *)0x999, s));
    }
    CASE("driver_async_copies_timing_and_context_stack") {
        CUcontext ctx, popped = NULL;
        CUstream cs;
        CUevent a, b;
        CUdeviceptr d, e2;
        unsigned int host[64], *back;
        for (int i = 0; i < 64; i++) host[i] = (unsigned)i * 3u;
        EXPECT(CUDA_SUCCESS, cuInit(0));
        EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&ctx, 0));
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuCtxPopCurrent(&popped));
        EXPECT(CUDA_SUCCESS, cuCtxPushCurrent(ctx));
        int least = 1, greatest = 1, prio = 1;
        EXPECT(CUDA_SUCCESS, cuCtxGetStreamPriorityRange(&least, &greatest));
        REQUIRE(least == 0 && greatest < 0);
        EXPECT(CUDA_SUCCESS, cuStreamCreateWithPriority(&cs, CU_STREAM_NON_BLOCKING, greatest));
        unsigned int fl = 7;
        EXPECT(CUDA_SUCCESS, cuStreamGetPriority(cs, &prio));
        EXPECT(CUDA_SUCCESS, cuStreamGetFlags(cs, &fl));
        REQUIRE(prio == greatest && fl == CU_STREAM_NON_BLOCKING);
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&d, sizeof host));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&e2, sizeof host));
        /* pinned: a copy into pageable memory would return only once done (CUDA's rule) */
        EXPECT(CUDA_SUCCESS, cuMemAllocHost((void **)&back, sizeof host));
        EXPECT(CUDA_SUCCESS, cuEventCreate(&a, CU_EVENT_DEFAULT));
        EXPECT(CUDA_SUCCESS, cuEventCreate(&b, CU_EVENT_DEFAULT));
        EXPECT(CUDA_SUCCESS, cuEventRecord(a, cs));
        EXPECT(CUDA_SUCCESS, cuLaunchHostFunc(cs, held_slow_set, (void *)&flag));
        EXPECT(CUDA_SUCCESS, cuMemcpyHtoDAsync(d, host, sizeof host, cs));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoDAsync(e2, d, sizeof host, cs));
        EXPECT(CUDA_SUCCESS, cuMemsetD32Async(d, 0xdeadbeef, 64, cs));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoHAsync(back, e2, sizeof host, cs));
        EXPECT(CUDA_SUCCESS, cuEventRecord(b, cs));
        float ms = -1;
        EXPECT(CUDA_ERROR_NOT_READY, cuEventElapsedTime(&ms, a, b));
        gate_open();
        EXPECT(CUDA_SUCCESS, cuEventSynchronize(b));
        EXPECT(CUDA_SUCCESS, cuEventElapsedTime(&ms, a, b));
        /* At least the 300 ms sleep; in milliseconds (microseconds would read >= 300000):
         * the upper bound only catches a unit error, never a slow machine. */
        REQUIRE(ms >= 250.0f && ms < 100000.0f);
        REQUIRE(memcmp(back, host, sizeof host) == 0);
        REQUIRE(((unsigned int *)d)[63] == 0xdeadbeef);
        EXPECT(CUDA_SUCCESS, cuMemsetD32(e2, 5, 64));
        REQUIRE(((unsigned int *)e2)[0] == 5);
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemsetD32(e2 + 1, 5, 4));
        void *pinned;
        CUdeviceptr mapped;
        EXPECT(CUDA_SUCCESS, cuMemHostAlloc(&pinned, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
        EXPECT(CUDA_SUCCESS, cuMemHostGetDevicePointer(&mapped, pinned, 0));
        REQUIRE((void *)mapped == pinned);
        EXPECT(CUDA_SUCCESS, cuCtxPopCurrent(&popped));
        REQUIRE(popped == ctx);
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&d, 16));
    }
    CASE("runtime_event_elapsed_time") {
        cudaEvent_t a, b, nt;
        float ms = -1;
        EXPECT(cudaSuccess, cudaEventCreate(&a));
        EXPECT(cudaSuccess, cudaEventCreate(&b));
        EXPECT(cudaSuccess, cudaEventCreateWithFlags(&nt, cudaEventDisableTiming));
        EXPECT(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, a, b));
        EXPECT(cudaSuccess, cudaEventRecord(a, 0));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(0, slow_set, (void *)&flag));
        EXPECT(cudaSuccess, cudaEventRecord(b, 0));
        EXPECT(cudaSuccess, cudaEventRecord(nt, 0));
        EXPECT(cudaSuccess, cudaEventSynchronize(b));
        EXPECT(cudaSuccess, cudaEventElapsedTime(&ms, a, b));
        REQUIRE(ms >= 250.0f);
        EXPECT(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, a, nt));
        int least, greatest;
        EXPECT(cudaSuccess, cudaDeviceGetStreamPriorityRange(&least, &greatest));
        REQUIRE(least == 0 && greatest == -5);
    }
    PASS_CASE();
    return 0;
}
