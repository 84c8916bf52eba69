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
 *     one block a row likewise; the attention's rows and their 64-bit
 *     offsets (past 2^31 elements of att), its shared memory; the sum of
 *     squares' chunks. */
#include "gpu/gemm_args.h"
#include "gpu/launch.h"
#include "testlib.h"

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
}

// The attention's rows (launch.h): every (b, h, t) once, the offsets where
// the CPU's layout has them, past 2^31 (B NH T T of 3 x 5 x 40000^2); the
// shared memory within the 48 KiB a block gets unasked; the sum of
// squares' chunks.
static void test_attention_rows(void) {
    const int shapes[][4] = {{2, 37, 96, 3}, {1, 1, 64, 2}, {3, 40000, 20, 5}};  // B, T, C, NH
    for (int s = 0; s < 3; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3], hs = C / NH;
        size_t rows = (size_t)B * NH * T, bad = 0, checked = 0;
        for (size_t r = 0; r < rows; r += rows > 1000 ? rows / 997 : 1) {  // (a sample of the big one)
            size_t probe[] = {r, rows - 1};
            for (int k = 0; k < 2; k++, checked++) {
                dt_att_row a = dt_att_row_of(probe[k], T, C, NH);
                int ok = a.b < (size_t)B && a.h < (size_t)NH && a.t < (size_t)T &&
                         (a.b * NH + a.h) * T + a.t == probe[k] &&
                         a.att == (((a.b * NH + a.h) * (size_t)T + a.t) * T) &&
                         a.qkv == (a.b * T + a.t) * 3 * (size_t)C + a.h * hs &&
                         a.qkv + 2 * (size_t)C + hs <= (size_t)B * T * 3 * C && a.out + hs <= (size_t)B * T * C;
                bad += !ok;
            }
        }
        dt_att_row last = dt_att_row_of(rows - 1, T, C, NH);
        size_t end = last.att + T;  // one past att's last element
        CHECK(bad == 0 && end == rows * T && last.b == (size_t)B - 1 && last.t == (size_t)T - 1,
              "attention rows B %d T %d C %d NH %d: %zu of %zu sampled rows wrong; att ends at %zu (%zu)", B, T, C, NH,
              bad, checked, end, rows * T);
    }
    CHECK((size_t)3 * 5 * 40000 * 40000 > ((size_t)1 << 31), "the big shape passes 2^31 elements of att");
    CHECK(DT_ATT_PARTS * 32 == DT_THREADS, "a partial row a warp: %d warps", DT_ATT_PARTS);
    size_t most = dt_att_smem(DT_ATT_MAX_HS, 2 * DT_ATT_PARTS);
    CHECK(most <= 48 * 1024 && dt_att_smem(DT_ATT_MAX_HS, 1 + DT_ATT_PARTS) <= most &&
              dt_att_smem(3, 1 + DT_ATT_PARTS) == sizeof(float) * 3 * (1 + DT_ATT_PARTS),
          "attention's shared memory at hs %d: %zu bytes (<= 48 KiB)", DT_ATT_MAX_HS, most);
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

int main(void) {
    test_gemm_args();
    test_launch();
    test_attention_rows();
    return tl_finish();
}
