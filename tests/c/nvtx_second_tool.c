/* A second NVTX injection library (a stand-in for Nsight Systems' injection): counts the
 * range calls it receives and writes "pushes pops starts ends" to $SECOND_TOOL_REPORT at
 * exit. Its start ids are 1000 + n, so a caller can see that the program got this tool's ids.
 * Declares the NVTX v3 injection types itself (nvtxDetail/nvtxTypes.h) to stay one file. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*Fn)(void);
typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, Fn ***table, unsigned *size);
} Callbacks;

static int pushes, pops, starts, ends;

static int push_a(const char *m) { (void)m; return pushes++; }
static int push_ex(const void *a) { (void)a; return pushes++; }
static int pop(void) { pops++; return 0; }
static unsigned long long start_a(const char *m) { (void)m; return 1000 + ++starts; }
static void end(unsigned long long id) { (void)id; ends++; }
static int domain_push(const void *d, const void *a) { (void)d; (void)a; return pushes++; }
static int domain_pop(const void *d) { (void)d; pops++; return 0; }

static void report(void) {
    const char *p = getenv("SECOND_TOOL_REPORT");
    FILE *f = p ? fopen(p, "w") : NULL;
    if (!f)
        return;
    fprintf(f, "%d %d %d %d\n", pushes, pops, starts, ends);
    fclose(f);
}

int InitializeInjectionNvtx2(const void *(*get_export_table)(unsigned)) {
    const Callbacks *cb = (const Callbacks *)get_export_table(1);
    Fn **t = NULL;
    unsigned n = 0;
    if (!cb || !cb->GetModuleFunctionTable(1, &t, &n) || n < 12)
        return 0;
    *t[5] = (Fn)start_a;
    *t[7] = (Fn)end;
    *t[8] = (Fn)push_ex;
    *t[9] = (Fn)push_a;
    *t[11] = (Fn)pop;
    if (!cb->GetModuleFunctionTable(5, &t, &n) || n < 6)
        return 0;
    *t[4] = (Fn)domain_push;
    *t[5] = (Fn)domain_pop;
    atexit(report);
    return 1;
}
