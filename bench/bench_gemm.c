/* fp32 GEMM candidates on this machine: oneDNN's dnnl_sgemm (what dtrain
 * uses, through dt_sgemm) against OpenBLAS's cblas_sgemm, loaded at run time
 * if present (Debian's libopenblas0), in the same run. Run OpenBLAS's rows
 * again with OPENBLAS_CORETYPE=SkylakeX to see what a hand-set core type
 * gives; dtrain's choice must not need such settings.
 *
 *   bench_gemm [--threads T] [--precision fp32|bf16|fp16] [--json]
 *
 * Shapes: square 1024 and 2048, the MLP/CNN training GEMMs (batch 256 /
 * 64) and the GPTs' largest (the MLP block's, B x T rows). --precision
 * runs dt_sgemm in that precision (the operands' conversion included;
 * OpenBLAS's rows stay fp32). First it measures the core's fp32 FMA peak
 * (independent FMAs on registers, the widest vectors the CPU runs, per
 * dt_cpu_get: AVX-512 or AVX2) on the same threads, and gives every GEMM
 * as a share of it. The last column is dtrain's portable GEMM (what a build
 * without oneDNN runs; fp32). */
#include "dtrain/core.h"
#include "kernels/kernels.h"

#include <dlfcn.h>
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                               int, float, float *, int);
enum { RowMajor = 101, NoTrans = 111, Trans = 112 };

static double time_gemm(int which, cblas_sgemm_fn ob, int ta, int tb, int M, int N, int K, const float *A,
                        const float *B, float *C) {
    int lda = ta ? M : K, ldb = tb ? K : N;
    int reps = 0;
    double t0 = dt_now(), t = 0;
    for (int warm = 1; warm >= 0; warm--) {
        reps = 0;
        t0 = dt_now();
        do {
            if (which == 0) dt_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
            else if (which == 2) dt_sgemm_portable(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
            else ob(RowMajor, ta ? Trans : NoTrans, tb ? Trans : NoTrans, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
            reps++;
            t = dt_now() - t0;
        } while (t < (warm ? 0.1 : 0.5));
    }
    return 2.0 * M * N * K * reps / t / 1e9;
}

// 12 chains of dependent FMAs: enough independent work to cover the FMA
// latency of 2 pipes (4 cycles x 2) with room to spare. Returns the FLOPs done.
#define PEAK_CHAINS 12
#define PEAK_LOOP(V, FMA, SET)                                                  \
    V acc[PEAK_CHAINS];                                                         \
    for (int j = 0; j < PEAK_CHAINS; j++) acc[j] = SET(1.0f + j * 1e-3f);        \
    const V a = SET(0.999999f), b = SET(1e-7f);                                 \
    for (long i = 0; i < iters; i++)                                            \
        for (int j = 0; j < PEAK_CHAINS; j++) acc[j] = FMA(acc[j], a, b);       \
    float out[16] = {0};                                                        \
    for (int j = 1; j < PEAK_CHAINS; j++) acc[0] = acc[0] + acc[j];             \
    __builtin_memcpy(out, &acc[0], sizeof acc[0]);                              \
    sink += out[0];

static volatile float sink;
__attribute__((target("avx512f"))) static double peak_avx512(long iters) {
    PEAK_LOOP(__m512, _mm512_fmadd_ps, _mm512_set1_ps)
    return 2.0 * 16 * PEAK_CHAINS * (double)iters;
}
__attribute__((target("avx2,fma"))) static double peak_avx2(long iters) {
    PEAK_LOOP(__m256, _mm256_fmadd_ps, _mm256_set1_ps)
    return 2.0 * 8 * PEAK_CHAINS * (double)iters;
}

// GFLOPS of `threads` threads each running the FMA loop, best of 3.
static double fma_peak(int threads, const char **isa) {
    int wide = dt_cpu_get()->isa >= DT_ISA_AVX512;
    *isa = wide ? "AVX-512" : "AVX2";
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double flops = 0, t0 = dt_now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
        flops += wide ? peak_avx512(20000000) : peak_avx2(20000000);
        double g = flops / (dt_now() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

int main(int argc, char **argv) {
    int threads = 1, json = 0;
    const char *prec = "fp32";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) prec = argv[++i];
        else if (!strcmp(argv[i], "--json")) json = 1;
        else {
            fprintf(stderr, "usage: bench_gemm [--threads T] [--precision fp32|bf16|fp16] [--json]\n");
            return 2;
        }
    }
    dt_set_threads(threads);
    dt_kernels_set_precision(!strcmp(prec, "bf16") ? DT_BF16 : !strcmp(prec, "fp16") ? DT_F16 : DT_F32);
    void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    cblas_sgemm_fn ob = h ? (cblas_sgemm_fn)dlsym(h, "cblas_sgemm") : NULL;
    if (h) {
        void (*set)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
        if (set) set(threads);
    }
    const char *core = getenv("OPENBLAS_CORETYPE");
    static const struct { const char *name; int ta, tb, M, N, K; } shapes[] = {
        {"square-1024", 0, 0, 1024, 1024, 1024},
        {"square-2048", 0, 0, 2048, 2048, 2048},
        {"gpt-small-fc 2048x1536x384", 0, 1, 2048, 1536, 384},
        {"gpt2-124m-fc 256x3072x768", 0, 1, 256, 3072, 768},
        {"gpt2-124m-fcproj-dw 768x3072x256", 1, 0, 768, 3072, 256},
        {"mlp-fwd 256x1024x1024", 0, 1, 256, 1024, 1024},
        {"mlp-dw 1024x1024x256", 1, 0, 1024, 1024, 256},
        {"cnn-conv2-fwd 64x12544x800", 0, 0, 64, 12544, 800},
        {"cnn-conv2-dcol 800x12544x64", 1, 0, 800, 12544, 64},
    };
    size_t maxn = 800u * 12544u;
    float *A = malloc(sizeof(float) * maxn), *B = malloc(sizeof(float) * maxn), *C = malloc(sizeof(float) * maxn);
    dt_rng r;
    dt_rng_seed(&r, 1);
    for (size_t i = 0; i < maxn; i++) A[i] = dt_rng_uniform(&r), B[i] = dt_rng_uniform(&r);
    const dt_cpu *cpu = dt_cpu_get();
    const char *isa;
    double peak = fma_peak(threads, &isa);
    if (json)
        printf("{\"cpu\": \"%s\", \"family\": %d, \"model\": %d, \"threads\": %d, \"fma_peak_gflops\": %.1f, "
               "\"peak_isa\": \"%s\"}\n", cpu->name, cpu->family, cpu->model, threads, peak, isa);
    else
        printf("# CPU: %s (family %d model %d), %d thread%s, dtrain in %s: fp32 FMA peak %.1f GFLOPS (%s)\n"
               "%-30s %8s %5s %14s %5s %9s %5s\n", cpu->name, cpu->family, cpu->model, threads, threads > 1 ? "s" : "", prec,
               peak, isa, "shape (MxNxK)", "oneDNN", "peak", ob ? "OpenBLAS" : "(no OpenBLAS)", "peak", "portable", "peak");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        double g0 = time_gemm(0, NULL, shapes[s].ta, shapes[s].tb, shapes[s].M, shapes[s].N, shapes[s].K, A, B, C);
        double g1 = ob ? time_gemm(1, ob, shapes[s].ta, shapes[s].tb, shapes[s].M, shapes[s].N, shapes[s].K, A, B, C) : 0;
        double g2 = time_gemm(2, NULL, shapes[s].ta, shapes[s].tb, shapes[s].M, shapes[s].N, shapes[s].K, A, B, C);
        if (json) {
            printf("{\"shape\": \"%s\", \"threads\": %d, \"impl\": \"onednn\", \"precision\": \"%s\", \"gflops\": %.1f, "
                   "\"of_peak\": %.3f}\n", shapes[s].name, threads, prec, g0, g0 / peak);
            if (ob)
                printf("{\"shape\": \"%s\", \"threads\": %d, \"impl\": \"openblas\", \"coretype\": \"%s\", \"gflops\": %.1f, "
                       "\"of_peak\": %.3f}\n", shapes[s].name, threads, core ? core : "auto", g1, g1 / peak);
            printf("{\"shape\": \"%s\", \"threads\": %d, \"impl\": \"portable\", \"gflops\": %.1f, \"of_peak\": %.3f}\n",
                   shapes[s].name, threads, g2, g2 / peak);
        } else {
            printf("%-30s %8.1f %4.0f%% %14.1f %4.0f%% %9.1f %4.0f%%\n", shapes[s].name, g0, 100 * g0 / peak, g1,
                   100 * g1 / peak, g2, 100 * g2 / peak);
        }
    }
    free(A), free(B), free(C);
    return 0;
}
