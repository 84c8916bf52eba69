/* Compute kernels shared by the layers. The GEMM library (oneDNN) sits
 * behind dt_sgemm alone: nothing else in the tree includes its header. */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include <stddef.h>

/* Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, where
 * op(X) is X or X^T as ta/tb are 0 or 1, and lda/ldb/ldc are row strides of
 * the matrices as stored. Uses all compute threads, or one when called from
 * inside an OpenMP parallel region. Deterministic for a fixed thread count. */
void dt_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

#endif
