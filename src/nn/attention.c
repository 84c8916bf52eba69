/* The GPT layer kernels that dtrain/nn.h does not already have: token +
 * position embedding, residual add, and causal multi-head self-attention.
 * Layernorm, GELU, linear and cross-entropy come from layers.c. */
#include "dtrain/gpt.h"
#include "kernels/kernels.h"
#include "nn/rows.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

// ----------------------------------------------------------------------------
// encoder: token + position embedding

void dt_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                        int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const float *e = wte + (size_t)inp[b * T + t] * C, *p = wpe + (size_t)t * C;
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
        }
}

void dt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                         int T, int C) {
    // Two positions may hold the same token, so the scatter into dwte is
    // split over channels, not positions: each thread owns a slice of every
    // row and visits positions in order (deterministic for any thread count).
    if (dwte) {
#pragma omp parallel
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            int lo = (int)((long)C * id / nt), hi = (int)((long)C * (id + 1) / nt);
            for (int i = 0; i < B * T; i++) {
                float *d = dwte + (size_t)inp[i] * C;
                const float *g = dout + (size_t)i * C;
                for (int c = lo; c < hi; c++) d[c] += g[c];
            }
        }
    }
    if (dwpe) {
#pragma omp parallel for schedule(static)
        for (int t = 0; t < T; t++)
            for (int b = 0; b < B; b++) {
                float *d = dwpe + (size_t)t * C;
                const float *g = dout + ((size_t)b * T + t) * C;
#pragma omp simd
                for (int c = 0; c < C; c++) d[c] += g[c];
            }
    }
}

void dt_encoder_split_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B, int T,
                              int C, int v0, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < B * T; i++) {
        float *o = out + (size_t)i * C;
        const float *pe = wpe + (size_t)(i % T) * C;
        if (inp[i] >= v0 && inp[i] < v0 + V) {
            const float *we = wte + (size_t)(inp[i] - v0) * C;
            for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
        } else {
            memset(o, 0, sizeof(float) * C);
        }
    }
}

void dt_encoder_split_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B, int T,
                               int C, int v0, int V) {
    for (int i = 0; i < B * T; i++)
        if (inp[i] >= v0 && inp[i] < v0 + V) {
            float *d = dwte + (size_t)(inp[i] - v0) * C;
            for (int c = 0; c < C; c++) d[c] += dout[(size_t)i * C + c];
        }
    dt_encoder_backward(NULL, dwpe, dout, inp, B, T, C);
}

// ----------------------------------------------------------------------------
// residual

void dt_residual_forward(float *out, const float *a, const float *b, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void dt_residual_backward(float *da, float *db, const float *dout, size_t N) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < N; i++) {
        if (da) da[i] += dout[i];
        if (db) db[i] += dout[i];
    }
}

// ----------------------------------------------------------------------------
// causal multi-head self-attention
//
// For one (batch b, head h) with q, k, v the [T, hs] slices of qkv (row
// stride 3C):
//   forward   S = q k^T / sqrt(hs)          GEMM  [T,hs] x [hs,T]
//             A = causal_softmax(S)         row t over columns 0..t, in place
//             y = A v                       GEMM  [T,T] x [T,hs] -> out (stride C)
//   backward  dA = dy v^T                   GEMM
//             dv += A^T dy                  GEMM
//             dS = A * (dA - rowsum(dA*A)) / sqrt(hs)   (softmax backward)
//             dq += dS k,  dk += dS^T q     GEMMs
// Only A (the att buffer) is kept for backward. The (b, h) pairs are spread
// over the threads; each GEMM then runs on one thread (dt_sgemm does so
// inside a parallel region), which for T and hs of 64..1024 is the better
// split than threading each small GEMM.
//
// Causality is also used to skip work: rows are taken in blocks of ATT_BLOCK
// and block i only multiplies against the first (i+1)*ATT_BLOCK keys and
// values, so the score-sized GEMMs do a little over half of the T x T
// square (5/8 of it at T = 256). Entries of A right of the diagonal are
// stored as zeros.

#define ATT_BLOCK 64

// In a low precision the GEMMs would round their operands at every call: q,
// k and v once per row block that reads them, a block of A or dS once per
// GEMM. Here each operand is rounded once (dt_kernels_operand16, into this
// thread's slots: q, k, v and dy of the (b, h) pair, a block of A, a block
// of dS) and the GEMMs take it as it is (dt_gemm16): the same rounding, the
// same results bit for bit. In fp32 the operands are read where they lie.
enum { SQ, SK, SV, SDY, SA, SD };

// X[rows, cols] (row stride ld) as a GEMM operand in t: X itself in fp32,
// else rounded into slot; *ldo is the row stride to pass.
static const void *operand(dt_dtype t, int slot, const float *X, int rows, int cols, int ld, int *ldo) {
    *ldo = t == DT_F32 ? ld : cols;
    return t == DT_F32 ? (const void *)X : dt_kernels_operand16(slot, X, rows, cols, ld, t);
}

// Rows r0.. of an operand made by operand().
static const void *rows_of(dt_dtype t, const void *X, int r0, int ld) {
    return t == DT_F32 ? (const void *)((const float *)X + (size_t)r0 * ld)
                       : (const void *)((const uint16_t *)X + (size_t)r0 * ld);
}

static void mm(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda,
               const void *B, int ldb, float beta, float *C, int ldc) {
    if (t == DT_F32) dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else dt_gemm16(t, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    dt_dtype pt = dt_kernels_precision();
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *A = att + ((size_t)b * NH + h) * T * T;
            int lq, lk, lv, la;
            const void *q16 = operand(pt, SQ, q, T, hs, C3, &lq), *k16 = operand(pt, SK, k, T, hs, C3, &lk),
                       *v16 = operand(pt, SV, v, T, hs, C3, &lv);
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int nr = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, nk = r0 + nr;  // rows, keys
                float *Ab = A + (size_t)r0 * T;
                mm(pt, 0, 1, nr, nk, hs, scale, rows_of(pt, q16, r0, lq), lq, k16, lk, 0.0f, Ab, T);
                for (int t = r0; t < r0 + nr; t++) {
                    float *a = A + (size_t)t * T;
                    float mx = -FLT_MAX;
                    for (int j = 0; j <= t; j++) mx = a[j] > mx ? a[j] : mx;
                    float s = 0.0f;
                    for (int j = 0; j <= t; j++) {
                        a[j] = dt_att_exp(a[j], mx);
                        s += a[j];
                    }
                    float inv = 1.0f / s;
                    for (int j = 0; j <= t; j++) a[j] *= inv;
                    for (int j = t + 1; j < T; j++) a[j] = 0.0f;
                }
                const void *a16 = operand(pt, SA, Ab, nr, nk, T, &la);
                mm(pt, 0, 0, nr, hs, nk, 1.0f, a16, la, v16, lv, 0.0f, out + ((size_t)b * T + r0) * C + h * hs, C);
            }
        }
}

void dt_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    dt_dtype pt = dt_kernels_precision();
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t qo = (size_t)b * T * C3 + h * hs;
            const float *q = qkv + qo, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + qo, *dk = dq + C, *dv = dq + 2 * C;
            const float *A = att + ((size_t)b * NH + h) * T * T;
            float *D = datt + ((size_t)b * NH + h) * T * T;
            const float *dy = dout + (size_t)b * T * C + h * hs;
            int lq, lk, lv, ly, la, ld;
            const void *q16 = operand(pt, SQ, q, T, hs, C3, &lq), *k16 = operand(pt, SK, k, T, hs, C3, &lk),
                       *v16 = operand(pt, SV, v, T, hs, C3, &lv), *dy16 = operand(pt, SDY, dy, T, hs, C, &ly);
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int nr = T - r0 < ATT_BLOCK ? T - r0 : ATT_BLOCK, nk = r0 + nr;
                const float *Ab = A + (size_t)r0 * T;
                const void *dyb = rows_of(pt, dy16, r0, ly);
                float *Db = D + (size_t)r0 * T;
                mm(pt, 0, 1, nr, nk, hs, 1.0f, dyb, ly, v16, lv, 0.0f, Db, T);  // dA = dy v^T
                const void *a16 = operand(pt, SA, Ab, nr, nk, T, &la);
                mm(pt, 1, 0, nk, hs, nr, 1.0f, a16, la, dyb, ly, 1.0f, dv, C3);  // dv += A^T dy
                for (int t = r0; t < r0 + nr; t++) {
                    float *d = D + (size_t)t * T;
                    const float *a = A + (size_t)t * T;
                    float s = 0.0f;
                    for (int j = 0; j <= t; j++) s += d[j] * a[j];
                    for (int j = 0; j <= t; j++) d[j] = dt_att_grad(a[j], d[j], s, scale);
                    for (int j = t + 1; j < nk; j++) d[j] = 0.0f;
                }
                const void *d16 = operand(pt, SD, Db, nr, nk, T, &ld);
                mm(pt, 0, 0, nr, hs, nk, 1.0f, d16, ld, k16, lk, 1.0f, dq + (size_t)r0 * C3, C3);               // dq += dS k
                mm(pt, 1, 0, nk, hs, nr, 1.0f, d16, ld, rows_of(pt, q16, r0, lq), lq, 1.0f, dk, C3);  // dk += dS^T q
            }
        }
}
