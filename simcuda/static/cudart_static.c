/* cudart_static: a stand-in for NVIDIA's static CUDA runtime (libcudart_static.a), linked
 * into test programs in place of -lcudart.
 *
 * Invariant: this code reaches the driver exactly as NVIDIA's static runtime does and in no
 * other way: dlopen("libcuda.so.1"), dlsym(handle, "cuGetProcAddress_v2") (or the older
 * "cuGetProcAddress"), then cuGetProcAddress for every other entry point by base name and
 * the CUDA version that introduced the ABI used here (the versions NVIDIA's runtime 12.9
 * asks for), with flag 2 for the per-thread-default-stream variants. It never links
 * libcuda or libcudart, so `ldd` of a program built with it shows neither, and an
 * LD_PRELOAD library can only see its allocations at the driver layer.
 *
 * Runtime semantics kept: lazy initialisation on the first call, the device's primary
 * context made current on each calling thread, cudaMalloc(&p, 0) succeeds with p = NULL
 * without a driver call, cudaFree(NULL) only initialises, a sticky per-thread last error
 * (cudaGetLastError returns and clears it). Driver result codes are returned as runtime
 * codes of the same number (true for every code this subset can produce). Implemented: what
 * the seed programs and examples/demo.c call (allocation, streams, copies, sets, host
 * functions, errors). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t,
                             CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);

/* The driver entry points, as the runtime holds them. */
static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamCreateWithPriority)(CUstream *, unsigned int, int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
} drv;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cudaError_t init_error = cudaSuccess;
static gpa_v2_t gpa_v2;
static gpa_v1_t gpa_v1;
static int device_count;
static CUcontext primary[64];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

static __thread int cur_dev;
static __thread CUcontext cur_ctx;
static __thread cudaError_t last_error;

static int verbose(void) {
    const char *v = getenv("CUDART_STATIC_LOG");
    return v && *v && strcmp(v, "0") != 0;
}

/* One entry point by base name, version and flags, through cuGetProcAddress. */
static void *entry(const char *name, int version, cuuint64_t flags) {
    void *fn = NULL;
    CUresult r;
    if (gpa_v2) {
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        r = gpa_v2(name, &fn, version, flags, &st);
    } else {
        r = gpa_v1(name, &fn, version, flags);
    }
    if (verbose())
        fprintf(stderr, "cudart_static: %s %d %llu -> %d %p\n", name, version,
                (unsigned long long)flags, (int)r, fn);
    return r == CUDA_SUCCESS ? fn : NULL;
}

#define GET(field, name, version, flags)                                                  \
    do {                                                                                  \
        *(void **)&drv.field = entry(name, version, flags);                               \
        if (!drv.field)                                                                   \
            missing = name;                                                               \
    } while (0)

static void load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        init_error = 35; /* cudaErrorInsufficientDriver */
        return;
    }
    *(void **)&gpa_v2 = dlsym(h, "cuGetProcAddress_v2");
    if (!gpa_v2)
        *(void **)&gpa_v1 = dlsym(h, "cuGetProcAddress");
    if (!gpa_v2 && !gpa_v1) {
        init_error = 35;
        return;
    }
    /* Like NVIDIA's runtime, fetch cuGetProcAddress itself through cuGetProcAddress and use
     * what it returns from then on. */
    void *again = entry("cuGetProcAddress", 12000, 0);
    if (again)
        *(void **)&gpa_v2 = again;
    const char *missing = NULL;
    GET(Init, "cuInit", 2000, 0);
    GET(DeviceGet, "cuDeviceGet", 2000, 0);
    GET(DeviceGetCount, "cuDeviceGetCount", 2000, 0);
    GET(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0);
    GET(CtxSetCurrent, "cuCtxSetCurrent", 4000, 0);
    GET(CtxGetCurrent, "cuCtxGetCurrent", 4000, 0);
    GET(CtxSynchronize, "cuCtxSynchronize", 2000, 0);
    GET(MemGetInfo, "cuMemGetInfo", 3020, 0);
    GET(MemAlloc, "cuMemAlloc", 3020, 0);
    GET(MemFree, "cuMemFree", 3020, 0);
    GET(MemFreeHost, "cuMemFreeHost", 2000, 0);
    GET(MemHostAlloc, "cuMemHostAlloc", 2020, 0);
    GET(MemAllocAsync, "cuMemAllocAsync", 11020, 0);
    GET(MemAllocAsync_ptsz, "cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(MemFreeAsync, "cuMemFreeAsync", 11020, 0);
    GET(MemFreeAsync_ptsz, "cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    GET(MemcpyHtoD, "cuMemcpyHtoD", 3020, 0);
    GET(MemcpyDtoH, "cuMemcpyDtoH", 3020, 0);
    GET(MemcpyDtoD, "cuMemcpyDtoD", 3020, 0);
    GET(MemsetD8, "cuMemsetD8", 3020, 0);
    GET(StreamCreate, "cuStreamCreate", 2000, 0);
    GET(StreamCreateWithPriority, "cuStreamCreateWithPriority", 5050, 0);
    GET(StreamDestroy, "cuStreamDestroy", 4000, 0);
    GET(StreamSynchronize, "cuStreamSynchronize", 2000, 0);
    GET(LaunchHostFunc, "cuLaunchHostFunc", 10000, 0);
    if (missing) {
        fprintf(stderr, "cudart_static: the driver has no %s\n", missing);
        init_error = 35;
        return;
    }
    if (drv.Init(0) != CUDA_SUCCESS || drv.DeviceGetCount(&device_count) != CUDA_SUCCESS) {
        init_error = cudaErrorInitializationError;
        return;
    }
    if (device_count <= 0)
        init_error = cudaErrorNoDevice;
    if (device_count > 64)
        device_count = 64;
}

static cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

static cudaError_t rt(CUresult r) { return fail((cudaError_t)r); }

/* Initialise once per process, then make the thread's device's primary context current. */
static cudaError_t ready(void) {
    pthread_once(&once, load);
    if (init_error != cudaSuccess)
        return fail(init_error);
    if (cur_ctx)
        return cudaSuccess;
    pthread_mutex_lock(&primary_lock);
    CUresult r = CUDA_SUCCESS;
    if (!primary[cur_dev]) {
        CUdevice d;
        r = drv.DeviceGet(&d, cur_dev);
        if (r == CUDA_SUCCESS)
            r = drv.PrimaryCtxRetain(&primary[cur_dev], d);
    }
    CUcontext ctx = primary[cur_dev];
    pthread_mutex_unlock(&primary_lock);
    if (r == CUDA_SUCCESS)
        r = drv.CtxSetCurrent(ctx);
    if (r != CUDA_SUCCESS)
        return rt(r);
    cur_ctx = ctx;
    return cudaSuccess;
}

#define READY()                                                                           \
    do {                                                                                  \
        cudaError_t e_ = ready();                                                         \
        if (e_ != cudaSuccess)                                                            \
            return e_;                                                                    \
    } while (0)

cudaError_t cudaGetDeviceCount(int *count) {
    READY();
    if (!count)
        return fail(cudaErrorInvalidValue);
    *count = device_count;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    pthread_once(&once, load);
    if (init_error != cudaSuccess)
        return fail(init_error);
    if (device < 0 || device >= device_count)
        return fail(cudaErrorInvalidDevice);
    if (device != cur_dev) {
        cur_dev = device;
        cur_ctx = NULL;
    }
    return ready();
}

cudaError_t cudaGetDevice(int *device) {
    if (!device)
        return fail(cudaErrorInvalidValue);
    *device = cur_dev;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    READY();
    if (devPtr && size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    CUresult r = drv.MemAlloc(devPtr ? &p : NULL, size);
    if (devPtr)
        *devPtr = (void *)(size_t)p;
    return rt(r);
}

cudaError_t cudaFree(void *devPtr) {
    READY();
    if (!devPtr)
        return cudaSuccess;
    return rt(drv.MemFree((CUdeviceptr)(size_t)devPtr));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    READY();
    return rt(drv.MemHostAlloc(pHost, size, flags));
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void *ptr) {
    READY();
    return rt(drv.MemFreeHost(ptr));
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
    READY();
    if (devPtr && size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    CUresult r = drv.MemAllocAsync(devPtr ? &p : NULL, size, (CUstream)stream);
    if (devPtr)
        *devPtr = (void *)(size_t)p;
    return rt(r);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
    READY();
    return rt(drv.MemFreeAsync((CUdeviceptr)(size_t)devPtr, (CUstream)stream));
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    READY();
    return rt(drv.MemGetInfo(free_b, total_b));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    READY();
    return rt(drv.StreamCreate((CUstream *)pStream, flags));
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                         int priority) {
    READY();
    return rt(drv.StreamCreateWithPriority((CUstream *)pStream, flags, priority));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    READY();
    return rt(drv.StreamDestroy((CUstream)stream));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    READY();
    return rt(drv.StreamSynchronize((CUstream)stream));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
    READY();
    return rt(drv.LaunchHostFunc((CUstream)stream, (CUhostFn)fn, userData));
}

cudaError_t cudaDeviceSynchronize(void) {
    READY();
    return rt(drv.CtxSynchronize());
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    READY();
    switch (kind) {
    case cudaMemcpyHostToHost:
        memmove(dst, src, count);
        return cudaSuccess;
    case cudaMemcpyHostToDevice:
        return rt(drv.MemcpyHtoD((CUdeviceptr)(size_t)dst, src, count));
    case cudaMemcpyDeviceToHost:
        return rt(drv.MemcpyDtoH(dst, (CUdeviceptr)(size_t)src, count));
    case cudaMemcpyDeviceToDevice:
        return rt(drv.MemcpyDtoD((CUdeviceptr)(size_t)dst, (CUdeviceptr)(size_t)src, count));
    default:
        return fail(cudaErrorInvalidMemcpyDirection);
    }
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    READY();
    return rt(drv.MemsetD8((CUdeviceptr)(size_t)devPtr, (unsigned char)value, count));
}

/* Async copies and sets: simcuda's driver table has no async copy entry points, but its
 * device memory is host memory, so a host function queued on the stream does the work in
 * stream order, after the work queued before it, while the caller goes on (a host-to-device
 * source is staged first, as CUDA stages pageable memory). Simcuda-specific by design. */
struct job {
    void *dst;
    const void *src; /* NULL: set dst to value */
    int value;
    size_t n;
    unsigned char staged[];
};

static void run_job(void *arg) {
    struct job *j = arg;
    if (j->src)
        memmove(j->dst, j->src, j->n);
    else
        memset(j->dst, j->value, j->n);
    free(j);
}

static cudaError_t enqueue(cudaStream_t stream, void *dst, const void *src, int value, size_t n,
                           int stage) {
    struct job *j = malloc(sizeof *j + (stage ? n : 0));
    if (!j)
        return fail(cudaErrorMemoryAllocation);
    j->dst = dst;
    j->value = value;
    j->n = n;
    j->src = src;
    if (stage) {
        memcpy(j->staged, src, n);
        j->src = j->staged;
    }
    CUresult r = drv.LaunchHostFunc((CUstream)stream, run_job, j);
    if (r != CUDA_SUCCESS)
        free(j);
    return rt(r);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    READY();
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
        return fail(cudaErrorInvalidMemcpyDirection);
    return enqueue(stream, dst, src, 0, count, kind == cudaMemcpyHostToDevice);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    READY();
    return enqueue(stream, devPtr, NULL, value, count, 0);
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

static const struct {
    cudaError_t code;
    const char *name;
    const char *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {35, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized",
     "invalid device context"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
     "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t error) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return errors[i].name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error)
            return errors[i].text;
    return "unrecognized error code";
}
