/* Local SGD, the "local-sgd" strategy ([parallel] sync_every = H;
 * strategy.h): every rank holds the whole model and steps on its own, and
 * the parameters are averaged every H steps, so a period of H steps moves
 * one parameter allreduce instead of H gradient allreduces (Stich, "Local
 * SGD converges fast and communicates little", 2019).
 *
 * A local step trains on the rank's share of the global batch alone: the
 * loop scales a micro-batch's loss by len / loss_denom, and plan sets
 * loss_denom to the share, so the rank's gradient is its share's mean (the
 * step a one-process run would take on that share). After the update of
 * every H-th local step the parameters are summed (one fp32 allreduce) and
 * divided by the number of ranks. The optimizer state (momentum, Adam's
 * moments) stays each rank's own and is never averaged; a gradient norm
 * for clipping is the rank's own.
 *
 * [parallel] sync_warmup = S runs the first S steps as plain data parallel
 * (the gradients summed in one allreduce after backward, the loss scaled by
 * the global batch), then switches to local steps: post-local SGD (Lin et
 * al., "Don't use large mini-batches, use local SGD", 2020). Steps are
 * counted by the optimizer's step count, which checkpoints keep, so a
 * resumed run continues the same schedule.
 *
 * The loop calls params_sync (an average when the ranks have diverged)
 * before an evaluation, a checkpoint and the final weights, so those see
 * the mean model; a checkpoint keeps rank 0's optimizer state.
 *
 * With H = 1 and an optimizer whose state is linear in the gradients (SGD,
 * with or without momentum or Nesterov, and weight decay), averaging the
 * parameters after each rank's step is the data-parallel step whenever the
 * shares are equal: the mean of (p - lr m_r) is p - lr mean(m_r), and the
 * mean of the momenta follows the same recurrence as the momentum of the
 * mean gradient. AdamW's per-element normalisation and per-rank clipping
 * are not linear, so there they differ. */
#include "engine/strategies/strategy.h"

#include <stdlib.h>

typedef struct {
    dt_strategy base;
    int local;     // this step is a local one (past the warm-up)
    int64_t t;     // steps taken before this one
    int dirty;     // the ranks' parameters may differ since the last average
} local_sgd;

static int lsgd_wants(const dt_config *c) { return c->sync_every > 0; }

static dt_status lsgd_check(const dt_config *c, int W) {
    if (c->deterministic)
        return dt_error(DT_ERR_CONFIG, "[parallel] sync_every = %d (local SGD) and deterministic = true cannot be combined; "
                                       "set sync_every = 0 for deterministic data parallel",
                        c->sync_every);
    return dt_strategy_dp.check(c, W);
}

static int lsgd_max_micro(const dt_config *c, int W) { return dt_strategy_dp.max_micro(c, W); }

static dt_status lsgd_init(dt_strategy *s) {
    (void)s;
    return DT_OK;
}

static int lsgd_plan(dt_strategy *s, int first, int share, int global) {
    local_sgd *d = (local_sgd *)s;
    d->t = *dt_optim_step_count(s->opt);
    d->local = d->t >= s->c->sync_warmup;
    int k = dt_strategy_plan_accum(s, first, share, global);
    if (d->local && share > 0) s->loss_denom = share;
    return k;
}

// Sums buf[n] over the ranks in place, timed as the step's communication.
static dt_status sum(dt_strategy *s, float *buf, const char *what) {
    double t0 = dt_now();
    dt_status st = dt_allreduce(buf, buf, s->n, DT_F32, DT_SUM, s->comm);
    s->comm_seconds += dt_now() - t0;
    s->comm_exposed_seconds += dt_now() - t0;  // nothing overlaps it
    return st != DT_OK ? dt_error(st, "local SGD: %s allreduce: %s", what, dt_last_error()) : DT_OK;
}

// A warm-up step's gradients are summed; a local step's stay the rank's.
static dt_status lsgd_sync(dt_strategy *s) {
    local_sgd *d = (local_sgd *)s;
    if (s->world == 1 || d->local) return DT_OK;
    return dt_strategy_sum_grads(s, s->comm, "local SGD");
}

static dt_status lsgd_params_sync(dt_strategy *s) {
    local_sgd *d = (local_sgd *)s;
    if (s->world == 1 || !d->dirty) return DT_OK;
    dt_status st = sum(s, s->params, "parameter");
    if (st != DT_OK) return st;
    float inv = 1.0f / (float)s->world;
    float *p = s->params;
    size_t n = s->n;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) p[i] *= inv;
    d->dirty = 0;
    return DT_OK;
}

static dt_status lsgd_update(dt_strategy *s, float lr, float scale) {
    local_sgd *d = (local_sgd *)s;
    dt_status st = dt_strategy_update_slice(s, lr, scale);
    if (st != DT_OK || !d->local) return st;
    d->dirty = 1;
    if ((d->t + 1 - s->c->sync_warmup) % s->c->sync_every) return DT_OK;
    return lsgd_params_sync(s);
}

// A death with spares: every rank goes back to the newest checkpoint,
// whose parameters are the same everywhere (own_state).
static void lsgd_abandon(dt_strategy *s) { ((local_sgd *)s)->dirty = 0; }

const dt_strategy_ops dt_strategy_local_sgd = {
    .name = "local-sgd",
    .size = sizeof(local_sgd),
    .wants = lsgd_wants,
    .check = lsgd_check,
    .max_micro = lsgd_max_micro,
    .init = lsgd_init,
    .plan = lsgd_plan,
    .sync = lsgd_sync,
    .grad_norm = dt_strategy_norm_replicated,
    .update = lsgd_update,
    .params_sync = lsgd_params_sync,
    .own_state = 1,
    .abandon = lsgd_abandon,
};
