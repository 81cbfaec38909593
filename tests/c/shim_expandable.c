/* Expandable-segment scenarios, one per mode; each prints key=value lines.
 *   hole:    three 20 MiB blocks A, B, C; free A and C; allocate 40 MiB.
 *   data:    blocks keep addresses and contents while the reservation grows and shrinks.
 *   empty:   allocate a mix, free all, cushim_empty_cache().
 *   fail:    a 50 MiB allocation (three pages) while SIMCUDA_FAIL makes every second
 *            cuMemCreate/cuMemMap fail (so its retry fails too), then a one-page one.
 *   growth:  a 50 MiB allocation (three pages, one growth) written whole, then a 20 MiB
 *            one (one page, one growth) written whole.
 */
#include <stdint.h>
#include "shim_util.h"

static void pattern(unsigned char *p, size_t n, unsigned char tag) {
    for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)(tag + i / 4096);
    p[n - 1] = tag;
}

static int check(const unsigned char *p, size_t n, unsigned char tag) {
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != (unsigned char)(tag + i / 4096)) return 0;
    return p[n - 1] == tag;
}

static int hole(void) {
    void *a, *b, *c, *d;
    CHECK(cudaMalloc(&a, 20 * MiB));
    CHECK(cudaMalloc(&b, 20 * MiB));
    CHECK(cudaMalloc(&c, 20 * MiB));
    printf("used_three=%llu\n", used_bytes());
    CHECK(cudaFree(a));
    CHECK(cudaFree(c));
    CHECK(cudaMalloc(&d, 40 * MiB));
    memset(d, 0x11, 40 * MiB);
    printf("used_after=%llu\n", used_bytes());
    CHECK(cudaFree(b));
    CHECK(cudaFree(d));
    return 0;
}

static int data(void) {
    enum { N = 24 };
    unsigned char *p[N];
    size_t sz[N];
    int ok = 1;
    for (int i = 0; i < N; i++) {
        sz[i] = (size_t)(1 + (i * 7) % 23) * MiB + (size_t)(i * 4096);
        CHECK(cudaMalloc((void **)&p[i], sz[i]));
        pattern(p[i], sz[i], (unsigned char)i);
    }
    unsigned char *keep[N];
    for (int i = 0; i < N; i++) keep[i] = p[i];
    for (int i = 0; i < N; i += 2) CHECK(cudaFree(p[i]));
    shim_call("cushim_empty_cache"); /* shrink around the survivors */
    unsigned char *more[N];
    for (int i = 0; i < N; i++) { /* grow again, into the holes and past the end */
        CHECK(cudaMalloc((void **)&more[i], sz[i] / 2 + 512));
        memset(more[i], 0xEE, sz[i] / 2 + 512);
    }
    for (int i = 1; i < N; i += 2) {
        if (p[i] != keep[i] || !check(p[i], sz[i], (unsigned char)i)) ok = 0;
        CHECK(cudaFree(p[i]));
    }
    for (int i = 0; i < N; i++) CHECK(cudaFree(more[i]));
    printf("data_intact=%d\n", ok);
    return 0;
}

static int empty(void) {
    void *p[40];
    for (int i = 0; i < 40; i++) {
        CHECK(cudaMalloc(&p[i], (size_t)(i % 5 == 0 ? 300 * 1024 : (1 + i % 9) * MiB)));
        memset(p[i], i, 512);
    }
    for (int i = 0; i < 40; i++) CHECK(cudaFree(p[i]));
    printf("used_before_empty=%llu\n", used_bytes());
    printf("empty_rc=%d\n", shim_call("cushim_empty_cache"));
    printf("used_after_empty=%llu\n", used_bytes());
    return 0;
}

static int fail(void) {
    void *a = NULL, *b = NULL;
    cudaError_t e = cudaMalloc(&a, 50 * MiB); /* needs several pages: one of them fails */
    printf("first=%d\n", (int)e);
    (void)cudaGetLastError();
    printf("used_after_fail=%llu\n", used_bytes());
    CHECK(cudaMalloc(&b, 20 * MiB)); /* one page: one create, one map */
    memset(b, 1, 20 * MiB);
    printf("second=ok\n");
    CHECK(cudaFree(b));
    if (a) CHECK(cudaFree(a));
    shim_call("cushim_empty_cache"); /* so the exit report shows what leaked, if anything */
    return 0;
}

static int growth(void) {
    void *a, *b;
    CHECK(cudaMalloc(&a, 50 * MiB));
    memset(a, 0x5a, 50 * MiB); /* every page of the growth is readable and writable */
    printf("used_first=%llu\n", used_bytes());
    CHECK(cudaMalloc(&b, 20 * MiB));
    memset(b, 0xa5, 20 * MiB);
    printf("used_second=%llu\n", used_bytes());
    printf("written=%d\n", ((unsigned char *)a)[50 * MiB - 1] == 0x5a &&
                                ((unsigned char *)b)[20 * MiB - 1] == 0xa5);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    shim_call("cushim_empty_cache");
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "hole";
    if (!strcmp(mode, "hole")) return hole();
    if (!strcmp(mode, "data")) return data();
    if (!strcmp(mode, "empty")) return empty();
    if (!strcmp(mode, "fail")) return fail();
    if (!strcmp(mode, "growth")) return growth();
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
