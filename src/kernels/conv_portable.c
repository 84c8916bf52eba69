/* 2-D convolution in portable C: im2col and a GEMM (dt_sgemm) forward,
 * a GEMM and col2im for the input gradient, a GEMM for the weight
 * gradient. The same contract as dt_conv_* (kernels.h): what they run in a
 * build without oneDNN, and in every build for the shapes on which oneDNN
 * would run its reference kernel (conv.c); compiled in every build so the
 * tests compare the two.
 *
 * For one sample b, with col[IC K K, OH OW] the input's patches (a column
 * per output pixel, zeros where a patch reaches into the padding):
 *   out[b] = w[OC, IC K K] @ col + bias          (forward)
 *   dcol   = w^T @ dout[b]; dinp[b] = col2im(dcol) (backward data)
 *   dw    += dout[b] @ col^T; db += rows of dout[b] (backward weights)
 * Samples go to `slots` (the thread count, at most B): slot t takes samples
 * [B t / slots, B (t+1) / slots) with room of its own in scratch, and its
 * GEMMs run on one thread (dt_sgemm inside a parallel region); with one
 * slot a GEMM uses every thread. Backward weights sums each slot's samples
 * into the slot's own partial gradient, then adds the partials to dw and db
 * in slot order: deterministic for a fixed thread count.
 *
 * Layouts: plain NCHW is what this path works in (dt_conv_prefers_blocked
 * says so for the shapes conv.c routes here); blocked inputs or outputs
 * (nChw16c) are converted a sample at a time in the slot's room. `save`
 * is the input, NCHW, in 16 bits in a low precision (unless keep32). In a
 * low precision dt_sgemm rounds the GEMMs' operands (the patches, the
 * weights, the output gradient), and the output gradient is rounded in the
 * slot's room first so the bias gradient sums the same rounded values. */
#include "kernels/kernels.h"

#include <omp.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int B, IC, H, W, OC, K, S, P, OH, OW, slots;
    size_t in, ckk, ohw;          // a sample's input IC H W; a patch IC K K; OH OW
    size_t xs, col, ys, part;     // a slot's room, in floats (multiples of 16)
    dt_dtype round;               // the operands' precision (DT_F32: not rounded)
    int keep16;                   // save holds 16-bit values
} geom;

static size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

static geom geometry(const dt_conv_shape *s) {
    geom g = {s->B, s->IC, s->H, s->W, s->OC, s->K, s->S, s->P, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, DT_F32, 0};
    g.OH = (s->H + 2 * s->P - s->K) / s->S + 1;
    g.OW = (s->W + 2 * s->P - s->K) / s->S + 1;
    g.in = (size_t)s->IC * s->H * s->W;
    g.ckk = (size_t)s->IC * s->K * s->K;
    g.ohw = (size_t)g.OH * g.OW;
    g.xs = up16(g.in);
    g.col = up16(g.ckk * g.ohw);
    g.ys = up16((size_t)s->OC * g.ohw);
    g.part = up16((size_t)s->OC * g.ckk + s->OC);
    int nt = omp_get_max_threads();
    g.slots = nt < s->B ? nt : s->B;
    g.round = dt_kernels_precision();
    g.keep16 = g.round != DT_F32 && !s->keep32;
    return g;
}

void dt_conv_portable_size(const dt_conv_shape *s, size_t *save, size_t *scratch) {
    geom g = geometry(s);
    size_t n = (size_t)s->B * g.in;
    *save = g.keep16 ? up16((n + 1) / 2) : up16(n);
    *scratch = (size_t)g.slots * (g.xs + g.col + g.ys + g.part);
}

// ----------------------------------------------------------------------------
// patches, layouts

// The output columns ox whose input column ox S - P + kx lies in [0, W): [*a, *e).
static void valid_cols(const geom *g, int kx, int *a, int *e) {
    int d = g->P - kx, f = g->W - 1 + g->P - kx;
    int lo = d <= 0 ? 0 : (d + g->S - 1) / g->S, hi = f < 0 ? 0 : f / g->S + 1;
    if (lo > g->OW) lo = g->OW;
    if (hi > g->OW) hi = g->OW;
    *a = lo;
    *e = hi > lo ? hi : lo;
}

// col[IC K K, OH OW] from one sample x[IC, H, W].
static void im2col(float *col, const float *x, const geom *g) {
    for (int c = 0; c < g->IC; c++)
        for (int ky = 0; ky < g->K; ky++)
            for (int kx = 0; kx < g->K; kx++) {
                float *row = col + ((size_t)(c * g->K + ky) * g->K + kx) * g->ohw;
                int a, e;
                valid_cols(g, kx, &a, &e);
                for (int oy = 0; oy < g->OH; oy++) {
                    float *r = row + (size_t)oy * g->OW;
                    int iy = oy * g->S - g->P + ky;
                    if (iy < 0 || iy >= g->H) {
                        memset(r, 0, sizeof(float) * g->OW);
                        continue;
                    }
                    const float *xr = x + ((size_t)c * g->H + iy) * g->W;
                    for (int ox = 0; ox < a; ox++) r[ox] = 0.0f;
                    for (int ox = a; ox < e; ox++) r[ox] = xr[ox * g->S - g->P + kx];
                    for (int ox = e; ox < g->OW; ox++) r[ox] = 0.0f;
                }
            }
}

// x[IC, H, W] += the patches' sums of col[IC K K, OH OW].
static void col2im(float *x, const float *col, const geom *g) {
    for (int c = 0; c < g->IC; c++)
        for (int ky = 0; ky < g->K; ky++)
            for (int kx = 0; kx < g->K; kx++) {
                const float *row = col + ((size_t)(c * g->K + ky) * g->K + kx) * g->ohw;
                int a, e;
                valid_cols(g, kx, &a, &e);
                for (int oy = 0; oy < g->OH; oy++) {
                    int iy = oy * g->S - g->P + ky;
                    if (iy < 0 || iy >= g->H) continue;
                    const float *r = row + (size_t)oy * g->OW;
                    float *xr = x + ((size_t)c * g->H + iy) * g->W;
                    for (int ox = a; ox < e; ox++) xr[ox * g->S - g->P + kx] += r[ox];
                }
            }
}

// One sample of a blocked tensor xb[ceil(C/16), P, 16] as plain y[C, P].
static void unblock(float *y, const float *xb, int C, size_t P) {
    for (int c = 0; c < C; c++) {
        const float *xc = xb + (size_t)(c / DT_CONV_BLOCK) * P * DT_CONV_BLOCK + c % DT_CONV_BLOCK;
        for (size_t p = 0; p < P; p++) y[(size_t)c * P + p] = xc[p * DT_CONV_BLOCK];
    }
}

// Plain y[C, P] into one sample of a blocked xb: overwritten (the channels
// past C zero), or added to (`add`: those channels left alone).
static void block(float *xb, const float *y, int C, size_t P, int add) {
    int CB = (C + DT_CONV_BLOCK - 1) / DT_CONV_BLOCK;
    for (int c = 0; c < CB * DT_CONV_BLOCK; c++) {
        float *xc = xb + (size_t)(c / DT_CONV_BLOCK) * P * DT_CONV_BLOCK + c % DT_CONV_BLOCK;
        if (c >= C) {
            if (!add)
                for (size_t p = 0; p < P; p++) xc[p * DT_CONV_BLOCK] = 0.0f;
        } else if (add) {
            for (size_t p = 0; p < P; p++) xc[p * DT_CONV_BLOCK] += y[(size_t)c * P + p];
        } else {
            for (size_t p = 0; p < P; p++) xc[p * DT_CONV_BLOCK] = y[(size_t)c * P + p];
        }
    }
}

static size_t blocked_sample(int C, size_t P) {
    return (size_t)((C + DT_CONV_BLOCK - 1) / DT_CONV_BLOCK) * DT_CONV_BLOCK * P;
}

// The slots' rooms in scratch, and the samples of slot t.
typedef struct {
    float *xs, *col, *ys, *part;
    int b0, b1;
} slot;

static slot slot_of(float *scratch, const geom *g, int t) {
    float *base = scratch + (size_t)t * (g->xs + g->col + g->ys + g->part);
    slot r = {base, base + g->xs, base + g->xs + g->col, base + g->xs + g->col + g->ys,
              (int)((long)g->B * t / g->slots), (int)((long)g->B * (t + 1) / g->slots)};
    return r;
}

// Sample b of the output gradient as the GEMMs read it: dout itself, or
// (blocked, or to be rounded) its plain, rounded copy in the slot's room.
static const float *dout_sample(const float *dout, int b, const geom *g, int blocked, float *ys) {
    size_t n = (size_t)g->OC * g->ohw;
    if (!blocked && g->round == DT_F32) return dout + (size_t)b * n;
    if (blocked) unblock(ys, dout + (size_t)b * blocked_sample(g->OC, g->ohw), g->OC, g->ohw);
    else memcpy(ys, dout + (size_t)b * n, sizeof(float) * n);
    if (g->round != DT_F32) dt_round_f32(ys, ys, n, g->round);
    return ys;
}

// ----------------------------------------------------------------------------
// the passes

// Keeps sample b's input x in save (rounded, 16-bit or fp32, in a low precision).
static void keep(float *save, const float *x, int b, const geom *g) {
    size_t off = (size_t)b * g->in;
    if (g->keep16) dt_from_f32((uint16_t *)save + off, x, g->in, g->round);
    else if (g->round != DT_F32) dt_round_f32(save + off, x, g->in, g->round);
    else memcpy(save + off, x, sizeof(float) * g->in);
}

static void forward_sample(float *out, float *save, const slot *sl, const float *inp, const float *w,
                           const float *bias, const dt_conv_shape *s, const geom *g, int b) {
    const float *x = inp + (size_t)b * g->in;
    if (s->src_blocked) {
        unblock(sl->xs, inp + (size_t)b * blocked_sample(g->IC, (size_t)g->H * g->W), g->IC, (size_t)g->H * g->W);
        x = sl->xs;
    }
    keep(save, x, b, g);
    im2col(sl->col, x, g);
    float *y = s->dst_blocked ? sl->ys : out + (size_t)b * g->OC * g->ohw;
    dt_sgemm(0, 0, g->OC, (int)g->ohw, (int)g->ckk, 1.0f, w, (int)g->ckk, sl->col, (int)g->ohw, 0.0f, y, (int)g->ohw);
    for (int o = 0; o < g->OC; o++) {
        float *yo = y + (size_t)o * g->ohw, bo = bias ? bias[o] : 0.0f;
        if (s->relu)
            for (size_t p = 0; p < g->ohw; p++) yo[p] = yo[p] + bo > 0.0f ? yo[p] + bo : 0.0f;
        else if (bias)
            for (size_t p = 0; p < g->ohw; p++) yo[p] += bo;
    }
    if (s->dst_blocked) block(out + (size_t)b * blocked_sample(g->OC, g->ohw), y, g->OC, g->ohw, 0);
}

void dt_conv_portable_forward(float *out, float *save, float *scratch, const float *inp, const float *w,
                              const float *b, const dt_conv_shape *s) {
    geom g = geometry(s);
#pragma omp parallel num_threads(g.slots)
    for (int t = omp_get_thread_num(); t < g.slots; t += omp_get_num_threads()) {
        slot sl = slot_of(scratch, &g, t);
        for (int i = sl.b0; i < sl.b1; i++) forward_sample(out, save, &sl, inp, w, b, s, &g, i);
    }
}

static void data_sample(float *dinp, const slot *sl, const float *dout, const float *w, const dt_conv_shape *s,
                        const geom *g, int b, int set_dinp) {
    const float *dy = dout_sample(dout, b, g, s->dst_blocked, sl->ys);
    dt_sgemm(1, 0, (int)g->ckk, (int)g->ohw, g->OC, 1.0f, w, (int)g->ckk, dy, (int)g->ohw, 0.0f, sl->col,
             (int)g->ohw);
    if (s->src_blocked) {
        memset(sl->xs, 0, sizeof(float) * g->in);
        col2im(sl->xs, sl->col, g);
        block(dinp + (size_t)b * blocked_sample(g->IC, (size_t)g->H * g->W), sl->xs, g->IC, (size_t)g->H * g->W,
              !set_dinp);
        return;
    }
    float *dx = dinp + (size_t)b * g->in;
    if (set_dinp) memset(dx, 0, sizeof(float) * g->in);
    col2im(dx, sl->col, g);
}

// Slot sl's samples into its partial gradient part[OC IC K K + OC].
static void weights_slot(const slot *sl, const float *dout, const float *save, const dt_conv_shape *s,
                         const geom *g) {
    size_t nw = (size_t)g->OC * g->ckk;
    memset(sl->part, 0, sizeof(float) * (nw + g->OC));
    for (int b = sl->b0; b < sl->b1; b++) {
        const float *x = save + (size_t)b * g->in;
        if (g->keep16) {
            dt_to_f32(sl->xs, (const uint16_t *)save + (size_t)b * g->in, g->in, g->round);
            x = sl->xs;
        }
        im2col(sl->col, x, g);
        const float *dy = dout_sample(dout, b, g, s->dst_blocked, sl->ys);
        dt_sgemm(0, 1, g->OC, (int)g->ckk, (int)g->ohw, 1.0f, dy, (int)g->ohw, sl->col, (int)g->ohw, 1.0f, sl->part,
                 (int)g->ckk);
        for (int o = 0; o < g->OC; o++) {
            const float *d = dy + (size_t)o * g->ohw;
            float acc = 0.0f;
            for (size_t p = 0; p < g->ohw; p++) acc += d[p];
            sl->part[nw + o] += acc;
        }
    }
}

void dt_conv_portable_backward(float *dinp, float *dw, float *db, float *scratch, float *out, const float *dout,
                               const float *save, const float *w, const dt_conv_shape *s, int set_dinp) {
    (void)out;  // (no use for the output's room)
    geom g = geometry(s);
    if (dinp) {
#pragma omp parallel num_threads(g.slots)
        for (int t = omp_get_thread_num(); t < g.slots; t += omp_get_num_threads()) {
            slot sl = slot_of(scratch, &g, t);
            for (int i = sl.b0; i < sl.b1; i++) data_sample(dinp, &sl, dout, w, s, &g, i, set_dinp);
        }
    }
    if (!dw && !db) return;
#pragma omp parallel num_threads(g.slots)
    for (int t = omp_get_thread_num(); t < g.slots; t += omp_get_num_threads()) {
        slot sl = slot_of(scratch, &g, t);
        weights_slot(&sl, dout, save, s, &g);
    }
    // the partials in slot order
    size_t nw = (size_t)g.OC * g.ckk;
#pragma omp parallel for schedule(static) if (nw > 65536)
    for (size_t i = 0; i < nw + g.OC; i++) {
        float v = 0.0f;
        for (int t = 0; t < g.slots; t++) v += slot_of(scratch, &g, t).part[i];
        if (i < nw && dw) dw[i] += v;
        else if (i >= nw && db) db[i - nw] += v;
    }
}
