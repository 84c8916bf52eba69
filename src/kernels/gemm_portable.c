/* A portable fp32 GEMM in plain C, for builds without oneDNN (kernels.h):
 * row-major as dnnl_sgemm, C = alpha op(A) op(B) + beta C. op(B) is
 * packed a panel of KB x NB at a time into a contiguous buffer, and each
 * row of C takes its panel's products in a loop over k then j that the
 * compiler vectorises, summed apart and then added to C (so that C's old
 * value is added once a panel: accumulating twice gives twice); rows go to
 * the OpenMP threads (outside a parallel region). Far from oneDNN's speed
 * (a few times slower), always there, and compiled in every build so that
 * its tests compare it with oneDNN's. */
#include "kernels/kernels.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

enum { KB = 256, NB = 512 };

static void scale_c(int M, int N, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

// op(B)[k0 .. k0+kn) x [j0 .. j0+jn) into P (kn x jn, row-major).
static void pack_b(float *P, int tb, const float *B, int ldb, int k0, int kn, int j0, int jn) {
    for (int k = 0; k < kn; k++)
        for (int j = 0; j < jn; j++)
            P[(size_t)k * jn + j] = tb ? B[(size_t)(j0 + j) * ldb + k0 + k] : B[(size_t)(k0 + k) * ldb + j0 + j];
}

void dt_sgemm_portable(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (beta != 1.0f) scale_c(M, N, beta, C, ldc);
    if (K <= 0 || alpha == 0.0f) return;
    float *P = malloc(sizeof(float) * KB * NB);
    if (!P) {
        fprintf(stderr, "dtrain: out of memory for a GEMM panel (%zu bytes)\n", sizeof(float) * KB * NB);
        abort();
    }
    for (int j0 = 0; j0 < N; j0 += NB) {
        int jn = N - j0 < NB ? N - j0 : NB;
        for (int k0 = 0; k0 < K; k0 += KB) {
            int kn = K - k0 < KB ? K - k0 : KB;
            pack_b(P, tb, B, ldb, k0, kn, j0, jn);
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && (size_t)M * jn * kn > 65536)
            for (int i = 0; i < M; i++) {
                float *c = C + (size_t)i * ldc + j0, acc[NB] = {0};
                for (int k = 0; k < kn; k++) {
                    float a = alpha * (ta ? A[(size_t)(k0 + k) * lda + i] : A[(size_t)i * lda + k0 + k]);
                    const float *p = P + (size_t)k * jn;
                    for (int j = 0; j < jn; j++) acc[j] += a * p[j];
                }
                for (int j = 0; j < jn; j++) c[j] += acc[j];  // (C's old value added once)
            }
        }
    }
    free(P);
}
