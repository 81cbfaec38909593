/* vector_add: a small CUDA runtime program (the same source builds against NVIDIA's toolkit).
 * It adds two vectors "on the device" in stream order — the add runs as a host function on
 * a stream, standing in for a kernel — copies the result back and checks it. Prints
 * "vector_add: OK n=<n> sum=<sum>" on success. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s failed: %s (%s)\n", #x, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
    return 1; } } while (0)

struct add_args { const float *a, *b; float *c; size_t n; };

static void add(void *p) {
    struct add_args *x = (struct add_args *)p;
    for (size_t i = 0; i < x->n; i++) x->c[i] = x->a[i] + x->b[i];
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 1 << 20;
    size_t bytes = n * sizeof(float);
    float *ha, *hb, *hc;
    CHECK(cudaMallocHost((void **)&ha, bytes));
    CHECK(cudaMallocHost((void **)&hb, bytes));
    hc = (float *)malloc(bytes);
    if (!hc) return 1;
    for (size_t i = 0; i < n; i++) { ha[i] = (float)i; hb[i] = 2.0f * (float)i; }
    float *da, *db, *dc;
    CHECK(cudaMalloc((void **)&da, bytes));
    CHECK(cudaMalloc((void **)&db, bytes));
    CHECK(cudaMalloc((void **)&dc, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpyAsync(da, ha, bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(db, hb, bytes, cudaMemcpyHostToDevice, s));
    struct add_args args = { da, db, dc, n };
    CHECK(cudaLaunchHostFunc(s, add, &args));
    CHECK(cudaMemcpyAsync(hc, dc, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (hc[i] != 3.0f * (float)i) { fprintf(stderr, "mismatch at %zu\n", i); return 1; }
        sum += hc[i];
    }
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    CHECK(cudaFreeHost(ha));
    CHECK(cudaFreeHost(hb));
    free(hc);
    printf("vector_add: OK n=%zu sum=%.0f\n", n, sum);
    return 0;
}
