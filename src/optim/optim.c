/* SGD (momentum, Nesterov, weight decay) and AdamW over flat arrays, with
 * the update rules of torch.optim.SGD and torch.optim.AdamW; global-norm
 * clipping; learning-rate schedules. */
#include "dtrain/optim.h"
#include "optim/elem.h"

#include <math.h>
#include <stdlib.h>

struct dt_optim {
    dt_optim_params p;
    size_t n;
    int64_t t;        // steps taken
    float *s0, *s1;   // SGD: momentum; AdamW: m, v
    const char *state_dir;  // the state's file-backed mapping (dt_state_alloc), or NULL
    int skip;         // steps are skipped (dt_optim_set_skip)
    size_t *frozen;   // (offset, length) pairs of elements never updated, in order (dt_optim_set_frozen)
    int nfrozen;
};

dt_status dt_optim_create(dt_optim **out, const dt_optim_params *p, size_t n) {
    return dt_optim_create_at(out, p, n, NULL);
}

dt_status dt_optim_create_at(dt_optim **out, const dt_optim_params *p, size_t n, const char *state_dir) {
    *out = NULL;
    dt_optim *o = calloc(1, sizeof *o);
    if (!o) return dt_error(DT_ERR_NOMEM, "optimizer: out of memory");
    o->p = *p;
    o->n = n;
    o->state_dir = state_dir;
    int nstate = dt_optim_num_states(o);
    if (nstate >= 1 && !(o->s0 = dt_state_alloc(n, state_dir))) goto nomem;
    if (nstate >= 2 && !(o->s1 = dt_state_alloc(n, state_dir))) goto nomem;
    *out = o;
    return DT_OK;
nomem:
    dt_optim_free(o);
    if (state_dir) return DT_ERR_IO;  // dt_state_alloc's message names the directory
    return dt_error(DT_ERR_NOMEM, "optimizer: out of memory for state of %zu parameters", n);
}

void dt_optim_free(dt_optim *o) {
    if (!o) return;
    dt_state_free(o->s0, o->n, o->state_dir);
    dt_state_free(o->s1, o->n, o->state_dir);
    free(o->frozen);
    free(o);
}

int64_t *dt_optim_step_count(dt_optim *o) { return &o->t; }

int dt_optim_num_states(const dt_optim *o) { return dt_optim_params_states(&o->p); }

int dt_optim_params_states(const dt_optim_params *p) {
    if (p->kind == DT_OPTIM_ADAMW) return 2;
    return p->momentum != 0.0f ? 1 : 0;
}

float *dt_optim_state(dt_optim *o, int i) { return i == 0 ? o->s0 : i == 1 ? o->s1 : NULL; }

void dt_optim_set_skip(dt_optim *o, int skip) { o->skip = skip; }
dt_optim_kind dt_optim_kind_of(const dt_optim *o) { return o->p.kind; }
int dt_optim_skipping(const dt_optim *o) { return o->skip; }

dt_status dt_optim_set_frozen(dt_optim *o, const size_t *ranges, int n) {
    free(o->frozen);
    o->frozen = NULL;
    o->nfrozen = 0;
    if (n <= 0) return DT_OK;
    if (!(o->frozen = malloc(sizeof(size_t) * 2 * (size_t)n))) return dt_error(DT_ERR_NOMEM, "optimizer: out of memory");
    for (int i = 0; i < n; i++) {
        size_t a = ranges[2 * i], b = a + ranges[2 * i + 1];
        if (i && a < o->frozen[2 * (o->nfrozen - 1)] + o->frozen[2 * (o->nfrozen - 1) + 1])
            return free(o->frozen), o->frozen = NULL, o->nfrozen = 0,
                   dt_error(DT_ERR_INTERNAL, "optimizer: frozen ranges out of order");
        if (a >= o->n || b <= a) continue;
        o->frozen[2 * o->nfrozen] = a;
        o->frozen[2 * o->nfrozen + 1] = (b < o->n ? b : o->n) - a;
        o->nfrozen++;
    }
    return DT_OK;
}

void dt_optim_begin_step(dt_optim *o) {
    if (!o->skip) o->t++;
}

dt_adamw_k dt_optim_adamw_k(const dt_optim *o, float lr, float grad_scale) {
    const dt_optim_params *p = &o->p;
    float bc1 = 1.0f - powf(p->beta1, (float)o->t), bc2 = 1.0f - powf(p->beta2, (float)o->t);
    return (dt_adamw_k){p->beta1, p->beta2, p->eps, lr, p->weight_decay, lr / bc1, 1.0f / sqrtf(bc2), grad_scale};
}

dt_sgd_k dt_optim_sgd_k(const dt_optim *o, float lr, float grad_scale) {
    const dt_optim_params *p = &o->p;
    return (dt_sgd_k){lr, p->momentum, p->weight_decay, grad_scale, p->nesterov, o->t == 1};
}

static void update_span(dt_optim *o, size_t off, size_t n, float *params, const float *grads, float lr,
                        float grad_scale);

// The elements of [off, off + n) outside the frozen ranges, span by span.
void dt_optim_update(dt_optim *o, size_t off, size_t n, float *params, const float *grads, float lr,
                     float grad_scale) {
    if (o->skip) return;
    size_t at = off, end = off + n;
    for (int i = 0; i < o->nfrozen && at < end; i++) {
        size_t a = o->frozen[2 * i], b = a + o->frozen[2 * i + 1];
        if (b <= at) continue;
        if (a > at) {
            size_t e = a < end ? a : end;
            update_span(o, at, e - at, params + (at - off), grads + (at - off), lr, grad_scale);
        }
        at = b;
    }
    if (at < end) update_span(o, at, end - at, params + (at - off), grads + (at - off), lr, grad_scale);
}

// The loops take their constants by value (each thread its own copy) and
// their arrays as restrict: otherwise every store through w may change the
// constants, reloaded at every element, and the loop does not vectorise
// cleanly; SGD with and without momentum are two loops (no per-element
// test of the momentum pointer).
static void adamw_loop(float *restrict w, const float *restrict g, float *restrict m, float *restrict v, size_t n,
                       dt_adamw_k k) {
#pragma omp parallel for simd schedule(static) firstprivate(k)
    for (size_t i = 0; i < n; i++) dt_adamw_elem(&w[i], g[i], &m[i], &v[i], &k);
}

// SGD with momentum buffer buf (NULL: none).
static void sgd_loop(float *restrict w, const float *restrict g, float *restrict buf, size_t n, dt_sgd_k k) {
    if (!buf) {
#pragma omp parallel for simd schedule(static) firstprivate(k)
        for (size_t i = 0; i < n; i++) dt_sgd_plain_elem(&w[i], g[i], &k);
    } else {
#pragma omp parallel for simd schedule(static) firstprivate(k)
        for (size_t i = 0; i < n; i++) dt_sgd_momentum_elem(&w[i], g[i], &buf[i], &k);
    }
}

static void update_span(dt_optim *o, size_t off, size_t n, float *params, const float *grads, float lr,
                        float grad_scale) {
    if (o->p.kind == DT_OPTIM_ADAMW)
        adamw_loop(params, grads, o->s0 + off, o->s1 + off, n, dt_optim_adamw_k(o, lr, grad_scale));
    else
        sgd_loop(params, grads, o->s0 ? o->s0 + off : NULL, n, dt_optim_sgd_k(o, lr, grad_scale));
}

void dt_optim_step(dt_optim *o, float *params, const float *grads, float lr, float grad_scale) {
    dt_optim_begin_step(o);
    dt_optim_update(o, 0, o->n, params, grads, lr, grad_scale);
}

void dt_adagrad_rows(float *table, float *acc, const int64_t *rows, const float *g, size_t n, int dim, float lr,
                     float eps) {
    for (size_t i = 0; i < n; i++) {
        float *w = table + (size_t)rows[i] * dim;
        const float *gi = g + i * (size_t)dim;
        float step = lr;
        if (acc) {
            float ss = 0;
            for (int k = 0; k < dim; k++) ss += gi[k] * gi[k];
            acc[rows[i]] += ss / (float)dim;
            step = lr / (sqrtf(acc[rows[i]]) + eps);
        }
        for (int k = 0; k < dim; k++) w[k] -= step * gi[k];
    }
}

void dt_sum_squares_blocks(const float *g, size_t nblocks, double *out) {
    enum { BLK = DT_SUMSQ_BLOCK, SIDE = 8 };  // blocks side by side: independent chains of additions
    size_t groups = (nblocks + SIDE - 1) / SIDE;
#pragma omp parallel for schedule(static)
    for (size_t q = 0; q < groups; q++) {
        size_t b0 = q * SIDE, nb = nblocks - b0 < SIDE ? nblocks - b0 : SIDE;
        if (nb < SIDE) {
            for (size_t b = b0; b < b0 + nb; b++) {
                double s = 0;
                for (size_t i = b * BLK; i < (b + 1) * BLK; i++) s += (double)g[i] * g[i];
                out[b] = s;
            }
            continue;
        }
        const float *x = g + b0 * BLK;
        double s[SIDE] = {0};
        for (size_t i = 0; i < BLK; i++)
            for (int k = 0; k < SIDE; k++) s[k] += (double)x[(size_t)k * BLK + i] * x[(size_t)k * BLK + i];
        for (int k = 0; k < SIDE; k++) out[b0 + (size_t)k] = s[k];
    }
}

size_t dt_sum_squares_parts(const float *x, size_t n, size_t first, double carry, double *part) {
    enum { BLK = DT_SUMSQ_BLOCK };
    size_t i = 0, k = 0;
    first %= BLK;
    if (n && first) {  // the rest of a block begun before x
        double s = carry;
        for (size_t e = BLK - first < n ? BLK - first : n; i < e; i++) s += (double)x[i] * x[i];
        part[k++] = s;
    }
    size_t full = (n - i) / BLK;
    dt_sum_squares_blocks(x + i, full, part + k);
    k += full, i += full * BLK;
    if (i < n) {  // a block that goes on after x
        double s = 0;
        for (; i < n; i++) s += (double)x[i] * x[i];
        part[k++] = s;
    }
    return k;
}

double dt_sum_squares(const float *g, size_t n) {
    // Fixed-size blocks summed in order: the result does not depend on the
    // thread count.
    enum { BLK = DT_SUMSQ_BLOCK };
    size_t nb = (n + BLK - 1) / BLK, full = n / BLK;
    double *part = malloc(sizeof(double) * (nb ? nb : 1));
    if (!part) {
        double s = 0;
        for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
        return s;
    }
    dt_sum_squares_blocks(g, full, part);
    if (full < nb) {
        double s = 0;
        for (size_t i = full * BLK; i < n; i++) s += (double)g[i] * g[i];
        part[full] = s;
    }
    double s = 0;
    for (size_t b = 0; b < nb; b++) s += part[b];
    free(part);
    return s;
}

float dt_clip_scale(double norm, float clip_norm) { return dt_clip_rule(norm, clip_norm); }

void dt_optim_unstep(dt_optim *o) {
    if (o->t > 0) o->t--;
}

// ----------------------------------------------------------------------------
// dynamic loss scaling

dt_loss_scaler dt_loss_scaler_default(void) { return (dt_loss_scaler){65536.0f, 2.0f, 0.5f, 2000, 0, 0}; }

int dt_loss_scaler_update(dt_loss_scaler *s, int overflow) {
    if (overflow) {
        s->scale *= s->backoff;
        s->clean = 0;
        s->skipped++;
        return 0;
    }
    if (++s->clean >= s->growth_interval) {
        s->scale *= s->growth;
        s->clean = 0;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// schedules

float dt_schedule_lr(const dt_schedule *s, int64_t step) {
    if (s->warmup_steps > 0 && step < s->warmup_steps)
        return s->lr * (float)(step + 1) / (float)s->warmup_steps;
    if (s->kind == DT_SCHED_CONSTANT) return s->lr;
    int64_t span = s->total_steps - s->warmup_steps;
    if (span <= 0) return s->lr;
    double frac = (double)(step - s->warmup_steps) / (double)span;
    if (frac > 1.0) frac = 1.0;
    double k = s->kind == DT_SCHED_COSINE ? 0.5 * (1.0 + cos(M_PI * frac)) : 1.0 - frac;
    return (float)(s->min_lr + (s->lr - s->min_lr) * k);
}
