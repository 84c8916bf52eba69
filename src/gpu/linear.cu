/* The linear layer on the GPU (gpu.h), dt_linear_*'s row-major contract,
 * by cuBLASLt with its epilogues where they fit: the bias (BIAS), the bias
 * and GELU with its input kept (GELU_AUX_BIAS), GELU's gradient (DGELU).
 * In column-major terms (gemm_args.h) out[B,OC] is [OC,B]: a bias of OC is
 * the epilogue's vector of m, and pre [B,OC] the aux matrix with ld OC,
 * which cuBLASLt wants a multiple of 8. Where an epilogue does not fit (or
 * cuBLASLt has no algorithm for it), the plain GEMM and the kernels of
 * layers.cu do the same. The bias's gradient is always
 * dt_gpu_bias_backward's (column sums in a fixed order). Nothing here has run
 * on a GPU yet (docs/gpu.md). */
#include "gpu/cuda_check.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"
#include "gpu/lt.h"
#include "nn/rows.h"

#include <stdint.h>

// dpre[i] = gelu'(pre[i]) dpre[i]: the DGELU epilogue's work, where it is not.
__global__ static void dgelu_kernel(float *dpre, const float *pre, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dpre[i] = dt_gelu_grad(pre[i]) * dpre[i];
}

// out (+)= inp w^T, operands of type t, through cuBLASLt with `epi` (bias,
// aux as lt.h says); *found 0 when it has no algorithm (nothing run).
static dt_status linear_lt(float *out, const void *inp, const void *w, int B, int C, int OC, dt_dtype t,
                           cublasLtEpilogue_t epi, const float *bias, float *aux, int *found) {
    dt_cm_gemm g;
    if (dt_gemm_colmajor(0, 1, B, OC, C, C, C, OC, &g) != 0)
        return dt_error(DT_ERR_ARG, "GPU linear: B %d, C %d, OC %d", B, C, OC);
    dt_lt_op o = {&g, dt_lt_type(t), epi, bias, aux, OC, 1.0f, 0.0f, w, inp, out, 1, 0, 0, 0};
    return dt_gpu_lt_run(&o, found);
}

// Whether products of type t are not exact fp32 anyway (16-bit operands,
// or TF32 on): where cuBLASLt's own GELU may stand in for nn/rows.h's.
static int approx(dt_dtype t) { return t != DT_F32 || dt_gpu_tf32(); }

// Whether p is aligned to 16 bytes (what the epilogues' vectors and aux
// matrix are given in dtrain's blocks; cuBLASLt asks no less of them).
static int aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// C = A op(B) (tb: B transposed; alpha 1, beta 0), operands of type t:
// dt_gpu_sgemm in fp32, dt_gpu_gemm16 in 16 bits.
static dt_status gemm_t(dt_dtype t, int tb, int M, int N, int K, const void *A, int lda, const void *B, int ldb,
                        float *C, int ldc) {
    if (t == DT_F32)
        return dt_gpu_sgemm(0, tb, M, N, K, 1.0f, (const float *)A, lda, (const float *)B, ldb, 0.0f, C, ldc);
    return dt_gpu_gemm16(t, 0, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

// y = inp w^T + b: BIAS's epilogue, else the GEMM and the bias's kernel.
static dt_status linear(float *y, const void *inp, const void *w, const float *b, int B, int C, int OC, dt_dtype t) {
    if (b && C > 0 && aligned16(b)) {
        int found = 0;
        dt_status st = linear_lt(y, inp, w, B, C, OC, t, CUBLASLT_EPILOGUE_BIAS, b, NULL, &found);
        if (st != DT_OK || found) return st;
    }
    dt_status st = gemm_t(t, 1, B, OC, C, inp, C, w, C, y, OC);
    if (st == DT_OK && b) st = dt_gpu_bias_forward(y, b, (size_t)B, OC);
    return st;
}

dt_status dt_gpu_linear_forward(float *out, float *pre, const void *inp, const void *w, const float *b, int B, int C,
                                int OC, dt_dtype t) {
    if (B <= 0 || OC <= 0) return DT_OK;
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "GPU linear: operands of type %s", dt_dtype_name(t));
    if (!pre) return linear(out, inp, w, b, B, C, OC, t);
    // (exact fp32, TF32 off, keeps nn/rows.h's GELU: the comparisons with the CPU are made so)
    if (approx(t) && OC % 8 == 0 && C > 0 && aligned16(pre) && (!b || aligned16(b))) {
        int found = 0;
        dt_status st = linear_lt(out, inp, w, B, C, OC, t,
                                 b ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, b, pre, &found);
        if (st != DT_OK || found) return st;
    }
    dt_status st = linear(pre, inp, w, b, B, C, OC, t);
    return st == DT_OK ? dt_gpu_gelu_forward(out, pre, (size_t)B * OC, NULL, DT_F32) : st;
}

dt_status dt_gpu_linear_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, int B, int C, int OC) {
    dt_status st = DT_OK;
    if (dinp) st = dt_gpu_sgemm(0, 0, B, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);  // dout w
    if (st == DT_OK && dw) st = dt_gpu_sgemm(1, 0, OC, C, B, 1.0f, dout, OC, inp, C, 1.0f, dw, C);  // dout^T inp
    if (st == DT_OK && db && B > 0) st = dt_gpu_bias_backward(db, dout, (size_t)B, OC, NULL, DT_F32);
    return st;
}

// dpre = gelu'(pre) (dout w), operands of type t: the GEMM [B,OC] x
// [OC,C] with the DGELU epilogue (aux pre, ld C) where the products are
// not exact fp32 (as the forward's GELU), or the GEMM and dgelu_kernel.
dt_status dt_gpu_linear_dgelu(float *dpre, const void *dout, const void *w, const float *pre, int B, int C, int OC,
                              dt_dtype t) {
    if (B <= 0 || C <= 0) return DT_OK;
    if (approx(t) && C % 8 == 0 && OC > 0 && aligned16(pre)) {
        dt_cm_gemm g;
        if (dt_gemm_colmajor(0, 0, B, C, OC, OC, C, C, &g) != 0)
            return dt_error(DT_ERR_ARG, "GPU linear backward: B %d, C %d, OC %d", B, C, OC);
        dt_lt_op o = {&g, dt_lt_type(t), CUBLASLT_EPILOGUE_DGELU, NULL, (float *)pre, C, 1.0f, 0.0f, w, dout, dpre,
                      1, 0, 0, 0};
        int found = 0;
        dt_status st = dt_gpu_lt_run(&o, &found);
        if (st != DT_OK || found) return st;
    }
    dt_status st = gemm_t(t, 0, B, C, OC, dout, OC, w, C, dpre, C);
    if (st != DT_OK) return st;
    size_t n = (size_t)B * C;
    DT_RUN(dgelu_kernel, dt_launch_blocks(n, DT_THREADS), DT_THREADS, 0, dpre, pre, n);
    DT_LAUNCHED(dgelu_kernel);
    return DT_OK;
}
