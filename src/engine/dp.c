/* Bucketed, overlapped gradient allreduce (see dp.h). */
#include "engine/dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t lo, hi;
    dt_request_t req;
    int started;
} bucket;

struct dt_dp {
    dt_comm_t comm;
    float *grads;
    int nb;
    bucket *b;          // b[0] is the LAST region of the block (done first)
    int next;           // next bucket to start
    dt_status err;
    char errmsg[1024];
    double t_first, t_backward_end, t_done;
};

dt_status dt_dp_create(dt_dp **out, dt_comm_t comm, float *grads, size_t n, size_t bucket_floats) {
    *out = NULL;
    if (bucket_floats == 0) bucket_floats = 1;
    dt_dp *d = calloc(1, sizeof *d);
    if (!d) return dt_error(DT_ERR_NOMEM, "data parallel: out of memory");
    d->comm = comm;
    d->grads = grads;
    d->nb = n ? (int)((n + bucket_floats - 1) / bucket_floats) : 0;
    d->b = calloc(d->nb ? d->nb : 1, sizeof *d->b);
    if (!d->b) {
        free(d);
        return dt_error(DT_ERR_NOMEM, "data parallel: out of memory");
    }
    for (int i = 0; i < d->nb; i++) {
        size_t hi = n - (size_t)i * bucket_floats;
        d->b[i].hi = hi;
        d->b[i].lo = hi > bucket_floats ? hi - bucket_floats : 0;
    }
    *out = d;
    return DT_OK;
}

void dt_dp_free(dt_dp *d) {
    if (!d) return;
    for (int i = 0; i < d->nb; i++)
        if (d->b[i].req) dt_wait(&d->b[i].req);
    free(d->b);
    free(d);
}

int dt_dp_num_buckets(const dt_dp *d) { return d->nb; }

void dt_dp_begin(dt_dp *d) {
    d->next = 0;
    d->err = DT_OK;
    d->t_first = 0;
    for (int i = 0; i < d->nb; i++) d->b[i].started = 0;
}

static void start(dt_dp *d, bucket *b) {
    if (!d->t_first) d->t_first = dt_now();
    b->started = 1;
    if (d->err != DT_OK) return;
    dt_status st = dt_iallreduce(d->grads + b->lo, d->grads + b->lo, b->hi - b->lo, DT_F32, DT_SUM,
                                 d->comm, &b->req);
    if (st != DT_OK) {
        d->err = st;
        snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
        b->req = NULL;
    }
}

void dt_dp_ready(size_t offset, void *dp) {
    dt_dp *d = dp;
    while (d->next < d->nb && d->b[d->next].lo >= offset) start(d, &d->b[d->next++]);
}

dt_status dt_dp_finish(dt_dp *d) {
    d->t_backward_end = dt_now();
    while (d->next < d->nb) start(d, &d->b[d->next++]);
    for (int i = 0; i < d->nb; i++) {
        if (!d->b[i].req) continue;
        dt_status st = dt_wait(&d->b[i].req);
        d->b[i].req = NULL;
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
