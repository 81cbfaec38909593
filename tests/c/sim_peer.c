/* simcuda across devices and processes, one case per argv[1] (run with SIMCUDA_DEVICES=2);
 * prints "PASS <case>". "props": every field of the runtime's cudaDeviceProp equals the
 * driver's attribute for it. "peer": peer queries, enabling and copies, the same through
 * both APIs. "peer_async": cuMemcpyPeerAsync / cudaMemcpyPeerAsync return before their stream
 * reaches them and copy in stream order. "vmm_access": per-device access on virtual-memory mappings. "vmm_share": a
 * physical allocation exported as a POSIX descriptor, imported by a second process (the
 * descriptor passed at spawn) which sees and changes the same bytes; retaining a handle
 * from an address; properties from a handle. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>
#include "sim_check.h"

extern char **environ;
#define MiB (1ull << 20)

static int attr(int a, int dev) {
    int v = -12345;
    EXPECT(CUDA_SUCCESS, cuDeviceGetAttribute(&v, (CUdevice_attribute)a, dev));
    return v;
}

#define F(field, a) do { if ((long long)p.field != (long long)attr(a, dev)) { \
    fprintf(stderr, "cudaDeviceProp.%s = %lld, attribute %d = %d\n", #field, \
            (long long)p.field, a, attr(a, dev)); exit(1); } n++; } while (0)

static int props(int dev) {
    struct cudaDeviceProp p;
    memset(&p, 0x5a, sizeof p);
    EXPECT(cudaSuccess, cudaGetDeviceProperties(&p, dev));
    int n = 0;
    char name[256];
    EXPECT(CUDA_SUCCESS, cuDeviceGetName(name, sizeof name, dev));
    REQUIRE(!strcmp(name, p.name));
    size_t total = 0;
    EXPECT(CUDA_SUCCESS, cuDeviceTotalMem(&total, dev));
    REQUIRE(p.totalGlobalMem == total);
    CUuuid u;
    EXPECT(CUDA_SUCCESS, cuDeviceGetUuid(&u, dev));
    REQUIRE(!memcmp(u.bytes, p.uuid.bytes, 16));
    F(sharedMemPerBlock, 8); F(regsPerBlock, 12); F(warpSize, 10); F(memPitch, 11);
    F(maxThreadsPerBlock, 1); F(maxThreadsDim[0], 2); F(maxThreadsDim[1], 3);
    F(maxThreadsDim[2], 4); F(maxGridSize[0], 5); F(maxGridSize[1], 6); F(maxGridSize[2], 7);
    F(clockRate, 13); F(totalConstMem, 9); F(major, 75); F(minor, 76);
    F(textureAlignment, 14); F(texturePitchAlignment, 51); F(deviceOverlap, 15);
    F(multiProcessorCount, 16); F(kernelExecTimeoutEnabled, 17); F(integrated, 18);
    F(canMapHostMemory, 19); F(computeMode, 20); F(maxTexture1D, 21);
    F(maxTexture1DMipmap, 77); F(maxTexture1DLinear, 69); F(maxTexture2D[0], 22);
    F(maxTexture2D[1], 23); F(maxTexture2DMipmap[0], 73); F(maxTexture2DMipmap[1], 74);
    F(maxTexture2DLinear[0], 70); F(maxTexture2DLinear[1], 71); F(maxTexture2DLinear[2], 72);
    F(maxTexture2DGather[0], 45); F(maxTexture2DGather[1], 46); F(maxTexture3D[0], 24);
    F(maxTexture3D[1], 25); F(maxTexture3D[2], 26); F(maxTexture3DAlt[0], 47);
    F(maxTexture3DAlt[1], 48); F(maxTexture3DAlt[2], 49); F(maxTextureCubemap, 52);
    F(maxTexture1DLayered[0], 42); F(maxTexture1DLayered[1], 43);
    F(maxTexture2DLayered[0], 27); F(maxTexture2DLayered[1], 28); F(maxTexture2DLayered[2], 29);
    F(maxTextureCubemapLayered[0], 53); F(maxTextureCubemapLayered[1], 54);
    F(maxSurface1D, 55); F(maxSurface2D[0], 56); F(maxSurface2D[1], 57);
    F(maxSurface3D[0], 58); F(maxSurface3D[1], 59); F(maxSurface3D[2], 60);
    F(maxSurface1DLayered[0], 61); F(maxSurface1DLayered[1], 62);
    F(maxSurface2DLayered[0], 63); F(maxSurface2DLayered[1], 64); F(maxSurface2DLayered[2], 65);
    F(maxSurfaceCubemap, 66); F(maxSurfaceCubemapLayered[0], 67);
    F(maxSurfaceCubemapLayered[1], 68); F(surfaceAlignment, 30); F(concurrentKernels, 31);
    F(ECCEnabled, 32); F(pciBusID, 33); F(pciDeviceID, 34); F(pciDomainID, 50);
    F(tccDriver, 35); F(asyncEngineCount, 40); F(unifiedAddressing, 41);
    F(memoryClockRate, 36); F(memoryBusWidth, 37); F(l2CacheSize, 38);
    F(persistingL2CacheMaxSize, 108); F(maxThreadsPerMultiProcessor, 39);
    F(streamPrioritiesSupported, 78); F(globalL1CacheSupported, 79);
    F(localL1CacheSupported, 80); F(sharedMemPerMultiprocessor, 81);
    F(regsPerMultiprocessor, 82); F(managedMemory, 83); F(isMultiGpuBoard, 84);
    F(multiGpuBoardGroupID, 85); F(hostNativeAtomicSupported, 86);
    F(singleToDoublePrecisionPerfRatio, 87); F(pageableMemoryAccess, 88);
    F(concurrentManagedAccess, 89); F(computePreemptionSupported, 90);
    F(canUseHostPointerForRegisteredMem, 91); F(cooperativeLaunch, 95);
    F(cooperativeMultiDeviceLaunch, 96); F(sharedMemPerBlockOptin, 97);
    F(pageableMemoryAccessUsesHostPageTables, 100); F(directManagedMemAccessFromHost, 101);
    F(maxBlocksPerMultiProcessor, 106); F(accessPolicyMaxWindowSize, 109);
    F(reservedSharedMemPerBlock, 111); F(hostRegisterSupported, 99);
    F(sparseCudaArraySupported, 112); F(hostRegisterReadOnlySupported, 113);
    F(timelineSemaphoreInteropSupported, 114); F(memoryPoolsSupported, 115);
    F(gpuDirectRDMASupported, 116); F(gpuDirectRDMAFlushWritesOptions, 117);
    F(gpuDirectRDMAWritesOrdering, 118); F(memoryPoolSupportedHandleTypes, 119);
    F(deferredMappingCudaArraySupported, 121); F(ipcEventSupported, 125);
    F(clusterLaunch, 120); F(unifiedFunctionPointers, 129);
    for (int i = 0; i < 63; i++)
        REQUIRE(p.reserved[i] == 0);
    /* what deviceQuery prints and once read as No / 0 */
    REQUIRE(p.unifiedAddressing == 1 && p.managedMemory == 1 && p.canMapHostMemory == 1);
    REQUIRE(p.asyncEngineCount == 2);
    return n;
}

/* A host function that holds its stream until released. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open;

static void hold_stream(void *arg) {
    (void)arg;
    pthread_mutex_lock(&gate_mu);
    while (!gate_open)
        pthread_cond_wait(&gate_cv, &gate_mu);
    gate_open = 0;
    pthread_mutex_unlock(&gate_mu);
}

static void release_stream(void) {
    pthread_mutex_lock(&gate_mu);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

static CUmemAllocationProp prop_on(int dev, int posix) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    return p;
}

static void set_access(CUdeviceptr va, size_t n, int dev, CUmemAccess_flags f) {
    CUmemAccessDesc d;
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = f;
    EXPECT(CUDA_SUCCESS, cuMemSetAccess(va, n, &d, 1));
}

static unsigned long long access_of(CUdeviceptr va, int dev) {
    CUmemLocation l;
    l.type = CU_MEM_LOCATION_TYPE_DEVICE;
    l.id = dev;
    unsigned long long f = 99;
    EXPECT(CUDA_SUCCESS, cuMemGetAccess(&f, &l, va));
    return f;
}

static void ctx_on(int dev, CUcontext *c) {
    EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(c, dev));
    EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(*c));
}

/* The importing process: fd 100 is the exported descriptor of 2 MiB on device 0. */
static int import_child(void) {
    CUcontext c;
    EXPECT(CUDA_SUCCESS, cuInit(0));
    ctx_on(0, &c);
    CUmemGenericAllocationHandle h;
    EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemImportFromShareableHandle(&h, (void *)(intptr_t)100, CU_MEM_HANDLE_TYPE_WIN32));
    EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemImportFromShareableHandle(&h, (void *)(intptr_t)0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    EXPECT(CUDA_SUCCESS, cuMemImportFromShareableHandle(&h, (void *)(intptr_t)100, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(100);
    CUmemAllocationProp p;
    EXPECT(CUDA_SUCCESS, cuMemGetAllocationPropertiesFromHandle(&p, h));
    REQUIRE(p.location.id == 0 && p.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    size_t f0, f, t;
    EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f0, &t));
    CUdeviceptr va;
    EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
    EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
    EXPECT(CUDA_SUCCESS, cuMemRelease(h));
    set_access(va, 2 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    unsigned char b[2];
    EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(b, va + 4096, 1));
    EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(b + 1, va + 2 * MiB - 1, 1));
    REQUIRE(b[0] == 0x42 && b[1] == 0x42);
    EXPECT(CUDA_SUCCESS, cuMemsetD8(va, 0x77, 16));
    EXPECT(CUDA_SUCCESS, cuCtxSynchronize());
    EXPECT(CUDA_SUCCESS, cuMemUnmap(va, 2 * MiB));
    EXPECT(CUDA_SUCCESS, cuMemAddressFree(va, 2 * MiB));
    EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
    REQUIRE(f == f0); /* imported memory is the exporter's */
    printf("child imported ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    if (!strcmp(argv[1], "import-child"))
        return import_child();
    CUcontext c0, c1;
    EXPECT(CUDA_SUCCESS, cuInit(0));
    int count = 0;
    EXPECT(CUDA_SUCCESS, cuDeviceGetCount(&count));
    REQUIRE(count == 2);
    ctx_on(0, &c0);
    EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c1, 1));
    CASE("props") {
        int n = props(0) + props(1);
        printf("fields compared %d\nPASS props\n", n);
    }
    CASE("peer") {
        int can = -1;
        EXPECT(CUDA_SUCCESS, cuDeviceCanAccessPeer(&can, 0, 1)); REQUIRE(can == 1);
        EXPECT(CUDA_SUCCESS, cuDeviceCanAccessPeer(&can, 0, 0)); REQUIRE(can == 0);
        EXPECT(cudaSuccess, cudaDeviceCanAccessPeer(&can, 1, 0)); REQUIRE(can == 1);
        EXPECT(cudaSuccess, cudaDeviceCanAccessPeer(&can, 1, 1)); REQUIRE(can == 0);
        EXPECT(CUDA_ERROR_INVALID_DEVICE, cuDeviceCanAccessPeer(&can, 0, 2));
        EXPECT(cudaErrorInvalidDevice, cudaDeviceCanAccessPeer(&can, 0, 2));
        /* driver: current context is device 0 */
        EXPECT(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, cuCtxDisablePeerAccess(c1));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuCtxEnablePeerAccess(c1, 1));
        EXPECT(CUDA_SUCCESS, cuCtxEnablePeerAccess(c1, 0));
        EXPECT(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cuCtxEnablePeerAccess(c1, 0));
        EXPECT(CUDA_ERROR_INVALID_DEVICE, cuCtxEnablePeerAccess(c0, 0));
        /* runtime on device 0 sees the same pair */
        EXPECT(cudaSuccess, cudaSetDevice(0));
        EXPECT(cudaErrorPeerAccessAlreadyEnabled, cudaDeviceEnablePeerAccess(1, 0));
        EXPECT(cudaSuccess, cudaDeviceDisablePeerAccess(1));
        EXPECT(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, cuCtxDisablePeerAccess(c1));
        EXPECT(cudaErrorPeerAccessNotEnabled, cudaDeviceDisablePeerAccess(1));
        EXPECT(cudaErrorInvalidDevice, cudaDeviceEnablePeerAccess(0, 0));
        /* copies between devices, enabled or not */
        CUdeviceptr a, b;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&a, 4096));
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(c1));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&b, 4096));
        EXPECT(CUDA_SUCCESS, cuMemsetD8(b, 0, 4096));
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(c0));
        EXPECT(CUDA_SUCCESS, cuMemsetD8(a, 0x31, 4096));
        EXPECT(CUDA_SUCCESS, cuMemcpyPeer(b, c1, a, c0, 4096));
        unsigned char x[4096];
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(x, b, 4096));
        REQUIRE(x[0] == 0x31 && x[4095] == 0x31);
        EXPECT(CUDA_SUCCESS, cuMemsetD8(b, 0x32, 2048));
        EXPECT(cudaSuccess, cudaMemcpyPeer((void *)a, 0, (void *)b, 1, 4096));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(x, a, 4096));
        REQUIRE(x[0] == 0x32 && x[2047] == 0x32 && x[2048] == 0x31);
        EXPECT(cudaErrorInvalidDevice, cudaMemcpyPeer((void *)a, 0, (void *)b, 2, 16));
        EXPECT(CUDA_SUCCESS, cuMemFree(a));
        EXPECT(CUDA_SUCCESS, cuMemFree(b));
        printf("PASS peer\n");
    }
    CASE("peer_async") {
        /* driver: a copy from device 0 to device 1 queued behind a held stream of device 0 */
        CUdeviceptr a, b;
        unsigned char x[4096];
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(c1));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&b, 4096));
        EXPECT(CUDA_SUCCESS, cuMemsetD8(b, 0x10, 4096));
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(c0));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&a, 4096));
        EXPECT(CUDA_SUCCESS, cuMemsetD8(a, 0x11, 4096));
        CUstream s;
        EXPECT(CUDA_SUCCESS, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        EXPECT(CUDA_SUCCESS, cuLaunchHostFunc(s, hold_stream, NULL));
        EXPECT(CUDA_SUCCESS, cuMemsetD8Async(a, 0x12, 4096, s));
        EXPECT(CUDA_SUCCESS, cuMemcpyPeerAsync(b, c1, a, c0, 4096, s));
        EXPECT(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(x, b, 4096));
        REQUIRE(x[0] == 0x10 && x[4095] == 0x10); /* not run yet: the stream is held */
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuMemcpyPeerAsync(b, (CUcontext)0x1234, a, c0, 16, s));
        release_stream();
        EXPECT(CUDA_SUCCESS, cuStreamSynchronize(s));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(x, b, 4096));
        REQUIRE(x[0] == 0x12 && x[4095] == 0x12); /* after the memset queued before it */
        /* runtime: device 1 back to device 0 on a stream of device 0 */
        EXPECT(cudaSuccess, cudaSetDevice(0));
        cudaStream_t rs;
        EXPECT(cudaSuccess, cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
        EXPECT(cudaSuccess, cudaLaunchHostFunc(rs, hold_stream, NULL));
        EXPECT(CUDA_SUCCESS, cuMemsetD8(b, 0x13, 2048));
        EXPECT(cudaSuccess, cudaMemcpyPeerAsync((void *)a, 0, (void *)b, 1, 4096, rs));
        EXPECT(cudaErrorNotReady, cudaStreamQuery(rs));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(x, a, 4096));
        REQUIRE(x[0] == 0x12);
        EXPECT(cudaErrorInvalidDevice, cudaMemcpyPeerAsync((void *)a, 0, (void *)b, 2, 16, rs));
        release_stream();
        EXPECT(cudaSuccess, cudaStreamSynchronize(rs));
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(x, a, 4096));
        REQUIRE(x[0] == 0x13 && x[2047] == 0x13 && x[2048] == 0x12);
        /* the legacy stream (0) of the current context */
        EXPECT(cudaSuccess, cudaMemcpyPeerAsync((void *)b, 1, (void *)a, 0, 4096, 0));
        EXPECT(cudaSuccess, cudaDeviceSynchronize());
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(x, b, 4096));
        REQUIRE(x[0] == 0x13 && x[4095] == 0x12);
        EXPECT(cudaSuccess, cudaStreamDestroy(rs));
        EXPECT(CUDA_SUCCESS, cuStreamDestroy(s));
        EXPECT(CUDA_SUCCESS, cuMemFree(a));
        EXPECT(CUDA_SUCCESS, cuMemFree(b));
        printf("PASS peer_async\n");
    }
    CASE("vmm_access") {
        CUmemAllocationProp p = prop_on(0, 0);
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 4 * MiB, &p, 0));
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 4 * MiB, 0, h, 0));
        REQUIRE(access_of(va, 0) == 0 && access_of(va, 1) == 0);
        set_access(va, 4 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        REQUIRE(access_of(va, 0) == 3 && access_of(va + 2 * MiB, 1) == 0);
        /* granting device 1 one granule leaves device 0's access as it was */
        set_access(va + 2 * MiB, 2 * MiB, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        REQUIRE(access_of(va, 1) == 0 && access_of(va + 2 * MiB, 1) == 3);
        REQUIRE(access_of(va + 2 * MiB, 0) == 3);
        set_access(va + 2 * MiB, 2 * MiB, 1, CU_MEM_ACCESS_FLAGS_PROT_READ);
        REQUIRE(access_of(va + 2 * MiB, 1) == 1);
        /* a kernel of device 1 (a memset on its stream) writes only where it was granted */
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(c1));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemsetD8(va + 2 * MiB, 1, 16));
        set_access(va + 2 * MiB, 2 * MiB, 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        EXPECT(CUDA_SUCCESS, cuMemsetD8(va + 2 * MiB, 1, 16));
        EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemsetD8(va, 1, 16));
        EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(c0));
        set_access(va + 2 * MiB, 2 * MiB, 1, CU_MEM_ACCESS_FLAGS_PROT_NONE);
        REQUIRE(access_of(va + 2 * MiB, 1) == 0 && access_of(va + 2 * MiB, 0) == 3);
        EXPECT(CUDA_SUCCESS, cuMemsetD8(va, 1, 4 * MiB));
        unsigned long long f;
        CUmemLocation l = {CU_MEM_LOCATION_TYPE_DEVICE, 2};
        EXPECT(CUDA_ERROR_INVALID_DEVICE, cuMemGetAccess(&f, &l, va));
        l.id = 0;
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemGetAccess(&f, &l, va + 4 * MiB));
        /* retaining from an address gives the mapped handle with a reference of its own */
        CUmemGenericAllocationHandle r;
        EXPECT(CUDA_SUCCESS, cuMemRetainAllocationHandle(&r, (void *)(va + 3 * MiB)));
        REQUIRE(r == h);
        EXPECT(CUDA_SUCCESS, cuMemRelease(h));
        EXPECT(CUDA_SUCCESS, cuMemRelease(r));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemRelease(r));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemRetainAllocationHandle(&r, (void *)(va + 4 * MiB)));
        EXPECT(CUDA_SUCCESS, cuMemUnmap(va, 4 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemAddressFree(va, 4 * MiB));
        printf("PASS vmm_access\n");
    }
    CASE("vmm_share") {
        size_t f0, f, t;
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f0, &t));
        CUmemAllocationProp p = prop_on(0, 0);
        CUmemGenericAllocationHandle h, plain;
        int fd = -1;
        EXPECT(CUDA_SUCCESS, cuMemCreate(&plain, 2 * MiB, &p, 0));
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        EXPECT(CUDA_SUCCESS, cuMemRelease(plain));
        p = prop_on(0, 1);
        EXPECT(CUDA_SUCCESS, cuMemCreate(&h, 2 * MiB, &p, 0));
        CUmemAllocationProp q;
        EXPECT(CUDA_SUCCESS, cuMemGetAllocationPropertiesFromHandle(&q, h));
        REQUIRE(q.type == CU_MEM_ALLOCATION_TYPE_PINNED && q.location.id == 0);
        REQUIRE(q.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_WIN32, 0));
        EXPECT(CUDA_SUCCESS, cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        REQUIRE(fd >= 0);
        CUdeviceptr va;
        EXPECT(CUDA_SUCCESS, cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
        EXPECT(CUDA_SUCCESS, cuMemMap(va, 2 * MiB, 0, h, 0));
        set_access(va, 2 * MiB, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
        EXPECT(CUDA_SUCCESS, cuMemsetD8(va, 0x42, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuCtxSynchronize());
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, fd, 100);
        char *child_argv[] = {argv[0], "import-child", NULL};
        pid_t pid;
        REQUIRE(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, child_argv, environ) == 0);
        int status = 0;
        REQUIRE(waitpid(pid, &status, 0) == pid);
        REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(fd);
        unsigned char b[17];
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(b, va, 17));
        REQUIRE(b[0] == 0x77 && b[15] == 0x77 && b[16] == 0x42);
        EXPECT(CUDA_SUCCESS, cuMemUnmap(va, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemRelease(h));
        EXPECT(CUDA_SUCCESS, cuMemAddressFree(va, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemGetInfo(&f, &t));
        REQUIRE(f == f0);
        printf("PASS vmm_share\n");
    }
    return 0;
}
