/* Causal multi-head attention on the GPU, the CPU's layout and contract
 * (nn/attention.c, dtrain/gpt.h): qkv [B,T,3C], out [B,T,C], att
 * [B,NH,T,T] the probabilities, zeros right of the diagonal. Its products
 * in fp32, or, as the CPU's GEMMs in bf16 or fp16, with both factors
 * rounded to that type first (R below: the kernels' template parameter);
 * sums, softmax and results fp32.
 *
 * Kept simple (correct first; fast later): one block of DT_THREADS a row
 * (b, h, t). A row's scores: a warp a position, its lanes over the head's
 * channels, reduced by shuffles (a fixed butterfly); the softmax over
 * positions 0..t in block trees; the weighted sum of the values: warp w
 * takes positions w, w + DT_ATT_PARTS, ..., into a partial row in shared
 * memory, and the partial rows are added in order. Backward in two passes:
 * rows (the softmax's gradient into datt, dq) and columns (a block a key
 * position j: dk and dv, over the rows t >= j). Every sum in a fixed order:
 * the same bits every run. Each element's arithmetic nn/rows.h's (the
 * CPU's). Indices 64-bit (B NH T T may pass 2^31). Nothing here has run on
 * a GPU yet (docs/gpu.md). */
#include "core/bf16.h"
#include "gpu/cuda_check.h"
#include "gpu/gpu.h"
#include "gpu/launch.h"
#include "nn/rows.h"

#include <cuda_fp16.h>
#include <float.h>
#include <math.h>

// A product's factor in the products' precision R: 0 fp32 (as it is), 1
// bf16, 2 fp16 (rounded to nearest even, the CPU's dt_round_f32).
enum { R32, RBF16, RF16 };
template <int R> __device__ static float rnd(float x) {
    if (R == RBF16) return dt_bf16_to_f32(dt_f32_to_bf16(x));
    if (R == RF16) return __half2float(__float2half_rn(x));
    return x;
}

// The sum of v over the warp's lanes, every lane the same bits (a
// butterfly: each step adds the same two values on both sides).
__device__ static float warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// The block's sum (or maximum) of v, every thread getting it: warps' in
// butterflies, then warp 0 over the DT_ATT_PARTS warps' results.
template <bool MAX> __device__ static float block_reduce(float v, float *sh) {
    for (int m = 16; m > 0; m >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, m);
        v = MAX ? (o > v ? o : v) : v + o;
    }
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = sh[0];
    for (int w = 1; w < DT_ATT_PARTS; w++) r = MAX ? (sh[w] > r ? sh[w] : r) : r + sh[w];
    __syncthreads();  // (before sh is written again)
    return r;
}

// y[d] += sum over j <= t of p[j] x_j[d] (x_j = x + j 3C, the rows of
// one head's keys or values), by partial rows part[DT_ATT_PARTS][hs] added
// in order. Every thread of the block calls it; p is in global memory,
// written before by this block and synchronised.
template <int R>
__device__ static void weighted_sum(float *y, const float *p, const float *x, size_t t, int hs, int C, float *part) {
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int d = lane; d < hs; d += 32) part[w * hs + d] = 0.0f;
    for (size_t j = w; j <= t; j += DT_ATT_PARTS) {
        float pj = rnd<R>(p[j]);
        const float *xj = x + j * 3 * (size_t)C;
        for (int d = lane; d < hs; d += 32) part[w * hs + d] += pj * rnd<R>(xj[d]);
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hs; d += DT_THREADS) {
        float s = part[d];
        for (int k = 1; k < DT_ATT_PARTS; k++) s += part[k * hs + d];
        y[d] += s;
    }
    __syncthreads();
}

// row[j] = scale (a . x_j) for j <= t, zeros after (to T); a in shared
// memory, already in R.
template <int R>
__device__ static void dots(float *row, const float *a, const float *x, size_t t, int T, int hs, int C, float scale) {
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (size_t j = w; j <= t; j += DT_ATT_PARTS) {
        const float *xj = x + j * 3 * (size_t)C;
        float s = 0.0f;
        for (int d = lane; d < hs; d += 32) s += a[d] * rnd<R>(xj[d]);
        s = warp_sum(s);
        if (lane == 0) row[j] = s * scale;
    }
    for (size_t j = t + 1 + threadIdx.x; j < (size_t)T; j += DT_THREADS) row[j] = 0.0f;
    __syncthreads();
}

template <int R>
__global__ static void __launch_bounds__(DT_THREADS)
    att_forward_kernel(float *out, float *att, const float *qkv, size_t rows, int T, int C, int NH) {
    extern __shared__ float sm[];  // q [hs], partial rows [DT_ATT_PARTS][hs]
    __shared__ float red[DT_ATT_PARTS];
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs), *q = sm, *part = sm + hs;
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        dt_att_row a = dt_att_row_of(r, T, C, NH);
        const float *k = qkv + (a.qkv - a.t * 3 * (size_t)C) + C, *v = k + C;  // (position 0's)
        float *p = att + a.att;
        for (int d = threadIdx.x; d < hs; d += DT_THREADS) q[d] = rnd<R>(qkv[a.qkv + d]);
        __syncthreads();
        dots<R>(p, q, k, a.t, T, hs, C, scale);
        float mx = -FLT_MAX;
        for (size_t j = threadIdx.x; j <= a.t; j += DT_THREADS) mx = p[j] > mx ? p[j] : mx;
        mx = block_reduce<true>(mx, red);
        float s = 0.0f;
        for (size_t j = threadIdx.x; j <= a.t; j += DT_THREADS) {
            float e = dt_att_exp(p[j], mx);
            p[j] = e;
            s += e;
        }
        float inv = 1.0f / block_reduce<false>(s, red);
        for (size_t j = threadIdx.x; j <= a.t; j += DT_THREADS) p[j] *= inv;
        __syncthreads();
        float *y = out + a.out;
        for (int d = threadIdx.x; d < hs; d += DT_THREADS) y[d] = 0.0f;
        weighted_sum<R>(y, p, v, a.t, hs, C, part);  // (its first sync orders the zeros before the adds)
    }
}

// The row pass: dA[j] = dy . v_j, the softmax's gradient dS[j] = A[j] (dA[j]
// - sum_j dA A) scale into datt (zeros after t), dq += sum_j dS[j] k_j.
template <int R>
__global__ static void __launch_bounds__(DT_THREADS)
    att_backward_rows_kernel(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                             size_t rows, int T, int C, int NH) {
    extern __shared__ float sm[];  // dy [hs], partial rows [DT_ATT_PARTS][hs]
    __shared__ float red[DT_ATT_PARTS];
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs), *dy = sm, *part = sm + hs;
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        dt_att_row a = dt_att_row_of(r, T, C, NH);
        const float *k = qkv + (a.qkv - a.t * 3 * (size_t)C) + C, *v = k + C, *A = att + a.att;
        float *D = datt + a.att;
        for (int d = threadIdx.x; d < hs; d += DT_THREADS) dy[d] = rnd<R>(dout[a.out + d]);
        __syncthreads();
        dots<R>(D, dy, v, a.t, T, hs, C, 1.0f);
        float s = 0.0f;
        for (size_t j = threadIdx.x; j <= a.t; j += DT_THREADS) s += D[j] * A[j];
        s = block_reduce<false>(s, red);
        for (size_t j = threadIdx.x; j <= a.t; j += DT_THREADS) D[j] = dt_att_grad(A[j], D[j], s, scale);
        __syncthreads();
        weighted_sum<R>(dqkv + a.qkv, D, k, a.t, hs, C, part);
    }
}

// The column pass, a block a key position j of (b, h): dk_j += sum over t
// >= j of dS[t, j] q_t, dv_j += sum of A[t, j] dy_t; warp w takes the rows
// j + w, j + w + DT_ATT_PARTS, ... into partial rows, added in order.
template <int R>
__global__ static void __launch_bounds__(DT_THREADS)
    att_backward_cols_kernel(float *dqkv, const float *datt, const float *dout, const float *qkv, const float *att,
                             size_t rows, int T, int C, int NH) {
    extern __shared__ float sm[];  // partial rows of dk, dv [2 DT_ATT_PARTS][hs]
    int hs = C / NH, w = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *pk = sm, *pv = pk + DT_ATT_PARTS * hs;
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        dt_att_row a = dt_att_row_of(r, T, C, NH);  // (its t: the key position j)
        size_t j = a.t;  // att[b, h, t, j] at (r - j + t) T + j
        const float *q0 = qkv + (a.qkv - j * 3 * (size_t)C), *dy0 = dout + (a.out - j * (size_t)C);
        const float *A0 = att + (r - j) * T + j, *D0 = datt + (r - j) * T + j;
        for (int d = lane; d < hs; d += 32) pk[w * hs + d] = 0.0f, pv[w * hs + d] = 0.0f;
        for (size_t t = j + w; t < (size_t)T; t += DT_ATT_PARTS) {
            float ds = rnd<R>(D0[t * T]), p = rnd<R>(A0[t * T]);
            const float *qt = q0 + t * 3 * (size_t)C, *dyt = dy0 + t * (size_t)C;
            for (int d = lane; d < hs; d += 32) {
                pk[w * hs + d] += ds * rnd<R>(qt[d]);
                pv[w * hs + d] += p * rnd<R>(dyt[d]);
            }
        }
        __syncthreads();
        float *dk = dqkv + a.qkv + C, *dv = dk + C;
        for (int d = threadIdx.x; d < hs; d += DT_THREADS) {
            float sk = pk[d], sv = pv[d];
            for (int m = 1; m < DT_ATT_PARTS; m++) sk += pk[m * hs + d], sv += pv[m * hs + d];
            dk[d] += sk;
            dv[d] += sv;
        }
        __syncthreads();
    }
}

static dt_status att_check(const char *what, int B, int T, int C, int NH, dt_dtype t) {
    if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
        return dt_error(DT_ERR_ARG, "GPU attention %s: B %d, T %d, C %d, NH %d (NH must divide C)", what, B, T, C, NH);
    if (C / NH > DT_ATT_MAX_HS)
        return dt_error(DT_ERR_ARG, "GPU attention %s: head size %d (C %d / NH %d) is past the kernel's %d", what, C / NH,
                        C, NH, DT_ATT_MAX_HS);
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "GPU attention %s: products in type %s (F32, BF16 or F16 only)", what,
                        dt_dtype_name(t));
    return DT_OK;
}

template <int R>
static dt_status att_forward(float *out, float *att, const float *qkv, size_t rows, int T, int C, int NH) {
    size_t smem = dt_att_smem(C / NH, 1 + DT_ATT_PARTS);
    att_forward_kernel<R><<<dt_launch_rows(rows), DT_THREADS, smem>>>(out, att, qkv, rows, T, C, NH);
    DT_LAUNCHED(att_forward_kernel);
    return DT_OK;
}

template <int R>
static dt_status att_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                              size_t rows, int T, int C, int NH) {
    att_backward_rows_kernel<R><<<dt_launch_rows(rows), DT_THREADS, dt_att_smem(C / NH, 1 + DT_ATT_PARTS)>>>(
        dqkv, datt, dout, qkv, att, rows, T, C, NH);
    DT_LAUNCHED(att_backward_rows_kernel);
    att_backward_cols_kernel<R><<<dt_launch_rows(rows), DT_THREADS, dt_att_smem(C / NH, 2 * DT_ATT_PARTS)>>>(
        dqkv, datt, dout, qkv, att, rows, T, C, NH);
    DT_LAUNCHED(att_backward_cols_kernel);
    return DT_OK;
}

dt_status dt_gpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH, dt_dtype t) {
    dt_status st = att_check("forward", B, T, C, NH, t);
    size_t rows = (size_t)B * NH * T;
    if (st != DT_OK || rows == 0) return st;
    return t == DT_BF16 ? att_forward<RBF16>(out, att, qkv, rows, T, C, NH)
           : t == DT_F16 ? att_forward<RF16>(out, att, qkv, rows, T, C, NH)
                         : att_forward<R32>(out, att, qkv, rows, T, C, NH);
}

dt_status dt_gpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                                    int B, int T, int C, int NH, dt_dtype t) {
    dt_status st = att_check("backward", B, T, C, NH, t);
    size_t rows = (size_t)B * NH * T;
    if (st != DT_OK || rows == 0) return st;
    return t == DT_BF16 ? att_backward<RBF16>(dqkv, datt, dout, qkv, att, rows, T, C, NH)
           : t == DT_F16 ? att_backward<RF16>(dqkv, datt, dout, qkv, att, rows, T, C, NH)
                         : att_backward<R32>(dqkv, datt, dout, qkv, att, rows, T, C, NH);
}
