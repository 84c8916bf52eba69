/* The GPU device's host-side arithmetic, run in every build (no GPU, no
 * CUDA needed): what the CUDA code is given is computed by plain C
 * functions, and these check them.
 *
 *   - gemm_args.h: dtrain's row-major dt_sgemm as cuBLAS's column-major
 *     call. A naive column-major GEMM (what BLAS computes given transa,
 *     transb, m, n, k, lda, ldb, ldc) run on the derived arguments must
 *     equal, bitwise, a naive row-major GEMM (what dt_sgemm computes), for
 *     every transpose, non-square sizes, row strides longer than the rows
 *     (their padding NaN: never read; C's padding never written), alpha and
 *     beta; bad sizes are refused.
 *   - launch.h: the grid of a grid-stride loop covers n elements (n = 0: no
 *     launch; 1; a block's edges; past 2^31 and past the grid's limit), and
 *     one block a row likewise; the sum of squares' and the column sums'
 *     chunks.
 *   - att_plan.h: the GPU attention's GEMMs and row passes, run on naive
 *     host loops (each GEMM in double over its strided batch, the rows as
 *     the CPU's), against the CPU's attention in fp32, bf16 and fp16, odd
 *     shapes: every operand, stride and order of the plan that attention.cu
 *     runs on cuBLASLt; its refusals. */
#include "dtrain/gpt.h"
#include "gpu/att_plan.h"
#include "gpu/gemm_args.h"
#include "gpu/launch.h"
#include "kernels/kernels.h"
#include "nn/rows.h"
#include "testlib.h"

#include <float.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// C[M,N] = alpha op(A) op(B) + beta C, row-major (dt_sgemm's contract), sums
// in double in the order of k.
static void rowmajor_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                         int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                     (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
            float *c = &C[(size_t)i * ldc + j];
            *c = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
}

// BLAS's column-major sgemm: C[m,n] = alpha op(A) op(B) + beta C, element
// (r, c) of a matrix at [r + c ld]; the same order of sums as above.
static void colmajor_blas(int transa, int transb, int m, int n, int k, float alpha, const float *A, int lda,
                          const float *B, int ldb, float beta, float *C, int ldc) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (double)(transa ? A[i * (size_t)lda + p] : A[p * (size_t)lda + i]) *
                     (transb ? B[p * (size_t)ldb + j] : B[j * (size_t)ldb + p]);
            float *c = &C[i + (size_t)j * ldc];
            *c = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
}

static uint64_t g_x = 88172645463325252ull;
static float draw(void) {
    g_x ^= g_x << 13, g_x ^= g_x >> 7, g_x ^= g_x << 17;
    return (float)((double)(g_x >> 11) / 9007199254740992.0 - 0.5);
}

// rows x cols stored with stride ld: values, the padding `pad`.
static float *matrix(int rows, int cols, int ld, float pad) {
    size_t n = (size_t)(rows ? rows : 1) * ld;
    float *m = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) m[i] = (int)(i % ld) < cols ? draw() : pad;
    return m;
}

static void test_gemm_case(int ta, int tb, int M, int N, int K, int pad, float alpha, float beta) {
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    dt_cm_gemm g;
    int ok = dt_gemm_colmajor(ta, tb, M, N, K, lda, ldb, ldc, &g) == 0;
    if (!ok) {
        CHECK(ok, "ta %d tb %d %dx%dx%d: accepted", ta, tb, M, N, K);
        return;
    }
    float *A = matrix(ta ? K : M, ta ? M : K, lda, NAN), *B = matrix(tb ? N : K, tb ? K : N, ldb, NAN);
    float *C = matrix(M, N, ldc, -7.0f);
    size_t nc = (size_t)(M ? M : 1) * ldc;
    float *C2 = malloc(sizeof(float) * nc);
    memcpy(C2, C, sizeof(float) * nc);
    rowmajor_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const float *first = g.b_first ? B : A, *second = g.b_first ? A : B;
    colmajor_blas(g.transa, g.transb, g.m, g.n, g.k, alpha, first, g.lda, second, g.ldb, beta, C2, g.ldc);
    // The layouts Lt is given describe the same storage: op(first) is m x k,
    // op(second) k x n, C m x n, each ld at least its rows.
    int lay = (g.transa ? g.a.cols : g.a.rows) == g.m && (g.transa ? g.a.rows : g.a.cols) == g.k &&
              (g.transb ? g.b.cols : g.b.rows) == g.k && (g.transb ? g.b.rows : g.b.cols) == g.n &&
              g.c.rows == g.m && g.c.cols == g.n && g.a.ld == g.lda && g.b.ld == g.ldb && g.c.ld == g.ldc &&
              g.a.ld >= g.a.rows && g.b.ld >= g.b.rows && g.c.ld >= g.c.rows;
    size_t bad = 0;
    for (size_t i = 0; i < nc; i++) bad += memcmp(&C[i], &C2[i], sizeof(float)) != 0;
    int padded = 1;  // C's padding as it was
    for (size_t i = 0; i < nc; i++) padded &= (int)(i % ldc) < N || C2[i] == -7.0f;
    CHECK(bad == 0 && padded && lay, "ta %d tb %d M %d N %d K %d pad %d alpha %g beta %g: column-major call "
          "(transa %d transb %d m %d n %d k %d lda %d ldb %d ldc %d) = row-major GEMM bitwise: %zu elements "
          "differ, C's padding %s, layouts %s", ta, tb, M, N, K, pad, alpha, beta, g.transa, g.transb, g.m, g.n, g.k,
          g.lda, g.ldb, g.ldc, bad, padded ? "kept" : "WRITTEN", lay ? "consistent" : "WRONG");
    free(A), free(B), free(C), free(C2);
}

static void test_gemm_args(void) {
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {7, 3, 5}, {5, 7, 3}, {1, 9, 4}, {9, 1, 4}, {6, 5, 1}, {17, 33, 65}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
                test_gemm_case(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], s % 3 == 0 ? 0 : (int)s, s % 2 ? 1.0f : 0.5f,
                               s % 4 < 2 ? 0.0f : 1.0f);
    dt_cm_gemm g;
    CHECK(dt_gemm_colmajor(0, 0, 4, 5, 6, 5, 5, 5, &g) == -1, "lda 5 < K 6 refused");
    CHECK(dt_gemm_colmajor(1, 0, 4, 5, 6, 3, 5, 5, &g) == -1, "transposed A: lda 3 < M 4 refused");
    CHECK(dt_gemm_colmajor(0, 1, 4, 5, 6, 6, 5, 5, &g) == -1, "transposed B: ldb 5 < K 6 refused");
    CHECK(dt_gemm_colmajor(0, 0, 4, 5, 6, 6, 5, 4, &g) == -1, "ldc 4 < N 5 refused");
    CHECK(dt_gemm_colmajor(0, 0, -1, 5, 6, 6, 5, 5, &g) == -1, "a negative size refused");
    CHECK(dt_gemm_colmajor(0, 0, 0, 5, 6, 6, 5, 5, &g) == 0 && g.n == 0, "M = 0: an empty call (n = 0)");
}

// A grid-stride loop of `blocks` blocks of `threads` visits every index
// below n once when blocks * threads reaches n, or when the grid is full
// (the stride loop takes the rest); never a block with nothing to do.
static void test_launch(void) {
    const size_t big = (size_t)1 << 31;
    const size_t ns[] = {0, 1, 2, 255, 256, 257, 100003, big - 1, big, big + 7, (size_t)DT_MAX_BLOCKS * DT_THREADS,
                         (size_t)DT_MAX_BLOCKS * DT_THREADS + 1, (size_t)1 << 45, SIZE_MAX};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        size_t n = ns[i];
        unsigned b = dt_launch_blocks(n, DT_THREADS);
        int covers = n == 0 ? b == 0 : (size_t)b * DT_THREADS >= n || b == DT_MAX_BLOCKS;
        int no_idle = b == 0 || (size_t)(b - 1) * DT_THREADS < n;
        size_t want = n / DT_THREADS + (n % DT_THREADS != 0);
        CHECK(covers && no_idle && b >= 1 - (n == 0) && b <= DT_MAX_BLOCKS &&
                  b == (want > DT_MAX_BLOCKS ? DT_MAX_BLOCKS : want),
              "%zu elements: %u blocks of %d", n, b, DT_THREADS);
        unsigned r = dt_launch_rows(n);
        CHECK(r == (n > DT_MAX_BLOCKS ? DT_MAX_BLOCKS : n), "%zu rows: %u blocks", n, r);
    }
    CHECK(dt_launch_blocks(5, 1) == 5 && dt_launch_blocks(5, 4) == 2 && dt_launch_blocks(8, 4) == 2,
          "other block sizes: 5/1 -> 5, 5/4 -> 2, 8/4 -> 2");
    // The kernels' 64-bit index: the last element past 2^31 is reached.
    size_t n = big + 7;
    unsigned b = dt_launch_blocks(n, DT_THREADS);
    size_t last = (size_t)(b - 1) * DT_THREADS + (DT_THREADS - 1);
    CHECK(last >= n - 1 && last - (n - 1) < DT_THREADS, "2^31 + 7 elements: the last thread's index %zu reaches %zu",
          last, n - 1);
    // A 16-bit output's kind (the kernels' H): none, bf16, fp16; another type refused by name.
    char room[2];
    int h[4] = {dt_launch_h16("x", NULL, DT_F32), dt_launch_h16("x", room, DT_BF16), dt_launch_h16("x", room, DT_F16),
                dt_launch_h16("GPU op", room, DT_F32)};
    CHECK(h[0] == 0 && h[1] == 1 && h[2] == 2 && h[3] == -1 &&
              !strcmp(dt_last_error(), "GPU op: a 16-bit output of type F32 (BF16 or F16 only)"),
          "16-bit outputs' kinds: %d %d %d %d (0 1 2 -1), %s", h[0], h[1], h[2], h[3], dt_last_error());
}

// The sum of squares' and the column sums' chunks (launch.h).
static void test_chunks(void) {
    const size_t ns[] = {0, 1, DT_SUMSQ_BLOCK - 1, DT_SUMSQ_BLOCK, DT_SUMSQ_BLOCK + 1, ((size_t)1 << 31) + 7};
    const size_t want[] = {0, 1, 1, 1, 2, ((size_t)1 << 31) / DT_SUMSQ_BLOCK + 1};
    for (int i = 0; i < 6; i++)
        CHECK(dt_sumsq_chunks(ns[i]) == want[i], "sum of squares over %zu: %zu chunks (%zu)", ns[i],
              dt_sumsq_chunks(ns[i]), want[i]);
    // the column sums' chunks of rows: DT_COLSUM_ROWS rows, more where the
    // grid's y would pass DT_MAX_GRID_Y; every row in one chunk
    const size_t N = (size_t)DT_MAX_GRID_Y * DT_COLSUM_ROWS;
    const size_t rows[] = {0, 1, 255, 256, 257, N, N + 1, (size_t)1 << 33};
    const size_t want_rows[] = {256, 256, 256, 256, 256, 256, 257, ((size_t)1 << 33) / DT_MAX_GRID_Y + 1};
    const unsigned want_chunks[] = {0, 1, 1, 1, 2, DT_MAX_GRID_Y, 65281, DT_MAX_GRID_Y};
    for (int i = 0; i < 8; i++) {
        size_t r = dt_colsum_rows(rows[i]);
        unsigned k = dt_colsum_chunks(rows[i]);
        CHECK(r == want_rows[i] && k == want_chunks[i] && k <= DT_MAX_GRID_Y && (size_t)k * r >= rows[i] &&
                  (k == 0 || (size_t)(k - 1) * r < rows[i]),
              "column sums over %zu rows: %u chunks of %zu rows (%u of %zu)", rows[i], k, r, want_chunks[i],
              want_rows[i]);
    }
}

// ---- the attention's plan on the host

// Element i of an operand of type t, as a float.
static float elt(const void *p, dt_dtype t, size_t i) {
    if (t == DT_F32) return ((const float *)p)[i];
    float f;
    dt_to_f32(&f, (const uint16_t *)p + i, 1, t);
    return f;
}

static void put16(void *h, size_t i, float v, dt_dtype t) {
    if (h) dt_from_f32((uint16_t *)h + i, &v, 1, t);
}

static dt_status h_gemm(dt_dtype t, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                        int lda, long long sa, const void *B, int ldb, long long sb, float beta, float *C, int ldc,
                        long long sc, int batch) {
    for (int n = 0; n < batch; n++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int k = 0; k < K; k++)
                    s += (double)elt(A, t, n * sa + (ta ? (size_t)k * lda + i : (size_t)i * lda + k)) *
                         elt(B, t, n * sb + (tb ? (size_t)j * ldb + k : (size_t)k * ldb + j));
                float *c = C + n * sc + (size_t)i * ldc + j;
                *c = (float)(alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *c));
            }
    return DT_OK;
}

static dt_status h_softmax(float *att, void *p16, size_t rows, int T, dt_dtype t) {
    for (size_t r = 0; r < rows; r++) {
        float *a = att + r * T, mx = -FLT_MAX, s = 0;
        int pos = (int)(r % T);
        for (int j = 0; j <= pos; j++) mx = a[j] > mx ? a[j] : mx;
        for (int j = 0; j <= pos; j++) s += a[j] = dt_att_exp(a[j], mx);
        for (int j = 0; j < T; j++) put16(p16, r * T + j, a[j] = j <= pos ? a[j] / s : 0.0f, t);
    }
    return DT_OK;
}

static dt_status h_softmax_backward(float *datt, const float *att, void *d16, size_t rows, int T,
                                    float scale, dt_dtype t) {
    for (size_t r = 0; r < rows; r++) {
        float *d = datt + r * T, s = 0;
        const float *a = att + r * T;
        int pos = (int)(r % T);
        for (int j = 0; j <= pos; j++) s += d[j] * a[j];
        for (int j = 0; j < T; j++) put16(d16, r * T + j, d[j] = j <= pos ? dt_att_grad(a[j], d[j], s, scale) : 0, t);
    }
    return DT_OK;
}

static dt_status h_round(void *dst, const float *src, size_t n, dt_dtype t) {
    dt_from_f32(dst, src, n, t);
    return DT_OK;
}

static const dt_att_ops h_ops = {h_gemm, h_softmax, h_softmax_backward, h_round};

static float *randoms(size_t n, float range) {
    float *a = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) a[i] = draw() * range;
    return a;
}

static double normwise(const float *ref, const float *x, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]), r += (double)ref[i] * ref[i];
    return sqrt(d / (r > 0 ? r : 1));
}

// Rows of [B NH T, T] zero right of the diagonal.
static int upper_zero(const float *a, size_t rows, int T) {
    for (size_t r = 0; r < rows; r++)
        for (int j = (int)(r % T) + 1; j < T; j++)
            if (a[r * T + j] != 0.0f) return 0;
    return 1;
}

// The plan against the CPU's attention in t: out, dqkv and datt normwise,
// att each within 1e-5 relative (its products in t in both); tolerances as
// test_gpu's (the same rounded factors, sums in another order).
static void test_att_plan(int B, int T, int C, int NH, dt_dtype t) {
    double tol = t == DT_BF16 ? 1e-2 : t == DT_F16 ? 2e-3 : 1e-5;
    size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C, na = (size_t)B * NH * T * T, rows = (size_t)B * NH * T;
    float *qkv = randoms(n3, 2), *dout = randoms(n, 1), *dq0 = randoms(n3, 0.1f);
    float *out = randoms(n, 1), *att = randoms(na, 1), *datt = randoms(na, 1), *dqkv = malloc(sizeof(float) * n3);
    float *pout = randoms(n, 1), *patt = randoms(na, 1), *pdatt = randoms(na, 1), *pdqkv = malloc(sizeof(float) * n3);
    // (the plan writes dqkv whole: its room starts as garbage, the CPU's op adds into zeros)
    memset(dqkv, 0, sizeof(float) * n3), memcpy(pdqkv, dq0, sizeof(float) * n3);
    size_t wb = dt_att_work_bytes(B, T, C, NH, t);
    void *work = wb ? malloc(wb) : NULL;
    dt_status st = dt_att_forward(&h_ops, pout, patt, qkv, work, B, T, C, NH, t);
    dt_kernels_set_precision(t);
    dt_attention_forward(out, att, qkv, B, T, C, NH);
    double dy = normwise(out, pout, n), dp = tl_max_rel(att, patt, na, 1e-30);
    CHECK(st == DT_OK && dy <= tol && dp <= 1e-5 && upper_zero(patt, rows, T),
          "attention plan %s forward B %d T %d C %d NH %d: out %.3g (normwise, <= %g), att %.3g (<= 1e-5), zeros right "
          "of the diagonal %d: %s", dt_dtype_name(t), B, T, C, NH, dy, tol, dp, upper_zero(patt, rows, T),
          st == DT_OK ? "ok" : dt_last_error());
    // the backward on the CPU's probabilities on both sides
    st = dt_att_backward(&h_ops, pdqkv, pdatt, dout, qkv, att, work, B, T, C, NH, t);
    dt_attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    dt_kernels_set_precision(DT_F32);
    for (size_t i = 0; i < na; i++)  // (the CPU leaves part of its scratch right of the diagonal as it was)
        if (i % T > i / T % T) datt[i] = 0.0f;
    double dq = normwise(dqkv, pdqkv, n3), dd = normwise(datt, pdatt, na);
    CHECK(st == DT_OK && dq <= tol && dd <= tol && upper_zero(pdatt, rows, T),
          "attention plan %s backward B %d T %d C %d NH %d: dqkv %.3g, datt %.3g (normwise, <= %g), zeros right of "
          "the diagonal %d: %s", dt_dtype_name(t), B, T, C, NH, dq, dd, tol, upper_zero(pdatt, rows, T),
          st == DT_OK ? "ok" : dt_last_error());
    free(qkv), free(dout), free(dq0), free(out), free(att), free(datt), free(dqkv);
    free(pout), free(patt), free(pdatt), free(pdqkv), free(work);
}

static void test_att_refusals(void) {
    float x = 0;
    dt_status st = dt_att_forward(&h_ops, &x, &x, &x, NULL, 1, 1, 96, 5, DT_F32);
    CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "NH must divide C"), "attention: NH 5 of C 96 refused: %s",
          dt_last_error());
    st = dt_att_backward(&h_ops, &x, &x, &x, &x, &x, NULL, 1, 1, 96, 2, DT_I64);
    CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "products in type"), "attention: products in int64 refused: %s",
          dt_last_error());
    st = dt_att_forward(&h_ops, &x, &x, &x, NULL, 1, 1, 96, 2, DT_BF16);
    CHECK(st == DT_ERR_ARG && strstr(dt_last_error(), "need a work block"), "attention: bf16 without work refused: %s",
          dt_last_error());
    size_t wb = dt_att_work_bytes(2, 3, 8, 2, DT_F16), big = dt_att_work_bytes(16, 1024, 768, 12, DT_BF16);
    CHECK(wb == 512 + 256 + 256 && big == 2 * (16 * 1024 * (3 * 768 + 768) + 16 * 12 * 1024 * 1024) &&
              dt_att_work_bytes(2, 3, 8, 2, DT_F32) == 0,
          "attention's work block: %zu bytes in fp16 (qkv, att, dy of 288, 72, 96 bytes, each on 256), %zu at GPT-2 "
          "124M's B 16 in bf16, none in fp32", wb, big);
    // The room: fused heads (up to 128 columns) keep rows, larger ones the T x T squares.
    dt_att_room f = dt_att_room_of(16, 1024, 768, 12, DT_BF16), g = dt_att_room_of(2, 5, 1024, 2, DT_F16);
    CHECK(f.saved == 4 * 16 * 12 * 1024 && f.scratch == 4 * 16 * 12 * 1024 && f.work == 0 &&
              g.saved == 4 * 2 * 2 * 25 && g.scratch == g.saved && g.work == dt_att_work_bytes(2, 5, 1024, 2, DT_F16) &&
              dt_att_fused(384, 3) && !dt_att_fused(258, 2) && !dt_att_fused(96, 5),
          "attention's room: GPT-2 124M's B 16 fused: %zu bytes kept (the rows' log-sum-exp), "
          "%zu of scratch; heads of 512 on GEMMs: %zu, %zu and %zu of work", f.saved, f.scratch, g.saved, g.scratch,
          g.work);
}

int main(void) {
    test_gemm_args();
    test_launch();
    test_chunks();
    for (int i = 0; i < 3; i++) {
        dt_dtype t = i == 0 ? DT_F32 : i == 1 ? DT_BF16 : DT_F16;
        test_att_plan(2, 37, 96, 3, t);
        test_att_plan(1, 1, 64, 2, t);
        test_att_plan(3, 70, 72, 4, t);
        test_att_plan(1, 33, 5, 1, t);
    }
    test_att_refusals();
    return tl_finish();
}
