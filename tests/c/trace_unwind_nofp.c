/* Three C frames built WITHOUT frame pointers (-O2 -fomit-frame-pointer), loaded by
 * tests/trace_unwind_matches_libgcc.rs with dlopen after the process's first capture.
 * unwind_c_inner zeroes rbp before calling back into Rust, so no frame-pointer chain
 * survives below it: only the .eh_frame rules can walk out through these frames. */
#include <stddef.h>
#include <stdint.h>

typedef size_t (*cb_fn)(void *ctx);

__attribute__((noinline)) size_t unwind_c_inner(cb_fn cb, void *ctx) {
    volatile uint64_t pad[5];
    pad[0] = 1;
    __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
    size_t r = cb(ctx);
    __asm__ volatile("" ::: "memory");
    return r + pad[0] - 1;
}

__attribute__((noinline)) size_t unwind_c_middle(cb_fn cb, void *ctx, int k) {
    /* A variable-size frame: its CFA rule differs from inner's. */
    volatile char *p = __builtin_alloca(16 + (size_t)k);
    p[0] = 0;
    size_t r = unwind_c_inner(cb, ctx);
    __asm__ volatile("" ::: "memory");
    return r + (size_t)p[0];
}

__attribute__((noinline)) size_t unwind_c_outer(cb_fn cb, void *ctx) {
    size_t r = unwind_c_middle(cb, ctx, 3);
    __asm__ volatile("" ::: "memory");
    return r;
}
