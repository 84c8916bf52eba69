/* The Llama task (task.h): the GPT's token windows (engine/tasks/gpt.c:
 * random windows of seq_len + 1 tokens from [data] train_file, every rank
 * the same global batch, its share of it) -> dt_llama; the validation loss
 * over [data] val_file. The model exposes the GPT's seams (one flat block,
 * its gradient order, a grad hook, a layer hook, stages), so the loop's
 * data parallel and ZeRO 1-3 run it as they run the GPT, and the
 * model-parallel strategy its tensor-parallel shards and pipeline stages
 * (each keeping its blocks' parameters, set at hold). */
#include "dtrain/gpt.h"  /* the token files */
#include "dtrain/launch.h"
#include "dtrain/llama.h"
#include "dtrain/train.h"
#include "engine/codecs/codec.h"
#include "engine/tasks/task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_task {
    const dt_config *c;
    dt_llama_config lc;
    dt_llama *m;
    dt_tokens train, val;
    int B, T, Bm, first, share;  // global batch, window, the model's batch; this rank's windows
    int32_t *x, *y;              // the global batch [B, T]
    int *order_layer;            // the layer using each range of the gradient order
    dt_grad_matrix *mats;
    int nmats;
    int sliced;                  // ZeRO-3: create made this rank's slice alone
    int tp, ntp;                 // [parallel] tensor: this rank's shard of ntp (0 of 1: the whole model)
    dt_comm_t tpc, rest;         // its shard's group, and the ranks of its shard
    unsigned char *order_split;  // the ranges divided among the shards
    int lent;                    // the default set serves the stage
    int deferred;                // the parameters come at hold (a pipeline stage's blocks)
    dt_tensor_info tinfo[DT_LLAMA_NTENSORS];
    char mvals[9][24];
    dt_st_meta wmeta[11];
    cJSON *history;
    dt_task_layer_fn layer_fn;
    void *layer_user;
};

static int llama_wants(const dt_config *c) { return c->gpt && c->arch == DT_ARCH_LLAMA; }

static void llama_close(dt_task *t) {
    dt_comm_destroy(t->tpc);
    dt_comm_destroy(t->rest);
    t->tpc = t->rest = NULL;
}

static void llama_destroy(dt_task *t) {
    if (!t) return;
    free(t->order_layer);
    free(t->order_split);
    free(t->mats);
    cJSON_Delete(t->history);
    free(t->x);
    free(t->y);
    dt_llama_free(t->m);
    dt_tokens_close(&t->train);
    dt_tokens_close(&t->val);
    free(t);
}

// The weights file's metadata: the sizes (as dt_llama_save_hf's).
static int weights_meta(dt_task *t) {
    const dt_llama_config *c = &t->lc;
    const char *k[9] = {"n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "block_size", "vocab_size",
                        "rope_theta", "norm_eps"};
    int v[7] = {c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->ffn_hidden, c->block_size, c->vocab_size};
    for (int i = 0; i < 7; i++) snprintf(t->mvals[i], sizeof t->mvals[i], "%d", v[i]);
    snprintf(t->mvals[7], sizeof t->mvals[7], "%.9g", c->rope_theta);
    snprintf(t->mvals[8], sizeof t->mvals[8], "%.9g", c->norm_eps);
    t->wmeta[0] = (dt_st_meta){"format", "dtrain-llama"};
    for (int i = 0; i < 9; i++) t->wmeta[1 + i] = (dt_st_meta){k[i], t->mvals[i]};
    return 10;
}

// The order's layers (tok_embeddings: the embedding; 9 slices a block;
// norm, lm_head: the head) and the codecs' matrices.
static dt_status llama_order(dt_task *t, int norder) {
    int L = t->lc.n_layer;
    t->order_layer = malloc(sizeof(int) * (size_t)norder);
    t->order_split = malloc((size_t)norder);
    t->mats = malloc(sizeof *t->mats * (size_t)(norder + DT_LLAMA_NTENSORS));
    if (!t->order_layer || !t->order_split || !t->mats) return dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < DT_LLAMA_NTENSORS; i++)
        t->nmats += dt_codec_matrices(dt_llama_tensor(t->m, i), i >= 1 && i <= 9 ? L : 0, t->mats + t->nmats);
    for (int i = 0; i < norder; i++) {
        t->order_layer[i] = i == 0 ? -1 : i < norder - 2 ? (i - 1) / 9 : L;
        int tensor = i == 0 ? 0 : i < norder - 2 ? 1 + (i - 1) % 9 : 10 + i - (norder - 2);
        t->order_split[i] = t->ntp > 1 && dt_llama_tensor_split(tensor);
    }
    return DT_OK;
}

static void part_fill(void *user, const float *local, size_t lo, size_t hi, float *buf) {
    dt_llama_part_fill(((dt_task *)user)->m, local, lo, hi, buf);
}

static void part_take(void *user, float *local, size_t lo, size_t hi, const float *buf) {
    dt_llama_part_take(((dt_task *)user)->m, local, lo, hi, buf);
}

// The model's sums over the tensor-parallel shards (dt_llama_set_reduce).
static dt_status tp_reduce(float *buf, size_t n, void *user) {
    dt_status st = dt_allreduce(buf, buf, n, DT_F32, DT_SUM, ((dt_task *)user)->tpc);
    return st == DT_OK ? DT_OK : dt_error(st, "tensor-parallel allreduce: %s", dt_last_error());
}

static dt_status llama_regroup(dt_task *t, dt_comm_t comm, dt_comm_t *replicas, dt_comm_t *tensor_group) {
    dt_status st = dt_task_shard_groups(comm, t->c, &t->ntp, &t->tp, &t->tpc, &t->rest, NULL);
    *replicas = t->rest;
    *tensor_group = t->tpc;
    return st;
}

static void llama_info(dt_task *t, const dt_config *c, const dt_grad_range *order, int norder, dt_task_info *info) {
    *info = (dt_task_info){.params = dt_llama_params(t->m),
                           .grads = dt_llama_grads(t->m),
                           .nparams = dt_llama_num_params(t->m),
                           .order = order,
                           .norder = norder,
                           .order_layer = t->order_layer,
                           .order_split = t->ntp > 1 ? t->order_split : NULL,
                           .replicas = t->rest,
                           .tensor_group = t->tpc,
                           .part_fill = t->ntp > 1 || t->deferred ? part_fill : NULL,
                           .part_take = t->ntp > 1 || t->deferred ? part_take : NULL,
                           .deferred = t->deferred,
                           .part_user = t,
                           .matrices = t->mats,
                           .nmatrices = t->nmats,
                           .tensors = t->tinfo,
                           .nwhole = dt_llama_config_num_params(&t->lc),
                           .sliced = t->sliced,
                           .ntensors = DT_LLAMA_NTENSORS,
                           .weights_meta = t->wmeta,
                           .nweights_meta = weights_meta(t),
                           .steps_per_epoch = c->max_steps,
                           .total_steps = c->max_steps,
                           .epochs = 1,
                           .tokens_per_sample = t->T,
                           .has_eval = t->val.tokens != NULL};
    dt_rng_seed(&info->rng, c->seed ^ 0x746f6b656e73ull);  // the data stream, as the GPT's
    char shard[64] = "";
    if (t->ntp > 1) snprintf(shard, sizeof shard, " (%zu on each of %d tensor-parallel ranks)", info->nparams, t->ntp);
    snprintf(info->describe, sizeof info->describe,
             "Llama L%d H%d KV%d C%d F%d V%d, %zu parameters%s; %zu train / %zu val tokens; B=%d T=%d", t->lc.n_layer,
             t->lc.n_head, t->lc.n_kv_head, t->lc.n_embd, t->lc.ffn_hidden, t->lc.vocab_size, info->nwhole, shard,
             t->train.total, t->val.n, t->B, t->T);
}

static dt_status llama_create(dt_task **out, const dt_config *c, dt_comm_t comm, int max_micro, int model_rows,
                              dt_task_info *info) {
    (void)model_rows;
    dt_task *t = calloc(1, sizeof *t);
    if (!(*out = t)) return dt_error(DT_ERR_NOMEM, "out of memory");
    *t = (dt_task){.c = c, .lc = dt_config_llama(c), .B = c->batch, .T = c->seq_len, .Bm = max_micro};
    int rank = dt_comm_rank(comm), W = dt_comm_size(comm), norder;
    t->first = (int)((long)t->B * rank / W);
    t->share = (int)((long)t->B * (rank + 1) / W) - t->first;
    dt_status st = (t->history = cJSON_CreateArray()) ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    if (st != DT_OK) goto done;
    DT_TRY(dt_task_open_tokens(&t->train, c, 1, rank, W), done);
    if (c->val_file[0]) DT_TRY(dt_task_open_tokens(&t->val, c, 0, 0, 1), done);
    DT_TRY(dt_task_shard_groups(comm, c, &t->ntp, &t->tp, &t->tpc, &t->rest, NULL), done);
    DT_TRY(dt_llama_create_shard(&t->m, &t->lc, t->Bm, t->T, t->tp, t->ntp), done);
    if (t->ntp > 1) dt_llama_set_reduce(t->m, tp_reduce, t);
    // ZeRO-3 keeps a rank's slice of the parameters alone (each its own
    // from the same stream); a pipeline stage its blocks', set at hold.
    t->sliced = c->zero >= 3 && W > 1;
    t->deferred = c->pipeline > 1;
    size_t lo = 0, hi = SIZE_MAX;
    if (t->sliced) dt_shard_range(dt_llama_num_params(t->m), rank, W, &lo, &hi);
    if (!t->deferred) DT_TRY(dt_llama_init_range(t->m, c->seed, lo, hi), done);
    // [model] init_from: Hugging Face Llama weights (dt_llama_load_hf: a whole model's block)
    if (c->init_from[0]) DT_TRY(dt_llama_load_hf(t->m, c->init_from), done);
    t->x = calloc((size_t)t->B * t->T, sizeof(int32_t));
    t->y = calloc((size_t)t->B * t->T, sizeof(int32_t));
    if (!t->x || !t->y) {
        st = dt_error(DT_ERR_NOMEM, "out of memory");
        goto done;
    }
    dt_llama_param_shapes(&t->lc, t->tinfo);
    const dt_grad_range *order = dt_llama_grad_order(t->m, &norder);
    DT_TRY(llama_order(t, norder), done);
    llama_info(t, c, order, norder, info);
done:
    if (st != DT_OK) {
        llama_close(t);
        llama_destroy(t);
        *out = NULL;
    }
    return st;
}

static void llama_start_epoch(dt_task *t, int64_t epoch, int64_t batch) { (void)t, (void)epoch, (void)batch; }

static dt_status llama_next_batch(dt_task *t, dt_rng *rng, dt_task_batch *b, int *more) {
    *more = 1;
    *b = (dt_task_batch){t->first, t->share, t->B};
    return dt_tokens_sample(&t->train, rng, t->B, t->T, t->x, t->y);
}

static void llama_zero_grad(dt_task *t) { dt_llama_zero_grad(t->m); }

static dt_status llama_forward(dt_task *t, int64_t step, int off, int len, float loss_scale, float *loss) {
    (void)step;
    size_t o = (size_t)(t->first + off) * t->T;
    dt_llama_set_loss_scale(t->m, loss_scale);
    return dt_llama_forward(t->m, t->x + o, t->y + o, len, t->T, loss);
}

static dt_status llama_backward(dt_task *t, dt_grad_ready_fn hook, void *user) {
    dt_llama_set_grad_hook(t->m, hook, user);
    dt_llama_backward(t->m);
    return DT_OK;
}

static dt_status layer_hook(int layer, int phase, void *user) {
    dt_task *t = user;
    return t->layer_fn(layer, phase, t->layer_user);
}

static void llama_set_layer_hook(dt_task *t, dt_task_layer_fn fn, void *user) {
    t->layer_fn = fn;
    t->layer_user = user;
    dt_llama_set_layer_hook(t->m, fn ? layer_hook : NULL, t);
}

// ----------------------------------------------------------------------------
// stages: the model's stage calls on one set each (a pipeline's, or tensor
// parallel's one stage of every layer)

struct dt_task_stage {
    dt_llama_acts *a;
    dt_task *t;
    int lent, l0, l1, off, len;
    float scale;
};

// A stage of every layer takes the model's own set, once; the evaluation,
// between steps, uses it while the stage does not.
static dt_status llama_stage_create(dt_task *t, int l0, int l1, int max_len, dt_task_stage **out) {
    dt_task_stage *st = calloc(1, sizeof *st);
    if (!(*out = st)) return dt_error(DT_ERR_NOMEM, "stage: out of memory");
    *st = (dt_task_stage){.t = t, .l0 = l0, .l1 = l1};
    dt_llama_set_grad_hook(t->m, NULL, NULL);
    if (l0 == 0 && l1 == t->lc.n_layer && max_len <= t->Bm && !t->lent) {
        st->a = dt_llama_default_acts(t->m);
        st->lent = t->lent = 1;
        return DT_OK;
    }
    dt_status s = dt_llama_acts_create(&st->a, &t->lc, max_len, t->T, l0, l1, t->ntp);
    if (s != DT_OK) free(st), *out = NULL;
    return s;
}

static void llama_stage_free(dt_task_stage *st) {
    if (!st) return;
    if (st->lent) st->t->lent = 0;
    else dt_llama_acts_free(st->a);
    free(st);
}

static dt_status llama_stage_begin(dt_task *t, dt_task_stage *st, int64_t step, int off, int len, float loss_scale,
                                   float **in, size_t *in_count, float **out, size_t *out_count) {
    (void)step;
    st->off = off, st->len = len, st->scale = loss_scale;
    dt_status s = dt_llama_acts_set_shape(st->a, len, t->T);
    *in = dt_llama_acts_resid(st->a, st->l0);
    *out = dt_llama_acts_resid(st->a, st->l1);
    *in_count = *out_count = (size_t)len * t->T * t->lc.n_embd;
    return s;
}

static dt_status llama_stage_forward(dt_task *t, dt_task_stage *st, float *loss) {
    size_t o = (size_t)st->off * t->T;
    float *in = dt_llama_acts_resid(st->a, st->l0), *out = dt_llama_acts_resid(st->a, st->l1);
    dt_status s = DT_OK;
    if (st->l0 == 0) s = dt_llama_embed_forward(t->m, st->a, t->x + o, in);
    if (s == DT_OK) s = dt_llama_forward_range(t->m, st->a, st->l0, st->l1, in, out);
    if (s == DT_OK && st->l1 == t->lc.n_layer) s = dt_llama_head_forward(t->m, st->a, out, t->y + o, loss);
    return s;
}

// (in place: the stream's gradient has the same size at both ends)
static dt_status llama_stage_backward(dt_task *t, dt_task_stage *st, float *d, float **din) {
    *din = d;
    float *in = dt_llama_acts_resid(st->a, st->l0), *out = dt_llama_acts_resid(st->a, st->l1);
    dt_llama_set_loss_scale(t->m, st->scale);
    dt_status s = DT_OK;
    if (st->l1 == t->lc.n_layer) s = dt_llama_head_backward(t->m, st->a, out, d);
    if (s == DT_OK) s = dt_llama_backward_range(t->m, st->a, st->l0, st->l1, in, d);
    if (s == DT_OK && st->l0 == 0) s = dt_llama_embed_backward(t->m, st->a, d);
    return s;
}

static dt_status llama_hold(dt_task *t, const unsigned char *held, const dt_grad_range **ranges, int *n) {
    dt_status st = dt_llama_set_held(t->m, held);
    if (st == DT_OK) st = dt_llama_init(t->m, t->c->seed);
    *ranges = dt_llama_held_ranges(t->m, n);
    return st;
}

static dt_status llama_scratch_batch(dt_task *t, int len) {
    if (len > t->B) return dt_error(DT_ERR_ARG, "llama: a scratch batch of %d windows, more than the batch's %d", len, t->B);
    memset(t->x, 0, sizeof(int32_t) * (size_t)len * t->T);
    memset(t->y, 0, sizeof(int32_t) * (size_t)len * t->T);
    return DT_OK;
}

// The evaluation's forward (dt_task_val_loss).
static dt_status llama_lm_forward(void *user, const int32_t *x, const int32_t *y, int n, int T, float *loss,
                                  const float **logits) {
    dt_status st = dt_llama_forward(user, x, y, n, T, loss);
    *logits = dt_llama_logits(user);
    return st;
}

static dt_status llama_evaluate(dt_task *t, dt_comm_t comm, int64_t step, float train_loss, float *loss,
                                float *accuracy) {
    *accuracy = -1;
    if (t->ntp > 1) comm = t->rest;  // (the shards of one model run the same windows)
    dt_task_hook hook = {t->layer_fn, t->layer_user, -1, t->lc.n_layer};
    dt_status st = dt_task_val_loss(llama_lm_forward, t->m, &t->val, t->c->eval_batches * t->B, t->Bm, t->T,
                                    t->lc.vocab_size, t->x, t->y, comm, &hook, loss, NULL);
    if (st == DT_OK) dt_task_history_add(t->history, step, train_loss, *loss);
    return st;
}

dt_status dt_llama_eval_checkpoint(const dt_config *c, const char *weights, float *loss, float *accuracy, int *n) {
    dt_set_threads(c->threads);
    dt_llama_config lc = dt_config_llama(c);
    dt_llama *m = NULL;
    dt_status st = dt_check_memory(c, DT_MEM_EVAL, 1, 0, NULL);
    if (st == DT_OK) st = dt_llama_create(&m, &lc, c->batch, c->seq_len);
    if (st == DT_OK) st = dt_llama_load(m, weights);  // (the weights first: a wrong file before the data loads)
    if (st == DT_OK) st = dt_task_eval_tokens(c, llama_lm_forward, m, loss, accuracy, n);
    dt_llama_free(m);
    return st;
}

static dt_status llama_save(dt_task *t, const char *path, dt_comm_t comm, size_t lo, size_t hi) {
    dt_st_meta meta[11];
    memcpy(meta, t->wmeta, sizeof(dt_st_meta) * 10);
    meta[10] = (dt_st_meta){"dtrain_version", dt_version()};
    return dt_task_write_weights(path, t->tinfo, DT_LLAMA_NTENSORS, meta, 11, dt_llama_params(t->m),
                                 t->ntp > 1 || t->deferred ? part_fill : NULL, t, comm, lo, hi);
}

static void llama_summary(dt_task *t, cJSON *o, const dt_train_result *r) {
    cJSON_AddStringToObject(o, "model", t->c->preset);
    cJSON_AddNumberToObject(o, "threads", dt_get_threads());
    cJSON_AddNumberToObject(o, "seq_len", t->T);
    if (r->test_loss >= 0) cJSON_AddNumberToObject(o, "val_loss", r->test_loss);
    else cJSON_AddNullToObject(o, "val_loss");
    cJSON_AddItemReferenceToObject(o, "val_history", t->history);
    cJSON_AddNumberToObject(o, "tokens_per_sec", r->samples_per_sec * t->T);
}

const dt_task_ops dt_task_llama = {
    .name = "llama",
    .wants = llama_wants,
    .create = llama_create,
    .destroy = llama_destroy,
    .close = llama_close,
    .regroup = llama_regroup,
    .stage_create = llama_stage_create,
    .stage_free = llama_stage_free,
    .stage_begin = llama_stage_begin,
    .stage_forward = llama_stage_forward,
    .stage_backward = llama_stage_backward,
    .scratch_batch = llama_scratch_batch,
    .hold = llama_hold,
    .start_epoch = llama_start_epoch,
    .next_batch = llama_next_batch,
    .zero_grad = llama_zero_grad,
    .forward = llama_forward,
    .backward = llama_backward,
    .set_layer_hook = llama_set_layer_hook,
    .evaluate = llama_evaluate,
    .save = llama_save,
    .summary = llama_summary,
};
