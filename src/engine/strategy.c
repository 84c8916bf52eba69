/* The strategy registry and what the peers share (strategy.h). */
#include "engine/strategy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// The one registry: the first strategy that wants the config runs it.
static const dt_strategy_ops *const strategies[] = {
    &dt_strategy_local_sgd,
    &dt_strategy_dp_deterministic,
    &dt_strategy_dp,
};

const dt_strategy_ops *dt_strategy_for(const dt_config *c) {
    for (size_t i = 0; i < sizeof strategies / sizeof *strategies; i++)
        if (strategies[i]->wants(c)) return strategies[i];
    return &dt_strategy_dp;
}

dt_status dt_strategy_create(dt_strategy **out, const dt_strategy_ops *ops, const dt_strategy_args *a) {
    *out = NULL;
    dt_strategy *s = calloc(1, ops->size);
    if (!s) return dt_error(DT_ERR_NOMEM, "strategy %s: out of memory", ops->name);
    s->ops = ops;
    s->c = a->c;
    s->comm = a->comm;
    s->rank = dt_comm_rank(a->comm);
    s->world = dt_comm_size(a->comm);
    s->params = a->params;
    s->grads = a->grads;
    s->n = a->n;
    s->order = a->order;
    s->norder = a->norder;
    s->obs = a->obs;
    s->lo = 0;
    s->hi = a->n;
    int nmax = a->c->grad_accum > a->c->micro_shards ? a->c->grad_accum : a->c->micro_shards;
    s->off = malloc(sizeof(int) * (size_t)(nmax > 0 ? nmax : 1));
    s->len = malloc(sizeof(int) * (size_t)(nmax > 0 ? nmax : 1));
    dt_status st = s->off && s->len ? DT_OK : dt_error(DT_ERR_NOMEM, "strategy %s: out of memory", ops->name);
    if (st == DT_OK) st = ops->init(s);  // sets lo, hi for a sharded state
    if (st == DT_OK) st = dt_optim_create(&s->opt, &a->c->optim, s->hi - s->lo);
    if (st != DT_OK) {
        dt_strategy_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt_strategy_free(dt_strategy *s) {
    if (!s) return;
    if (s->ops->fini) s->ops->fini(s);
    dt_optim_free(s->opt);
    free(s->off);
    free(s->len);
    free(s);
}

void dt_strategy_ckpt_view(dt_strategy *s, dt_ckpt_model *m) {
    m->params = s->params;
    m->nparams = s->n;
    m->nstates = dt_optim_num_states(s->opt);
    for (int j = 0; j < 2; j++) m->states[j] = j < m->nstates ? dt_optim_state(s->opt, j) : NULL;
    m->opt_step = dt_optim_step_count(s->opt);
    m->optimizer = dt_optim_kind_name(s->c->optim.kind);
    m->params_lo = 0;
    m->params_hi = s->n;
    m->states_lo = s->lo;
    m->states_hi = s->hi;
}

int dt_strategy_plan_accum(dt_strategy *s, int first, int share, int global) {
    (void)first;
    int A = s->c->grad_accum, k = 0;
    for (int a = 0; a < A; a++) {
        int lo = (int)((long)share * a / A), hi = (int)((long)share * (a + 1) / A);
        if (hi > lo) {
            s->off[k] = lo;
            s->len[k++] = hi - lo;
        }
    }
    s->nmicro = k;
    s->global = global;
    return k;
}

dt_status dt_strategy_norm_replicated(dt_strategy *s, double *norm) {
    *norm = sqrt(dt_sum_squares(s->grads, s->n));
    return DT_OK;
}

void dt_fixed_add(int64_t *acc, const float *g, size_t n, double scale) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        double x = (double)g[i] * scale;
        acc[i] += (int64_t)llrint(x > 4e18 ? 4e18 : x < -4e18 ? -4e18 : x);
    }
}

dt_status dt_strategy_update_slice(dt_strategy *s, float lr, float scale) {
    dt_optim_begin_step(s->opt);
    dt_optim_update(s->opt, 0, s->hi - s->lo, s->params + s->lo, s->grads + s->lo, lr, scale);
    return DT_OK;
}
