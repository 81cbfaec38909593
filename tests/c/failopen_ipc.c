/* IPC handles and peer access, with results that depend only on CUDA's answers (for the
 * fault-injection sweep of tests/shim/shim_failopen.rs). With no argument: the exporter
 * allocates two 2 MiB blocks (a, then b: under the shim b lies inside a's segment), fills
 * them, exports a through the runtime and b through the driver, and starts itself as
 * "import HEXA HEXB" (or "-" for a handle it could not get), which opens a through the
 * runtime and b through the driver, prints a checksum of each, marks its first bytes and
 * closes it. The importer's environment is the exporter's, without CUSHIM_TEST_FAULT, which
 * it gets from FAULT_IMPORTER when that is set. The exporter then reports the marks, and
 * enables and disables peer access to device 1 through both APIs (SIMCUDA_DEVICES=2).
 * Prints one "name=value" line per answer. */
#define _GNU_SOURCE
#include <cuda.h>
#include <spawn.h>
#include <sys/wait.h>
#include "shim_util.h"

extern char **environ;
#define SIZE (2 * MiB)

static void to_hex(const char *h, char *out) {
    for (int i = 0; i < 64; i++)
        sprintf(out + 2 * i, "%02x", (unsigned char)h[i]);
}

static int from_hex(const char *s, char *h) {
    if (strlen(s) != 128)
        return 0;
    for (int i = 0; i < 64; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return 0;
        h[i] = (char)v;
    }
    return 1;
}

static unsigned long long dev_sum(const void *d) {
    static unsigned char host[SIZE];
    CHECK(cudaMemcpy(host, d, SIZE, cudaMemcpyDeviceToHost));
    unsigned long long s = 0;
    for (size_t i = 0; i < SIZE; i += 4093)
        s = s * 31 + host[i] + i;
    return s + host[SIZE - 1];
}

static int import(const char *hexa, const char *hexb) {
    CHECK(cudaSetDevice(0));
    cudaIpcMemHandle_t ha;
    CUipcMemHandle hb;
    void *a = NULL;
    CUdeviceptr b = 0;
    int ra = -1, rb = -1;
    if (from_hex(hexa, ha.reserved)) {
        ra = cudaIpcOpenMemHandle(&a, ha, cudaIpcMemLazyEnablePeerAccess);
        (void)cudaGetLastError();
    }
    printf("open_a=%d\n", ra);
    if (ra == 0) {
        printf("sum_a=%llu\n", dev_sum(a));
        CHECK(cudaMemset(a, 0x33, 4096));
    }
    if (from_hex(hexb, hb.reserved))
        rb = cuIpcOpenMemHandle(&b, hb, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    printf("open_b=%d\n", rb);
    if (rb == 0) {
        printf("sum_b=%llu\n", dev_sum((void *)b));
        CHECK(cudaMemset((void *)b, 0x44, 4096));
        CHECK(cudaDeviceSynchronize());
    }
    if (ra == 0) {
        printf("close_a=%d\n", cudaIpcCloseMemHandle(a));
        (void)cudaGetLastError();
    }
    if (rb == 0)
        printf("close_b=%d\n", cuIpcCloseMemHandle(b));
    return 0;
}

/* The importer's environment: ours, with CUSHIM_TEST_FAULT from FAULT_IMPORTER only. */
static char **child_env(void) {
    static char *env[4096];
    static char fault[256];
    int n = 0;
    for (char **e = environ; *e && n < 4093; e++)
        if (strncmp(*e, "CUSHIM_TEST_FAULT=", 18))
            env[n++] = *e;
    const char *f = getenv("FAULT_IMPORTER");
    if (f) {
        snprintf(fault, sizeof fault, "CUSHIM_TEST_FAULT=%s", f);
        env[n++] = fault;
    }
    env[n] = NULL;
    return env;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "import"))
        return import(argv[2], argv[3]);
    if (cuInit(0) != CUDA_SUCCESS)
        return 2;
    CHECK(cudaSetDevice(0));
    void *a, *b;
    CHECK(cudaMalloc(&a, SIZE));
    CHECK(cudaMalloc(&b, SIZE));
    CHECK(cudaMemset(a, 0x11, SIZE));
    CHECK(cudaMemset(b, 0x22, SIZE));
    CHECK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t ha;
    CUipcMemHandle hb;
    int ra = cudaIpcGetMemHandle(&ha, a);
    (void)cudaGetLastError();
    int rb = cuIpcGetMemHandle(&hb, (CUdeviceptr)b);
    printf("get_a=%d\nget_b=%d\n", ra, rb);
    char hexa[129] = "-", hexb[129] = "-";
    if (ra == 0)
        to_hex(ha.reserved, hexa);
    if (rb == 0)
        to_hex(hb.reserved, hexb);
    fflush(stdout);
    char *args[] = {argv[0], "import", hexa, hexb, NULL};
    pid_t pid;
    if (posix_spawn(&pid, argv[0], NULL, NULL, args, child_env()) != 0)
        return 3;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 4;
    unsigned char ma = 0, mb = 0;
    CHECK(cudaMemcpy(&ma, a, 1, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&mb, b, 1, cudaMemcpyDeviceToHost));
    printf("mark_a=%02x\nmark_b=%02x\n", ma, mb);
    /* Peer access to device 1, runtime then driver. */
    int p1 = cudaDeviceEnablePeerAccess(1, 0);
    int p2 = cudaDeviceDisablePeerAccess(1);
    (void)cudaGetLastError();
    CUcontext c1;
    if (cuDevicePrimaryCtxRetain(&c1, 1) != CUDA_SUCCESS)
        return 5;
    int p3 = cuCtxEnablePeerAccess(c1, 0);
    int p4 = cuCtxDisablePeerAccess(c1);
    printf("peer=%d,%d,%d,%d\n", p1, p2, p3, p4);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    return 0;
}
