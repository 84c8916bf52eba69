/* Causal attention fused, flash attention's scheme (att_plan.h's room,
 * gpu.h's contract): the T x T scores and probabilities never leave the
 * chip. A block is 8 warps, 32 rows of one head (b, h): a warp owns 4 of
 * them; the other side comes in tiles of 32 rows through shared memory, a
 * lane a row of the tile for the dot products (scores, dp = dout . v: the
 * warp's 4 rows in one pass over the columns, their tile transposed so a
 * column's 4 values are one float4), a lane 1 to 4 of the head's columns
 * for the sums kept in registers (the 4 rows' values at each row of the
 * tile one float4 from the warp's slots in shared memory: every value
 * loaded feeds 4 FMAs, and no shuffles).
 *
 *   forward     per query row, over the key tiles up to the diagonal: the
 *               scores, the running maximum and sum (online softmax) and
 *               the output's sum rescaled; out = sum / l. Saved: each
 *               row's log-sum-exp m + log l.
 *   backward    D = dout . out per row (fa_dot, out as the layer keeps it:
 *               fp32, or in 16 bits its copy in the products' type); then
 *               per key tile, over
 *               the query tiles from the diagonal on, dv += p dout and
 *               dk += ds q (fa_kv); per query tile, over the key tiles up
 *               to the diagonal, dq += ds k (fa_q); p = exp(s - lse) and
 *               ds = p (dp - D) / sqrt(hs) made again in each, the same
 *               bits. Each gradient element is one thread's, added in a
 *               fixed order: no atomics, the same bits every run.
 *
 * Each element's arithmetic is nn/rows.h's (dt_att_exp, dt_att_grad). In
 * bf16 or fp16 each product's factors are rounded to the type as the CPU's
 * attention rounds them (q, k, v, the probabilities, dout and the
 * softmax's gradient; fp32 sums), except that the probabilities rounded
 * for p v are the unnormalised exp(s - m) (the sum divided at the end),
 * and D is dout . out, out made of those rounded factors and itself
 * rounded to the type (the CPU sums dp p over fp32 probabilities).
 * The CPU's numbers to rounding, not bitwise (another order of sums).
 * Heads of up to DT_ATT_FUSED_HS columns; indices 64-bit. With 16-bit
 * products and heads of 64 or 128 columns the same scheme runs on the
 * tensor cores (flash_tc.cuh); tests/gpu/test_gpu_emu.c runs both on CPU
 * threads. */
#ifdef DT_CUDA_EMU
#include "cuda_emu.h"  // (tests/gpu: these kernels on CPU threads, test_gpu_emu)
#else
#include "gpu/cuda_check.h"
#endif
#include "gpu/att_plan.h"
#include "gpu/block.h"
#include "gpu/gpu.h"
#include "nn/rows.h"

#include <float.h>
#include <math.h>

#define FA_W 8                 // warps a block
#define FA_R 4                 // rows a warp
#define FA_TILE (FA_W * FA_R)  // a block's rows, and a tile of the other side: a lane a row
static_assert(FA_TILE == 32, "a tile has a row for each lane");
static_assert(DT_ATT_FUSED_HS <= 4 * 32, "a lane holds at most 4 columns of a row");

// Rows r0 .. r0 + 31 of one head's hs columns of src (row stride `stride`)
// into shared s, rounded to the products' type; rows past T zeros. By rows
// (T 0: s[r ld + d]) or transposed (T 1: s[d 32 + r], a warp's FA_R rows
// of a column one float4).
template <int H, int TR>
__device__ static void load_tile(float *s, int ld, const float *src, size_t stride, int r0, int T, int hs) {
    for (int i = threadIdx.x; i < FA_TILE * hs; i += blockDim.x) {
        int r = i / hs, d = i % hs;
        s[TR ? d * FA_TILE + r : r * ld + d] = r0 + r < T ? rounded<H>(src[(size_t)(r0 + r) * stride + d]) : 0.0f;
    }
}

// The warp's FA_R rows' dot products with the lane's row: out[r] = a_r . b
// over hs columns, in order (an fmaf chain: a score is the same bits in
// every kernel), a_r from a transposed tile (at its warp's rows), b a row.
__device__ static void dots(float *out, const float *at, const float *b, int hs) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int d = 0; d < hs; d++) {
        float4 a = *(const float4 *)(at + d * FA_TILE);
        float x = b[d];
        s0 = fmaf(a.x, x, s0), s1 = fmaf(a.y, x, s1), s2 = fmaf(a.z, x, s2), s3 = fmaf(a.w, x, s3);
    }
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}
static_assert(FA_R == 4, "a warp's rows are a float4");

// acc[r][n] (row r's column lane + 32 n) += w.r * row[...], for columns < hs.
template <int NC> __device__ static void axpy4(float (*acc)[NC], float4 w, const float *row, int hs) {
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int n = 0; n < NC; n++) {
        if (lane + 32 * n >= hs) continue;
        float v = row[lane + 32 * n];
        acc[0][n] = fmaf(w.x, v, acc[0][n]), acc[1][n] = fmaf(w.y, v, acc[1][n]);
        acc[2][n] = fmaf(w.z, v, acc[2][n]), acc[3][n] = fmaf(w.w, v, acc[3][n]);
    }
}

// dst[column lane + 32 n] = acc[n] mul, columns < hs.
template <int NC> __device__ static void store(float *dst, const float *acc, float mul, int hs) {
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int n = 0; n < NC; n++)
        if (lane + 32 * n < hs) dst[lane + 32 * n] = acc[n] * mul;
}

// dst[column lane + 32 n] = acc[n] mul rounded to 16 bits (H 1 bf16, 2
// fp16: block.h's narrow), columns < hs.
template <int NC, int H> __device__ static void store16(uint16_t *dst, const float *acc, float mul, int hs) {
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int n = 0; n < NC; n++)
        if (lane + 32 * n < hs) dst[lane + 32 * n] = narrow<H>(acc[n] * mul);
}

// A warp's rows' values of its lane's key (or query) into its slot of w
// ([FA_W][32][FA_R]: a row of the other side's FA_R values one float4).
__device__ static void put4(float *w, const float *v) {
    *(float4 *)(w + ((threadIdx.x / 32) * 32 + threadIdx.x % 32) * FA_R) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ static float4 get4(const float *w, int j) {
    return *(const float4 *)(w + ((threadIdx.x / 32) * 32 + j) * FA_R);
}
#define FA_SLOTS (FA_W * 32 * FA_R)  // floats of a put4/get4 block

// The last row of the warp's FA_R rows (from r0) that is below T, and the
// count of the other side's rows from k0 it reaches in a tile (causal: up
// to that row; 0 where the warp has none).
__device__ static int reach(int r0, int k0, int T) {
    int last = min(r0 + FA_R - 1, T - 1);
    return last < r0 ? 0 : min(FA_TILE, last + 1 - k0);
}

// The tile of 32 query rows (the longest first) of head (b, h) = blockIdx.x.
template <int H, int NC>
__global__ static void __launch_bounds__(FA_W * 32, 2)
    fa_forward(float *out, uint16_t *out16, float *lse, const float *qkv, int T, int C, int NH, float scale) {
    DT_DYN_SHARED __align__(128) float sm[];  // (float4 reads; flash_tc.cuh: wmma's 32 bytes)
    int hs = C / NH, ld = hs + 1, warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.x % NH;
    size_t bh = blockIdx.x, b = bh / NH, C3 = 3 * (size_t)C;
    int q0 = (gridDim.y - 1 - blockIdx.y) * FA_TILE, qe = min(T, q0 + FA_TILE), t0 = q0 + warp * FA_R;
    float *Qt = sm, *K = Qt + FA_TILE * hs, *V = K + FA_TILE * ld, *P = V + FA_TILE * hs;
    const float *x = qkv + b * T * C3 + (size_t)h * hs;
    float m[FA_R], l[FA_R], o[FA_R][NC];
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        m[r] = -FLT_MAX, l[r] = 0.0f;
#pragma unroll
        for (int n = 0; n < NC; n++) o[r][n] = 0.0f;
    }
    load_tile<H, 1>(Qt, 0, x, C3, q0, T, hs);
    for (int k0 = 0; k0 < qe; k0 += FA_TILE) {
        __syncthreads();  // (the last tile read)
        load_tile<H, 0>(K, ld, x + C, C3, k0, T, hs);
        load_tile<H, 0>(V, hs, x + 2 * C, C3, k0, T, hs);
        __syncthreads();
        int j = k0 + lane;
        float s[FA_R], p[FA_R];
        dots(s, Qt + warp * FA_R, K + lane * ld, hs);
#pragma unroll
        for (int r = 0; r < FA_R; r++) {
            int t = t0 + r;
            bool ok = j <= t && t < T;
            float sc = __fmul_rn(s[r], scale);
            float mx = fmaxf(m[r], warp_all<true>(ok ? sc : -FLT_MAX));
            float e = ok ? dt_att_exp(sc, mx) : 0.0f, c = dt_att_exp(m[r], mx);
            l[r] = l[r] * c + warp_all<false>(e);
            m[r] = mx;
#pragma unroll
            for (int n = 0; n < NC; n++) o[r][n] *= c;
            p[r] = rounded<H>(e);
        }
        put4(P, p);
        __syncwarp();
        for (int jj = 0, je = reach(t0, k0, T); jj < je; jj++) axpy4<NC>(o, get4(P, jj), V + jj * hs, hs);
    }  // (P read before the next tile's: the loop's first barrier)
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        int t = t0 + r;
        if (t >= T) continue;
        size_t at = (b * T + t) * C + (size_t)h * hs;
        if (out16) store16<NC, H>(out16 + at, o[r], 1.0f / l[r], hs);
        else store<NC>(out + at, o[r], 1.0f / l[r], hs);
        if (lane == 0) lse[bh * T + t] = m[r] + logf(l[r]);
    }
}

// The layer's output element i as kept: fp32, or (H 1, 2) in 16 bits.
template <int H> __device__ static inline float kept_out(const void *out, size_t i) {
    if (H == 1 || H == 2) return widen<H>(((const uint16_t *)out)[i]);
    return ((const float *)out)[i];
}

// D[b, h, t] = dout . out over the head's columns (dout rounded as the
// products take it, out as the layer keeps it), a warp a row r = (b T +
// t) NH + h.
template <int H>
__global__ static void fa_dot(float *D, const float *dout, const void *out, size_t rows, int T, int C, int NH) {
    int hs = C / NH, lane = threadIdx.x % 32;
    EACH_ROW(r, rows) {
        size_t bt = r / NH, b = bt / T;
        int h = (int)(r % NH), t = (int)(bt % T);
        const float *dy = dout + bt * C + (size_t)h * hs;
        size_t o = bt * C + (size_t)h * hs;
        float s = 0.0f;
        for (int d = lane; d < hs; d += 32) s = fmaf(rounded<H>(dy[d]), kept_out<H>(out, o + d), s);
        s = warp_all<false>(s);
        if (lane == 0) D[(b * NH + h) * T + t] = s;
    }
}

// The tile of 32 key rows blockIdx.y of head blockIdx.x: dk and dv over
// the query tiles from the diagonal on; a lane a query of the tile.
template <int H, int NC>
__global__ static void __launch_bounds__(FA_W * 32, 2)
    fa_kv(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, int T, int C, int NH,
          float scale) {
    DT_DYN_SHARED __align__(128) float sm[];  // (float4 reads; flash_tc.cuh: wmma's 32 bytes)
    int hs = C / NH, ld = hs + 1, warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.x % NH;
    size_t bh = blockIdx.x, b = bh / NH, C3 = 3 * (size_t)C;
    int k0 = blockIdx.y * FA_TILE, j0 = k0 + warp * FA_R;
    float *Kt = sm, *Vt = Kt + FA_TILE * hs, *Q = Vt + FA_TILE * hs, *dY = Q + FA_TILE * ld, *Ls = dY + FA_TILE * ld,
          *Ds = Ls + FA_TILE, *P = Ds + FA_TILE, *dS = P + FA_SLOTS;
    const float *x = qkv + b * T * C3 + (size_t)h * hs, *dy = dout + b * T * C + (size_t)h * hs;
    float dk[FA_R][NC], dv[FA_R][NC];
#pragma unroll
    for (int r = 0; r < FA_R; r++)
#pragma unroll
        for (int n = 0; n < NC; n++) dk[r][n] = dv[r][n] = 0.0f;
    load_tile<H, 1>(Kt, 0, x + C, C3, k0, T, hs);
    load_tile<H, 1>(Vt, 0, x + 2 * C, C3, k0, T, hs);
    for (int q0 = k0; q0 < T; q0 += FA_TILE) {
        __syncthreads();
        load_tile<H, 0>(Q, ld, x, C3, q0, T, hs);
        load_tile<H, 0>(dY, ld, dy, C, q0, T, hs);
        if (threadIdx.x < FA_TILE) {
            int i = q0 + threadIdx.x;
            Ls[threadIdx.x] = i < T ? lse[bh * T + i] : 0.0f;
            Ds[threadIdx.x] = i < T ? D[bh * T + i] : 0.0f;
        }
        __syncthreads();
        int i = q0 + lane;
        float s[FA_R], dp[FA_R], p[FA_R], ds[FA_R];
        dots(s, Kt + warp * FA_R, Q + lane * ld, hs);
        dots(dp, Vt + warp * FA_R, dY + lane * ld, hs);
#pragma unroll
        for (int r = 0; r < FA_R; r++) {
            bool ok = i < T && j0 + r <= i;
            float e = ok ? dt_att_exp(__fmul_rn(s[r], scale), Ls[lane]) : 0.0f;
            p[r] = rounded<H>(e);
            ds[r] = rounded<H>(ok ? dt_att_grad(e, dp[r], Ds[lane], scale) : 0.0f);
        }
        put4(P, p);
        put4(dS, ds);
        __syncwarp();
        for (int ii = 0, ie = min(FA_TILE, T - q0); ii < ie; ii++) {
            axpy4<NC>(dv, get4(P, ii), dY + ii * ld, hs);
            axpy4<NC>(dk, get4(dS, ii), Q + ii * ld, hs);
        }
    }  // (P and dS read before the next tile's: the loop's first barrier)
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        int j = j0 + r;
        if (j >= T) continue;
        float *g = dqkv + (b * T + j) * C3 + (size_t)h * hs;
        store<NC>(g + C, dk[r], 1.0f, hs);
        store<NC>(g + 2 * C, dv[r], 1.0f, hs);
    }
}

// The tile of 32 query rows (the longest first) of head blockIdx.x: dq
// over the key tiles up to the diagonal; a lane a key of the tile.
template <int H, int NC>
__global__ static void __launch_bounds__(FA_W * 32, 2)
    fa_q(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, int T, int C, int NH,
         float scale) {
    DT_DYN_SHARED __align__(128) float sm[];  // (float4 reads; flash_tc.cuh: wmma's 32 bytes)
    int hs = C / NH, ld = hs + 1, warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.x % NH;
    size_t bh = blockIdx.x, b = bh / NH, C3 = 3 * (size_t)C;
    int q0 = (gridDim.y - 1 - blockIdx.y) * FA_TILE, qe = min(T, q0 + FA_TILE), i0 = q0 + warp * FA_R;
    float *Qt = sm, *dYt = Qt + FA_TILE * hs, *K = dYt + FA_TILE * hs, *V = K + FA_TILE * ld, *dS = V + FA_TILE * ld;
    const float *x = qkv + b * T * C3 + (size_t)h * hs, *dy = dout + b * T * C + (size_t)h * hs;
    float L[FA_R], Dr[FA_R], dq[FA_R][NC];
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        int i = i0 + r;
        L[r] = i < T ? lse[bh * T + i] : 0.0f, Dr[r] = i < T ? D[bh * T + i] : 0.0f;
#pragma unroll
        for (int n = 0; n < NC; n++) dq[r][n] = 0.0f;
    }
    load_tile<H, 1>(Qt, 0, x, C3, q0, T, hs);
    load_tile<H, 1>(dYt, 0, dy, C, q0, T, hs);
    for (int k0 = 0; k0 < qe; k0 += FA_TILE) {
        __syncthreads();
        load_tile<H, 0>(K, ld, x + C, C3, k0, T, hs);
        load_tile<H, 0>(V, ld, x + 2 * C, C3, k0, T, hs);
        __syncthreads();
        int j = k0 + lane;
        float s[FA_R], dp[FA_R], ds[FA_R];
        dots(s, Qt + warp * FA_R, K + lane * ld, hs);
        dots(dp, dYt + warp * FA_R, V + lane * ld, hs);
#pragma unroll
        for (int r = 0; r < FA_R; r++) {
            bool ok = i0 + r < T && j <= i0 + r;
            float e = ok ? dt_att_exp(__fmul_rn(s[r], scale), L[r]) : 0.0f;
            ds[r] = rounded<H>(ok ? dt_att_grad(e, dp[r], Dr[r], scale) : 0.0f);
        }
        put4(dS, ds);
        __syncwarp();
        for (int jj = 0, je = reach(i0, k0, T); jj < je; jj++) axpy4<NC>(dq, get4(dS, jj), K + jj * ld, hs);
    }  // (dS read before the next tile's: the loop's first barrier)
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        int i = i0 + r;
        if (i < T) store<NC>(dqkv + (b * T + i) * C3 + (size_t)h * hs, dq[r], 1.0f, hs);
    }
}

#include "gpu/flash_tc.cuh"
#include "gpu/flash_mma.cuh"

// The grid: the heads along x, the tiles of `rows` rows along y.
static dt_status grid_of(dim3 *g, int B, int T, int NH, int rows) {
    size_t heads = (size_t)B * NH, tiles = ((size_t)T + rows - 1) / rows;
    if (heads > DT_MAX_BLOCKS || tiles > DT_MAX_GRID_Y)
        return dt_error(DT_ERR_ARG, "GPU attention: B %d x NH %d heads, T %d (at most %u heads and %u rows)", B, NH,
                        T, DT_MAX_BLOCKS, DT_MAX_GRID_Y * rows);
    *g = dim3((unsigned)heads, (unsigned)tiles);
    return DT_OK;
}

// D = dout . out a row (fa_dot), before either backward.
template <int H> static dt_status row_dots(float *D, const float *dout, const void *out, int B, int T, int C, int NH) {
    size_t rows = (size_t)B * T * NH;
    auto k = fa_dot<H>;
    DT_RUN(k, dt_launch_blocks(rows, FA_W), FA_W * 32, 0, D, dout, out, rows, T, C, NH);
    DT_LAUNCHED(fa_dot);
    return DT_OK;
}

// A family's launches (the CUDA cores' or the tensor cores'): its tiles of
// `rows` rows, `threads` a block, sh bytes of shared memory, names for the
// errors. forward: k; backward: D (row_dots), then the key tiles' kernel
// kv, then the query tiles' q.
typedef struct {
    int rows, threads;
    size_t sh;
    const char *names[3];
} fa_family;

template <typename K>
static dt_status forward_on(const fa_family *f, K k, float *out, uint16_t *out16, float *saved, const float *qkv, int B,
                            int T, int C, int NH) {
    dim3 g;
    dt_status st = grid_of(&g, B, T, NH, f->rows);
    if (st == DT_OK) st = dt_shared_bytes(k, f->sh);
    if (st != DT_OK) return st;
    float scale = 1.0f / sqrtf((float)(C / NH));
    DT_RUN(k, g, f->threads, f->sh, out, out16, saved, qkv, T, C, NH, scale);
    return dt_gpu_launched(f->names[0]);
}

template <int H, typename KV, typename KQ>
static dt_status backward_on(const fa_family *f, KV kv, KQ kq, float *dqkv, float *D, const float *dout,
                             const float *qkv, const void *out, const float *lse, int B, int T, int C, int NH) {
    float scale = 1.0f / sqrtf((float)(C / NH));
    dim3 g;
    dt_status st = grid_of(&g, B, T, NH, f->rows);
    if (st == DT_OK) st = dt_shared_bytes(kv, f->sh);
    if (st == DT_OK) st = dt_shared_bytes(kq, f->sh);
    if (st == DT_OK) st = row_dots<H>(D, dout, out, B, T, C, NH);
    if (st != DT_OK) return st;
    DT_RUN(kv, g, f->threads, f->sh, dqkv, dout, qkv, lse, D, T, C, NH, scale);
    if ((st = dt_gpu_launched(f->names[1])) != DT_OK) return st;
    DT_RUN(kq, g, f->threads, f->sh, dqkv, dout, qkv, lse, D, T, C, NH, scale);
    return dt_gpu_launched(f->names[2]);
}

// The CUDA cores' kernels, NC columns a lane.
template <int H, int NC>
static dt_status forward(float *out, uint16_t *out16, float *saved, const float *qkv, int B, int T, int C, int NH) {
    fa_family f = {FA_TILE, FA_W * 32, sizeof(float) * (FA_TILE * (3 * (C / NH) + 1) + FA_SLOTS), {"fa_forward"}};
    return forward_on(&f, fa_forward<H, NC>, out, out16, saved, qkv, B, T, C, NH);
}

template <int H, int NC>
static dt_status backward(float *dqkv, float *D, const float *dout, const float *qkv, const void *out,
                          const float *saved, int B, int T, int C, int NH) {
    fa_family f = {FA_TILE, FA_W * 32, sizeof(float) * (FA_TILE * (4 * (C / NH) + 4) + 2 * FA_SLOTS),
                   {NULL, "fa_kv", "fa_q"}};
    return backward_on<H>(&f, fa_kv<H, NC>, fa_q<H, NC>, dqkv, D, dout, qkv, out, saved, B, T, C, NH);
}

// flash_mma.cuh's grid: a block a head's tile of 64 rows, in one dimension.
static dt_status mma_grid(unsigned *blocks, unsigned *tiles, int B, int T, int NH) {
    size_t t = ((size_t)T + MMA_ROWS - 1) / MMA_ROWS, n = (size_t)B * NH * t;
    if (n > DT_MAX_BLOCKS)
        return dt_error(DT_ERR_ARG, "GPU attention: B %d x NH %d heads of T %d rows: more than %u blocks", B, NH, T,
                        DT_MAX_BLOCKS);
    *blocks = (unsigned)n, *tiles = (unsigned)t;
    return DT_OK;
}

// The tensor cores': H 1 or 2 (heads of HS = 64 or 128), 3 (tf32: 64); in 16 bits flash_mma.cuh's (the backward
// at heads of 64), else flash_tc.cuh's.
template <int H, int HS>
static dt_status forward_tc(float *out, uint16_t *out16, float *saved, const float *qkv, int B, int T, int C, int NH) {
    if constexpr (H == 3) {
        fa_family f = {TC_ROWS, TC_W * 32, tc_layout<HS, H>::FORWARD, {"fa_forward_tc"}};
        return forward_on(&f, fa_forward_tc<H, HS>, out, out16, saved, qkv, B, T, C, NH);
    } else {
        unsigned blocks = 0, tiles = 0;
        auto k = fa_forward_mma<H, HS>;
        dt_status st = mma_grid(&blocks, &tiles, B, T, NH);
        if (st == DT_OK) st = dt_shared_bytes(k, mma_layout<HS>::FORWARD);
        if (st != DT_OK) return st;
        DT_RUN(k, blocks, MMA_W * 32, mma_layout<HS>::FORWARD, out, out16, saved, qkv, T, C, NH,
               1.0f / sqrtf((float)HS), tiles);
        return dt_gpu_launched("fa_forward_mma");
    }
}

template <int H, int HS>
static dt_status backward_tc(float *dqkv, float *D, const float *dout, const float *qkv, const void *out,
                             const float *saved, int B, int T, int C, int NH) {
    if constexpr (H == 3 || HS != 64) {
        fa_family f = {TC_ROWS, TC_W * 32, tc_layout<HS, H>::BACKWARD, {NULL, "fa_kv_tc", "fa_q_tc"}};
        return backward_on<H>(&f, fa_kv_tc<H, HS>, fa_q_tc<H, HS>, dqkv, D, dout, qkv, out, saved, B, T, C, NH);
    } else {
        typedef mma_layout<HS> Y;
        unsigned blocks = 0, tiles = 0;
        auto kv = fa_kv_mma<H, HS>;
        auto kq = fa_q_mma<H, HS>;
        float scale = 1.0f / sqrtf((float)HS);
        dt_status st = mma_grid(&blocks, &tiles, B, T, NH);
        if (st == DT_OK) st = dt_shared_bytes(kv, Y::KV);
        if (st == DT_OK) st = dt_shared_bytes(kq, Y::Q);
        if (st == DT_OK) st = row_dots<H>(D, dout, out, B, T, C, NH);
        if (st != DT_OK) return st;
        DT_RUN(kv, blocks, MMA_W * 32, Y::KV, dqkv, dout, qkv, saved, D, T, C, NH, scale, tiles);
        if ((st = dt_gpu_launched("fa_kv_mma")) != DT_OK) return st;
        DT_RUN(kq, blocks, MMA_W * 32, Y::Q, dqkv, dout, qkv, saved, D, T, C, NH, scale, tiles);
        return dt_gpu_launched("fa_q_mma");
    }
}

// The tensor cores' products for t at heads of hs, where they take them
// (0: none): 1 bf16, 2 fp16 (heads of 64 or 128), 3 tf32 (fp32 where
// dt_gpu_set_tf32 says, heads of 64: at 128 its backward outgrows a
// block's shared memory).
static int tc_kind(int hs, dt_dtype t) {
    if (t == DT_BF16 || t == DT_F16) return hs == 64 || hs == 128 ? (t == DT_BF16 ? 1 : 2) : 0;
    return t == DT_F32 && hs == 64 && dt_gpu_tf32() ? 3 : 0;
}

// Whether this GPU runs the tensor cores' kernels of kind h at heads of
// hs: bf16 and tf32 fragments from compute capability 8.0, and their
// backward's shared memory within what a block may ask for (227 KiB on an
// H100 or H200; 99 KiB on some GPUs: there the 16-bit kernels at heads of
// 64, mma.sync's 37 KiB, and the CUDA cores' for the others).
static int tc_usable(int hs, int h) {
#ifdef DT_CUDA_EMU
    (void)hs, (void)h;
    return 1;
#else
    int dev, major = 0;
    size_t need = h == 3 ? tc_layout<64, 3>::BACKWARD : hs == 64 ? mma_layout<64>::KV : tc_layout<128, 1>::BACKWARD;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev))
        return 0;
    return major >= 8 && dt_shared_optin() >= need;
#endif
}

// The kernels for t and the head's size: on the tensor cores (kind h, where
// tc_kind and tc_usable say), else on the CUDA cores with NC columns a lane
// (1, 2, 4 for heads up to 32, 64, 128).
static int on_tensor_cores(int hs, dt_dtype t) {
    int h = tc_kind(hs, t);
    return h && tc_usable(hs, h) ? h : 0;
}
// (tc: on_tensor_cores's answer, asked once a call: it queries the GPU)
#define FA_DISPATCH(fn, t, hs, tc, ...)                                                                    \
    ((tc) ? FA_TC(fn##_tc, tc, hs, __VA_ARGS__)                                                            \
          : (t) == DT_BF16 ? FA_NC(fn, 1, hs, __VA_ARGS__)                                                 \
          : (t) == DT_F16  ? FA_NC(fn, 2, hs, __VA_ARGS__)                                                 \
                           : FA_NC(fn, 0, hs, __VA_ARGS__))
#define FA_NC(fn, H, hs, ...)                                                                              \
    ((hs) <= 32 ? fn<H, 1>(__VA_ARGS__) : (hs) <= 64 ? fn<H, 2>(__VA_ARGS__) : fn<H, 4>(__VA_ARGS__))
#define FA_TC(fn, h, hs, ...)                                                                              \
    ((h) == 3 ? fn<3, 64>(__VA_ARGS__)                                                                     \
     : (h) == 1 ? ((hs) == 64 ? fn<1, 64>(__VA_ARGS__) : fn<1, 128>(__VA_ARGS__))                          \
                : ((hs) == 64 ? fn<2, 64>(__VA_ARGS__) : fn<2, 128>(__VA_ARGS__)))

static dt_status fused_args(const char *what, int B, int T, int C, int NH, dt_dtype t) {
    dt_status st = dt_att_args(what, B, T, C, NH, t);
    if (st == DT_OK && C / NH > DT_ATT_FUSED_HS)
        return dt_error(DT_ERR_ARG, "GPU attention %s: heads of %d columns (the fused kernels take up to %d)", what,
                        C / NH, DT_ATT_FUSED_HS);
    return st;
}

dt_status dt_gpu_flash_forward(float *out, float *saved, const float *qkv, int B, int T, int C, int NH, dt_dtype t,
                               void *out16) {
    dt_status st = fused_args("forward", B, T, C, NH, t);
    if (st == DT_OK && dt_launch_h16("GPU attention forward", out16, t) < 0) return DT_ERR_ARG;
    if (st != DT_OK || B == 0 || T == 0) return st;
    uint16_t *h = (uint16_t *)out16;
    return FA_DISPATCH(forward, t, C / NH, on_tensor_cores(C / NH, t), out, h, saved, qkv, B, T, C, NH);
}

dt_status dt_gpu_flash_backward(float *dqkv, float *scratch, const float *dout, const float *qkv, const void *out,
                                const float *saved, int B, int T, int C, int NH, dt_dtype t) {
    dt_status st = fused_args("backward", B, T, C, NH, t);
    if (st != DT_OK || B == 0 || T == 0) return st;
    return FA_DISPATCH(backward, t, C / NH, on_tensor_cores(C / NH, t), dqkv, scratch, dout, qkv, out, saved, B, T,
                       C, NH);
}
