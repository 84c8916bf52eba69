/* dtrain's row-major GEMM as cuBLAS(Lt)'s column-major one (gemm_args.h). */
#include "gpu/gemm_args.h"

int dt_gemm_colmajor(int ta, int tb, int M, int N, int K, int lda, int ldb, int ldc, dt_cm_gemm *g) {
    // dtrain's row lengths: op(A) is [M,K], so A is stored [M,K] (ta = 0) or
    // [K,M]; op(B) is [K,N], B stored [K,N] or [N,K]; C [M,N].
    int a_row = ta ? M : K, b_row = tb ? K : N;
    if (M < 0 || N < 0 || K < 0 || lda < 1 || ldb < 1 || ldc < 1 || lda < a_row || ldb < b_row || ldc < N)
        return -1;
    *g = (dt_cm_gemm){
        .b_first = 1,
        .transa = tb ? 1 : 0,
        .transb = ta ? 1 : 0,
        .m = N,
        .n = M,
        .k = K,
        .lda = ldb,
        .ldb = lda,
        .ldc = ldc,
        // Column-major, a stored row-major matrix [r, c] is [c, r].
        .a = {b_row, tb ? N : K, ldb},
        .b = {a_row, ta ? K : M, lda},
        .c = {N, M, ldc},
    };
    return 0;
}
