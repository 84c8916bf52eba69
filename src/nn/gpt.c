/* The GPT-2 model: parameters in llm.c's layout, forward, backward. The
 * structure follows llm.c's train_gpt2.c (one parameter block, one block of
 * saved activations), with the layer kernels of layers.c and attention.c. */
#include "dtrain/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPT 16  // parameter tensors

static const char *const param_names[NPT] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW,
       FCPROJB, LNFW, LNFB };

struct dt_gpt {
    dt_gpt_config c;
    int maxB, maxT;
    size_t nparams;
    dt_tensor_info tensors[NPT];
    float *params, *grads;
    float *p[NPT], *g[NPT];   // tensor views into the blocks
    dt_grad_range *order;     // the gradient order (dt_gpt_grad_order), 12 L + 4

    // Saved activations (llm.c's ActivationTensors), sized for maxB x maxT.
    // Per-layer ones are [L, B, T, ...].
    float *encoded;                  // [B,T,C]
    float *ln1, *ln1_mean, *ln1_rstd; // [L,B,T,C], [L,B,T]
    float *qkv;                      // [L,B,T,3C]
    float *atty;                     // [L,B,T,C]
    float *att;                      // [L,B,NH,T,T]
    float *attproj;                  // [L,B,T,C]
    float *residual2;                // [L,B,T,C]
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;           // [L,B,T,4C]
    float *fcproj;                   // [L,B,T,C]
    float *residual3;                // [L,B,T,C]
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits, *probs;           // [B,T,V]

    // Backward scratch, one layer's worth, reused layer after layer.
    float *dresidual, *dln, *datty, *dqkv, *dfch, *dfch_gelu, *datt;

    int32_t *inputs, *targets;       // copies of the last forward's [B,T]
    int B, T, have_targets;
    float loss_scale;
    dt_grad_ready_fn hook;
    void *hook_user;
};

// ----------------------------------------------------------------------------
// configuration

int dt_gpt_pad_vocab(int V) { return (V + 127) / 128 * 128; }

dt_status dt_gpt_preset(const char *name, dt_gpt_config *c) {
    memset(c, 0, sizeof *c);
    if (!strcmp(name, "gpt-tiny")) *c = (dt_gpt_config){2, 4, 64, 256, 256, 256};
    else if (!strcmp(name, "gpt-small")) *c = (dt_gpt_config){6, 6, 384, 256, 256, 256};
    else if (!strcmp(name, "gpt2-124m")) *c = (dt_gpt_config){12, 12, 768, 1024, 50257, 50304};
    else return dt_error(DT_ERR_ARG, "unknown GPT preset '%s' (expected gpt-tiny, gpt-small or gpt2-124m)", name);
    return DT_OK;
}

dt_status dt_gpt_config_check(const dt_gpt_config *c, const char *what) {
    const struct { const char *name; int v, lo, hi; } f[] = {
        {"n_layer", c->n_layer, 1, 1024},      {"n_head", c->n_head, 1, 1024},
        {"n_embd", c->n_embd, 1, 65536},       {"block_size", c->block_size, 1, 1 << 20},
        {"vocab_size", c->vocab_size, 1, 65536}, {"padded_vocab_size", c->padded_vocab_size, 1, 1 << 20}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < f[i].lo || f[i].v > f[i].hi)
            return dt_error(DT_ERR_ARG, "%s: %s = %d: expected a value from %d to %d", what, f[i].name,
                            f[i].v, f[i].lo, f[i].hi);
    if (c->n_embd % c->n_head)
        return dt_error(DT_ERR_ARG, "%s: n_embd (%d) is not a multiple of n_head (%d)", what, c->n_embd, c->n_head);
    if (c->padded_vocab_size < c->vocab_size)
        return dt_error(DT_ERR_ARG, "%s: padded_vocab_size (%d) is below vocab_size (%d)", what,
                        c->padded_vocab_size, c->vocab_size);
    // Token files hold uint16 ids: a larger vocabulary could not be fed.
    if (c->vocab_size > 65536) return dt_error(DT_ERR_ARG, "%s: vocab_size %d exceeds 65536", what, c->vocab_size);
    return DT_OK;
}

// Element counts of the 16 tensors and their shapes.
void dt_gpt_param_shapes(const dt_gpt_config *c, dt_tensor_info t[NPT]) {
    int64_t L = c->n_layer, C = c->n_embd, Vp = c->padded_vocab_size, maxT = c->block_size;
    const int64_t sh[NPT][3] = {{Vp, C}, {maxT, C}, {L, C}, {L, C}, {L, 3 * C, C}, {L, 3 * C},
                                {L, C, C}, {L, C}, {L, C}, {L, C}, {L, 4 * C, C}, {L, 4 * C},
                                {L, C, 4 * C}, {L, C}, {C}, {C}};
    size_t off = 0;
    for (int i = 0; i < NPT; i++) {
        t[i].name = param_names[i];
        t[i].ndim = (i == LNFW || i == LNFB) ? 1 : (i == QKVW || i == ATTPROJW || i == FCW || i == FCPROJW) ? 3 : 2;
        size_t n = 1;
        for (int d = 0; d < 4; d++) t[i].shape[d] = d < t[i].ndim ? sh[i][d] : 0;
        for (int d = 0; d < t[i].ndim; d++) n *= (size_t)sh[i][d];
        t[i].numel = n;
        t[i].offset = off;
        off += n;
    }
}

size_t dt_gpt_config_num_params(const dt_gpt_config *c) {
    dt_tensor_info t[NPT];
    dt_gpt_param_shapes(c, t);
    return t[NPT - 1].offset + t[NPT - 1].numel;
}

// ----------------------------------------------------------------------------
// create / free

// The model's float buffers, in one order for create, free and the size
// estimate: the two blocks, then the saved activations and the scratch.
enum { NBUF = 30 };

static void buffer_list(dt_gpt *m, float **p[NBUF]) {
    float **b[NBUF] = {&m->params, &m->grads, &m->encoded, &m->ln1, &m->ln1_mean, &m->ln1_rstd,
                       &m->qkv, &m->atty, &m->att, &m->attproj, &m->residual2, &m->ln2,
                       &m->ln2_mean, &m->ln2_rstd, &m->fch, &m->fch_gelu, &m->fcproj,
                       &m->residual3, &m->lnf, &m->lnf_mean, &m->lnf_rstd, &m->logits, &m->probs,
                       &m->dresidual, &m->dln, &m->datty, &m->dqkv, &m->dfch, &m->dfch_gelu,
                       &m->datt};
    memcpy(p, b, sizeof b);
}

// Floats of each buffer of buffer_list for batches of B x T, in double: the
// products of valid sizes can pass 2^64 (B and T up to 2^20 each), which
// the estimate must report rather than wrap.
static void buffer_sizes(const dt_gpt_config *c, int B, int T, double n[NBUF]) {
    double L = c->n_layer, C = c->n_embd, NH = c->n_head, V = c->vocab_size, np = (double)dt_gpt_config_num_params(c);
    double BT = (double)B * T, att = (double)B * NH * T * T;
    const double z[NBUF] = {np, np, BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C, L * att,
                            L * BT * C, L * BT * C, L * BT * C, L * BT, L * BT, L * BT * 4 * C, L * BT * 4 * C,
                            L * BT * C, L * BT * C, BT * C, BT, BT, BT * V, BT * V, BT * C, BT * C, BT * C,
                            BT * 3 * C, BT * 4 * C, BT * 4 * C, att};
    memcpy(n, z, sizeof z);
}

size_t dt_gpt_activation_bytes(const dt_gpt_config *c, int B, int T) {
    double n[NBUF], total = 2.0 * sizeof(int32_t) * B * T;  // inputs, targets
    buffer_sizes(c, B, T, n);
    for (int i = 2; i < NBUF; i++) total += sizeof(float) * n[i];
    return total < 0x1p63 ? (size_t)total : SIZE_MAX;
}

void dt_gpt_free(dt_gpt *m) {
    if (!m) return;
    float **bufs[NBUF];
    buffer_list(m, bufs);
    for (int i = 0; i < NBUF; i++) dt_free(*bufs[i]);
    dt_free(m->inputs);
    dt_free(m->targets);
    free(m->order);
    free(m);
}

dt_status dt_gpt_create(dt_gpt **out, const dt_gpt_config *c, int B, int T) {
    *out = NULL;
    dt_status st = dt_gpt_config_check(c, "gpt");
    if (st != DT_OK) return st;
    if (B < 1 || T < 1 || T > c->block_size)
        return dt_error(DT_ERR_ARG, "gpt: batch %d x context %d: expected B >= 1 and 1 <= T <= block_size (%d)",
                        B, T, c->block_size);
    dt_gpt *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "gpt: out of memory");
    m->c = *c;
    m->maxB = B;
    m->maxT = T;
    m->loss_scale = 1.0f;
    dt_gpt_param_shapes(c, m->tensors);
    m->nparams = dt_gpt_config_num_params(c);
    size_t L = c->n_layer, BT = (size_t)B * T, total = 0;
    double sz[NBUF];
    float **bufs[NBUF];
    buffer_list(m, bufs);
    buffer_sizes(c, B, T, sz);
    for (int i = 0; i < NBUF; i++) {
        total += (size_t)sz[i];
        if (sz[i] >= 0x1p60 || !(*bufs[i] = dt_alloc(sizeof(float) * (size_t)sz[i]))) {
            dt_gpt_free(m);
            return dt_error(DT_ERR_NOMEM, "gpt: out of memory (%zu MiB of parameters and activations for B=%d T=%d)",
                            total * 4 >> 20, B, T);
        }
    }
    m->inputs = dt_alloc(sizeof(int32_t) * BT);
    m->targets = dt_alloc(sizeof(int32_t) * BT);
    m->order = malloc(sizeof(dt_grad_range) * (12 * L + 4));
    if (!m->inputs || !m->targets || !m->order) {
        dt_gpt_free(m);
        return dt_error(DT_ERR_NOMEM, "gpt: out of memory");
    }
    for (int i = 0; i < NPT; i++) {
        m->p[i] = m->params + m->tensors[i].offset;
        m->g[i] = m->grads + m->tensors[i].offset;
    }
    // The gradient order: layer by layer, as the block would be laid out if
    // it were not stacked (see grads_final).
    int n = 0;
    for (int i = WTE; i <= WPE; i++) m->order[n++] = (dt_grad_range){m->tensors[i].offset, m->tensors[i].numel};
    for (size_t l = 0; l < L; l++)
        for (int i = LN1W; i <= FCPROJB; i++) {
            size_t len = m->tensors[i].numel / L;
            m->order[n++] = (dt_grad_range){m->tensors[i].offset + l * len, len};
        }
    for (int i = LNFW; i <= LNFB; i++) m->order[n++] = (dt_grad_range){m->tensors[i].offset, m->tensors[i].numel};
    *out = m;
    return DT_OK;
}

const dt_gpt_config *dt_gpt_get_config(const dt_gpt *m) { return &m->c; }
size_t dt_gpt_num_params(const dt_gpt *m) { return m->nparams; }
float *dt_gpt_params(dt_gpt *m) { return m->params; }
float *dt_gpt_grads(dt_gpt *m) { return m->grads; }
void dt_gpt_zero_grad(dt_gpt *m) { memset(m->grads, 0, sizeof(float) * m->nparams); }
int dt_gpt_num_tensors(const dt_gpt *m) { (void)m; return NPT; }
const dt_tensor_info *dt_gpt_tensor(const dt_gpt *m, int i) {
    return i >= 0 && i < NPT ? &m->tensors[i] : NULL;
}
const float *dt_gpt_logits(const dt_gpt *m) { return m->logits; }
void dt_gpt_set_loss_scale(dt_gpt *m, float s) { m->loss_scale = s; }
const dt_grad_range *dt_gpt_grad_order(const dt_gpt *m, int *n) {
    *n = 12 * m->c.n_layer + 4;
    return m->order;
}
void dt_gpt_set_grad_hook(dt_gpt *m, dt_grad_ready_fn fn, void *user) {
    m->hook = fn;
    m->hook_user = user;
}

void dt_gpt_init(dt_gpt *m, uint64_t seed) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    const dt_gpt_config *c = &m->c;
    float resid_std = 0.02f / sqrtf(2.0f * c->n_layer);
    memset(m->params, 0, sizeof(float) * m->nparams);
    for (int i = 0; i < NPT; i++) {
        float *p = m->p[i];
        size_t n = m->tensors[i].numel;
        if (i == WTE) n = (size_t)c->vocab_size * c->n_embd;  // padding rows stay 0
        if (i == LN1W || i == LN2W || i == LNFW) {
            for (size_t j = 0; j < n; j++) p[j] = 1.0f;
        } else if (i == WTE || i == WPE || i == QKVW || i == FCW || i == ATTPROJW || i == FCPROJW) {
            float sd = (i == ATTPROJW || i == FCPROJW) ? resid_std : 0.02f;
            for (size_t j = 0; j < n; j++) p[j] = sd * dt_rng_normal(&r);
        }
    }
}

// ----------------------------------------------------------------------------
// forward

dt_status dt_gpt_forward(dt_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                         float *loss) {
    const dt_gpt_config *c = &m->c;
    if (B < 1 || B > m->maxB || T < 1 || T > m->maxT)
        return dt_error(DT_ERR_ARG, "gpt forward: batch %d x context %d exceeds the %d x %d the model was built for (block_size %d)",
                        B, T, m->maxB, m->maxT, c->block_size);
    int V = c->vocab_size;
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return dt_error(DT_ERR_ARG, "gpt forward: input token %d at position %d is outside the vocabulary [0, %d)",
                            inputs[i], i, V);
        if (targets && (targets[i] < 0 || targets[i] >= V))
            return dt_error(DT_ERR_ARG, "gpt forward: target token %d at position %d is outside the vocabulary [0, %d)",
                            targets[i], i, V);
    }
    int L = c->n_layer, C = c->n_embd, NH = c->n_head, BT = B * T;
    m->B = B;
    m->T = T;
    memcpy(m->inputs, inputs, sizeof(int32_t) * BT);
    m->have_targets = targets != NULL;
    if (targets) memcpy(m->targets, targets, sizeof(int32_t) * BT);

    dt_encoder_forward(m->encoded, inputs, m->p[WTE], m->p[WPE], B, T, C);
    size_t sC = (size_t)BT * C, s1 = BT, satt = (size_t)B * NH * T * T;
    for (int l = 0; l < L; l++) {
        const float *residual = l == 0 ? m->encoded : m->residual3 + (l - 1) * sC;
        float *ln1 = m->ln1 + l * sC, *qkv = m->qkv + l * 3 * sC, *atty = m->atty + l * sC;
        float *attproj = m->attproj + l * sC, *res2 = m->residual2 + l * sC, *ln2 = m->ln2 + l * sC;
        float *fch = m->fch + l * 4 * sC, *fchg = m->fch_gelu + l * 4 * sC;
        float *fcproj = m->fcproj + l * sC, *res3 = m->residual3 + l * sC;
        size_t lC = (size_t)l * C;
        dt_layernorm_forward(ln1, m->ln1_mean + l * s1, m->ln1_rstd + l * s1, residual,
                             m->p[LN1W] + lC, m->p[LN1B] + lC, BT, C, 1e-5f);
        dt_linear_forward(qkv, ln1, m->p[QKVW] + lC * 3 * C, m->p[QKVB] + 3 * lC, BT, C, 3 * C);
        dt_attention_forward(atty, m->att + l * satt, qkv, B, T, C, NH);
        dt_linear_forward(attproj, atty, m->p[ATTPROJW] + lC * C, m->p[ATTPROJB] + lC, BT, C, C);
        dt_residual_forward(res2, residual, attproj, sC);
        dt_layernorm_forward(ln2, m->ln2_mean + l * s1, m->ln2_rstd + l * s1, res2,
                             m->p[LN2W] + lC, m->p[LN2B] + lC, BT, C, 1e-5f);
        dt_linear_forward(fch, ln2, m->p[FCW] + lC * 4 * C, m->p[FCB] + 4 * lC, BT, C, 4 * C);
        dt_gelu_forward(fchg, fch, 4 * sC);
        dt_linear_forward(fcproj, fchg, m->p[FCPROJW] + lC * 4 * C, m->p[FCPROJB] + lC, BT, 4 * C, C);
        dt_residual_forward(res3, res2, fcproj, sC);
    }
    dt_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->residual3 + (L - 1) * sC, m->p[LNFW],
                         m->p[LNFB], BT, C, 1e-5f);
    // Tied head: the first V rows of wte are the output projection.
    dt_linear_forward(m->logits, m->lnf, m->p[WTE], NULL, BT, C, V);
    if (targets) {
        float l = dt_crossentropy_forward(m->probs, m->logits, targets, BT, V);
        if (!isfinite(l)) return dt_error(DT_ERR_NUMERIC, "gpt forward: loss is %g", l);
        if (loss) *loss = l;
    }
    return DT_OK;
}

// ----------------------------------------------------------------------------
// backward

// Tells the grad hook that layer l's slices of the per-layer tensors from k
// (in block order) on have just been computed. Backward runs lnf, then the
// layers from L-1 down, each visiting its tensors in decreasing block order,
// then the embedding, which also completes wte (the tied head's gradient was
// its first part): so the gradient order (wte, wpe, layer 0's slices in block
// order, ..., layer L-1's, lnfw, lnfb) is final from slice (k, l) to its end.
// Its position there: wte, wpe, the l layers below and, in layer l, the
// tensors before k. (k = LNFW, l = L-1 gives lnfw's.)
static void grads_final(dt_gpt *m, int k, int l) {
    if (!m->hook) return;
    size_t L = m->c.n_layer, pos = m->tensors[WTE].numel + m->tensors[WPE].numel;
    for (int i = LN1W; i <= FCPROJB; i++) pos += (size_t)(i < k ? l + 1 : l) * (m->tensors[i].numel / L);
    m->hook(pos, m->hook_user);
}

dt_status dt_gpt_backward(dt_gpt *m) {
    if (!m->have_targets)
        return dt_error(DT_ERR_ARG, "gpt backward: the last forward had no targets");
    const dt_gpt_config *c = &m->c;
    int B = m->B, T = m->T, L = c->n_layer, C = c->n_embd, NH = c->n_head, V = c->vocab_size;
    int BT = B * T;
    size_t sC = (size_t)BT * C, s1 = BT, satt = (size_t)B * NH * T * T;

    // dlogits overwrites the logits (no longer needed).
    float *dlogits = m->logits;
    memset(dlogits, 0, sizeof(float) * BT * V);
    dt_crossentropy_backward(dlogits, m->probs, m->targets, BT, V, m->loss_scale);
    memset(m->dln, 0, sizeof(float) * sC);
    dt_linear_backward(m->dln, m->g[WTE], NULL, dlogits, m->lnf, m->p[WTE], BT, C, V);
    memset(m->dresidual, 0, sizeof(float) * sC);
    dt_layernorm_backward(m->dresidual, m->g[LNFW], m->g[LNFB], m->dln, m->residual3 + (L - 1) * sC,
                          m->p[LNFW], m->lnf_mean, m->lnf_rstd, BT, C);
    grads_final(m, LNFW, L - 1);

    // dresidual carries the gradient of the residual stream down the layers:
    // a residual add passes it through unchanged to both of its inputs, so
    // it is both d(fcproj) and, after the MLP branch adds in, d(residual2).
    for (int l = L - 1; l >= 0; l--) {
        const float *residual = l == 0 ? m->encoded : m->residual3 + (l - 1) * sC;
        size_t lC = (size_t)l * C;
        const float *ln1 = m->ln1 + l * sC, *qkv = m->qkv + l * 3 * sC, *atty = m->atty + l * sC;
        const float *res2 = m->residual2 + l * sC, *ln2 = m->ln2 + l * sC;
        const float *fch = m->fch + l * 4 * sC, *fchg = m->fch_gelu + l * 4 * sC;

        memset(m->dfch_gelu, 0, sizeof(float) * 4 * sC);
        dt_linear_backward(m->dfch_gelu, m->g[FCPROJW] + lC * 4 * C, m->g[FCPROJB] + lC, m->dresidual,
                           fchg, m->p[FCPROJW] + lC * 4 * C, BT, 4 * C, C);
        grads_final(m, FCPROJW, l);
        memset(m->dfch, 0, sizeof(float) * 4 * sC);
        dt_gelu_backward(m->dfch, m->dfch_gelu, fch, 4 * sC);
        memset(m->dln, 0, sizeof(float) * sC);
        dt_linear_backward(m->dln, m->g[FCW] + lC * 4 * C, m->g[FCB] + 4 * lC, m->dfch, ln2,
                           m->p[FCW] + lC * 4 * C, BT, C, 4 * C);
        grads_final(m, FCW, l);
        dt_layernorm_backward(m->dresidual, m->g[LN2W] + lC, m->g[LN2B] + lC, m->dln, res2,
                              m->p[LN2W] + lC, m->ln2_mean + l * s1, m->ln2_rstd + l * s1, BT, C);
        grads_final(m, LN2W, l);

        memset(m->datty, 0, sizeof(float) * sC);
        dt_linear_backward(m->datty, m->g[ATTPROJW] + lC * C, m->g[ATTPROJB] + lC, m->dresidual, atty,
                           m->p[ATTPROJW] + lC * C, BT, C, C);
        grads_final(m, ATTPROJW, l);
        memset(m->dqkv, 0, sizeof(float) * 3 * sC);
        dt_attention_backward(m->dqkv, m->datt, m->datty, qkv, m->att + l * satt, B, T, C, NH);
        memset(m->dln, 0, sizeof(float) * sC);
        dt_linear_backward(m->dln, m->g[QKVW] + lC * 3 * C, m->g[QKVB] + 3 * lC, m->dqkv, ln1,
                           m->p[QKVW] + lC * 3 * C, BT, C, 3 * C);
        grads_final(m, QKVW, l);
        dt_layernorm_backward(m->dresidual, m->g[LN1W] + lC, m->g[LN1B] + lC, m->dln, residual,
                              m->p[LN1W] + lC, m->ln1_mean + l * s1, m->ln1_rstd + l * s1, BT, C);
        grads_final(m, LN1W, l);
    }
    dt_encoder_backward(m->g[WTE], m->g[WPE], m->dresidual, m->inputs, B, T, C);
    if (m->hook) m->hook(0, m->hook_user);
    m->have_targets = 0;  // the logits are gone: a second backward would be wrong
    return DT_OK;
}
