/* Deterministic data parallel, the "dp-deterministic" strategy
 * ([parallel] deterministic = true; strategy.h): bitwise the same result for
 * any number of ranks.
 *
 * The global batch is cut into [parallel] micro_shards fixed shards, the
 * same cut for every worker count, and a rank runs the shards inside its
 * share as its micro-batches. Each shard's gradient goes on its own into
 * int64 fixed-point sums (round(g * 2^32)); one int64 SUM allreduce then
 * adds the ranks' sums. Integer addition is associative, so the result does
 * not depend on how the shards were spread over the ranks or in what order
 * they were added. The state stays replicated, as in "dp".
 *
 * A model with batch norm normalises over the whole global batch (sync_bn,
 * which the config requires here): a rank's shards then run together as
 * one micro-batch whose segments are the shards (dt_model_set_segments),
 * each shard's gradient still going into the sums on its own. */
#include "engine/strategies/strategy.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_strategy base;
    int64_t *acc;  // the fixed-point sums of this rank's shards
} dp_det;

static int det_wants(const dt_config *c) { return c->deterministic; }

static dt_status det_check(const dt_config *c, int W) {
    dt_status st = dt_strategy_dp.check(c, W);
    if (st != DT_OK) return st;
    if (c->micro_shards % W)
        return dt_error(DT_ERR_CONFIG, "[parallel] micro_shards (%d) must be a multiple of the %d workers in deterministic mode",
                        c->micro_shards, W);
    return DT_OK;
}

static int det_max_micro(const dt_config *c, int W) {
    int shard = (c->batch + c->micro_shards - 1) / c->micro_shards;
    return dt_layers_have_batchnorm(c->layers, c->nlayers) ? shard * (c->micro_shards / W) : shard;
}

static dt_status det_init(dt_strategy *s) {
    dp_det *d = (dp_det *)s;
    if (!(d->acc = dt_alloc(sizeof(int64_t) * (s->n ? s->n : 1)))) return DT_ERR_NOMEM;
    s->fixed = d->acc;
    return DT_OK;
}

static void det_fini(dt_strategy *s) { dt_free(((dp_det *)s)->acc); }

// Each shard's gradient on its own, from zero.
static void det_micro_end(dt_strategy *s, int k) {
    (void)k;
    dt_fixed_add(((dp_det *)s)->acc, s->grads, s->n, DT_FIXED_SCALE);
    memset(s->grads, 0, sizeof(float) * s->n);
}

static dt_status det_sync(dt_strategy *s) {
    int64_t *acc = ((dp_det *)s)->acc;
    size_t n = s->n;
    double t0 = dt_now();
    dt_status st = dt_allreduce(acc, acc, n, DT_I64, DT_SUM, s->comm);
    if (st == DT_OK) dt_fixed_to_float(s->grads, acc, n);
    memset(acc, 0, sizeof(int64_t) * n);
    if (s->world > 1) {  // all of it exposed: nothing overlaps backward
        s->comm_seconds += dt_now() - t0;
        s->comm_exposed_seconds += dt_now() - t0;
    }
    return st != DT_OK ? dt_error(st, "gradient allreduce: %s", dt_last_error()) : DT_OK;
}

const dt_strategy_ops dt_strategy_dp_deterministic = {
    .name = "dp-deterministic",
    .size = sizeof(dp_det),
    .wants = det_wants,
    .check = det_check,
    .max_micro = det_max_micro,
    .init = det_init,
    .fini = det_fini,
    .plan = dt_strategy_plan_shards,
    .micro_end = det_micro_end,
    .sync = det_sync,
    .grad_norm = dt_strategy_norm_replicated,
    .update = dt_strategy_update_slice,
    .replicated = 1,
};
