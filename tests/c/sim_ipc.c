/* Device memory shared between two processes with IPC handles. "export" allocates, fills a
 * block, exports it (also through an interior pointer and through the runtime: the same
 * handle), starts "import HEX SIZE" as a second process and waits for it; the importer
 * checks the bytes, writes marks at both ends and closes; the exporter then sees the marks.
 * With the shim preloaded the exporter's blocks are cached blocks inside larger segments.
 * Prints "PASS export" (exporter) and "imported ok" (importer). */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "sim_check.h"
#include "sim_ctx.h"

extern char **environ;
#define MiB (1024u * 1024u)

static void to_hex(const CUipcMemHandle *h, char *out) {
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
        sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void from_hex(const char *s, CUipcMemHandle *h) {
    REQUIRE(strlen(s) == 2 * CU_IPC_HANDLE_SIZE);
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++) {
        unsigned v;
        REQUIRE(sscanf(s + 2 * i, "%2x", &v) == 1);
        h->reserved[i] = (char)v;
    }
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + 3); }


/* The record files cushim keeps in CUSHIM_IPC_DIR (names starting "cushim-ipc-"): with
 * SIM_IPC_SHOW_RECORDS, print each one's mode and owner; with SIM_IPC_TAMPER=link|open,
 * play a local attacker on each: replace it by a symbolic link to a copy of itself, or
 * make it readable by everyone. */
static void records(void) {
    const char *dir = getenv("CUSHIM_IPC_DIR"), *tamper = getenv("SIM_IPC_TAMPER");
    char default_dir[64];
    if (!dir) { /* cushim's default: the user's own directory under /dev/shm */
        snprintf(default_dir, sizeof default_dir, "/dev/shm/cushim-%u", (unsigned)geteuid());
        dir = default_dir;
    }
    if (!tamper && !getenv("SIM_IPC_SHOW_RECORDS"))
        return;
    DIR *d = opendir(dir);
    REQUIRE(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "cushim-ipc-", 11))
            continue;
        char path[4096], copy[4200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        REQUIRE(lstat(path, &st) == 0);
        if (!tamper) {
            printf("record %s mode %o uid %u\n", e->d_name, (unsigned)(st.st_mode & 07777),
                   (unsigned)st.st_uid);
        } else if (!strcmp(tamper, "link")) {
            snprintf(copy, sizeof copy, "%s/planted-%s", dir, e->d_name);
            REQUIRE(rename(path, copy) == 0 && symlink(copy, path) == 0);
        } else if (!strcmp(tamper, "open")) {
            REQUIRE(chmod(path, 0644) == 0);
        }
    }
    closedir(d);
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    REQUIRE(d != NULL);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static int import(const char *hex, size_t size) {
    init_ctx();
    records();
    int fds_before = open_fds();
    CUipcMemHandle h, zero;
    from_hex(hex, &h);
    memset(&zero, 0, sizeof zero);
    CUdeviceptr p = 0, q = 0;
    EXPECT(CUDA_ERROR_INVALID_VALUE, cuIpcOpenMemHandle(&p, zero, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    EXPECT(CUDA_SUCCESS, cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    EXPECT(CUDA_SUCCESS, cuIpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    REQUIRE(p == q);
    unsigned char *buf = malloc(size);
    EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(buf, p, size));
    for (size_t i = 0; i < size; i++)
        if (buf[i] != pattern(i)) {
            fprintf(stderr, "importer: byte %zu is %u, expected %u\n", i, buf[i], pattern(i));
            return 1;
        }
    EXPECT(CUDA_SUCCESS, cuMemsetD8(p, 0xAB, 16));
    EXPECT(CUDA_SUCCESS, cuMemsetD8(p + size - 1, 0xCD, 1));
    EXPECT(CUDA_SUCCESS, cuCtxSynchronize());
    EXPECT(CUDA_SUCCESS, cuIpcCloseMemHandle(p));
    EXPECT(CUDA_SUCCESS, cuIpcCloseMemHandle(q));
    EXPECT(CUDA_ERROR_INVALID_VALUE, cuIpcCloseMemHandle(p));
    printf("importer descriptors left %d\n", open_fds() - fds_before);
    printf("imported ok\n");
    return 0;
}

/* The same through the runtime alone (no driver call, no context made current first). */
static int import_runtime(const char *hex, size_t size) {
    CUipcMemHandle h;
    cudaIpcMemHandle_t rh;
    from_hex(hex, &h);
    memcpy(&rh, &h, sizeof rh);
    void *p = NULL, *q = NULL;
    EXPECT(cudaSuccess, cudaIpcOpenMemHandle(&p, rh, cudaIpcMemLazyEnablePeerAccess));
    EXPECT(cudaSuccess, cudaIpcOpenMemHandle(&q, rh, cudaIpcMemLazyEnablePeerAccess));
    REQUIRE(p == q);
    unsigned char *buf = malloc(size);
    EXPECT(cudaSuccess, cudaMemcpy(buf, p, size, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < size; i++)
        REQUIRE(buf[i] == pattern(i));
    EXPECT(cudaSuccess, cudaMemset(p, 0xAB, 16));
    EXPECT(cudaSuccess, cudaMemset((char *)p + size - 1, 0xCD, 1));
    EXPECT(cudaSuccess, cudaIpcCloseMemHandle(p));
    EXPECT(cudaSuccess, cudaIpcCloseMemHandle(q));
    printf("imported ok\n");
    return 0;
}

/* Give up CAP_SYS_PTRACE (effective and permitted): an importer of the exporter's user that
 * may not ptrace it, as under Yama's ptrace_scope 1 for a process that is not its ancestor. */
static void drop_ptrace(void) {
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    REQUIRE(syscall(SYS_capget, &hdr, data) == 0);
    data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    data[CAP_SYS_PTRACE / 32].permitted &= ~(1u << (CAP_SYS_PTRACE % 32));
    data[CAP_SYS_PTRACE / 32].inheritable &= ~(1u << (CAP_SYS_PTRACE % 32));
    REQUIRE(syscall(SYS_capset, &hdr, data) == 0);
}

/* A process without the shim given a handle of a block inside a cached segment: refused
 * with CUDA's error, never a pointer to other memory. With SIM_IPC_DROP_PTRACE, a process
 * under the shim that may not ptrace the exporter: refused the same way. */
static int import_refused(const char *hex) {
    if (getenv("SIM_IPC_DROP_PTRACE"))
        drop_ptrace();
    init_ctx();
    records();
    CUipcMemHandle h;
    from_hex(hex, &h);
    CUdeviceptr p = 0;
    EXPECT(CUDA_ERROR_INVALID_VALUE, cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    REQUIRE(p == 0);
    printf("import refused\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "import"))
        return import(argv[2], (size_t)strtoull(argv[3], NULL, 10));
    if (argc == 4 && !strcmp(argv[1], "import-runtime"))
        return import_runtime(argv[2], (size_t)strtoull(argv[3], NULL, 10));
    if (argc == 4 && !strcmp(argv[1], "import-refused"))
        return import_refused(argv[2]);
    if (argc < 2)
        return 2;
    if ((!strcmp(argv[1], "export") || !strcmp(argv[1], "export-first")) && (sim_case_known_ = 1)) {
        /* "export": the second of two allocations (under the shim: a block inside the
         * segment the first one opened); "export-first": the first. SIM_IPC_CHILD_NO_SHIM=1
         * starts the importer without LD_PRELOAD; SIM_IPC_EXPECT_REFUSED=1 expects the
         * importer's open to be refused with CUDA_ERROR_INVALID_VALUE. */
        int first = !strcmp(argv[1], "export-first");
        int refused = getenv("SIM_IPC_EXPECT_REFUSED") != NULL;
        init_ctx();
        const size_t sizes[2] = {2 * MiB, 3 * MiB + 512};
        CUdeviceptr blk[2];
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&blk[0], sizes[0]));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&blk[1], sizes[1]));
        CUdeviceptr b = blk[!first], a = blk[first];
        size_t size = sizes[!first], asize = sizes[first];
        EXPECT(CUDA_SUCCESS, cuMemsetD8(a, 0x11, asize));   /* the neighbour, left alone */
        unsigned char *buf = malloc(size);
        for (size_t i = 0; i < size; i++)
            buf[i] = pattern(i);
        EXPECT(CUDA_SUCCESS, cuMemcpyHtoD(b, buf, size));
        CUipcMemHandle h, h2;
        cudaIpcMemHandle_t rh;
        if (getenv("SIM_IPC_EXPECT_EXPORT_REFUSED")) {
            /* cushim cannot keep the handle's record private: refused, in both APIs */
            EXPECT(CUDA_ERROR_NOT_SUPPORTED, cuIpcGetMemHandle(&h, b));
            EXPECT(cudaErrorNotSupported, cudaIpcGetMemHandle(&rh, (void *)b));
            printf("export refused\n");
            return 0;
        }
        if (getenv("SIM_IPC_NOT_DUMPABLE")) /* only a CAP_SYS_PTRACE holder may ptrace it */
            REQUIRE(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
        EXPECT(CUDA_SUCCESS, cuIpcGetMemHandle(&h, b));
        EXPECT(CUDA_SUCCESS, cuIpcGetMemHandle(&h2, b));
        REQUIRE(!memcmp(&h, &h2, sizeof h));
        EXPECT(cudaSuccess, cudaIpcGetMemHandle(&rh, (void *)b));
        REQUIRE(!memcmp(&h, &rh, sizeof h));
        CUdeviceptr self;
        EXPECT(CUDA_ERROR_INVALID_CONTEXT, cuIpcOpenMemHandle(&self, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        /* the exporter still sees its bytes after exporting */
        memset(buf, 0, size);
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(buf, b, size));
        REQUIRE(buf[5] == pattern(5) && buf[size - 1] == pattern(size - 1));
        char hex[2 * CU_IPC_HANDLE_SIZE + 1], sz[32];
        to_hex(&h, hex);
        snprintf(sz, sizeof sz, "%zu", size);
        const char *mode = refused ? "import-refused"
                           : getenv("SIM_IPC_RUNTIME_IMPORT") ? "import-runtime" : "import";
        char *child_argv[] = {argv[0], (char *)mode, hex, sz, NULL};
        /* The importer's environment: without LD_PRELOAD when SIM_IPC_CHILD_NO_SHIM is set,
         * its own SIMCUDA_REPORT when SIM_IPC_CHILD_REPORT names one. */
        static char *env[512];
        static char child_report[4200];
        const char *cr = getenv("SIM_IPC_CHILD_REPORT");
        int n = 0;
        for (char **e = environ; *e && n < 509; e++) {
            if (getenv("SIM_IPC_CHILD_NO_SHIM") && !strncmp(*e, "LD_PRELOAD=", 11))
                continue;
            if (cr && !strncmp(*e, "SIMCUDA_REPORT=", 15))
                continue;
            env[n++] = *e;
        }
        if (cr) {
            snprintf(child_report, sizeof child_report, "SIMCUDA_REPORT=%s", cr);
            env[n++] = child_report;
        }
        env[n] = NULL;
        pid_t pid;
        REQUIRE(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, child_argv, env) == 0);
        int status = 0;
        REQUIRE(waitpid(pid, &status, 0) == pid);
        REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(buf, b, size));
        if (!refused) {
            REQUIRE(buf[0] == 0xAB && buf[15] == 0xAB && buf[16] == pattern(16));
            REQUIRE(buf[size - 1] == 0xCD && buf[size - 2] == pattern(size - 2));
        } else {
            REQUIRE(buf[0] == pattern(0) && buf[size - 1] == pattern(size - 1));
        }
        unsigned char *na = malloc(asize);
        EXPECT(CUDA_SUCCESS, cuMemcpyDtoH(na, a, asize));
        for (size_t i = 0; i < asize; i++)
            REQUIRE(na[i] == 0x11);
        printf("offset_in_pair=%lld\nPASS export\n", (long long)(b - a));
    }
    CASE("freed") {
        /* Under the shim: each exported block inside a segment has a record until the
         * program frees it, through the driver or the runtime, whatever the segment kind.
         * Prints the record count after two exports and after each free. */
        init_ctx();
        const char *dir = getenv("CUSHIM_IPC_DIR");
        REQUIRE(dir != NULL);
        CUdeviceptr a, b;
        void *d = NULL;
        CUipcMemHandle h;
        cudaIpcMemHandle_t rh;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&a, 2 * MiB));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&b, 3 * MiB));
        EXPECT(cudaSuccess, cudaMalloc(&d, MiB + 512));
        EXPECT(CUDA_SUCCESS, cuIpcGetMemHandle(&h, b));
        EXPECT(cudaSuccess, cudaIpcGetMemHandle(&rh, d));
        int n[3] = {0, 0, 0};
        for (int k = 0; k < 3; k++) {
            if (k == 1)
                EXPECT(CUDA_SUCCESS, cuMemFree(b));
            if (k == 2)
                EXPECT(cudaSuccess, cudaFree(d));
            struct dirent *e;
            DIR *dd = opendir(dir);
            REQUIRE(dd != NULL);
            while ((e = readdir(dd)) != NULL) n[k] += !strncmp(e->d_name, "cushim-ipc-", 11);
            closedir(dd);
        }
        EXPECT(CUDA_SUCCESS, cuMemFree(a));
        printf("records %d %d %d\nPASS freed\n", n[0], n[1], n[2]);
    }
    CASE("handles") {
        /* Not device memory: refused. A freed and reallocated allocation: a new handle. */
        init_ctx();
        CUipcMemHandle h, h2;
        char host[64];
        EXPECT(CUDA_ERROR_INVALID_VALUE, cuIpcGetMemHandle(&h, (CUdeviceptr)host));
        CUdeviceptr b, b2;
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&b, MiB));
        EXPECT(CUDA_SUCCESS, cuIpcGetMemHandle(&h, b + 4096));
        EXPECT(CUDA_SUCCESS, cuIpcGetMemHandle(&h2, b));
        REQUIRE(!memcmp(&h, &h2, sizeof h));
        EXPECT(CUDA_SUCCESS, cuMemFree(b));
        EXPECT(CUDA_SUCCESS, cuMemAlloc(&b2, MiB));
        EXPECT(CUDA_SUCCESS, cuIpcGetMemHandle(&h2, b2));
        REQUIRE(b2 != b || memcmp(&h, &h2, sizeof h));
        printf("PASS handles\n");
    }
    CASES_END();
    return 0;
}
