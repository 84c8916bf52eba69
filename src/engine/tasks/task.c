/* What the model tables share (task.h): a tensor-parallel model's shard
 * groups, an evaluation's split over the ranks, a language model's
 * validation loss, the weights file, the layers' times. */
#include "dtrain/launch.h"
#include "engine/tasks/task.h"
#include "engine/checkpoints.h"
#include "engine/device.h"
#include "engine/worker.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_task_shard_groups(dt_comm_t comm, const dt_config *c, int *ntp, int *tp, dt_comm_t *tpc, dt_comm_t *rest,
                               dt_comm_t *gpus) {
    int rank = dt_comm_rank(comm);
    if (gpus && *gpus) {  // (made over tpc: gone first; a regroup's, aborted: a peer may be dead)
        dt_comm_abort(*gpus, "the tensor-parallel groups are made again");
        dt_comm_destroy(*gpus);
    }
    dt_comm_destroy(*tpc);
    dt_comm_destroy(*rest);
    *tpc = *rest = NULL;
    if (gpus) *gpus = NULL;
    *ntp = c->tensor > 1 ? c->tensor : 1;
    *tp = rank % *ntp;
    if (*ntp == 1) return DT_OK;
    char why[1024];
    dt_status st = dt_comm_split(comm, rank / *ntp, *tp, tpc);
    if (st == DT_OK) st = dt_comm_split(comm, *tp, rank, rest);
    if (st != DT_OK) return dt_error(st, "tensor parallel: splitting the workers: %s", dt_last_error());
    if (!gpus || dt_device_index(c->device) < 0) return DT_OK;
    if ((st = dt_train_device_comm(c, comm, *tpc, gpus, why, sizeof why)) != DT_OK)
        return dt_error(st, "tensor parallel: the shards' sums on the GPUs: %s", dt_last_error());
    if (rank == 0) dt_train_device_comm_said("tensor-parallel sums", *gpus, why);
    return DT_OK;
}

void dt_task_eval_share(long n, int r, int W, int chunk, int *lo, int *hi, int *extra) {
    *lo = (int)(n * r / W);
    *hi = (int)(n * (r + 1) / W);
    long most = (n + W - 1) / W, mine = *hi - *lo;
    *extra = (int)((most + chunk - 1) / chunk - (mine + chunk - 1) / chunk);
}

dt_status dt_task_replay(dt_task_layer_fn fn, void *user, int first, int last, int times) {
    dt_status st = DT_OK;
    for (int k = 0; fn && k < times && st == DT_OK; k++)
        for (int l = first; l <= last && st == DT_OK; l++) st = fn(l, 0, user);
    return st;
}

dt_status dt_task_val_loss(dt_task_lm_fn fwd, void *user, const dt_tokens *val, int windows, int Bc, int T, int V,
                           int32_t *x, int32_t *y, dt_comm_t comm, const dt_task_hook *hook, float *loss, float *acc) {
    int rank = comm ? dt_comm_rank(comm) : 0, W = comm ? dt_comm_size(comm) : 1, lo, hi, extra;
    dt_task_eval_share(windows, rank, W, Bc, &lo, &hi, &extra);
    double sums[2] = {0, 0};  // sum of window losses, correct predictions
    for (int i = lo; i < hi; i += Bc) {
        int n = hi - i < Bc ? hi - i : Bc;
        float l = 0;
        dt_status st = DT_OK;
        dt_heartbeat(-1);
        for (int b = 0; b < n && st == DT_OK; b++)
            st = dt_tokens_window(val, i + b, 1, T, x + (size_t)b * T, y + (size_t)b * T);
        const float *lg = NULL;
        if (st == DT_OK) st = fwd(user, x, y, n, T, &l, &lg);
        if (st != DT_OK) return st;
        sums[0] += (double)l * n;
        for (int r = 0; acc && r < n * T; r++) {
            int arg = 0;
            for (int v = 1; v < V; v++)
                if (lg[(size_t)r * V + v] > lg[(size_t)r * V + arg]) arg = v;
            sums[1] += arg == y[r];
        }
    }
    dt_status st = hook ? dt_task_replay(hook->fn, hook->user, hook->first, hook->last, extra) : DT_OK;
    if (st != DT_OK) return st;
    if (W > 1) {  // (counts stay exact in float up to 2^24 tokens)
        float fs[2] = {(float)sums[0], (float)sums[1]};
        if ((st = dt_allreduce(fs, fs, 2, DT_F32, DT_SUM, comm)) != DT_OK) return st;
        sums[0] = fs[0];
        sums[1] = fs[1];
    }
    *loss = (float)(sums[0] / windows);
    if (acc) *acc = (float)(sums[1] / ((double)windows * T));
    return DT_OK;
}

dt_status dt_task_open_tokens(dt_tokens *tk, const dt_config *c, int train, int r, int W) {
    const char *path = train ? c->train_file : c->val_file;
    int shard = train && W > 1 && dt_config_data_sharded(c);
    dt_status st = dt_tokens_open_shard(tk, path, c->vocab_size, shard ? r : 0, shard ? W : 1);
    size_t least = st == DT_OK ? tk->total / (size_t)tk->nshards : 0;  // (the smallest shard)
    if (st == DT_OK && least < (size_t)c->seq_len + 1)
        st = shard ? dt_error(DT_ERR_CONFIG, "%s: %zu tokens in %d shards ([data] shard): %zu in the smallest, fewer than "
                              "one window of [train] seq_len + 1 = %d", path, tk->total, W, least, c->seq_len + 1)
                   : dt_error(DT_ERR_CONFIG, "%s: %zu tokens, fewer than one window of [train] seq_len + 1 = %d", path,
                              tk->n, c->seq_len + 1);
    if (st == DT_OK && shard && r == 0)
        dt_log(DT_LOG_INFO, "data: each of %d ranks reads its shard of %s ([data] shard = %s): rank 0 tokens [0, %zu) "
                            "of %zu", W, path, c->data_shard == DT_DATA_SHARD_RANKS ? "ranks" : "auto, for s3:// data",
               tk->n, tk->total);
    if (st != DT_OK) dt_tokens_close(tk);
    return st;
}

dt_status dt_task_eval_tokens(const dt_config *c, dt_task_lm_fn fwd, void *user, float *loss, float *acc, int *n) {
    const char *file = c->val_file[0] ? c->val_file : c->train_file;
    int B = c->batch, T = c->seq_len;
    dt_tokens val = {0};
    int32_t *x = malloc(sizeof(int32_t) * B * T), *y = malloc(sizeof(int32_t) * B * T);
    dt_status st = x && y ? dt_tokens_open(&val, file, c->vocab_size) : dt_error(DT_ERR_NOMEM, "out of memory");
    if (st == DT_OK)
        st = dt_task_val_loss(fwd, user, &val, c->eval_batches * B, B, T, c->vocab_size, x, y, NULL, NULL, loss, acc);
    if (n) *n = c->eval_batches * B * T;
    dt_tokens_close(&val);
    free(x);
    free(y);
    return st;
}

void dt_task_history_add(cJSON *history, int64_t step, float train_loss, float val_loss) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "step", (double)step);
    cJSON_AddNumberToObject(e, "train_loss", train_loss);
    cJSON_AddNumberToObject(e, "val_loss", val_loss);
    cJSON_AddItemToArray(history, e);
}

// What of the whole block this rank holds: its parts (fill), or its slice
// [lo, hi) of params.
typedef struct {
    const float *params;
    size_t lo, hi;
    dt_part_fill_fn fill;
    void *user;
} held;

static void fill_held(void *user, size_t lo, size_t hi, float *buf) {
    held *h = user;
    if (h->fill) return h->fill(h->user, h->params, lo, hi, buf);
    size_t a = lo > h->lo ? lo : h->lo, b = hi < h->hi ? hi : h->hi;
    if (a < b) memcpy(buf + (a - lo), h->params + a, sizeof(float) * (b - a));
}

dt_status dt_task_write_weights(const char *path, const dt_tensor_info *tensors, int n, const dt_st_meta *meta,
                                int nmeta, const float *params, dt_part_fill_fn fill, void *user, dt_comm_t comm,
                                size_t lo, size_t hi) {
    if (!path && !comm) return DT_OK;
    held h = {params, lo, hi, fill, user};
    dt_status st = dt_run_weights_write(path, tensors, n, meta, nmeta, comm, fill_held, &h);
    return st == DT_OK ? DT_OK : dt_error(st, "saving the model: %s", dt_last_error());
}

// ---- the layers' times -------------------------------------------------------

int dt_task_layers(const dt_config *c) { return c->gpt ? c->n_layer : c->nlayers; }

// Layer l alone, DT_TASK_TIME_REPS times: its forwards' seconds into f, its
// backwards' into b (the layer's input and its output's gradient zeros).
static dt_status time_layer(const dt_task_ops *tops, dt_task *task, int rank, int l, int len, double *f, double *b) {
    dt_task_stage *st = NULL;
    float *in, *out, *d = NULL, *din;
    size_t inc, outc;
    dt_status rc = tops->stage_create(task, l, l + 1, len, &st);
    for (int r = 0; r < DT_TASK_TIME_REPS && rc == DT_OK; r++) {
        rc = tops->stage_begin(task, st, 0, 0, len, 1.0f / (float)len, &in, &inc, &out, &outc);
        if (rc == DT_OK && !d && !(d = calloc(outc > inc ? outc : inc, sizeof(float))))
            rc = dt_error(DT_ERR_NOMEM, "timing the layers: out of memory");
        if (rc != DT_OK) break;
        if (l > 0) memset(in, 0, sizeof(float) * inc);
        double t0 = dt_now();
        float loss;
        rc = tops->stage_forward(task, st, &loss);
        dt_fault_slow_layer(rank, l);
        f[r] = dt_now() - t0;
        memset(d, 0, sizeof(float) * outc);
        t0 = dt_now();
        if (rc == DT_OK) rc = tops->stage_backward(task, st, d, &din);
        b[r] = dt_now() - t0;
    }
    if (st) tops->stage_free(st);
    free(d);
    return rc;
}

// The layer whose time stands for layer l's: l itself, but for a GPT,
// whose blocks all cost the same: its first layer (with the embedding),
// its last (with the head) and the second (a block alone), which stands
// for the others.
static int timed_as(const dt_config *c, int l) {
    return !c->gpt || l == 0 || l == dt_task_layers(c) - 1 ? l : 1;
}

dt_status dt_task_time_layers(const dt_task_ops *tops, dt_task *task, const dt_config *c, dt_comm_t comm,
                              int samples, float *grads, size_t n, dt_task_layer_times *out) {
    int L = dt_task_layers(c), rank = dt_comm_rank(comm);
    double f[DT_TASK_TIME_REPS], b[DT_TASK_TIME_REPS];
    int64_t *ns = calloc(2 * (size_t)L, sizeof *ns);  // [forward, backward] of each layer
    *out = (dt_task_layer_times){.layers = L, .samples = samples, .forward = calloc((size_t)L, sizeof(double)),
                                 .backward = calloc((size_t)L, sizeof(double))};
    dt_status rc = L < 1 || samples < 1 || !tops->stage_create || !tops->scratch_batch
                       ? dt_error(DT_ERR_ARG, "timing the layers: the %s model has no layers to time", tops->name)
                   : ns && out->forward && out->backward ? DT_OK
                                                         : dt_error(DT_ERR_NOMEM, "timing the layers: out of memory");
    if (rc == DT_OK) rc = tops->scratch_batch(task, samples);
    for (int l = 0; l < L && rc == DT_OK; l++) {
        if (timed_as(c, l) != l) continue;
        if ((rc = time_layer(tops, task, rank, l, samples, f, b)) != DT_OK) break;
        ns[2 * l] = (int64_t)llround(dt_median(f, DT_TASK_TIME_REPS) * 1e9);
        ns[2 * l + 1] = (int64_t)llround(dt_median(b, DT_TASK_TIME_REPS) * 1e9);
        dt_zero_pages(grads, sizeof(float) * n);  // (the layer's, at once: one layer's at a time)
    }
    // (every rank reaches the allreduce, with its error after it: none waits for one that failed)
    dt_status ar = ns ? dt_allreduce(ns, ns, 2 * (size_t)L, DT_I64, DT_MAX, comm) : DT_ERR_NOMEM;
    if (rc == DT_OK && ar != DT_OK) rc = dt_error(ar, "timing the layers: agreeing on them: %s", dt_last_error());
    for (int l = 0; l < L && rc == DT_OK; l++) {
        out->forward[l] = (double)ns[2 * timed_as(c, l)] * 1e-9;
        out->backward[l] = (double)ns[2 * timed_as(c, l) + 1] * 1e-9;
    }
    free(ns);
    if (rc != DT_OK) dt_task_layer_times_free(out);
    return rc;
}

void dt_task_layer_times_free(dt_task_layer_times *t) {
    free(t->forward);
    free(t->backward);
    *t = (dt_task_layer_times){0};
}
