/* GPT layers and model against finite differences and naive references.
 *
 * Layers are checked with a scalar loss L = sum(out * R) for a fixed random R
 * (so dout = R), comparing backward's gradients with central differences.
 * The whole model is checked the same way on its real loss, for a sample of
 * elements of every parameter tensor; its gradient order must partition the
 * block, its grad hook must report final only what is final, slice by slice
 * from the top layer down, and its loss scale must scale every gradient. Then:
 * attention is causal (a change at position t never reaches outputs before
 * t) and equals a naive double reference; padding rows of wte get no
 * gradient; bad token ids and too-long contexts fail with clear errors;
 * results are bitwise reproducible. */
#include "dtrain/gpt.h"
#include "testlib.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_rng g_rng;

static float *randn(size_t n, float scale) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = scale * dt_rng_normal(&g_rng);
    return p;
}
static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* |num - ana| <= rtol * max(|num|, |ana|) + atol */
static int close_enough(double num, double ana, double rtol, double atol) {
    return fabs(num - ana) <= rtol * fmax(fabs(num), fabs(ana)) + atol;
}

// ----------------------------------------------------------------------------
// attention

enum { AB = 2, AT = 5, AC = 8, ANH = 2 };

static double att_loss(const float *qkv, const float *R) {
    float out[AB * AT * AC], att[AB * ANH * AT * AT];
    dt_attention_forward(out, att, qkv, AB, AT, AC, ANH);
    double s = 0;
    for (int i = 0; i < AB * AT * AC; i++) s += (double)out[i] * R[i];
    return s;
}

// Naive double-precision attention for one output element set.
static void att_reference(double *out, const float *qkv) {
    int hs = AC / ANH;
    for (int b = 0; b < AB; b++)
        for (int h = 0; h < ANH; h++)
            for (int t = 0; t < AT; t++) {
                const float *q = qkv + ((size_t)b * AT + t) * 3 * AC + h * hs;
                double w[AT], mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const float *k = qkv + ((size_t)b * AT + j) * 3 * AC + AC + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += (double)q[i] * k[i];
                    w[j] = d / sqrt((double)hs);
                    mx = fmax(mx, w[j]);
                }
                for (int j = 0; j <= t; j++) sum += (w[j] = exp(w[j] - mx));
                for (int i = 0; i < hs; i++) {
                    double y = 0;
                    for (int j = 0; j <= t; j++)
                        y += w[j] / sum * qkv[((size_t)b * AT + j) * 3 * AC + 2 * AC + h * hs + i];
                    out[((size_t)b * AT + t) * AC + h * hs + i] = y;
                }
            }
}

static void test_attention(void) {
    size_t nq = AB * AT * 3 * AC, no = AB * AT * AC;
    float *qkv = randn(nq, 1.0f), *R = randn(no, 1.0f);
    float out[AB * AT * AC], att[AB * ANH * AT * AT], datt[AB * ANH * AT * AT];
    dt_attention_forward(out, att, qkv, AB, AT, AC, ANH);
    double ref[AB * AT * AC];
    att_reference(ref, qkv);
    double worst = 0;
    for (size_t i = 0; i < no; i++) worst = fmax(worst, fabs(out[i] - ref[i]));
    CHECK(worst < 1e-5, "attention forward vs double reference: max abs diff %.2e", worst);
    // Saved probabilities: rows sum to 1, zeros above the diagonal.
    int rows_ok = 1;
    for (int r = 0; r < AB * ANH * AT; r++) {
        int t = r % AT;
        double s = 0;
        for (int j = 0; j < AT; j++) {
            s += att[r * AT + j];
            if (j > t && att[r * AT + j] != 0.0f) rows_ok = 0;
        }
        if (fabs(s - 1) > 1e-5) rows_ok = 0;
    }
    CHECK(rows_ok, "attention probabilities: rows sum to 1 and are causal");

    // Backward against central differences, and accumulation (+=).
    float *dqkv = zeros(nq);
    for (size_t i = 0; i < nq; i++) dqkv[i] = 0.5f;
    dt_attention_backward(dqkv, datt, R, qkv, att, AB, AT, AC, ANH);
    int bad = 0;
    double eps = 1e-2;
    for (size_t i = 0; i < nq; i++) {
        float x0 = qkv[i];
        qkv[i] = x0 + (float)eps;
        double lp = att_loss(qkv, R);
        qkv[i] = x0 - (float)eps;
        double lm = att_loss(qkv, R);
        qkv[i] = x0;
        double num = (lp - lm) / (2 * eps), ana = dqkv[i] - 0.5;
        if (!close_enough(num, ana, 1e-2, 1e-3)) {
            if (bad++ < 5) fprintf(stderr, "  dqkv[%zu]: numeric %.6f backward %.6f\n", i, num, ana);
        }
    }
    CHECK(bad == 0, "attention backward vs finite differences: %d of %zu elements differ", bad, nq);

    // Causality: perturbing position 3 of batch 0 changes nothing before it.
    float out2[AB * AT * AC];
    for (int c = 0; c < 3 * AC; c++) qkv[3 * 3 * AC + c] += 1.0f;
    dt_attention_forward(out2, att, qkv, AB, AT, AC, ANH);
    CHECK(memcmp(out, out2, sizeof(float) * 3 * AC) == 0, "attention: outputs before t unaffected by t");
    CHECK(memcmp(out, out2, sizeof(float) * 4 * AC) != 0, "attention: output at t depends on t");
    free(qkv);
    free(R);
    free(dqkv);
}

// Longer sequences than attention.c's row block (64), with a partial last
// block: forward vs a naive double reference, backward vs finite
// differences on a sample of elements.
static void att_ref_general(double *out, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double *w = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += (double)q[i] * k[i];
                    w[j] = d / sqrt((double)hs);
                    mx = fmax(mx, w[j]);
                }
                for (int j = 0; j <= t; j++) sum += (w[j] = exp(w[j] - mx));
                for (int i = 0; i < hs; i++) {
                    double y = 0;
                    for (int j = 0; j <= t; j++) y += w[j] / sum * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + i];
                    out[((size_t)b * T + t) * C + h * hs + i] = y;
                }
            }
    free(w);
}

static double att_loss_general(const float *qkv, const float *R, float *out, float *att, int B, int T, int C, int NH) {
    dt_attention_forward(out, att, qkv, B, T, C, NH);
    double s = 0;
    for (size_t i = 0; i < (size_t)B * T * C; i++) s += (double)out[i] * R[i];
    return s;
}

static void test_attention_blocks(void) {
    int B = 2, T = 150, C = 16, NH = 2;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = randn(nq, 1.0f), *R = randn(no, 1.0f), *out = zeros(no), *att = zeros(na), *datt = zeros(na);
    double *ref = malloc(sizeof(double) * no);
    att_ref_general(ref, qkv, B, T, C, NH);
    dt_attention_forward(out, att, qkv, B, T, C, NH);
    double worst = 0;
    for (size_t i = 0; i < no; i++) worst = fmax(worst, fabs(out[i] - ref[i]));
    CHECK(worst < 1e-5, "attention forward T=%d (3 row blocks) vs double reference: %.2e", T, worst);
    int causal = 1;
    for (int r = 0; r < B * NH * T; r++)
        for (int j = r % T + 1; j < T; j++) causal &= att[(size_t)r * T + j] == 0.0f;
    CHECK(causal, "attention T=%d: probabilities zero right of the diagonal", T);
    float *dqkv = zeros(nq);
    dt_attention_backward(dqkv, datt, R, qkv, att, B, T, C, NH);
    int bad = 0, tried = 0;
    double eps = 1e-2;
    for (int s = 0; s < 150; s++) {
        size_t i = dt_rng_below(&g_rng, (uint32_t)nq);
        float x0 = qkv[i];
        qkv[i] = x0 + (float)eps;
        double lp = att_loss_general(qkv, R, out, att, B, T, C, NH);
        qkv[i] = x0 - (float)eps;
        double lm = att_loss_general(qkv, R, out, att, B, T, C, NH);
        qkv[i] = x0;
        double num = (lp - lm) / (2 * eps);
        tried++;
        if (!close_enough(num, dqkv[i], 1e-2, 2e-3) && bad++ < 5)
            fprintf(stderr, "  dqkv[%zu]: numeric %.6f backward %.6f\n", i, num, dqkv[i]);
    }
    CHECK(bad == 0, "attention backward T=%d vs finite differences: %d of %d differ", T, bad, tried);
    free(qkv);
    free(R);
    free(out);
    free(att);
    free(datt);
    free(ref);
    free(dqkv);
}

// ----------------------------------------------------------------------------
// encoder and residual (linear: their gradients are exact sums)

static void test_encoder_residual(void) {
    enum { B = 2, T = 4, C = 3, V = 5 };
    int32_t inp[B * T] = {1, 3, 1, 4, 0, 1, 2, 1};  // repeated tokens
    float *wte = randn(V * C, 1), *wpe = randn(T * C, 1), *R = randn(B * T * C, 1);
    float out[B * T * C];
    dt_encoder_forward(out, inp, wte, wpe, B, T, C);
    int ok = 1;
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++)
            ok &= out[i * C + c] == wte[inp[i] * C + c] + wpe[(i % T) * C + c];
    CHECK(ok, "encoder forward = wte[token] + wpe[position]");
    float *dwte = zeros(V * C), *dwpe = zeros(T * C);
    double ewte[V * C] = {0}, ewpe[T * C] = {0};
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++) {
            ewte[inp[i] * C + c] += R[i * C + c];
            ewpe[(i % T) * C + c] += R[i * C + c];
        }
    dt_encoder_backward(dwte, dwpe, R, inp, B, T, C);
    dt_encoder_backward(dwte, dwpe, R, inp, B, T, C);  // accumulates
    double worst = 0;
    for (int i = 0; i < V * C; i++) worst = fmax(worst, fabs(dwte[i] - 2 * ewte[i]));
    for (int i = 0; i < T * C; i++) worst = fmax(worst, fabs(dwpe[i] - 2 * ewpe[i]));
    CHECK(worst < 1e-5, "encoder backward (twice, accumulating): max abs diff %.2e", worst);

    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {6, 5, 4, 3, 2, 1}, o[6], da[6] = {1, 1, 1, 1, 1, 1}, db[6] = {0};
    dt_residual_forward(o, a, b, 6);
    dt_residual_backward(da, db, a, 6);
    CHECK(o[0] == 7 && o[5] == 7 && da[2] == 4 && db[2] == 3, "residual forward/backward");
    free(wte);
    free(wpe);
    free(R);
    free(dwte);
    free(dwpe);
}

// ----------------------------------------------------------------------------
// the whole model

typedef struct {
    dt_gpt *m;
    const float *final;
    const dt_grad_range *order;
    int norder;
    size_t pos[64];  // what the hook reported
    int calls, early;
} hook_state;

// Every range of the gradient order from the reported position on must hold
// its final gradient already.
static void check_hook(size_t pos, void *user) {
    hook_state *h = user;
    if (h->calls < 64) h->pos[h->calls] = pos;
    h->calls++;
    size_t at = 0;
    for (int i = 0; i < h->norder; i++) {
        const dt_grad_range *r = &h->order[i];
        size_t skip = pos <= at ? 0 : pos - at < r->len ? pos - at : r->len;
        if (memcmp(dt_gpt_grads(h->m) + r->offset + skip, h->final + r->offset + skip, sizeof(float) * (r->len - skip)))
            h->early = 1;
        at += r->len;
    }
}

// The gradient order partitions the block; during backward the hook reports
// the start of lnfw, then of every layer's fcprojw, fcw, ln2w, attprojw, qkvw
// and ln1w slices from the top layer down (each such backward also finishes
// the bias after the weight), then 0, and never a gradient before it is final.
static void test_grad_order(dt_gpt *m, const float *g, const int32_t *x, const int32_t *y, int B, int T) {
    hook_state hs = {.m = m, .final = g};
    hs.order = dt_gpt_grad_order(m, &hs.norder);
    size_t np = dt_gpt_num_params(m), start[64], at = 0;
    int L = dt_gpt_get_config(m)->n_layer, ok = hs.norder == 12 * L + 4 && hs.norder < 64;
    unsigned char *seen = calloc(np, 1);
    for (int i = 0; ok && i < hs.norder; i++) {
        start[i] = at;
        at += hs.order[i].len;
        for (size_t j = hs.order[i].offset; ok && j < hs.order[i].offset + hs.order[i].len; j++)
            ok = j < np && !seen[j]++;
    }
    CHECK(ok && at == np, "gradient order: %d ranges partition the %zu gradients", hs.norder, np);
    free(seen);
    if (!ok) return;
    size_t want[64];
    int nw = 0;
    want[nw++] = start[12 * L + 2];
    for (int l = L - 1; l >= 0; l--)
        for (int k = 10; k >= 0; k -= 2) want[nw++] = start[2 + 12 * l + k];
    want[nw++] = 0;
    float loss;
    dt_gpt_set_grad_hook(m, check_hook, &hs);
    dt_gpt_zero_grad(m);
    dt_gpt_forward(m, x, y, B, T, &loss);
    dt_gpt_backward(m);
    dt_gpt_set_grad_hook(m, NULL, NULL);
    int same = hs.calls == nw;
    for (int i = 0; same && i < nw; i++) same = hs.pos[i] == want[i];
    CHECK(same, "grad hook: %d calls, expected %d, at the starts of lnfw and each layer's slices from the top", hs.calls, nw);
    CHECK(!hs.early, "grad hook: never reports a gradient before it is final");
}

// Larger weights than GPT-2's init so that every path carries signal.
static void random_params(dt_gpt *m) {
    const dt_gpt_config *c = dt_gpt_get_config(m);
    float *p = dt_gpt_params(m);
    for (int i = 0; i < dt_gpt_num_tensors(m); i++) {
        const dt_tensor_info *ti = dt_gpt_tensor(m, i);
        int is_lnw = !strcmp(ti->name, "ln1w") || !strcmp(ti->name, "ln2w") || !strcmp(ti->name, "lnfw");
        size_t n = !strcmp(ti->name, "wte") ? (size_t)c->vocab_size * c->n_embd : ti->numel;
        for (size_t j = 0; j < n; j++)
            p[ti->offset + j] = (is_lnw ? 1.0f : 0.0f) + 0.3f * dt_rng_normal(&g_rng);
    }
}

static void random_tokens(int32_t *t, int n, int V) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)dt_rng_below(&g_rng, (uint32_t)V);
}

static void test_model(void) {
    dt_gpt_config c = {.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 30,
                       .padded_vocab_size = 32};
    enum { B = 2, T = 6 };
    dt_gpt *m;
    CHECK(dt_gpt_create(&m, &c, B, T) == DT_OK, "create: %s", dt_last_error());
    random_params(m);
    float *p = dt_gpt_params(m);
    size_t np = dt_gpt_num_params(m);
    CHECK(np == dt_gpt_config_num_params(&c), "parameter count");
    int32_t x[B * T], y[B * T];
    random_tokens(x, B * T, c.vocab_size);
    random_tokens(y, B * T, c.vocab_size);
    float loss;
    dt_gpt_zero_grad(m);
    CHECK(dt_gpt_forward(m, x, y, B, T, &loss) == DT_OK, "forward: %s", dt_last_error());
    CHECK(dt_gpt_backward(m) == DT_OK, "backward");
    float *g = malloc(sizeof(float) * np);
    memcpy(g, dt_gpt_grads(m), sizeof(float) * np);

    // Padding rows of wte: never read, so no gradient.
    const dt_tensor_info *wte = dt_gpt_tensor(m, 0);
    int pad_zero = 1;
    for (size_t j = (size_t)c.vocab_size * c.n_embd; j < wte->numel; j++) pad_zero &= g[j] == 0.0f;
    CHECK(pad_zero, "wte padding rows get no gradient");

    // Finite differences on a sample of every tensor.
    double eps = 1e-2;
    for (int i = 0; i < dt_gpt_num_tensors(m); i++) {
        const dt_tensor_info *ti = dt_gpt_tensor(m, i);
        int bad = 0, tried = 0;
        for (int s = 0; s < 12; s++) {
            size_t j = ti->offset + dt_rng_below(&g_rng, (uint32_t)ti->numel);
            float x0 = p[j];
            float lp, lm;
            p[j] = x0 + (float)eps;
            dt_gpt_forward(m, x, y, B, T, &lp);
            p[j] = x0 - (float)eps;
            dt_gpt_forward(m, x, y, B, T, &lm);
            p[j] = x0;
            double num = ((double)lp - lm) / (2 * eps);
            tried++;
            if (!close_enough(num, g[j], 3e-2, 2e-4)) {
                if (bad++ < 3) fprintf(stderr, "  %s[%zu]: numeric %.6f backward %.6f\n", ti->name, j - ti->offset, num, g[j]);
            }
        }
        CHECK(bad == 0, "model gradient of %s vs finite differences: %d of %d differ", ti->name, bad, tried);
    }

    // Reproducible: the same forward + backward gives bitwise the same.
    dt_gpt_zero_grad(m);
    float loss2;
    dt_gpt_forward(m, x, y, B, T, &loss2);
    dt_gpt_backward(m);
    CHECK(loss2 == loss && memcmp(g, dt_gpt_grads(m), sizeof(float) * np) == 0, "bitwise reproducible");

    test_grad_order(m, g, x, y, B, T);
    // The loss scale multiplies every gradient (by a power of two: exactly).
    dt_gpt_set_loss_scale(m, 0.25f);
    dt_gpt_zero_grad(m);
    dt_gpt_forward(m, x, y, B, T, &loss2);
    dt_gpt_backward(m);
    dt_gpt_set_loss_scale(m, 1.0f);
    int scaled = 1;
    for (size_t j = 0; j < np; j++) scaled &= dt_gpt_grads(m)[j] == 0.25f * g[j];
    CHECK(scaled && loss2 == loss, "loss scale 0.25: gradients x 0.25, loss unchanged");

    // Shorter batches than the model was built for work, and give the same
    // result for the first sequence as a batch of one.
    float l1;
    CHECK(dt_gpt_forward(m, x, y, 1, T - 2, &l1) == DT_OK, "smaller B and T");

    // Bad input.
    x[3] = c.vocab_size;
    CHECK(dt_gpt_forward(m, x, y, B, T, &loss) == DT_ERR_ARG && strstr(dt_last_error(), "outside the vocabulary"),
          "token id >= V rejected: %s", dt_last_error());
    x[3] = -1;
    CHECK(dt_gpt_forward(m, x, NULL, B, T, NULL) == DT_ERR_ARG, "negative token id rejected");
    x[3] = 0;
    CHECK(dt_gpt_forward(m, x, y, B, T + 1, &loss) == DT_ERR_ARG && strstr(dt_last_error(), "context"),
          "context longer than built for rejected: %s", dt_last_error());
    dt_gpt *m2;
    CHECK(dt_gpt_create(&m2, &c, 1, c.block_size + 1) == DT_ERR_ARG && strstr(dt_last_error(), "block_size"),
          "context longer than block_size rejected: %s", dt_last_error());
    dt_gpt_config bad = c;
    bad.n_head = 3;
    CHECK(dt_gpt_create(&m2, &bad, 1, 4) == DT_ERR_ARG && strstr(dt_last_error(), "multiple of n_head"),
          "n_embd %% n_head checked: %s", dt_last_error());
    CHECK(dt_gpt_forward(m, x, NULL, B, T, NULL) == DT_OK && dt_gpt_backward(m) == DT_ERR_ARG,
          "backward without targets rejected");
    free(g);
    dt_gpt_free(m);
}

// ----------------------------------------------------------------------------
// activations apart from the model: stages, micro-batches in flight, hooks

enum { SB = 2, ST = 5 };
static const dt_gpt_config stage_cfg = {.n_layer = 3, .n_head = 2, .n_embd = 16, .block_size = 8,
                                        .vocab_size = 30, .padded_vocab_size = 32};

// A set of layers [l0, l1) of the whole model (recompute: g_recompute).
static int g_recompute;
static dt_status acts_range(dt_gpt_acts **a, const dt_gpt_config *c, int B, int T, int l0, int l1) {
    dt_gpt_acts_params p = {B, T, l0, l1, 1, g_recompute, 0, 0};
    return dt_gpt_acts_create_with(a, c, &p);
}
static size_t acts_size(const dt_gpt_config *c, int B, int T, int l0, int l1, int ntp, int recompute) {
    dt_gpt_acts_params p = {B, T, l0, l1, ntp, recompute, 0, 0};
    return dt_gpt_acts_size(c, &p);
}
// The same, sequence parallel.
static size_t acts_size_seq(const dt_gpt_config *c, int B, int T, int ntp, int recompute) {
    dt_gpt_acts_params p = {B, T, 0, c->n_layer, ntp, recompute, 1, 0};
    return dt_gpt_acts_size(c, &p);
}
// Shard r of ntp with a default set for B x T (recompute: the set keeps the
// blocks' inputs alone; seq: sequence parallel).
static dt_status create_shard_seq(dt_gpt **m, const dt_gpt_config *c, int B, int T, int r, int ntp, int recompute,
                                  int seq) {
    dt_gpt_acts_params p = {B, T, 0, c->n_layer, ntp, recompute, seq, 0};
    return dt_gpt_create_shard(m, c, &p, r);
}
static dt_status create_shard(dt_gpt **m, const dt_gpt_config *c, int B, int T, int r, int ntp, int recompute) {
    return create_shard_seq(m, c, B, T, r, ntp, recompute, 0);
}

// A sequence-parallel shard of T's set at B=8 T=256 against the expected
// sizes: the stream, the layernorms' outputs (ln1, ln2, lnf), residual2 and
// the statistics 1/T too (R = BT / T rows), the rest as without (1/T of the
// qkv, attention, MLP and logit parts; the token ids whole). (Every part
// here is a multiple of 16 floats.)
static void seq_sizes(const dt_gpt_config *s, const char *name, int T) {
    size_t bt = 8 * 256, C = s->n_embd, L = s->n_layer, att = bt * s->n_head * 256, R = bt / T;
    size_t st = (L + 1) * R * C, blk = R * (3 * C + 4) + bt * 12 * C / T + att / T;
    size_t hd = R * (C + 2) + 2 * bt + 2 * bt * s->padded_vocab_size / T;
    size_t sp = acts_size_seq(s, 8, 256, T, 0), rec = acts_size_seq(s, 8, 256, T, 1);
    size_t tp = acts_size(s, 8, 256, 0, (int)L, T, 0), tprec = acts_size(s, 8, 256, 0, (int)L, T, 1);
    CHECK(sp == 4 * (st + L * blk + hd), "%s: a sequence-parallel shard of %d's set: %zu bytes, expected %zu", name, T,
          sp, 4 * (st + L * blk + hd));
    CHECK(rec == 4 * (st + blk + hd), "%s: a sequence-parallel shard of %d recomputed: %zu bytes, expected %zu", name, T,
          rec, 4 * (st + blk + hd));
    printf("  %s B=8 T=256, tensor %d: a shard's set %.1f MiB, sequence parallel %.1f MiB (%.2fx smaller); "
           "recomputed %.1f and %.1f MiB\n", name, T, tp / 1048576.0, sp / 1048576.0, (double)tp / sp,
           tprec / 1048576.0, rec / 1048576.0);
}

// Two pipeline stages, layers [0,k) (with the embedding) and [k,L) (with the
// head), as separate sets (split) or one whole-model set per micro-batch;
// the stream between them in a buffer of the caller's (mid). The schedule
// keeps two micro-batches in flight: forward 0, forward 1, backward 1,
// backward 0.
static void run_stages(dt_gpt *m, int k, int split, const int32_t *x, const int32_t *y, float loss[2]) {
    int L = stage_cfg.n_layer;
    size_t n = (size_t)SB * ST * stage_cfg.n_embd;
    dt_gpt_acts *lo[2], *hi[2];
    float *mid[2], *d[2];
    int ok = 1;
    for (int mb = 0; mb < 2; mb++) {
        if (split) {
            ok &= acts_range(&lo[mb], &stage_cfg, SB, ST, 0, k) == DT_OK;
            ok &= acts_range(&hi[mb], &stage_cfg, SB, ST, k, L) == DT_OK;
        } else {
            ok &= dt_gpt_acts_create(&lo[mb], &stage_cfg, SB, ST) == DT_OK;
            hi[mb] = lo[mb];
        }
        mid[mb] = zeros(n);
        d[mb] = zeros(n);
    }
    CHECK(ok, "activation sets for layers [0,%d) and [%d,%d): %s", k, k, L, dt_last_error());
    dt_status st = DT_OK;
    for (int mb = 0; mb < 2 && st == DT_OK; mb++) {
        const int32_t *xm = x + mb * SB * ST, *ym = y + mb * SB * ST;
        float *in = dt_gpt_acts_resid(lo[mb], 0), *top = dt_gpt_acts_resid(hi[mb], L);
        if (st == DT_OK) st = dt_gpt_embed_forward(m, lo[mb], xm, in);
        if (st == DT_OK) st = dt_gpt_forward_range(m, lo[mb], 0, k, in, mid[mb]);
        if (st == DT_OK) st = dt_gpt_forward_range(m, hi[mb], k, L, mid[mb], top);
        if (st == DT_OK) st = dt_gpt_head_forward(m, hi[mb], top, ym, &loss[mb]);
    }
    for (int mb = 1; mb >= 0 && st == DT_OK; mb--) {
        float *in = dt_gpt_acts_resid(lo[mb], 0), *top = dt_gpt_acts_resid(hi[mb], L);
        if (st == DT_OK) st = dt_gpt_head_backward(m, hi[mb], top, d[mb]);
        if (st == DT_OK) st = dt_gpt_backward_range(m, hi[mb], k, L, mid[mb], d[mb]);
        if (st == DT_OK) st = dt_gpt_backward_range(m, lo[mb], 0, k, in, d[mb]);
        if (st == DT_OK) st = dt_gpt_embed_backward(m, lo[mb], d[mb]);
    }
    CHECK(st == DT_OK, "stages k=%d %s: %s", k, split ? "split" : "one set", st == DT_OK ? "" : dt_last_error());
    for (int mb = 0; mb < 2; mb++) {
        if (split) dt_gpt_acts_free(hi[mb]);
        dt_gpt_acts_free(lo[mb]);
        free(mid[mb]);
        free(d[mb]);
    }
}

typedef struct {
    int layer[64], phase[64], n, fail_layer;
} layer_log;

static dt_status log_layer(int layer, dt_gpt_phase phase, void *user) {
    layer_log *g = user;
    if (g->n < 64) g->layer[g->n] = layer, g->phase[g->n] = phase;
    g->n++;
    if (layer == g->fail_layer && phase == DT_GPT_FORWARD) return dt_error(DT_ERR_COMM, "gather of layer %d failed", layer);
    return DT_OK;
}

// The log holds layers from..to (step +1 or -1) in one phase, from position at.
static int log_is(const layer_log *g, int at, int from, int to, int phase) {
    int step = from <= to ? 1 : -1;
    for (int l = from;; l += step, at++) {
        if (at >= g->n || g->layer[at] != l || g->phase[at] != phase) return 0;
        if (l == to) return 1;
    }
}

// A forward-only set (an evaluation's): the loss and the logits of the
// default set's forward to the bit, with the stream in two buffers (3 and
// 4 layers: an odd and an even count of turns) and one block's
// activations; every backward call refuses it.
static void test_forward_only(void) {
    for (int L = 3; L <= 4; L++) {
        dt_gpt_config c = stage_cfg;
        c.n_layer = L;
        dt_gpt *m;
        dt_gpt_acts *a = NULL;
        dt_gpt_acts_params fw = {SB, ST, 0, L, 1, 0, 0, 1};
        if (dt_gpt_create(&m, &c, SB, ST) != DT_OK || dt_gpt_acts_create_with(&a, &c, &fw) != DT_OK) {
            CHECK(0, "forward-only set of %d layers: %s", L, dt_last_error());
            return;
        }
        random_params(m);
        int32_t x[SB * ST], y[SB * ST];
        random_tokens(x, SB * ST, c.vocab_size);
        random_tokens(y, SB * ST, c.vocab_size);
        float l0 = 0, l1 = -1;
        size_t nl = (size_t)SB * ST * c.vocab_size;
        int ok = dt_gpt_forward(m, x, y, SB, ST, &l0) == DT_OK;
        float *lg = malloc(sizeof(float) * nl);
        if (ok && lg) memcpy(lg, dt_gpt_logits(m), sizeof(float) * nl);
        ok &= lg && dt_gpt_forward_with(m, a, x, y, SB, ST, &l1) == DT_OK;
        CHECK(ok && l0 == l1 && !memcmp(lg, dt_gpt_acts_logits(a), sizeof(float) * nl),
              "%d layers: the forward-only set's loss %.9g and logits are the default set's (%.9g) to the bit: %s", L, l1,
              l0, dt_last_error());
        // Two streams, not L + 1; one block's activations, as recomputation's.
        size_t stream = sizeof(float) * SB * ST * c.n_embd;
        CHECK(dt_gpt_acts_bytes(a) + (size_t)(L - 1) * stream == acts_size(&c, SB, ST, 0, L, 1, 1) &&
                  dt_gpt_acts_bytes(a) < acts_size(&c, SB, ST, 0, L, 1, 0) / 2,
              "%d layers: forward-only set %zu bytes, recomputation's %zu less %d streams, a whole set %zu", L,
              dt_gpt_acts_bytes(a), acts_size(&c, SB, ST, 0, L, 1, 1), L - 1, acts_size(&c, SB, ST, 0, L, 1, 0));
        float *d = calloc((size_t)SB * ST * c.n_embd, sizeof(float));
        CHECK(d && dt_gpt_head_backward(m, a, dt_gpt_acts_resid(a, L), d) == DT_ERR_ARG &&
                  strstr(dt_last_error(), "forward-only"),
              "%d layers: backward of a forward-only set refused: %s", L, dt_last_error());
        CHECK(d && dt_gpt_backward_range(m, a, 0, L, dt_gpt_acts_resid(a, 0), d) == DT_ERR_ARG,
              "%d layers: backward_range of a forward-only set refused", L);
        free(d);
        free(lg);
        dt_gpt_acts_free(a);
        dt_gpt_free(m);
    }
}

static void test_stages(void) {
    const dt_gpt_config *c = &stage_cfg;
    int L = c->n_layer;
    dt_gpt *m, *mp;  // mp: parameters only (B = T = 0), the same values
    int created = dt_gpt_create(&m, c, SB, ST) == DT_OK;
    created &= dt_gpt_create(&mp, c, 0, 0) == DT_OK;
    CHECK(created, "create, and create without activations: %s", dt_last_error());
    if (!created) return;
    random_params(m);
    size_t np = dt_gpt_num_params(m);
    memcpy(dt_gpt_params(mp), dt_gpt_params(m), sizeof(float) * np);
    int32_t x[2 * SB * ST], y[2 * SB * ST];
    random_tokens(x, 2 * SB * ST, c->vocab_size);
    random_tokens(y, 2 * SB * ST, c->vocab_size);
    // Micro-batch 1's second sequence repeats micro-batch 0's first: the
    // shared tokens' wte rows get gradient from both.
    memcpy(x + 3 * ST, x, sizeof(int32_t) * ST);

    // The reference: the whole-model calls, micro-batch 1 then 0 (float
    // sums depend on their order; the schedule backpropagates 1 first).
    float ref[2];
    dt_gpt_zero_grad(m);
    for (int mb = 1; mb >= 0; mb--) {
        CHECK(dt_gpt_forward(m, x + mb * SB * ST, y + mb * SB * ST, SB, ST, &ref[mb]) == DT_OK, "forward mb %d", mb);
        dt_gpt_backward(m);
    }
    const float *gref = dt_gpt_grads(m);
    // Recomputation (sets that keep the blocks' inputs alone) changes no bit.
    for (g_recompute = 0; g_recompute < 2; g_recompute++)
        for (int k = 1; k < L; k++)
            for (int split = 0; split < 2; split++) {
                float loss[2] = {0, 0};
                dt_gpt_zero_grad(mp);
                run_stages(mp, k, split, x, y, loss);
                CHECK(loss[0] == ref[0] && loss[1] == ref[1],
                      "stages [0,%d) [%d,%d) %s%s: losses %.7g %.7g, whole model %.7g %.7g", k, k, L,
                      split ? "in two sets" : "in one set", g_recompute ? ", recomputed" : "", loss[0], loss[1], ref[0],
                      ref[1]);
                CHECK(memcmp(dt_gpt_grads(mp), gref, sizeof(float) * np) == 0,
                      "stages [0,%d) [%d,%d) %s%s, 2 micro-batches in flight: gradients bitwise the whole model's", k, k,
                      L, split ? "in two sets" : "in one set", g_recompute ? ", recomputed" : "");
            }
    g_recompute = 0;
    // A whole-model forward between a micro-batch's forward and backward
    // does not disturb it (it uses the default set).
    {
        dt_gpt_acts *a;
        float la, lb;
        CHECK(dt_gpt_acts_create(&a, c, SB, ST) == DT_OK, "acts");
        float *in = dt_gpt_acts_resid(a, 0), *top = dt_gpt_acts_resid(a, L), *d = zeros((size_t)SB * ST * c->n_embd);
        dt_gpt_zero_grad(m);
        dt_gpt_embed_forward(m, a, x, in);
        dt_gpt_forward_range(m, a, 0, L, in, top);
        dt_gpt_head_forward(m, a, top, y, &la);
        dt_gpt_forward(m, x + SB * ST, y + SB * ST, SB, ST, &lb);
        dt_status st = dt_gpt_head_backward(m, a, top, d);
        if (st == DT_OK) st = dt_gpt_backward_range(m, a, 0, L, in, d);
        if (st == DT_OK) st = dt_gpt_embed_backward(m, a, d);
        float *g0 = malloc(sizeof(float) * np);
        memcpy(g0, dt_gpt_grads(m), sizeof(float) * np);
        dt_gpt_zero_grad(m);
        dt_gpt_forward(m, x, y, SB, ST, &lb);
        dt_gpt_backward(m);
        CHECK(st == DT_OK && la == lb && memcmp(g0, dt_gpt_grads(m), sizeof(float) * np) == 0,
              "a set's backward after another forward equals the whole model's");
        free(g0);
        free(d);
        dt_gpt_acts_free(a);
    }

    // Memory: a whole-model set is the activations the model used to hold
    // minus the two projections per layer (the backward scratch is the
    // model's, shared by all sets). Exact bytes for this config, and the
    // per-layer and head parts of a split add up to the whole.
    {
        size_t BT = SB * ST, C = c->n_embd, att = BT * c->n_head * ST, V = c->vocab_size;
        size_t r16 = 16, want = 0, per_layer[] = {BT * C, BT, BT, 3 * BT * C, BT * C, att, BT * C, BT * C, BT, BT, 4 * BT * C, 4 * BT * C};
        want += ((L + 1) * BT * C + r16 - 1) / r16 * r16;
        for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++) want += (L * per_layer[i] + r16 - 1) / r16 * r16;
        size_t head[] = {BT * C, BT, BT, BT * V, BT * V, BT, BT};
        for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) want += (head[i] + r16 - 1) / r16 * r16;
        dt_gpt_acts *a;
        CHECK(dt_gpt_acts_create(&a, c, SB, ST) == DT_OK, "acts: %s", dt_last_error());
        CHECK(dt_gpt_acts_bytes(a) == 4 * want && acts_size(c, SB, ST, 0, L, 1, 0) == 4 * want,
              "acts bytes %zu, expected %zu", dt_gpt_acts_bytes(a), 4 * want);
        dt_gpt_acts_free(a);
        // gpt-small at B=8, T=256: against the old in-model buffers
        // (activations with both projections, plus one layer of scratch).
        dt_gpt_config s;
        dt_gpt_preset("gpt-small", &s);
        size_t bt = 8 * 256, Cs = s.n_embd, Ls = s.n_layer, atts = bt * s.n_head * 256, Vs = s.vocab_size;
        size_t old = 4 * (bt * Cs + Ls * bt * (18 * Cs + 4) + Ls * atts + bt * (Cs + 2) + 2 * bt * Vs + 14 * bt * Cs + atts);
        size_t now = acts_size(&s, 8, 256, 0, Ls, 1, 0);
        printf("  gpt-small B=8 T=256: one activation set %zu bytes (%.1f MiB); before: %zu bytes (%.1f MiB) in the model\n",
               now, now / 1048576.0, old, old / 1048576.0);
        CHECK(now < old, "gpt-small activation set (%zu bytes) smaller than the old buffers (%zu)", now, old);
        size_t parts = acts_size(&s, 8, 256, 0, 3, 1, 0) + acts_size(&s, 8, 256, 3, Ls, 1, 0);
        CHECK(parts == now + 4 * bt * Cs, "two stage sets = one whole set + the shared boundary stream (%zu vs %zu)", parts, now);
        // Recomputation keeps the stream before each block and one block's
        // activations; a tensor-parallel shard 1/T of the qkv, attention,
        // MLP and logit parts. (Every part here is a multiple of 16 floats.)
        size_t stream = (Ls + 1) * bt * Cs, block = bt * (15 * Cs + 4) + atts, hd = bt * (Cs + 4 + 2 * Vs);
        CHECK(now == 4 * (stream + Ls * block + hd), "gpt-small set: %zu bytes, expected %zu", now,
              4 * (stream + Ls * block + hd));
        size_t rec = acts_size(&s, 8, 256, 0, Ls, 1, 1);
        CHECK(rec == 4 * (stream + block + hd), "recomputed set: %zu bytes, expected the stream, one block and the head %zu",
              rec, 4 * (stream + block + hd));
        size_t blk2 = bt * (3 * Cs + 4) + bt * 12 * Cs / 2 + atts / 2, head2 = bt * (Cs + 4) + bt * s.padded_vocab_size;
        size_t tp2 = acts_size(&s, 8, 256, 0, Ls, 2, 0);
        CHECK(tp2 == 4 * (stream + Ls * blk2 + head2), "a shard of 2's set: %zu bytes, expected %zu", tp2,
              4 * (stream + Ls * blk2 + head2));
        printf("  gpt-small B=8 T=256: recomputed %.1f MiB (%.2fx smaller), a shard of 2 %.1f MiB\n", rec / 1048576.0,
               (double)now / rec, tp2 / 1048576.0);
        seq_sizes(&s, "gpt-small", 2);
        dt_gpt_config g85 = {12, 12, 768, 256, 256, 256};  // bench/memory.py's 85 M model
        seq_sizes(&g85, "L12 C768", 2);
        seq_sizes(&g85, "L12 C768", 4);
    }

    // The layer hook: before each stage, layers ascending on forward and
    // descending on backward (embedding -1, hd L).
    layer_log g = {.fail_layer = 99};
    float loss;
    dt_gpt_set_layer_hook(m, log_layer, &g);
    dt_gpt_zero_grad(m);
    dt_gpt_forward(m, x, y, SB, ST, &loss);
    dt_gpt_backward(m);
    CHECK(g.n == 2 * (L + 2) && log_is(&g, 0, DT_GPT_EMBED, L, DT_GPT_FORWARD) &&
              log_is(&g, L + 2, L, DT_GPT_EMBED, DT_GPT_BACKWARD),
          "layer hook: %d calls, -1..%d forward then %d..-1 backward", g.n, L, L);
    // Ranges fire for their layers only.
    dt_gpt_acts *a;
    dt_gpt_acts_create(&a, c, SB, ST);
    float *in = dt_gpt_acts_resid(a, 0), *d = zeros((size_t)SB * ST * c->n_embd);
    g.n = 0;
    dt_gpt_embed_forward(m, a, x, in);
    dt_gpt_forward_range(m, a, 0, 1, in, dt_gpt_acts_resid(a, 1));
    dt_gpt_forward_range(m, a, 1, L, dt_gpt_acts_resid(a, 1), dt_gpt_acts_resid(a, L));
    dt_gpt_backward_range(m, a, 1, L, dt_gpt_acts_resid(a, 1), d);
    CHECK(g.n == 2 * L && log_is(&g, 0, DT_GPT_EMBED, L - 1, DT_GPT_FORWARD) && log_is(&g, L + 1, L - 1, 1, DT_GPT_BACKWARD),
          "layer hook on ranges: embedding, 0..%d forward, %d..1 backward (%d calls)", L - 1, L - 1, g.n);
    // A failing hook stops the forward before its layer, with its status.
    g = (layer_log){.fail_layer = 1};
    CHECK(dt_gpt_forward(m, x, y, SB, ST, &loss) == DT_ERR_COMM && strstr(dt_last_error(), "gather of layer 1"),
          "a failing layer hook stops the forward: %s", dt_last_error());
    CHECK(g.n == 3 && g.layer[2] == 1, "no layer after the failing hook ran (%d calls)", g.n);
    CHECK(dt_gpt_backward(m) == DT_ERR_ARG, "no backward after a failed forward");
    dt_gpt_set_layer_hook(m, NULL, NULL);

    // Misuse: every case a clear DT_ERR_ARG.
    dt_gpt_acts *lo, *hi, *ao_unused;
    dt_gpt *m_unused;
    acts_range(&lo, c, SB, ST, 0, 1);
    acts_range(&hi, c, SB, ST, 1, L);
    float lossx;
#define REJECTS(call, msg, what) \
    CHECK((call) == DT_ERR_ARG && strstr(dt_last_error(), msg), "%s rejected: %s", what, dt_last_error())
    REJECTS(dt_gpt_embed_forward(m, hi, x, dt_gpt_acts_resid(hi, 1)), "without the embedding", "embedding on a set from layer 1");
    REJECTS(dt_gpt_head_forward(m, lo, dt_gpt_acts_resid(lo, 1), y, &lossx), "without the head", "head on a set up to layer 1");
    REJECTS(dt_gpt_forward_range(m, lo, 0, 2, in, d), "layers [0, 2)", "range beyond the set's layers");
    REJECTS(dt_gpt_forward_range(m, lo, 1, 1, in, d), "non-empty", "empty range");
    REJECTS(dt_gpt_forward_range(m, a, 0, L, in, in), "same buffer", "resid_in = resid_out");
    REJECTS(dt_gpt_backward_range(m, hi, 1, L, d, d), "layer 1 has not run forward", "backward before forward");
    REJECTS(dt_gpt_embed_backward(m, lo, d), "has not run forward", "embedding backward before forward");
    REJECTS(dt_gpt_head_backward(m, hi, d, d), "no targets", "head backward before forward");
    REJECTS(dt_gpt_acts_set_shape(a, SB, ST + 1), "context", "shape beyond the set's");
    REJECTS(acts_range(&ao_unused, c, SB, ST, 1, L + 1), "n_layer", "set beyond the layers");
    REJECTS(dt_gpt_forward(mp, x, y, SB, ST, &lossx), "without activations", "whole forward on a model without its set");
    REJECTS(dt_gpt_backward(mp), "without activations", "whole backward on a model without its set");
    REJECTS(dt_gpt_create(&m_unused, c, 0, ST), "batch 0", "B = 0 with T > 0");
    // After a forward of the first layers only, the backward of all of
    // them is refused (layer 2 has nothing saved).
    dt_gpt_acts_set_shape(a, SB, ST);
    dt_gpt_forward_range(m, a, 0, 2, in, dt_gpt_acts_resid(a, 2));
    REJECTS(dt_gpt_backward_range(m, a, 0, L, in, d), "layer 2 has not run forward", "backward of a layer not run forward");
#undef REJECTS
    dt_gpt_config other = *c;
    other.n_embd = 32;
    dt_gpt_acts *ao;
    dt_gpt_acts_create(&ao, &other, SB, ST);
    CHECK(dt_gpt_embed_forward(m, ao, x, dt_gpt_acts_resid(ao, 0)) == DT_ERR_ARG && strstr(dt_last_error(), "another model config"),
          "a set of another config rejected: %s", dt_last_error());
    CHECK(dt_gpt_logits(mp) == NULL && dt_gpt_default_acts(mp) == NULL && dt_gpt_acts_logits(lo) == NULL &&
              dt_gpt_acts_resid(lo, 2) == NULL && dt_gpt_acts_resid(hi, 0) == NULL,
          "no logits, default set or stream outside a set's parts");
    dt_gpt_acts_free(ao);
    dt_gpt_acts_free(lo);
    dt_gpt_acts_free(hi);
    dt_gpt_acts_free(a);
    free(d);
    dt_gpt_free(m);
    dt_gpt_free(mp);
}

// ----------------------------------------------------------------------------
// tensor parallel: ntp shards in threads against the whole model

typedef struct {
    pthread_barrier_t bar;
    float *bufs[4];
    int ntp;
} tp_group;

typedef struct {
    tp_group *g;
    int r, calls;
    dt_gpt *m;
    const int32_t *x, *y;
    float loss;
    int fwd_calls, bwd_calls;
    double moved;  // floats a rank sends, as dt_comm_stats counts them
    dt_status st;
} tp_shard;

// Sums or maxes in rank order, as an allreduce that gives every rank the
// same bits; a reduce-scatter sums in the same order; an allgather.
static dt_status tp_reduce_threads(dt_gpt_coll op, const float *send, float *recv, size_t n, void *user) {
    tp_shard *s = user;
    tp_group *g = s->g;
    s->calls++;
    // (an allreduce of n: 2 (T - 1) / T n; a reduce-scatter or an allgather
    // of blocks of n: (T - 1) n)
    s->moved += op == DT_GPT_SUM || op == DT_GPT_MAX ? 2.0 * (g->ntp - 1) / g->ntp * (double)n : (double)(g->ntp - 1) * n;
    g->bufs[s->r] = (float *)send;
    pthread_barrier_wait(&g->bar);
    size_t out = op == DT_GPT_ALLGATHER ? n * (size_t)g->ntp : n;
    float *tmp = malloc(sizeof(float) * (out ? out : 1));
    for (size_t i = 0; i < out; i++) {
        if (op == DT_GPT_ALLGATHER) {
            tmp[i] = g->bufs[i / n][i % n];
            continue;
        }
        size_t at = op == DT_GPT_REDUCE_SCATTER ? (size_t)s->r * n + i : i;
        float v = g->bufs[0][at];
        for (int r = 1; r < g->ntp; r++) v = op == DT_GPT_MAX ? fmaxf(v, g->bufs[r][at]) : v + g->bufs[r][at];
        tmp[i] = v;
    }
    pthread_barrier_wait(&g->bar);
    memcpy(recv, tmp, sizeof(float) * out);
    free(tmp);
    return DT_OK;
}

enum { TPB = 2, TPT = 8 };

static void *tp_run(void *arg) {
    tp_shard *s = arg;
    dt_gpt_zero_grad(s->m);
    s->st = dt_gpt_forward(s->m, s->x, s->y, TPB, TPT, &s->loss);
    s->fwd_calls = s->calls;
    if (s->st == DT_OK) s->st = dt_gpt_backward(s->m);
    s->bwd_calls = s->calls - s->fwd_calls;
    return NULL;
}

static void test_tensor_parallel(void) {
    // vocab 90 of 128 rows: with 4 shards the last holds only padding rows.
    const dt_gpt_config c = {2, 4, 32, 16, 90, 128};
    int L = c.n_layer;
    dt_gpt *whole;
    if (dt_gpt_create(&whole, &c, TPB, TPT) != DT_OK || dt_gpt_init(whole, 7) != DT_OK) {
        CHECK(0, "create the whole model: %s", dt_last_error());
        return;
    }
    int32_t x[TPB * TPT], y[TPB * TPT];
    random_tokens(x, TPB * TPT, c.vocab_size);
    random_tokens(y, TPB * TPT, c.vocab_size);
    x[3] = 89;  // the last real row: shard 2 of 4
    y[5] = 89;
    float ref;
    dt_gpt_zero_grad(whole);
    CHECK(dt_gpt_forward(whole, x, y, TPB, TPT, &ref) == DT_OK && dt_gpt_backward(whole) == DT_OK,
          "whole model forward/backward: %s", dt_last_error());
    size_t nw = dt_gpt_num_params(whole);
    // T = 2, 4, and 2 again with recomputation (its gradients bitwise the
    // first T = 2's); the three again sequence parallel (against the same
    // T without: loss and every gradient but the layernorms' bitwise, and
    // recomputed bitwise its own). Each case's gradients are kept in gk.
    enum { NCASE = 6 };
    const int cases[NCASE][4] = {{2, 0, 0, -1}, {4, 0, 0, -1}, {2, 1, 0, 0}, {2, 0, 1, 0}, {4, 0, 1, 1}, {2, 1, 1, 3}};
    float *gk[NCASE][4] = {{0}}, lk[NCASE] = {0};
    for (int ci = 0; ci < NCASE; ci++) {
        int ntp = cases[ci][0], rec = cases[ci][1], seq = cases[ci][2], ref_case = cases[ci][3];
        tp_group g = {.ntp = ntp};
        pthread_barrier_init(&g.bar, NULL, (unsigned)ntp);
        tp_shard sh[4] = {{0}};
        pthread_t th[4];
        float *want = malloc(sizeof(float) * nw);
        int ok = 1;
        for (int r = 0; r < ntp && ok; r++) {
            sh[r] = (tp_shard){.g = &g, .r = r, .x = x, .y = y};
            ok = create_shard_seq(&sh[r].m, &c, TPB, TPT, r, ntp, rec, seq) == DT_OK && dt_gpt_init(sh[r].m, 7) == DT_OK;
            CHECK(ok, "create shard %d of %d%s: %s", r, ntp, seq ? " sequence parallel" : "", dt_last_error());
            if (!ok) break;
            dt_gpt_set_reduce(sh[r].m, tp_reduce_threads, &sh[r]);
            // The shard's parameters: its part of the whole model's.
            size_t n = dt_gpt_num_params(sh[r].m);
            dt_gpt_part_take(sh[r].m, want, 0, nw, dt_gpt_params(whole));
            CHECK(memcmp(want, dt_gpt_params(sh[r].m), sizeof(float) * n) == 0,
                  "T=%d shard %d: init is the whole model's initialisation, sliced", ntp, r);
        }
        for (int r = 0; r < ntp && ok; r++) pthread_create(&th[r], NULL, tp_run, &sh[r]);
        for (int r = 0; r < ntp && ok; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < ntp && ok; r++) {
            tp_shard *s = &sh[r];
            const char *sp = seq ? " sequence-parallel" : "";
            CHECK(s->st == DT_OK, "T=%d%s shard %d: forward/backward: %s", ntp, sp, r, dt_last_error());
            CHECK(fabsf(s->loss - ref) <= 1e-6f * fabsf(ref) && s->loss == sh[0].loss,
                  "T=%d%s shard %d: loss %.8g, whole model %.8g (every shard the same)", ntp, sp, r, s->loss, ref);
            // One sum per attention and per MLP block each way; the
            // embedding, the head's max and sums forward, the head's
            // layernorm input backward.
            // (Recomputation: the forward's two of each block but the last
            // again in backward.)
            // Sequence parallel, forward: the embedding's reduce-scatter; a
            // gather and a reduce-scatter per half; the head's gather, max
            // and sums. Backward: the head's gather, reduce-scatter and
            // layernorm sum; per layer 2 gathers of the output gradient, 2
            // of the layernorms, 2 reduce-scatters and the layernorms' sum;
            // the embedding's gather. (Recomputation: 4 per block again.)
            int fw = seq ? 4 * L + 4 : 2 * L + 3, bw = seq ? 7 * L + 4 + (rec ? 4 * (L - 1) : 0) : 2 * L + 1 + (rec ? 2 * (L - 1) : 0);
            CHECK(s->fwd_calls == fw && s->bwd_calls == bw,
                  "T=%d%s shard %d%s: %d collectives forward (expected %d), %d backward (expected %d)", ntp, sp, r,
                  rec ? " recomputed" : "", s->fwd_calls, fw, s->bwd_calls, bw);
            // The floats a rank sends, S = BT C a stream: tensor parallel
            // (8L + 4) (T - 1)/T S, sequence parallel (10L + 5) (T - 1)/T S,
            // and the allreduces of the cross-entropy's 3 BT floats and
            // sequence parallel's layernorm gradients (4C a layer, 2C).
            double S = (double)TPB * TPT * c.n_embd, f = (double)(ntp - 1) / ntp;
            double small = 2 * f * (3.0 * TPB * TPT + (seq ? 4.0 * L * c.n_embd + 2.0 * c.n_embd : 0));
            double sent = (seq ? 10 * L + 5 : 2 * (4 * L + 2)) * f * S + small;
            if (!rec)
                CHECK(fabs(s->moved - sent) < 0.5, "T=%d%s shard %d: %.0f floats sent, expected %.0f", ntp, sp, r, s->moved,
                      sent);
            size_t ns = dt_gpt_num_params(s->m);
            if ((gk[ci][r] = malloc(sizeof(float) * ns))) memcpy(gk[ci][r], dt_gpt_grads(s->m), sizeof(float) * ns);
            lk[ci] = s->loss;
            if (rec)
                CHECK(gk[ref_case][r] && memcmp(gk[ref_case][r], dt_gpt_grads(s->m), sizeof(float) * ns) == 0,
                      "T=2%s shard %d recomputed: gradients bitwise those without recomputation", sp, r);
            if (seq && !rec) {
                // The same sums in the same order but for the layernorms'
                // weights (summed by rows on each shard, then over them).
                CHECK(s->loss == lk[ref_case], "T=%d sequence-parallel shard %d: loss bitwise without (%.9g, %.9g)", ntp,
                      r, s->loss, lk[ref_case]);
                for (int i = 0; i < dt_gpt_num_tensors(s->m); i++) {
                    const dt_tensor_info *t = dt_gpt_tensor(s->m, i);
                    int ln = i == 2 || i == 3 || i == 8 || i == 9 || i == 14 || i == 15;
                    if (!ln)
                        CHECK(gk[ref_case][r] && !memcmp(gk[ref_case][r] + t->offset, dt_gpt_grads(s->m) + t->offset,
                                                         sizeof(float) * t->numel),
                              "T=%d sequence-parallel shard %d: gradient of %s bitwise without", ntp, r, t->name);
                }
            }
            dt_gpt_part_take(sh[r].m, want, 0, nw, dt_gpt_grads(whole));
            for (int i = 0; i < dt_gpt_num_tensors(s->m); i++) {
                const dt_tensor_info *t = dt_gpt_tensor(s->m, i);
                const float *gs = dt_gpt_grads(s->m) + t->offset, *gw = want + t->offset;
                double mx = 0, d = 0;
                for (size_t j = 0; j < t->numel; j++) {
                    mx = fmax(mx, fabs(gw[j]));
                    d = fmax(d, fabs((double)gs[j] - gw[j]));
                }
                CHECK(d <= 1e-5 * mx, "T=%d%s shard %d: gradient of %s within 1e-5 of its largest (%.3g): off by %.3g",
                      ntp, sp, r, t->name, mx, d);
                if (!dt_gpt_tensor_split(i))
                    CHECK(memcmp(gs, dt_gpt_grads(sh[0].m) + t->offset, sizeof(float) * t->numel) == 0,
                          "T=%d%s shard %d: gradient of the whole tensor %s bitwise shard 0's", ntp, sp, r, t->name);
            }
        }
        // Shard tensors: 1/T of the split ones, the rest whole.
        if (ok) {
            const dt_tensor_info *q = dt_gpt_tensor(sh[0].m, 4), *e = dt_gpt_tensor(sh[0].m, 0);
            CHECK(q->shape[1] == 3 * c.n_embd / ntp && e->shape[0] == c.padded_vocab_size / ntp,
                  "T=%d: qkvw [L, %lld, C], wte [%lld, C]", ntp, (long long)q->shape[1], (long long)e->shape[0]);
        }
        // Whole from the shards, bitwise.
        float *back = calloc(nw, sizeof(float));
        // (and in pieces: every element filled by one shard alone)
        for (size_t lo = 0; lo < nw && ok; lo += 97) {
            size_t hi = lo + 97 < nw ? lo + 97 : nw;
            float piece[97];
            for (size_t j = 0; j < hi - lo; j++) piece[j] = -0.0f;
            for (int r = 0; r < ntp; r++) {
                float mine[97];
                for (size_t j = 0; j < hi - lo; j++) mine[j] = -0.0f;
                dt_gpt_part_fill(sh[r].m, dt_gpt_params(sh[r].m), lo, hi, mine);
                for (size_t j = 0; j < hi - lo; j++) piece[j] += mine[j];
            }
            memcpy(back + lo, piece, sizeof(float) * (hi - lo));
        }
        CHECK(!ok || memcmp(back, dt_gpt_params(whole), sizeof(float) * nw) == 0,
              "T=%d: the shards' parameters put together are the whole model's", ntp);
        // A shard is no whole model for a weights file.
        CHECK(!ok || dt_gpt_save(sh[0].m, "/nonexistent/x.safetensors") == DT_ERR_ARG, "T=%d: a shard is not saved as a model", ntp);
        free(back);
        free(want);
        for (int r = 0; r < ntp; r++) dt_gpt_free(sh[r].m);
        pthread_barrier_destroy(&g.bar);
    }
    for (int ci = 0; ci < NCASE; ci++)
        for (int r = 0; r < 4; r++) free(gk[ci][r]);
    dt_gpt *bad;
    CHECK(create_shard(&bad, &c, 1, 1, 0, 3, 0) == DT_ERR_ARG && strstr(dt_last_error(), "hidden size 32"),
          "3 shards of a hidden size of 32 refused: %s", dt_last_error());
    const dt_gpt_config c2 = {1, 2, 32, 16, 90, 128};
    CHECK(create_shard(&bad, &c2, 1, 1, 0, 4, 0) == DT_ERR_ARG && strstr(dt_last_error(), "2 attention heads"),
          "4 shards of 2 heads refused: %s", dt_last_error());
    const dt_gpt_config c6 = {1, 6, 36, 16, 90, 100};
    CHECK(create_shard(&bad, &c6, 1, 1, 0, 3, 0) == DT_ERR_ARG && strstr(dt_last_error(), "100 rows"),
          "3 shards of 100 vocabulary rows refused: %s", dt_last_error());
    CHECK(create_shard_seq(&bad, &c, 2, 8, 0, 1, 0, 1) == DT_ERR_ARG && strstr(dt_last_error(), "needs tensor-parallel shards"),
          "sequence parallel on one shard refused: %s", dt_last_error());
    CHECK(create_shard_seq(&bad, &c, 1, 6, 0, 4, 0, 1) == DT_ERR_ARG && strstr(dt_last_error(), "1 x 6 = 6 tokens"),
          "sequence parallel over 4 shards of 6 tokens refused: %s", dt_last_error());
    // A set of another kind than the model's, and a shape the shards do not divide.
    dt_gpt *sq;
    dt_gpt_acts *plain, *a6;
    dt_gpt_acts_params pp = {2, 8, 0, c.n_layer, 2, 0, 0, 0}, p6 = {2, 8, 0, c.n_layer, 2, 0, 1, 0};
    int ok = create_shard_seq(&sq, &c, 0, 0, 0, 2, 0, 1) == DT_OK && dt_gpt_acts_create_with(&plain, &c, &pp) == DT_OK &&
             dt_gpt_acts_create_with(&a6, &c, &p6) == DT_OK;
    CHECK(ok, "a sequence-parallel shard and sets: %s", dt_last_error());
    if (ok) {
        CHECK(dt_gpt_embed_forward(sq, plain, x, dt_gpt_acts_resid(plain, 0)) == DT_ERR_ARG &&
                  strstr(dt_last_error(), "made without sequence parallel"),
              "a set without sequence parallel refused by a model with it: %s", dt_last_error());
        CHECK(dt_gpt_acts_set_shape(a6, 1, 7) == DT_ERR_ARG && strstr(dt_last_error(), "1 x 7 = 7 tokens"),
              "a shape of 7 tokens over 2 shards refused: %s", dt_last_error());
        CHECK(dt_gpt_acts_resid(a6, 1) - dt_gpt_acts_resid(a6, 0) == 8 * c.n_embd,
              "a sequence-parallel set's stream: 16 / 2 rows a layer");
        dt_gpt_acts_free(plain);
        dt_gpt_acts_free(a6);
        dt_gpt_free(sq);
    }
    dt_gpt_free(whole);
}

// dt_gpt_init_range (a ZeRO-3 rank's slice): the range's values bitwise
// dt_gpt_init's, every element outside it left as it was (zero), for
// ranges that start and end inside tensors, a range inside one tensor and
// an empty one.
static void test_init_range(void) {
    const dt_gpt_config c = {4, 4, 32, 16, 90, 128};
    dt_gpt *w, *r;
    int ok = dt_gpt_create(&w, &c, 1, 4) == DT_OK && dt_gpt_create(&r, &c, 1, 4) == DT_OK && dt_gpt_init(w, 5) == DT_OK;
    CHECK(ok, "models: %s", dt_last_error());
    if (!ok) return;
    size_t n = dt_gpt_num_params(w), cuts[][2] = {{0, n / 3}, {n / 3, 2 * n / 3 + 7}, {2 * n / 3 + 7, n}, {101, 203},
                                                    {500, 500}};
    const float *pw = dt_gpt_params(w), *pr = dt_gpt_params(r);
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
        size_t lo = cuts[k][0], hi = cuts[k][1], bad = 0;
        memset(dt_gpt_params(r), 0, n * sizeof(float));
        CHECK(dt_gpt_init_range(r, 5, lo, hi) == DT_OK, "init_range: %s", dt_last_error());
        for (size_t i = 0; i < n; i++) bad += i >= lo && i < hi ? memcmp(&pr[i], &pw[i], 4) != 0 : pr[i] != 0;
        CHECK(bad == 0, "init_range [%zu, %zu) of %zu: %zu elements differ from dt_gpt_init's inside or are set outside",
              lo, hi, n, bad);
    }
    dt_gpt_free(w);
    dt_gpt_free(r);
}

// A model that keeps some blocks (a pipeline stage's, dt_gpt_set_held):
// stage A the embedding and blocks 0, 1, stage B blocks 2, 3 and the head.
// Each initialises its parts bitwise as the whole model does and nothing
// else; their parts put together (fill, every element from one of them) are
// the whole block; take puts a whole block's parts back; run as two
// stages, their losses and gradients are the whole model's (the tied wte
// within rounding: its two parts are summed apart).
static void test_held(void) {
    const dt_gpt_config c = {4, 4, 32, 16, 90, 128};
    const unsigned char ha[4] = {1, 1, 0, 0}, hb[4] = {0, 0, 1, 1};
    dt_gpt *w, *a, *b;
    int ok = dt_gpt_create(&w, &c, 2, 8) == DT_OK && dt_gpt_create(&a, &c, 0, 0) == DT_OK &&
             dt_gpt_create(&b, &c, 0, 0) == DT_OK;
    ok = ok && dt_gpt_set_held(a, ha) == DT_OK && dt_gpt_set_held(b, hb) == DT_OK;
    ok = ok && dt_gpt_init(w, 5) == DT_OK && dt_gpt_init(a, 5) == DT_OK && dt_gpt_init(b, 5) == DT_OK;
    CHECK(ok, "models keeping blocks: %s", dt_last_error());
    if (!ok) return;
    size_t n = dt_gpt_num_params(w);
    const dt_tensor_info *wte = dt_gpt_tensor(w, 0), *lnf = dt_gpt_tensor(w, 14), *qkv = dt_gpt_tensor(w, 4);
    int na, nb;
    const dt_grad_range *ra = dt_gpt_held_ranges(a, &na), *rb = dt_gpt_held_ranges(b, &nb);
    // A: wte, wpe and ln1w..fcprojb [0, 2) each; B: wte, the same [2, 4), lnf
    // (adjacent ranges as one: wte, wpe, ln1w [0, 2); fcprojb [2, 4), lnf)
    CHECK(na == 12 && ra[0].offset == 0 && ra[0].len == wte->numel + dt_gpt_tensor(w, 1)->numel + 2 * 32 && nb == 13 &&
              rb[0].offset == 0 && rb[0].len == wte->numel && rb[nb - 1].offset + rb[nb - 1].len == n,
          "held ranges: A %d (wte, wpe and ln1w's first two as one), B %d (wte, 11 slices, fcprojb's last two and lnf)",
          na, nb);
    size_t q2 = qkv->numel / 4 * 2;
    const float *pw = dt_gpt_params(w), *pa = dt_gpt_params(a), *pb = dt_gpt_params(b);
    CHECK(!memcmp(pa + qkv->offset, pw + qkv->offset, q2 * 4) && !memcmp(pb + qkv->offset + q2, pw + qkv->offset + q2, q2 * 4) &&
              !memcmp(pb, pw, wte->numel * 4) && pa[qkv->offset + q2] == 0 && pb[qkv->offset] == 0 && pb[wte->numel] == 0,
          "each keeps its blocks' initial values, bitwise the whole model's, and nothing else");
    float *back = zeros(n), *pc = zeros(n);
    for (size_t i = 0; i < n; i++) back[i] = -0.0f;
    float *fa = zeros(n), *fb = zeros(n);
    for (size_t i = 0; i < n; i++) fa[i] = fb[i] = -0.0f;
    dt_gpt_part_fill(a, pa, 0, n, fa);
    dt_gpt_part_fill(b, pb, 0, n, fb);
    for (size_t i = 0; i < n; i++) back[i] = fa[i] + fb[i];
    CHECK(!memcmp(back, pw, n * 4), "the two parts' fills add up to the whole block, bitwise");
    dt_gpt_part_take(b, pc, 0, n, pw);
    CHECK(!memcmp(pc + qkv->offset + q2, pw + qkv->offset + q2, q2 * 4) && pc[qkv->offset] == 0 && !memcmp(pc, pw, wte->numel * 4),
          "take: a whole block's parts into B's layout, nothing else");
    // Two stages against the whole model.
    int32_t x[16], y[16];
    random_tokens(x, 16, c.vocab_size);
    random_tokens(y, 16, c.vocab_size);
    dt_gpt_acts *sa, *sb;
    dt_gpt_acts_params p0 = {2, 8, 0, 2, 1, 0, 0, 0}, p1 = {2, 8, 2, 4, 1, 0, 0, 0};
    float lw, lb = 0;
    ok = dt_gpt_acts_create_with(&sa, &c, &p0) == DT_OK && dt_gpt_acts_create_with(&sb, &c, &p1) == DT_OK;
    float *mid = dt_gpt_acts_resid(sb, 2), *d = zeros(16 * 32);
    dt_gpt_zero_grad(w);
    dt_gpt_zero_grad(a);
    dt_gpt_zero_grad(b);
    ok = ok && dt_gpt_forward(w, x, y, 2, 8, &lw) == DT_OK && dt_gpt_backward(w) == DT_OK;
    ok = ok && dt_gpt_embed_forward(a, sa, x, dt_gpt_acts_resid(sa, 0)) == DT_OK &&
         dt_gpt_forward_range(a, sa, 0, 2, dt_gpt_acts_resid(sa, 0), mid) == DT_OK &&
         dt_gpt_forward_range(b, sb, 2, 4, mid, dt_gpt_acts_resid(sb, 4)) == DT_OK &&
         dt_gpt_head_forward(b, sb, dt_gpt_acts_resid(sb, 4), y, &lb) == DT_OK &&
         dt_gpt_head_backward(b, sb, dt_gpt_acts_resid(sb, 4), d) == DT_OK &&
         dt_gpt_backward_range(b, sb, 2, 4, mid, d) == DT_OK &&
         dt_gpt_backward_range(a, sa, 0, 2, dt_gpt_acts_resid(sa, 0), d) == DT_OK &&
         dt_gpt_embed_backward(a, sa, d) == DT_OK;
    CHECK(ok && lw == lb, "two stages of models keeping blocks: loss %.7g, the whole model's %.7g: %s", lb, lw,
          ok ? "" : dt_last_error());
    const float *gw = dt_gpt_grads(w), *ga = dt_gpt_grads(a), *gb = dt_gpt_grads(b);
    double worst = 0;
    for (size_t i = 0; i < wte->numel; i++) worst = fmax(worst, fabs((double)ga[i] + gb[i] - gw[i]));
    CHECK(ok && !memcmp(ga + qkv->offset, gw + qkv->offset, q2 * 4) && !memcmp(gb + qkv->offset + q2, gw + qkv->offset + q2, q2 * 4) &&
              !memcmp(gb + lnf->offset, gw + lnf->offset, lnf->numel * 4) && worst < 1e-6,
          "their gradients: the blocks' bitwise the whole model's, the tied wte's two parts summed within %.2g", worst);
    dt_gpt_acts_free(sa);
    dt_gpt_acts_free(sb);
    free(d), free(back), free(pc), free(fa), free(fb);
    unsigned char none[4] = {0};
    CHECK(dt_gpt_set_held(a, none) == DT_ERR_ARG && strstr(dt_last_error(), "none"), "a model keeping no block refused");
    dt_gpt_free(w), dt_gpt_free(a), dt_gpt_free(b);
}

// Parameter bytes a rank holds at T = 1, 2, 4 for GPT-2 124M: the split
// tensors' 1/T plus the whole ones (the blocks are not touched: no memory).
static void test_shard_bytes(void) {
    dt_gpt_config c;
    dt_gpt_preset("gpt2-124m", &c);
    size_t whole = dt_gpt_config_num_params(&c), split = 0;
    dt_tensor_info t[16];
    dt_gpt_param_shapes(&c, t);
    for (int i = 0; i < 16; i++) split += dt_gpt_tensor_split(i) ? t[i].numel : 0;
    for (int T = 1; T <= 4; T *= 2) {
        dt_gpt *m;
        if (create_shard(&m, &c, 0, 0, T - 1, T, 0) != DT_OK) {
            CHECK(0, "gpt2-124m shard of %d: %s", T, dt_last_error());
            continue;
        }
        size_t n = dt_gpt_num_params(m);
        CHECK(n == split / T + (whole - split), "gpt2-124m, T = %d: %zu parameters a rank, expected %zu / %d split + %zu whole",
              T, n, split, T, whole - split);
        printf("gpt2-124m, tensor = %d: %zu parameter bytes a rank (%.1f MB; split %zu / %d + whole %zu floats), %.3f of the whole model\n",
               T, 4 * n, 4e-6 * (double)n, split, T, whole - split, (double)n / (double)whole);
        dt_gpt_free(m);
    }
}

static void test_presets(void) {
    dt_gpt_config c;
    CHECK(dt_gpt_preset("gpt2-124m", &c) == DT_OK && c.padded_vocab_size == 50304, "gpt2-124m preset");
    // GPT-2 small has 124,475,904 parameters with wte padded to 50304 rows
    // (124,439,808 unpadded), as llm.c reports.
    CHECK(dt_gpt_config_num_params(&c) == 124475904, "gpt2-124m parameter count %zu", dt_gpt_config_num_params(&c));
    CHECK(dt_gpt_preset("gpt-tiny", &c) == DT_OK && c.n_layer == 2 && c.n_embd == 64 && c.n_head == 4, "gpt-tiny");
    CHECK(dt_gpt_preset("gpt-small", &c) == DT_OK && c.n_layer == 6 && c.n_embd == 384 && c.n_head == 6, "gpt-small");
    CHECK(dt_gpt_preset("gpt-huge", &c) == DT_ERR_ARG, "unknown preset rejected");
    CHECK(dt_gpt_pad_vocab(50257) == 50304 && dt_gpt_pad_vocab(256) == 256, "vocab padding");
}

int main(void) {
    dt_rng_seed(&g_rng, 42);
    dt_set_threads(2);
    test_attention();
    test_attention_blocks();
    test_encoder_residual();
    test_model();
    test_stages();
    test_forward_only();
    test_tensor_parallel();
    test_shard_bytes();
    test_held();
    test_init_range();
    test_presets();
    return tl_finish();
}
