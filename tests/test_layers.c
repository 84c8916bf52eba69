/* Layer kernels against central finite differences, and a whole model.
 *
 * Each layer is checked with a scalar loss L = sum(out * R) for a fixed random
 * R, so that dout = R and dL/dx = (L(x+e) - L(x-e)) / 2e for every input and
 * parameter element. Inputs are small and random; where the layer has kinks
 * (relu, maxpool) the inputs are kept further than e from them. Then:
 * backward accumulates (+=); the forward passes agree with naive double
 * references; dropout's mask has the right statistics and is reproducible; a
 * small CNN's flat gradient block matches finite differences of its loss;
 * its pipeline stages and its tensor-parallel shards (convolutions and
 * linear layers split over channels, run as coroutines) give the whole model's
 * loss and gradients; and the same thread count gives bitwise-identical
 * results. */
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "testlib.h"
#include "tp_net.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define RTOL 1e-2 /* finite differences vs backward */

static dt_rng g_rng;
static double g_worst_fd;  /* worst relative error seen, for the report */
static double g_worst_model;

static float *randn(size_t n, float scale) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = scale * dt_rng_normal(&g_rng);
    return p;
}

static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static float *copy(const float *a, size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    memcpy(p, a, sizeof(float) * n);
    return p;
}

static double maxabs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

/* Values that are pairwise at least `gap` apart (a shuffled ramp), so that a
 * perturbation smaller than gap/2 never changes which element is a maximum. */
static float *distinct(size_t n, float gap) {
    uint32_t *idx = malloc(sizeof(uint32_t) * n);
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    dt_rng_shuffle(&g_rng, idx, n);
    float *p = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = ((float)idx[i] - 0.5f * (float)n) * gap;
    free(idx);
    return p;
}

// ----------------------------------------------------------------------------
// finite-difference harness

typedef struct {
    void (*fwd)(void *ctx); /* recomputes out from the current inputs */
    void *ctx;
    const float *out;
    size_t nout;
    const float *R;
} fd_problem;

static double fd_loss(fd_problem *p) {
    p->fwd(p->ctx);
    double s = 0;
    for (size_t i = 0; i < p->nout; i++) s += (double)p->out[i] * p->R[i];
    return s;
}

/* Compares g[n], the backward's gradient of L with respect to x[n], with
 * central differences of step eps. An element passes when
 * |num - g| <= RTOL * max(|num|, |g|, floor) with floor = 1e-2 * max|g|. */
static void fd_check(fd_problem *p, float *x, const float *g, size_t n, float eps,
                     const char *what) {
    double floor = fmax(1e-2 * maxabs(g, n), 1e-6), worst = 0;
    size_t worst_i = 0, bad = 0;
    double worst_num = 0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + eps;
        float xp = x[i];
        double lp = fd_loss(p);
        x[i] = x0 - eps;
        float xm = x[i];
        double lm = fd_loss(p);
        x[i] = x0;
        double num = (lp - lm) / ((double)xp - (double)xm);
        double rel = fabs(num - g[i]) / fmax(fmax(fabs(num), fabs(g[i])), floor);
        if (rel > RTOL) bad++;
        if (rel > worst) worst = rel, worst_i = i, worst_num = num;
    }
    p->fwd(p->ctx); /* leave the saved state (col, argmax, ...) at the base point */
    if (worst > g_worst_fd) g_worst_fd = worst;
    CHECK(bad == 0, "%s: %zu of %zu elements differ from finite differences; worst [%zu] "
          "backward %.6g vs numeric %.6g (rel %.2e)", what, bad, n, worst_i, g[worst_i],
          worst_num, worst);
}

/* Backward must accumulate: a second call on the same buffers doubles them. */
static void check_doubled(const float *twice, const float *once, size_t n, const char *what) {
    float *two = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) two[i] = 2.0f * once[i];
    double r = tl_max_rel(twice, two, n, 1e-4 * fmax(maxabs(once, n), 1e-6));
    CHECK(r <= 1e-5, "%s: second backward call does not accumulate (rel %.2e from 2x)", what, r);
    free(two);
}

// ----------------------------------------------------------------------------
// linear

typedef struct {
    float *out, *inp, *w, *b;
    int B, C, OC;
} lin_ctx;

static void lin_fwd(void *c) {
    lin_ctx *k = c;
    dt_linear_forward(k->out, k->inp, k->w, k->b, k->B, k->C, k->OC);
}

static void test_linear(int B, int C, int OC, int bias) {
    char what[96];
    lin_ctx k = {zeros((size_t)B * OC), randn((size_t)B * C, 1), randn((size_t)OC * C, 0.5f),
                 bias ? randn(OC, 0.5f) : NULL, B, C, OC};
    size_t nout = (size_t)B * OC;
    float *R = randn(nout, 1);
    lin_fwd(&k);
    // naive reference
    double worst = 0;
    for (int i = 0; i < B; i++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? k.b[o] : 0, sa = fabs(s);
            for (int c = 0; c < C; c++) {
                double t = (double)k.inp[i * C + c] * k.w[o * C + c];
                s += t;
                sa += fabs(t);
            }
            worst = fmax(worst, fabs(k.out[i * OC + o] - s) / sa);
        }
    snprintf(what, sizeof what, "linear B=%d C=%d OC=%d bias=%d", B, C, OC, bias);
    CHECK(worst < 1e-5, "%s forward vs naive: rel %.2e", what, worst);

    float *dinp = zeros((size_t)B * C), *dw = zeros((size_t)OC * C), *db = zeros(OC);
    dt_linear_backward(dinp, dw, bias ? db : NULL, R, k.inp, k.w, B, C, OC);
    fd_problem p = {lin_fwd, &k, k.out, nout, R};
    char w2[128];
    snprintf(w2, sizeof w2, "%s dinp", what);
    fd_check(&p, k.inp, dinp, (size_t)B * C, 1e-2f, w2);
    snprintf(w2, sizeof w2, "%s dw", what);
    fd_check(&p, k.w, dw, (size_t)OC * C, 1e-2f, w2);
    if (bias) {
        snprintf(w2, sizeof w2, "%s db", what);
        fd_check(&p, k.b, db, OC, 1e-2f, w2);
    }
    // accumulation
    float *dinp1 = copy(dinp, (size_t)B * C), *dw1 = copy(dw, (size_t)OC * C), *db1 = copy(db, OC);
    dt_linear_backward(dinp, dw, bias ? db : NULL, R, k.inp, k.w, B, C, OC);
    snprintf(w2, sizeof w2, "%s dinp", what);
    check_doubled(dinp, dinp1, (size_t)B * C, w2);
    snprintf(w2, sizeof w2, "%s dw", what);
    check_doubled(dw, dw1, (size_t)OC * C, w2);
    if (bias) {
        snprintf(w2, sizeof w2, "%s db", what);
        check_doubled(db, db1, OC, w2);
    }
    // NULL gradients are skipped and do not change the others
    float *dw_only = zeros((size_t)OC * C);
    dt_linear_backward(NULL, dw_only, NULL, R, k.inp, k.w, B, C, OC);
    CHECK(tl_max_rel(dw_only, dw1, (size_t)OC * C, 1e-6) <= 1e-6, "%s: dw alone differs", what);
    free(dw_only);
    free(dinp1), free(dw1), free(db1), free(dinp), free(dw), free(db), free(R);
    free(k.out), free(k.inp), free(k.w), free(k.b);
}

// ----------------------------------------------------------------------------
// conv2d

typedef struct {
    float *out, *col, *inp, *w, *b;
    int B, IC, H, W, OC, K, S, P;
} conv_ctx;

static void conv_fwd(void *c) {
    conv_ctx *k = c;
    dt_conv2d_forward(k->out, k->col, k->inp, k->w, k->b, k->B, k->IC, k->H, k->W, k->OC, k->K,
                      k->S, k->P);
}

static void test_conv(int B, int IC, int H, int W, int OC, int K, int S, int P) {
    char what[128], w2[160];
    snprintf(what, sizeof what, "conv2d B=%d IC=%d %dx%d OC=%d K=%d S=%d P=%d", B, IC, H, W, OC,
             K, S, P);
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    size_t nin = (size_t)B * IC * H * W, nw = (size_t)OC * IC * K * K,
           nout = (size_t)B * OC * OH * OW, ncol = dt_conv2d_col_size(B, IC, H, W, OC, K, S, P);
    CHECK(ncol >= nin && ncol <= 64 * (nin + nout + nw + OC + 64), "%s: col size %zu", what, ncol);
    conv_ctx k = {zeros(nout), zeros(ncol), randn(nin, 1), randn(nw, 0.5f), randn(OC, 0.5f),
                  B, IC, H, W, OC, K, S, P};
    conv_fwd(&k);
    // naive reference
    double worst = 0;
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OC; o++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    double s = k.b[o], sa = fabs(k.b[o]);
                    for (int c = 0; c < IC; c++)
                        for (int kh = 0; kh < K; kh++)
                            for (int kw = 0; kw < K; kw++) {
                                int ih = oh * S - P + kh, iw = ow * S - P + kw;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                double t = (double)k.inp[((size_t)(b * IC + c) * H + ih) * W + iw] *
                                           k.w[((size_t)(o * IC + c) * K + kh) * K + kw];
                                s += t;
                                sa += fabs(t);
                            }
                    // float rounding is relative to the sum of |terms|
                    float got = k.out[((size_t)(b * OC + o) * OH + oh) * OW + ow];
                    worst = fmax(worst, fabs(got - s) / sa);
                }
    CHECK(worst < 1e-5, "%s forward vs naive: rel %.2e", what, worst);

    float *R = randn(nout, 1);
    float *dinp = zeros(nin), *dw = zeros(nw), *db = zeros(OC), *dcol = zeros(ncol);
    dt_conv2d_backward(dinp, dw, db, dcol, R, k.col, k.w, B, IC, H, W, OC, K, S, P);
    fd_problem p = {conv_fwd, &k, k.out, nout, R};
    snprintf(w2, sizeof w2, "%s dinp", what);
    fd_check(&p, k.inp, dinp, nin, 1e-2f, w2);
    snprintf(w2, sizeof w2, "%s dw", what);
    fd_check(&p, k.w, dw, nw, 1e-2f, w2);
    snprintf(w2, sizeof w2, "%s db", what);
    fd_check(&p, k.b, db, OC, 1e-2f, w2);

    float *dinp1 = copy(dinp, nin), *dw1 = copy(dw, nw), *db1 = copy(db, OC);
    dt_conv2d_backward(dinp, dw, db, dcol, R, k.col, k.w, B, IC, H, W, OC, K, S, P);
    snprintf(w2, sizeof w2, "%s dinp", what);
    check_doubled(dinp, dinp1, nin, w2);
    snprintf(w2, sizeof w2, "%s dw", what);
    check_doubled(dw, dw1, nw, w2);
    snprintf(w2, sizeof w2, "%s db", what);
    check_doubled(db, db1, OC, w2);

    // Only dw wanted (first layer of a model): same dw, nothing else touched.
    float *dw_only = zeros(nw);
    dt_conv2d_backward(NULL, dw_only, NULL, dcol, R, k.col, k.w, B, IC, H, W, OC, K, S, P);
    CHECK(tl_max_rel(dw_only, dw1, nw, 1e-6) <= 1e-6, "%s: dw alone differs", what);
    free(dw_only);
    free(dinp1), free(dw1), free(db1), free(dinp), free(dw), free(db), free(dcol), free(R);
    free(k.out), free(k.col), free(k.inp), free(k.w), free(k.b);
}

// ----------------------------------------------------------------------------
// maxpool

typedef struct {
    float *out;
    int32_t *argmax;
    float *inp;
    int B, C, H, W, K, S;
} pool_ctx;

static void pool_fwd(void *c) {
    pool_ctx *k = c;
    dt_maxpool_forward(k->out, k->argmax, k->inp, k->B, k->C, k->H, k->W, k->K, k->S);
}

static void test_maxpool(int B, int C, int H, int W, int K, int S) {
    char what[96], w2[128];
    snprintf(what, sizeof what, "maxpool B=%d C=%d %dx%d K=%d S=%d", B, C, H, W, K, S);
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    size_t nin = (size_t)B * C * H * W, nout = (size_t)B * C * OH * OW;
    pool_ctx k = {zeros(nout), calloc(nout, sizeof(int32_t)), distinct(nin, 0.05f), B, C, H, W, K, S};
    pool_fwd(&k);
    int ok = 1;
    for (int bc = 0; bc < B * C; bc++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                float m = -INFINITY;
                int mi = -1;
                for (int kh = 0; kh < K; kh++)
                    for (int kw = 0; kw < K; kw++) {
                        int idx = (oh * S + kh) * W + ow * S + kw;
                        float v = k.inp[(size_t)bc * H * W + idx];
                        if (v > m) m = v, mi = idx;
                    }
                size_t o = ((size_t)bc * OH + oh) * OW + ow;
                if (k.out[o] != m || k.argmax[o] != mi) ok = 0;
            }
    CHECK(ok, "%s forward: max or argmax differs from naive", what);
    float *R = randn(nout, 1), *dinp = zeros(nin);
    dt_maxpool_backward(dinp, R, k.argmax, B, C, H, W, K, S);
    fd_problem p = {pool_fwd, &k, k.out, nout, R};
    snprintf(w2, sizeof w2, "%s dinp", what);
    fd_check(&p, k.inp, dinp, nin, 5e-3f, w2);
    float *d1 = copy(dinp, nin);
    dt_maxpool_backward(dinp, R, k.argmax, B, C, H, W, K, S);
    check_doubled(dinp, d1, nin, w2);
    free(d1), free(dinp), free(R), free(k.out), free(k.argmax), free(k.inp);
}

// ----------------------------------------------------------------------------
// element-wise activations

typedef struct {
    float *out, *inp;
    size_t N;
    int gelu;
} act_ctx;

static void act_fwd(void *c) {
    act_ctx *k = c;
    if (k->gelu) dt_gelu_forward(k->out, k->inp, k->N);
    else dt_relu_forward(k->out, k->inp, k->N);
}

static void test_activation(int gelu) {
    const char *what = gelu ? "gelu" : "relu";
    size_t N = 301;
    act_ctx k = {zeros(N), randn(N, 2), N, gelu};
    if (!gelu) // keep relu inputs away from the kink at 0
        for (size_t i = 0; i < N; i++)
            if (fabsf(k.inp[i]) < 0.1f) k.inp[i] += k.inp[i] < 0 ? -0.1f : 0.1f;
    k.inp[0] = 9.0f, k.inp[1] = -9.0f; // saturated tails
    act_fwd(&k);
    double worst = 0;
    for (size_t i = 0; i < N; i++) {
        double x = k.inp[i], ref;
        if (gelu) ref = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
        else ref = x > 0 ? x : 0;
        // 1 + tanh(u) cancels for negative x, in float as in PyTorch: an
        // absolute floor of 0.1 on the output
        worst = fmax(worst, tl_rel(k.out[i], ref, 0.1));
    }
    CHECK(worst < 1e-5, "%s forward vs double formula: rel %.2e", what, worst);
    float *R = randn(N, 1), *dinp = zeros(N);
    if (gelu) dt_gelu_backward(dinp, R, k.inp, N);
    else dt_relu_backward(dinp, R, k.inp, N);
    fd_problem p = {act_fwd, &k, k.out, N, R};
    char w2[64];
    snprintf(w2, sizeof w2, "%s dinp", what);
    fd_check(&p, k.inp, dinp, N, 1e-2f, w2);
    float *d1 = copy(dinp, N);
    if (gelu) dt_gelu_backward(dinp, R, k.inp, N);
    else dt_relu_backward(dinp, R, k.inp, N);
    check_doubled(dinp, d1, N, w2);
    free(d1), free(dinp), free(R), free(k.out), free(k.inp);
}

// ----------------------------------------------------------------------------
// layernorm

typedef struct {
    float *out, *mean, *rstd, *inp, *w, *b;
    int N, C;
} ln_ctx;

static void ln_fwd(void *c) {
    ln_ctx *k = c;
    dt_layernorm_forward(k->out, k->mean, k->rstd, k->inp, k->w, k->b, k->N, k->C, 1e-5f);
}

static void test_layernorm(int N, int C) {
    char what[64], w2[96];
    snprintf(what, sizeof what, "layernorm N=%d C=%d", N, C);
    size_t n = (size_t)N * C;
    ln_ctx k = {zeros(n), zeros(N), zeros(N), randn(n, 1.5f), randn(C, 1), randn(C, 1), N, C};
    for (int i = 0; i < N; i++) k.inp[(size_t)i * C] += 3.0f; // non-zero row means
    ln_fwd(&k);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += k.inp[(size_t)i * C + c];
        m /= C;
        for (int c = 0; c < C; c++) v += pow(k.inp[(size_t)i * C + c] - m, 2);
        v /= C;
        worst = fmax(worst, tl_rel(k.mean[i], m, 1e-3));
        worst = fmax(worst, tl_rel(k.rstd[i], 1 / sqrt(v + 1e-5), 1e-3));
        for (int c = 0; c < C; c++) {
            double ref = (k.inp[(size_t)i * C + c] - m) / sqrt(v + 1e-5) * k.w[c] + k.b[c];
            worst = fmax(worst, tl_rel(k.out[(size_t)i * C + c], ref, 1e-3));
        }
    }
    CHECK(worst < 1e-5, "%s forward vs double reference: rel %.2e", what, worst);
    float *R = randn(n, 1), *dinp = zeros(n), *dw = zeros(C), *db = zeros(C);
    dt_layernorm_backward(dinp, dw, db, R, k.inp, k.w, k.mean, k.rstd, N, C);
    fd_problem p = {ln_fwd, &k, k.out, n, R};
    snprintf(w2, sizeof w2, "%s dinp", what);
    fd_check(&p, k.inp, dinp, n, 1e-2f, w2);
    snprintf(w2, sizeof w2, "%s dw", what);
    fd_check(&p, k.w, dw, C, 1e-2f, w2);
    snprintf(w2, sizeof w2, "%s db", what);
    fd_check(&p, k.b, db, C, 1e-2f, w2);
    float *dinp1 = copy(dinp, n), *dw1 = copy(dw, C), *db1 = copy(db, C);
    dt_layernorm_backward(dinp, dw, db, R, k.inp, k.w, k.mean, k.rstd, N, C);
    snprintf(w2, sizeof w2, "%s dinp", what);
    check_doubled(dinp, dinp1, n, w2);
    snprintf(w2, sizeof w2, "%s dw", what);
    check_doubled(dw, dw1, C, w2);
    snprintf(w2, sizeof w2, "%s db", what);
    check_doubled(db, db1, C, w2);
    float *dw_only = zeros(C);
    dt_layernorm_backward(NULL, dw_only, NULL, R, k.inp, k.w, k.mean, k.rstd, N, C);
    CHECK(tl_max_rel(dw_only, dw1, C, 1e-6) <= 1e-6, "%s: dw alone differs", what);
    free(dw_only);
    free(dinp1), free(dw1), free(db1), free(dinp), free(dw), free(db), free(R);
    free(k.out), free(k.mean), free(k.rstd), free(k.inp), free(k.w), free(k.b);
}

// ----------------------------------------------------------------------------
// dropout

static void test_dropout(void) {
    const size_t N = 200000;
    const float ps[] = {0.1f, 0.5f, 0.8f};
    float *inp = randn(N, 1), *out = zeros(N), *mask = zeros(N), *mask2 = zeros(N);
    for (int t = 0; t < 3; t++) {
        float p = ps[t];
        dt_rng r;
        dt_rng_seed(&r, 1234 + t);
        dt_dropout_forward(out, mask, inp, N, p, &r);
        size_t zero = 0, bad_val = 0, bad_out = 0;
        float keep = 1.0f / (1.0f - p);
        for (size_t i = 0; i < N; i++) {
            if (mask[i] == 0.0f) zero++;
            else if (fabsf(mask[i] - keep) > 1e-6f * keep) bad_val++;
            if (out[i] != inp[i] * mask[i]) bad_out++;
        }
        double frac = (double)zero / N, sigma = sqrt(p * (1 - p) / N);
        CHECK(fabs(frac - p) < 5 * sigma, "dropout p=%.1f: dropped fraction %.4f (5 sigma = %.4f)",
              p, frac, 5 * sigma);
        CHECK(bad_val == 0, "dropout p=%.1f: %zu kept mask values are not 1/(1-p) = %g", p,
              bad_val, keep);
        CHECK(bad_out == 0, "dropout p=%.1f: %zu outputs are not inp*mask", p, bad_out);
        // The scaling keeps the expectation: mean(mask) ~ 1.
        double mm = 0;
        for (size_t i = 0; i < N; i++) mm += mask[i];
        mm /= N;
        double sm = sqrt(p / (1 - p) / N);
        CHECK(fabs(mm - 1) < 5 * sm, "dropout p=%.1f: mean mask %.4f, expected 1", p, mm);
        // Same seed, same mask; another seed, another mask.
        dt_rng_seed(&r, 1234 + t);
        dt_dropout_forward(out, mask2, inp, N, p, &r);
        CHECK(!memcmp(mask, mask2, sizeof(float) * N), "dropout p=%.1f: same seed, different mask", p);
        dt_rng_seed(&r, 999);
        dt_dropout_forward(out, mask2, inp, N, p, &r);
        CHECK(memcmp(mask, mask2, sizeof(float) * N), "dropout p=%.1f: other seed, same mask", p);
        // The generator advances: a second draw differs from the first.
        dt_rng_seed(&r, 1234 + t);
        dt_dropout_forward(out, mask2, inp, N, p, &r);
        dt_dropout_forward(out, mask2, inp, N, p, &r);
        CHECK(memcmp(mask, mask2, sizeof(float) * N), "dropout p=%.1f: rng does not advance", p);
    }
    // Backward with a fixed mask: dinp += mask * dout, one rounding (fmaf:
    // the rule the GPU's kernel shares, whatever a compiler contracts).
    dt_rng r;
    dt_rng_seed(&r, 7);
    const size_t n = 1000;
    dt_dropout_forward(out, mask, inp, n, 0.3f, &r);
    float *dout = randn(n, 1), *dinp = randn(n, 1), *d0 = copy(dinp, n);
    dt_dropout_backward(dinp, dout, mask, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (dinp[i] != fmaf(dout[i], mask[i], d0[i])) bad++;
    CHECK(bad == 0, "dropout backward: %zu elements are not dinp + mask*dout", bad);
    // p = 0 keeps everything unscaled.
    dt_dropout_forward(out, mask, inp, n, 0.0f, &r);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        if (mask[i] != 1.0f || out[i] != inp[i]) bad++;
    CHECK(bad == 0, "dropout p=0: %zu elements changed", bad);
    free(dout), free(dinp), free(d0), free(inp), free(out), free(mask), free(mask2);
}

// ----------------------------------------------------------------------------
// softmax cross-entropy

typedef struct {
    float *probs, *logits;
    const int32_t *targets;
    int B, V;
    float loss;
} ce_ctx;

static void ce_fwd(void *c) {
    ce_ctx *k = c;
    k->loss = dt_crossentropy_forward(k->probs, k->logits, k->targets, k->B, k->V);
}

static void test_crossentropy(int B, int V) {
    char what[64], w2[96];
    snprintf(what, sizeof what, "crossentropy B=%d V=%d", B, V);
    size_t n = (size_t)B * V;
    int32_t *tg = malloc(sizeof(int32_t) * B);
    for (int i = 0; i < B; i++) tg[i] = (int32_t)dt_rng_below(&g_rng, V);
    ce_ctx k = {zeros(n), randn(n, 2), tg, B, V, 0};
    ce_fwd(&k);
    double ref = 0, worst_p = 0;
    for (int i = 0; i < B; i++) {
        const float *l = k.logits + (size_t)i * V;
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, l[v]);
        for (int v = 0; v < V; v++) s += exp(l[v] - mx);
        ref += mx + log(s) - l[tg[i]];
        for (int v = 0; v < V; v++)
            worst_p = fmax(worst_p, tl_rel(k.probs[(size_t)i * V + v], exp(l[v] - mx) / s, 1e-4));
    }
    ref /= B;
    CHECK_NEAR(k.loss, ref, 1e-6, "crossentropy loss vs double reference");
    CHECK(worst_p < 1e-5, "%s: probs vs double reference rel %.2e", what, worst_p);
    // L = loss * dloss: the backward's dloss scales the gradient.
    const float dloss = 0.75f;
    float *dl = zeros(n);
    dt_crossentropy_backward(dl, k.probs, tg, B, V, 1.0f);
    float R = 1.0f;
    fd_problem p = {ce_fwd, &k, &k.loss, 1, &R};
    snprintf(w2, sizeof w2, "%s dlogits", what);
    fd_check(&p, k.logits, dl, n, 1e-2f, w2);
    float *dl1 = copy(dl, n), *ds = zeros(n);
    dt_crossentropy_backward(dl, k.probs, tg, B, V, 1.0f);
    check_doubled(dl, dl1, n, w2);
    dt_crossentropy_backward(ds, k.probs, tg, B, V, dloss);
    for (size_t i = 0; i < n; i++) dl1[i] *= dloss;
    CHECK(tl_max_rel(ds, dl1, n, 1e-6) < 1e-5, "%s: dloss does not scale the gradient", what);
    // Large logits stay finite (max subtraction).
    for (size_t i = 0; i < n; i++) k.logits[i] = 1000.0f + (float)(i % V);
    ce_fwd(&k);
    CHECK(isfinite(k.loss), "%s: loss of large logits is %g", what, k.loss);
    free(ds), free(dl1), free(dl), free(k.probs), free(k.logits), free(tg);
}

// ----------------------------------------------------------------------------
// a whole model

static const dt_layer_spec CNN[] = {
    {.kind = DT_LAYER_CONV2D, .out = 4, .kernel = 3, .stride = 1, .pad = 1},
    {.kind = DT_LAYER_RELU},
    {.kind = DT_LAYER_MAXPOOL, .kernel = 2},
    {.kind = DT_LAYER_FLATTEN},
    {.kind = DT_LAYER_LINEAR, .out = 16},
    {.kind = DT_LAYER_LAYERNORM},
    {.kind = DT_LAYER_GELU},
    {.kind = DT_LAYER_LINEAR, .out = 5},
};
static const int CNN_IN[3] = {2, 8, 8};
#define CNN_N ((int)(sizeof CNN / sizeof CNN[0]))

static float model_loss(dt_model *m, const float *x, const int32_t *y, int B) {
    float loss = NAN;
    dt_status st = dt_model_forward(m, x, y, B, 0, &loss);
    CHECK(st == DT_OK, "model forward: %s", dt_last_error());
    return loss;
}

static void test_model_grad(void) {
    const int B = 3;
    dt_model *m;
    dt_status st = dt_model_create(&m, CNN_IN, CNN, CNN_N, B);
    CHECK(st == DT_OK, "model create: %s", dt_last_error());
    if (st != DT_OK) return;
    dt_model_init(m, 42);
    size_t np = dt_model_num_params(m);
    // 4*2*9+4 + 16*64+16 + 16+16 + 5*16+5
    CHECK(np == 76 + 1040 + 32 + 85, "model: %zu parameters", np);
    int in = dt_model_input_size(m);
    float *x = randn((size_t)B * in, 1);
    int32_t y[3] = {0, 3, 4};
    float *params = dt_model_params(m);
    dt_model_zero_grad(m);
    float loss0 = model_loss(m, x, y, B);
    CHECK(dt_model_backward(m) == DT_OK, "model backward: %s", dt_last_error());
    float *g = copy(dt_model_grads(m), np);
    // Accumulates: a second backward doubles the block.
    CHECK(dt_model_backward(m) == DT_OK, "model backward: %s", dt_last_error());
    check_doubled(dt_model_grads(m), g, np, "model gradient block");
    CHECK(model_loss(m, x, y, B) == loss0, "model: forward is not repeatable");

    // Finite differences of the float loss for a sample of every tensor:
    // either step may pass (a larger one is less noisy, a smaller one
    // less likely to cross a relu or maxpool kink).
    const float eps[2] = {1e-2f, 1e-3f};
    double gmax = maxabs(g, np), floor = 1e-2 * gmax, worst = 0;
    int checked = 0, bad = 0;
    for (int t = 0; t < dt_model_num_tensors(m); t++) {
        const dt_tensor_info *ti = dt_model_tensor(m, t);
        int ns = ti->numel < 12 ? (int)ti->numel : 12;
        for (int s = 0; s < ns; s++) {
            size_t j = ti->offset + (ns == (int)ti->numel ? (size_t)s
                                                          : dt_rng_below(&g_rng, (uint32_t)ti->numel));
            double best = INFINITY, best_num = 0;
            for (int e = 0; e < 2; e++) {
                float p0 = params[j];
                params[j] = p0 + eps[e];
                float pp = params[j];
                double lp = model_loss(m, x, y, B);
                params[j] = p0 - eps[e];
                float pm = params[j];
                double lm = model_loss(m, x, y, B);
                params[j] = p0;
                double num = (lp - lm) / ((double)pp - pm);
                double rel = fabs(num - g[j]) / fmax(fmax(fabs(num), fabs(g[j])), floor);
                if (rel < best) best = rel, best_num = num;
            }
            checked++;
            if (best > RTOL) {
                bad++;
                fprintf(stderr, "  %s[%zu]: backward %.6g, numeric %.6g (rel %.2e)\n", ti->name,
                        j - ti->offset, g[j], best_num, best);
            }
            if (best > worst) worst = best;
        }
    }
    g_worst_model = worst;
    CHECK(bad == 0, "model: %d of %d sampled parameters differ from finite differences", bad,
          checked);
    CHECK(checked > 60, "model: only %d parameters sampled", checked);
    free(g), free(x);
    dt_model_free(m);
}

// Pipeline stages: the model cut in two at every layer boundary (across a
// convolution and the relu it runs, that relu and the maxpool doing its
// backward, blocked layouts, dropout) gives the whole model's loss and
// gradient block bitwise, the stream copied between the stages.
static void test_model_stages(void) {
    static const dt_layer_spec net[] = {
        {.kind = DT_LAYER_CONV2D, .out = 6, .kernel = 5, .stride = 1, .pad = 2},
        {.kind = DT_LAYER_RELU},
        {.kind = DT_LAYER_MAXPOOL, .kernel = 2},
        {.kind = DT_LAYER_CONV2D, .out = 8, .kernel = 3, .stride = 2},
        {.kind = DT_LAYER_RELU},
        {.kind = DT_LAYER_FLATTEN},
        {.kind = DT_LAYER_LINEAR, .out = 32},
        {.kind = DT_LAYER_RELU},
        {.kind = DT_LAYER_DROPOUT, .p = 0.3f},
        {.kind = DT_LAYER_LINEAR, .out = 10},
    };
    const int n = (int)(sizeof net / sizeof *net), B = 5, shape[3] = {1, 12, 12};
    dt_model *m;
    if (dt_model_create(&m, shape, net, n, B) != DT_OK) {
        CHECK(0, "stages: model create: %s", dt_last_error());
        return;
    }
    dt_model_init(m, 9);
    size_t np = dt_model_num_params(m);
    float *x = randn((size_t)B * dt_model_input_size(m), 1);
    int32_t y[5] = {1, 0, 9, 4, 7};
    float whole_loss = NAN;
    dt_model_set_dropout_key(m, 3, 10);
    dt_model_zero_grad(m);
    CHECK(dt_model_forward(m, x, y, B, 1, &whole_loss) == DT_OK && dt_model_backward(m) == DT_OK, "stages: whole model: %s",
          dt_last_error());
    float *g = copy(dt_model_grads(m), np);
    CHECK(dt_model_stream_size(m, 0) == 144 && dt_model_stream_size(m, n) == 10 && dt_model_stream_size(m, 6) == 32,
          "stages: stream sizes %zu, %zu, %zu", dt_model_stream_size(m, 0), dt_model_stream_size(m, n),
          dt_model_stream_size(m, 6));
    int equal = 0;
    for (int cut = 1; cut < n; cut++) {
        dt_model_acts *a = NULL, *b = NULL;
        float loss = NAN, *din = NULL, *din0 = NULL;
        dt_status st = dt_model_acts_create(&a, m, 0, cut, B);
        if (st == DT_OK) st = dt_model_acts_create(&b, m, cut, n, B);
        dt_model_zero_grad(m);
        dt_model_set_dropout_key(m, 3, 10);
        if (st == DT_OK) st = dt_model_forward_range(m, a, x, NULL, B, 1, NULL);
        if (st == DT_OK) {
            memcpy(dt_model_acts_input(b), dt_model_acts_output(a), sizeof(float) * B * dt_model_stream_size(m, cut));
            st = dt_model_forward_range(m, b, NULL, y, B, 1, &loss);
        }
        if (st == DT_OK) st = dt_model_backward_range(m, b, NULL, &din);
        if (st == DT_OK) st = dt_model_backward_range(m, a, din, &din0);
        CHECK(st == DT_OK && din && !din0, "stages cut at %d: %s", cut, st == DT_OK ? "no input gradient" : dt_last_error());
        int same = st == DT_OK && loss == whole_loss && !memcmp(dt_model_grads(m), g, sizeof(float) * np);
        CHECK(same, "stages cut at %d: loss %.9g vs %.9g, gradients max rel diff %.3g", cut, loss, whole_loss,
              tl_max_rel(dt_model_grads(m), g, np, 1e-3));
        equal += same;
        dt_model_acts_free(a);
        dt_model_acts_free(b);
    }
    dt_model_acts *bad = NULL;
    CHECK(dt_model_acts_create(&bad, m, 3, 3, B) == DT_ERR_ARG && !bad, "stages: an empty stage is refused");
    printf("model stages: cut at each of %d boundaries, loss and gradients bitwise the whole model's in %d\n", n - 1, equal);
    free(g), free(x);
    dt_model_free(m);
}

// ----------------------------------------------------------------------------
// tensor-parallel shards of a sequential model against the whole
//
// The shards run as coroutines on the main thread (ucontext), each on a
// stack of its own: a shard's sum switches back to a scheduler, which adds
// the shards' buffers in rank order (an allreduce giving every shard the
// same bits) once every shard has reached its sum. (test_conv runs shards
// in threads.)

typedef struct {
    ucontext_t sched;
    float *bufs[4];
    size_t n[4];
    int ntp;
} tp_group;

typedef struct {
    tp_group *g;
    ucontext_t ctx;
    char *stack;
    int r, calls, fwd_calls, done;
    dt_model *m;
    const float *x;
    const int32_t *y;
    float loss;
    dt_status st;
} tp_shard;

static dt_status tp_sum(float *buf, size_t n, void *user) {
    tp_shard *s = user;
    s->calls++;
    s->g->bufs[s->r] = buf;
    s->g->n[s->r] = n;
    swapcontext(&s->ctx, &s->g->sched);
    return DT_OK;
}

enum { TP_B = 4 };
static tp_shard *g_tp_cur;  // the shard the scheduler starts

static void tp_step(void) {
    tp_shard *s = g_tp_cur;
    dt_model_zero_grad(s->m);
    dt_model_set_dropout_key(s->m, 5, 20);
    s->st = dt_model_forward(s->m, s->x, s->y, TP_B, 1, &s->loss);
    s->fwd_calls = s->calls;
    if (s->st == DT_OK) s->st = dt_model_backward(s->m);
    s->done = 1;
}

// Runs the shards' steps to their ends; 0 when they met at different sums.
static int tp_run(tp_shard *sh, int ntp) {
    tp_group *g = sh[0].g;
    for (int r = 0; r < ntp; r++) {
        getcontext(&sh[r].ctx);
        sh[r].stack = malloc((size_t)16 << 20);
        sh[r].ctx.uc_stack.ss_sp = sh[r].stack;
        sh[r].ctx.uc_stack.ss_size = (size_t)16 << 20;
        sh[r].ctx.uc_link = &g->sched;
        makecontext(&sh[r].ctx, tp_step, 0);
    }
    for (;;) {
        int at = 0, done = 0;
        for (int r = 0; r < ntp; r++) {
            if (sh[r].done) {
                done++;
                continue;
            }
            g_tp_cur = &sh[r];
            swapcontext(&g->sched, &sh[r].ctx);
            if (sh[r].done) done++;
            else at++;
        }
        if (done == ntp) return 1;
        if (at != ntp) return 0;
        size_t n = g->n[0];
        for (int r = 1; r < ntp; r++)
            if (g->n[r] != n) return 0;
        for (size_t i = 0; i < n; i++) {
            float v = g->bufs[0][i];
            for (int r = 1; r < ntp; r++) v += g->bufs[r][i];
            for (int r = 0; r < ntp; r++) g->bufs[r][i] = v;
        }
    }
}


// One layout of ntp shards against the whole model m (its loss, logits
// and gradient block from the same step): a shard's initial parameters are
// its part of the whole model's bitwise; loss and logits agree within 1e-5,
// the gradients assembled from the shards within 1e-4 (single gradients of
// a step: the partial sums' rounding, as 1 and 2 threads differ below);
// one sum a pair forward, one backward but for the pair starting at layer
// 0 (it has no input gradient).
static void test_tp_layout(dt_model *whole, float wloss, const float *wlogits, const float *wgrads, const float *x,
                           const int32_t *y, int ntp) {
    size_t nw = dt_model_num_params(whole);
    tp_group g = {.ntp = ntp};
    tp_shard sh[4] = {{0}};
    float *init = malloc(sizeof(float) * nw), *grads = malloc(sizeof(float) * nw);
    for (size_t i = 0; i < nw; i++) init[i] = grads[i] = NAN;
    int ok = 1;
    for (int r = 0; r < ntp && ok; r++) {
        sh[r] = (tp_shard){.g = &g, .r = r, .x = x, .y = y};
        ok = dt_model_create_shard(&sh[r].m, TP_IN, TP_NET, TP_N, TP_B, r, ntp) == DT_OK;
        CHECK(ok, "tensor %d: shard %d: %s", ntp, r, dt_last_error());
        if (!ok) break;
        dt_model_init(sh[r].m, 11);
        dt_model_set_reduce(sh[r].m, tp_sum, &sh[r]);
        dt_model_shard_fill(sh[r].m, r, dt_model_params(sh[r].m), 0, nw, init);
    }
    if (ok) {
        CHECK(!memcmp(init, dt_model_params(whole), sizeof(float) * nw),
              "tensor %d: the shards' initial parameters are not the whole model's bitwise", ntp);
        size_t np, act;
        CHECK(dt_model_shard_memory(TP_IN, TP_NET, TP_N, TP_B, ntp, &np, &act) == DT_OK &&
                  np == dt_model_num_params(sh[0].m) && act == dt_model_act_bytes(sh[0].m, NULL),
              "tensor %d: dt_model_shard_memory %zu parameters, %zu bytes; the shard %zu, %zu", ntp, np, act,
              dt_model_num_params(sh[0].m), dt_model_act_bytes(sh[0].m, NULL));
        CHECK(tp_run(sh, ntp), "tensor %d: the shards met at different sums", ntp);
        for (int r = 0; r < ntp; r++) {
            CHECK(sh[r].st == DT_OK && sh[r].done && sh[r].fwd_calls == 2 && sh[r].calls == 3,
                  "tensor %d: shard %d: %s; %d sums forward, %d backward (want 2, 1)", ntp, r,
                  sh[r].st == DT_OK ? "ok" : dt_last_error(), sh[r].fwd_calls, sh[r].calls - sh[r].fwd_calls);
            CHECK_NEAR(sh[r].loss, wloss, 1e-5, "tensor-parallel loss");
            double d = tl_max_rel(dt_model_logits(sh[r].m), wlogits, (size_t)TP_B * 5, 1e-3);
            CHECK(d <= 1e-5, "tensor %d: shard %d's logits differ from the whole model's by rel %.3g", ntp, r, d);
            dt_model_shard_fill(sh[r].m, r, dt_model_grads(sh[r].m), 0, nw, grads);
        }
        double d = tl_max_rel(grads, wgrads, nw, 1e-3);
        CHECK(d <= 1e-4, "tensor %d: the shards' gradients differ from the whole model's by rel %.3g", ntp, d);
        printf("tensor parallel %d: %zu of %zu parameters a shard; initial parameters bitwise, loss %.9g vs %.9g, "
               "gradients max rel diff %.2e\n", ntp, dt_model_num_params(sh[0].m), nw, sh[0].loss, wloss, d);
    }
    for (int r = 0; r < ntp; r++) dt_model_free(sh[r].m), free(sh[r].stack);
    free(init), free(grads);
}

static void test_tensor_parallel(void) {
    dt_model *m;
    if (dt_model_create(&m, TP_IN, TP_NET, TP_N, TP_B) != DT_OK) {
        CHECK(0, "tensor parallel: whole model: %s", dt_last_error());
        return;
    }
    dt_model_init(m, 11);
    size_t nw = dt_model_num_params(m);
    float *x = randn((size_t)TP_B * dt_model_input_size(m), 1);
    int32_t y[TP_B] = {1, 4, 0, 3};
    float loss = NAN;
    dt_model_zero_grad(m);
    dt_model_set_dropout_key(m, 5, 20);
    CHECK(dt_model_forward(m, x, y, TP_B, 1, &loss) == DT_OK && dt_model_backward(m) == DT_OK,
          "tensor parallel: whole model: %s", dt_last_error());
    float *logits = copy(dt_model_logits(m), (size_t)TP_B * 5), *g = copy(dt_model_grads(m), nw);
    test_tp_layout(m, loss, logits, g, x, y, 2);
    test_tp_layout(m, loss, logits, g, x, y, 4);

    // A shard's tensors: its part, the whole model's shape beside it.
    dt_model *s;
    if (dt_model_create_shard(&s, TP_IN, TP_NET, TP_N, TP_B, 1, 2) == DT_OK) {
        const dt_tensor_info *c0 = dt_model_tensor(s, 0), *w0 = dt_model_whole_tensor(s, 0);
        const dt_tensor_info *c4 = dt_model_tensor(s, 2), *w4 = dt_model_whole_tensor(s, 2);
        const dt_tensor_info *l9 = dt_model_tensor(s, 6), *w9 = dt_model_whole_tensor(s, 6);
        CHECK(c0->shape[0] == 16 && w0->shape[0] == 32 && w0->shape[1] == 3 && w0->offset == 0,
              "tensor 2: 0.weight [%lld, ...] of [%lld, %lld, ...]", (long long)c0->shape[0], (long long)w0->shape[0],
              (long long)w0->shape[1]);
        CHECK(!strcmp(c4->name, "4.weight") && c4->shape[0] == 8 && c4->shape[1] == 16 && w4->shape[1] == 32 &&
                  w4->offset == 32 * 27 + 32,
              "tensor 2: %s [%lld, %lld] of [%lld, %lld] at %zu", c4->name, (long long)c4->shape[0],
              (long long)c4->shape[1], (long long)w4->shape[0], (long long)w4->shape[1], w4->offset);
        CHECK(!strcmp(l9->name, "9.weight") && l9->shape[1] == 8 && w9->shape[1] == 16 && dt_model_tensor_split(s, 6) &&
                  !dt_model_tensor_split(s, 7) && dt_model_tensor_split(s, 1) && !dt_model_tensor_split(s, 8),
              "tensor 2: %s [10, %lld] of [10, %lld]; split 9.weight, not 9.bias, 0.bias, not 10.weight", l9->name,
              (long long)l9->shape[1], (long long)w9->shape[1]);
        dt_model_free(s);
    }
    // T must divide a column-parallel convolution's channels; a model with
    // no pair (a convolution, then layernorm) is refused.
    CHECK(dt_model_tensor_parallel_check(TP_NET, TP_N, 3, "tensor") == DT_ERR_CONFIG &&
              strstr(dt_last_error(), "tensor = 3 does not divide the 32 output channels of layer 0 (conv2d out=32)"),
          "tensor 3: %s", dt_last_error());
    static const dt_layer_spec none[] = {
        {.kind = DT_LAYER_CONV2D, .out = 4, .kernel = 3}, {.kind = DT_LAYER_FLATTEN}, {.kind = DT_LAYER_LAYERNORM},
        {.kind = DT_LAYER_LINEAR, .out = 5}};
    CHECK(dt_model_tensor_parallel_check(none, 4, 2, "tensor") == DT_ERR_CONFIG &&
              strstr(dt_last_error(), "tensor = 2: the model has no two linear or conv2d layers"),
          "conv, flatten, layernorm, linear: %s", dt_last_error());
    free(x), free(logits), free(g);
    dt_model_free(m);
}

/* Forward, backward and three AdamW steps with a given thread count; returns
 * the concatenation of losses, logits, gradients and final parameters. */
static float *model_run(int threads, size_t *len) {
    dt_set_threads(threads);
    const int B = 16;
    dt_layer_spec big[CNN_N];
    memcpy(big, CNN, sizeof big);
    big[0].out = 8;
    big[4].out = 64;
    dt_model *m;
    if (dt_model_create(&m, CNN_IN, big, CNN_N, B) != DT_OK) return NULL;
    dt_model_init(m, 5);
    dt_rng r;
    dt_rng_seed(&r, 77);
    int in = dt_model_input_size(m), V = dt_model_num_classes(m);
    size_t np = dt_model_num_params(m);
    float *x = malloc(sizeof(float) * B * in);
    int32_t y[16];
    for (int i = 0; i < B * in; i++) x[i] = dt_rng_normal(&r);
    for (int i = 0; i < B; i++) y[i] = (int32_t)dt_rng_below(&r, V);
    dt_optim_params op = dt_optim_default_params(DT_OPTIM_ADAMW);
    dt_optim *o;
    dt_optim_create(&o, &op, np);
    const int steps = 3;
    *len = steps + (size_t)B * V + 2 * np;
    float *res = malloc(sizeof(float) * *len), *q = res;
    for (int s = 0; s < steps; s++) {
        dt_model_zero_grad(m);
        dt_model_forward(m, x, y, B, 1, q++);
        dt_model_backward(m);
        if (s == steps - 1) {
            memcpy(q, dt_model_logits(m), sizeof(float) * B * V);
            q += B * V;
            memcpy(q, dt_model_grads(m), sizeof(float) * np);
            q += np;
        }
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), op.lr, 1.0f);
    }
    memcpy(q, dt_model_params(m), sizeof(float) * np);
    dt_optim_free(o);
    free(x);
    dt_model_free(m);
    return res;
}

static void test_determinism(void) {
    size_t n1, n1b, n2, n2b;
    float *a1 = model_run(1, &n1), *b1 = model_run(1, &n1b);
    float *a2 = model_run(2, &n2), *b2 = model_run(2, &n2b);
    dt_set_threads(0);
    CHECK(a1 && b1 && a2 && b2, "determinism: model run failed: %s", dt_last_error());
    if (!(a1 && b1 && a2 && b2)) return;
    CHECK(n1 == n1b && !memcmp(a1, b1, sizeof(float) * n1),
          "determinism: two runs on 1 thread differ");
    CHECK(n2 == n2b && !memcmp(a2, b2, sizeof(float) * n2),
          "determinism: two runs on 2 threads differ");
    // 1 and 2 threads may round differently, but only by rounding.
    double r = tl_max_rel(a1, a2, n1, 1e-3);
    CHECK(r < 1e-4, "determinism: 1 vs 2 threads differ by rel %.2e", r);
    printf("1 vs 2 threads: max rel difference %.2e (%s)\n", r,
           memcmp(a1, a2, sizeof(float) * n1) ? "not bitwise equal" : "bitwise equal");
    free(a1), free(b1), free(a2), free(b2);
}

int main(void) {
    dt_rng_seed(&g_rng, 2024);
    dt_set_threads(0);

    test_linear(3, 7, 5, 1);
    test_linear(1, 4, 9, 0);
    test_linear(6, 33, 17, 1);

    test_conv(2, 3, 7, 6, 4, 3, 1, 0);
    test_conv(2, 3, 7, 6, 4, 3, 1, 2);
    test_conv(2, 3, 7, 6, 4, 3, 2, 0);
    test_conv(3, 2, 9, 8, 5, 3, 2, 2);
    test_conv(2, 1, 8, 8, 3, 5, 1, 2);
    test_conv(1, 4, 6, 7, 1, 1, 1, 0);

    test_maxpool(2, 3, 8, 6, 2, 2);
    test_maxpool(2, 2, 7, 7, 3, 2);  // overlapping windows
    test_maxpool(1, 2, 7, 6, 3, 1);

    test_activation(0);
    test_activation(1);

    test_layernorm(5, 16);
    test_layernorm(3, 7);

    test_dropout();

    test_crossentropy(4, 10);
    test_crossentropy(1, 3);

    test_model_grad();
    test_model_stages();
    test_tensor_parallel();
    test_determinism();

    printf("worst layer finite-difference rel error %.2e, whole model %.2e\n", g_worst_fd,
           g_worst_model);
    return tl_finish();
}
