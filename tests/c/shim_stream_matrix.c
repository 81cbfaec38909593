/* The stream-safety scenario over kinds of streams. Usage: shim_stream_matrix KIND [N]
 *   nonblocking N  N non-blocking streams; the late write is queued on the last one, the
 *                  block's next owner writes on the first (on the legacy stream if N = 1)
 *   blocking       two blocking streams: late write on one, next owner on the other
 *   newstream      the late write is queued on the legacy stream while no stream exists
 *                  (the free reuses at once); the next owner writes on a non-blocking
 *                  stream created after the reuse
 *   perthread      no stream created: a second thread allocates p and queues the late
 *                  write on its per-thread default stream; the main thread frees p and the
 *                  next owner writes on the main thread's per-thread default stream
 *   ptsz           as perthread, with stream-ordered allocation on the per-thread default
 *                  stream: the second thread allocates p and frees it with
 *                  cudaMallocAsync/cudaFreeAsync on cudaStreamPerThread after queueing the
 *                  late write there; the main thread allocates the next owner the same way
 *                  (each thread's cudaStreamPerThread is its own stream)
 *   exited         the main thread allocates nothing: a thread allocates p, queues the late
 *                  write on its per-thread default stream, frees p and ends; a thread
 *                  created after it (the C library gives it the first one's thread
 *                  pointer) is the next owner, on its own per-thread default stream
 * The late write is a host function that first waits (at most 300 ms) for the main thread's
 * go, then fills p with 0xAA. The main thread gives the go once the next owner's write of
 * 0x55 has completed (or 200 ms passed); with protection the owner's write is ordered after
 * the late write (or the owner got other memory), whatever the timing. With MATRIX_RACE set
 * (the test sets it for free_sync:none, to see the race happen) the main thread synchronizes
 * the owner's stream before the go and the late write waits for the go (60 s at most, a
 * hang detector): the late write lands after the owner's, however slowly threads run. 12 MiB: a segment of exactly the block, so a reused block has the same address.
 * Prints "same_address=0|1" and "intact=0|1". */
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include "shim_util.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int owner_queued = 0;

struct fill { void *p; size_t n; };

static void CUDART_CB late_write(void *arg) {
    struct fill *f = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (getenv("MATRIX_RACE")) until.tv_sec += 60;
    else until.tv_nsec += 300 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000) { until.tv_sec += 1; until.tv_nsec -= 1000000000; }
    pthread_mutex_lock(&mu);
    while (!owner_queued)
        if (pthread_cond_timedwait(&cv, &mu, &until) != 0) break;
    pthread_mutex_unlock(&mu);
    memset(f->p, 0xAA, f->n); /* simcuda's device memory is host memory */
}

static void release_late_write(void) {
    pthread_mutex_lock(&mu);
    owner_queued = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static const size_t size = 12 * MiB;
static struct fill fill;

static void *second_thread(void *arg) {
    (void)arg;
    void *p = NULL;
    CHECK(cudaMalloc(&p, size));
    fill.p = p;
    fill.n = size;
    CHECK(cudaLaunchHostFunc(cudaStreamPerThread, late_write, &fill));
    return NULL;
}

static void *second_thread_async(void *arg) {
    (void)arg;
    void *p = NULL;
    CHECK(cudaMallocAsync(&p, size, cudaStreamPerThread));
    fill.p = p;
    fill.n = size;
    CHECK(cudaLaunchHostFunc(cudaStreamPerThread, late_write, &fill));
    CHECK(cudaFreeAsync(p, cudaStreamPerThread));
    return NULL;
}

static void *q_exited;
static pthread_t tid_first, tid_next;

static void *first_thread(void *arg) {
    (void)arg;
    tid_first = pthread_self();
    second_thread(NULL);
    CHECK(cudaFree(fill.p));
    return NULL;
}

static void owner_writes_then_go(void *q, cudaStream_t owner) {
    CHECK(cudaMemsetAsync(q, 0x55, size, owner));
    if (getenv("MATRIX_RACE"))
        CHECK(cudaStreamSynchronize(owner));
    for (int i = 0; i < 200 && cudaStreamQuery(owner) == cudaErrorNotReady; i++)
        usleep(1000);
    release_late_write();
}

static void *next_thread(void *arg) {
    (void)arg;
    tid_next = pthread_self();
    CHECK(cudaMalloc(&q_exited, size));
    owner_writes_then_go(q_exited, cudaStreamPerThread);
    return NULL;
}

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "nonblocking";
    int n = argc > 2 ? atoi(argv[2]) : 1;
    if (getenv("MATRIX_RACE")) require_cache_for_race();
    if (n < 1 || n > 64) n = 1;
    cudaStream_t streams[64];
    cudaStream_t writer = 0, owner = 0;
    int nstreams = 0;
    if (!strcmp(kind, "nonblocking")) {
        for (int i = 0; i < n; i++)
            CHECK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
        nstreams = n;
        writer = streams[n - 1];
        owner = n > 1 ? streams[0] : 0;
    } else if (!strcmp(kind, "blocking")) {
        for (int i = 0; i < 2; i++)
            CHECK(cudaStreamCreate(&streams[i]));
        nstreams = 2;
        writer = streams[0];
        owner = streams[1];
    } else if (!strcmp(kind, "perthread")) {
        writer = owner = cudaStreamPerThread;
    } else if (!strcmp(kind, "newstream")) {
        writer = 0; /* the owner's stream is created after the reuse, below */
    } else if (!strcmp(kind, "ptsz")) {
        pthread_t t;
        void *q = NULL;
        if (pthread_create(&t, NULL, second_thread_async, NULL) != 0) return 1;
        pthread_join(t, NULL);
        CHECK(cudaMallocAsync(&q, size, cudaStreamPerThread));
        owner_writes_then_go(q, cudaStreamPerThread);
        CHECK(cudaDeviceSynchronize());
        print_reuse_verdict(fill.p, q, size);
        CHECK(cudaFree(q));
        return 0;
    } else if (!strcmp(kind, "exited")) {
        pthread_t t;
        if (pthread_create(&t, NULL, first_thread, NULL) != 0) return 1;
        pthread_join(t, NULL);
        if (pthread_create(&t, NULL, next_thread, NULL) != 0) return 1;
        pthread_join(t, NULL);
        CHECK(cudaDeviceSynchronize());
        printf("same_thread_pointer=%d\n", pthread_equal(tid_first, tid_next) ? 1 : 0);
        print_reuse_verdict(fill.p, q_exited, size);
        CHECK(cudaFree(q_exited));
        return 0;
    } else {
        fprintf(stderr, "unknown kind %s\n", kind);
        return 2;
    }
    void *p = NULL, *q = NULL;
    if (!strcmp(kind, "perthread")) {
        pthread_t t;
        if (pthread_create(&t, NULL, second_thread, NULL) != 0) return 1;
        pthread_join(t, NULL);
        p = fill.p;
    } else {
        CHECK(cudaMalloc(&p, size));
        fill.p = p;
        fill.n = size;
        CHECK(cudaLaunchHostFunc(writer, late_write, &fill));
    }
    CHECK(cudaFree(p));
    CHECK(cudaMalloc(&q, size));
    if (!strcmp(kind, "newstream")) {
        CHECK(cudaStreamCreateWithFlags(&streams[0], cudaStreamNonBlocking));
        nstreams = 1;
        owner = streams[0];
    }
    owner_writes_then_go(q, owner);
    CHECK(cudaDeviceSynchronize());
    print_reuse_verdict(p, q, size);
    CHECK(cudaFree(q));
    for (int i = 0; i < nstreams; i++)
        CHECK(cudaStreamDestroy(streams[i]));
    return 0;
}
