/* The run loop: one loop for every model and every way of distributing it.
 *
 * It reads top to bottom as a step does: the task (task.h: the classifier
 * or the GPT) gives the next global batch; the strategy (strategy.h) plans
 * this rank's micro-batches, hooks into backward and synchronises the
 * gradients; the control plane (control.h) agrees on the loss, a stop and a
 * save; the strategy then takes the global gradient norm and updates the
 * parameters it owns. Around the steps: resume and checkpoints
 * (checkpoints.h, from the strategy's view of what this rank holds),
 * evaluation at the end of each epoch and every eval_every steps, the
 * observer (obs/obs.h), and on rank 0 the run directory's files. */
#include "dtrain/comm.h"
#include "dtrain/launch.h"
#include "dtrain/train.h"
#include "engine/checkpoints.h"
#include "engine/codecs/codec.h"
#include "engine/control.h"
#include "engine/device.h"
#include "engine/dynbatch.h"
#include "engine/strategies/strategy.h"
#include "engine/tables.h"
#include "engine/tasks/task.h"
#include "engine/worker.h"
#include "kernels/kernels.h"
#include "obs/json.h"
#include "obs/obs.h"
#include "optim/elem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

// The model tables, in one place: the first that wants the config.
static const dt_task_ops *const tasks[] = {&dt_task_dlrm, &dt_task_llama, &dt_task_gpt, &dt_task_classifier};

const dt_task_ops *dt_task_for(const dt_config *c) {
    for (size_t i = 0; i < sizeof tasks / sizeof *tasks; i++)
        if (tasks[i]->wants(c)) return tasks[i];
    return &dt_task_classifier;
}

// [parallel] sequence divides a GPT's tensor-parallel shards' stream along
// the tokens of every micro-batch (engine/tasks/gpt.c).
static dt_status sequence_check(const dt_config *c) {
    if (!c->sequence) return DT_OK;
    if (!c->gpt)
        return dt_error(DT_ERR_CONFIG, "[parallel] sequence = true: only a GPT's tensor parallel divides its layernorms "
                                       "and residual stream along the tokens; use sequence = false");
    if (c->tensor < 2)
        return dt_error(DT_ERR_CONFIG, "[parallel] sequence = true divides what tensor-parallel ranks hold whole along "
                                       "the tokens, and tensor = %d; set tensor >= 2 or sequence = false", c->tensor);
    if (c->seq_len % c->tensor)
        return dt_error(DT_ERR_CONFIG, "[parallel] sequence = true: tensor = %d does not divide [train] seq_len = %d "
                                       "(each tensor rank keeps 1 / tensor of every micro-batch's tokens); choose a "
                                       "seq_len that it divides, or sequence = false", c->tensor, c->seq_len);
    return DT_OK;
}

dt_status dt_train_check(const dt_config *c, int W) {
    // One way of spreading the work at a time: the registry takes the
    // first strategy that wants the config, so a second one asked for
    // would be ignored without a word.
    const char *asked[4];
    int n = 0;
    if (c->ps_servers > 0) asked[n++] = "[parallel] servers";
    if (c->pipeline > 1 || c->tensor > 1) asked[n++] = c->pipeline > 1 ? "[parallel] pipeline" : "[parallel] tensor";
    // (ZeRO stage 1 shards a model-parallel run's optimizer state: engine/strategies/pipeline.c)
    if (c->zero > 0 && !(c->zero == 1 && (c->pipeline > 1 || c->tensor > 1))) asked[n++] = "[parallel] zero";
    if (c->sync_every > 0) asked[n++] = "[parallel] sync_every";
    if (n > 1)
        return dt_error(DT_ERR_CONFIG, "%s and %s cannot be combined (yet): choose one of parameter servers, model parallelism (tensor, pipeline), ZeRO and local SGD",
                        asked[0], asked[1]);
    // Dynamic batching reads each rank's speed from its forward and backward
    // time, which must be its own work: ZeRO-3's layer gathers make every
    // rank wait for the slowest inside them.
    if (c->dynamic_batch && (c->pipeline > 1 || c->tensor > 1 || c->ps_servers > 0 || c->sync_every > 0 || c->zero >= 3))
        return dt_error(DT_ERR_CONFIG, "[train] dynamic_batch works with data parallel and ZeRO stages 1-2, not with %s",
                        c->pipeline > 1      ? "[parallel] pipeline (which plans its own micro-batches)"
                        : c->tensor > 1     ? "[parallel] tensor (every rank of a shard group runs the same samples)"
                        : c->ps_servers > 0 ? "[parallel] servers (each worker pushes its own share's gradient)"
                        : c->sync_every > 0 ? "[parallel] sync_every (local SGD weights every rank's share alike)"
                                            : "[parallel] zero = 3 (its layer gathers hide each rank's speed)");
    // fp16's loss scaling finds an overflow as an inf or a NaN in the summed
    // gradients: fixed-point sums clamp them and lossy codecs may drop them.
    if (c->precision == DT_F16 && (c->deterministic || c->comp_method != DT_COMP_NONE))
        return dt_error(DT_ERR_CONFIG, "[train] precision = fp16 cannot be combined with %s (its overflow check needs the "
                                       "gradients' inf and NaN kept); use bf16, which needs no loss scaling",
                        c->deterministic ? "[parallel] deterministic = true" : "[compression] method");
    if (c->grad_dtype && (c->deterministic || (c->comp_method != DT_COMP_NONE && c->comp_method != DT_COMP_BF16)))
        return dt_error(DT_ERR_CONFIG, "[parallel] grad_dtype = bf16 cannot be combined with %s: %s",
                        c->deterministic ? "deterministic = true" : "[compression] method",
                        c->deterministic ? "deterministic sums are int64 fixed point" : "the method decides what is sent");
    // A parameter server decodes each worker's push on its own: the methods
    // with a message of one rank alone (codec.h).
    if (c->comp_method != DT_COMP_NONE && n > 0 && c->ps_servers == 0)
        return dt_error(DT_ERR_CONFIG,
                        "[compression] method works with plain data parallel and parameter servers only; %s does "
                        "not compress",
                        asked[0]);
    if (c->comp_method != DT_COMP_NONE && c->ps_servers > 0 && !dt_codec_p2p(c))
        return dt_error(DT_ERR_CONFIG,
                        "[compression] method = %s with [parallel] servers: a push is one worker's message, and %s "
                        "(use topk, fp16, bf16, int8, qsgd or sign)",
                        dt_comp_method_name(c->comp_method),
                        c->comp_method == DT_COMP_RANDOMK ? "random-k's indices are drawn alike by the ranks of one "
                                                            "allreduce"
                                                          : "PowerSGD needs two allreduces over the workers a piece");
    dt_status st = sequence_check(c);
    if (st == DT_OK && dt_tables_on_workers(c)) st = dt_tables_tp_check(c);
    if (st == DT_OK && c->recsys && c->rs_shard == 1 && !c->rs_sparse)
        st = dt_error(DT_ERR_CONFIG, "[recsys] shard = workers holds the tables by row: it needs sparse = true (false "
                                     "puts them in the block)");
    if (st == DT_OK) st = dt_strategy_for(c)->check(c, W);
    return st == DT_OK ? dt_check_offload(c) : st;
}

dt_status dt_train_warm(const dt_config *c) {
    if (!c) {  // released: what any task loaded ahead goes
        for (size_t i = 0; i < sizeof tasks / sizeof *tasks; i++)
            if (tasks[i]->warm) tasks[i]->warm(NULL);
        return DT_OK;
    }
    const dt_task_ops *t = dt_task_for(c);
    return t->warm ? t->warm(c) : DT_OK;
}

int dt_train_alone_from(const dt_config *c) {
    const dt_strategy_ops *s = dt_strategy_for(c);
    return s->alone_from ? s->alone_from(c) : -1;
}

dt_status dt_train_check_spares(const dt_config *c, int W, int spares) {
    if (spares <= 0 || dt_train_alone_from(c) >= 0) return DT_OK;  // (a spare there is a restart that is ready)
    if (dt_tables_on_workers(c))
        return dt_error(DT_ERR_CONFIG, "--spares with [recsys] shard = workers: each worker's shard of the tables is on "
                                       "it alone; use --max-restarts");
    const dt_strategy_ops *s = dt_strategy_for(c);
    if ((c->pipeline > 1 || c->tensor > 1) && c->zero == 1)
        return dt_error(DT_ERR_CONFIG, "--spares with model parallelism and [parallel] zero = 1: each rank's slice of "
                                       "the optimizer state is on it alone; use --max-restarts");
    if (c->tensor > 1 && W / c->tensor < 2)
        return dt_error(DT_ERR_CONFIG, "--spares with [parallel] tensor = %d on %d workers: each shard is on one "
                                       "worker alone, and a spare takes a dead worker's shard from a twin (the %d "
                                       "workers of its tensor rank); use %d workers or more, or --max-restarts",
                        c->tensor, W, W / c->tensor, 2 * c->tensor);
    int own = c->comp_method != DT_COMP_NONE || s->own_state;  // state no other rank has
    if (!s->replicated && !s->take_over && !own)
        return dt_error(DT_ERR_CONFIG, "--spares: strategy %s is not supported: a spare takes a dead worker's state "
                                       "from a surviving replica (data parallel: dp, dp-deterministic) or its slice "
                                       "from a buddy rank's copy (ZeRO: zero, zero-deterministic, zero-3), or is let "
                                       "in alone by its peers (parameter servers outside [ps] mode = sync), or every "
                                       "rank goes back to the newest checkpoint (local SGD, compression, ZeRO on "
                                       "a GPU); use --max-restarts",
                        s->name);
    if (own && c->ckpt_every_steps <= 0 && c->ckpt_every_seconds <= 0) {
        int codec = c->comp_method != DT_COMP_NONE, gpu_zero = dt_device_index(c->device) >= 0 && c->zero > 0;
        return dt_error(DT_ERR_CONFIG, "--spares with %s: each rank's %s is its own, so after a death every rank goes "
                                       "back to the newest checkpoint and redoes the steps since; checkpoints are off "
                                       "(add --checkpoint-every N)",
                        codec ? "[compression] method" : gpu_zero ? "[parallel] zero on a GPU"
                                                                  : "[parallel] sync_every (local SGD)",
                        codec ? "codec state (residuals)" : gpu_zero ? "slice of the optimizer state (on its GPU alone)"
                                                                     : "drift since the last average");
    }
    if (c->ckpt_sharded && s->replicated)  // ZeRO's own shards: a missing one is given up (dt_ckpt_writer_abandon)
        return dt_error(DT_ERR_CONFIG, "--spares with [checkpoint] sharded = true: a dead worker's shard of a "
                                       "checkpoint being written would never come; use whole checkpoints");
    return DT_OK;
}

// What summary.json reports of each rank: its peak resident memory, and the
// bytes it read of weights and checkpoint files (tensor data), of data
// files, and from object storage.
enum { RANK_FIGURES = 4 };
static void rank_figures(double *v) {
    struct rusage ru;
    v[0] = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : 0;
    v[1] = (double)dt_st_bytes_read();
    v[2] = (double)dt_data_bytes_read();
    v[3] = (double)dt_s3_bytes_read();
}

// summary.json's "layer_times" ([train] time_layers): the samples they were
// measured on and each layer's forward and backward seconds.
static void add_layer_times(cJSON *o, const dt_task_layer_times *t) {
    if (t->layers < 1) return;
    cJSON *j = cJSON_AddObjectToObject(o, "layer_times");
    cJSON_AddNumberToObject(j, "samples", t->samples);
    cJSON *f = cJSON_AddArrayToObject(j, "forward_seconds"), *b = cJSON_AddArrayToObject(j, "backward_seconds");
    for (int l = 0; l < t->layers; l++) {
        cJSON_AddItemToArray(f, cJSON_CreateNumber(t->forward[l]));
        cJSON_AddItemToArray(b, cJSON_CreateNumber(t->backward[l]));
    }
}

static dt_status write_summary(const char *path, const dt_config *c, const dt_task_ops *tops, dt_task *task,
                               dt_strategy *strat, const dt_train_result *r, size_t nparams, const double *peaks,
                               const dt_task_layer_times *layers) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "dtrain_version", dt_version());
    cJSON_AddStringToObject(o, "strategy", dt_strategy_for(c)->name);
    cJSON_AddStringToObject(o, "compression", dt_comp_method_name(c->comp_method));
    cJSON *pr = cJSON_AddObjectToObject(o, "precision");  // docs/mixed-precision.md
    cJSON_AddStringToObject(pr, "compute", c->precision == DT_F32 ? "fp32" : c->precision == DT_BF16 ? "bf16" : "fp16");
    cJSON_AddBoolToObject(pr, "native", c->precision != DT_F32 && dt_kernels_native((dt_dtype)c->precision));
    cJSON_AddStringToObject(pr, "kernels", dt_kernels_describe((dt_dtype)c->precision));
    dt_kernels_wstats ws;
    dt_kernels_weights_stats(&ws);
    if (ws.bytes) {  // the weights' 16-bit working copy (kernels.h)
        cJSON *wc = cJSON_AddObjectToObject(pr, "weight_copy");
        cJSON_AddNumberToObject(wc, "bytes", (double)ws.bytes);
        cJSON_AddNumberToObject(wc, "converted", (double)ws.converted);
        cJSON_AddNumberToObject(wc, "conversions_saved", (double)ws.reused);
    }
    if (c->precision == DT_F16) cJSON_AddNumberToObject(pr, "loss_scale", r->loss_scale);
    if (c->precision == DT_F16 || r->skipped_steps > 0) cJSON_AddNumberToObject(pr, "skipped_steps", (double)r->skipped_steps);
    cJSON_AddNumberToObject(o, "params", (double)nparams);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    cJSON_AddNumberToObject(o, "batch", c->batch);
    cJSON_AddNumberToObject(o, "final_train_loss", r->final_train_loss);
    cJSON_AddNumberToObject(o, "wall_seconds", r->wall_seconds);
    cJSON_AddNumberToObject(o, "train_seconds", r->train_seconds);
    cJSON_AddNumberToObject(o, "samples_per_sec", r->samples_per_sec);
    tops->summary(task, o, r);
    dt_json_add_parallel(o, r);
    if (strat->ops->summary) strat->ops->summary(strat, o);
    add_layer_times(o, layers);
    // Rank 0's bytes by kind at its ZeRO stage (docs/zero.md), beside its
    // peak resident memory.
    dt_memory_kinds k;
    int held = dt_memory_zero_held(c, r->workers);
    size_t state = dt_memory_model_state(c, DT_MEM_TRAIN, nparams, held, r->workers, &k);
    struct rusage ru;
    cJSON *m = cJSON_AddObjectToObject(o, "memory");
    cJSON_AddNumberToObject(m, "zero", c->zero);
    if (c->zero >= 2) cJSON_AddBoolToObject(m, "pages_kept", held < c->zero);
    cJSON_AddNumberToObject(m, "weights_bytes", (double)k.weights);
    cJSON_AddNumberToObject(m, "gradients_bytes", (double)k.gradients);
    cJSON_AddNumberToObject(m, "optimizer_state_bytes", (double)k.optimizer);
    cJSON_AddNumberToObject(m, "comm_buffer_bytes", (double)k.comm);
    cJSON_AddNumberToObject(m, "model_state_bytes", (double)state);
    cJSON_AddNumberToObject(m, "activations_bytes", (double)dt_memory_activations(c, r->workers));
    if (c->offload) {  // the state file, and what this process read and wrote on storage (/proc/self/io)
        cJSON_AddNumberToObject(m, "offloaded_bytes", (double)k.offloaded);
        FILE *io = fopen("/proc/self/io", "r");
        char line[128];
        unsigned long long v;
        while (io && fgets(line, sizeof line, io)) {
            if (sscanf(line, "read_bytes: %llu", &v) == 1) cJSON_AddNumberToObject(m, "disk_read_bytes", (double)v);
            if (sscanf(line, "write_bytes: %llu", &v) == 1) cJSON_AddNumberToObject(m, "disk_write_bytes", (double)v);
        }
        if (io) fclose(io);
    }
    cJSON_AddNumberToObject(m, "peak_rss_bytes", getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : 0);
    cJSON_AddNumberToObject(m, "formula_bytes", (double)dt_memory_worker(c, r->workers, NULL));
    // (peaks: each rank's RANK_FIGURES; NULL: one rank)
    double one[RANK_FIGURES];
    rank_figures(one);
    const double *v = peaks ? peaks : one;
    cJSON *rp = peaks ? cJSON_AddArrayToObject(m, "ranks_peak_rss_bytes") : NULL, *io = cJSON_AddObjectToObject(o, "io");
    const char *names[RANK_FIGURES] = {NULL, "ranks_read_bytes", "ranks_data_read_bytes", "ranks_s3_read_bytes"};
    for (int k = 0; k < RANK_FIGURES; k++) {
        cJSON *a = k ? cJSON_AddArrayToObject(io, names[k]) : rp;
        for (int i = 0; a && i < (peaks ? r->workers : 1); i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[RANK_FIGURES * i + k]));
    }
    const char *lname;
    if (dt_worker_mem_cap()[0]) {  // --memory-limit, and how the kernel enforces it
        cJSON_AddNumberToObject(m, "cap_bytes", (double)dt_mem_limit(&lname));
        cJSON_AddStringToObject(m, "cap", dt_worker_mem_cap());
    }
    return dt_json_write(path, o);
}

// The task's layer hook, for a strategy that gathers parameters per layer.
static dt_status params_needed(int layer, int phase, void *user) {
    dt_strategy *s = user;
    return s->ops->params_needed(s, layer, phase);
}

// A strategy with ranks of another role (the parameter servers): the
// world's first ranks run its own loop (serve) to the end of the run
// (*served = 1); the others go on as the workers, over a communicator of
// their own in *workers.
static dt_status split_roles(const dt_strategy_ops *sops, const dt_config *c, dt_comm_t all, const char *run_dir,
                             dt_comm_t *workers, int *served) {
    int k = sops->other_ranks ? sops->other_ranks(c) : 0, r = dt_comm_rank(all), size = dt_comm_size(all);
    *workers = all;
    *served = 0;
    if (k <= 0) return DT_OK;
    if (k >= size)
        return dt_error(DT_ERR_CONFIG, "strategy %s: the first %d of the %d ranks are servers; none is left to train",
                        sops->name, k, size);
    dt_comm_t mine;
    // A worker or server restarted alone (ps/, outside mode sync) takes
    // its predecessor's place among its peers without them.
    dt_status st = dt_comm_incarnation(all) > 0 ? dt_comm_split_rejoin(all, r < k, &mine)
                                                 : dt_comm_split(all, r < k, r, &mine);
    if (st != DT_OK) return dt_error(st, "rank %d, splitting the workers from the servers: %s", r, dt_last_error());
    if (r >= k) {
        *workers = mine;
        return DT_OK;
    }
    *served = 1;
    return dt_worker_exit(mine, sops->serve(c, all, mine, run_dir));
}

// A death in the start's collectives (--spares): this rank waits for the
// spare in the dead rank's place (dt_comm_rejoin) and skips the rest of
// the start; every rank then takes the start's state from a replica as
// after a death mid-run (*lost = 1).
static dt_status lose_start(dt_comm_t comm, int *lost) {
    dt_log(DT_LOG_DEBUG, "%s; waiting for a spare to take the dead rank's place", dt_last_error());
    dt_status st = dt_comm_rejoin(comm, 0);
    if (st != DT_OK) return dt_error(st, "rank %d, at the start: %s", dt_comm_rank(comm), dt_last_error());
    *lost = 1;
    return DT_OK;
}

// A checkpoint the strategy's own ranks write (dt_run_ckpt_set_saver).
static dt_status save_by_strategy(void *user, const dt_train_state *ts, char *lost, size_t n) {
    dt_strategy *s = user;
    return s->ops->ckpt_save(s, ts, lost, n);
}

// A recommender's rows from the strategy's servers (tables_remote).
static dt_status pull_rows(void *user, const int64_t *ids, size_t n, float *vals) {
    dt_strategy *s = user;
    return s->ops->rows_pull(s, ids, n, vals);
}

// Before a step's forward and after its backward: the rows its share
// touches from the servers, then their gradients back (tables_remote).
static dt_status step_rows(const dt_task_ops *tops, dt_task *task, dt_strategy *s, int push) {
    const int64_t *ids;
    size_t n;
    float *vals, *grads;
    tops->rows(task, &ids, &n, &vals, &grads);
    dt_status st = push ? s->ops->rows_push(s, ids, n, grads) : s->ops->rows_pull(s, ids, n, vals);
    return st == DT_OK ? DT_OK : dt_error(st, "the tables' rows: %s", dt_last_error());
}

// A fixed shard's gradient of one tensor into the strategy's fixed-point
// sums (dt_grad_part_fn; segments).
static void shard_part(size_t offset, size_t count, const float *g, void *user) {
    dt_strategy *s = user;
    dt_fixed_add(s->fixed + offset, g, count, DT_FIXED_SCALE);
}

// The strategy's segments of micro-batch 0 (its fixed shards run together)
// to the task, each loss scaled as its own micro-batch's would be.
static dt_status segments(const dt_task_ops *tops, dt_task *task, dt_strategy *s) {
    if (!tops->segments) return dt_error(DT_ERR_CONFIG, "task %s: the strategy's shards cannot run together", tops->name);
    float scale[s->nseg];
    for (int j = 0; j < s->nseg; j++) scale[j] = (float)s->seg_len[j] / (float)s->loss_denom * s->loss_scale;
    return tops->segments(task, s->nseg, s->seg_len, scale, shard_part, s);
}

// One step's micro-batches, forward and backward, on this rank; *loss_sum
// gets the sum of their losses weighted by their sizes.
static dt_status micro_steps(const dt_task_ops *tops, dt_task *task, dt_strategy *s, dt_obs *obs, int64_t step,
                             const dt_task_batch *b, double *loss_sum) {
    int nm = dt_strategy_plan(s, b->first, b->share, b->global);
    *loss_sum = 0;
    for (int k = 0; k < nm; k++) {
        float loss;
        double t0 = dt_now();
        dt_status st = s->nseg ? segments(tops, task, s) : DT_OK;
        if (st != DT_OK) return st;
        dt_obs_begin(obs, DT_OBS_FORWARD);
        st = tops->forward(task, step, s->off[k], s->len[k], (float)s->len[k] / (float)s->loss_denom * s->loss_scale,
                           &loss);
        if (st == DT_OK && k == 0) st = dt_fault_step(s->rank, step + 1);
        dt_obs_end(obs, DT_OBS_FORWARD);
        if (st != DT_OK) return st;
        void *user;
        dt_grad_ready_fn hook = dt_strategy_grad_hook(s, k, &user);
        dt_obs_begin(obs, DT_OBS_BACKWARD);
        st = tops->backward(task, hook, user);
        if (st == DT_OK) dt_strategy_micro_end(s, k);
        dt_fault_slow(s->rank, dt_now() - t0);
        dt_obs_end(obs, DT_OBS_BACKWARD);
        if (st != DT_OK) return st;
        *loss_sum += (double)loss * s->len[k];
    }
    return tops->micro_pad ? tops->micro_pad(task, nm) : DT_OK;
}

// Dynamic batching: every rank's forward and backward time and share of
// this step (from the control plane's allgather) into the split of the
// batches to come.
static dt_status rebalance(dt_dynbatch *dyn, dt_obs *obs, const dt_task_ops *tops, dt_task *task, int rank, int W,
                           int nunits, int64_t step) {
    double sec[W];
    int share[W], units[W];
    for (int r = 0; r < W; r++) share[r] = dt_obs_rank_work(obs, r, &sec[r]);
    if (!dt_dynbatch_update(dyn, sec, share, units)) return DT_OK;
    if (rank == 0) {
        char line[512];
        int o = 0;
        for (int r = 0; r < W && o < (int)sizeof line - 16; r++) o += snprintf(line + o, sizeof line - o, " %d", units[r]);
        dt_log(DT_LOG_DEBUG, "dynamic batch: after step %lld, units of %d per rank:%s", (long long)step, nunits, line);
    }
    return tops->set_shares(task, units, nunits);
}

// fp16's overflow check: an inf or a NaN among the gradients this rank
// updates, or one injected (DTRAIN_FAULT_OVERFLOW=RANK:STEP puts an inf
// there, after the gradients are synchronised, as an overflow no other rank
// sees).
static int grads_overflow(dt_strategy *s, int64_t step) {
    if (s->hi > s->lo && dt_fault_overflow(s->rank, step)) s->grads[s->lo] = INFINITY;
    return dt_count_nonfinite(s->grads + s->lo, s->hi - s->lo, DT_F32) != 0;
}

// The step's skip, once every rank agreed on whether it overflowed: fp16's
// loss scaler halves its scale (or grows it) and says, or a non-finite
// gradient is logged and counted in *skipped. 1: the step is skipped.
static int overflow_skips(dt_strategy *s, dt_loss_scaler *scaler, int overflow, int64_t step, int64_t *skipped) {
    if (scaler) {
        int skip = !dt_loss_scaler_update(scaler, overflow);
        s->loss_scale = scaler->scale;
        return skip;
    }
    if (!overflow) return 0;
    (*skipped)++;
    if (s->rank == 0)
        dt_log(DT_LOG_WARN, "step %lld: the gradient holds NaN or Inf after the gradients' exchange: the step is "
               "skipped (%lld so far)", (long long)step + 1, (long long)*skipped);
    return 1;
}

// One rank on a device (the strategy's update_end): the norm, the clipping
// and the skip made on the device and the update queued behind them, the
// host's one read last; then the control plane and the skip's bookkeeping.
static dt_status finish_on_device(dt_strategy *s, dt_run_ckpt *ck, dt_obs *obs, float lr, int64_t step,
                                  double loss_sum, int global, dt_loss_scaler *scaler, dt_control *ctl, float *gnorm,
                                  int64_t *skipped) {
    int vote = dt_run_ckpt_vote(ck), overflow = 0;
    float unscale = 1.0f / s->loss_scale;
    double norm = 0;
    dt_obs_begin(obs, DT_OBS_COMM);
    dt_status st = dt_strategy_sync(s);
    dt_obs_end(obs, DT_OBS_COMM);
    dt_obs_begin(obs, DT_OBS_OPTIMIZER);
    if (st == DT_OK)
        st = s->ops->update_end(s, step + 1, lr, s->c->optim.clip_norm, unscale, &loss_sum, &norm, &overflow);
    dt_obs_end(obs, DT_OBS_OPTIMIZER);
    if (st == DT_OK) st = dt_control_agree(obs, s->comm, loss_sum, global, vote, overflow, ctl);
    if (st != DT_OK) return st;
    dt_step_scale(norm, unscale, 0, gnorm);
    overflow_skips(s, scaler, ctl->overflow, step, skipped);  // (the device skipped it already)
    return DT_OK;
}

// The rest of a step: gradients synchronised, the control plane's
// agreement, then the norm, clipping, the schedule and the update. With a
// loss scaler (fp16) the gradients are the loss scale's multiple: the norm
// and the update divide it out, and a step that overflowed on any rank is
// skipped by all. In any precision, a step whose synchronised gradient
// holds NaN or Inf on any rank (a worker's faulty gradient, which the
// allreduce spread: it cannot tell whose) is skipped by all, logged and
// counted in *skipped; parameter servers screen the pushes themselves
// (ps/robust.c). One rank on a device ends its step there
// (finish_on_device).
static dt_status finish_step(dt_strategy *s, dt_run_ckpt *ck, dt_obs *obs, const dt_schedule *sched, int64_t step,
                             double loss_sum, int global, dt_loss_scaler *scaler, dt_control *ctl, float *lr,
                             float *gnorm, int64_t *skipped) {
    *lr = dt_schedule_lr(sched, step);
    if (dt_strategy_ends_on_device(s))
        return finish_on_device(s, ck, obs, *lr, step, loss_sum, global, scaler, ctl, gnorm, skipped);
    int vote = dt_run_ckpt_vote(ck);
    dt_obs_begin(obs, DT_OBS_COMM);
    dt_status st = dt_strategy_sync(s);
    int watch = scaler || (s->opt && s->c->ps_servers == 0);
    int overflow = 0;
    if (st == DT_OK && s->ops->grads_nonfinite) st = s->ops->grads_nonfinite(s, step + 1, &loss_sum, &overflow);
    else if (watch && st == DT_OK) overflow = grads_overflow(s, step + 1);
    overflow &= watch;
    if (st == DT_OK && s->own_pace) dt_control_local(loss_sum, s->loss_denom, vote, overflow, ctl);
    else if (st == DT_OK) st = dt_control_agree(obs, s->comm, loss_sum, global, vote, overflow, ctl);
    dt_obs_end(obs, DT_OBS_COMM);
    if (st != DT_OK) return st;
    dt_obs_begin(obs, DT_OBS_OPTIMIZER);
    double norm;
    float unscale = 1.0f / s->loss_scale;
    st = dt_strategy_grad_norm(s, &norm);
    float scale = dt_step_scale(norm, unscale, s->c->optim.clip_norm, gnorm);
    dt_optim_set_skip(s->opt, overflow_skips(s, scaler, watch && ctl->overflow, step, skipped));
    if (st == DT_OK) st = dt_strategy_update(s, *lr, scale);
    dt_optim_set_skip(s->opt, 0);
    dt_obs_end(obs, DT_OBS_OPTIMIZER);
    return st;
}

// fp16's loss scaler as a checkpoint or a replica's state left it (a state
// without one, loss_scale 0, leaves the scaler as it is).
static void scaler_from_state(dt_loss_scaler *sc, const dt_train_state *ts) {
    if (ts->loss_scale <= 0) return;
    sc->scale = ts->loss_scale;
    sc->clean = (int)ts->scale_clean;
    sc->skipped = ts->scale_skipped;
}

// ---- the run: its state, then its phases in the order they run ------------

/* How this process came to its rank, and where it stands in a recovery
 * (docs/internals.md, "Replacement"). A process that takes a dead rank's
 * place is met by every rank in a new generation and gets the state of a
 * replica (recover), or is let in alone by its peers and takes its state
 * and its place in the loop from the strategy's restore (join_at). */
typedef struct {
    dt_place place;    // at the start, met in a new generation, or let in alone (dt_worker_place)
    int have_state;    // holds a training state: all but a replica's newcomer before its first recover
    int lost_start;    // a death broke the start's collectives: the rest of the start was skipped
    int owed;          // let in alone: the meeting after its predecessor's last step comes first
    int repair;        // the failure just returned is one a spare repairs: recover, then go on
    int begun;         // this process has begun a training step (a recovery with no checkpoint cannot go
                       // back to the start then)
    double failed_at;  // when the step being recovered failed (0: none is)
} recovery;

typedef struct {
    const dt_config *c;
    dt_config fresh;  // c as checkpoints take it (the run's checkpoint state keeps a pointer to it)
    const dt_task_ops *tops;
    const dt_strategy_ops *sops;
    dt_task *task;
    dt_task_info info;
    dt_strategy *strat;
    dt_dynbatch *dyn;
    dt_comm_t comm, all;  // the workers'; every rank's (the same without servers)
    dt_obs *obs;
    dt_run_ckpt ck;
    dt_train_result *res;
    const char *run_dir, *ckpt_run_dir;  // rank 0's files (NULL on the others); the checkpoints' (every rank's)
    dt_progress_fn progress;
    void *user;
    int rank, W, threads, model_rows;
    int over;  // this rank's part ended early: a server ran its own loop, or its predecessor had finished
    uint64_t split_gen;  // the generation the task's and the strategy's sub-communicators were split in
    recovery rec;
    dt_task_layer_times layers;  // [train] time_layers: the layers' measured times (layers = 0: none)
    // the position and the figures of the steps
    dt_train_state ts;  // at the last meeting, or as resumed or shared
    dt_rng rng;         // the data's stream
    int64_t step, samples, loss_n, total, spe;
    int epochs, nunits;
    int pieces;  // [ps] share = dynamic: the servers hand out the pieces of an epoch's batches
    int alone;   // ranks at their own pace: rank 0 evaluates alone
    int fp16, stop, evaluated;
    double t_start, t_train, loss_sum;
    uint64_t bytes_sent;  // by this rank during the steps (dt_obs_bytes_sent)
    dt_schedule sched;
    dt_loss_scaler scaler;
} run_state;

// Joins the workers: a role (a server runs its own loop to the end of the
// run), the observer, and the checks every worker makes before it
// allocates. Spares (docs/checkpoints.md): a rank whose collective fails on
// a peer's death waits for a spare to take its place and goes on
// (recover); a spare gets its state there. A death in the start's
// collectives is the same: the others rejoin there (in dt_worker_init's
// barrier, or here: lose_start), skip the rest of the start's collectives
// and meet the spare in recover.
static dt_status join(run_state *r) {
    const dt_config *c = r->c;
    recovery *rec = &r->rec;
    dt_status st;
    int served;
    rec->place = dt_worker_place(r->comm);
    rec->have_state = rec->place != DT_PLACE_REPLICA;
    rec->lost_start = rec->have_state && dt_comm_generation(r->comm) > 0;
    int world = dt_comm_size(r->comm) - (r->sops->other_ranks ? r->sops->other_ranks(c) : 0);
    if ((st = dt_train_check_spares(c, world, dt_worker_spares())) != DT_OK) return st;
    if ((st = split_roles(r->sops, c, r->all, r->run_dir, &r->comm, &served)) != DT_OK) return st;
    if (served) {
        r->res->rank = -1;  // not a worker: nothing to report
        r->over = 1;
        return DT_OK;
    }
    r->rank = dt_comm_rank(r->comm);
    r->W = dt_comm_size(r->comm);
    if (rec->have_state && (st = dt_fault_at(r->rank, 0, "metrics")) != DT_OK) return st;  // (a test's fault)
    st = dt_obs_create(&r->obs, c, r->run_dir, r->comm, r->progress, r->user);
    if (dt_worker_recoverable(st) && rec->have_state && !rec->lost_start) {  // a death in its barrier; again without it
        if ((st = lose_start(r->comm, &rec->lost_start)) != DT_OK) return st;
        st = dt_obs_create(&r->obs, c, r->run_dir, r->comm, r->progress, r->user);
    }
    if (st != DT_OK) return st;
    dt_obs_set_all(r->obs, r->all);
    r->ckpt_run_dir = r->run_dir;  // sharded checkpoints: every rank writes
    if (r->rank != 0) r->run_dir = NULL;  // only rank 0 writes files and reports progress
    r->res->rank = r->rank;
    r->res->workers = r->W;
    r->res->threads = r->threads;
    if ((st = dt_train_check(c, r->W)) != DT_OK) return st;
    if ((st = dt_train_device_use(c, r->comm)) != DT_OK) return st;
    // the largest batch the model runs, from the memory check
    if ((st = dt_check_memory(c, DT_MEM_TRAIN, r->W, 0, &r->model_rows)) != DT_OK) return st;
    return dt_worker_run_dir(c, r->run_dir);
}

// [train] time_layers: each layer's forward and backward timed once the
// model is made, before the strategy touches it (dt_task_time_layers, on
// the largest micro-batch), for summary.json; batch norm's running
// statistics, which the scratch batch moves, are put back. Not on a rank
// that replaces another (the others are past it), nor where the model has
// no stages or trains on a GPU.
static dt_status time_layers(run_state *r) {
    const dt_task_info *info = &r->info;
    if (!r->c->time_layers || r->rec.place != DT_PLACE_START || r->rec.lost_start) return DT_OK;
    if (!r->tops->stage_create || info->device) {
        if (r->rank == 0)
            dt_log(DT_LOG_WARN, "[train] time_layers: the layers are not timed (%s)",
                   info->device ? "not on a GPU" : "the model has no stages to time them by");
        return DT_OK;
    }
    size_t nf = 0, o = 0;
    for (int i = 0; i < info->nfrozen; i++) nf += info->frozen[i].len;
    float *keep = nf ? malloc(sizeof(float) * nf) : NULL;
    if (nf && !keep) return dt_error(DT_ERR_NOMEM, "[train] time_layers: out of memory");
    for (int i = 0; i < info->nfrozen; o += info->frozen[i++].len)
        memcpy(keep + o, info->params + info->frozen[i].offset, sizeof(float) * info->frozen[i].len);
    dt_status st = dt_task_time_layers(r->tops, r->task, r->c, r->comm, r->sops->max_micro(r->c, r->W), info->grads,
                                       info->nparams, &r->layers);
    o = 0;
    for (int i = 0; i < info->nfrozen; o += info->frozen[i++].len)
        memcpy(info->params + info->frozen[i].offset, keep + o, sizeof(float) * info->frozen[i].len);
    free(keep);
    if (st != DT_OK) return dt_error(st, "[train] time_layers: %s", dt_last_error());
    if (r->rank == 0)
        dt_log(DT_LOG_INFO, "timed the %d layers' forward and backward on %d samples (summary.json's layer_times)",
               r->layers.layers, r->layers.samples);
    return DT_OK;
}

// The model and its data, every rank from rank 0's parameters, and the
// strategy over them. A rank let in alone skips the start's collectives,
// which the others made long ago with its predecessor: it gets the weights
// and its step from the strategy (resume_or_join).
static dt_status build(run_state *r) {
    const dt_config *c = r->c;
    const dt_task_ops *tops = r->tops;
    dt_task_info *info = &r->info;
    recovery *rec = &r->rec;
    dt_status st = tops->create(&r->task, c, r->comm, r->sops->max_micro(c, r->W), r->model_rows, info);
    if (st != DT_OK) return st;
    if (rec->have_state && (st = dt_fault_at(r->rank, 0, "start")) != DT_OK) return st;  // (a test's fault)
    if (rec->place == DT_PLACE_START && !rec->lost_start && !info->deferred && !info->sliced &&
        (st = dt_broadcast(info->params, info->params, info->nparams, DT_F32, 0,
                           info->replicas ? info->replicas : r->comm)) != DT_OK) {
        if (dt_worker_recoverable(st)) st = lose_start(r->comm, &rec->lost_start);
        if (st != DT_OK) return dt_error(st, "broadcast of the initial parameters: %s", dt_last_error());
    }
    if ((st = time_layers(r)) != DT_OK) return st;
    dt_strategy_args sa = {c, r->comm, info->params, info->grads, info->nparams, info->order, info->norder, r->obs,
                           info->order_layer, r->all, info->order_split, info->nwhole, info->part_fill,
                           info->part_take, info->part_user, info->replicas, info->tensor_group, info->matrices,
                           info->nmatrices, info->tied, info->device, info->frozen, info->nfrozen};
    if ((st = dt_strategy_create(&r->strat, r->sops, &sa)) != DT_OK) return st;
    // What this rank keeps of the model (a pipeline stage: its layers).
    if (r->sops->layout &&
        (st = r->sops->layout(r->strat, tops, r->task, rec->place != DT_PLACE_START || rec->lost_start)) != DT_OK) {
        if (!dt_worker_recoverable(st) || rec->place != DT_PLACE_START || (st = lose_start(r->comm, &rec->lost_start)) != DT_OK)
            return st;
    }
    r->split_gen = dt_comm_generation(r->comm);
    dt_memory_kinds mk;
    dt_memory_model_state(c, DT_MEM_TRAIN, info->nparams, dt_memory_zero_held(c, r->W), r->W, &mk);
    dt_obs_set_memory(r->obs, (double[DT_OBS_MEM_KINDS]){(double)mk.weights, (double)mk.gradients,
                                                         (double)mk.optimizer, (double)mk.comm,
                                                         (double)dt_memory_activations(c, r->W)});
    if (info->tables_remote) {  // the recommender's tables on the servers: evaluation pulls its rows too
        if (!r->sops->rows_pull || !tops->rows || !tops->set_rows_source)
            return dt_error(DT_ERR_CONFIG, "the %s model's tables are on parameter servers, but strategy %s holds "
                                           "no tables", tops->name, r->sops->name);
        tops->set_rows_source(r->task, pull_rows, r->strat);
    }
    if (r->sops->params_needed) {
        if (!tops->set_layer_hook)
            return dt_error(DT_ERR_CONFIG, "strategy %s gathers parameters layer by layer; the %s model has no "
                                           "layers to hook",
                            r->sops->name, tops->name);
        tops->set_layer_hook(r->task, params_needed, r->strat);
    }
    // Dynamic batching: units of the global batch (its samples, or the
    // deterministic mode's fixed shards) dealt by speed.
    r->nunits = c->deterministic ? c->micro_shards : c->batch;
    if (c->dynamic_batch && !tops->set_shares)
        return dt_error(DT_ERR_CONFIG, "[train] dynamic_batch: the %s model's batches cannot be split unevenly",
                        tops->name);
    return c->dynamic_batch && r->W > 1 ? dt_dynbatch_create(&r->dyn, r->W, c->batch, r->nunits) : DT_OK;
}

// A rank let in alone (the strategy's `rejoined`: ps/) takes its
// predecessor's place in the loop, so that it meets the others where they
// meet; when its predecessor had made step `at`, it runs the meeting after
// that step first (owed: the others may be in it), as at the end of that
// step.
static void join_at(run_state *r) {
    dt_strategy *s = r->strat;
    dt_train_state *ts = &r->ts;
    int64_t at = s->rejoin_step, spe = r->info.steps_per_epoch > 0 ? r->info.steps_per_epoch : 1,
            every = r->c->ckpt_every_steps;
    int owed = s->rejoin_meet && at > 0;
    r->rec.owed = owed;
    ts->step = at;
    ts->epoch = (owed ? at - 1 : at) / spe;
    ts->epoch_batch = at - ts->epoch * spe;
    // (the save the meeting it owes may make: every K steps, or at the end)
    r->ck.last_step = every > 0 ? at - (owed && at % every == 0 ? every : at % every) : owed ? at - 1 : at;
    if (s->rejoin_pieces) {  // dynamic sharing: the workers' steps say nothing of the epoch; server 0 does
        ts->epoch = s->rejoin_epoch;
        ts->epoch_batch = s->unit < 0 ? spe : 0;  // (spe: its epoch's end, whose meeting it runs first)
    }
}

// Checkpoints: the weights, the optimizer state as this rank holds it, the
// loop's position and its data stream. Resumed from one when asked; a rank
// let in alone resumes nothing: the strategy's restore says where it joins
// (join_at).
static dt_status resume_or_join(run_state *r) {
    const dt_config *c = r->c;
    dt_strategy *s = r->strat;
    dt_ckpt_model cm = {.tensors = r->info.tensors,
                        .ntensors = r->info.ntensors,
                        .weights_meta = r->info.weights_meta,
                        .nweights_meta = r->info.nweights_meta};
    dt_strategy_ckpt_view(s, &cm);
    r->ts = (dt_train_state){.rng = r->info.rng};
    r->fresh = *c;
    if (r->rec.place == DT_PLACE_ALONE) r->fresh.resume[0] = 0;
    dt_status st = dt_run_ckpt_begin(&r->ck, &r->fresh, r->ckpt_run_dir, r->comm, &cm, &r->ts);
    // Resumed: rank 0 reads the checkpoint and shares it in a collective,
    // which a death at the start broke, or which the others skipped.
    if ((dt_worker_recoverable(st) || (st == DT_OK && r->rec.lost_start)) && r->fresh.resume[0])
        return dt_error(DT_ERR_COMM, "rank %d: a worker died while the run started, before the checkpoint to resume "
                                     "from was shared; a spare cannot resume it (--max-restarts restarts the run)%s%s",
                        r->rank, st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
    if (st != DT_OK) return st;
    if (s->ckpt_saves) dt_run_ckpt_set_saver(&r->ck, save_by_strategy, s);
    r->ck.wait = s->ckpt_live;
    s->ckpt_model = &r->ck.model;
    s->ckpt_dir = r->ck.dir;
    s->start_step = r->ts.step;
    if ((st = dt_strategy_ckpt_restore(s, r->ck.from, r->ck.from_parts)) != DT_OK) return st;
    if (s->rejoin_done) {  // a replacement for a rank that had finished: its files are written
        r->res->rank = -1;
        dt_obs_leave(r->obs);
        r->over = 1;
        return DT_OK;
    }
    if (s->rejoined) join_at(r);
    r->ck.obs = r->obs;
    r->rng = r->ts.rng;
    r->res->resumed_step = r->ts.step;
    if (r->rec.have_state) dt_heartbeat(r->ts.step);  // a spare's first beat is the step it redoes
    return DT_OK;
}

// Rank 0's line about the run, before its first step.
static void describe(const run_state *r, const char *wcopy) {
    const dt_config *c = r->c;
    char ep[64] = "";
    if (r->epochs > 1) snprintf(ep, sizeof ep, " (%d epochs of %lld)", r->epochs, (long long)r->spe);
    const dt_cpu *cpu = dt_cpu_get();
    dt_log(DT_LOG_INFO, "%s: %s, %lld steps%s, %d worker%s x %d thread%s, strategy %s%s, precision %s%s; %s (%s)",
           c->name, r->info.describe, (long long)r->total, ep, r->W, r->W > 1 ? "s" : "", r->threads,
           r->threads > 1 ? "s" : "", r->sops->name, c->deterministic ? ", deterministic" : "",
           dt_kernels_describe((dt_dtype)c->precision), wcopy, cpu->name, dt_isa_name(cpu->isa));
    dt_memory_need m;
    if (dt_memory_worker(c, r->W, &m))
        dt_log(DT_LOG_INFO, "memory of a worker by the formula: %.1f MiB = model state %.1f + activations %.1f + "
                            "checkpoints %.1f%s + data %.1f + the program %.1f MiB (docs/model-parallel.md)",
               m.total / 1048576.0, m.model / 1048576.0, m.activations / 1048576.0, m.checkpoints / 1048576.0,
               !m.ckpt_pieces ? ""
               : c->zero > 0 && c->tensor <= 1 && c->pipeline <= 1 ? " (written from the live state)"
                                                                   : " (written in pieces)",
               m.data / 1048576.0, m.program / 1048576.0);
    if (dt_memory_zero_held(c, r->W) < c->zero && dt_device_index(c->device) < 0)  // (a GPU's: docs/gpu.md)
        dt_log(DT_LOG_INFO, "zero %d: the machine has room, so each worker keeps the pages of the parts it does not "
                            "own (stage 1's model state, no refill a step); [parallel] zero_release = always gives them back (docs/zero.md)",
               c->zero);
}

// What the steps run with: the run's length, dynamic sharing's pieces, the
// schedule, fp16's loss scaler, the weights' 16-bit copy, the position.
static dt_status prepare(run_state *r) {
    const dt_config *c = r->c;
    dt_strategy *s = r->strat;
    dt_status st;
    r->total = r->info.total_steps;
    r->spe = r->info.steps_per_epoch;
    r->epochs = r->info.epochs;
    // [ps] share = dynamic (ps/): the pieces of an epoch's batches (a
    // batch's even split among the workers) go to whichever worker is free,
    // from the servers: a worker trains as many as its speed takes, and its
    // epoch ends when they are all out, not after `spe` steps.
    r->pieces = c->ps_share && s->own_pace;
    // A task whose one epoch is its whole run (the GPT's sampled windows:
    // max_steps steps): a checkpoint of its last step (epoch 1, batch 0)
    // resumed with more steps goes on from its step.
    if (r->epochs == 1 && r->spe == r->total && r->ts.epoch == 1 && r->ts.epoch_batch == 0 && r->ts.step > 0 &&
        r->ts.step < r->total) {
        r->ts.epoch = 0;
        r->ts.epoch_batch = r->ts.step;
    }
    // A checkpoint's position inside this run (a damaged or crafted one's may be anywhere).
    if (r->ts.epoch < 0 || r->ts.epoch > r->epochs || r->ts.epoch_batch < 0 ||
        (!r->pieces && r->spe > 0 && r->ts.epoch_batch > r->spe))
        return dt_error(DT_ERR_CONFIG, "the checkpoint's position, batch %lld of epoch %lld, is outside this run (%d "
                        "epochs of %lld batches): a damaged checkpoint, or one of a run with another data set or batch",
                        (long long)r->ts.epoch_batch, (long long)r->ts.epoch + 1, r->epochs, (long long)r->spe);
    if (r->pieces && !r->tops->seek)
        return dt_error(DT_ERR_CONFIG, "[ps] share = dynamic: the %s model's batches cannot be handed out in pieces",
                        r->tops->name);
    if (r->pieces) s->units = r->spe * r->W;
    if (r->pieces && r->ts.epoch_batch != 0 && !s->rejoined)  // resumed inside an epoch
        return dt_error(DT_ERR_CONFIG, "[ps] share = dynamic resumes only from a checkpoint at an epoch's end: this "
                                       "one is at batch %lld of epoch %lld's %lld (the pieces handed out are not in it)",
                        (long long)r->ts.epoch_batch, (long long)r->ts.epoch + 1, (long long)r->spe);
    r->sched = dt_worker_schedule(c, r->total);
    // fp16: dynamic loss scaling (optim.h), its overflow agreed on by the
    // control plane; resumed, where the checkpoint's run left it.
    r->fp16 = c->precision == DT_F16;
    r->scaler = dt_loss_scaler_default();
    if (r->fp16) {
        scaler_from_state(&r->scaler, &r->ts);
        s->loss_scale = r->scaler.scale;
    }
    // A low precision: the GEMMs read the weights from a 16-bit copy,
    // converted once after each change (a new step, an evaluation after an
    // update) instead of at every call (kernels.h).
    char wcopy[64] = "";
    if (c->precision != DT_F32) {
        if ((st = dt_kernels_set_weights(r->info.params, r->info.nparams)) != DT_OK) return st;
        snprintf(wcopy, sizeof wcopy, ", weights' %s copy %.1f MiB", r->fp16 ? "fp16" : "bf16",
                 (double)r->info.nparams * 2 / (1 << 20));
    }
    if (r->rank == 0) describe(r, wcopy);
    // Ranks at their own pace (parameter servers outside mode sync) meet
    // only in the strategy's collectives, which a replacement for a rank
    // that died inside a meeting can join (ps/): rank 0 evaluates alone.
    r->alone = s->own_pace && r->W > 1;
    r->step = r->ts.step;
    r->loss_n = r->ts.epoch_steps;
    r->loss_sum = r->ts.epoch_loss;
    return DT_OK;
}

// ---- the steps and their meetings -------------------------------------------

// The observer's position at step r->step, for a meeting without a step of
// this rank's before it.
static void at_step(const run_state *r, int e) {
    dt_obs_at(r->obs, &(dt_obs_step_info){.step = r->step, .total_steps = r->total, .epoch = e + 1,
                                          .epochs = r->epochs});
}

// A step made without this rank (ps/, backup): its batch is passed over.
// *end: the epoch's data ran out (never: no step is made past a meeting, at
// the epoch's end, without every rank).
static dt_status skip_step(run_state *r, int e, int64_t *ebatch, int *end) {
    dt_task_batch b;
    int more;
    r->strat->skip_steps--;
    dt_status st = r->tops->next_batch(r->task, &r->rng, &b, &more);
    if (st != DT_OK) return st;
    if (!more) {
        r->strat->skip_steps = 0;
        *end = 1;
        return DT_OK;
    }
    r->step++;
    (*ebatch)++;
    at_step(r, e);
    return DT_OK;
}

// One step: the next batch (with dynamic sharing, the next piece's), the
// micro-batches or the strategy's own schedule, then the rest of the step;
// *end: the epoch's data or pieces ran out first. A failure that a spare
// repairs is marked r->rec.repair.
static dt_status train_step(run_state *r, int e, int64_t *ebatch, dt_control *ctl, int *end) {
    dt_strategy *s = r->strat;
    if (r->pieces && s->unit < 0) return *end = 1, DT_OK;  // this epoch's pieces are all out
    int64_t piece = r->pieces ? s->unit % s->units : -1, at = r->step;  // at: the schedule's step
    double t0 = dt_now();
    r->rec.begun = 1;
    dt_task_batch b;
    int more;
    dt_obs_begin(r->obs, DT_OBS_DATA);
    if (r->pieces) {
        at = e * r->spe + piece / r->W;
        r->tops->seek(r->task, piece / r->W, (int)(piece % r->W));
    }
    dt_status st = r->tops->next_batch(r->task, &r->rng, &b, &more);
    dt_obs_end(r->obs, DT_OBS_DATA);
    if (st != DT_OK) return st;
    if (!more) return *end = 1, DT_OK;
    dt_obs_set_share(r->obs, b.share);
    if (!s->grads_zero) r->tops->zero_grad(r->task);
    uint64_t sent0 = dt_obs_bytes_sent(r->obs);
    dt_kernels_weights_changed();  // by the last step's update (or the resume)
    double lsum;
    float lr, gnorm;
    int64_t skipped0 = r->scaler.skipped;
    if (r->info.tables_remote) st = step_rows(r->tops, r->task, s, 0);
    if (st == DT_OK)
        st = r->sops->run_step ? r->sops->run_step(s, r->tops, r->task, r->step, &b, &lsum)
                               : micro_steps(r->tops, r->task, s, r->obs, r->step, &b, &lsum);
    if (st == DT_OK && r->info.tables_remote) st = step_rows(r->tops, r->task, s, 1);
    if (st == DT_OK)
        st = finish_step(s, &r->ck, r->obs, &r->sched, at, lsum, b.global, r->fp16 ? &r->scaler : NULL, ctl, &lr,
                         &gnorm, &r->scaler.skipped);
    if (st == DT_OK && r->dyn) st = rebalance(r->dyn, r->obs, r->tops, r->task, r->rank, r->W, r->nunits, r->step + 1);
    if (st != DT_OK) {
        st = dt_error(st, "rank %d, step %lld: %s", r->rank, (long long)r->step + 1, dt_last_error());
        r->rec.repair = dt_worker_recoverable(st);
        return st;
    }
    r->bytes_sent += dt_obs_bytes_sent(r->obs) - sent0;
    r->step++;
    // (pieces: the batch of the next piece, or the epoch's end when none is left)
    *ebatch = !r->pieces ? *ebatch + 1 : s->unit < 0 ? r->spe : s->unit % s->units / r->W;
    r->loss_sum += ctl->loss;
    r->loss_n++;
    r->samples += b.global;
    r->stop = ctl->stop;
    r->t_train += dt_now() - t0;
    r->ck.state_opt = *r->ck.model.opt_step;  // the optimizer step of the state below (ZeRO's slices, --spares)
    dt_obs_step(r->obs, &(dt_obs_step_info){r->step, r->total, e + 1, r->epochs, ctl->loss, lr, gnorm, b.global,
                                            (int64_t)b.global * r->info.tokens_per_sample, s->has_staleness,
                                            s->staleness, r->fp16 ? r->scaler.scale : 0,
                                            r->scaler.skipped > skipped0, r->scaler.skipped, piece + 1, 0});
    return DT_OK;
}

// The loop's state after step r->step, batch ebatch of epoch e.
static dt_train_state state_at(const run_state *r, int e, int64_t ebatch) {
    int end = ebatch == r->spe;
    return (dt_train_state){r->step, end ? e + 1 : e, end ? 0 : ebatch, r->loss_n, r->loss_sum, r->rng, r->W,
                            r->fp16 ? r->scaler.scale : 0, r->scaler.clean, r->scaler.skipped};
}

// The task's evaluation, timed as the observer's eval. A strategy whose
// ranks keep parts of the model (slices, a stage's layers) gathers the
// layers through the layer hook as in a step, and gives them back after it.
static dt_status eval_run(run_state *r, float train_loss, float *tl, float *ta) {
    dt_obs_begin(r->obs, DT_OBS_EVAL);
    dt_kernels_weights_changed();  // by the last update
    dt_status st = dt_strategy_params_eval(r->strat, 1);
    if (st == DT_OK) st = r->tops->evaluate(r->task, r->alone ? NULL : r->comm, r->step, train_loss, tl, ta);
    if (st == DT_OK) st = dt_strategy_params_eval(r->strat, 0);
    dt_obs_end(r->obs, DT_OBS_EVAL);
    return st;
}

// An evaluation after step r->step (the training loss beside it is the mean
// since the one before). redo: a restarted worker 0 runs again a meeting
// whose evaluation its predecessor may have recorded (its metrics log
// says). A failure that a spare repairs is marked: the evaluation is not
// redone.
static dt_status evaluate(run_state *r, int e, int redo) {
    float train_loss = (float)(r->loss_sum / (r->loss_n ? r->loss_n : 1)), tl, ta;
    dt_status st;
    if (r->info.has_eval) {
        dt_heartbeat_phase(DT_PHASE_EVAL);
        if ((st = dt_strategy_params_sync(r->strat)) != DT_OK) return st;
        if ((st = dt_fault_at(r->rank, r->step, "eval")) != DT_OK) return st;  // (a test's fault)
        if (redo && r->alone && r->rank == 0 && dt_obs_logged_eval(r->obs, r->step, &tl, &ta)) {
            dt_log(DT_LOG_INFO, "worker 0 (restarted): the evaluation after step %lld is in its predecessor's "
                                "metrics log; not done again", (long long)r->step);
            r->res->test_loss = tl;
            r->res->test_accuracy = ta;
        } else if (!r->alone || r->rank == 0) {
            st = eval_run(r, train_loss, &tl, &ta);
            r->rec.repair = dt_worker_recoverable(st);
            if (st != DT_OK) return st;
            r->res->test_loss = tl;
            r->res->test_accuracy = ta;
            dt_obs_eval(r->obs, train_loss, tl, ta);
        }
        r->evaluated = 1;
    }
    r->res->final_train_loss = train_loss;
    r->res->epochs = e + 1;
    r->loss_sum = 0;
    r->loss_n = 0;
    return DT_OK;
}

// The checkpoint of state tc where it is due (the end of the run: last;
// the votes: save): the strategy's parameters made equal and brought to
// the host, its view staged (a staged view is the writer's snapshot:
// staged again only after its write), then written.
static dt_status checkpoint(run_state *r, dt_train_state *tc, int last, int save) {
    dt_status st;
    if (dt_run_ckpt_due(&r->ck, tc->step, last, r->stop, save) && r->ck.dir[0] &&
        (dt_heartbeat_phase(DT_PHASE_CKPT), (st = dt_strategy_params_sync(r->strat)) != DT_OK ||
         (st = dt_strategy_params_host(r->strat)) != DT_OK ||
         (r->ck.model.stable && r->ck.writer && (st = dt_ckpt_writer_wait(r->ck.writer)) != DT_OK) ||
         (st = dt_strategy_ckpt_stage(r->strat)) != DT_OK))
        return st;
    return dt_run_ckpt_step(&r->ck, tc, last, r->stop, save);
}

// The meeting after step r->step: the evaluation at the end of the epoch
// and of the run and every eval_every steps, then the checkpoint that the
// schedule, the votes (ctl) or a stop ask for, and the heartbeat.
static dt_status meet(run_state *r, int e, int64_t ebatch, const dt_control *ctl, int redo) {
    const dt_config *c = r->c;
    int epoch_end = ebatch == r->spe, last = r->pieces ? epoch_end && e + 1 == r->epochs : r->step == r->total;
    dt_status st;
    dt_heartbeat(r->step);  // (the step is done: a death in the meeting is after it)
    r->ts = state_at(r, e, ebatch);  // this step's state, should the evaluation be interrupted by a failure
    if ((epoch_end || last || (c->eval_every > 0 && r->step % c->eval_every == 0)) &&
        (st = evaluate(r, e, redo)) != DT_OK)
        return st;
    r->ts = state_at(r, e, ebatch);
    // Dynamic sharing: the workers' step counts differ, so their only
    // shared places, epochs' ends, are the checkpoints' (every
    // ceil(K / steps an epoch)-th epoch; their step the run's batches,
    // epoch x steps), decided by the epoch alone, as a replacement can.
    dt_train_state tc = r->ts;
    int save = ctl->save, here = 1;
    if (r->pieces && !r->stop) {
        int64_t every = c->ckpt_every_steps, ke = every > 0 ? (every + r->spe - 1) / r->spe : 0;
        here = epoch_end;
        tc.step = (e + 1) * r->spe;
        r->ck.last_step = tc.step - 1;  // (not due by a count of steps)
        save |= ke > 0 && (e + 1) % ke == 0;
    }
    if (here && (st = checkpoint(r, &tc, last, save)) != DT_OK) return st;
    dt_heartbeat(r->step);
    dt_heartbeat_phase(DT_PHASE_STEP);
    return DT_OK;
}

// Steps are left: a count, dynamic sharing's pieces, or the meeting a
// restarted rank owes.
static int steps_left(const run_state *r) {
    return r->pieces || r->step < r->total || r->rec.owed;
}

// The epochs from r->ts on: each step, then the meeting after it.
static dt_status epochs(run_state *r) {
    dt_strategy *s = r->strat;
    for (int e = (int)r->ts.epoch; e < r->epochs && steps_left(r) && !r->stop; e++) {
        int64_t ebatch = e == r->ts.epoch ? r->ts.epoch_batch : 0;  // mid-epoch on resume
        r->tops->start_epoch(r->task, e, ebatch);
        // every worker's first piece is its own share of batch 0 (a replacement's first: server 0's word)
        if (r->pieces && !s->rejoin_pieces) s->unit = e * s->units + r->rank;
        s->rejoin_pieces = 0;
        while (!r->stop && steps_left(r)) {
            dt_control ctl = {0};
            int redo = r->rec.owed, end = 0;  // redo: a meeting its predecessor may have made in part
            dt_status st = DT_OK;
            if (r->rec.owed) {  // restarted: the meeting after its predecessor's last step, then on
                r->rec.owed = 0;
                at_step(r, e);
            } else if (s->skip_steps > 0) {
                st = skip_step(r, e, &ebatch, &end);
            } else {
                st = train_step(r, e, &ebatch, &ctl, &end);
            }
            if (st == DT_OK && !end) st = meet(r, e, ebatch, &ctl, redo);
            if (st != DT_OK) return st;
            if (end) break;
        }
    }
    return DT_OK;
}

// Dynamic batching's estimates and split, from rank `from` to every rank.
static dt_status share_split(run_state *r, int from) {
    int units[r->W];
    dt_status st = dt_dynbatch_share(r->dyn, r->comm, from, units);
    return st == DT_OK ? r->tops->set_shares(r->task, units, r->nunits) : st;
}

// Sub-communicators split in an older generation, which the rejoin broke
// (the task's shard groups, the strategy's pipelines): split again in the
// order a spare's start splits them, so that the two meet.
static dt_status regroup(run_state *r) {
    dt_status st = DT_OK;
    if (r->tops->regroup) st = r->tops->regroup(r->task, r->comm, &r->strat->replicas, &r->strat->tensor_group);
    if (st == DT_OK && r->sops->regroup) st = r->sops->regroup(r->strat);
    if (st == DT_OK) r->split_gen = dt_comm_generation(r->comm);
    return st;
}

// Whether a recovery goes back to the newest checkpoint: the ranks hold
// state that no other rank has a copy of (a codec's residuals, local SGD's
// drift), which the checkpoint holds as each rank left it; otherwise a
// replica's state (and a buddy's copy of a slice) is taken as it is now.
static int by_checkpoint(const run_state *r) {
    return r->ck.model.extra || r->sops->own_state;
}

// One try at a recovery: rejoin (a new generation of the communicator,
// with the spare in the dead rank's place), then the state of the replica
// that got furthest, and a sharded strategy's slices (each rank's own, or
// from its buddy's copy; before the first step, a spare's own seeded
// one). *again: another death broke it, and this rank is ready for the
// next try.
static dt_status take_state(run_state *r, int *from, int *again) {
    recovery *rec = &r->rec;
    int have = rec->have_state, lost = 0;
    dt_status st;
    *again = 0;
    if (have) dt_log(DT_LOG_DEBUG, "%s; waiting for a spare to take the dead rank's place", dt_last_error());
    if (have && r->sops->abandon) r->sops->abandon(r->strat);  // its transfers over, the step to be redone
    if (have && !rec->lost_start && (st = dt_comm_rejoin(r->comm, 0)) != DT_OK)
        return dt_error(st, "rank %d, after step %lld: %s", r->rank, (long long)r->ts.step, dt_last_error());
    rec->lost_start = 0;  // (rejoined in the start)
    if (dt_comm_generation(r->comm) != r->split_gen && (st = regroup(r)) != DT_OK)
        return dt_error(st, "rank %d, splitting the workers again: %s", r->rank, dt_last_error());
    if (by_checkpoint(r)) {  // each rank's own state, as the newest checkpoint has it (none: the start's)
        *from = 0;
        if ((st = dt_run_ckpt_rollback(&r->ck, &r->ts, have, rec->begun)) == DT_OK)
            st = dt_strategy_ckpt_restore(r->strat, r->ck.from, r->ck.from_parts);  // ("": the start's)
        if (st != DT_OK) st = dt_error(st, "rank %d, going back to the newest checkpoint: %s", r->rank, dt_last_error());
    } else if ((st = dt_run_ckpt_share(&r->ck, &r->ts, have, from)) != DT_OK)
        st = dt_error(st, "rank %d, taking the state of a replica: %s", r->rank, dt_last_error());
    else if (r->sops->take_over && (st = r->sops->take_over(r->strat, have || r->ts.step == 0, &lost)) != DT_OK)
        st = dt_error(st, "rank %d, after step %lld: %s", r->rank, (long long)r->ts.step, dt_last_error());
    else if (r->dyn)  // dynamic batching: the split in force, which a spare does not have
        st = share_split(r, *from);
    if (st == DT_OK || lost || !dt_worker_recoverable(st)) return st;
    // another death meanwhile: again, with a new generation (a rank with no
    // state rejoins here, the others as they start the next try)
    if (!have && (st = dt_comm_rejoin(r->comm, 0)) != DT_OK) return st;
    *again = 1;
    return DT_OK;
}

// A spare took a dead rank's place (or this rank is that spare, or a death
// broke the start): every rank takes the furthest replica's state, and the
// steps go on from there, the failed one redone.
static dt_status recover(run_state *r) {
    recovery *rec = &r->rec;
    int from, again;
    dt_status st;
    rec->repair = 0;
    if (!rec->failed_at) rec->failed_at = dt_now();
    do st = take_state(r, &from, &again);
    while (st == DT_OK && again);
    if (st != DT_OK) return st;
    if (r->fp16) {  // the loss scale and its count of clean steps came with the state
        scaler_from_state(&r->scaler, &r->ts);
        r->strat->loss_scale = r->scaler.scale;
    }
    rec->have_state = 1;
    r->step = r->ts.step;
    r->loss_n = r->ts.epoch_steps;
    r->loss_sum = r->ts.epoch_loss;
    r->rng = r->ts.rng;
    r->stop = 0;
    if (r->rank == 0 && by_checkpoint(r))
        dt_log(DT_LOG_INFO, "spares: every worker rejoined and went back to %s (step %lld) in %.2f s; redoing the "
                            "steps from %lld",
               r->ck.from[0] ? r->ck.from : "the start (no checkpoint yet)", (long long)r->step,
               dt_now() - rec->failed_at, (long long)r->step + 1);
    else if (r->rank == 0)
        dt_log(DT_LOG_INFO, "spares: every worker rejoined and took rank %d's state at step %lld in %.2f s; "
                            "redoing step %lld",
               from, (long long)r->step, dt_now() - rec->failed_at, (long long)r->step + 1);
    rec->failed_at = 0;
    dt_heartbeat(r->step);
    return DT_OK;
}

// Waits for this rank's writer (rank 0's: with the others' files) outside
// any collective, so watching the others: a rank that the launcher saw
// exit, or whose place a spare took, ends the wait with DT_ERR_COMM (the
// recovery follows); the heartbeat goes on meanwhile.
static dt_status wait_saved(run_state *r) {
    while (!dt_ckpt_writer_idle(r->ck.writer)) {
        int p = dt_comm_replaced(r->comm);
        for (int q = 0; q < r->W && p < 0; q++)
            if (q != r->rank && dt_comm_peer_state(r->comm, q, NULL) == DT_PEER_GONE) p = q;
        if (p >= 0) return dt_error(DT_ERR_COMM, "rank %d died while the checkpoint was written", p);
        dt_heartbeat(r->step);
        usleep(5000);
    }
    return dt_ckpt_writer_wait(r->ck.writer);
}

// A fresh run with spares whose recoveries go back to the newest
// checkpoint (by_checkpoint) saves one before its first step, where
// checkpoints are on, and waits for it: a death before the first
// scheduled one goes back to the start. A death in the start or in this
// save itself is recovered as any other, from the start's state, which
// every rank still has (a barrier ends the save: none has begun a step;
// there is no checkpoint yet: dt_run_ckpt_rollback), and the save is made
// again: every rank asks after each recovery, on what every rank has then
// (the step and the checkpoint gone back to). (After a barrier: rank 0's
// writer clears what an earlier run left unfinished before any rank
// writes.)
static dt_status save_start(run_state *r) {
    const dt_config *c = r->c;
    if (dt_worker_spares() <= 0 || !by_checkpoint(r) || r->ts.step != 0 || r->rec.place == DT_PLACE_ALONE ||
        !r->ck.dir[0] || r->ck.from[0] || (c->ckpt_every_steps <= 0 && c->ckpt_every_seconds <= 0))
        return DT_OK;
    dt_train_state tc = state_at(r, (int)r->ts.epoch, r->ts.epoch_batch);  // (fp16: the loss scale too)
    r->ck.last_step = -1;  // (due at step 0)
    dt_status st = dt_barrier(r->comm);
    if (st == DT_OK) st = checkpoint(r, &tc, 0, 1);
    if (st == DT_OK) st = dt_fault_at(r->rank, 0, "save0");  // (a test's fault: its write in flight)
    if (st == DT_OK && r->ck.writer) st = wait_saved(r);
    if (st == DT_OK) st = dt_barrier(r->comm);  // (no rank goes on while one may die in it: all at the start's state)
    dt_heartbeat_phase(DT_PHASE_STEP);
    r->rec.repair = dt_worker_recoverable(st);
    return st == DT_OK ? DT_OK : dt_error(st, "rank %d, the checkpoint of step 0: %s", r->rank, dt_last_error());
}

// The steps, from the start or the resumed state, with every recovery
// that spares make on the way; a spare (or every rank after a death in the
// start) begins with one.
static dt_status steps(run_state *r) {
    dt_heartbeat_phase(DT_PHASE_STEP);
    dt_status st = r->rec.have_state && !r->rec.lost_start ? DT_OK : recover(r);
    while (st == DT_OK) {
        if ((st = save_start(r)) == DT_OK) st = epochs(r);
        if (st == DT_OK || !r->rec.repair) break;
        st = recover(r);
    }
    return st;
}

// The run's end: after a stop request the checkpoint has the state and no
// final files are written; otherwise the evaluation that a run resumed from
// its last checkpoint has not made, the weights file and summary.json.
static dt_status finish(run_state *r) {
    dt_train_result *res = r->res;
    dt_strategy *s = r->strat;
    dt_status st = DT_OK;
    char path[4096];
    dt_heartbeat_phase(DT_PHASE_END);
    if (r->stop) {
        dt_log(DT_LOG_INFO, "stopped on request after step %lld", (long long)r->step);
        res->stopped = 1;
        r->run_dir = NULL;
    } else if (!r->evaluated && r->info.has_eval && (!r->alone || r->rank == 0)) {
        dt_heartbeat_phase(DT_PHASE_EVAL);
        if ((st = eval_run(r, res->final_train_loss, &res->test_loss, &res->test_accuracy)) != DT_OK) return st;
    }
    if (r->loss_n) res->final_train_loss = (float)(r->loss_sum / r->loss_n);
    res->steps = r->step;
    res->train_seconds = r->t_train;
    res->samples_per_sec = r->t_train > 0 ? (double)r->samples / r->t_train : 0;
    res->comm_seconds = s->comm_seconds;
    res->comm_exposed_seconds = s->comm_exposed_seconds;
    res->loss_scale = r->fp16 ? r->scaler.scale : 0;
    res->skipped_steps = r->scaler.skipped;
    res->bytes_sent = r->bytes_sent;
    if (!r->stop && ((st = dt_strategy_params_sync(s)) != DT_OK || (st = dt_strategy_params_host(s)) != DT_OK))
        return st;
    if (!r->stop && (st = dt_fault_at(r->rank, r->step, "end")) != DT_OK) return st;  // (a test's fault)
    if (r->run_dir) snprintf(path, sizeof path, "%s/model.safetensors", r->run_dir);
    dt_heartbeat_phase(DT_PHASE_WEIGHTS);
    // The weights: from every rank's slice where the strategy keeps slices,
    // from the ranks of one copy of the model where ranks keep parts of it.
    dt_comm_t from = s->params_sliced ? r->comm : s->copy;
    if (!r->stop && (!s->copy || s->copy_first) &&
        (st = r->tops->save(r->task, r->run_dir ? path : NULL, from, s->params_sliced ? s->lo : 0,
                            s->params_sliced ? s->hi : s->n)) != DT_OK)
        return st;
    res->wall_seconds = dt_now() - r->t_start;
    // Every rank's peak resident memory over the run (its steps,
    // evaluations, checkpoints and the weights file), for summary.json.
    // And what it read of weights and checkpoint files.
    double mine[RANK_FIGURES], *peaks = NULL;
    rank_figures(mine);
    if (!r->alone && r->W > 1 && !(peaks = malloc(sizeof mine * (size_t)r->W))) return dt_error(DT_ERR_NOMEM, "out of memory");
    if (peaks && (st = dt_allgather(mine, peaks, sizeof mine, DT_U8, r->comm)) != DT_OK) {
        free(peaks);
        return st;
    }
    if (r->run_dir) {
        snprintf(path, sizeof path, "%s/summary.json", r->run_dir);
        st = write_summary(path, r->c, r->tops, r->task, s, res, r->info.nparams, peaks, &r->layers);
    }
    free(peaks);
    return st;
}

// A run that failed after its last step (a peer's death in the final
// evaluation or the weights file): rank 0 still writes the trained
// weights where it holds them all (the parameters are replicated), alone.
static void last_weights(run_state *r) {
    dt_strategy *s = r->strat;
    char path[4096];
    if (!s || !r->run_dir || r->rank != 0 || r->step < r->total || r->total <= 0 || s->params_sliced || s->copy ||
        r->stop)
        return;
    snprintf(path, sizeof path, "%s/model.safetensors", r->run_dir);
    if (access(path, F_OK) == 0) return;
    char err[1024];
    snprintf(err, sizeof err, "%s", dt_last_error());  // (the failure's message stays the one reported)
    if (dt_strategy_params_host(s) == DT_OK && r->tops->save(r->task, path, NULL, 0, s->n) == DT_OK)
        dt_log(DT_LOG_WARN, "the run failed after its last step; rank 0 wrote the trained weights of step %lld to %s",
               (long long)r->step, path);
    dt_error(DT_ERR_INTERNAL, "%s", err);
}

// Everything ends, in order: the observer (its closing barrier, unless a
// replacement's predecessor made it), the strategy's transfers, the task,
// the workers' communicator before the world's (a failed run aborts them,
// so the others stop with its message), the checkpoint write in flight
// (before the strategy where that write reads the strategy's staged slice).
static dt_status tear_down(run_state *r, dt_status st) {
    dt_heartbeat_phase(DT_PHASE_END);
    dt_kernels_set_weights(NULL, 0);
    if (r->strat && r->strat->skip_barriers > 0) dt_obs_leave(r->obs);
    st = dt_obs_close(r->obs, st);
    if (st == DT_OK && r->res->steps > 0) st = dt_fault_at(r->rank, r->res->steps, "closed");  // (a test's fault)
    if (r->ck.model.stable) st = dt_run_ckpt_end(&r->ck, st);
    if (r->strat) r->strat->failed = st != DT_OK;
    dt_strategy_free(r->strat);
    dt_dynbatch_free(r->dyn);
    if (r->task && r->tops->close) r->tops->close(r->task);
    if (r->comm != r->all) st = dt_worker_exit(r->comm, st);
    st = dt_worker_exit(r->all, st);
    st = dt_run_ckpt_end(&r->ck, st);
    if (r->task) r->tops->destroy(r->task);
    dt_task_layer_times_free(&r->layers);
    return st;
}

dt_status dt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress, void *user,
                   dt_train_result *res) {
    static dt_status (*const phases[])(run_state *) = {join, build, resume_or_join, prepare, steps, finish};
    run_state r = {.c = c, .tops = dt_task_for(c), .sops = dt_strategy_for(c), .res = res, .run_dir = run_dir,
                   .progress = progress, .user = user, .t_start = dt_now()};
    memset(res, 0, sizeof *res);
    res->test_loss = -1;
    res->test_accuracy = -1;
    dt_status st = dt_train_check_device(c);
    if (st != DT_OK) return st;
    st = dt_worker_init(c, &r.comm, &r.threads);
    if (st != DT_OK) return st;
    r.all = r.comm;
    for (size_t i = 0; i < sizeof phases / sizeof *phases && st == DT_OK && !r.over; i++) st = phases[i](&r);
    if (st != DT_OK) last_weights(&r);
    return tear_down(&r, st);
}
