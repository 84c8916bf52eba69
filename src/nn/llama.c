/* The Llama-style decoder (dtrain/llama.h): one parameter block in the
 * order the header lists, one block of saved activations for B x T tokens,
 * forward and backward layer by layer with the kernels of llama_layers.c
 * and layers.c, the grad and layer hooks the GPT has (nn/gpt.c). */
#include "dtrain/llama.h"
#include "nn/nn_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPT DT_LLAMA_NTENSORS
#define NPL 9  // per-layer tensors

enum { EMB, ATTN_NORM, WQ, WK, WV, WO, MLP_NORM, W_GATE, W_UP, W_DOWN, NORM, HEAD };

static const char *const names[NPT] = {"tok_embeddings", "attn_norm", "wq", "wk", "wv", "wo",
                                       "mlp_norm", "w_gate", "w_up", "w_down", "norm", "lm_head"};

// One layer's saved activations ([BT, ...] each) and the stream before it.
typedef struct {
    float *x, *xn1, *rstd1, *q, *k, *v, *att, *y, *x2, *xn2, *rstd2, *gate, *up, *h;
} layer_acts;

struct dt_llama {
    dt_llama_config c;
    size_t nparams;
    dt_tensor_info t[NPT];
    float *params, *grads, *p[NPT], *g[NPT];
    dt_grad_range *ord;      // the gradient order
    int maxB, maxT, B, T, have_targets;
    float *acts;             // the one allocation below point into
    layer_acts *la;          // [L]
    float *xL, *xnf, *rstdf, *logits, *probs;  // the stream after the last layer, the head's
    int32_t *inputs, *targets;
    float *d0, *d1, *dF0, *dF1, *dF2, *datt, *dq, *dk, *dv;  // backward scratch
    float loss_scale;
    dt_grad_ready_fn hook;
    void *hook_user;
    dt_llama_layer_fn layer_hook;
    void *layer_user;
};

// ----------------------------------------------------------------------------
// configuration

dt_status dt_llama_preset(const char *name, dt_llama_config *c) {
    static const struct { const char *name; dt_llama_config c; } p[] = {
        {"llama-tiny", {2, 4, 2, 64, 176, 128, 256, 10000.0f, 1e-5f}},
        {"llama-small", {6, 8, 4, 256, 704, 256, 256, 10000.0f, 1e-5f}},
        {"llama2-7b", {32, 32, 32, 4096, 11008, 4096, 32000, 10000.0f, 1e-5f}},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (!strcmp(name, p[i].name)) {
            *c = p[i].c;
            return DT_OK;
        }
    return dt_error(DT_ERR_ARG, "llama preset '%s': expected llama-tiny, llama-small or llama2-7b", name);
}

dt_status dt_llama_config_check(const dt_llama_config *c, const char *what) {
    const int v[] = {c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->ffn_hidden, c->block_size, c->vocab_size};
    const char *n[] = {"n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "block_size", "vocab_size"};
    for (int i = 0; i < 7; i++)
        if (v[i] < 1) return dt_error(DT_ERR_ARG, "%s: %s = %d: expected >= 1", what, n[i], v[i]);
    if (c->n_embd % c->n_head || (c->n_embd / c->n_head) % 2)
        return dt_error(DT_ERR_ARG, "%s: n_embd = %d, n_head = %d: expected the head size n_embd / n_head to be a whole even number",
                        what, c->n_embd, c->n_head);
    if (c->n_head % c->n_kv_head)
        return dt_error(DT_ERR_ARG, "%s: n_kv_head = %d does not divide n_head = %d (grouped-query attention shares each "
                        "key/value head among n_head / n_kv_head query heads)", what, c->n_kv_head, c->n_head);
    if (!(c->rope_theta >= 1.0f && c->rope_theta <= 1e9f))
        return dt_error(DT_ERR_ARG, "%s: rope_theta = %g: expected 1 <= rope_theta <= 1e9", what, c->rope_theta);
    if (!(c->norm_eps > 0.0f && c->norm_eps <= 0.1f))
        return dt_error(DT_ERR_ARG, "%s: norm_eps = %g: expected 0 < norm_eps <= 0.1", what, c->norm_eps);
    return DT_OK;
}

void dt_llama_param_shapes(const dt_llama_config *c, dt_tensor_info t[NPT]) {
    int64_t L = c->n_layer, C = c->n_embd, V = c->vocab_size, F = c->ffn_hidden;
    int64_t KC = (int64_t)c->n_kv_head * (C / c->n_head);
    const int64_t sh[NPT][3] = {{V, C}, {L, C}, {L, C, C}, {L, KC, C}, {L, KC, C}, {L, C, C},
                                {L, C}, {L, F, C}, {L, F, C}, {L, C, F}, {C}, {V, C}};
    size_t off = 0;
    for (int i = 0; i < NPT; i++) {
        t[i].name = names[i];
        t[i].ndim = i == NORM ? 1 : i == EMB || i == HEAD || i == ATTN_NORM || i == MLP_NORM ? 2 : 3;
        t[i].numel = 1;
        for (int d = 0; d < 4; d++) t[i].shape[d] = d < t[i].ndim ? sh[i][d] : 0;
        for (int d = 0; d < t[i].ndim; d++) t[i].numel *= (size_t)sh[i][d];
        t[i].offset = off;
        off += t[i].numel;
    }
}

size_t dt_llama_config_num_params(const dt_llama_config *c) {
    dt_tensor_info t[NPT];
    dt_llama_param_shapes(c, t);
    return t[NPT - 1].offset + t[NPT - 1].numel;
}

// ----------------------------------------------------------------------------
// create / free

// Floats of the saved activations and the scratch for B x T tokens; with
// base, points the views into it.
static size_t acts_layout(dt_llama *m, float *base) {
    size_t L = m->c.n_layer, BT = (size_t)m->maxB * m->maxT, C = m->c.n_embd, F = m->c.ffn_hidden;
    size_t KC = (size_t)m->c.n_kv_head * (C / m->c.n_head), V = m->c.vocab_size;
    size_t att = BT * m->c.n_head * m->maxT, at = 0;
#define TAKE(p, n) do { if (base) (p) = base + at; at += ((n) + 15) / 16 * 16; } while (0)
    for (size_t l = 0; l < L; l++) {
        layer_acts *a = base ? &m->la[l] : &(layer_acts){0};
        TAKE(a->x, BT * C); TAKE(a->xn1, BT * C); TAKE(a->rstd1, BT); TAKE(a->q, BT * C); TAKE(a->k, BT * KC);
        TAKE(a->v, BT * KC); TAKE(a->att, att); TAKE(a->y, BT * C); TAKE(a->x2, BT * C); TAKE(a->xn2, BT * C);
        TAKE(a->rstd2, BT); TAKE(a->gate, BT * F); TAKE(a->up, BT * F); TAKE(a->h, BT * F);
    }
    TAKE(m->xL, BT * C); TAKE(m->xnf, BT * C); TAKE(m->rstdf, BT); TAKE(m->logits, BT * V); TAKE(m->probs, BT * V);
    float *ip = NULL, *tp = NULL;
    TAKE(ip, BT); TAKE(tp, BT);
    m->inputs = (int32_t *)ip;
    m->targets = (int32_t *)tp;
    TAKE(m->d0, BT * C); TAKE(m->d1, BT * C); TAKE(m->dF0, BT * F); TAKE(m->dF1, BT * F); TAKE(m->dF2, BT * F);
    TAKE(m->datt, att); TAKE(m->dq, BT * C); TAKE(m->dk, BT * KC); TAKE(m->dv, BT * KC);
#undef TAKE
    return at;
}

size_t dt_llama_activation_bytes(const dt_llama_config *c, int B, int T) {
    dt_llama m = {.c = *c, .maxB = B, .maxT = T};
    return sizeof(float) * acts_layout(&m, NULL);
}

void dt_llama_free(dt_llama *m) {
    if (!m) return;
    dt_free(m->params);
    dt_free(m->grads);
    dt_free(m->acts);
    free(m->la);
    free(m->ord);
    free(m);
}

static void make_order(dt_llama *m) {
    int L = m->c.n_layer, n = 0;
    m->ord[n++] = (dt_grad_range){m->t[EMB].offset, m->t[EMB].numel};
    for (int l = 0; l < L; l++)
        for (int i = ATTN_NORM; i <= W_DOWN; i++) {
            size_t len = m->t[i].numel / (size_t)L;
            m->ord[n++] = (dt_grad_range){m->t[i].offset + (size_t)l * len, len};
        }
    for (int i = NORM; i <= HEAD; i++) m->ord[n++] = (dt_grad_range){m->t[i].offset, m->t[i].numel};
}

dt_status dt_llama_create(dt_llama **out, const dt_llama_config *c, int B, int T) {
    *out = NULL;
    dt_status st = dt_llama_config_check(c, "llama");
    if (st != DT_OK) return st;
    if (B < 0 || T < 0 || T > c->block_size || (B == 0) != (T == 0))
        return dt_error(DT_ERR_ARG, "llama: batch %d x context %d: expected B >= 1 and 1 <= T <= block_size (%d), or both 0",
                        B, T, c->block_size);
    dt_llama *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "llama: out of memory");
    m->c = *c;
    m->maxB = m->B = B;
    m->maxT = m->T = T;
    m->loss_scale = 1.0f;
    dt_llama_param_shapes(c, m->t);
    m->nparams = dt_llama_config_num_params(c);
    m->params = dt_alloc(sizeof(float) * m->nparams);
    m->grads = dt_alloc(sizeof(float) * m->nparams);
    m->ord = malloc(sizeof(dt_grad_range) * (NPL * (size_t)c->n_layer + 3));
    m->la = calloc((size_t)c->n_layer, sizeof *m->la);
    size_t na = B ? acts_layout(m, NULL) : 0;
    m->acts = na ? dt_alloc(sizeof(float) * na) : NULL;
    if (!m->params || !m->grads || !m->ord || !m->la || (na && !m->acts)) {
        dt_llama_free(m);
        return dt_error(DT_ERR_NOMEM, "llama: out of memory (%zu MiB of parameters and gradients, %zu MiB of activations)",
                        m->nparams * 8 >> 20, na * 4 >> 20);
    }
    if (na) acts_layout(m, m->acts);
    memset(m->params, 0, sizeof(float) * m->nparams);
    memset(m->grads, 0, sizeof(float) * m->nparams);
    for (int i = 0; i < NPT; i++) {
        m->p[i] = m->params + m->t[i].offset;
        m->g[i] = m->grads + m->t[i].offset;
    }
    make_order(m);
    *out = m;
    return DT_OK;
}

const dt_llama_config *dt_llama_get_config(const dt_llama *m) { return &m->c; }
size_t dt_llama_num_params(const dt_llama *m) { return m->nparams; }
float *dt_llama_params(dt_llama *m) { return m->params; }
float *dt_llama_grads(dt_llama *m) { return m->grads; }
void dt_llama_zero_grad(dt_llama *m) { memset(m->grads, 0, sizeof(float) * m->nparams); }
const dt_tensor_info *dt_llama_tensor(const dt_llama *m, int i) { return i >= 0 && i < NPT ? &m->t[i] : NULL; }
const float *dt_llama_logits(const dt_llama *m) { return m->logits; }
void dt_llama_set_loss_scale(dt_llama *m, float s) { m->loss_scale = s; }
const dt_grad_range *dt_llama_grad_order(const dt_llama *m, int *n) {
    *n = NPL * m->c.n_layer + 3;
    return m->ord;
}
void dt_llama_set_grad_hook(dt_llama *m, dt_grad_ready_fn fn, void *user) {
    m->hook = fn;
    m->hook_user = user;
}
void dt_llama_set_layer_hook(dt_llama *m, dt_llama_layer_fn fn, void *user) {
    m->layer_hook = fn;
    m->layer_user = user;
}

// ----------------------------------------------------------------------------
// initialisation

dt_status dt_llama_init(dt_llama *m, uint64_t seed) { return dt_llama_init_range(m, seed, 0, SIZE_MAX); }

// Every value of the block drawn in order from one stream; those in [lo, hi) kept.
dt_status dt_llama_init_range(dt_llama *m, uint64_t seed, size_t lo, size_t hi) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    float resid = 0.02f / sqrtf(2.0f * m->c.n_layer);
    for (int i = 0; i < NPT; i++) {
        const dt_tensor_info *t = &m->t[i];
        int one = i == ATTN_NORM || i == MLP_NORM || i == NORM;
        float sd = i == WO || i == W_DOWN ? resid : 0.02f;
        for (size_t j = 0; j < t->numel; j++) {
            float v = one ? 1.0f : sd * dt_rng_normal(&r);
            size_t e = t->offset + j;
            if (e >= lo && e < hi) m->params[e] = v;
        }
        dt_alive();
    }
    return DT_OK;
}

// ----------------------------------------------------------------------------
// forward

typedef struct {
    float *an, *wq, *wk, *wv, *wo, *mn, *wg, *wu, *wd;
} layer_params;

static layer_params layer_params_of(float *const t[NPT], const dt_tensor_info *ti, int l, int L) {
    float *v[NPL];
    for (int i = 0; i < NPL; i++) v[i] = t[ATTN_NORM + i] + (size_t)l * (ti[ATTN_NORM + i].numel / (size_t)L);
    return (layer_params){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
}

static dt_status hook(dt_llama *m, int layer, int phase) {
    return m->layer_hook ? m->layer_hook(layer, phase, m->layer_user) : DT_OK;
}

// out = x2 + down(swiglu(gate(n2), up(n2))), x2 = x + wo(gqa(rope(q), rope(k), v)).
static void layer_forward(dt_llama *m, int l, float *out) {
    const dt_llama_config *c = &m->c;
    int B = m->B, T = m->T, BT = B * T, C = c->n_embd, F = c->ffn_hidden, hs = C / c->n_head;
    int KC = c->n_kv_head * hs;
    layer_acts *a = &m->la[l];
    layer_params p = layer_params_of(m->p, m->t, l, c->n_layer);
    dt_rmsnorm_forward(a->xn1, a->rstd1, a->x, p.an, BT, C, c->norm_eps);
    dt_linear_forward(a->q, a->xn1, p.wq, NULL, BT, C, C);
    dt_linear_forward(a->k, a->xn1, p.wk, NULL, BT, C, KC);
    dt_linear_forward(a->v, a->xn1, p.wv, NULL, BT, C, KC);
    dt_rope(a->q, B, T, c->n_head, hs, c->rope_theta, 1);
    dt_rope(a->k, B, T, c->n_kv_head, hs, c->rope_theta, 1);
    dt_gqa_forward(a->y, a->att, a->q, a->k, a->v, B, T, c->n_head, c->n_kv_head, hs);
    dt_linear_forward(a->x2, a->y, p.wo, NULL, BT, C, C);
    for (size_t i = 0; i < (size_t)BT * C; i++) a->x2[i] += a->x[i];
    dt_rmsnorm_forward(a->xn2, a->rstd2, a->x2, p.mn, BT, C, c->norm_eps);
    dt_linear_forward(a->gate, a->xn2, p.wg, NULL, BT, C, F);
    dt_linear_forward(a->up, a->xn2, p.wu, NULL, BT, C, F);
    dt_swiglu_forward(a->h, a->gate, a->up, (size_t)BT * F);
    dt_linear_forward(out, a->h, p.wd, NULL, BT, F, C);
    for (size_t i = 0; i < (size_t)BT * C; i++) out[i] += a->x2[i];
}

static dt_status check_tokens(const int32_t *tok, int n, int V, const char *what) {
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return dt_error(DT_ERR_ARG, "llama forward: %s token %d at position %d is outside the vocabulary [0, %d)",
                            what, tok[i], i, V);
    return DT_OK;
}

static void embed(dt_llama *m, float *out) {
    int C = m->c.n_embd, BT = m->B * m->T;
    for (int i = 0; i < BT; i++)
        memcpy(out + (size_t)i * C, m->p[EMB] + (size_t)m->inputs[i] * C, sizeof(float) * C);
}

static dt_status head_forward(dt_llama *m, const int32_t *targets, float *loss) {
    int BT = m->B * m->T, C = m->c.n_embd, V = m->c.vocab_size;
    dt_rmsnorm_forward(m->xnf, m->rstdf, m->xL, m->p[NORM], BT, C, m->c.norm_eps);
    dt_linear_forward(m->logits, m->xnf, m->p[HEAD], NULL, BT, C, V);
    if (!targets) return DT_OK;
    memcpy(m->targets, targets, sizeof(int32_t) * BT);
    float l = dt_crossentropy_forward(m->probs, m->logits, targets, BT, V);
    if (!isfinite(l)) return dt_error(DT_ERR_NUMERIC, "llama forward: loss is %g", l);
    m->have_targets = 1;
    if (loss) *loss = l;
    return DT_OK;
}

dt_status dt_llama_forward(dt_llama *m, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss) {
    int L = m->c.n_layer, V = m->c.vocab_size;
    if (B < 1 || B > m->maxB || T < 1 || T > m->maxT)
        return dt_error(DT_ERR_ARG, "llama forward: batch %d x context %d exceeds the %d x %d the model was built for",
                        B, T, m->maxB, m->maxT);
    m->have_targets = 0;
    m->B = B;
    m->T = T;
    dt_status st = check_tokens(inputs, B * T, V, "input");
    if (st == DT_OK && targets) st = check_tokens(targets, B * T, V, "target");
    if (st == DT_OK) st = hook(m, -1, 0);
    if (st != DT_OK) return st;
    // (the layer views were laid out for maxB x maxT: at a smaller shape
    // each buffer's prefix is used)
    memcpy(m->inputs, inputs, sizeof(int32_t) * B * T);
    embed(m, m->la[0].x);
    for (int l = 0; l < L; l++) {
        if ((st = hook(m, l, 0)) != DT_OK) return st;
        layer_forward(m, l, l + 1 < L ? m->la[l + 1].x : m->xL);
    }
    if ((st = hook(m, L, 0)) != DT_OK) return st;
    return head_forward(m, targets, loss);
}

// ----------------------------------------------------------------------------
// backward

// The gradient order's position after which all is final once layer l's
// tensor k (ATTN_NORM..W_DOWN) and those after it in the layer are done
// (k = NORM: every layer's, l ignored).
static void grads_final(dt_llama *m, int k, int l) {
    if (!m->hook) return;
    size_t L = m->c.n_layer, pos = m->t[EMB].numel;
    for (int i = ATTN_NORM; i <= W_DOWN; i++)
        pos += (k == NORM ? L : (size_t)(i < k ? l + 1 : l)) * (m->t[i].numel / L);
    m->hook(pos, m->hook_user);
}

static void layer_backward(dt_llama *m, int l, float *dx) {
    const dt_llama_config *c = &m->c;
    int B = m->B, T = m->T, BT = B * T, C = c->n_embd, F = c->ffn_hidden, hs = C / c->n_head;
    int KC = c->n_kv_head * hs;
    size_t sC = (size_t)BT * C, sF = (size_t)BT * F, sK = (size_t)BT * KC;
    layer_acts *a = &m->la[l];
    layer_params p = layer_params_of(m->p, m->t, l, c->n_layer), g = layer_params_of(m->g, m->t, l, c->n_layer);
    // dx holds d(out); the residual passes it to x2 unchanged.
    memset(m->dF0, 0, sizeof(float) * sF);
    dt_linear_backward(m->dF0, g.wd, NULL, dx, a->h, p.wd, BT, F, C);
    grads_final(m, W_DOWN, l);
    memset(m->dF1, 0, sizeof(float) * sF);
    memset(m->dF2, 0, sizeof(float) * sF);
    dt_swiglu_backward(m->dF1, m->dF2, m->dF0, a->gate, a->up, sF);
    memset(m->d0, 0, sizeof(float) * sC);
    dt_linear_backward(m->d0, g.wg, NULL, m->dF1, a->xn2, p.wg, BT, C, F);
    dt_linear_backward(m->d0, g.wu, NULL, m->dF2, a->xn2, p.wu, BT, C, F);
    grads_final(m, W_GATE, l);
    dt_rmsnorm_backward(dx, g.mn, m->d0, a->x2, p.mn, a->rstd2, BT, C);
    grads_final(m, MLP_NORM, l);
    // dx now holds d(x2); the residual passes it to x.
    memset(m->d1, 0, sizeof(float) * sC);
    dt_linear_backward(m->d1, g.wo, NULL, dx, a->y, p.wo, BT, C, C);
    grads_final(m, WO, l);
    memset(m->dq, 0, sizeof(float) * sC);
    memset(m->dk, 0, sizeof(float) * sK);
    memset(m->dv, 0, sizeof(float) * sK);
    dt_gqa_backward(m->dq, m->dk, m->dv, m->datt, m->d1, a->q, a->k, a->v, a->att, B, T, c->n_head, c->n_kv_head, hs);
    dt_rope(m->dq, B, T, c->n_head, hs, c->rope_theta, -1);
    dt_rope(m->dk, B, T, c->n_kv_head, hs, c->rope_theta, -1);
    memset(m->d0, 0, sizeof(float) * sC);
    dt_linear_backward(m->d0, g.wq, NULL, m->dq, a->xn1, p.wq, BT, C, C);
    dt_linear_backward(m->d0, g.wk, NULL, m->dk, a->xn1, p.wk, BT, C, KC);
    dt_linear_backward(m->d0, g.wv, NULL, m->dv, a->xn1, p.wv, BT, C, KC);
    grads_final(m, WQ, l);
    dt_rmsnorm_backward(dx, g.an, m->d0, a->x, p.an, a->rstd1, BT, C);
    grads_final(m, ATTN_NORM, l);
}

// The head's backward into dx [BT, C] (written; it may be xnf, read before).
static void head_backward(dt_llama *m, float *dx) {
    int BT = m->B * m->T, C = m->c.n_embd, V = m->c.vocab_size;
    float *dlogits = m->logits;  // (the logits are not needed again)
    memset(dlogits, 0, sizeof(float) * BT * V);
    dt_crossentropy_backward(dlogits, m->probs, m->targets, BT, V, m->loss_scale);
    memset(m->d0, 0, sizeof(float) * BT * C);
    dt_linear_backward(m->d0, m->g[HEAD], NULL, dlogits, m->xnf, m->p[HEAD], BT, C, V);
    memset(dx, 0, sizeof(float) * BT * C);
    dt_rmsnorm_backward(dx, m->g[NORM], m->d0, m->xL, m->p[NORM], m->rstdf, BT, C);
    grads_final(m, NORM, 0);
}

dt_status dt_llama_backward(dt_llama *m) {
    int L = m->c.n_layer, C = m->c.n_embd, BT = m->B * m->T;
    if (!m->have_targets)
        return dt_error(DT_ERR_ARG, "llama backward: the last forward had no targets (or was already backpropagated)");
    m->have_targets = 0;
    dt_status st = hook(m, L, 1);
    if (st != DT_OK) return st;
    // The stream's gradient goes down in xnf, free once the head's weight
    // gradient has read it.
    float *d = m->xnf;
    head_backward(m, d);
    for (int l = L - 1; l >= 0; l--) {
        if ((st = hook(m, l, 1)) != DT_OK) return st;
        layer_backward(m, l, d);
    }
    if ((st = hook(m, -1, 1)) != DT_OK) return st;
    for (int i = 0; i < BT; i++) {
        float *e = m->g[EMB] + (size_t)m->inputs[i] * C;
        for (int j = 0; j < C; j++) e[j] += d[(size_t)i * C + j];
    }
    if (m->hook) m->hook(0, m->hook_user);
    return DT_OK;
}
