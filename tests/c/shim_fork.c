/* fork while other threads allocate.
 *
 *   shim_fork MODE N
 *
 * Two threads loop cudaMalloc/cudaFree (counting their calls) while the main thread forks N
 * times. MODE "exit": each child exits at once (exit(0): the shim's exit snapshot runs);
 * MODE "alloc": each child allocates, frees, writes a snapshot on demand and exits. The
 * parent waits for every child with a deadline of 60 s (a hang detector, not a timing
 * assertion: a healthy child exits in milliseconds); a child still running then is killed
 * and reported as "hung" (and no more children are forked). Finally the threads stop and
 * the parent prints its figures:
 *   children=N ok=K hung=H failed=F
 *   pids=p1,p2,...
 *   mallocs=M (the program's own count) shim_allocs=A shim_allocated=B
 * With SHIM_FORK_HOLD set, each child first prints "held=PID" and waits for a byte on its
 * stdin before it does anything else.
 */
#include "shim_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static atomic_long mallocs;

static void *churn(void *arg) {
    unsigned long seed = (unsigned long)(size_t)arg;
    while (!atomic_load(&stop)) {
        void *p[4];
        for (int i = 0; i < 4; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t size = 512 + (size_t)((seed >> 33) % (3 * MiB));
            CHECK(cudaMalloc(&p[i], size));
            atomic_fetch_add(&mallocs, 1);
        }
        for (int i = 0; i < 4; i++)
            CHECK(cudaFree(p[i]));
    }
    return NULL;
}

static int child_alloc(void) {
    void *p[8];
    for (int i = 0; i < 8; i++)
        if (cudaMalloc(&p[i], (size_t)(i + 1) * 700 * 1024) != cudaSuccess)
            return 2;
    for (int i = 0; i < 8; i++)
        if (cudaFree(p[i]) != cudaSuccess)
            return 3;
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "cushim_dump_snapshot");
    if (dump && dump(NULL) != 0)
        return 4;
    return 0;
}

/* Wait for `pid` up to 60 s. 0: exited with status 0; 1: exited otherwise; 2: hung. */
static int wait_child(pid_t pid) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int status = 0;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
        if (r < 0)
            return 1;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 60) {
            /* Say where it hangs before killing it: every thread's stack (gdb, where it is
             * installed), else each thread's system call and kernel wait channel. */
            char cmd[512];
            snprintf(cmd, sizeof cmd,
                     "gdb -batch -p %d -ex 'thread apply all bt' 2>/dev/null || "
                     "for t in /proc/%d/task/*; do echo \"$t: $(cat $t/syscall) $(cat $t/wchan)\"; done",
                     (int)pid, (int)pid);
            printf("child %d hung; its threads:\n", (int)pid);
            fflush(stdout);
            if (system(cmd) != 0)
                fprintf(stderr, "(could not read the hung child's threads)\n");
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 2;
        }
        usleep(1000);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s exit|alloc N\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "alloc") && strcmp(argv[1], "exit")) {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    /* What this program checks is the shim's fork handling: without it, say so at once
     * rather than wait out the children's deadlines. */
    if (!dlsym(RTLD_DEFAULT, "cushim_memory_stats_json")) {
        fprintf(stderr, "shim_fork needs the shim: no cushim in this process\n");
        return 3;
    }
    int alloc_in_child = strcmp(argv[1], "alloc") == 0;
    int n = atoi(argv[2]);
    /* Initialize before the threads start, so the first fork already has the shim's state. */
    void *warm;
    CHECK(cudaMalloc(&warm, 1024));
    CHECK(cudaFree(warm));
    atomic_fetch_add(&mallocs, 1);

    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, churn, (void *)(size_t)(i + 1));
    /* Let both threads be inside their loops before the first fork. */
    while (atomic_load(&mallocs) < 200)
        usleep(100);

    int ok = 0, hung = 0, failed = 0;
    char pids[4096] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            if (getenv("SHIM_FORK_HOLD")) {
                /* Say the child's pid and wait for a byte on stdin before its first CUDA
                 * call: a test puts something at the child's own file names meanwhile. */
                char go;
                printf("held=%d\n", (int)getpid());
                fflush(stdout);
                if (read(0, &go, 1) != 1)
                    _exit(5);
            }
            exit(alloc_in_child ? child_alloc() : 0);
        }
        used += (size_t)snprintf(pids + used, sizeof pids - used, "%s%d", i ? "," : "", (int)pid);
        switch (wait_child(pid)) {
        case 0: ok++; break;
        case 1: failed++; break;
        default: hung++; break;
        }
        if (hung)
            break; /* one hang is the verdict; do not wait for 29 more */
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    printf("children=%d ok=%d hung=%d failed=%d\n", n, ok, hung, failed);
    printf("pids=%s\n", pids);
    printf("mallocs=%ld shim_allocs=%lld shim_allocated=%lld\n", atomic_load(&mallocs),
           shim_stat("allocation.all.allocated"), shim_stat("allocated_bytes.all.current"));
    return 0;
}
