/* The Llama model's forward and backward (dtrain/llama.h): activation sets
 * for a micro-batch through a range of layers, the stages (embedding,
 * blocks, head) with their backward twins on the residual stream, and the
 * whole-model calls over the model's own set. A tensor-parallel shard
 * sums the partial products of wo and w_down forward and the partial input
 * gradients of its column-parallel linears backward (m->reduce). */
#include "nn/llama_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// One layer's saved activations, [B*T, ...] at the set's current shape
// (a shard's q, k, v, att, y, gate, up, h are its heads' and units').
typedef struct {
    float *xn1, *rstd1, *q, *k, *v, *att, *y, *x2, *xn2, *rstd2, *gate, *up, *h;
} layer_acts;

struct dt_llama_acts {
    dt_llama_config c;
    int l0, l1, maxB, maxT, B, T, ntp;
    float *resid;            // [l1 - l0 + 1, maxB maxT, C]
    layer_acts *la;          // [l1 - l0]
    float *xnf, *rstdf, *logits, *probs;  // the head's (l1 = L)
    int32_t *inputs, *targets;            // the embedding's (l0 = 0), the head's
    float *block;
    unsigned char *saved;    // [l1 - l0]: ran forward since set_shape
    int have_inputs, have_targets;
};

// ----------------------------------------------------------------------------
// activation sets

// Floats of a set's parts; with base, points them into it.
static size_t acts_layout(dt_llama_acts *a, float *base) {
    llama_dims d = llama_dims_of(&a->c, a->ntp);
    size_t BT = (size_t)a->maxB * a->maxT, C = d.C, at = 0, att = BT * d.NHl * a->maxT;
    size_t head = a->l1 == a->c.n_layer, V = head ? (size_t)d.V : 0, emb = a->l0 == 0;
#define TAKE(p, n) do { if (base) (p) = base + at; at += ((n) + 15) / 16 * 16; } while (0)
    TAKE(a->resid, (size_t)(a->l1 - a->l0 + 1) * BT * C);
    for (int l = 0; l < a->l1 - a->l0; l++) {
        layer_acts *s = base ? &a->la[l] : &(layer_acts){0};
        TAKE(s->xn1, BT * C); TAKE(s->rstd1, BT); TAKE(s->q, BT * d.Cl); TAKE(s->k, BT * d.KCl);
        TAKE(s->v, BT * d.KCl); TAKE(s->att, att); TAKE(s->y, BT * d.Cl); TAKE(s->x2, BT * C);
        TAKE(s->xn2, BT * C); TAKE(s->rstd2, BT); TAKE(s->gate, BT * d.Fl); TAKE(s->up, BT * d.Fl);
        TAKE(s->h, BT * d.Fl);
    }
    TAKE(a->xnf, head * BT * C); TAKE(a->rstdf, head * BT); TAKE(a->logits, BT * V); TAKE(a->probs, BT * V);
    float *ip = NULL, *tp = NULL;
    TAKE(ip, emb * BT); TAKE(tp, head * BT);
#undef TAKE
    if (base) {
        a->inputs = emb ? (int32_t *)ip : NULL;
        a->targets = head ? (int32_t *)tp : NULL;
    }
    return at;
}

void dt_llama_acts_free(dt_llama_acts *a) {
    if (!a) return;
    dt_free(a->block);
    free(a->la);
    free(a->saved);
    free(a);
}

dt_status dt_llama_acts_create(dt_llama_acts **out, const dt_llama_config *c, int B, int T, int l0, int l1, int ntp) {
    *out = NULL;
    dt_status st = dt_llama_config_check(c, "llama activations");
    if (st == DT_OK) st = dt_llama_tensor_parallel_check(c, ntp, "llama activations");
    if (st != DT_OK) return st;
    if (B < 1 || T < 1 || T > c->block_size)
        return dt_error(DT_ERR_ARG, "llama: batch %d x context %d: expected B >= 1 and 1 <= T <= block_size (%d)", B, T,
                        c->block_size);
    if (l0 < 0 || l0 > l1 || l1 > c->n_layer)
        return dt_error(DT_ERR_ARG, "llama activations: layers [%d, %d): expected 0 <= l0 <= l1 <= n_layer (%d)", l0, l1,
                        c->n_layer);
    dt_llama_acts *a = calloc(1, sizeof *a);
    if (!a) return dt_error(DT_ERR_NOMEM, "llama activations: out of memory");
    *a = (dt_llama_acts){.c = *c, .l0 = l0, .l1 = l1, .maxB = B, .maxT = T, .B = B, .T = T, .ntp = ntp};
    size_t n = acts_layout(a, NULL);
    a->la = calloc((size_t)(l1 - l0) + 1, sizeof *a->la);
    a->saved = calloc((size_t)(l1 - l0) + 1, 1);
    a->block = dt_alloc(sizeof(float) * n);
    if (!a->la || !a->saved || !a->block) {
        dt_llama_acts_free(a);
        return dt_error(DT_ERR_NOMEM, "llama activations: out of memory (%zu MiB for layers [%d, %d) at B=%d T=%d)",
                        n * 4 >> 20, l0, l1, B, T);
    }
    acts_layout(a, a->block);
    *out = a;
    return DT_OK;
}

size_t dt_llama_activation_bytes(const dt_llama_config *c, int B, int T) {
    dt_llama_acts a = {.c = *c, .l0 = 0, .l1 = c->n_layer, .maxB = B, .maxT = T, .ntp = 1};
    llama_dims d = llama_dims_of(c, 1);
    size_t BT = (size_t)B * T, scratch = 2 * BT * d.C + 3 * BT * d.Fl + BT * d.NHl * T + BT * d.Cl + 2 * BT * d.KCl;
    return sizeof(float) * (acts_layout(&a, NULL) + scratch);
}

dt_llama_acts *dt_llama_default_acts(dt_llama *m) { return m->acts; }
const float *dt_llama_acts_logits(const dt_llama_acts *a) { return a->logits; }
const float *dt_llama_logits(const dt_llama *m) { return m->acts ? m->acts->logits : NULL; }

dt_status dt_llama_acts_set_shape(dt_llama_acts *a, int B, int T) {
    if (B < 1 || B > a->maxB || T < 1 || T > a->maxT)
        return dt_error(DT_ERR_ARG, "llama forward: batch %d x context %d exceeds the %d x %d the activations were built for",
                        B, T, a->maxB, a->maxT);
    a->B = B;
    a->T = T;
    memset(a->saved, 0, (size_t)(a->l1 - a->l0));
    a->have_inputs = a->have_targets = 0;
    return DT_OK;
}

float *dt_llama_acts_resid(dt_llama_acts *a, int l) {
    if (l < a->l0 || l > a->l1) return NULL;
    return a->resid + (size_t)(l - a->l0) * a->maxB * a->maxT * a->c.n_embd;
}

// ----------------------------------------------------------------------------
// scratch, checks, hooks, sums

void dt_llama_free_scratch(dt_llama *m) {
    dt_free(m->scratch);
    m->scratch = NULL;
    m->scratch_bt = m->scratch_att = 0;
}

dt_status dt_llama_reserve_scratch(dt_llama *m, int B, int T) {
    llama_dims d = llama_dims_of(&m->c, m->ntp);
    size_t BT = (size_t)B * T, att = BT * d.NHl * T;
    if (BT <= m->scratch_bt && att <= m->scratch_att) return DT_OK;
    BT = BT > m->scratch_bt ? BT : m->scratch_bt;
    att = att > m->scratch_att ? att : m->scratch_att;
    dt_llama_free_scratch(m);
    size_t n[9] = {BT * d.C, BT * d.C, BT * d.Fl, BT * d.Fl, BT * d.Fl, att, BT * d.Cl, BT * d.KCl, BT * d.KCl}, all = 0;
    for (int i = 0; i < 9; i++) all += n[i];
    if (!(m->scratch = dt_alloc(sizeof(float) * all)))
        return dt_error(DT_ERR_NOMEM, "llama backward: out of memory for the scratch of %zu tokens", BT);
    float **p[9] = {&m->d0, &m->d1, &m->dF0, &m->dF1, &m->dF2, &m->datt, &m->dq, &m->dk, &m->dv}, *at = m->scratch;
    for (int i = 0; i < 9; i++) *p[i] = at, at += n[i];
    m->scratch_bt = BT;
    m->scratch_att = att;
    return DT_OK;
}

enum { EMBED_PART, LAYERS_PART, HEAD_PART };
static dt_status check_stage(const dt_llama *m, const dt_llama_acts *a, int part, int l0, int l1, const char *what) {
    if (memcmp(&a->c, &m->c, sizeof m->c) || a->ntp != m->ntp)
        return dt_error(DT_ERR_ARG, "%s: the activations were made for another model config or shard count", what);
    if (part == EMBED_PART && a->l0 != 0)
        return dt_error(DT_ERR_ARG, "%s: the activations hold layers [%d, %d), without the embedding", what, a->l0, a->l1);
    if (part == HEAD_PART && a->l1 != m->c.n_layer)
        return dt_error(DT_ERR_ARG, "%s: the activations hold layers [%d, %d), without the head", what, a->l0, a->l1);
    if (part == LAYERS_PART && (l0 >= l1 || l0 < a->l0 || l1 > a->l1))
        return dt_error(DT_ERR_ARG, "%s: layers [%d, %d): expected a non-empty range within the activations' [%d, %d)",
                        what, l0, l1, a->l0, a->l1);
    return DT_OK;
}

static dt_status hook(dt_llama *m, int layer, int phase) {
    return m->layer_hook ? m->layer_hook(layer, phase, m->layer_user) : DT_OK;
}

// The shards' partial sums buf[n] summed in place (nothing for a whole model).
static dt_status tp_sum(dt_llama *m, float *buf, size_t n) {
    if (m->ntp == 1) return DT_OK;
    if (!m->reduce)
        return dt_error(DT_ERR_ARG, "llama: tensor-parallel shard %d of %d has no reduce function (dt_llama_set_reduce)",
                        m->tp, m->ntp);
    return m->reduce(buf, n, m->reduce_user);
}

static dt_status check_tokens(const int32_t *tok, int n, int V, const char *what) {
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return dt_error(DT_ERR_ARG, "llama forward: %s token %d at position %d is outside the vocabulary [0, %d)",
                            what, tok[i], i, V);
    return DT_OK;
}

typedef struct {
    float *an, *wq, *wk, *wv, *wo, *mn, *wg, *wu, *wd;
} layer_params;

static layer_params layer_params_of(float *const t[NPT], const dt_tensor_info *ti, int l, int L) {
    float *v[NPL];
    for (int i = 0; i < NPL; i++) v[i] = t[ATTN_NORM + i] + (size_t)l * (ti[ATTN_NORM + i].numel / (size_t)L);
    return (layer_params){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
}

// ----------------------------------------------------------------------------
// forward

dt_status dt_llama_embed_forward(dt_llama *m, dt_llama_acts *a, const int32_t *inputs, float *resid_out) {
    int BT = a->B * a->T, C = m->c.n_embd;
    dt_status st = check_stage(m, a, EMBED_PART, 0, 0, "llama embed forward");
    if (st == DT_OK) st = check_tokens(inputs, BT, m->c.vocab_size, "input");
    if (st == DT_OK) st = hook(m, -1, 0);
    if (st != DT_OK) return st;
    memcpy(a->inputs, inputs, sizeof(int32_t) * BT);
    for (int i = 0; i < BT; i++) memcpy(resid_out + (size_t)i * C, m->p[EMB] + (size_t)inputs[i] * C, sizeof(float) * C);
    a->have_inputs = 1;
    return DT_OK;
}

static void add(float *out, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] += x[i];
}

// out = x2 + w_down(swiglu(w_gate n2, w_up n2)), x2 = x + wo(gqa(rope(wq n1), rope(wk n1), wv n1)).
static dt_status layer_forward(dt_llama *m, dt_llama_acts *a, int l, const float *x, float *out) {
    const dt_llama_config *c = &m->c;
    llama_dims d = llama_dims_of(c, m->ntp);
    int B = a->B, T = a->T, BT = B * T, C = d.C;
    layer_acts *s = &a->la[l - a->l0];
    layer_params p = layer_params_of(m->p, m->t, l, c->n_layer);
    dt_rmsnorm_forward(s->xn1, s->rstd1, x, p.an, BT, C, c->norm_eps);
    dt_linear_forward(s->q, s->xn1, p.wq, NULL, BT, C, d.Cl);
    dt_linear_forward(s->k, s->xn1, p.wk, NULL, BT, C, d.KCl);
    dt_linear_forward(s->v, s->xn1, p.wv, NULL, BT, C, d.KCl);
    dt_rope(s->q, B, T, d.NHl, d.hs, c->rope_theta, 1);
    dt_rope(s->k, B, T, d.KVl, d.hs, c->rope_theta, 1);
    dt_gqa_forward(s->y, s->att, s->q, s->k, s->v, B, T, d.NHl, d.KVl, d.hs);
    dt_linear_forward(s->x2, s->y, p.wo, NULL, BT, d.Cl, C);
    dt_status st = tp_sum(m, s->x2, (size_t)BT * C);
    if (st != DT_OK) return st;
    add(s->x2, x, (size_t)BT * C);
    dt_rmsnorm_forward(s->xn2, s->rstd2, s->x2, p.mn, BT, C, c->norm_eps);
    dt_linear_forward(s->gate, s->xn2, p.wg, NULL, BT, C, d.Fl);
    dt_linear_forward(s->up, s->xn2, p.wu, NULL, BT, C, d.Fl);
    dt_swiglu_forward(s->h, s->gate, s->up, (size_t)BT * d.Fl);
    dt_linear_forward(out, s->h, p.wd, NULL, BT, d.Fl, C);
    if ((st = tp_sum(m, out, (size_t)BT * C)) != DT_OK) return st;
    add(out, s->x2, (size_t)BT * C);
    return DT_OK;
}

dt_status dt_llama_forward_range(dt_llama *m, dt_llama_acts *a, int l0, int l1, const float *resid_in,
                                 float *resid_out) {
    dt_status st = check_stage(m, a, LAYERS_PART, l0, l1, "llama forward_range");
    if (st == DT_OK && resid_in == resid_out)
        st = dt_error(DT_ERR_ARG, "llama forward_range: resid_in and resid_out are the same buffer (backward needs the input)");
    for (int l = l0; st == DT_OK && l < l1; l++) {
        if ((st = hook(m, l, 0)) != DT_OK) break;
        st = layer_forward(m, a, l, l == l0 ? resid_in : dt_llama_acts_resid(a, l),
                           l == l1 - 1 ? resid_out : dt_llama_acts_resid(a, l + 1));
        if (st == DT_OK) a->saved[l - a->l0] = 1;
    }
    return st;
}

dt_status dt_llama_head_forward(dt_llama *m, dt_llama_acts *a, const float *resid_in, const int32_t *targets,
                                float *loss) {
    int BT = a->B * a->T, C = m->c.n_embd, V = m->c.vocab_size;
    dt_status st = check_stage(m, a, HEAD_PART, 0, 0, "llama head forward");
    if (st == DT_OK && targets) st = check_tokens(targets, BT, V, "target");
    if (st == DT_OK) st = hook(m, m->c.n_layer, 0);
    a->have_targets = 0;
    if (st != DT_OK) return st;
    dt_rmsnorm_forward(a->xnf, a->rstdf, resid_in, m->p[NORM], BT, C, m->c.norm_eps);
    dt_linear_forward(a->logits, a->xnf, m->p[HEAD], NULL, BT, C, V);
    if (!targets) return DT_OK;
    memcpy(a->targets, targets, sizeof(int32_t) * BT);
    float l = dt_crossentropy_forward(a->probs, a->logits, targets, BT, V);
    if (!isfinite(l)) return dt_error(DT_ERR_NUMERIC, "llama forward: loss is %g", l);
    a->have_targets = 1;
    if (loss) *loss = l;
    return DT_OK;
}

static dt_status no_default_acts(const char *what) {
    return dt_error(DT_ERR_ARG, "llama %s: the model was created without activations (B = T = 0): use a dt_llama_acts "
                    "and the stage calls", what);
}

dt_status dt_llama_forward(dt_llama *m, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss) {
    dt_llama_acts *a = m->acts;
    int L = m->c.n_layer;
    if (!a) return no_default_acts("forward");
    dt_status st = dt_llama_acts_set_shape(a, B, T);
    if (st == DT_OK) st = dt_llama_embed_forward(m, a, inputs, dt_llama_acts_resid(a, 0));
    if (st == DT_OK) st = dt_llama_forward_range(m, a, 0, L, dt_llama_acts_resid(a, 0), dt_llama_acts_resid(a, L));
    if (st == DT_OK) st = dt_llama_head_forward(m, a, dt_llama_acts_resid(a, L), targets, loss);
    return st;
}

// ----------------------------------------------------------------------------
// backward

// Tells the grad hook the order is final from where layer l's tensor k
// (ATTN_NORM..W_DOWN) and the ones after it in the layer begin (k = NORM:
// every layer's done, l ignored).
static void grads_final(dt_llama *m, int k, int l) {
    if (!m->hook) return;
    size_t L = m->c.n_layer, pos = m->t[EMB].numel;
    for (int i = ATTN_NORM; i <= W_DOWN; i++)
        pos += (k == NORM ? L : (size_t)(i < k ? l + 1 : l)) * (m->t[i].numel / L);
    m->hook(pos, m->hook_user);
}

// dx holds the gradient after the layer; it leaves as the one before it.
static dt_status layer_backward(dt_llama *m, dt_llama_acts *a, int l, const float *x, float *dx) {
    const dt_llama_config *c = &m->c;
    llama_dims d = llama_dims_of(c, m->ntp);
    int B = a->B, T = a->T, BT = B * T, C = d.C;
    size_t sC = (size_t)BT * C, sF = (size_t)BT * d.Fl, sK = (size_t)BT * d.KCl;
    layer_acts *s = &a->la[l - a->l0];
    layer_params p = layer_params_of(m->p, m->t, l, c->n_layer), g = layer_params_of(m->g, m->t, l, c->n_layer);
    memset(m->dF0, 0, sizeof(float) * sF);
    dt_linear_backward(m->dF0, g.wd, NULL, dx, s->h, p.wd, BT, d.Fl, C);
    grads_final(m, W_DOWN, l);
    memset(m->dF1, 0, sizeof(float) * sF);
    memset(m->dF2, 0, sizeof(float) * sF);
    dt_swiglu_backward(m->dF1, m->dF2, m->dF0, s->gate, s->up, sF);
    memset(m->d0, 0, sizeof(float) * sC);
    dt_linear_backward(m->d0, g.wg, NULL, m->dF1, s->xn2, p.wg, BT, C, d.Fl);
    dt_linear_backward(m->d0, g.wu, NULL, m->dF2, s->xn2, p.wu, BT, C, d.Fl);
    grads_final(m, W_GATE, l);
    dt_status st = tp_sum(m, m->d0, sC);
    if (st != DT_OK) return st;
    dt_rmsnorm_backward(dx, g.mn, m->d0, s->x2, p.mn, s->rstd2, BT, C);  // (the residual passes dx on to x2)
    grads_final(m, MLP_NORM, l);
    memset(m->d1, 0, sizeof(float) * (size_t)BT * d.Cl);
    dt_linear_backward(m->d1, g.wo, NULL, dx, s->y, p.wo, BT, d.Cl, C);
    grads_final(m, WO, l);
    memset(m->dq, 0, sizeof(float) * (size_t)BT * d.Cl);
    memset(m->dk, 0, sizeof(float) * sK);
    memset(m->dv, 0, sizeof(float) * sK);
    dt_gqa_backward(m->dq, m->dk, m->dv, m->datt, m->d1, s->q, s->k, s->v, s->att, B, T, d.NHl, d.KVl, d.hs);
    dt_rope(m->dq, B, T, d.NHl, d.hs, c->rope_theta, -1);
    dt_rope(m->dk, B, T, d.KVl, d.hs, c->rope_theta, -1);
    memset(m->d0, 0, sizeof(float) * sC);
    dt_linear_backward(m->d0, g.wq, NULL, m->dq, s->xn1, p.wq, BT, C, d.Cl);
    dt_linear_backward(m->d0, g.wk, NULL, m->dk, s->xn1, p.wk, BT, C, d.KCl);
    dt_linear_backward(m->d0, g.wv, NULL, m->dv, s->xn1, p.wv, BT, C, d.KCl);
    grads_final(m, WQ, l);
    if ((st = tp_sum(m, m->d0, sC)) != DT_OK) return st;
    dt_rmsnorm_backward(dx, g.an, m->d0, x, p.an, s->rstd1, BT, C);
    grads_final(m, ATTN_NORM, l);
    return DT_OK;
}

dt_status dt_llama_head_backward(dt_llama *m, dt_llama_acts *a, const float *resid_in, float *dresid) {
    int BT = a->B * a->T, C = m->c.n_embd, V = m->c.vocab_size;
    dt_status st = check_stage(m, a, HEAD_PART, 0, 0, "llama head backward");
    if (st == DT_OK && !a->have_targets)
        st = dt_error(DT_ERR_ARG, "llama backward: the last forward had no targets (or was already backpropagated)");
    if (st == DT_OK) st = dt_llama_reserve_scratch(m, a->B, a->T);
    if (st == DT_OK) st = hook(m, m->c.n_layer, 1);
    if (st != DT_OK) return st;
    float *dlogits = a->logits;  // (the logits are not needed again)
    memset(dlogits, 0, sizeof(float) * BT * V);
    dt_crossentropy_backward(dlogits, a->probs, a->targets, BT, V, m->loss_scale);
    memset(m->d0, 0, sizeof(float) * BT * C);
    dt_linear_backward(m->d0, m->g[HEAD], NULL, dlogits, a->xnf, m->p[HEAD], BT, C, V);
    memset(dresid, 0, sizeof(float) * BT * C);
    dt_rmsnorm_backward(dresid, m->g[NORM], m->d0, resid_in, m->p[NORM], a->rstdf, BT, C);
    grads_final(m, NORM, 0);
    a->have_targets = 0;
    return DT_OK;
}

dt_status dt_llama_backward_range(dt_llama *m, dt_llama_acts *a, int l0, int l1, const float *resid_in,
                                  float *dresid) {
    dt_status st = check_stage(m, a, LAYERS_PART, l0, l1, "llama backward_range");
    for (int l = l0; st == DT_OK && l < l1; l++)
        if (!a->saved[l - a->l0])
            st = dt_error(DT_ERR_ARG, "llama backward_range: layer %d has not run forward on these activations", l);
    if (st == DT_OK) st = dt_llama_reserve_scratch(m, a->B, a->T);
    for (int l = l1 - 1; st == DT_OK && l >= l0; l--)
        if ((st = hook(m, l, 1)) == DT_OK)
            st = layer_backward(m, a, l, l == l0 ? resid_in : dt_llama_acts_resid(a, l), dresid);
    return st;
}

dt_status dt_llama_embed_backward(dt_llama *m, dt_llama_acts *a, const float *dresid) {
    int BT = a->B * a->T, C = m->c.n_embd;
    dt_status st = check_stage(m, a, EMBED_PART, 0, 0, "llama embed backward");
    if (st == DT_OK && !a->have_inputs)
        st = dt_error(DT_ERR_ARG, "llama embed backward: the embedding has not run forward on these activations");
    if (st == DT_OK) st = hook(m, -1, 1);
    if (st != DT_OK) return st;
    for (int i = 0; i < BT; i++) {
        float *e = m->g[EMB] + (size_t)a->inputs[i] * C;
        for (int j = 0; j < C; j++) e[j] += dresid[(size_t)i * C + j];
    }
    if (m->hook) m->hook(0, m->hook_user);
    return DT_OK;
}

// The stream's gradient goes down in the head's xnf, free once the head's
// weight gradient has read it.
dt_status dt_llama_backward(dt_llama *m) {
    dt_llama_acts *a = m->acts;
    if (!a) return no_default_acts("backward");
    int L = m->c.n_layer;
    float *d = a->xnf;
    dt_status st = dt_llama_head_backward(m, a, dt_llama_acts_resid(a, L), d);
    if (st == DT_OK) st = dt_llama_backward_range(m, a, 0, L, dt_llama_acts_resid(a, 0), d);
    if (st == DT_OK) st = dt_llama_embed_backward(m, a, d);
    return st;
}
