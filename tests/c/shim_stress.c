/* 4 threads x N random malloc/free on random devices (sizes 1 B .. 64 MiB, log-uniform), a
 * pattern in the first and last 256 bytes of each block checked before its free. At the end
 * prints per-device allocated and reserved bytes from the shim and the device's own usage. */
#include <pthread.h>
#include <stdint.h>
#include "shim_util.h"

#define THREADS 4
#define LIVE 24

static int ops = 100000;
static int ndev = 1;
static volatile int failures;

struct slot { unsigned char *p; size_t size; int dev; unsigned char tag; };

static uint64_t xs(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

static void fill(struct slot *b) {
    size_t n = b->size / 2 < 256 ? b->size / 2 : 256;
    memset(b->p, b->tag, n);
    memset(b->p + b->size - n, b->tag ^ 0xff, n);
}

static int intact(const struct slot *b) {
    size_t n = b->size / 2 < 256 ? b->size / 2 : 256;
    for (size_t i = 0; i < n; i++)
        if (b->p[i] != b->tag || b->p[b->size - n + i] != (unsigned char)(b->tag ^ 0xff))
            return 0;
    return 1;
}

static void *worker(void *arg) {
    uint64_t seed = 0x9E3779B97F4A7C15ull * (uintptr_t)(arg + 1);
    struct slot live[LIVE] = {0};
    for (int i = 0; i < ops; i++) {
        struct slot *b = &live[xs(&seed) % LIVE];
        if (b->p) {
            CHECK(cudaSetDevice(b->dev));
            if (!intact(b)) { failures++; fprintf(stderr, "corrupted block %p\n", (void *)b->p); }
            CHECK(cudaFree(b->p));
            b->p = NULL;
        } else {
            int shift = (int)(xs(&seed) % 27); /* up to 64 MiB */
            b->size = 1 + (size_t)(xs(&seed) % ((size_t)1 << shift));
            b->dev = (int)(xs(&seed) % (uint64_t)ndev);
            b->tag = (unsigned char)xs(&seed);
            CHECK(cudaSetDevice(b->dev));
            CHECK(cudaMalloc((void **)&b->p, b->size));
            fill(b);
        }
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i].p) {
            CHECK(cudaSetDevice(live[i].dev));
            if (!intact(&live[i])) failures++;
            CHECK(cudaFree(live[i].p));
        }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) ops = atoi(argv[1]);
    CHECK(cudaGetDeviceCount(&ndev));
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("failures=%d\n", failures);
    for (int d = 0; d < ndev; d++) {
        CHECK(cudaSetDevice(d));
        char key[64];
        (void)key;
        printf("dev%d used=%llu\n", d, used_bytes());
    }
    printf("stats=%s\n", shim_stats());
    return 0;
}
