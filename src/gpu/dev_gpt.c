/* The GPT on the device (dev_model.h): nn/gpt.c's whole-model forward and
 * backward (one copy of the model, fp32, no recomputation), kernel for
 * kernel, over the same parameter and gradient blocks. A linear is the
 * bias written first and the GEMM adding onto it, as dt_linear_forward. */
#include "gpu/dev_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                                                  \
    do {                                                                                                           \
        dt_status st_ = (call);                                                                                    \
        if (st_ != DT_OK) return st_;                                                                              \
    } while (0)

enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB,
       NPT };

typedef struct {  // one layer's saved activations
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fchg;
} layer_acts;

struct dt_dev_gpt {
    dt_dev_blocks b;
    dt_gpt_config c;
    size_t off[NPT];  // the tensors' offsets in the blocks
    int maxB, maxT, B, T;
    float loss_scale;
    float *resid;  // [L + 1, B, T, C]
    layer_acts *la;
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *probs;
    int32_t *inputs, *targets;
    float *dresid, *dln, *datty, *dqkv, *dfch, *dfchg, *datt;  // backward's scratch, one layer's
};

static void gpt_take(dt_dev_gpt *g) {
    dt_dev_arena *a = &g->b.arena;
    size_t BT = (size_t)g->maxB * g->maxT, C = (size_t)g->c.n_embd, V = (size_t)g->c.vocab_size, f = sizeof(float);
    size_t att = (size_t)g->maxB * g->c.n_head * g->maxT * g->maxT;
    dt_dev_blocks_take(&g->b, (int)BT);
    g->resid = dt_dev_take(a, DT_DEV_ACTS, f * BT * C * (size_t)(g->c.n_layer + 1));
    for (int l = 0; l < g->c.n_layer; l++) {
        layer_acts *s = &g->la[l];
        s->ln1 = dt_dev_take(a, DT_DEV_ACTS, f * BT * C);
        s->ln1_mean = dt_dev_take(a, DT_DEV_ACTS, f * BT);
        s->ln1_rstd = dt_dev_take(a, DT_DEV_ACTS, f * BT);
        s->qkv = dt_dev_take(a, DT_DEV_ACTS, f * BT * 3 * C);
        s->atty = dt_dev_take(a, DT_DEV_ACTS, f * BT * C);
        s->att = dt_dev_take(a, DT_DEV_ACTS, f * att);
        s->res2 = dt_dev_take(a, DT_DEV_ACTS, f * BT * C);
        s->ln2 = dt_dev_take(a, DT_DEV_ACTS, f * BT * C);
        s->ln2_mean = dt_dev_take(a, DT_DEV_ACTS, f * BT);
        s->ln2_rstd = dt_dev_take(a, DT_DEV_ACTS, f * BT);
        s->fch = dt_dev_take(a, DT_DEV_ACTS, f * BT * 4 * C);
        s->fchg = dt_dev_take(a, DT_DEV_ACTS, f * BT * 4 * C);
    }
    g->lnf = dt_dev_take(a, DT_DEV_ACTS, f * BT * C);
    g->lnf_mean = dt_dev_take(a, DT_DEV_ACTS, f * BT);
    g->lnf_rstd = dt_dev_take(a, DT_DEV_ACTS, f * BT);
    g->logits = dt_dev_take(a, DT_DEV_ACTS, f * BT * V);
    g->probs = dt_dev_take(a, DT_DEV_ACTS, f * BT * V);
    g->inputs = dt_dev_take(a, DT_DEV_ACTS, sizeof(int32_t) * BT);
    g->targets = dt_dev_take(a, DT_DEV_ACTS, sizeof(int32_t) * BT);
    g->dresid = dt_dev_take(a, DT_DEV_WORK, f * BT * C);
    g->dln = dt_dev_take(a, DT_DEV_WORK, f * BT * C);
    g->datty = dt_dev_take(a, DT_DEV_WORK, f * BT * C);
    g->dqkv = dt_dev_take(a, DT_DEV_WORK, f * BT * 3 * C);
    g->dfch = dt_dev_take(a, DT_DEV_WORK, f * BT * 4 * C);
    g->dfchg = dt_dev_take(a, DT_DEV_WORK, f * BT * 4 * C);
    g->datt = dt_dev_take(a, DT_DEV_WORK, f * att);
}

dt_status dt_dev_gpt_create(dt_dev_gpt **out, const dt_dev *d, const dt_gpt *m, int B, int T, int nstates) {
    dt_dev_gpt *g = calloc(1, sizeof *g);
    const dt_gpt_config *c = dt_gpt_get_config(m);
    layer_acts *la = calloc((size_t)c->n_layer, sizeof *la);
    if (!g || !la) {
        free(g);
        free(la);
        *out = NULL;
        return dt_error(DT_ERR_NOMEM, "out of memory");
    }
    *g = (dt_dev_gpt){.b = {.d = d, .arena = {.d = d}, .n = dt_gpt_num_params(m), .nstates = nstates}, .c = *c,
                      .maxB = B, .maxT = T, .la = la};
    for (int i = 0; i < NPT; i++) g->off[i] = dt_gpt_tensor(m, i)->offset;
    *out = g;
    gpt_take(g);  // (counting)
    size_t pinned = 2 * sizeof(int32_t) * (size_t)B * T;
    dt_status st = dt_dev_blocks_open(&g->b, pinned, "the device model");
    if (st != DT_OK) {
        dt_dev_gpt_free(g);
        *out = NULL;
        return st;
    }
    gpt_take(g);
    return DT_OK;
}

void dt_dev_gpt_free(dt_dev_gpt *g) {
    if (!g) return;
    dt_dev_blocks_close(&g->b);
    free(g->la);
    free(g);
}

dt_dev_blocks *dt_dev_gpt_blocks(dt_dev_gpt *g) { return &g->b; }

// A tensor's layer l slice in block `blk` (params or grads): per-layer
// tensors are [L, rows of `per` floats].
static float *at(const dt_dev_gpt *g, float *blk, int i, int l, size_t per) { return blk + g->off[i] + l * per; }

static dt_status linear_forward(const dt_dev *d, float *out, const float *inp, const float *w, const float *b, int N,
                                int C, int OC) {
    if (b) {
        TRY(d->memset0(out, sizeof(float) * (size_t)N * OC));
        TRY(d->bias_forward(out, b, (size_t)N, OC));
    }
    return d->sgemm(0, 1, N, OC, C, 1.0f, inp, C, w, C, b ? 1.0f : 0.0f, out, OC);
}

// dt_linear_backward; din NULL: not computed; db NULL: no bias.
static dt_status linear_backward(const dt_dev *d, float *din, float *dw, float *db, const float *dout,
                                 const float *inp, const float *w, int N, int C, int OC) {
    if (din) TRY(d->sgemm(0, 0, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, din, C));
    TRY(d->sgemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C));
    return db ? d->bias_backward(db, dout, (size_t)N, OC) : DT_OK;
}

static dt_status layer_forward(dt_dev_gpt *g, int l, const float *residual, float *out) {
    const dt_dev *d = g->b.d;
    int B = g->B, T = g->T, C = g->c.n_embd, BT = B * T, F = 4 * C;
    size_t rC = (size_t)BT * C, uC = (size_t)C;
    layer_acts *s = &g->la[l];
    float *p = g->b.params;
    TRY(d->layernorm_forward(s->ln1, s->ln1_mean, s->ln1_rstd, residual, at(g, p, LN1W, l, uC), at(g, p, LN1B, l, uC),
                             (size_t)BT, C, 1e-5f));
    TRY(linear_forward(d, s->qkv, s->ln1, at(g, p, QKVW, l, 3 * uC * uC), at(g, p, QKVB, l, 3 * uC), BT, C, 3 * C));
    TRY(d->attention_forward(s->atty, s->att, s->qkv, B, T, C, g->c.n_head));
    TRY(linear_forward(d, s->res2, s->atty, at(g, p, ATTPROJW, l, uC * uC), at(g, p, ATTPROJB, l, uC), BT, C, C));
    TRY(d->residual_forward(s->res2, residual, s->res2, rC));
    TRY(d->layernorm_forward(s->ln2, s->ln2_mean, s->ln2_rstd, s->res2, at(g, p, LN2W, l, uC), at(g, p, LN2B, l, uC),
                             (size_t)BT, C, 1e-5f));
    TRY(linear_forward(d, s->fch, s->ln2, at(g, p, FCW, l, 4 * uC * uC), at(g, p, FCB, l, 4 * uC), BT, C, F));
    TRY(d->gelu_forward(s->fchg, s->fch, (size_t)BT * F));
    TRY(linear_forward(d, out, s->fchg, at(g, p, FCPROJW, l, 4 * uC * uC), at(g, p, FCPROJB, l, uC), BT, F, C));
    return d->residual_forward(out, s->res2, out, rC);
}

static dt_status check_tokens(const int32_t *tok, int n, int V, const char *what) {
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return dt_error(DT_ERR_ARG, "gpt forward: %s token %d at position %d is outside the vocabulary [0, %d)",
                            what, tok[i], i, V);
    return DT_OK;
}

dt_status dt_dev_gpt_forward(dt_dev_gpt *g, const int32_t *inputs, const int32_t *targets, int B, int T,
                             float loss_scale, float *loss) {
    const dt_dev *d = g->b.d;
    int C = g->c.n_embd, V = g->c.vocab_size, L = g->c.n_layer, BT = B * T;
    if (B < 1 || B > g->maxB || T < 1 || T > g->maxT)
        return dt_error(DT_ERR_ARG, "device gpt: batch %d x %d outside 1..%d x 1..%d", B, T, g->maxB, g->maxT);
    TRY(check_tokens(inputs, BT, V, "input"));
    TRY(check_tokens(targets, BT, V, "target"));
    int32_t *pin = g->b.pinned;
    memcpy(pin, inputs, sizeof(int32_t) * (size_t)BT);
    memcpy(pin + BT, targets, sizeof(int32_t) * (size_t)BT);
    TRY(d->to_device(g->inputs, pin, sizeof(int32_t) * (size_t)BT));
    TRY(d->to_device(g->targets, pin + BT, sizeof(int32_t) * (size_t)BT));
    g->B = B;
    g->T = T;
    float *p = g->b.params;
    size_t rC = (size_t)BT * C;
    TRY(d->encoder_forward(g->resid, g->inputs, p + g->off[WTE], p + g->off[WPE], B, T, C));
    for (int l = 0; l < L; l++) TRY(layer_forward(g, l, g->resid + l * rC, g->resid + (l + 1) * rC));
    TRY(d->layernorm_forward(g->lnf, g->lnf_mean, g->lnf_rstd, g->resid + L * rC, p + g->off[LNFW], p + g->off[LNFB],
                             (size_t)BT, C, 1e-5f));
    TRY(linear_forward(d, g->logits, g->lnf, p + g->off[WTE], NULL, BT, C, V));  // the tied head
    TRY(d->crossentropy_forward(g->probs, g->b.row_loss, g->b.loss, g->logits, g->targets, (size_t)BT, V, (size_t)V));
    float l;
    TRY(d->to_host(&l, g->b.loss, sizeof l));
    g->loss_scale = loss_scale;
    *loss = l;
    if (!isfinite(l)) return dt_error(DT_ERR_NUMERIC, "gpt forward: loss is %g", l);
    return DT_OK;
}

static dt_status layer_backward(dt_dev_gpt *g, int l, const float *residual) {
    const dt_dev *d = g->b.d;
    int B = g->B, T = g->T, C = g->c.n_embd, BT = B * T, F = 4 * C;
    size_t sC = (size_t)BT * C, sF = (size_t)BT * F, uC = (size_t)C, f = sizeof(float);
    layer_acts *s = &g->la[l];
    float *p = g->b.params, *gr = g->b.grads;
    TRY(d->memset0(g->dfchg, f * sF));
    TRY(linear_backward(d, g->dfchg, at(g, gr, FCPROJW, l, 4 * uC * uC), at(g, gr, FCPROJB, l, uC), g->dresid, s->fchg,
                        at(g, p, FCPROJW, l, 4 * uC * uC), BT, F, C));
    TRY(d->memset0(g->dfch, f * sF));
    TRY(d->gelu_backward(g->dfch, g->dfchg, s->fch, sF));
    TRY(d->memset0(g->dln, f * sC));
    TRY(linear_backward(d, g->dln, at(g, gr, FCW, l, 4 * uC * uC), at(g, gr, FCB, l, 4 * uC), g->dfch, s->ln2,
                        at(g, p, FCW, l, 4 * uC * uC), BT, C, F));
    TRY(d->layernorm_backward(g->dresid, at(g, gr, LN2W, l, uC), at(g, gr, LN2B, l, uC), g->dln, s->res2,
                              at(g, p, LN2W, l, uC), s->ln2_mean, s->ln2_rstd, (size_t)BT, C));
    TRY(d->memset0(g->datty, f * sC));
    TRY(linear_backward(d, g->datty, at(g, gr, ATTPROJW, l, uC * uC), at(g, gr, ATTPROJB, l, uC), g->dresid, s->atty,
                        at(g, p, ATTPROJW, l, uC * uC), BT, C, C));
    TRY(d->memset0(g->dqkv, f * 3 * sC));
    TRY(d->attention_backward(g->dqkv, g->datt, g->datty, s->qkv, s->att, B, T, C, g->c.n_head));
    TRY(d->memset0(g->dln, f * sC));
    TRY(linear_backward(d, g->dln, at(g, gr, QKVW, l, 3 * uC * uC), at(g, gr, QKVB, l, 3 * uC), g->dqkv, s->ln1,
                        at(g, p, QKVW, l, 3 * uC * uC), BT, C, 3 * C));
    return d->layernorm_backward(g->dresid, at(g, gr, LN1W, l, uC), at(g, gr, LN1B, l, uC), g->dln, residual,
                                 at(g, p, LN1W, l, uC), s->ln1_mean, s->ln1_rstd, (size_t)BT, C);
}

dt_status dt_dev_gpt_backward(dt_dev_gpt *g) {
    const dt_dev *d = g->b.d;
    int B = g->B, T = g->T, C = g->c.n_embd, V = g->c.vocab_size, L = g->c.n_layer, BT = B * T;
    if (!B) return dt_error(DT_ERR_ARG, "device gpt: backward needs a forward first");
    size_t sC = (size_t)BT * C, f = sizeof(float);
    float *p = g->b.params, *gr = g->b.grads, *dlogits = g->logits;  // (the logits are no longer needed)
    TRY(d->memset0(dlogits, f * (size_t)BT * V));
    TRY(d->crossentropy_backward(dlogits, g->probs, g->targets, (size_t)BT, V, (size_t)V, g->loss_scale));
    TRY(d->memset0(g->dln, f * sC));
    TRY(linear_backward(d, g->dln, gr + g->off[WTE], NULL, dlogits, g->lnf, p + g->off[WTE], BT, C, V));
    TRY(d->memset0(g->dresid, f * sC));
    TRY(d->layernorm_backward(g->dresid, gr + g->off[LNFW], gr + g->off[LNFB], g->dln, g->resid + L * sC,
                              p + g->off[LNFW], g->lnf_mean, g->lnf_rstd, (size_t)BT, C));
    for (int l = L - 1; l >= 0; l--) TRY(layer_backward(g, l, g->resid + l * sC));
    TRY(d->encoder_backward(gr + g->off[WTE], gr + g->off[WPE], g->dresid, g->inputs, B, T, C));
    g->B = 0;
    return DT_OK;
}
