/* trace_dlclose LIB_A LIB_B: allocate 1 MiB from LIB_A's lib_a_alloc, dlclose LIB_A, dlopen
 * LIB_B (built from the same source, so it usually lands at LIB_A's old address) and allocate
 * 2 MiB from its lib_b_alloc. Both blocks stay allocated for the exit snapshot.
 * Prints same_base=0|1 and done. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*alloc_fn)(void **, size_t);

static void *base_of(void *fn) {
    Dl_info info;
    return dladdr(fn, &info) ? info.dli_fbase : NULL;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    void *a = dlopen(argv[1], RTLD_NOW);
    if (!a) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    alloc_fn fa = (alloc_fn)dlsym(a, "lib_a_alloc");
    void *p = NULL, *q = NULL;
    if (!fa || fa(&p, 1 << 20) != 0)
        return 1;
    void *base_a = base_of((void *)fa);
    if (dlclose(a) != 0)
        return 1;
    void *b = dlopen(argv[2], RTLD_NOW);
    if (!b) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    alloc_fn fb = (alloc_fn)dlsym(b, "lib_b_alloc");
    if (!fb || fb(&q, 2 << 20) != 0)
        return 1;
    printf("same_base=%d\n", base_of((void *)fb) == base_a);
    printf("done\n");
    return 0;
}
