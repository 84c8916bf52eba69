/* The strategy registry and what the peers share (strategy.h). */
#include "engine/strategies/strategy.h"
#include "dtrain/train.h"
#include "optim/elem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// The one registry: the first strategy that wants the config runs it.
static const dt_strategy_ops *const strategies[] = {
    &dt_strategy_device_zero,
    &dt_strategy_device,
    &dt_strategy_ps,
    &dt_strategy_pipeline,
    &dt_strategy_zero3,
    &dt_strategy_zero_deterministic,
    &dt_strategy_zero,
    &dt_strategy_local_sgd,
    &dt_strategy_dp_deterministic,
    &dt_strategy_dp,
};

const dt_strategy_ops *dt_strategy_for(const dt_config *c) {
    for (size_t i = 0; i < sizeof strategies / sizeof *strategies; i++)
        if (strategies[i]->wants(c)) return strategies[i];
    return &dt_strategy_dp;
}

// The frozen ranges (task.h) that lie in the optimizer's slice [lo, hi).
static dt_status set_frozen(dt_optim *o, const dt_grad_range *r, int n, size_t lo, size_t hi) {
    size_t *v = malloc(sizeof(size_t) * 2 * (size_t)n);
    int k = 0;
    if (!v) return dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        size_t a = r[i].offset > lo ? r[i].offset : lo, b = r[i].offset + r[i].len < hi ? r[i].offset + r[i].len : hi;
        if (a < b) v[2 * k] = a - lo, v[2 * k + 1] = b - a, k++;
    }
    dt_status st = dt_optim_set_frozen(o, v, k);
    free(v);
    return st;
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
    s->order_layer = a->order_layer;
    s->order_split = a->order_split;
    s->matrices = a->matrices;
    s->nmatrices = a->nmatrices;
    s->nwhole = a->nwhole > a->n ? a->nwhole : 0;
    s->part_fill = a->part_fill;
    s->part_take = a->part_take;
    s->part_user = a->part_user;
    s->tied = a->tied;
    s->device = a->device;
    s->replicas = a->replicas;
    s->tensor_group = a->tensor_group;
    s->obs = a->obs;
    s->all = a->all ? a->all : a->comm;
    s->lo = 0;
    s->hi = a->n;
    s->loss_scale = 1.0f;
    int nmax = a->c->grad_accum > a->c->micro_shards ? a->c->grad_accum : a->c->micro_shards;
    s->off = malloc(sizeof(int) * (size_t)(nmax > 0 ? nmax : 1));
    s->len = malloc(sizeof(int) * (size_t)(nmax > 0 ? nmax : 1));
    s->seg_len = malloc(sizeof(int) * (size_t)(nmax > 0 ? nmax : 1));
    dt_status st = s->off && s->len && s->seg_len ? DT_OK : dt_error(DT_ERR_NOMEM, "strategy %s: out of memory", ops->name);
    if (st == DT_OK) st = ops->init(s);  // sets lo, hi for a sharded state
    const char *dir = a->c->offload ? a->c->offload_dir : NULL;  // [parallel] offload = disk
    if (st == DT_OK) st = dt_optim_create_at(&s->opt, &a->c->optim, s->hi - s->lo, dir);
    if (st == DT_OK && a->nfrozen) st = set_frozen(s->opt, a->frozen, a->nfrozen, s->lo, s->hi);
    if (st == DT_OK && s->nwhole) st = dt_strategy_ckpt_slices(s);
    if (st != DT_OK) {
        dt_strategy_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

dt_status dt_strategy_ckpt_slices(dt_strategy *s) {
    if (s->ckpt_params) return DT_OK;
    if (!s->nwhole) s->nwhole = s->n;
    dt_shard_range(s->nwhole, s->rank, s->world, &s->ckpt_lo, &s->ckpt_hi);
    if (s->ops->ckpt_save && dt_memory_ckpt_pieces(s->c, s->world)) {  // written a piece at a time: no slice
        s->ckpt_pieces = 1;
        s->ckpt_saves = 1;
        return DT_OK;
    }
    size_t len = s->ckpt_hi - s->ckpt_lo + 1;
    s->ckpt_params = dt_alloc(sizeof(float) * len);
    for (int j = 0; j < dt_optim_num_states(s->opt) && j < 2; j++) s->ckpt_states[j] = dt_alloc(sizeof(float) * len);
    if (!s->ckpt_params || (dt_optim_num_states(s->opt) > 0 && !s->ckpt_states[0]) ||
        (dt_optim_num_states(s->opt) > 1 && !s->ckpt_states[1]))
        return dt_error(DT_ERR_NOMEM, "strategy %s: out of memory for the checkpoint's slice", s->ops->name);
    return DT_OK;
}

void dt_strategy_free(dt_strategy *s) {
    if (!s) return;
    if (s->ops->fini) s->ops->fini(s);
    dt_optim_free(s->opt);
    dt_free(s->ckpt_params);
    for (int j = 0; j < 2; j++) dt_free(s->ckpt_states[j]);
    free(s->wire);
    free(s->off);
    free(s->len);
    free(s->seg_len);
    free(s);
}

// dt_ckpt_model's extra: the strategy's own state.
static int ckpt_extra(void *user, dt_st_tensor *t, int max) {
    dt_strategy *s = user;
    return s->ops->ckpt_extra(s, t, max);
}

void dt_strategy_ckpt_view(dt_strategy *s, dt_ckpt_model *m) {
    m->params = s->params + (s->params_sliced ? s->lo : 0);  // params[0] is element params_lo
    m->nparams = s->n;
    m->nstates = dt_optim_num_states(s->opt);
    for (int j = 0; j < 2; j++) m->states[j] = j < m->nstates ? dt_optim_state(s->opt, j) : NULL;
    m->opt_step = dt_optim_step_count(s->opt);
    m->optimizer = dt_optim_kind_name(s->c->optim.kind);
    m->params_lo = s->params_sliced ? s->lo : 0;
    m->params_hi = s->params_sliced ? s->hi : s->n;
    m->states_lo = s->lo;
    m->states_hi = s->hi;
    m->extra = s->ops->ckpt_extra && s->ops->ckpt_extra(s, NULL, 0) > 0 ? ckpt_extra : NULL;
    m->extra_user = s;
    if (s->ckpt_params || s->ckpt_pieces) {  // parts: this rank's slice of the whole model, staged (or none:
                                              // in pieces, the strategy's ckpt_save and ckpt_restore)
        m->params = s->ckpt_params;
        m->nparams = s->nwhole;
        for (int j = 0; j < m->nstates; j++) m->states[j] = s->ckpt_states[j];
        m->params_lo = m->states_lo = s->ckpt_lo;
        m->params_hi = m->states_hi = s->ckpt_hi;
        m->stable = 1;  // (ckpt_stage changes the slice only after the write in flight: the loop waits)
        m->state_only = s->ckpt_pieces;
    }
    // [checkpoint] staging = pieces (or auto under a cap) of a ZeRO rank:
    // its slice written from the live buffers, no snapshot, each save
    // waiting for its write (ckpt_live).
    s->ckpt_live = !s->ops->ckpt_save && s->world > 1 && s->c->zero > 0 && dt_memory_ckpt_pieces(s->c, s->world);
    if (s->ckpt_live) m->stable = 1;
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

int dt_strategy_plan_shards(dt_strategy *s, int first, int share, int global) {
    int M = s->c->micro_shards, k = 0;
    for (int j = 0; j < M; j++) {
        int lo = (int)((long)global * j / M), hi = (int)((long)global * (j + 1) / M);
        if (lo >= first && hi <= first + share && hi > lo) {
            s->off[k] = lo - first;
            s->len[k++] = hi - lo;
        }
    }
    s->nseg = 0;
    if (k > 0 && dt_layers_have_batchnorm(s->c->layers, s->c->nlayers)) {  // (batch norm: the segments of one)
        memcpy(s->seg_len, s->len, sizeof(int) * (size_t)k);
        s->nseg = k;
        s->len[0] = s->off[k - 1] + s->len[k - 1] - s->off[0];
        k = 1;
    }
    s->nmicro = k;
    s->global = global;
    return k;
}

uint16_t *dt_strategy_wire(dt_strategy *s) {
    if (!s->wire && !(s->wire = malloc(sizeof(uint16_t) * (s->n ? s->n : 1))))
        dt_error(DT_ERR_NOMEM, "strategy %s: out of memory for %zu bf16 gradients", s->ops->name, s->n);
    return s->wire;
}

dt_status dt_strategy_sum_grads(dt_strategy *s, dt_comm_t comm, const char *who) {
    double t0 = dt_now();
    dt_status st;
    if (s->c->grad_dtype) {
        uint16_t *w = dt_strategy_wire(s);
        if (!w) return DT_ERR_NOMEM;
        dt_from_f32(w, s->grads, s->n, DT_BF16);
        st = dt_allreduce(w, w, s->n, DT_BF16, DT_SUM, comm);
        if (st == DT_OK) dt_to_f32(s->grads, w, s->n, DT_BF16);
    } else {
        st = dt_allreduce(s->grads, s->grads, s->n, DT_F32, DT_SUM, comm);
    }
    double t = dt_now() - t0;
    s->comm_seconds += t;
    s->comm_exposed_seconds += t;
    return st != DT_OK ? dt_error(st, "%s: gradient allreduce: %s", who, dt_last_error()) : DT_OK;
}

dt_status dt_strategy_norm_replicated(dt_strategy *s, double *norm) {
    *norm = sqrt(dt_sum_squares(s->grads, s->n));
    return DT_OK;
}

void dt_fixed_add(int64_t *acc, const float *g, size_t n, double scale) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        acc[i] += dt_fixed_of(g[i], scale);
    }
}

dt_status dt_strategy_update_slice(dt_strategy *s, float lr, float scale) {
    dt_optim_begin_step(s->opt);
    dt_optim_update(s->opt, 0, s->hi - s->lo, s->params + s->lo, s->grads + s->lo, lr, scale);
    return DT_OK;
}

void dt_fixed_to_float(float *g, const int64_t *acc, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) g[i] = dt_fixed_value(acc[i]);
}

// dt_sum_squares's blocks (DT_SUMSQ_BLOCK, optim.c) are summed here slice
// by slice.

dt_status dt_strategy_norm_sharded(dt_strategy *s, double *norm) {
    if (s->world == 1) return dt_strategy_norm_replicated(s, norm);
    return dt_norm_sharded(s->grads + s->lo, s->n, s->lo, s->hi, s->comm, norm);
}

// The host's slice's pieces (dt_norm_parts_fn).
static dt_status host_parts(void *slice, size_t n, size_t first, double carry, double *part) {
    dt_sum_squares_parts(slice, n, first, carry, part);
    return DT_OK;
}

dt_status dt_norm_sharded(const float *slice, size_t n, size_t lo, size_t hi, dt_comm_t comm, double *norm) {
    if (dt_comm_size(comm) == 1) {
        *norm = sqrt(dt_sum_squares(slice, n));
        return DT_OK;
    }
    return dt_norm_sharded_by(host_parts, (void *)slice, n, lo, hi, comm, norm);
}

dt_status dt_norm_sharded_by(dt_norm_parts_fn parts, void *user, size_t n, size_t lo, size_t hi, dt_comm_t comm,
                             double *norm) {
    size_t B = DT_SUMSQ_BLOCK, nb = (n + B - 1) / B;
    int W = dt_comm_size(comm), r = dt_comm_rank(comm);
    *norm = 0;
    // Blocks each rank closes (holds the last element of), in rank order.
    size_t *counts = malloc(sizeof(size_t) * 2 * (size_t)W);
    double *part = malloc(sizeof(double) * (nb + 1));
    dt_status st = DT_OK;
    if (!counts || !part) {
        st = dt_error(DT_ERR_NOMEM, "gradient norm: out of memory");
        goto done;
    }
    size_t *displs = counts + W;
    for (int p = 0; p < W; p++) {
        size_t a, b;
        dt_shard_range(n, p, W, &a, &b);
        size_t from = a / B, to = b == n ? nb : b / B;
        counts[p] = b > a ? to - from : 0;
        displs[p] = p ? displs[p - 1] + counts[p - 1] : 0;
    }
    // The partial sum of a block cut at lo comes from the rank before (a
    // double sent as its 8 bytes: no reduction touches it).
    double carry = 0;
    if (lo < n && lo % B && (st = dt_recv(&carry, 1, DT_I64, r - 1, comm)) != DT_OK) goto comm;
    double *mine = part + displs[r];  // (an open last piece is sent on, not gathered)
    size_t np = hi > lo ? (lo % B + (hi - lo) + B - 1) / B : 0;
    if (np && (st = parts(user, hi - lo, lo % B, carry, mine)) != DT_OK) goto done;
    if (np) carry = hi % B && hi != n ? mine[np - 1] : 0;
    if (hi < n && hi % B && (st = dt_send(&carry, 1, DT_I64, r + 1, comm)) != DT_OK) goto comm;
    if ((st = dt_allgatherv(mine, counts[r], part, counts, displs, DT_I64, comm)) != DT_OK) goto comm;
    double sum = 0;
    for (size_t b = 0; b < nb; b++) sum += part[b];
    *norm = sqrt(sum);
    goto done;
comm:
    st = dt_error(st, "gradient norm: %s", dt_last_error());
done:
    free(counts);
    free(part);
    return st;
}

// Bucket i is [pos, pos + bucket_floats) of the order, from its end; each
// is cut into the parts of the ranges it covers (merged where they touch in
// the block).
static void cut(dt_grad_buckets *g, size_t n, size_t bucket_floats, const dt_grad_range *order, int norder) {
    int r = norder - 1;                 // the range holding position `at - 1`
    size_t start = n - order[r].len;    // its position in the order
    for (int i = 0; i < g->nb; i++) {
        size_t hi = n - (size_t)i * bucket_floats, lo = hi > bucket_floats ? hi - bucket_floats : 0;
        dt_grad_bucket *b = &g->b[i];
        b->pos = lo;
        b->first = g->np;
        for (size_t at = hi; at > lo;) {
            while (start >= at) start -= order[--r].len;
            size_t from = lo > start ? lo : start;
            size_t plo = order[r].offset + (from - start), phi = order[r].offset + (at - start);
            if (g->np > b->first && g->p[g->np - 1].lo == phi) g->p[g->np - 1].lo = plo;
            else g->p[g->np++] = (dt_grad_piece){plo, phi, NULL};
            at = from;
        }
        b->n = g->np - b->first;
    }
}

dt_status dt_grad_buckets_cut(dt_grad_buckets *g, const dt_strategy *s, size_t bucket_floats, const char *who) {
    size_t n = s->n;
    dt_grad_range whole = {0, n};
    const dt_grad_range *order = s->order;
    int norder = s->norder;
    if (!order || norder < 1) {
        order = &whole;
        norder = 1;
    }
    size_t covered = 0;
    for (int i = 0; i < norder; i++) covered += order[i].len;
    if (covered != n) return dt_error(DT_ERR_ARG, "%s: the gradient order covers %zu of the %zu gradients", who, covered, n);
    if (bucket_floats == 0) bucket_floats = 1;
    *g = (dt_grad_buckets){.nb = n ? (int)((n + bucket_floats - 1) / bucket_floats) : 0};
    g->b = calloc(g->nb ? g->nb : 1, sizeof *g->b);
    g->p = calloc((size_t)g->nb + (size_t)norder, sizeof *g->p);  // a range boundary adds a piece
    if (!g->b || !g->p) return dt_error(DT_ERR_NOMEM, "%s: out of memory", who);
    cut(g, n, bucket_floats, order, norder);
    return DT_OK;
}

void dt_grad_buckets_free(dt_grad_buckets *g) {
    free(g->b);
    free(g->p);
    *g = (dt_grad_buckets){0};
}

static int in_block(const int *order_layer, int L, int i, int l) {
    int ly = order_layer[i];
    return l < 0 ? ly < 0 || ly >= L : ly == l;
}

int dt_layer_spans(const dt_grad_range *o, int no, const int *order_layer, int L, int l, size_t *sp) {
    int n = 0;
    for (size_t at = 0;;) {  // the next range at or above `at`, joined with those it touches
        size_t a = SIZE_MAX, e = 0;
        for (int i = 0; i < no; i++)
            if (in_block(order_layer, L, i, l) && o[i].len && o[i].offset >= at && o[i].offset < a)
                a = o[i].offset, e = a + o[i].len;
        if (a == SIZE_MAX) return n;
        for (int more = 1; more;) {  // (ranges never overlap)
            more = 0;
            for (int i = 0; i < no; i++)
                if (in_block(order_layer, L, i, l) && o[i].offset == e && o[i].len) e += o[i].len, more = 1;
        }
        sp[2 * n] = a, sp[2 * n + 1] = e, n++;
        at = e;
    }
}
