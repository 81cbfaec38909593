/* NVTX v3 ranges around allocations: nested pushes on two threads, a domain with a registered
 * string and a named category, a start/end range, and a thread that names itself. Each
 * allocation's size names the range it is made in, so a test can match trace entries to
 * ranges:
 *   main:   "step" (1 MiB), "step/forward" (2 MiB), "step/forward/layer" (3 MiB),
 *           "step/mem:phase [io]" (4 MiB, domain "mem", registered string "phase", the
 *           domain's category 7 named "io"), "step/request" (5 MiB, start/end), after all
 *           ranges (6 MiB);
 *   worker, named "loader": "[loader]/worker" (7 MiB), "[loader]/worker/backward" (8 MiB).
 * The allocations of "step/forward/layer" and "worker/backward" are freed inside their ranges;
 * the others are freed at the end, after every range closed. */
#include "shim_util.h"
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

static void *alloc(size_t mib) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, mib * MiB));
    return p;
}

static void *worker(void *arg) {
    (void)arg;
    nvtxNameOsThreadA((uint32_t)syscall(SYS_gettid), "loader");
    nvtxRangePushA("worker");
    void *a = alloc(7);
    nvtxRangePushA("backward");
    CHECK(cudaFree(alloc(8)));
    nvtxRangePop();
    nvtxRangePop();
    return a;
}

int main(void) {
    void *keep[8];
    int n = 0;
    nvtxDomainHandle_t dom = nvtxDomainCreateA("mem");
    nvtxStringHandle_t phase = nvtxDomainRegisterStringA(dom, "phase");
    nvtxDomainNameCategoryA(dom, 7, "io");

    if (nvtxRangePushA("step") != 0) {
        /* Without an injection NVTX returns -1 (a "no tool" signal); with one, level 0. */
        fprintf(stderr, "nvtxRangePushA returned no level: no injection library attached\n");
    }
    keep[n++] = alloc(1);
    nvtxRangePushA("forward");
    keep[n++] = alloc(2);
    nvtxRangePushA("layer");
    CHECK(cudaFree(alloc(3)));
    nvtxRangePop();
    nvtxRangePop();

    nvtxEventAttributes_t attr;
    memset(&attr, 0, sizeof attr);
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.category = 7;
    attr.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    attr.message.registered = phase;
    nvtxDomainRangePushEx(dom, &attr);
    keep[n++] = alloc(4);
    nvtxDomainRangePop(dom);

    nvtxRangeId_t req = nvtxRangeStartA("request");
    keep[n++] = alloc(5);
    nvtxRangeEnd(req);

    pthread_t t;
    void *w = NULL;
    if (pthread_create(&t, NULL, worker, NULL) != 0 || pthread_join(t, &w) != 0) {
        fprintf(stderr, "pthread failed\n");
        return 1;
    }
    keep[n++] = w;
    nvtxRangePop();

    keep[n++] = alloc(6);
    for (int i = 0; i < n; i++)
        CHECK(cudaFree(keep[i]));
    printf("ok\n");
    return 0;
}
