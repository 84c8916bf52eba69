/* Bucketed, overlapped gradient allreduce (see dp.h). */
#include "engine/dp.h"
#include "engine/checkpoints.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t lo, hi;      // a contiguous part of the gradient block
    dt_request_t req;
} piece;

typedef struct {
    size_t pos;         // where the bucket starts in the gradient order
    int first, n;       // its pieces
} bucket;

struct dt_dp {
    dt_comm_t comm;
    float *grads;
    int nb;
    bucket *b;          // b[0] is the END of the order (done first)
    piece *p;           // one per bucket when the order is the block itself
    int np;
    int next;           // next bucket to start
    dt_status err;
    char errmsg[1024];
    double t_first, t_backward_end, t_done;
};

// Cuts the order into buckets [pos, pos + bucket_floats) from its end, and
// each bucket into the parts of the ranges it covers (merged where they
// touch in the block).
static void cut(dt_dp *d, size_t n, size_t bucket_floats, const dt_grad_range *order, int norder) {
    int r = norder - 1;                 // the range holding position `at - 1`
    size_t start = n - order[r].len;    // its position in the order
    for (int i = 0; i < d->nb; i++) {
        size_t hi = n - (size_t)i * bucket_floats, lo = hi > bucket_floats ? hi - bucket_floats : 0;
        bucket *b = &d->b[i];
        b->pos = lo;
        b->first = d->np;
        for (size_t at = hi; at > lo;) {
            while (start >= at) start -= order[--r].len;
            size_t from = lo > start ? lo : start;
            size_t plo = order[r].offset + (from - start), phi = order[r].offset + (at - start);
            if (d->np > b->first && d->p[d->np - 1].lo == phi) d->p[d->np - 1].lo = plo;
            else d->p[d->np++] = (piece){plo, phi, NULL};
            at = from;
        }
        b->n = d->np - b->first;
    }
}

dt_status dt_dp_create(dt_dp **out, dt_comm_t comm, float *grads, size_t n, size_t bucket_floats,
                       const dt_grad_range *order, int norder) {
    *out = NULL;
    dt_grad_range whole = {0, n};
    if (!order || norder < 1) {
        order = &whole;
        norder = 1;
    }
    size_t covered = 0;
    for (int i = 0; i < norder; i++) covered += order[i].len;
    if (covered != n)
        return dt_error(DT_ERR_ARG, "data parallel: the gradient order covers %zu of the %zu gradients", covered, n);
    if (bucket_floats == 0) bucket_floats = 1;
    dt_dp *d = calloc(1, sizeof *d);
    if (!d) return dt_error(DT_ERR_NOMEM, "data parallel: out of memory");
    d->comm = comm;
    d->grads = grads;
    d->nb = n ? (int)((n + bucket_floats - 1) / bucket_floats) : 0;
    d->b = calloc(d->nb ? d->nb : 1, sizeof *d->b);
    d->p = calloc((size_t)d->nb + (size_t)norder, sizeof *d->p);  // a range boundary adds a piece
    if (!d->b || !d->p) {
        dt_dp_free(d);
        return dt_error(DT_ERR_NOMEM, "data parallel: out of memory");
    }
    cut(d, n, bucket_floats, order, norder);
    *out = d;
    return DT_OK;
}

void dt_dp_free(dt_dp *d) {
    if (!d) return;
    for (int i = 0; i < d->np; i++)
        if (d->p[i].req) dt_wait(&d->p[i].req);
    free(d->b);
    free(d->p);
    free(d);
}

int dt_dp_num_buckets(const dt_dp *d) { return d->nb; }

void dt_dp_begin(dt_dp *d) {
    d->next = 0;
    d->err = DT_OK;
    d->t_first = 0;
}

static void start(dt_dp *d, const bucket *b) {
    if (!d->t_first) d->t_first = dt_now();
    for (piece *p = d->p + b->first; p < d->p + b->first + b->n && d->err == DT_OK; p++) {
        dt_status st = dt_iallreduce(d->grads + p->lo, d->grads + p->lo, p->hi - p->lo, DT_F32, DT_SUM,
                                     d->comm, &p->req);
        if (st != DT_OK) {
            d->err = st;
            snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
            p->req = NULL;
        }
    }
}

void dt_dp_ready(size_t pos, void *dp) {
    dt_dp *d = dp;
    while (d->next < d->nb && d->b[d->next].pos >= pos) start(d, &d->b[d->next++]);
}

dt_status dt_dp_finish(dt_dp *d) {
    d->t_backward_end = dt_now();
    while (d->next < d->nb) start(d, &d->b[d->next++]);
    for (int i = 0; i < d->np; i++) {
        if (!d->p[i].req) continue;
        dt_status st = dt_wait(&d->p[i].req);
        d->p[i].req = NULL;
        if (st != DT_OK && d->err == DT_OK) {
            d->err = st;
            snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
        }
    }
    d->t_done = dt_now();
    if (!d->t_first) d->t_first = d->t_done;
    if (d->err != DT_OK) return dt_error(d->err, "gradient allreduce: %s", d->errmsg);
    return DT_OK;
}

void dt_dp_last_times(const dt_dp *d, double *window, double *exposed) {
    *window = d->t_done - d->t_first;
    *exposed = d->t_done - (d->t_backward_end > d->t_first ? d->t_backward_end : d->t_first);
}

#define FIXED_SCALE 4294967296.0  // 2^32

void dt_dp_fixed_add(int64_t *acc, const float *g, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        double x = (double)g[i] * FIXED_SCALE;  // clamped: no overflow from a diverging run
        acc[i] += (int64_t)llrint(x > 4e18 ? 4e18 : x < -4e18 ? -4e18 : x);
    }
}

dt_status dt_dp_fixed_reduce(int64_t *acc, float *grads, size_t n, dt_comm_t comm) {
    dt_status st = dt_allreduce(acc, acc, n, DT_I64, DT_SUM, comm);
    if (st != DT_OK) return dt_error(st, "gradient allreduce: %s", dt_last_error());
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) grads[i] = (float)((double)acc[i] / FIXED_SCALE);
    return DT_OK;
}

// ----------------------------------------------------------------------------
// one training step

dt_status dt_dp_check(const dt_config *c, int W) {
    if (c->batch < W) return dt_error(DT_ERR_CONFIG, "[train] batch %d is smaller than the %d workers", c->batch, W);
    if (c->deterministic && c->micro_shards % W)
        return dt_error(DT_ERR_CONFIG, "[parallel] micro_shards (%d) must be a multiple of the %d workers in deterministic mode",
                        c->micro_shards, W);
    return DT_OK;
}

int dt_dp_max_micro(const dt_config *c, int W) {
    int share = (c->batch + W - 1) / W;
    return c->deterministic ? (c->batch + c->micro_shards - 1) / c->micro_shards
                            : (share + c->grad_accum - 1) / c->grad_accum;
}

dt_status dt_dp_step_init(dt_dp_step *s, const dt_config *c, dt_comm_t comm, float *grads, size_t n,
                          const dt_grad_range *order, int norder) {
    memset(s, 0, sizeof *s);
    s->c = c;
    s->comm = comm;
    s->grads = grads;
    s->n = n;
    int nmax = c->deterministic ? c->micro_shards : c->grad_accum;
    s->off = malloc(sizeof(int) * nmax);
    s->len = malloc(sizeof(int) * nmax);
    if (!s->off || !s->len) return dt_error(DT_ERR_NOMEM, "out of memory");
    if (c->deterministic) {
        if (!(s->acc = dt_alloc(sizeof(int64_t) * n))) return DT_ERR_NOMEM;
    } else if (dt_comm_size(comm) > 1) {
        return dt_dp_create(&s->dp, comm, grads, n, (size_t)c->bucket_kb * 1024 / sizeof(float), order, norder);
    }
    return DT_OK;
}

void dt_dp_step_free(dt_dp_step *s) {
    dt_dp_free(s->dp);
    dt_free(s->acc);
    free(s->off);
    free(s->len);
    s->dp = NULL;
    s->acc = NULL;
    s->off = s->len = NULL;
}

// Deterministic mode cuts the global batch into micro_shards fixed shards
// (the same cut for every worker count) and takes those inside the share;
// otherwise the share is cut into grad_accum parts.
int dt_dp_step_begin(dt_dp_step *s, int first, int share, int global) {
    const dt_config *c = s->c;
    int k = 0;
    if (c->deterministic) {
        int M = c->micro_shards;
        for (int j = 0; j < M; j++) {
            int lo = (int)((long)global * j / M), hi = (int)((long)global * (j + 1) / M);
            if (lo >= first && hi <= first + share && hi > lo) {
                s->off[k] = lo - first;
                s->len[k++] = hi - lo;
            }
        }
    } else {
        int A = c->grad_accum;
        for (int a = 0; a < A; a++) {
            int lo = (int)((long)share * a / A), hi = (int)((long)share * (a + 1) / A);
            if (hi > lo) {
                s->off[k] = lo;
                s->len[k++] = hi - lo;
            }
        }
    }
    s->nmicro = k;
    s->global = global;
    s->loss = 0;
    if (s->dp) dt_dp_begin(s->dp);
    return k;
}

dt_grad_ready_fn dt_dp_step_hook(const dt_dp_step *s, int k) {
    return s->dp && k == s->nmicro - 1 ? dt_dp_ready : NULL;
}

void dt_dp_step_micro_end(dt_dp_step *s, int k, float loss) {
    s->loss += (double)loss * s->len[k];
    if (s->acc) {  // each shard's gradient on its own, from zero
        dt_dp_fixed_add(s->acc, s->grads, s->n);
        memset(s->grads, 0, sizeof(float) * s->n);
    }
}

dt_status dt_dp_step_end(dt_dp_step *s, float *loss) {
    dt_status st = DT_OK;
    if (s->acc) {
        st = dt_dp_fixed_reduce(s->acc, s->grads, s->n, s->comm);
        memset(s->acc, 0, sizeof(int64_t) * s->n);
    } else if (s->dp) {
        st = dt_dp_finish(s->dp);
        double win, exposed;
        dt_dp_last_times(s->dp, &win, &exposed);
        s->comm_seconds += win;
        s->comm_exposed_seconds += exposed;
    }
    // The global batch's mean loss, for progress and summary, and whether
    // any rank was asked to stop (so that all stop after this step).
    float lv[3] = {(float)s->loss, (float)dt_run_stop_requested(), s->save_vote};
    if (st == DT_OK) st = dt_obs_allreduce(s->obs, lv, 3, s->comm);
    *loss = lv[0] / (float)s->global;
    s->stop = lv[1] > 0;
    s->save = lv[2] > 0;
    return st;
}

dt_status dt_dp_step_update(dt_dp_step *s, dt_run_ckpt *ck, dt_optim *opt, const dt_schedule *sched, float *params,
                            int64_t step, float *loss, float *lr, float *gnorm) {
    s->save_vote = dt_run_ckpt_vote(ck);
    dt_obs_begin(s->obs, DT_OBS_COMM);
    dt_status st = dt_dp_step_end(s, loss);
    dt_obs_end(s->obs, DT_OBS_COMM);
    if (st != DT_OK)
        return dt_error(st, "rank %d, step %lld: %s", dt_comm_rank(s->comm), (long long)step + 1, dt_last_error());
    dt_obs_begin(s->obs, DT_OBS_OPTIMIZER);
    *gnorm = (float)sqrt(dt_sum_squares(s->grads, s->n));
    float scale = s->c->optim.clip_norm > 0 ? dt_clip_scale(*gnorm, s->c->optim.clip_norm) : 1.0f;
    *lr = dt_schedule_lr(sched, step);
    dt_optim_step(opt, params, s->grads, *lr, scale);
    dt_obs_end(s->obs, DT_OBS_OPTIMIZER);
    return DT_OK;
}
