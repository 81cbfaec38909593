/* Threads allocating through the driver API, the program linked with -lcuda (its driver
 * calls bound by the dynamic linker, never looked up). Usage: shim_threads_driver KIND
 *   legacy  the main thread, then a second thread (the first still alive, so the shim sees
 *           two), each: 50 x (cuMemAlloc 1 MiB, cuMemsetD8Async on stream 0, cuMemFree)
 *   handle  the same with the memsets on CU_STREAM_PER_THREAD
 *   dlsym   as handle, with cuMemsetD8Async looked up with dlsym on a libcuda.so.1 handle
 * Prints the shim's device allocations and allocations served. */
#include <pthread.h>
#include "driver_util.h"

static CUstream stream;
typedef CUresult (*memset_fn)(CUdeviceptr, unsigned char, size_t, CUstream);
static memset_fn memset_async;

static void *work(void *arg) {
    (void)arg;
    DCHECK(cuCtxSetCurrent(driver_ctx));
    for (int i = 0; i < 50; i++) {
        CUdeviceptr p = 0;
        DCHECK(cuMemAlloc(&p, MiB));
        DCHECK(memset_async(p, (unsigned char)i, MiB, stream));
        DCHECK(cuMemFree(p));
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "legacy";
    driver_init();
    stream = strcmp(kind, "legacy") == 0 ? 0 : CU_STREAM_PER_THREAD;
    memset_async = cuMemsetD8Async;
    if (strcmp(kind, "dlsym") == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        memset_async = h ? (memset_fn)dlsym(h, "cuMemsetD8Async") : NULL;
        if (!memset_async)
            return 3;
    }
    work(NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, work, NULL) != 0)
        return 2;
    pthread_join(th, NULL);
    DCHECK(cuCtxSynchronize());
    printf("device_allocs=%lld\n", shim_stat("num_device_alloc"));
    printf("shim_allocations=%lld\n", shim_stat("allocation.all.allocated"));
    return 0;
}
