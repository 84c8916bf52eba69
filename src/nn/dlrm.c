/* The DLRM-style click model (recsys.h): bottom MLP over the dense
 * features, the dot interaction with the looked-up embedding rows, top
 * MLP, logistic loss. The MLPs' weights are one flat block (bottom layers
 * then top layers, each weight [out, in] then bias [out], PyTorch's
 * nn.Linear layout); the tables are the caller's. */
#include "dtrain/recsys.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS (2 * DT_DLRM_MAX_MLP + 2)

struct dt_dlrm {
    dt_dlrm_spec s;
    int maxB, B, F, I;              // F = ntables + 1 interacting vectors; I = the top MLP's input width
    int nl, nbot;                   // linear layers, the bottom's first
    int in[MAX_LAYERS], out[MAX_LAYERS];
    size_t woff[MAX_LAYERS], boff[MAX_LAYERS];
    float *params, *grads;
    size_t np;
    dt_tensor_info tinfo[2 * MAX_LAYERS];
    char names[2 * MAX_LAYERS][32];
    // activations: act[l] is layer l's output (after its relu, where it has one) [B, out[l]]
    float *x;                       // log1p(dense) [B, ndense]
    float *act[MAX_LAYERS];
    float *inter;                   // [B, I]
    const float *emb;               // the forward's rows [B, T, dim] (the caller's)
    float *probs;                   // [B]
    uint8_t *y;                     // [B]
    float *d0, *d1;                 // gradient scratch, the widest layer [B, w]
};

// ----------------------------------------------------------------------------
// shapes

int dt_dlrm_interaction_size(const dt_dlrm_spec *s) { return s->dim + (s->ntables + 1) * s->ntables / 2; }

int64_t dt_dlrm_row_offset(const dt_dlrm_spec *s, int t) {
    int64_t o = 0;
    for (int i = 0; i < t; i++) o += s->rows[i];
    return o;
}

int64_t dt_dlrm_total_rows(const dt_dlrm_spec *s) { return dt_dlrm_row_offset(s, s->ntables); }

// The linear layers' widths: the bottom's (ending at dim; with no dense
// features, none: z0 is zero) then the top's (ending at 1).
static int layer_shapes(const dt_dlrm_spec *s, int *in, int *out, int *nbot) {
    int n = 0, w = s->ndense;
    if (s->ndense > 0) {
        for (int i = 0; i < s->nbottom; i++) in[n] = w, out[n++] = w = s->bottom[i];
        in[n] = w, out[n++] = s->dim;
    }
    *nbot = n;
    w = dt_dlrm_interaction_size(s);
    for (int i = 0; i < s->ntop; i++) in[n] = w, out[n++] = w = s->top[i];
    in[n] = w, out[n++] = 1;
    return n;
}

size_t dt_dlrm_mlp_params(const dt_dlrm_spec *s) {
    int in[MAX_LAYERS], out[MAX_LAYERS], nb, nl = layer_shapes(s, in, out, &nb);
    size_t np = 0;
    for (int l = 0; l < nl; l++) np += (size_t)out[l] * in[l] + out[l];
    return np;
}

// ----------------------------------------------------------------------------
// the model's memory

dt_status dt_dlrm_create(dt_dlrm **out, const dt_dlrm_spec *s, int max_batch) {
    dt_status st = dt_dlrm_spec_check(s, "[recsys]");
    if (st != DT_OK) return st;
    dt_dlrm *m = calloc(1, sizeof *m);
    if (!(*out = m)) return dt_error(DT_ERR_NOMEM, "the model: out of memory");
    m->s = *s;
    m->maxB = max_batch > 0 ? max_batch : 1;
    m->F = s->ntables + 1;
    m->I = dt_dlrm_interaction_size(s);
    m->nl = layer_shapes(s, m->in, m->out, &m->nbot);
    int wide = m->I > s->ntables * s->dim ? m->I : s->ntables * s->dim;
    int t = 0;
    for (int l = 0; l < m->nl; l++) {
        const char *part = l < m->nbot ? "bottom" : "top";
        int k = l < m->nbot ? l : l - m->nbot;
        m->woff[l] = m->np;
        m->np += (size_t)m->out[l] * m->in[l];
        m->boff[l] = m->np;
        m->np += m->out[l];
        snprintf(m->names[t], sizeof m->names[t], "%s.%d.weight", part, k);
        m->tinfo[t] = (dt_tensor_info){m->names[t], 2, {m->out[l], m->in[l]}, m->woff[l], (size_t)m->out[l] * m->in[l]};
        t++;
        snprintf(m->names[t], sizeof m->names[t], "%s.%d.bias", part, k);
        m->tinfo[t] = (dt_tensor_info){m->names[t], 1, {m->out[l]}, m->boff[l], (size_t)m->out[l]};
        t++;
        if (m->out[l] > wide) wide = m->out[l];
        if (m->in[l] > wide) wide = m->in[l];
    }
    size_t B = (size_t)m->maxB;
    m->params = dt_alloc(sizeof(float) * m->np);
    m->grads = dt_alloc(sizeof(float) * m->np);
    m->x = dt_alloc(sizeof(float) * B * (size_t)(s->ndense > 0 ? s->ndense : 1));
    m->inter = dt_alloc(sizeof(float) * B * (size_t)m->I);
    m->probs = dt_alloc(sizeof(float) * B);
    m->y = calloc(B, 1);
    m->d0 = dt_alloc(sizeof(float) * B * (size_t)wide);
    m->d1 = dt_alloc(sizeof(float) * B * (size_t)wide);
    int ok = m->params && m->grads && m->x && m->inter && m->probs && m->y && m->d0 && m->d1;
    for (int l = 0; l < m->nl && ok; l++) ok = (m->act[l] = dt_alloc(sizeof(float) * B * (size_t)m->out[l])) != NULL;
    if (!ok) {
        dt_dlrm_free(m);
        *out = NULL;
        return dt_error(DT_ERR_NOMEM, "the model's activations for %d records: out of memory", m->maxB);
    }
    return DT_OK;
}

void dt_dlrm_free(dt_dlrm *m) {
    if (!m) return;
    for (int l = 0; l < m->nl; l++) dt_free(m->act[l]);
    dt_free(m->params);
    dt_free(m->grads);
    dt_free(m->x);
    dt_free(m->inter);
    dt_free(m->probs);
    free(m->y);
    dt_free(m->d0);
    dt_free(m->d1);
    free(m);
}

float *dt_dlrm_params(dt_dlrm *m) { return m->params; }
float *dt_dlrm_grads(dt_dlrm *m) { return m->grads; }
size_t dt_dlrm_num_params(const dt_dlrm *m) { return m->np; }
int dt_dlrm_num_tensors(const dt_dlrm *m) { return 2 * m->nl; }
const dt_tensor_info *dt_dlrm_tensor(const dt_dlrm *m, int i) { return &m->tinfo[i]; }
const float *dt_dlrm_probs(const dt_dlrm *m) { return m->probs; }

void dt_dlrm_init(dt_dlrm *m, uint64_t seed) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int l = 0; l < m->nl; l++) {
        float a = 1.0f / sqrtf((float)m->in[l]);
        for (size_t i = 0; i < (size_t)m->out[l] * m->in[l]; i++) m->params[m->woff[l] + i] = a * (2 * dt_rng_uniform(&r) - 1);
        for (int i = 0; i < m->out[l]; i++) m->params[m->boff[l] + i] = a * (2 * dt_rng_uniform(&r) - 1);
    }
}

// splitmix64: a row's numbers from its own index alone.
static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void dt_dlrm_init_rows(float *out, int64_t first, int64_t n, int dim, uint64_t seed) {
    float a = 1.0f / sqrtf((float)dim);
    for (int64_t r = 0; r < n; r++) {
        uint64_t h = mix(seed ^ mix((uint64_t)(first + r) + 0x5eed));
        for (int k = 0; k < dim; k++) {
            h = mix(h);
            out[r * dim + k] = a * (2 * (float)((h >> 40) * 0x1.0p-24) - 1);
        }
    }
}

// ----------------------------------------------------------------------------
// forward and backward

// The interacting vectors of record b: z0 (the bottom's output; zeros
// without dense features) and its T rows.
static const float *vec(const dt_dlrm *m, int b, int i) {
    int d = m->s.dim;
    if (i > 0) return m->emb + ((size_t)b * m->s.ntables + (i - 1)) * d;
    return m->nbot ? m->act[m->nbot - 1] + (size_t)b * d : NULL;
}

static float dot(const float *a, const float *b, int d) {
    float s = 0;
    if (!a || !b) return 0;
    for (int k = 0; k < d; k++) s += a[k] * b[k];
    return s;
}

dt_status dt_dlrm_forward(dt_dlrm *m, const float *dense, const float *emb, const uint8_t *labels, int B, float *loss) {
    if (B < 1 || B > m->maxB)
        return dt_error(DT_ERR_ARG, "dlrm forward: %d records, the model was made for 1 to %d", B, m->maxB);
    const dt_dlrm_spec *s = &m->s;
    m->B = B;
    m->emb = emb;
    for (size_t i = 0; i < (size_t)B * s->ndense; i++) m->x[i] = log1pf(dense[i]);
    const float *in = m->x;
    for (int l = 0; l < m->nl; l++) {
        if (l == m->nbot) {  // the interaction: z0, then <v_i, v_j> for i < j
            for (int b = 0; b < B; b++) {
                float *o = m->inter + (size_t)b * m->I;
                const float *z0 = vec(m, b, 0);
                for (int k = 0; k < s->dim; k++) o[k] = z0 ? z0[k] : 0;
                int q = s->dim;
                for (int i = 0; i < m->F; i++)
                    for (int j = i + 1; j < m->F; j++) o[q++] = dot(vec(m, b, i), vec(m, b, j), s->dim);
            }
            in = m->inter;
        }
        dt_linear_forward(m->act[l], in, m->params + m->woff[l], m->params + m->boff[l], B, m->in[l], m->out[l]);
        if (l < m->nl - 1) dt_relu_forward(m->act[l], m->act[l], (size_t)B * m->out[l]);
        in = m->act[l];
    }
    const float *z = m->act[m->nl - 1];
    double sum = 0;
    for (int b = 0; b < B; b++) {
        m->probs[b] = 1.0f / (1.0f + expf(-z[b]));
        if (!labels) continue;
        m->y[b] = labels[b];
        sum += fmaxf(z[b], 0) - z[b] * labels[b] + log1pf(expf(-fabsf(z[b])));
    }
    if (loss) *loss = labels ? (float)(sum / B) : 0;
    return DT_OK;
}

// Through the interaction: g[B, I], the gradient of the top MLP's input,
// into demb[B, T, dim] and dz0[B, dim] (the bottom's output).
static void interaction_backward(const dt_dlrm *m, const float *g, float *demb, float *dz0) {
    int B = m->B, d = m->s.dim, T = m->s.ntables;
    memset(demb, 0, sizeof(float) * (size_t)B * T * d);
    for (int b = 0; b < B; b++) {
        const float *gb = g + (size_t)b * m->I;
        float *z = dz0 + (size_t)b * d;
        memcpy(z, gb, sizeof(float) * d);
        int q = d;
        for (int i = 0; i < m->F; i++)
            for (int j = i + 1; j < m->F; j++, q++) {
                const float *vi = vec(m, b, i), *vj = vec(m, b, j);
                float *di = i ? demb + ((size_t)b * T + i - 1) * d : z;
                float *dj = demb + ((size_t)b * T + j - 1) * d;
                for (int k = 0; k < d; k++) {
                    if (vj) di[k] += gb[q] * vj[k];
                    if (vi) dj[k] += gb[q] * vi[k];
                }
            }
    }
}

void dt_dlrm_backward(dt_dlrm *m, float *demb, float scale) {
    int B = m->B;
    float *g = m->d0, *spare = m->d1, *t;
    for (int b = 0; b < B; b++) g[b] = (m->probs[b] - (float)m->y[b]) * scale / (float)B;
    for (int l = m->nl - 1; l >= 0; l--) {  // g: the gradient of layer l's output
        size_t nout = (size_t)B * m->out[l], nin = (size_t)B * m->in[l];
        if (l < m->nl - 1) {  // through its relu
            memset(spare, 0, sizeof(float) * nout);
            dt_relu_backward(spare, g, m->act[l], nout);
            t = g, g = spare, spare = t;
        }
        const float *in = l == m->nbot ? m->inter : l == 0 ? m->x : m->act[l - 1];
        int want = l > 0 || l == m->nbot;
        memset(spare, 0, sizeof(float) * nin);
        dt_linear_backward(want ? spare : NULL, m->grads + m->woff[l], m->grads + m->boff[l], g, in,
                           m->params + m->woff[l], B, m->in[l], m->out[l]);
        t = g, g = spare, spare = t;
        if (l == m->nbot) {
            interaction_backward(m, g, demb, spare);
            t = g, g = spare, spare = t;
        }
    }
}
