/* The GPT task (task.h): random windows of seq_len + 1 tokens from [data]
 * train_file -> dt_gpt; the validation loss over [data] val_file every
 * eval_every steps and at the end; and a GPT's evaluation outside training
 * (dt_gpt_eval_checkpoint).
 *
 * Every rank draws the same global batch of B windows from the same seeded
 * stream (the loop's checkpointed rng) and trains on its share of them
 * (windows B*r/W up to B*(r+1)/W); validation splits its windows the same
 * way. */
#include "dtrain/ckpt.h"
#include "dtrain/gpt.h"
#include "dtrain/launch.h"
#include "dtrain/train.h"
#include "engine/codecs/codec.h"
#include "engine/device.h"
#include "engine/tasks/task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_task {
    const dt_config *c;
    int *order_layer;  // the layer using each range of the gradient order
    unsigned char *order_split;  // the ranges divided among the tensor-parallel ranks
    dt_grad_matrix *mats;        // the block's 2-D tensors, layer by layer (dt_codec_matrices), nmats
    int nmats;
    int tp, ntp;                 // [parallel] tensor: this rank's shard of ntp (0 of 1: the whole model)
    dt_comm_t tpc, rest;         // its shard's group (tensor innermost), and the ranks of its shard
    dt_comm_t tpg;               // on a device: a GPUs' communicator over tpc (the device model's sums)
    dt_gpt_config gc;
    dt_tokens train, val;
    dt_gpt *m;
    int B, T, Bm;               // global batch, window, the model's batch
    int first, share;           // this rank's windows of each global batch
    int32_t *x, *y;             // the global batch [B, T]
    dt_tensor_info tinfo[16];
    char mvals[6][16];
    dt_st_meta wmeta[7];
    cJSON *history;             // {step, train_loss, val_loss} per evaluation
    dt_task_layer_fn layer_fn;  // the loop's layer hook, and its argument
    void *layer_user;
    size_t act_bytes, act_saved;  // the activation sets made, and what 16-bit matmul inputs save in them
    int lent;                     // the default set serves a pipeline stage too (gpt_stage_create)
    int deferred;                 // the parameters come at hold (a pipeline stage's layers)
    int sliced, rank, W;          // ZeRO-3: create made rank's slice of W alone (info's sliced)
    dt_gpt_acts *eval;            // a pipeline's evaluation set: forwards alone (made at the first)
    dt_dev_gpt *dg;               // [train] device = cuda: the model's steps and evaluations on the device (m: host)
    dt_status dev_err;            // ... the step's zero_grad's failure, returned by its forward (or a stage's)
};

// Counts a set made (its bytes, and those its 16-bit matmul inputs save),
// or with made = 0 takes a freed one out.
static void count_acts(dt_task *t, const dt_gpt_acts *a, int made) {
    if (!a) return;
    if (made) t->act_bytes += dt_gpt_acts_bytes(a), t->act_saved += dt_gpt_acts_saved(a);
    else t->act_bytes -= dt_gpt_acts_bytes(a), t->act_saved -= dt_gpt_acts_saved(a);
}

// The evaluation's forward (dt_task_val_loss): on the device's model dg (a
// run on a device), else the CPU's in set a, else in the default set.
typedef struct {
    dt_gpt *m;
    dt_gpt_acts *a;
    dt_dev_gpt *dg;  // a run on a device: the forward on its blocks
} gpt_fwd;

static dt_status gpt_lm_forward(void *user, const int32_t *x, const int32_t *y, int n, int T, float *loss,
                                const float **logits) {
    gpt_fwd *f = user;
    if (f->dg) {  // (its logits stay on the device: the GPT's evaluation reads the loss alone)
        *logits = NULL;
        return dt_dev_gpt_forward(f->dg, x, y, n, T, 1.0f, loss);
    }
    dt_status st = f->a ? dt_gpt_forward_with(f->m, f->a, x, y, n, T, loss) : dt_gpt_forward(f->m, x, y, n, T, loss);
    *logits = f->a ? dt_gpt_acts_logits(f->a) : dt_gpt_logits(f->m);
    return st;
}

dt_status dt_gpt_eval_checkpoint(const dt_config *c, const char *weights, float *loss, float *accuracy,
                                 int *n) {
    dt_set_threads(c->threads);
    dt_gpt_config gc = dt_config_gpt(c);
    dt_gpt *m = NULL;
    dt_status st = dt_check_memory(c, DT_MEM_EVAL, 1, 0, NULL);
    if (st == DT_OK) st = dt_gpt_create(&m, &gc, c->batch, c->seq_len);
    if (st == DT_OK) st = dt_gpt_load(m, weights);
    gpt_fwd f = {m, NULL, NULL};
    if (st == DT_OK) st = dt_task_eval_tokens(c, gpt_lm_forward, &f, loss, accuracy, n);
    dt_gpt_free(m);
    return st;
}

dt_status dt_gpt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress, void *user,
                       dt_train_result *res) {
    if (!c->gpt) return dt_error(DT_ERR_ARG, "dt_gpt_train: the config's model is not a GPT");
    return dt_train(c, run_dir, progress, user, res);
}

// ----------------------------------------------------------------------------
// the task

static int gpt_wants(const dt_config *c) { return c->gpt && c->arch == DT_ARCH_GPT; }

static void gpt_destroy(dt_task *t) {
    if (!t) return;
    free(t->order_layer);
    free(t->order_split);
    free(t->mats);
    cJSON_Delete(t->history);
    free(t->x);
    free(t->y);
    dt_gpt_acts_free(t->eval);
    dt_dev_gpt_free(t->dg);
    dt_gpt_free(t->m);
    dt_tokens_close(&t->train);
    dt_tokens_close(&t->val);
    free(t);
}

static void gpt_close(dt_task *t) {
    dt_comm_destroy(t->tpg);
    dt_comm_destroy(t->tpc);
    dt_comm_destroy(t->rest);
    t->tpc = t->rest = t->tpg = NULL;
}

// The token files a spare loaded ahead (gpt_warm): [0] train, [1] val, for
// the next create with the same config.
static struct {
    const dt_config *c;
    int have[2];
    dt_tokens tk[2];
} g_warm;

static dt_status open_tokens(dt_tokens *tk, const dt_config *c, int train, int r, int W) {
    if (g_warm.c == c && g_warm.have[!train]) {
        *tk = g_warm.tk[!train];
        g_warm.have[!train] = 0;
        return DT_OK;
    }
    return dt_task_open_tokens(tk, c, train, r, W);
}

static dt_status gpt_warm(const dt_config *c) {
    for (int k = 0; k < 2; k++)
        if (g_warm.have[k]) dt_tokens_close(&g_warm.tk[k]);
    memset(&g_warm, 0, sizeof g_warm);
    if (!c) return DT_OK;
    // (a shard of the training file is known once the rank is: read then)
    dt_status st = dt_config_data_sharded(c) ? DT_OK : open_tokens(&g_warm.tk[0], c, 1, 0, 1);
    if (st != DT_OK) return st;
    g_warm.have[0] = !dt_config_data_sharded(c);
    if (c->val_file[0]) {
        if ((st = open_tokens(&g_warm.tk[1], c, 0, 0, 1)) != DT_OK) return st;
        g_warm.have[1] = 1;
    }
    g_warm.c = c;
    return DT_OK;
}

// The model's collectives over the tensor-parallel shards (dt_gpt_set_reduce,
// dt_dev_gpt_set_reduce): sums and maxes, and sequence parallel's
// reduce-scatters and allgathers, on the communicator *user (the task's
// tpc, or on a device tpg).
static dt_status tp_reduce(dt_gpt_coll op, const float *send, float *recv, size_t n, void *user) {
    dt_comm_t c = *(dt_comm_t *)user;
    const char *what = op == DT_GPT_REDUCE_SCATTER ? "reduce-scatter" : op == DT_GPT_ALLGATHER ? "allgather" : "allreduce";
    dt_status st = op == DT_GPT_REDUCE_SCATTER ? dt_reduce_scatter(send, recv, n, DT_F32, DT_SUM, c)
                   : op == DT_GPT_ALLGATHER    ? dt_allgather(send, recv, n, DT_F32, c)
                   : dt_allreduce(send, recv, n, DT_F32, op == DT_GPT_MAX ? DT_MAX : DT_SUM, c);
    return st == DT_OK ? DT_OK : dt_error(st, "tensor-parallel %s: %s", what, dt_last_error());
}

// [parallel] tensor = T: the T consecutive ranks from rank - rank % T hold
// the T shards of one copy of the model (tensor innermost in the layout of
// docs/model-parallel.md); the ranks of the same shard evaluate together.
static dt_status tensor_groups(dt_task *t, dt_comm_t comm) {
    return dt_task_shard_groups(comm, t->c, &t->ntp, &t->tp, &t->tpc, &t->rest, &t->tpg);
}

static dt_status gpt_regroup(dt_task *t, dt_comm_t comm, dt_comm_t *replicas, dt_comm_t *tensor_group) {
    dt_status st = tensor_groups(t, comm);
    *replicas = t->rest;
    *tensor_group = t->tpc;
    return st;
}

// The initial parameters: c's seed, or [model] init_from, of which only
// what this rank keeps is read (a shard's part, a stage's blocks:
// dt_gpt_load), never a whole copy beside the model.
static dt_status init_params(dt_task *t) {
    const dt_config *c = t->c;
    size_t lo = 0, hi = SIZE_MAX;
    if (t->sliced) dt_shard_range(dt_gpt_num_params(t->m), t->rank, t->W, &lo, &hi);
    dt_status st = dt_gpt_init_range(t->m, c->seed, lo, hi);
    if (st != DT_OK || !c->init_from[0]) return st;
    return dt_gpt_load_range(t->m, c->init_from, lo, hi);
}

static void part_fill(void *user, const float *local, size_t lo, size_t hi, float *buf) {
    dt_task *t = user;
    dt_gpt_part_fill(t->m, local, lo, hi, buf);
}

static void part_take(void *user, float *local, size_t lo, size_t hi, const float *buf) {
    dt_task *t = user;
    dt_gpt_part_take(t->m, local, lo, hi, buf);
}

// The gradient order's layers (wte, wpe: the embedding; 12 slices a
// block; lnfw, lnfb: the head), which ranges a tensor-parallel shard
// splits, and the codecs' matrices.
static dt_status gpt_order(dt_task *t, int norder) {
    t->order_layer = malloc(sizeof(int) * (size_t)norder);
    t->order_split = malloc((size_t)norder);
    t->mats = malloc(sizeof *t->mats * (size_t)norder);  // at most one a range of the order
    if (!t->order_layer || !t->order_split || !t->mats) return dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < dt_gpt_num_tensors(t->m); i++)  // the embeddings, 12 tensors stacked over the layers, lnf
        t->nmats += dt_codec_matrices(dt_gpt_tensor(t->m, i), i >= 2 && i < 14 ? t->gc.n_layer : 0, t->mats + t->nmats);
    for (int i = 0; i < norder; i++) {
        t->order_layer[i] = i < 2 ? DT_GPT_EMBED : i < norder - 2 ? (i - 2) / 12 : t->gc.n_layer;
        int tensor = i < 2 ? i : i < norder - 2 ? 2 + (i - 2) % 12 : 14 + i - (norder - 2);
        t->order_split[i] = t->ntp > 1 && dt_gpt_tensor_split(tensor);
    }
    return DT_OK;
}

// What the loop needs to know of the task, and its line for the run's start.
static void gpt_info(dt_task *t, const dt_config *c, const dt_grad_range *order, int norder, dt_task_info *info) {
    *info = (dt_task_info){.params = dt_gpt_params(t->m),
                           .grads = dt_gpt_grads(t->m),
                           .nparams = dt_gpt_num_params(t->m),
                           .order = order,
                           .norder = norder,
                           .order_layer = t->order_layer,
                           .order_split = t->ntp > 1 ? t->order_split : NULL,
                           .matrices = t->mats,
                           .nmatrices = t->nmats,
                           .replicas = t->rest,
                           .tensor_group = t->tpc,
                           .tensors = t->tinfo,
                           .nwhole = dt_gpt_config_num_params(&t->gc),
                           .part_fill = t->ntp > 1 || t->deferred ? part_fill : NULL,
                           .part_take = t->ntp > 1 || t->deferred ? part_take : NULL,
                           .part_user = t,
                           .deferred = t->deferred,
                           .sliced = t->sliced,
                           .tied = 1,
                           .ntensors = 16,
                           .weights_meta = t->wmeta,
                           .nweights_meta = dt_gpt_weights_meta(&t->gc, t->mvals, t->wmeta),
                           .steps_per_epoch = c->max_steps,
                           .total_steps = c->max_steps,
                           .epochs = 1,
                           .tokens_per_sample = t->T,
                           .has_eval = t->val.tokens != NULL};
    dt_rng_seed(&info->rng, c->seed ^ 0x746f6b656e73ull);  // the data stream, apart from init's
    char shard[96] = "";
    if (t->ntp > 1)
        snprintf(shard, sizeof shard, " (%zu on each of %d tensor-parallel ranks%s)", info->nparams, t->ntp,
                 c->sequence ? ", sequence parallel" : "");
    count_acts(t, dt_gpt_default_acts(t->m), 1);
    char acts[96] = "";
    if (t->act_saved)
        snprintf(acts, sizeof acts, "; activations %.1f MiB (%.1f MiB saved: matmul inputs kept in %s)",
                 (double)t->act_bytes / (1 << 20), (double)t->act_saved / (1 << 20),
                 c->precision == DT_F16 ? "fp16" : "bf16");
    snprintf(info->describe, sizeof info->describe,
             "GPT L%d H%d C%d V%d, %zu parameters%s; %zu train / %zu val tokens; B=%d T=%d%s", t->gc.n_layer,
             t->gc.n_head, t->gc.n_embd, t->gc.vocab_size, dt_gpt_config_num_params(&t->gc), shard, t->train.total,
             t->val.n, t->B, t->T, acts);
}

// Sets of activations for micro-batches of B windows through layers [l0,
// l1): the shard's parts, recomputed as [train] recompute says, its rows of
// the stream with [parallel] sequence.
static dt_gpt_acts_params acts_params(const dt_task *t, int B, int l0, int l1) {
    return (dt_gpt_acts_params){B, t->T, l0, l1, t->ntp, t->c->recompute, t->ntp > 1 && t->c->sequence, 0};
}

static dt_status gpt_create(dt_task **out, const dt_config *c, dt_comm_t comm, int max_micro, int model_rows,
                            dt_task_info *info) {
    (void)model_rows;
    dt_task *t = calloc(1, sizeof *t);
    if (!(*out = t)) return dt_error(DT_ERR_NOMEM, "out of memory");
    t->c = c;
    t->gc = dt_config_gpt(c);
    t->B = c->batch;
    t->T = c->seq_len;
    t->Bm = max_micro;
    int rank = dt_comm_rank(comm), W = dt_comm_size(comm), norder;
    t->first = (int)((long)t->B * rank / W);
    t->share = (int)((long)t->B * (rank + 1) / W) - t->first;
    dt_status st = (t->history = cJSON_CreateArray()) ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    if (st != DT_OK) goto done;
    DT_TRY(open_tokens(&t->train, c, 1, rank, W), done);
    if (c->val_file[0]) DT_TRY(open_tokens(&t->val, c, 0, 0, 1), done);
    DT_TRY(tensor_groups(t, comm), done);
    dt_gpt_acts_params ap = acts_params(t, t->Bm, 0, t->gc.n_layer);
    if (dt_device_index(c->device) >= 0) ap.B = ap.T = 0;  // (the activations are the device's: none on the host)
    DT_TRY(dt_gpt_create_shard(&t->m, &t->gc, &ap, t->tp), done);
    if (t->ntp > 1) dt_gpt_set_reduce(t->m, tp_reduce, &t->tpc);
    // A pipeline's stage keeps its layers alone: their parameters come when
    // the strategy has cut the stages (hold), under ZeRO-1 too.
    t->deferred = c->pipeline > 1;
    // ZeRO-3 keeps a rank's slice of the parameters alone: that is all it
    // makes (each rank its own, from the same stream; nothing broadcast).
    t->sliced = c->zero >= 3 && W > 1;
    t->rank = rank, t->W = W;
    if (!t->deferred) DT_TRY(init_params(t), done);
    t->x = calloc((size_t)t->B * t->T, sizeof(int32_t));
    t->y = calloc((size_t)t->B * t->T, sizeof(int32_t));
    if (!t->x || !t->y) {
        st = dt_error(DT_ERR_NOMEM, "out of memory");
        goto done;
    }
    dt_gpt_param_shapes(&t->gc, t->tinfo);  // the whole model's, for checkpoints
    const dt_grad_range *order = dt_gpt_grad_order(t->m, &norder);
    DT_TRY(gpt_order(t, norder), done);
    if (dt_device_index(c->device) >= 0)
        DT_TRY(dt_dev_gpt_create(&t->dg, dt_dev_get(), t->m, t->Bm, t->T, dt_optim_params_states(&c->optim),
                                 dt_train_device_part(c, comm), (dt_dtype)c->precision), done);
    if (t->dg && t->ntp > 1) {
        dt_dev_gpt_set_reduce(t->dg, tp_reduce, &t->tpg);
        dt_dev_gpt_blocks(t->dg)->shards = dt_comm_backend(t->tpg);
    }
    gpt_info(t, c, order, norder, info);
    info->device = t->dg ? dt_dev_gpt_blocks(t->dg) : NULL;
done:
    if (st != DT_OK) {
        gpt_close(t);
        gpt_destroy(t);
        *out = NULL;
    }
    return st;
}

static dt_status gpt_hold(dt_task *t, const unsigned char *held, const dt_grad_range **ranges, int *n) {
    dt_status st = dt_gpt_set_held(t->m, held);
    if (st == DT_OK) st = init_params(t);
    *ranges = dt_gpt_held_ranges(t->m, n);
    return st;
}

static dt_status gpt_scratch_batch(dt_task *t, int len) {
    if (len > t->B) return dt_error(DT_ERR_ARG, "gpt: a scratch batch of %d windows, more than the batch's %d", len, t->B);
    memset(t->x, 0, sizeof(int32_t) * (size_t)len * t->T);
    memset(t->y, 0, sizeof(int32_t) * (size_t)len * t->T);
    return DT_OK;
}

static void gpt_start_epoch(dt_task *t, int64_t epoch, int64_t batch) { (void)t, (void)epoch, (void)batch; }

// The global batch (the same on every rank); this rank's share.
static dt_status gpt_next_batch(dt_task *t, dt_rng *rng, dt_task_batch *b, int *more) {
    *more = 1;
    *b = (dt_task_batch){t->first, t->share, t->B};
    return dt_tokens_sample(&t->train, rng, t->B, t->T, t->x, t->y);
}

static void gpt_zero_grad(dt_task *t) {
    if (!t->dg) dt_gpt_zero_grad(t->m);
    else t->dev_err = dt_dev_blocks_zero_grad(dt_dev_gpt_blocks(t->dg));
}

static dt_status gpt_forward(dt_task *t, int64_t step, int off, int len, float loss_scale, float *loss) {
    (void)step;
    size_t o = (size_t)(t->first + off) * t->T;
    if (t->dg && t->dev_err != DT_OK) return t->dev_err;
    if (t->dg)
        return dt_dev_gpt_forward(t->dg, t->x + o, t->y + o, len, t->T, loss_scale,
                                  dt_dev_loss_out(dt_dev_gpt_blocks(t->dg), loss));
    dt_gpt_set_loss_scale(t->m, loss_scale);
    return dt_gpt_forward(t->m, t->x + o, t->y + o, len, t->T, loss);
}

static dt_status gpt_backward(dt_task *t, dt_grad_ready_fn hook, void *user) {
    if (t->dg) return dt_dev_gpt_backward(t->dg, hook, user);
    dt_gpt_set_grad_hook(t->m, hook, user);
    dt_gpt_backward(t->m);
    return DT_OK;
}

static dt_status layer_hook(int layer, dt_gpt_phase phase, void *user) {
    dt_task *t = user;
    return t->layer_fn(layer, phase == DT_GPT_BACKWARD, t->layer_user);
}

static void gpt_set_layer_hook(dt_task *t, dt_task_layer_fn fn, void *user) {
    t->layer_fn = fn;
    t->layer_user = user;
    dt_gpt_set_layer_hook(t->m, fn ? layer_hook : NULL, t);
    if (t->dg) dt_dev_gpt_blocks(t->dg)->layer_fn = fn, dt_dev_gpt_blocks(t->dg)->layer_user = user;
}

// ----------------------------------------------------------------------------
// pipeline stages: the GPT's stage calls (dtrain/gpt.h) on one set each

struct dt_task_stage {
    dt_gpt_acts *a;
    dt_dev_gpt_stage *ds;  // on a device: its activations there (a NULL)
    dt_task *t;
    int lent;  // a is the model's default set (the stages of one stage are the whole model)
    int l0, l1, off, len;
    float scale;
};

// A stage of the whole model takes the model's default set, once: the
// evaluation, between steps, uses it while the stage does not.
static dt_status gpt_stage_create(dt_task *t, int l0, int l1, int max_len, dt_task_stage **out) {
    dt_task_stage *st = calloc(1, sizeof *st);
    if (!(*out = st)) return dt_error(DT_ERR_NOMEM, "pipeline stage: out of memory");
    *st = (dt_task_stage){.t = t, .l0 = l0, .l1 = l1};
    if (t->dg) {
        dt_status s = dt_dev_gpt_stage_create(t->dg, l0, l1, &st->ds);
        if (s != DT_OK) free(st), *out = NULL;
        return s;
    }
    dt_gpt_set_grad_hook(t->m, NULL, NULL);
    if (l0 == 0 && l1 == t->gc.n_layer && max_len <= t->Bm && !t->lent) {
        st->a = dt_gpt_default_acts(t->m);
        st->lent = t->lent = 1;
        return DT_OK;
    }
    dt_gpt_acts_params ap = acts_params(t, max_len, l0, l1);
    dt_status st_ = dt_gpt_acts_create_with(&st->a, &t->gc, &ap);
    if (st_ == DT_OK) count_acts(t, st->a, 1);
    if (st_ != DT_OK) {
        free(st);
        *out = NULL;
    }
    return st_;
}

static void gpt_stage_free(dt_task_stage *st) {
    if (!st) return;
    if (st->ds) dt_dev_gpt_stage_free(st->ds);
    else if (st->lent) st->t->lent = 0;
    else count_acts(st->t, st->a, 0), dt_gpt_acts_free(st->a);
    free(st);
}

static dt_status gpt_stage_begin(dt_task *t, dt_task_stage *st, int64_t step, int off, int len, float loss_scale,
                                 float **in, size_t *in_count, float **out, size_t *out_count) {
    (void)step;
    st->off = off;
    st->len = len;
    st->scale = loss_scale;
    dt_status s = DT_OK;
    if (st->ds) dt_dev_gpt_stage_streams(st->ds, in, out);
    else if ((s = dt_gpt_acts_set_shape(st->a, len, t->T)) == DT_OK) {  // (the streams' places depend on the shape)
        *in = dt_gpt_acts_resid(st->a, st->l0);
        *out = dt_gpt_acts_resid(st->a, st->l1);
    }
    // (sequence parallel: the shard's rows of the stream)
    *in_count = *out_count = (size_t)len * t->T * t->gc.n_embd / (t->ntp > 1 && t->c->sequence ? t->ntp : 1);
    return s;
}

static dt_status gpt_stage_forward(dt_task *t, dt_task_stage *st, float *loss) {
    size_t o = (size_t)st->off * t->T;
    if (st->ds && t->dev_err != DT_OK) return t->dev_err;
    if (st->ds)
        return dt_dev_gpt_stage_forward(st->ds, t->x + o, t->y + o, st->len, t->T, st->scale,
                                        dt_dev_loss_out(dt_dev_gpt_blocks(t->dg), loss));
    float *in = dt_gpt_acts_resid(st->a, st->l0), *out = dt_gpt_acts_resid(st->a, st->l1);
    dt_status s = DT_OK;
    if (st->l0 == 0) s = dt_gpt_embed_forward(t->m, st->a, t->x + o, in);
    if (s == DT_OK) s = dt_gpt_forward_range(t->m, st->a, st->l0, st->l1, in, out);
    if (s == DT_OK && st->l1 == t->gc.n_layer) s = dt_gpt_head_forward(t->m, st->a, out, t->y + o, loss);
    return s;
}

// (in place: the residual stream's gradient has the same size at both ends)
static dt_status gpt_stage_backward(dt_task *t, dt_task_stage *st, float *d, float **din) {
    if (st->ds) return dt_dev_gpt_stage_backward(st->ds, d, din);
    *din = d;
    float *in = dt_gpt_acts_resid(st->a, st->l0), *out = dt_gpt_acts_resid(st->a, st->l1);
    dt_status s = DT_OK;
    dt_gpt_set_loss_scale(t->m, st->scale);
    if (st->l1 == t->gc.n_layer) s = dt_gpt_head_backward(t->m, st->a, out, d);
    if (s == DT_OK) s = dt_gpt_backward_range(t->m, st->a, st->l0, st->l1, in, d);
    if (s == DT_OK && st->l0 == 0) s = dt_gpt_embed_backward(t->m, st->a, d);
    return s;
}

static dt_status gpt_evaluate(dt_task *t, dt_comm_t comm, int64_t step, float train_loss, float *loss,
                              float *accuracy) {
    *accuracy = -1;
    // A pipeline's stages train in sets of their own layers: its whole
    // forwards run in a forward-only set (two streams and one block's
    // activations), never touching the default set's every layer. Others
    // train in the default set, which the evaluation then reuses; on a
    // device the device model's forward runs them.
    dt_status st = DT_OK;
    if (t->c->pipeline > 1 && !t->eval && !t->dg) {
        dt_gpt_acts_params ap = acts_params(t, t->Bm, 0, t->gc.n_layer);
        ap.recompute = 0;
        ap.forward_only = 1;
        if ((st = dt_gpt_acts_create_with(&t->eval, &t->gc, &ap)) != DT_OK) return st;
        count_acts(t, t->eval, 1);
    }
    // Tensor parallel: the shards of one model run the same windows.
    gpt_fwd f = {t->m, t->eval, t->dg};
    dt_task_hook hook = {t->layer_fn, t->layer_user, DT_GPT_EMBED, t->gc.n_layer};
    st = dt_task_val_loss(gpt_lm_forward, &f, &t->val, t->c->eval_batches * t->B, t->Bm, t->T, t->gc.vocab_size, t->x,
                          t->y, t->ntp > 1 ? t->rest : comm, &hook, loss, NULL);
    if (st == DT_OK) dt_task_history_add(t->history, step, train_loss, *loss);
    return st;
}

static dt_status gpt_save(dt_task *t, const char *path, dt_comm_t comm, size_t lo, size_t hi) {
    dt_st_meta meta[8];
    dt_gpt_weights_meta(&t->gc, t->mvals, meta);
    meta[7] = (dt_st_meta){"dtrain_version", dt_version()};
    return dt_task_write_weights(path, t->tinfo, 16, meta, 8, dt_gpt_params(t->m),
                                 t->ntp > 1 || t->deferred ? part_fill : NULL, t, comm, lo, hi);
}

static void gpt_summary(dt_task *t, cJSON *o, const dt_train_result *r) {
    cJSON_AddStringToObject(o, "model", t->c->preset);
    cJSON_AddNumberToObject(o, "threads", dt_get_threads());
    cJSON_AddNumberToObject(o, "seq_len", t->T);
    if (r->test_loss >= 0) cJSON_AddNumberToObject(o, "val_loss", r->test_loss);
    else cJSON_AddNullToObject(o, "val_loss");
    cJSON_AddItemReferenceToObject(o, "val_history", t->history);
    cJSON_AddNumberToObject(o, "tokens_per_sec", r->samples_per_sec * t->T);
    cJSON_AddStringToObject(o, "recompute", t->c->recompute ? "blocks" : "none");
    // The activation sets' bytes as allocated (docs/mixed-precision.md).
    cJSON *pr = cJSON_GetObjectItem(o, "precision");
    if (pr) {
        cJSON_AddNumberToObject(pr, "activation_bytes", (double)t->act_bytes);
        cJSON_AddNumberToObject(pr, "activation_bytes_saved", (double)t->act_saved);
    }
}

const dt_task_ops dt_task_gpt = {
    .name = "gpt",
    .wants = gpt_wants,
    .warm = gpt_warm,
    .create = gpt_create,
    .destroy = gpt_destroy,
    .close = gpt_close,
    .start_epoch = gpt_start_epoch,
    .next_batch = gpt_next_batch,
    .zero_grad = gpt_zero_grad,
    .forward = gpt_forward,
    .backward = gpt_backward,
    .set_layer_hook = gpt_set_layer_hook,
    .regroup = gpt_regroup,
    .stage_create = gpt_stage_create,
    .stage_free = gpt_stage_free,
    .stage_begin = gpt_stage_begin,
    .stage_forward = gpt_stage_forward,
    .stage_backward = gpt_stage_backward,
    .scratch_batch = gpt_scratch_batch,
    .hold = gpt_hold,
    .evaluate = gpt_evaluate,
    .save = gpt_save,
    .summary = gpt_summary,
};
