/* Giving memory back while the driver fails. With expandable segments,
 * three rounds of: allocate a mix of sizes (small and large pages), free everything,
 * cushim_empty_cache() (where SIMCUDA_FAIL may make a cuMemUnmap or cuMemRelease fail);
 * then one more cushim_empty_cache() and the device's bytes in use:
 *   used_after_rounds=N used_final=N
 * The device's live handles are in the SIMCUDA_REPORT ledger at exit.
 */
#include "shim_util.h"

static void round_of(int r) {
    static const size_t sizes[] = {700 * 1024, 3 * MiB, 25 * MiB, 1 * MiB, 41 * MiB, 6 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *p[N];
    for (int i = 0; i < N; i++)
        CHECK(cudaMalloc(&p[i], sizes[(i + r) % N]));
    for (int i = 0; i < N; i++)
        CHECK(cudaFree(p[i]));
    if (shim_call("cushim_empty_cache") != 0) {
        fprintf(stderr, "cushim_empty_cache unavailable\n");
        exit(1);
    }
}

int main(void) {
    for (int r = 0; r < 3; r++)
        round_of(r);
    printf("used_after_rounds=%llu\n", used_bytes());
    shim_call("cushim_empty_cache");
    printf("used_final=%llu\n", used_bytes());
    return 0;
}
