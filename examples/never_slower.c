/* never_slower: one cell of the "never slower" matrix (scripts/never-slower.sh): a program
 * that makes PAIRS cudaMalloc+cudaFree pairs of SIZE bytes, split over THREADS threads, while
 * STREAMS idle non-blocking streams exist. Run without and with the shim preloaded, on
 * simcuda under a latency profile (SIMCUDA_LATENCY=cuda,virtual): the script adds the CPU
 * time of the program's own threads, printed here, to simcuda's modelled time from its
 * report (the process's CPU time, simcuda's stream workers included, is printed too).
 *
 * usage: never_slower -s SIZE -S STREAMS -t THREADS -n PAIRS
 * output: never_slower size=S streams=K threads=T pairs=N program_cpu_ns=C process_cpu_ns=P
 * Builds with `cc` against simcuda's headers and with `nvcc` against the real toolkit.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static size_t size = 512;
static long per_thread_pairs;
static int failed;
static long long thread_cpu_ns; /* CPU time of the loop threads, summed */

static long long thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *work(void *arg) {
    (void)arg;
    for (long i = 0; i < per_thread_pairs; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, size) != cudaSuccess || cudaFree(p) != cudaSuccess) {
            __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
            return NULL;
        }
    }
    __atomic_add_fetch(&thread_cpu_ns, thread_cpu(), __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv) {
    int streams = 0, threads = 1, c;
    long pairs = 10000;
    while ((c = getopt(argc, argv, "s:S:t:n:")) != -1) {
        switch (c) {
        case 's': size = strtoull(optarg, NULL, 10); break;
        case 'S': streams = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'n': pairs = atol(optarg); break;
        default:
            fprintf(stderr, "usage: never_slower -s SIZE -S STREAMS -t THREADS -n PAIRS\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 64 || streams < 0 || streams > 64 || pairs < threads) {
        fprintf(stderr, "never_slower: 1-64 threads, 0-64 streams, at least one pair a thread\n");
        return 2;
    }
    cudaStream_t s[64];
    for (int i = 0; i < streams; i++) {
        if (cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "never_slower: cudaStreamCreateWithFlags failed\n");
            return 1;
        }
    }
    per_thread_pairs = pairs / threads;
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < streams; i++) cudaStreamDestroy(s[i]);
    if (failed) {
        fprintf(stderr, "never_slower: a cudaMalloc or cudaFree failed\n");
        return 1;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long long cpu_ns = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL +
                       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
    /* The program's own threads: main (start-up, streams, the shim's and simcuda's start,
     * exit) and the loop threads; not simcuda's stream workers, the simulated GPU. */
    long long program_ns = thread_cpu() + thread_cpu_ns;
    printf("never_slower size=%zu streams=%d threads=%d pairs=%ld program_cpu_ns=%lld "
           "process_cpu_ns=%lld\n",
           size, streams, threads, per_thread_pairs * threads, program_ns, cpu_ns);
    return 0;
}
