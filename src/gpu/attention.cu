/* Causal multi-head attention on the GPU, the CPU's layout and contract
 * (nn/attention.c, dtrain/gpt.h, gpu.h): heads of up to DT_ATT_FUSED_HS
 * columns on flash.cu's fused kernels, larger ones on att_plan.c's GEMMs
 * and row passes (att_plan.h's room says which). The plan's GEMMs and passes
 * run on cuBLASLt (dt_gpu_gemm_batched: a batch row's heads one strided
 * batch) and the two kernels here, a warp a row of att: the causal softmax
 * and its gradient, each row's maximum and sums by butterflies over the
 * lanes (a fixed order: the same bits every run; the CPU's sums run along
 * the row, so the bits are the CPU's to rounding), each element's
 * arithmetic nn/rows.h's (dt_att_exp, dt_att_grad). In bf16 or fp16 the
 * kernels also write their rows rounded to the type, the next GEMMs'
 * factors. Indices 64-bit (B NH T T may pass 2^31). tests/gpu/test_gpu_emu.c
 * runs the kernels on CPU threads. */
#include "gpu/att_plan.h"
#include "gpu/block.h"
#ifdef DT_CUDA_EMU
#include "cuda_emu.h"  // (tests/gpu: these kernels on CPU threads, test_gpu_emu)
#else
#include "gpu/cuda_check.h"
#endif
#include "gpu/gpu.h"
#include "gpu/launch.h"
#include "nn/rows.h"

#include <float.h>
#include <math.h>

static_assert(DT_THREADS % 32 == 0, "a block of whole warps (a warp a row)");

// Row r of att [rows, T] (position t = r % T): the softmax over 0..t in
// place, zeros after; h16 (H != 0) the row rounded.
template <int H> __global__ static void softmax_kernel(float *att, uint16_t *h16, size_t rows, int T) {
    int lane = threadIdx.x % 32;
    EACH_ROW(r, rows) {
        float *a = att + r * T;
        int t = (int)(r % T);
        float mx = -FLT_MAX, s = 0.0f;
        for (int j = lane; j <= t; j += 32) mx = a[j] > mx ? a[j] : mx;
        mx = warp_all<true>(mx);
        for (int j = lane; j <= t; j += 32) {  // (a lane reads back only what it wrote)
            float e = dt_att_exp(a[j], mx);
            a[j] = e;
            s += e;
        }
        float inv = 1.0f / warp_all<false>(s);
        for (int j = lane; j < T; j += 32) {
            float p = j <= t ? a[j] * inv : 0.0f;
            a[j] = p;
            if (H) h16[r * T + j] = narrow<H>(p);
        }
    }
}

// Row r of datt from dp to the softmax's gradient over 0..t (att the
// probabilities), zeros after; h16 (H != 0) the row rounded.
template <int H>
__global__ static void softmax_backward_kernel(float *datt, const float *att, uint16_t *h16, size_t rows, int T,
                                               float scale) {
    int lane = threadIdx.x % 32;
    EACH_ROW(r, rows) {
        float *d = datt + r * T;
        const float *a = att + r * T;
        int t = (int)(r % T);
        float s = 0.0f;
        for (int j = lane; j <= t; j += 32) s += d[j] * a[j];
        s = warp_all<false>(s);
        for (int j = lane; j < T; j += 32) {
            float g = j <= t ? dt_att_grad(a[j], d[j], s, scale) : 0.0f;
            d[j] = g;
            if (H) h16[r * T + j] = narrow<H>(g);
        }
    }
}

static dt_status softmax(float *att, void *p16, size_t rows, int T, dt_dtype t) {
    uint16_t *h = (uint16_t *)p16;
    if (t == DT_BF16) DT_RUN(softmax_kernel<1>, dt_launch_warp_rows(rows), DT_THREADS, 0, att, h, rows, T);
    else if (t == DT_F16) DT_RUN(softmax_kernel<2>, dt_launch_warp_rows(rows), DT_THREADS, 0, att, h, rows, T);
    else DT_RUN(softmax_kernel<0>, dt_launch_warp_rows(rows), DT_THREADS, 0, att, NULL, rows, T);
    DT_LAUNCHED(softmax_kernel);
    return DT_OK;
}

static dt_status softmax_backward(float *datt, const float *att, void *d16, size_t rows, int T, float scale,
                                  dt_dtype t) {
    uint16_t *h = (uint16_t *)d16;
    unsigned g = dt_launch_warp_rows(rows);
    if (t == DT_BF16) DT_RUN(softmax_backward_kernel<1>, g, DT_THREADS, 0, datt, att, h, rows, T, scale);
    else if (t == DT_F16) DT_RUN(softmax_backward_kernel<2>, g, DT_THREADS, 0, datt, att, h, rows, T, scale);
    else DT_RUN(softmax_backward_kernel<0>, g, DT_THREADS, 0, datt, att, NULL, rows, T, scale);
    DT_LAUNCHED(softmax_backward_kernel);
    return DT_OK;
}

static const dt_att_ops g_ops = {dt_gpu_gemm_batched, softmax, softmax_backward, dt_gpu_from_f32};

dt_status dt_gpu_attention_forward(float *out, float *att, const float *qkv, void *work, int B, int T, int C, int NH,
                                   dt_dtype t, void *out16) {
    if (dt_launch_h16("GPU attention forward", out16, t) < 0) return DT_ERR_ARG;
    if (dt_att_fused(C, NH)) return dt_gpu_flash_forward(out, att, qkv, B, T, C, NH, t, out16);
    dt_status st = dt_att_forward(&g_ops, out, att, qkv, work, B, T, C, NH, t);  // (the plan's GEMM into out, rounded)
    return st == DT_OK && out16 ? dt_gpu_from_f32(out16, out, (size_t)B * T * C, t) : st;
}

dt_status dt_gpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const void *out,
                                    const float *att, void *work, int B, int T, int C, int NH, dt_dtype t) {
    if (dt_att_fused(C, NH)) return dt_gpu_flash_backward(dqkv, datt, dout, qkv, out, att, B, T, C, NH, t);
    return dt_att_backward(&g_ops, dqkv, datt, dout, qkv, att, work, B, T, C, NH, t);
}
