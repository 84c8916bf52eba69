/* The CNN's layers on a device (gpu/dev_model.c): the index arithmetic of
 * each output element of im2col and of its inverse, max pooling's windows
 * and dropout's masks, one definition for the simulated GPU's loops
 * (dev_sim.c) and the CUDA kernels (cnn.cu). A convolution there is
 * im2col and a GEMM: the columns [C K K, B OH OW] of the batch (so that one
 * GEMM makes every sample's output), the input's gradient gathered back
 * from the columns' (each input element sums its own K K terms in order:
 * no atomics, the same bits every run). */
#ifndef DT_GPU_CNN_HD_H
#define DT_GPU_CNN_HD_H

#include "core/hd.h"
#include "core/rng_hd.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* A convolution's input geometry: C channels of H x W, K x K kernels,
 * stride S, padding P, output OH x OW. */
typedef struct {
    int C, H, W, K, S, P, OH, OW;
} dt_im2col_t;

/* Element (row, col) of the columns of x[B, C, H, W]: row (c K + ky) K +
 * kx, column (b OH + oy) OW + ox; 0 in the padding. */
DT_HD float dt_im2col_at(const float *x, const dt_im2col_t *g, size_t row, size_t col) {
    size_t ohw = (size_t)g->OH * g->OW, b = col / ohw, p = col % ohw, c = row / ((size_t)g->K * g->K);
    int kx = (int)(row % (size_t)g->K), ky = (int)(row / (size_t)g->K % (size_t)g->K);
    int y = (int)(p / (size_t)g->OW) * g->S - g->P + ky, xx = (int)(p % (size_t)g->OW) * g->S - g->P + kx;
    if (y < 0 || y >= g->H || xx < 0 || xx >= g->W) return 0.0f;
    return x[((b * (size_t)g->C + c) * (size_t)g->H + (size_t)y) * (size_t)g->W + (size_t)xx];
}

/* Input element i of the batch's [B, C, H, W] gradient: the sum of the
 * column gradients dcol[C K K, B OH OW] it went into, ky and kx in order. */
DT_HD float dt_col2im_at(const float *dcol, const dt_im2col_t *g, size_t B, size_t i) {
    int xx = (int)(i % (size_t)g->W), y = (int)(i / (size_t)g->W % (size_t)g->H);
    size_t c = i / ((size_t)g->W * g->H) % (size_t)g->C, b = i / ((size_t)g->W * g->H * g->C);
    size_t ncol = B * g->OH * g->OW;
    float s = 0.0f;
    for (int ky = 0; ky < g->K; ky++) {
        int ty = y + g->P - ky;
        if (ty < 0 || ty % g->S || ty / g->S >= g->OH) continue;
        for (int kx = 0; kx < g->K; kx++) {
            int tx = xx + g->P - kx;
            if (tx < 0 || tx % g->S || tx / g->S >= g->OW) continue;
            size_t row = (c * g->K + (size_t)ky) * g->K + (size_t)kx;
            s += dcol[row * ncol + (b * g->OH + (size_t)(ty / g->S)) * g->OW + (size_t)(tx / g->S)];
        }
    }
    return s;
}

/* Element i of out[nb, C, R], the transpose of each of the nb matrices of
 * in[nb, R, C]: its index in in. */
DT_HD size_t dt_transpose_src(size_t i, size_t R, size_t C) {
    size_t b = i / (R * C), j = i % (R * C);
    return b * R * C + (j % R) * C + j / R;
}

/* Output element i of K x K max pooling, stride S, over images of H x W
 * (x[images, H, W]; OH = (H - K) / S + 1, OW likewise): the maximum of its
 * window (a NaN wins over a number, the first of equals wins) and in *arg
 * its index in the image, as the CPU's dt_maxpool_forward. */
DT_HD float dt_maxpool_at(const float *x, int H, int W, int K, int S, size_t i, int32_t *arg) {
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1, oh = (int)(i / (size_t)OW % (size_t)OH), ow = (int)(i % (size_t)OW);
    const float *img = x + i / ((size_t)OH * OW) * (size_t)H * W;
    int mi = oh * S * W + ow * S;
    float m = img[mi];
    for (int kh = 0; kh < K; kh++)
        for (int kw = 0; kw < K; kw++) {
            int j = (oh * S + kh) * W + ow * S + kw;
            float v = img[j];
            if (v > m || (isnan(v) && !isnan(m))) m = v, mi = j;
        }
    *arg = mi;
    return m;
}

/* Input element i's gradient: the sum of dout over the windows (in order)
 * whose maximum it was. */
DT_HD float dt_maxpool_grad_at(const float *dout, const int32_t *arg, int H, int W, int K, int S, size_t i) {
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1, at = (int)(i % ((size_t)H * W)), y = at / W, x = at % W;
    size_t first = i / ((size_t)H * W) * (size_t)OH * OW;
    float s = 0.0f;
    for (int oh = y >= K ? (y - K) / S + 1 : 0; oh <= y / S && oh < OH; oh++)
        for (int ow = x >= K ? (x - K) / S + 1 : 0; ow <= x / S && ow < OW; ow++) {
            size_t o = first + (size_t)oh * OW + (size_t)ow;
            if (arg[o] == at) s += dout[o];
        }
    return s;
}

/* Sample j's dropout mask over its n values (mask[n], keep = 1 / (1 - p)
 * or 0): its own stream, nn/model.c's, drawn in order after `skip` draws
 * (a tensor-parallel shard's part of the whole layer's mask). */
DT_HD void dt_dropout_mask(float *mask, size_t n, float p, uint64_t seed, uint64_t step, uint64_t sample,
                           int layer, size_t skip) {
    uint64_t s[4];
    float keep = 1.0f / (1.0f - p);
    dt_xoshiro_seed(s, dt_dropout_seed(seed, step, sample, layer));
    for (size_t i = 0; i < skip; i++) dt_xoshiro_uniform(s);
    for (size_t i = 0; i < n; i++) mask[i] = dt_xoshiro_uniform(s) < p ? 0.0f : keep;
}

#endif
