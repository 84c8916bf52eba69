/* The recommender task (task.h; docs/recommender.md): click logs ->
 * dt_dlrm -> logistic loss; the test log's loss and AUC at the end of
 * every epoch.
 *
 * Where the embedding tables live. Without parameter servers (one
 * process, data parallel) and with [recsys] sparse = false they are an
 * ordinary part of the block, after the MLPs (one tensor a table), trained
 * by the run's optimizer like every parameter: a step's gradient is dense
 * over them. With [parallel] servers and sparse = true (the default) they
 * are on the servers, a row range each (ps/rows.c), and the block is the
 * MLPs alone: for each step the task lists the distinct rows its share
 * touches (global numbering: table t's row r is offset(t) + r), the loop
 * has the strategy pull them into `vals` before the forward and push
 * their gradients `rgrad` after the backward, and the servers apply the
 * tables' own optimizer ([recsys] table_optim) to those rows. */
#include "dtrain/launch.h"
#include "dtrain/recsys.h"
#include "dtrain/train.h"
#include "engine/tables.h"
#include "engine/tasks/task.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_task {
    const dt_config *c;
    const dt_dlrm_spec *sp;
    dt_clicks train, test;
    dt_dlrm *m;
    int remote;                   // the tables are on the servers
    int64_t R;                    // rows of all tables
    int T, dim;
    size_t mlp, np;               // the MLPs' floats (the block's start), the block's
    float *params, *grads;        // the block: the MLPs' (the model's own), then the tables when local
    dt_tensor_info *tinfo;
    dt_grad_range *order;
    char (*tname)[32];
    int nt;
    int rank, W;
    uint32_t *perm;               // this epoch's order of the training records
    int64_t spe, batch;           // steps an epoch, the next batch of the epoch
    int first, share, global;     // this step's share of the global batch
    const uint32_t *rec;          // its records (into train)
    // this step's rows: ids[nids] distinct and sorted, pos[share, T] each lookup's place among them
    int64_t *ids;
    size_t nids;
    int32_t *pos;
    float *vals, *rgrad;          // [nids, dim]: pulled rows, their gradients (remote)
    float *emb, *demb, *dense;    // [maxB, T, dim], [maxB, T, dim], [maxB, ndense]
    uint8_t *lab;
    int off, len;                 // the micro-batch in flight
    float scale;
    dt_task_rows_fn pull;         // the rows from wherever they live (remote: the strategy's)
    void *pull_user;
    int maxB;
    double last_auc;
};

// ----------------------------------------------------------------------------
// rows: a share's distinct rows and the lookups' places among them

typedef struct {
    int64_t id;
    int32_t k;
} keyed;

static int by_id(const void *a, const void *b) {
    int64_t x = ((const keyed *)a)->id, y = ((const keyed *)b)->id;
    return (x > y) - (x < y);
}

// The rows of records rec[0, n) of ds into t->ids / t->pos.
static dt_status gather_ids(dt_task *t, const dt_clicks *ds, const uint32_t *rec, int n) {
    size_t k = (size_t)n * t->T;
    keyed *v = malloc(sizeof *v * (k + 1));
    if (!v) return dt_error(DT_ERR_NOMEM, "the batch's rows: out of memory");
    for (int b = 0; b < n; b++)
        for (int j = 0; j < t->T; j++)
            v[(size_t)b * t->T + j] = (keyed){dt_dlrm_row_offset(t->sp, j) + ds->ids[(size_t)rec[b] * t->T + j],
                                              (int32_t)((size_t)b * t->T + j)};
    qsort(v, k, sizeof *v, by_id);
    t->nids = 0;
    for (size_t i = 0; i < k; i++) {
        if (i == 0 || v[i].id != v[i - 1].id) t->ids[t->nids++] = v[i].id;
        t->pos[v[i].k] = (int32_t)(t->nids - 1);
    }
    free(v);
    return DT_OK;
}

// Local tables: the rows out of the block.
static dt_status local_rows(void *user, const int64_t *ids, size_t n, float *vals) {
    dt_task *t = user;
    for (size_t i = 0; i < n; i++)
        memcpy(vals + i * t->dim, t->params + t->mlp + (size_t)ids[i] * t->dim, sizeof(float) * t->dim);
    return DT_OK;
}

// Records rec[0, n) of ds into the model's inputs: dense, labels and the
// looked-up rows (from t->vals through t->pos).
static void inputs(dt_task *t, const dt_clicks *ds, const uint32_t *rec, int n, const int32_t *pos) {
    int nd = ds->ndense;
    for (int b = 0; b < n; b++) {
        memcpy(t->dense + (size_t)b * nd, ds->dense + (size_t)rec[b] * nd, sizeof(float) * nd);
        t->lab[b] = ds->label[rec[b]];
        for (int j = 0; j < t->T; j++)
            memcpy(t->emb + ((size_t)b * t->T + j) * t->dim, t->vals + (size_t)pos[b * t->T + j] * t->dim,
                   sizeof(float) * t->dim);
    }
}

// ----------------------------------------------------------------------------
// create

static int rs_wants(const dt_config *c) { return c->recsys; }

static void rs_destroy(dt_task *t) {
    if (!t) return;
    dt_clicks_free(&t->train);
    dt_clicks_free(&t->test);
    if (!t->remote) dt_free(t->params), dt_free(t->grads);
    free(t->tinfo);
    free(t->order);
    free(t->tname);
    free(t->perm);
    free(t->ids);
    free(t->pos);
    dt_free(t->vals);
    dt_free(t->rgrad);
    dt_free(t->emb);
    dt_free(t->demb);
    dt_free(t->dense);
    free(t->lab);
    dt_dlrm_free(t->m);
    free(t);
}

// The block and its tensors: the MLPs' (the model's), then with local
// tables one tensor a table ("emb.T.weight", [rows, dim]).
static dt_status rs_block(dt_task *t, const dt_config *c) {
    int nm = dt_dlrm_num_tensors(t->m);
    t->mlp = dt_dlrm_num_params(t->m);
    t->nt = nm + (t->remote ? 0 : t->T);
    t->tinfo = calloc((size_t)t->nt, sizeof *t->tinfo);
    t->order = calloc((size_t)t->nt, sizeof *t->order);
    t->tname = calloc((size_t)t->nt, sizeof *t->tname);
    if (!t->tinfo || !t->order || !t->tname) return dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nm; i++) t->tinfo[i] = *dt_dlrm_tensor(t->m, i);
    if (t->remote) {
        t->params = dt_dlrm_params(t->m);
        t->grads = dt_dlrm_grads(t->m);
        t->np = t->mlp;
    } else {  // a block of its own: the model's MLPs copied in and pointed at (they start it)
        t->np = t->mlp + (size_t)t->R * t->dim;
        t->params = dt_alloc(sizeof(float) * t->np);
        t->grads = dt_alloc(sizeof(float) * t->np);
        if (!t->params || !t->grads)
            return dt_error(DT_ERR_NOMEM, "the tables in the block: %zu floats: out of memory", t->np);
        dt_dlrm_init_rows(t->params + t->mlp, 0, t->R, t->dim, c->seed);
        for (int j = 0; j < t->T; j++) {
            snprintf(t->tname[nm + j], sizeof t->tname[0], "emb.%d.weight", j);
            t->tinfo[nm + j] = (dt_tensor_info){t->tname[nm + j], 2, {t->sp->rows[j], t->dim},
                                                t->mlp + (size_t)dt_dlrm_row_offset(t->sp, j) * t->dim,
                                                (size_t)t->sp->rows[j] * t->dim};
        }
    }
    memcpy(t->params, dt_dlrm_params(t->m), sizeof(float) * t->mlp);
    for (int i = 0; i < t->nt; i++) t->order[i] = (dt_grad_range){t->tinfo[i].offset, t->tinfo[i].numel};
    return DT_OK;
}

// The MLPs run on the task's block: their values copied in before a
// forward, their gradients out after a backward (local tables: the
// model's own block is the block's start).
static void to_model(dt_task *t) {
    if (!t->remote) memcpy(dt_dlrm_params(t->m), t->params, sizeof(float) * t->mlp);
}

static dt_status rs_buffers(dt_task *t, int maxB) {
    size_t k = (size_t)maxB * t->T, row = sizeof(float) * t->dim;
    t->maxB = maxB;
    t->ids = malloc(sizeof(int64_t) * k);
    t->pos = malloc(sizeof(int32_t) * k);
    t->vals = dt_alloc(row * k);
    t->rgrad = dt_alloc(row * k);
    t->emb = dt_alloc(row * k);
    t->demb = dt_alloc(row * k);
    t->dense = dt_alloc(sizeof(float) * (size_t)maxB * (t->sp->ndense + 1));
    t->lab = malloc((size_t)maxB);
    t->perm = malloc(sizeof(uint32_t) * (size_t)(t->train.n + 1));
    if (!t->ids || !t->pos || !t->vals || !t->rgrad || !t->emb || !t->demb || !t->dense || !t->lab || !t->perm)
        return dt_error(DT_ERR_NOMEM, "the batch's buffers for %d records: out of memory", maxB);
    return DT_OK;
}

static dt_status rs_create(dt_task **out, const dt_config *c, dt_comm_t comm, int max_micro, int model_rows,
                           dt_task_info *info) {
    (void)max_micro, (void)model_rows;
    dt_task *t = calloc(1, sizeof *t);
    if (!(*out = t)) return dt_error(DT_ERR_NOMEM, "out of memory");
    t->c = c;
    t->sp = &c->dlrm;
    t->T = c->dlrm.ntables;
    t->dim = c->dlrm.dim;
    t->R = dt_dlrm_total_rows(t->sp);
    t->remote = (c->ps_servers > 0 && c->rs_sparse) || dt_tables_on_workers(c);
    t->rank = dt_comm_rank(comm);
    t->W = dt_comm_size(comm);
    t->pull = local_rows;
    t->pull_user = t;
    int maxB = c->batch > c->eval_batch ? c->batch : c->eval_batch;
    dt_status st;
    DT_TRY(dt_clicks_load(&t->train, c->rs_train, t->sp), done);
    if (c->rs_test[0]) DT_TRY(dt_clicks_load(&t->test, c->rs_test, t->sp), done);
    if (t->train.n < c->batch) {
        st = dt_error(DT_ERR_CONFIG, "[train] batch = %d is more than the %lld records of %s", c->batch,
                      (long long)t->train.n, c->rs_train);
        goto done;
    }
    DT_TRY(dt_dlrm_create(&t->m, t->sp, maxB), done);
    dt_dlrm_init(t->m, c->seed);
    DT_TRY(rs_block(t, c), done);
    DT_TRY(rs_buffers(t, maxB), done);
    t->spe = t->train.n / c->batch;
    int64_t total = c->epochs > 0 ? (int64_t)c->epochs * t->spe : c->max_steps;
    if (c->max_steps > 0 && c->max_steps < total) total = c->max_steps;
    *info = (dt_task_info){.params = t->params, .grads = t->grads, .nparams = t->np, .order = t->order,
                           .norder = t->nt, .tensors = t->tinfo, .nwhole = t->np, .ntensors = t->nt,
                           .steps_per_epoch = t->spe, .total_steps = total,
                           .epochs = (int)((total + t->spe - 1) / t->spe), .has_eval = t->test.n > 0,
                           .tables_remote = t->remote};
    char where[160];
    if (dt_tables_on_workers(c)) snprintf(where, sizeof where, "sharded by row across the %d workers", t->W);
    else if (t->remote) snprintf(where, sizeof where, "on the %d servers, by row", c->ps_servers);
    else snprintf(where, sizeof where, "in the block");
    snprintf(info->describe, sizeof info->describe, "%zu MLP parameters, %d tables of %lld rows x %d (%s), %lld train / %lld test records",
             t->mlp, t->T, (long long)t->R, t->dim, where, (long long)t->train.n, (long long)t->test.n);
done:
    if (st != DT_OK) {
        rs_destroy(t);
        *out = NULL;
    }
    return st;
}

// ----------------------------------------------------------------------------
// the steps

static void rs_start_epoch(dt_task *t, int64_t epoch, int64_t batch) {
    for (int64_t i = 0; i < t->train.n; i++) t->perm[i] = (uint32_t)i;
    if (t->c->shuffle) {
        dt_rng r;
        dt_rng_seed(&r, t->c->seed * 1000003ull + (uint64_t)epoch);
        dt_rng_shuffle(&r, t->perm, (size_t)t->train.n);
    }
    t->batch = batch;
}

static dt_status rs_next_batch(dt_task *t, dt_rng *rng, dt_task_batch *b, int *more) {
    (void)rng;
    *more = t->batch < t->spe;
    if (!*more) return DT_OK;
    int B = t->c->batch;
    size_t lo, hi;
    dt_shard_range((size_t)B, t->rank, t->W, &lo, &hi);
    t->first = (int)lo;
    t->share = (int)(hi - lo);
    t->global = B;
    t->rec = t->perm + t->batch * B + t->first;
    t->batch++;
    *b = (dt_task_batch){t->first, t->share, t->global};
    dt_status st = gather_ids(t, &t->train, t->rec, t->share);
    if (st == DT_OK && !t->remote) st = local_rows(t, t->ids, t->nids, t->vals);
    return st;
}

static void rs_zero_grad(dt_task *t) {
    memset(t->grads, 0, sizeof(float) * t->np);
    if (!t->remote) memset(dt_dlrm_grads(t->m), 0, sizeof(float) * t->mlp);
    memset(t->rgrad, 0, sizeof(float) * t->nids * t->dim);
}

static dt_status rs_forward(dt_task *t, int64_t step, int off, int len, float loss_scale, float *loss) {
    (void)step;
    t->off = off;
    t->len = len;
    t->scale = loss_scale;
    to_model(t);
    inputs(t, &t->train, t->rec + off, len, t->pos + (size_t)off * t->T);
    return dt_dlrm_forward(t->m, t->dense, t->emb, t->lab, len, loss);
}

// The rows' gradients: into the pulled rows' (remote), or the block's
// tables (local); the MLPs' into the block. The hook hears the whole
// block final at once.
static dt_status rs_backward(dt_task *t, dt_grad_ready_fn hook, void *user) {
    dt_dlrm_backward(t->m, t->demb, t->scale);
    const int32_t *pos = t->pos + (size_t)t->off * t->T;
    for (int k = 0; k < t->len * t->T; k++) {
        float *g = t->remote ? t->rgrad + (size_t)pos[k] * t->dim : t->grads + t->mlp + (size_t)t->ids[pos[k]] * t->dim;
        const float *d = t->demb + (size_t)k * t->dim;
        for (int i = 0; i < t->dim; i++) g[i] += d[i];
    }
    if (!t->remote) {  // the MLPs' gradients accumulate in the model's block; the step's are the block's
        float *mg = dt_dlrm_grads(t->m);
        memcpy(t->grads, mg, sizeof(float) * t->mlp);
    }
    if (hook) hook(0, user);
    return DT_OK;
}

static void rs_rows(dt_task *t, const int64_t **ids, size_t *n, float **vals, float **grads) {
    *ids = t->ids;
    *n = t->nids;
    *vals = t->vals;
    *grads = t->rgrad;
}

static void rs_set_rows_source(dt_task *t, dt_task_rows_fn fn, void *user) {
    t->pull = fn;
    t->pull_user = user;
}

// ----------------------------------------------------------------------------
// evaluation: every test record's click probability (this rank's share,
// the others' added in over comm), then the mean loss and the AUC

static dt_status rs_evaluate(dt_task *t, dt_comm_t comm, int64_t step, float train_loss, float *loss,
                             float *accuracy) {
    (void)step, (void)train_loss;
    const dt_clicks *ds = &t->test;
    int r = comm ? dt_comm_rank(comm) : 0, W = comm ? dt_comm_size(comm) : 1, lo, hi, extra;
    int chunk = t->maxB;
    dt_task_eval_share((long)ds->n, r, W, chunk, &lo, &hi, &extra);
    float *p = calloc((size_t)ds->n + 1, sizeof(float));
    uint32_t *rec = malloc(sizeof(uint32_t) * (size_t)chunk);
    if (!p || !rec) return free(p), free(rec), dt_error(DT_ERR_NOMEM, "evaluation: out of memory");
    to_model(t);
    dt_status st = DT_OK;
    for (int i = lo; i < hi && st == DT_OK; i += chunk) {
        int n = hi - i < chunk ? hi - i : chunk;
        dt_heartbeat(-1);
        for (int b = 0; b < n; b++) rec[b] = (uint32_t)(i + b);
        st = gather_ids(t, ds, rec, n);
        if (st == DT_OK) st = t->pull(t->pull_user, t->ids, t->nids, t->vals);
        if (st != DT_OK) break;
        inputs(t, ds, rec, n, t->pos);
        if ((st = dt_dlrm_forward(t->m, t->dense, t->emb, NULL, n, NULL)) != DT_OK) break;
        memcpy(p + i, dt_dlrm_probs(t->m), sizeof(float) * n);
    }
    // (the tables across the workers: every worker pulls as often, no rows for chunks it lacks)
    for (int e = 0; e < extra && st == DT_OK && dt_tables_on_workers(t->c); e++) st = t->pull(t->pull_user, t->ids, 0, t->vals);
    free(rec);
    if (st == DT_OK && comm && W > 1 && (st = dt_allreduce(p, p, (size_t)ds->n, DT_F32, DT_SUM, comm)) != DT_OK)
        st = dt_error(st, "evaluation: %s", dt_last_error());
    if (st == DT_OK) {
        double sum = 0;
        for (int64_t i = 0; i < ds->n; i++) {
            float q = p[i] < 1e-7f ? 1e-7f : p[i] > 1 - 1e-7f ? 1 - 1e-7f : p[i];
            sum -= ds->label[i] ? log(q) : log(1 - q);
        }
        *loss = (float)(sum / (double)(ds->n ? ds->n : 1));
        *accuracy = (float)(t->last_auc = dt_auc(p, ds->label, ds->n));
    }
    free(p);
    return st;
}

static dt_status rs_save(dt_task *t, const char *path, dt_comm_t comm, size_t lo, size_t hi) {
    dt_st_meta meta[] = {{"format", "dtrain-weights"}, {"dtrain_version", dt_version()}, {"name", t->c->name}};
    to_model(t);
    return dt_task_write_weights(path, t->tinfo, t->nt, meta, 3, t->params, NULL, NULL, comm, lo, hi);
}

static void rs_summary(dt_task *t, cJSON *o, const dt_train_result *r) {
    cJSON_AddNumberToObject(o, "epochs", r->epochs);
    cJSON_AddNumberToObject(o, "test_loss", r->test_loss);
    cJSON_AddNumberToObject(o, "test_auc", t->last_auc);
    cJSON *rs = cJSON_AddObjectToObject(o, "recsys");
    cJSON_AddStringToObject(rs, "tables", dt_tables_on_workers(t->c) ? "workers" : t->remote ? "servers" : "block");
    cJSON_AddNumberToObject(rs, "rows", (double)t->R);
    cJSON_AddNumberToObject(rs, "dim", t->dim);
    cJSON_AddNumberToObject(rs, "mlp_parameters", (double)t->mlp);
}

const dt_task_ops dt_task_dlrm = {
    .name = "dlrm",
    .wants = rs_wants,
    .create = rs_create,
    .destroy = rs_destroy,
    .start_epoch = rs_start_epoch,
    .next_batch = rs_next_batch,
    .zero_grad = rs_zero_grad,
    .forward = rs_forward,
    .backward = rs_backward,
    .evaluate = rs_evaluate,
    .save = rs_save,
    .summary = rs_summary,
    .rows = rs_rows,
    .set_rows_source = rs_set_rows_source,
};
