/* dt_sgemm on oneDNN's sgemm: on this class of CPU (AVX-512) it runs at
 * 150/250 GFLOPS on 1/2 cores with no tuning, where Debian's OpenBLAS
 * mis-detects the core type and reaches 20-36 unless told by environment
 * variables (docs/benchmarks.md has the measurements). */
#include "kernels/kernels.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>

void dt_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    dt_kernels_init();
    if (M == 0 || N == 0) return;
    dnnl_status_t s = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B,
                                 ldb, beta, C, ldc);
    if (s != dnnl_success) {
        // Only argument errors are possible here: a programmer error.
        fprintf(stderr, "dtrain: internal error: dnnl_sgemm status %d (M=%d N=%d K=%d)\n",
                (int)s, M, N, K);
        abort();
    }
}
