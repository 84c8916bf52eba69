/* Replicated data parallel, the "dp" strategy (strategy.h): every rank
 * holds the whole model and optimizer state; the gradients are summed in
 * buckets while backward runs.
 *
 * The gradients are taken in the model's gradient order: a list of ranges of
 * the block whose concatenation backward finishes from its end (for a
 * classifier, the block itself: order NULL; for the GPT, its slices layer by
 * layer, dt_gpt_grad_order). The order is cut into buckets of about
 * [parallel] bucket_kb, from its end towards its start; a bucket is one piece
 * of the block, or several where it spans ranges that do not touch. During
 * the last micro-batch's backward, the model's grad hook reports how far the
 * final part of the order has grown; every bucket wholly inside it is handed
 * to the gradient codec at once (engine/codecs/codec.h: for fp32, one dt_iallreduce
 * per piece on the communicator's progress thread), so that its transfer
 * overlaps the rest of backward. sync() starts what is left and finishes
 * every piece. Gradients already carry the weight local / global batch (the
 * loop's loss scale), so the SUM is the global mean.
 *
 * A recommender's tables under tensor parallel ([recsys] shard = workers):
 * each rank holds a shard of their rows (engine/tables.h's dt_tp_tables:
 * an all-to-all of a step's rows and their gradients) beside the
 * replicated MLPs, and its shard goes into its own file of the sharded
 * checkpoints (ckpt_extra). */
#include "engine/codecs/codec.h"
#include "engine/dynbatch.h"
#include "engine/strategies/strategy.h"
#include "engine/tables.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_strategy base;
    dt_codec *codec;
    dt_grad_buckets g;  // the order's buckets, g.b[0] its END (done first)
    int next;           // next bucket to start
    int armed;          // buckets are started during this step's last backward
    dt_status err;
    char errmsg[1024];
    double t_first, t_backward_end, t_done;
    dt_tp_tables *tables;  // [recsys] shard = workers: this rank's shard of the tables (NULL: none)
} dp;

static dt_status dp_init(dt_strategy *s) {
    dp *d = (dp *)s;
    if (dt_tables_on_workers(s->c)) {  // (one rank: all the rows)
        dt_status st = dt_tp_tables_create(&d->tables, s->c, s->comm);
        if (st != DT_OK) return st;
    }
    if (s->world == 1) return DT_OK;  // one rank: nothing to sum
    dt_status st = dt_grad_buckets_cut(&d->g, s, (size_t)s->c->bucket_kb * 1024 / sizeof(float), "data parallel");
    return st == DT_OK ? dt_codec_create(&d->codec, s->c, s->comm, s->n, s->matrices, s->nmatrices) : st;
}

static void dp_fini(dt_strategy *s) {
    dp *d = (dp *)s;
    for (int i = 0; i < d->g.np; i++)
        if (d->g.p[i].req) dt_wait(&d->g.p[i].req);
    dt_codec_free(d->codec);
    dt_tp_tables_free(d->tables);
    dt_grad_buckets_free(&d->g);
}

static int dp_plan(dt_strategy *s, int first, int share, int global) {
    dp *d = (dp *)s;
    d->next = 0;
    d->err = DT_OK;
    d->t_first = 0;
    return dt_strategy_plan_accum(s, first, share, global);
}

static void start(dp *d, const dt_grad_bucket *b) {
    if (!d->t_first) d->t_first = dt_now();
    for (dt_grad_piece *p = d->g.p + b->first; p < d->g.p + b->first + b->n && d->err == DT_OK; p++) {
        dt_status st = d->codec->ops->start(d->codec, d->base.grads, p->lo, p->hi, &p->req);
        if (st != DT_OK) {
            d->err = st;
            snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
            p->req = NULL;
        }
    }
}

// The model's grad hook: gradients at positions >= pos of the order are final.
static void ready(size_t pos, void *user) {
    dp *d = user;
    while (d->next < d->g.nb && d->g.b[d->next].pos >= pos) start(d, &d->g.b[d->next++]);
}

static dt_grad_ready_fn dp_grad_hook(dt_strategy *s, int k, void **user) {
    *user = s;
    return s->world > 1 && k == s->nmicro - 1 ? ready : NULL;
}

static dt_status dp_sync(dt_strategy *s) {
    dp *d = (dp *)s;
    if (s->world == 1) return DT_OK;
    d->t_backward_end = dt_now();
    while (d->next < d->g.nb) start(d, &d->g.b[d->next++]);
    for (int i = 0; i < d->g.np; i++) {
        dt_grad_piece *p = &d->g.p[i];
        if (!p->req) continue;
        dt_status st = d->codec->ops->finish(d->codec, s->grads, p->lo, p->hi, &p->req);
        p->req = NULL;
        if (st != DT_OK && d->err == DT_OK) {
            d->err = st;
            snprintf(d->errmsg, sizeof d->errmsg, "%s", dt_last_error());
        }
    }
    d->t_done = dt_now();
    if (!d->t_first) d->t_first = d->t_done;
    s->comm_seconds += d->t_done - d->t_first;
    s->comm_exposed_seconds += d->t_done - (d->t_backward_end > d->t_first ? d->t_backward_end : d->t_first);
    if (d->err != DT_OK) return dt_error(d->err, "gradient allreduce: %s", d->errmsg);
    return DT_OK;
}

// The codec's state in checkpoints (one worker has no codec, and no
// state), then this rank's shard of the tables.
static int dp_ckpt_extra(dt_strategy *s, dt_st_tensor *t, int max) {
    dp *d = (dp *)s;
    int n = d->codec ? dt_codec_state(d->codec, t, max) : 0;
    if (n < 0 || !d->tables) return n;
    int m = dt_tp_tables_tensors(d->tables, t && n < max ? t + n : NULL, t ? max - n : 0);
    return n + m;
}

static dt_status dp_ckpt_restore(dt_strategy *s, const char *path, int parts) {
    dp *d = (dp *)s;
    dt_status st = d->codec ? dt_codec_restore(d->codec, path, parts) : DT_OK;
    return st == DT_OK && d->tables ? dt_tp_tables_restore(d->tables, path) : st;
}

static dt_status dp_rows_pull(dt_strategy *s, const int64_t *ids, size_t n, float *vals) {
    dp *d = (dp *)s;
    if (!d->tables) return dt_error(DT_ERR_CONFIG, "strategy dp holds no tables ([recsys] shard = workers)");
    return dt_tp_tables_pull(d->tables, ids, n, vals);
}

static dt_status dp_rows_push(dt_strategy *s, const int64_t *ids, size_t n, const float *g) {
    dp *d = (dp *)s;
    if (!d->tables) return dt_error(DT_ERR_CONFIG, "strategy dp holds no tables ([recsys] shard = workers)");
    return dt_tp_tables_push(d->tables, ids, n, g);
}

// summary.json: the tables under tensor parallel, as the servers' are
// (ps.c): bytes a step, the rows asked of each worker, their balance.
static void dp_summary(dt_strategy *s, cJSON *o) {
    dp *d = (dp *)s;
    if (!d->tables) return;
    double bytes, bal, *per = calloc((size_t)s->world, sizeof *per);
    if (!per) return;
    dt_tp_tables_stats(d->tables, &bytes, per, &bal);
    cJSON *t = cJSON_AddObjectToObject(o, "tables");
    cJSON_AddStringToObject(t, "shard", "workers");
    cJSON_AddStringToObject(t, "placement", s->c->rs_placement ? "hash" : "range");
    cJSON_AddNumberToObject(t, "table_bytes_per_step", bytes);
    cJSON *a = cJSON_AddArrayToObject(t, "table_rows_per_worker");
    for (int j = 0; j < s->world; j++) cJSON_AddItemToArray(a, cJSON_CreateNumber(per[j]));
    cJSON_AddNumberToObject(t, "table_balance", bal);
    free(per);
}

static int dp_wants(const dt_config *c) { return !c->deterministic; }

static dt_status dp_check(const dt_config *c, int W) {
    if (c->batch < W) return dt_error(DT_ERR_CONFIG, "[train] batch %d is smaller than the %d workers", c->batch, W);
    return DT_OK;
}

static int dp_max_micro(const dt_config *c, int W) {
    int share = c->dynamic_batch ? dt_dynbatch_max_share(c->batch, W) : (c->batch + W - 1) / W;
    return (share + c->grad_accum - 1) / c->grad_accum;
}

const dt_strategy_ops dt_strategy_dp = {
    .name = "dp",
    .size = sizeof(dp),
    .wants = dp_wants,
    .check = dp_check,
    .max_micro = dp_max_micro,
    .init = dp_init,
    .fini = dp_fini,
    .plan = dp_plan,
    .grad_hook = dp_grad_hook,
    .sync = dp_sync,
    .grad_norm = dt_strategy_norm_replicated,
    .update = dt_strategy_update_slice,
    .ckpt_extra = dp_ckpt_extra,
    .ckpt_restore = dp_ckpt_restore,
    .rows_pull = dp_rows_pull,
    .rows_push = dp_rows_push,
    .summary = dp_summary,
    .replicated = 1, /* but a compressing codec's state is each rank's own: dt_train_check_spares */
};
