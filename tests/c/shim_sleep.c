/* Sleep mode under the shim: pause and resume by tag through cushim's C API (looked up with
 * dlsym, so without the shim the program says so and fails).
 *   worker ROLE         a process of the alternation: allocates "weights" (backed up) and
 *                       "kv_cache" (discarded), pauses both, then obeys lines on stdin:
 *                       resume | work | pause | quit; answers one line each.
 *   faults              pause/resume rounds; each either all happens or nothing does.
 *   bad_input           unknown tags, double pause, resume of what is not paused.
 *   off                 sleep mode off: pause and resume refuse with 801.
 *   capture             a pause during a CUDA graph capture refuses with 900, pauses nothing;
 *                       after the capture it pauses.
 *   forked              forks; the child allocates "weights", prints "child PID", and waits
 *                       (up to 120 s) until something outside paused them.
 *   trace               allocates in make_block (4 KiB, 8 KiB, then 4 KiB again, which the
 *                       cache serves from the block freed before), frees in drop_block;
 *                       the 4 KiB block stays live. Prints "ok".
 *   spans               backs up three segments of 100, 3 and 150 MiB (laid out across
 *                       several host buffers, one segment across two) and resumes them
 *                       with every byte as before, twice.
 *   corrupt             backs "weights" up, changes one byte of the backup in host memory
 *                       (found by its contents among the process's private mappings): the
 *                       resume fails with 214 and leaves the tag paused; with the byte put
 *                       back, it resumes with every byte as before. */
#include <sys/wait.h>
#include <unistd.h>
#include "shim_util.h"
#include <stdint.h>

typedef int (*push_fn)(const char *);
typedef int (*pop_fn)(void);
typedef int (*pause_fn)(const char *, int);
typedef int (*resume_fn)(const char *);
typedef long long (*paused_fn)(const char *);
static push_fn tag_push;
static pop_fn tag_pop;
static pause_fn do_pause;
static resume_fn do_resume;
static paused_fn paused_bytes;

static void lookup(void) {
    tag_push = (push_fn)dlsym(RTLD_DEFAULT, "cushim_tag_push");
    tag_pop = (pop_fn)dlsym(RTLD_DEFAULT, "cushim_tag_pop");
    do_pause = (pause_fn)dlsym(RTLD_DEFAULT, "cushim_pause");
    do_resume = (resume_fn)dlsym(RTLD_DEFAULT, "cushim_resume");
    paused_bytes = (paused_fn)dlsym(RTLD_DEFAULT, "cushim_paused_bytes");
    if (!tag_push || !tag_pop || !do_pause || !do_resume || !paused_bytes) {
        fprintf(stderr, "no cushim sleep-mode API in this process\n");
        exit(3);
    }
}

#define REQUIRE(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #cond); exit(1); } } while (0)
#define EXPECT_RC(want, call) do { int got_ = (call); if (got_ != (want)) { \
    fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, got_, (want)); \
    exit(1); } } while (0)

static void fill(unsigned char *h, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(seed * 31u + i * 7u + (i >> 12));
}

static void *tagged_malloc(const char *tag, size_t n) {
    void *p = NULL;
    EXPECT_RC(0, tag_push(tag));
    cudaError_t e = cudaMalloc(&p, n);
    EXPECT_RC(0, tag_pop());
    if (e != cudaSuccess) {
        printf("out of memory allocating %s (%d)\n", tag, (int)e);
        fflush(stdout);
        exit(4);
    }
    return p;
}

static int worker(const char *role) {
    size_t wn = 24 * MiB, kn = 36 * MiB;
    unsigned seed = role[0];
    unsigned char *want = malloc(wn), *got = malloc(wn), *kv = malloc(kn);
    if (!want || !got || !kv) return 5;
    void *w = tagged_malloc("weights", wn);
    void *k = tagged_malloc("kv_cache", kn);
    fill(want, wn, seed);
    CHECK(cudaMemcpy(w, want, wn, cudaMemcpyHostToDevice));
    memset(kv, 0x5a, kn);
    CHECK(cudaMemcpy(k, kv, kn, cudaMemcpyHostToDevice));
    int rc1 = do_pause("weights", 1), rc2 = do_pause("kv_cache", 0);
    printf("ready %d %d\n", rc1, rc2);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "resume", 6)) {
            int r = do_resume(NULL); /* every tag: all or nothing */
            if (r != 0) {
                printf("refused %d paused %lld\n", r, paused_bytes(NULL));
            } else {
                CHECK(cudaMemcpy(got, w, wn, cudaMemcpyDeviceToHost));
                int same = memcmp(got, want, wn) == 0;
                unsigned char last = kv[0], back[64];
                CHECK(cudaMemcpy(back, k, sizeof back, cudaMemcpyDeviceToHost));
                int discarded = 0;
                for (size_t i = 0; i < sizeof back; i++) discarded |= back[i] != last;
                printf("resumed weights_identical=%d kv_discarded=%d paused %lld\n", same,
                       discarded, paused_bytes(NULL));
            }
        } else if (!strncmp(line, "work", 4)) {
            for (size_t i = 0; i < wn; i += 4096) want[i]++;
            CHECK(cudaMemcpy(w, want, wn, cudaMemcpyHostToDevice));
            memset(kv, (int)seed, kn);
            CHECK(cudaMemcpy(k, kv, kn, cudaMemcpyHostToDevice));
            printf("worked\n");
        } else if (!strncmp(line, "pause", 5)) {
            int a = do_pause("weights", 1), b = do_pause("kv_cache", 0);
            /* a use of paused memory is an illegal address, not a crash */
            cudaError_t e = cudaMemcpy(got, w, 64, cudaMemcpyDeviceToHost);
            printf("paused %d %d bytes %lld use_after_pause=%d\n", a, b, paused_bytes(NULL), (int)e);
        } else if (!strncmp(line, "quit", 4)) {
            CHECK(cudaFree(w));
            CHECK(cudaFree(k));
            printf("bye\n");
            fflush(stdout);
            return 0;
        }
        fflush(stdout);
    }
    return 6;
}

static int faults(void) {
    size_t n = 6 * MiB + 100;
    unsigned char *want = malloc(n), *got = malloc(n);
    if (!want || !got) return 5;
    void *w = tagged_malloc("weights", n);
    void *other = tagged_malloc("other", 2 * MiB);
    fill(want, n, 9);
    CHECK(cudaMemcpy(w, want, n, cudaMemcpyHostToDevice));
    long long whole = 0;
    int pause_failed = 0, resume_failed = 0;
    for (int round = 0; round < 6; round++) {
        int r = do_pause("weights", round % 2 ? 0 : 1);
        long long p = paused_bytes("weights");
        if (r == 0) {
            if (whole == 0) whole = p;
            REQUIRE(p > 0 && p == whole);           /* whole-paused */
        } else {
            pause_failed++;
            REQUIRE(p == 0);                        /* whole-live */
            CHECK(cudaMemcpy(got, w, n, cudaMemcpyDeviceToHost));
            REQUIRE(memcmp(got, want, n) == 0);
            continue;
        }
        int tries = 0;
        while ((r = do_resume("weights")) != 0) {
            resume_failed++;
            REQUIRE(paused_bytes("weights") == whole); /* still whole-paused */
            REQUIRE(++tries < 10);
        }
        REQUIRE(paused_bytes("weights") == 0);
        if (round % 2 == 0) {
            CHECK(cudaMemcpy(got, w, n, cudaMemcpyDeviceToHost));
            REQUIRE(memcmp(got, want, n) == 0);
        }
        fill(want, n, 10 + round);
        CHECK(cudaMemcpy(w, want, n, cudaMemcpyHostToDevice));
    }
    /* the process stays usable */
    void *more = NULL;
    CHECK(cudaMalloc(&more, 1 * MiB));
    CHECK(cudaFree(more));
    CHECK(cudaFree(w));
    CHECK(cudaFree(other));
    printf("faults pause_failed=%d resume_failed=%d\n", pause_failed, resume_failed);
    return 0;
}

static int bad_input(void) {
    void *w = tagged_malloc("weights", 4 * MiB);
    EXPECT_RC(0, do_pause("no_such_tag", 1));
    REQUIRE(paused_bytes("no_such_tag") == 0);
    REQUIRE(paused_bytes(NULL) == 0);
    EXPECT_RC(0, do_resume("weights"));            /* not paused: nothing */
    EXPECT_RC(1, do_pause("weights", 7));           /* bad mode */
    EXPECT_RC(1, tag_push(""));
    EXPECT_RC(1, tag_pop());                        /* nothing open */
    size_t f0, f1, f2, t;
    CHECK(cudaMemGetInfo(&f0, &t));
    EXPECT_RC(0, do_pause("weights", 0));
    long long once = paused_bytes("weights");
    CHECK(cudaMemGetInfo(&f1, &t));
    EXPECT_RC(0, do_pause("weights", 0));           /* twice: nothing more */
    REQUIRE(paused_bytes("weights") == once);
    CHECK(cudaMemGetInfo(&f2, &t));
    REQUIRE(f2 == f1);
    REQUIRE(once >= (long long)(4 * MiB) && f1 >= f0 + (size_t)once); /* paused bytes are free */
    EXPECT_RC(0, do_resume(NULL));
    EXPECT_RC(0, do_resume(NULL));
    REQUIRE(paused_bytes(NULL) == 0);
    CHECK(cudaFree(w));
    printf("bad_input ok\n");
    return 0;
}

static int off(void) {
    void *w = NULL;
    CHECK(cudaMalloc(&w, 4 * MiB));
    EXPECT_RC(801, do_pause("weights", 1));
    EXPECT_RC(801, do_resume("weights"));
    REQUIRE(paused_bytes(NULL) == -1);
    CHECK(cudaFree(w));
    printf("off ok\n");
    return 0;
}

static int capture(void) {
    void *w = tagged_malloc("weights", 4 * MiB);
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    EXPECT_RC(900, do_pause("weights", 1));
    REQUIRE(paused_bytes("weights") == 0);          /* nothing was paused */
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(st, &g));
    (void)g;
    EXPECT_RC(0, do_pause("weights", 1));           /* after the capture: paused */
    REQUIRE(paused_bytes("weights") >= (long long)(4 * MiB));
    EXPECT_RC(0, do_resume(NULL));
    CHECK(cudaStreamDestroy(st));
    CHECK(cudaFree(w));
    printf("capture ok\n");
    return 0;
}

static int forked(void) {
    pid_t pid = fork();
    if (pid < 0) return 7;
    if (pid > 0) {
        int status = 0;
        if (waitpid(pid, &status, 0) != pid) return 8;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 9;
    }
    void *w = tagged_malloc("weights", 4 * MiB);
    printf("child %d\n", (int)getpid());
    fflush(stdout);
    /* poll, not a timing bound: the test answers as soon as the child printed its pid */
    for (int i = 0; i < 12000 && paused_bytes("weights") == 0; i++) usleep(10000);
    long long p = paused_bytes("weights");
    printf("child paused %lld\n", p);
    EXPECT_RC(0, do_resume(NULL));
    CHECK(cudaFree(w));
    return p > 0 ? 0 : 10;
}

__attribute__((noinline)) static void *make_block(size_t n) {
    void *p = NULL;
    EXPECT_RC(0, cudaMalloc(&p, n));
    return p;
}

__attribute__((noinline)) static void drop_block(void *p) {
    EXPECT_RC(0, cudaFree(p));
}

static int trace(void) {
    void *a = make_block(4096);
    void *b = make_block(8192);
    drop_block(a);
    void *c = make_block(4096);
    REQUIRE(c == a);
    drop_block(b);
    printf("ok\n");
    return 0;
}

/* The one place in the process's private anonymous read-write mappings of at least `min`
 * bytes where `head` starts a page, or NULL (none, or more than one). */
static unsigned char *find_backup(const unsigned char *head, size_t len, size_t min) {
    FILE *f = fopen("/proc/self/maps", "r");
    REQUIRE(f != NULL);
    char line[512];
    unsigned char *found = NULL;
    int count = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        int name_at = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &name_at) < 3) continue;
        if (strcmp(perms, "rw-p") || hi - lo < min) continue;
        if (name_at > 0 && line[name_at] != '\n' && line[name_at] != '\0') continue;
        for (unsigned long p = lo; p + len <= hi; p += 4096)
            if (!memcmp((void *)p, head, len)) { found = (unsigned char *)p; count++; }
    }
    fclose(f);
    return count == 1 ? found : NULL;
}

static int corrupt(void) {
    const size_t n = 32 * MiB;
    unsigned char *w = tagged_malloc("weights", n);
    unsigned char head[64];
    for (int i = 0; i < 64; i++) head[i] = (unsigned char)(0xC3 ^ (i * 37));
    CHECK(cudaMemset(w, 0x5A, n));
    CHECK(cudaMemcpy(w, head, sizeof head, cudaMemcpyHostToDevice));
    EXPECT_RC(0, do_pause("weights", 1));
    unsigned char *b = find_backup(head, sizeof head, n);
    REQUIRE(b != NULL);
    REQUIRE(b[n / 2] == 0x5A);
    b[n / 2] = 0xA5;
    EXPECT_RC(214, do_resume("weights"));
    REQUIRE(paused_bytes("weights") >= (long long)n);
    b[n / 2] = 0x5A;
    EXPECT_RC(0, do_resume("weights"));
    REQUIRE(paused_bytes("weights") == 0);
    unsigned char *h = malloc(n);
    REQUIRE(h != NULL);
    CHECK(cudaMemcpy(h, w, n, cudaMemcpyDeviceToHost));
    REQUIRE(!memcmp(h, head, sizeof head));
    for (size_t i = sizeof head; i < n; i++) REQUIRE(h[i] == 0x5A);
    free(h);
    CHECK(cudaFree(w));
    printf("corrupt ok\n");
    return 0;
}

static int spans(void) {
    const size_t sizes[3] = {100 * MiB, 3 * MiB, 150 * MiB};
    unsigned char *d[3];
    unsigned char *h = malloc(150 * MiB), *back = malloc(150 * MiB);
    REQUIRE(h != NULL && back != NULL);
    for (int k = 0; k < 3; k++) {
        d[k] = tagged_malloc("weights", sizes[k]);
        fill(h, sizes[k], 11 + k);
        CHECK(cudaMemcpy(d[k], h, sizes[k], cudaMemcpyHostToDevice));
    }
    for (int round = 0; round < 2; round++) {
        EXPECT_RC(0, do_pause("weights", 1));
        REQUIRE(paused_bytes("weights") >= (long long)(253 * MiB));
        EXPECT_RC(0, do_resume("weights"));
        for (int k = 0; k < 3; k++) {
            fill(h, sizes[k], 11 + k);
            CHECK(cudaMemcpy(back, d[k], sizes[k], cudaMemcpyDeviceToHost));
            REQUIRE(!memcmp(back, h, sizes[k]));
        }
    }
    for (int k = 0; k < 3; k++) CHECK(cudaFree(d[k]));
    free(h);
    free(back);
    printf("spans ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    CHECK(cudaFree(0));
    lookup();
    if (!strcmp(argv[1], "worker") && argc > 2) return worker(argv[2]);
    if (!strcmp(argv[1], "faults")) return faults();
    if (!strcmp(argv[1], "bad_input")) return bad_input();
    if (!strcmp(argv[1], "off")) return off();
    if (!strcmp(argv[1], "capture")) return capture();
    if (!strcmp(argv[1], "forked")) return forked();
    if (!strcmp(argv[1], "trace")) return trace();
    if (!strcmp(argv[1], "corrupt")) return corrupt();
    if (!strcmp(argv[1], "spans")) return spans();
    fprintf(stderr, "unknown case %s\n", argv[1]);
    return 2;
}
