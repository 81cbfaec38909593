/* Asks cuGetProcAddress_v2 for every entry of a list file (lines "name version flags",
 * '#' comments, "" for the empty name) and prints, per entry,
 * "name version flags -> rc status symbol", where symbol is the exported name (dladdr) of
 * the returned pointer or "-" for NULL. Also checks the v1 signature and cuGetExportTable. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include "sim_check.h"

typedef CUresult (*get_proc_v1)(const char *, void **, int, cuuint64_t);

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    FILE *f = fopen(argv[1], "r");
    REQUIRE(f != NULL);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char name[256] = "";
        int version = 0;
        unsigned long long flags = 0;
        if (line[0] == '"') {
            REQUIRE(sscanf(line, "\"\" %d %llu", &version, &flags) == 2);
        } else {
            REQUIRE(sscanf(line, "%255s %d %llu", name, &version, &flags) == 3);
        }
        void *fn = (void *)0x1;
        CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
        CUresult rc = cuGetProcAddress(name, &fn, version, flags, &st);
        const char *sym = "-";
        Dl_info info;
        if (fn && dladdr(fn, &info) && info.dli_sname) sym = info.dli_sname;
        else if (fn) sym = "?";
        printf("%s %d %llu -> %d %d %s\n", name[0] ? name : "\"\"", version, flags, (int)rc, (int)st, sym);
        n++;
    }
    printf("entries: %d\n", n);
    void *fn = NULL;
    EXPECT(CUDA_SUCCESS, cuGetProcAddress("cuGetProcAddress", &fn, 11030, 0, NULL));
    get_proc_v1 v1 = (get_proc_v1)fn;
    void *alloc = NULL;
    EXPECT(CUDA_SUCCESS, v1("cuMemAlloc", &alloc, 12000, 0));
    REQUIRE(alloc == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    EXPECT(CUDA_ERROR_NOT_FOUND, v1("cuNoSuchThing", &alloc, 12000, 0));
    REQUIRE(alloc == NULL);
    EXPECT(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress("cuInit", NULL, 12000, 0, NULL));
    const void *table = (const void *)0x1;
    CUuuid id;
    memset(&id, 0x42, sizeof id);
    EXPECT(CUDA_ERROR_NOT_FOUND, cuGetExportTable(&table, &id));
    REQUIRE(table == NULL);
    /* an entry point found by name works like the exported one */
    CUresult (*init)(unsigned) = NULL;
    EXPECT(CUDA_SUCCESS, cuGetProcAddress("cuInit", (void **)&init, 12000, 0, NULL));
    EXPECT(CUDA_SUCCESS, init(0));
    int count = 0;
    CUresult (*get_count)(int *) = NULL;
    EXPECT(CUDA_SUCCESS, cuGetProcAddress("cuDeviceGetCount", (void **)&get_count, 12000, 0, NULL));
    EXPECT(CUDA_SUCCESS, get_count(&count));
    REQUIRE(count == 1);
    printf("PASS procaddr\n");
    return 0;
}
