/* The GPT's per-row and per-element arithmetic, one definition for the CPU
 * layers (layers.c) and the GPU's kernels (gpu/layers.cu): DT_HD
 * (core/hd.h), __host__ __device__ under nvcc. What is shared is every
 * element's arithmetic and each row's closing step; a row's sums are each
 * side's own (the CPU's in order, the GPU's in a block's tree), so the two
 * agree to rounding, not bitwise. The CPU's results are the same bits as
 * before these functions existed (tests/test_layers, test_gpt, test_torch).
 *
 *   layernorm of a row x[C]: mean = sum x / C, rstd = 1 / sqrt(sum (x -
 *     mean)^2 / C + eps), out = (x - mean) rstd w + b; backward with
 *     norm = (x - mean) rstd, dn = w dout and the row's means of dn and of
 *     dn norm: dx += (dn - mean dn - norm mean(dn norm)) rstd; dw += norm
 *     dout, db += dout over the rows.
 *   GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 *     x^3))), tanh in a form that vectorises on the CPU (below).
 *   softmax cross-entropy of a row of logits l[V] (a padded row's columns
 *     past V are not part of it): mx = max l, p = exp(l - mx) / sum (the
 *     sum in double), loss = mx + log(sum) - l[target] in double, the batch's
 *     loss the mean of the rows' in order; dl += (p - [v = target]) dloss / N.
 *   ReLU: max(x, 0); its gradient dout where x > 0.
 *   causal attention's row t (nn/attention.c, gpu/attention.cu): scores s_j
 *     = q k_j / sqrt(hs), p_j = exp(s_j - max) / sum over j <= t; backward
 *     dS_j = p_j (dp_j - sum_j dp_j p_j) / sqrt(hs). */
#ifndef DT_NN_ROWS_H
#define DT_NN_ROWS_H

#include "core/hd.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

// ---- layernorm

DT_HD float dt_ln_mean(float sum, int C) { return sum / C; }
DT_HD float dt_ln_rstd(float sq_sum, int C, float eps) { return 1.0f / sqrtf(sq_sum / C + eps); }
DT_HD float dt_ln_sq(float x, float mean) { return (x - mean) * (x - mean); }
DT_HD float dt_ln_norm(float x, float mean, float rstd) { return (x - mean) * rstd; }
DT_HD float dt_ln_out(float x, float mean, float rstd, float w, float b) { return (x - mean) * rstd * w + b; }
/* dn = w dout; dn_mean, dnn_mean: the row's means of dn and of dn norm. */
DT_HD float dt_ln_dx(float dn, float norm, float dn_mean, float dnn_mean, float rstd) {
    return (dn - dn_mean - norm * dnn_mean) * rstd;
}

// ---- GELU

#define DT_GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)

/* tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2|u|), exp by
 * Cody-Waite range reduction, Cephes' degree-6 polynomial and an exponent
 * assembled from bits: libm's tanhf is one scalar call per element, which
 * made GELU a third of a GPT training step on the CPU. The absolute error
 * is below 2e-7, which is what counts here: GELU uses 1 + tanh and
 * 1 - tanh^2. */
DT_HD float dt_gelu_tanh(float u) {
    float x = -2.0f * fabsf(u);
    x = x < -87.0f ? -87.0f : x;  // exp(-87) is still a normal float
    float n = rintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r) + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;  // 2^n (n in [-126, 0]: a normal float)
#ifdef __CUDA_ARCH__
    float scale = __int_as_float(bits);
#else
    union { int32_t i; float f; } sc = {bits};
    float scale = sc.f;
#endif
    return copysignf(fmaf(-p, scale, 1.0f) / fmaf(p, scale, 1.0f), u);  // e = p scale
}

/* GELU's tanh argument. Here and below every product that feeds a sum is
 * an explicit fmaf and no other product does, so that gcc's and nvcc's
 * contractions (each their own) leave the CPU's and the GPU's bits equal. */
DT_HD float dt_gelu_arg(float x) { return DT_GELU_SCALE * fmaf(0.044715f * x * x, x, x); }

DT_HD float dt_gelu(float x) { return 0.5f * x * (1.0f + dt_gelu_tanh(dt_gelu_arg(x))); }

/* d gelu(x) / dx: the backward adds it times dout. */
DT_HD float dt_gelu_grad(float x) {
    float t = dt_gelu_tanh(dt_gelu_arg(x));
    float sech2 = fmaf(-t, t, 1.0f);
    return fmaf(0.5f * x * sech2 * DT_GELU_SCALE, fmaf(3.0f * 0.044715f * x, x, 1.0f), 0.5f * (1.0f + t));
}

// ---- softmax cross-entropy

DT_HD float dt_ce_exp(float l, float mx) { return expf(l - mx); }
/* 1 / the row's sum, applied to its exponentials. */
DT_HD float dt_ce_inv(double sum) { return (float)(1.0 / sum); }
DT_HD double dt_ce_row_loss(float mx, double sum, float l_target) { return (double)mx + log(sum) - l_target; }
/* The loss gradient's scale: dloss over the N rows the loss is the mean of. */
DT_HD float dt_ce_scale(float dloss, float rows) { return dloss / rows; }
/* One row's softmax p[V] of logits l[V], its sums in order (the CPU's
 * loop, and the simulated GPU's): its loss at `target`, NaN outside 0..V-1. */
DT_HD double dt_ce_row(float *p, const float *l, int V, int32_t target) {
    float mx = -FLT_MAX;
    for (int v = 0; v < V; v++) mx = l[v] > mx ? l[v] : mx;
    double s = 0.0;
    for (int v = 0; v < V; v++) {
        p[v] = dt_ce_exp(l[v], mx);
        s += p[v];
    }
    float inv = dt_ce_inv(s);
    for (int v = 0; v < V; v++) p[v] *= inv;
    return target >= 0 && target < V ? dt_ce_row_loss(mx, s, l[target]) : NAN;
}
DT_HD float dt_ce_grad(float d, float p, int is_target, float scale) { return fmaf(p - (is_target ? 1.0f : 0.0f), scale, d); }

// ---- ReLU

DT_HD float dt_relu(float x) { return x > 0.0f ? x : 0.0f; }
DT_HD float dt_relu_grad(float x, float dout) { return x > 0.0f ? dout : 0.0f; }

// ---- causal attention

/* A score's share before the row is normalised: exp(s - the row's max). */
DT_HD float dt_att_exp(float s, float mx) { return expf(s - mx); }
/* The softmax's gradient at a score: p (dp - sum dp p) / sqrt(hs), with
 * dot = the row's sum of dp p and scale = 1 / sqrt(hs). */
DT_HD float dt_att_grad(float p, float dp, float dot, float scale) { return p * (dp - dot) * scale; }

#endif
