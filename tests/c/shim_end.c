/* Ways for a program under the shim to end, for the snapshot-at-the-end tests.
 *
 * Usage: shim_end SIGNAL CASE (SIGNAL: a number; CASE as below). Every case first makes 8 MiB
 * and 5 MiB of live device allocations (so a snapshot written at the end holds 13 MiB).
 *   default:      kill(self, SIGNAL) with the default disposition, then exit(0) (the exit
 *                 must not hide the signal's status).
 *   flag_before:  a handler setting a flag, installed with sigaction before the first CUDA
 *                 call; after the signal it checks the flag, makes 3 MiB more, returns 0.
 *   flag_after:   the same, installed with signal() after the first CUDA call; also checks
 *                 sigaction reports that handler back.
 *   reraise:      a handler installed after the first CUDA call prints "cleanup", restores
 *                 SIG_DFL and raises the signal again.
 *   exit_handler: a handler that calls exit(3).
 *   ignore:       SIG_IGN after the first CUDA call; the program goes on and returns 0.
 *   dump2:        two SIGNAL (the dump signal) sent to itself, then returns 0.
 *   wait:         prints "ready" and waits for signals for ever (for `cushim run`/`dump`).
 *   segv:         dereferences NULL.
 *   abort:        calls abort().
 *   _exit:        calls _exit(4).
 *   atexit_free:  an atexit handler registered before the first CUDA call frees the 8 MiB
 *                 block after main returns.
 *   loop:         SIGNAL is a count N: N cudaMalloc+cudaFree pairs of 1 KiB, printing "half"
 *                 after N/2 and "made ns_per_pair=X thread_cpu_per_pair_ns=Y" (the
 *                 loop thread's CPU time) at the end, then waits for signals for
 *                 ever (returns instead when SHIM_END_EXIT is set).
 *   pinned_loop:  SIGNAL is a count N: N rounds of a 1 KiB cudaMallocHost+cudaFreeHost
 *                 pair then a 3 KiB cudaMalloc+cudaFree pair (two event sinks in turn),
 *                 then returns 0.
 *   steps:        SIGNAL is a count N: N cudaMalloc+cudaFree pairs of 1 KiB; after each
 *                 quarter prints "done I" (I pairs made so far) and waits for a line on
 *                 stdin before going on; at the end prints "end" and waits for signals.
 */
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include "shim_util.h"

static volatile sig_atomic_t flag;
static int the_sig;

static void set_flag(int sig) { flag = sig; }

static void *exit_block;
static void free_at_exit(void) { CHECK(cudaFree(exit_block)); }

static void reraise(int sig) {
    static const char msg[] = "cleanup\n";
    (void)!write(1, msg, sizeof msg - 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void exit_3(int sig) {
    (void)sig;
    exit(3);
}

__attribute__((noinline)) static void *alloc(size_t size) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, size));
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    the_sig = atoi(argv[1]);
    const char *c = argv[2];
    if (!strcmp(c, "flag_before")) {
        struct sigaction act;
        memset(&act, 0, sizeof act);
        act.sa_handler = set_flag;
        sigaction(the_sig, &act, NULL);
    }
    if (!strcmp(c, "atexit_free")) atexit(free_at_exit);
    void *a = alloc(8 * MiB);
    void *b = alloc(5 * MiB);
    (void)a;
    (void)b;
    if (!strcmp(c, "atexit_free")) {
        exit_block = a;
        return 0;
    }
    if (!strcmp(c, "default")) {
        kill(getpid(), the_sig);
        exit(0);
    }
    if (!strcmp(c, "flag_before") || !strcmp(c, "flag_after")) {
        if (!strcmp(c, "flag_after")) {
            signal(the_sig, set_flag);
            struct sigaction now;
            sigaction(the_sig, NULL, &now);
            if (now.sa_handler != set_flag) {
                printf("sigaction does not report the handler\n");
                return 5;
            }
        }
        kill(getpid(), the_sig);
        if (flag != the_sig) {
            printf("handler not run\n");
            return 6;
        }
        alloc(3 * MiB);
        printf("handled\n");
        return 0;
    }
    if (!strcmp(c, "reraise")) {
        signal(the_sig, reraise);
        kill(getpid(), the_sig);
        for (;;) pause();
    }
    if (!strcmp(c, "exit_handler")) {
        signal(the_sig, exit_3);
        kill(getpid(), the_sig);
        for (;;) pause();
    }
    if (!strcmp(c, "ignore")) {
        signal(the_sig, SIG_IGN);
        kill(getpid(), the_sig);
        alloc(3 * MiB);
        printf("ignored\n");
        return 0;
    }
    if (!strcmp(c, "dump2")) {
        kill(getpid(), the_sig);
        kill(getpid(), the_sig);
        return 0;
    }
    if (!strcmp(c, "wait")) {
        printf("ready\n");
        fflush(stdout);
        for (;;) pause();
    }
    if (!strcmp(c, "loop")) {
        long n = atol(argv[1]);
        struct timespec t0, t1, c0, c1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        for (long i = 0; i < n; i++) {
            void *p = alloc(1024);
            CHECK(cudaFree(p));
            if (i == n / 2) {
                printf("half\n");
                fflush(stdout);
            }
        }
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
        double cpu = (c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec);
        printf("made ns_per_pair=%.1f thread_cpu_per_pair_ns=%.1f\n", ns / (n ? n : 1),
               cpu / (n ? n : 1));
        fflush(stdout);
        if (getenv("SHIM_END_EXIT")) return 0;
        for (;;) pause();
    }
    if (!strcmp(c, "pinned_loop")) {
        long n = atol(argv[1]);
        for (long i = 0; i < n; i++) {
            void *h = NULL;
            CHECK(cudaMallocHost(&h, 1024));
            CHECK(cudaFreeHost(h));
            void *p = alloc(3072);
            CHECK(cudaFree(p));
        }
        return 0;
    }
    if (!strcmp(c, "steps")) {
        long n = atol(argv[1]);
        char line[64];
        for (long i = 1; i <= n; i++) {
            void *p = alloc(1024);
            CHECK(cudaFree(p));
            if (i % (n / 4 ? n / 4 : 1) == 0) {
                printf("done %ld\n", i);
                fflush(stdout);
                if (!fgets(line, sizeof line, stdin)) break;
            }
        }
        printf("end\n");
        fflush(stdout);
        for (;;) pause();
    }
    if (!strcmp(c, "segv")) {
        volatile int *p = NULL;
        return *p;
    }
    if (!strcmp(c, "abort")) abort();
    if (!strcmp(c, "_exit")) _exit(4);
    fprintf(stderr, "unknown case %s\n", c);
    return 2;
}
