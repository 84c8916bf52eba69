/* The Llama-style decoder (dtrain/llama.h): configuration, the one
 * parameter block in the order the header lists (a tensor-parallel
 * shard's parts, the blocks a pipeline stage keeps), the gradient order,
 * initialisation. The forward and backward are llama_run.c's. */
#include "nn/llama_impl.h"
#include "nn/nn_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[NPT] = {"tok_embeddings", "attn_norm", "wq", "wk", "wv", "wo",
                                       "mlp_norm", "w_gate", "w_up", "w_down", "norm", "lm_head"};

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

// In a shard of ntp: the rows of wq, wk, wv, w_gate and w_up and the
// columns of wo and w_down divided by ntp.
void dt_llama_shard_shapes(const dt_llama_config *c, int ntp, dt_tensor_info t[NPT]) {
    llama_dims d = llama_dims_of(c, ntp);
    int64_t L = c->n_layer, C = d.C, V = d.V, Cl = d.Cl, KC = d.KCl, F = d.Fl;
    const int64_t sh[NPT][3] = {{V, C}, {L, C}, {L, Cl, C}, {L, KC, C}, {L, KC, C}, {L, C, Cl},
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

void dt_llama_param_shapes(const dt_llama_config *c, dt_tensor_info t[NPT]) { dt_llama_shard_shapes(c, 1, t); }

size_t dt_llama_config_num_params(const dt_llama_config *c) {
    dt_tensor_info t[NPT];
    dt_llama_param_shapes(c, t);
    return t[NPT - 1].offset + t[NPT - 1].numel;
}

// ----------------------------------------------------------------------------
// tensor parallel

dt_status dt_llama_tensor_parallel_check(const dt_llama_config *c, int ntp, const char *what) {
    if (ntp < 1) return dt_error(DT_ERR_ARG, "%s: %d shards: expected >= 1", what, ntp);
    if (c->n_head % ntp || c->n_kv_head % ntp || c->ffn_hidden % ntp)
        return dt_error(DT_ERR_ARG, "%s: %d tensor-parallel ranks do not divide the model's %d query heads (n_head), "
                        "%d key/value heads (n_kv_head) and %d hidden units (ffn_hidden): each rank holds whole "
                        "key/value groups", what, ntp, c->n_head, c->n_kv_head, c->ffn_hidden);
    return DT_OK;
}

int dt_llama_tensor_split(int i) { return i == WQ || i == WK || i == WV || i == WO || i == W_GATE || i == W_UP || i == W_DOWN; }

// Where shard tp of ntp's part of tensor i lies: fn(user, local, whole, n)
// for each run of n floats at offset `local` of the shard's tensor and
// `whole` of the whole model's, increasing in both.
typedef void (*run_fn)(void *user, size_t local, size_t whole, size_t n);
static void shard_runs(const dt_llama *m, int i, run_fn fn, void *user) {
    size_t L = m->c.n_layer, C = m->c.n_embd, ntp = m->ntp, r = m->tp;
    size_t rows = m->t[i].ndim == 3 ? (size_t)m->t[i].shape[1] : 0, cols = m->t[i].ndim == 3 ? (size_t)m->t[i].shape[2] : 0;
    if (ntp == 1 || !dt_llama_tensor_split(i)) {
        fn(user, 0, 0, m->t[i].numel);
        return;
    }
    if (i == WO || i == W_DOWN)  // row-parallel: the columns of this rank's inputs
        for (size_t l = 0; l < L; l++)
            for (size_t o = 0; o < C; o++) fn(user, (l * C + o) * cols, (l * C + o) * cols * ntp + r * cols, cols);
    else  // column-parallel: this rank's rows (its heads, its hidden units)
        for (size_t l = 0; l < L; l++) fn(user, l * rows * cols, (l * rows * ntp + r * rows) * cols, rows * cols);
}

// ----------------------------------------------------------------------------
// the blocks a model keeps (a pipeline stage's)

static int holds(const dt_llama *m, int l) { return !m->held || m->held[l]; }
static int keeps_tensor(const dt_llama *m, int i) {
    return i == EMB ? holds(m, 0) : i >= NORM ? holds(m, m->c.n_layer - 1) : 1;
}

static void held_ranges(dt_llama *m) {
    int L = m->c.n_layer, n = 0;
    for (int i = 0; i < NPT; i++) {
        const dt_tensor_info *t = &m->t[i];
        if (!keeps_tensor(m, i)) continue;
        if (i == EMB || i >= NORM) {
            m->hranges[n++] = (dt_grad_range){t->offset, t->numel};
            continue;
        }
        size_t per = t->numel / (size_t)L;
        for (int l = 0; l < L; l++)
            if (holds(m, l)) m->hranges[n++] = (dt_grad_range){t->offset + (size_t)l * per, per};
    }
    int k = 0;  // adjacent ranges as one
    for (int i = 0; i < n; i++)
        if (k && m->hranges[k - 1].offset + m->hranges[k - 1].len == m->hranges[i].offset) m->hranges[k - 1].len += m->hranges[i].len;
        else m->hranges[k++] = m->hranges[i];
    m->nheld = k;
}

dt_status dt_llama_set_held(dt_llama *m, const unsigned char *held) {
    int L = m->c.n_layer, any = 0;
    for (int l = 0; held && l < L; l++) any |= held[l];
    if (held && !any) return dt_error(DT_ERR_ARG, "llama: a model that keeps none of its %d blocks", L);
    free(m->held);
    m->held = NULL;
    if (held && !(m->held = malloc((size_t)L))) return dt_error(DT_ERR_NOMEM, "llama: out of memory");
    if (held) memcpy(m->held, held, (size_t)L);
    held_ranges(m);
    if (held) {
        dt_pages_unused(m->params, sizeof(float), m->nparams, (const size_t *)m->hranges, m->nheld);
        dt_pages_unused(m->grads, sizeof(float), m->nparams, (const size_t *)m->hranges, m->nheld);
    }
    return DT_OK;
}

const dt_grad_range *dt_llama_held_ranges(const dt_llama *m, int *n) {
    *n = m->nheld;
    return m->hranges;
}

// shard_runs of tensor i cut to the ranges m keeps.
typedef struct {
    run_fn fn;
    void *user;
    const dt_llama *m;
    size_t base;  // the tensor's offset in m's block
} held_run;

static void held_one(void *user, size_t local, size_t whole, size_t n) {
    held_run *u = user;
    size_t a0 = u->base + local, b0 = a0 + n;
    for (int k = 0; k < u->m->nheld; k++) {
        const dt_grad_range *h = &u->m->hranges[k];
        size_t a = h->offset > a0 ? h->offset : a0, b = h->offset + h->len < b0 ? h->offset + h->len : b0;
        if (a < b) u->fn(u->user, local + (a - a0), whole + (a - a0), b - a);
    }
}

static void held_runs(const dt_llama *m, int i, run_fn fn, void *user) {
    if (!keeps_tensor(m, i)) return;
    held_run u = {fn, user, m, m->t[i].offset};
    shard_runs(m, i, m->held ? held_one : fn, m->held ? (void *)&u : user);
}

typedef struct {
    float *local;
    size_t base, lo, hi;  // the tensor's offset in the whole block; the range
    float *buf;
    int into;
} range_run;

static void range_one(void *user, size_t local, size_t whole, size_t n) {
    range_run *u = user;
    size_t a = u->base + whole, b = a + n;
    a = a > u->lo ? a : u->lo;
    b = b < u->hi ? b : u->hi;
    if (a >= b) return;
    float *l = u->local + local + (a - u->base - whole), *w = u->buf + (a - u->lo);
    memcpy(u->into ? l : w, u->into ? w : l, sizeof(float) * (b - a));
}

static void part_range(const dt_llama *m, float *local, size_t lo, size_t hi, float *buf, int into) {
    dt_tensor_info w[NPT];
    dt_llama_shard_shapes(&m->c, 1, w);
    for (int i = 0; i < NPT; i++) {
        if (w[i].offset >= hi || w[i].offset + w[i].numel <= lo) continue;
        if (!into && m->tp > 0 && !dt_llama_tensor_split(i)) continue;  // (shard 0's alone)
        range_run u = {local + m->t[i].offset, w[i].offset, lo, hi, buf, into};
        held_runs(m, i, range_one, &u);
    }
}

void dt_llama_part_fill(const dt_llama *m, const float *local, size_t lo, size_t hi, float *buf) {
    part_range(m, (float *)local, lo, hi, buf, 0);
}

void dt_llama_part_take(const dt_llama *m, float *local, size_t lo, size_t hi, const float *buf) {
    part_range(m, local, lo, hi, (float *)buf, 1);
}

// ----------------------------------------------------------------------------
// create / free

void dt_llama_free(dt_llama *m) {
    if (!m) return;
    dt_free(m->params);
    dt_free(m->grads);
    dt_llama_free_scratch(m);
    dt_llama_acts_free(m->acts);
    free(m->ord);
    free(m->held);
    free(m->hranges);
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
    return dt_llama_create_shard(out, c, B, T, 0, 1);
}

dt_status dt_llama_create_shard(dt_llama **out, const dt_llama_config *c, int B, int T, int tp, int ntp) {
    *out = NULL;
    dt_status st = dt_llama_config_check(c, "llama");
    if (st == DT_OK) st = dt_llama_tensor_parallel_check(c, ntp, "llama");
    if (st != DT_OK) return st;
    if (tp < 0 || tp >= ntp) return dt_error(DT_ERR_ARG, "llama: tensor-parallel rank %d of %d: expected 0 <= rank < %d", tp, ntp, ntp);
    dt_llama *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "llama: out of memory");
    m->c = *c;
    m->tp = tp;
    m->ntp = ntp;
    m->loss_scale = 1.0f;
    dt_llama_shard_shapes(c, ntp, m->t);
    m->nparams = m->t[NPT - 1].offset + m->t[NPT - 1].numel;
    m->params = dt_alloc(sizeof(float) * m->nparams);
    m->grads = dt_alloc(sizeof(float) * m->nparams);
    m->ord = malloc(sizeof(dt_grad_range) * (NPL * (size_t)c->n_layer + 3));
    m->hranges = malloc(sizeof(dt_grad_range) * (NPL * (size_t)c->n_layer + 3));
    if (!m->params || !m->grads || !m->ord || !m->hranges) {
        dt_llama_free(m);
        return dt_error(DT_ERR_NOMEM, "llama: out of memory (%zu MiB of parameters and gradients)", m->nparams * 8 >> 20);
    }
    for (int i = 0; i < NPT; i++) {
        m->p[i] = m->params + m->t[i].offset;
        m->g[i] = m->grads + m->t[i].offset;
    }
    make_order(m);
    held_ranges(m);
    if ((B || T) && ((st = dt_llama_acts_create(&m->acts, c, B, T, 0, c->n_layer, ntp)) != DT_OK ||
                     (st = dt_llama_reserve_scratch(m, B, T)) != DT_OK)) {
        dt_llama_free(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

const dt_llama_config *dt_llama_get_config(const dt_llama *m) { return &m->c; }
size_t dt_llama_num_params(const dt_llama *m) { return m->nparams; }
float *dt_llama_params(dt_llama *m) { return m->params; }
float *dt_llama_grads(dt_llama *m) { return m->grads; }
void dt_llama_zero_grad(dt_llama *m) {
    for (int i = 0; i < m->nheld; i++) memset(m->grads + m->hranges[i].offset, 0, sizeof(float) * m->hranges[i].len);
}
const dt_tensor_info *dt_llama_tensor(const dt_llama *m, int i) { return i >= 0 && i < NPT ? &m->t[i] : NULL; }
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
void dt_llama_set_reduce(dt_llama *m, dt_llama_reduce_fn fn, void *user) {
    m->reduce = fn;
    m->reduce_user = user;
}

// ----------------------------------------------------------------------------
// initialisation

// The whole model's values of a tensor drawn in order from one stream; the
// runs this model keeps copied where they fall in [lo, hi) of its block
// (the values in between drawn and dropped).
typedef struct {
    dt_rng *r;
    size_t drawn;       // the tensor's values drawn so far
    float sd, *params;
    int one;
    size_t base, lo, hi;
} init_run;

static float draw(init_run *u) { return u->one ? 1.0f : u->sd * dt_rng_normal(u->r); }

static void init_one(void *user, size_t local, size_t whole, size_t n) {
    init_run *u = user;
    for (; u->drawn < whole; u->drawn++) draw(u);
    for (size_t j = 0; j < n; j++, u->drawn++) {
        float v = draw(u);
        size_t e = u->base + local + j;
        if (e >= u->lo && e < u->hi) u->params[e] = v;
    }
}

dt_status dt_llama_init(dt_llama *m, uint64_t seed) { return dt_llama_init_range(m, seed, 0, SIZE_MAX); }

dt_status dt_llama_init_range(dt_llama *m, uint64_t seed, size_t lo, size_t hi) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    dt_tensor_info w[NPT];
    dt_llama_shard_shapes(&m->c, 1, w);
    float resid = 0.02f / sqrtf(2.0f * m->c.n_layer);
    for (int i = 0; i < NPT; i++) {
        init_run u = {&r, 0, i == WO || i == W_DOWN ? resid : 0.02f, m->params,
                      i == ATTN_NORM || i == MLP_NORM || i == NORM, m->t[i].offset, lo, hi};
        held_runs(m, i, init_one, &u);
        for (; u.drawn < w[i].numel; u.drawn++) draw(&u);  // (the rest of the whole tensor's stream)
        dt_alive();
    }
    return DT_OK;
}
