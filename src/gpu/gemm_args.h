/* dtrain's row-major GEMM as cuBLAS(Lt)'s column-major one: plain C, in
 * every build (tests/test_gpu_host.c checks it without a GPU).
 *
 * dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) computes
 * C[M,N] = alpha op(A) op(B) + beta C, each matrix row-major with its row
 * stride. A row-major matrix with stride ld is, read column-major with the
 * same ld, its transpose; so C^T[N,M] = op(B)^T op(A)^T is the same call in
 * column-major terms with the operands swapped: cuBLAS's A is dtrain's B
 * (transa = tb), cuBLAS's B is dtrain's A (transb = ta), m = N, n = M,
 * k = K, and every leading dimension is the row stride it was. */
#ifndef DT_GPU_GEMM_ARGS_H
#define DT_GPU_GEMM_ARGS_H

#ifdef __cplusplus
extern "C" {
#endif

/* One column-major operand as cublasLtMatrixLayoutCreate takes it: rows,
 * cols and ld of the stored matrix (before its op). */
typedef struct {
    int rows, cols, ld;
} dt_cm_layout;

/* The column-major call: C = alpha op(first) op(second) + beta C, with
 * first = dtrain's B and second = dtrain's A (b_first says so: always 1). */
typedef struct {
    int b_first;
    int transa, transb;  // 0: N, 1: T (of first, of second)
    int m, n, k;
    int lda, ldb, ldc;
    dt_cm_layout a, b, c;  // first's, second's and C's stored layouts
} dt_cm_gemm;

/* The column-major arguments of dt_sgemm(ta, tb, M, N, K, .., lda, .., ldb,
 * .., ldc). Returns 0, or -1 when a size is negative or a leading
 * dimension is shorter than its row (lda < K or M as ta says, ...). */
int dt_gemm_colmajor(int ta, int tb, int M, int N, int K, int lda, int ldb, int ldc, dt_cm_gemm *out);

#ifdef __cplusplus
}
#endif
#endif
