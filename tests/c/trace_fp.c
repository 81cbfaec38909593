/* Three C frames built with -g -fno-omit-frame-pointer, loaded by tests/trace_capture.rs
 * with dlopen. trace_fp_inner hands its own frame pointer to a Rust callback, which walks
 * the chain (or unwinds with DWARF) and records return addresses; the test checks that
 * they symbolize to these functions at the marked lines. */
#include <stddef.h>
#include <stdint.h>

typedef size_t (*walk_fn)(uintptr_t fp, uint64_t *buf, size_t n);

__attribute__((noinline)) size_t trace_fp_inner(walk_fn walk, uint64_t *buf, size_t n) {
    size_t r = walk((uintptr_t)__builtin_frame_address(0), buf, n); /* LINE_INNER */
    __asm__ volatile("" ::: "memory");
    return r;
}

__attribute__((noinline)) size_t trace_fp_middle(walk_fn walk, uint64_t *buf, size_t n) {
    size_t r = trace_fp_inner(walk, buf, n); /* LINE_MIDDLE */
    __asm__ volatile("" ::: "memory");
    return r;
}

__attribute__((noinline)) size_t trace_fp_outer(walk_fn walk, uint64_t *buf, size_t n) {
    size_t r = trace_fp_middle(walk, buf, n); /* LINE_OUTER */
    __asm__ volatile("" ::: "memory");
    return r;
}
