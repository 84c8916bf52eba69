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
#include "engine/dynbatch.h"
#include "engine/strategies/strategy.h"
#include "engine/tasks/task.h"
#include "engine/worker.h"
#include "kernels/kernels.h"
#include "obs/json.h"
#include "obs/obs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

// The model tables, in one place: the first that wants the config.
static const dt_task_ops *const tasks[] = {&dt_task_gpt, &dt_task_classifier};

const dt_task_ops *dt_task_for(const dt_config *c) {
    for (size_t i = 0; i < sizeof tasks / sizeof *tasks; i++)
        if (tasks[i]->wants(c)) return tasks[i];
    return &dt_task_classifier;
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
    dt_status st = dt_strategy_for(c)->check(c, W);
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

dt_status dt_train_check_spares(const dt_config *c, int spares) {
    if (spares <= 0) return DT_OK;
    const dt_strategy_ops *s = dt_strategy_for(c);
    if (!s->replicated && !s->take_over)
        return dt_error(DT_ERR_CONFIG, "--spares: strategy %s is not supported: a spare takes a dead worker's state "
                                       "from a surviving replica (data parallel: dp, dp-deterministic) or its slice "
                                       "from a buddy rank's copy (ZeRO: zero, zero-deterministic, zero-3); use "
                                       "--max-restarts",
                        s->name);
    if (c->comp_method != DT_COMP_NONE)
        return dt_error(DT_ERR_CONFIG, "--spares with [compression] method = %s: each rank's codec state (residuals) is "
                                       "its own and cannot be had from another rank; use --max-restarts",
                        dt_comp_method_name(c->comp_method));
    if (c->dynamic_batch)
        return dt_error(DT_ERR_CONFIG, "--spares with [train] dynamic_batch: the split by speed is not handed to a "
                                       "spare; use --max-restarts");
    if (c->ckpt_sharded && s->replicated)  // ZeRO's own shards: a missing one is given up (dt_ckpt_writer_abandon)
        return dt_error(DT_ERR_CONFIG, "--spares with [checkpoint] sharded = true: a dead worker's shard of a "
                                       "checkpoint being written would never come; use whole checkpoints");
    return DT_OK;
}

static dt_status write_summary(const char *path, const dt_config *c, const dt_task_ops *tops, dt_task *task,
                               dt_strategy *strat, const dt_train_result *r, size_t nparams) {
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
    if (c->precision == DT_F16) {
        cJSON_AddNumberToObject(pr, "loss_scale", r->loss_scale);
        cJSON_AddNumberToObject(pr, "skipped_steps", (double)r->skipped_steps);
    }
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
    // Rank 0's bytes by kind at its ZeRO stage (docs/zero.md), beside its
    // peak resident memory.
    dt_memory_kinds k;
    size_t state = dt_memory_model_state(c, DT_MEM_TRAIN, nparams, c->zero, r->workers, &k);
    struct rusage ru;
    cJSON *m = cJSON_AddObjectToObject(o, "memory");
    cJSON_AddNumberToObject(m, "zero", c->zero);
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
    // A worker or server restarted alone (ps.c, outside mode sync) takes
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
static dt_status save_by_strategy(void *user, const dt_train_state *ts) {
    dt_strategy *s = user;
    return s->ops->ckpt_save(s, ts);
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
        dt_obs_begin(obs, DT_OBS_FORWARD);
        dt_status st = tops->forward(task, step, s->off[k], s->len[k],
                                     (float)s->len[k] / (float)s->loss_denom * s->loss_scale, &loss);
        if (st == DT_OK && k == 0) st = dt_fault_step(s->rank, step + 1);
        dt_obs_end(obs, DT_OBS_FORWARD);
        if (st != DT_OK) return st;
        void *user;
        dt_grad_ready_fn hook = dt_strategy_grad_hook(s, k, &user);
        dt_obs_begin(obs, DT_OBS_BACKWARD);
        tops->backward(task, hook, user);
        dt_strategy_micro_end(s, k);
        dt_fault_slow(s->rank, dt_now() - t0);
        dt_obs_end(obs, DT_OBS_BACKWARD);
        *loss_sum += (double)loss * s->len[k];
    }
    return DT_OK;
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
    return !isfinite(dt_sum_squares(s->grads + s->lo, s->hi - s->lo));
}

// The rest of a step: gradients synchronised, the control plane's
// agreement, then the norm, clipping, the schedule and the update. With a
// loss scaler (fp16) the gradients are the loss scale's multiple: the norm
// and the update divide it out, and a step that overflowed on any rank is
// skipped by all.
static dt_status finish_step(dt_strategy *s, dt_run_ckpt *ck, dt_obs *obs, const dt_schedule *sched, int64_t step,
                             double loss_sum, int global, dt_loss_scaler *scaler, dt_control *ctl, float *lr,
                             float *gnorm) {
    int vote = dt_run_ckpt_vote(ck);
    dt_obs_begin(obs, DT_OBS_COMM);
    dt_status st = dt_strategy_sync(s);
    int overflow = scaler && st == DT_OK ? grads_overflow(s, step + 1) : 0;
    if (st == DT_OK && s->own_pace) dt_control_local(loss_sum, s->loss_denom, vote, overflow, ctl);
    else if (st == DT_OK) st = dt_control_agree(obs, s->comm, loss_sum, global, vote, overflow, ctl);
    dt_obs_end(obs, DT_OBS_COMM);
    if (st != DT_OK) return st;
    dt_obs_begin(obs, DT_OBS_OPTIMIZER);
    double norm;
    float unscale = 1.0f / s->loss_scale;
    st = dt_strategy_grad_norm(s, &norm);
    *gnorm = (float)(norm * unscale);
    float clip = s->c->optim.clip_norm, scale = (clip > 0 ? dt_clip_scale(*gnorm, clip) : 1.0f) * unscale;
    *lr = dt_schedule_lr(sched, step);
    if (scaler) {
        dt_optim_set_skip(s->opt, !dt_loss_scaler_update(scaler, ctl->overflow));
        s->loss_scale = scaler->scale;
    }
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

dt_status dt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress, void *user,
                   dt_train_result *res) {
    double t_start = dt_now();
    memset(res, 0, sizeof *res);
    res->test_loss = -1;
    res->test_accuracy = -1;
    const dt_task_ops *tops = dt_task_for(c);
    const dt_strategy_ops *sops = dt_strategy_for(c);
    dt_task *task = NULL;
    dt_strategy *strat = NULL;
    dt_dynbatch *dyn = NULL;
    dt_comm_t comm = NULL;
    dt_run_ckpt ck = {0};
    dt_obs *obs = NULL;
    char path[4096];
    int threads;
    dt_status st = dt_worker_init(c, &comm, &threads);
    if (st != DT_OK) return st;
    // Spares (docs/checkpoints.md): a rank whose collective fails on a peer's
    // death waits for a spare to take its place and goes on (`recover`
    // below); a newcomer (that spare) gets its state there. A death in the
    // start's collectives is the same: the others rejoin there (in
    // dt_worker_init's barrier, or below: lost_start), skip the rest of the
    // start's collectives and meet the newcomer in `recover`.
    int newcomer = dt_spare_rank() >= 0, have_state = !newcomer;
    int lost_start = !newcomer && dt_comm_generation(comm) > 0;
    dt_comm_t all = comm;  // every rank; comm becomes the workers' when the strategy has servers
    DT_TRY(dt_train_check_spares(c, dt_worker_spares()), done);
    int served;
    DT_TRY(split_roles(sops, c, all, run_dir, &comm, &served), done);
    if (served) {
        res->rank = -1;  // not a worker: nothing to report
        goto done;
    }
    int rank = dt_comm_rank(comm), W = dt_comm_size(comm);
    if (!newcomer && (st = dt_fault_at(rank, 0, "metrics")) != DT_OK) goto done;  // (a test's fault)
    st = dt_obs_create(&obs, c, run_dir, comm, progress, user);
    if (dt_worker_recoverable(st) && !newcomer && !lost_start) {  // a death in its barrier; again without it
        DT_TRY(lose_start(comm, &lost_start), done);
        st = dt_obs_create(&obs, c, run_dir, comm, progress, user);
    }
    if (st != DT_OK) goto done;
    dt_obs_set_all(obs, all);
    const char *ckpt_run_dir = run_dir;  // sharded checkpoints: every rank writes
    if (rank != 0) {  // only rank 0 writes files and reports progress
        run_dir = NULL;
        progress = NULL;
    }
    res->rank = rank;
    res->workers = W;
    res->threads = threads;
    DT_TRY(dt_train_check(c, W), done);
    int model_rows;  // the largest batch the model runs, from the memory check
    DT_TRY(dt_check_memory(c, DT_MEM_TRAIN, W, 0, &model_rows), done);
    DT_TRY(dt_worker_run_dir(c, run_dir), done);

    // The model and its data; every rank starts from rank 0's parameters.
    dt_task_info info;
    DT_TRY(tops->create(&task, c, comm, sops->max_micro(c, W), model_rows, &info), done);
    // A replacement for a worker that died (dt_comm_incarnation) skips the
    // start's collectives, which the others made long ago with its
    // predecessor: it gets the weights and its step from the strategy.
    int rejoining = dt_comm_incarnation(comm) > 0;
    if (!newcomer && (st = dt_fault_at(rank, 0, "start")) != DT_OK) goto done;  // (a test's fault)
    if (!newcomer && !lost_start && !rejoining &&
        (st = dt_broadcast(info.params, info.params, info.nparams, DT_F32, 0, info.replicas ? info.replicas : comm)) != DT_OK) {
        if (dt_worker_recoverable(st)) st = lose_start(comm, &lost_start);
        if (st != DT_OK) {
            st = dt_error(st, "broadcast of the initial parameters: %s", dt_last_error());
            goto done;
        }
    }
    dt_strategy_args sa = {c, comm, info.params, info.grads, info.nparams, info.order, info.norder, obs, info.order_layer,
                           all, info.order_split, info.nwhole, info.shard_copy, info.shard_user,
                           info.replicas, info.tensor_group, info.matrices, info.nmatrices};
    DT_TRY(dt_strategy_create(&strat, sops, &sa), done);
    dt_memory_kinds mk;
    dt_memory_model_state(c, DT_MEM_TRAIN, info.nparams, c->zero, W, &mk);
    dt_obs_set_memory(obs, (double[DT_OBS_MEM_KINDS]){(double)mk.weights, (double)mk.gradients, (double)mk.optimizer,
                                                      (double)mk.comm, (double)dt_memory_activations(c, W)});
    if (sops->params_needed) {
        if (!tops->set_layer_hook) {
            st = dt_error(DT_ERR_CONFIG, "strategy %s gathers parameters layer by layer; the %s model has no layers to hook",
                          sops->name, tops->name);
            goto done;
        }
        tops->set_layer_hook(task, params_needed, strat);
    }
    // Dynamic batching: units of the global batch (its samples, or the
    // deterministic mode's fixed shards) dealt by speed.
    int nunits = c->deterministic ? c->micro_shards : c->batch;
    if (c->dynamic_batch && !tops->set_shares) {
        st = dt_error(DT_ERR_CONFIG, "[train] dynamic_batch: the %s model's batches cannot be split unevenly", tops->name);
        goto done;
    }
    if (c->dynamic_batch && W > 1) DT_TRY(dt_dynbatch_create(&dyn, W, c->batch, nunits), done);

    // Checkpoints: the weights, the optimizer state as this rank holds it,
    // the loop's position and its data stream.
    dt_ckpt_model cm = {.tensors = info.tensors,
                        .ntensors = info.ntensors,
                        .weights_meta = info.weights_meta,
                        .nweights_meta = info.nweights_meta};
    dt_strategy_ckpt_view(strat, &cm);
    dt_train_state ts = {.rng = info.rng};
    dt_config fresh = *c;  // a replacement resumes nothing: it rejoins
    if (rejoining) fresh.resume[0] = 0;
    st = dt_run_ckpt_begin(&ck, &fresh, ckpt_run_dir, comm, &cm, &ts);
    // Resumed: rank 0 reads the checkpoint and shares it in a collective,
    // which a death at the start broke, or which the others skipped.
    if ((dt_worker_recoverable(st) || (st == DT_OK && lost_start)) && c->resume[0] && !rejoining) {
        st = dt_error(DT_ERR_COMM, "rank %d: a worker died while the run started, before the checkpoint to resume "
                                   "from was shared; a spare cannot resume it (--max-restarts restarts the run)%s%s",
                      rank, st == DT_OK ? "" : ": ", st == DT_OK ? "" : dt_last_error());
        goto done;
    }
    if (st != DT_OK) goto done;
    if (strat->ckpt_saves) dt_run_ckpt_set_saver(&ck, save_by_strategy, strat);
    strat->ckpt_model = &ck.model;
    strat->ckpt_dir = ck.dir;
    strat->start_step = ts.step;
    DT_TRY(dt_strategy_ckpt_restore(strat, ck.from, ck.from_parts), done);
    if (strat->rejoin_done) {  // a replacement for a rank that had finished: its files are written
        res->rank = -1;
        dt_obs_leave(obs);
        goto done;
    }
    // A replacement for a rank restarted alone (ps.c): its predecessor's place
    // in the loop, so that it meets the others where they meet; when its
    // predecessor had made step `at`, it runs the meeting after that step
    // first (owed: the others may be in it), as at the end of that step.
    int owed = strat->rejoined && strat->rejoin_meet && strat->rejoin_step > 0;
    if (strat->rejoined) {
        int64_t at = strat->rejoin_step, spe0 = info.steps_per_epoch > 0 ? info.steps_per_epoch : 1,
                every = c->ckpt_every_steps;
        ts.step = at;
        ts.epoch = (owed ? at - 1 : at) / spe0;
        ts.epoch_batch = at - ts.epoch * spe0;
        // (the save the meeting it owes may make: every K steps, or at the end)
        ck.last_step = every > 0 ? at - (owed && at % every == 0 ? every : at % every) : owed ? at - 1 : at;
        if (strat->rejoin_pieces) {  // dynamic sharing: the workers' steps say nothing of the epoch; server 0 does
            ts.epoch = strat->rejoin_epoch;
            ts.epoch_batch = strat->unit < 0 ? spe0 : 0;  // (spe: its epoch's end, whose meeting it runs first)
        }
    }
    ck.obs = obs;
    dt_rng rng = ts.rng;
    res->resumed_step = ts.step;
    if (!newcomer) dt_heartbeat(ts.step);  // a newcomer's first beat is the step it redoes

    int64_t total = info.total_steps, spe = info.steps_per_epoch;
    int epochs = info.epochs;
    // [ps] share = dynamic (ps.c): the pieces of an epoch's batches (a
    // batch's even split among the workers) go to whichever worker is free,
    // from the servers: a worker trains as many as its speed takes, and its
    // epoch ends when they are all out, not after `spe` steps.
    int pieces = c->ps_share && strat->own_pace;
    if (pieces && !tops->seek) {
        st = dt_error(DT_ERR_CONFIG, "[ps] share = dynamic: the %s model's batches cannot be handed out in pieces",
                      tops->name);
        goto done;
    }
    if (pieces) strat->units = spe * W;
    if (pieces && ts.epoch_batch != 0 && !strat->rejoined) {  // resumed inside an epoch
        st = dt_error(DT_ERR_CONFIG, "[ps] share = dynamic resumes only from a checkpoint at an epoch's end: this one "
                                     "is at batch %lld of epoch %lld's %lld (the pieces handed out are not in it)",
                      (long long)ts.epoch_batch, (long long)ts.epoch + 1, (long long)spe);
        goto done;
    }
    dt_schedule sched = dt_worker_schedule(c, total);
    // fp16: dynamic loss scaling (optim.h), its overflow agreed on by the control plane.
    int fp16 = c->precision == DT_F16;
    // A low precision: the GEMMs read the weights from a 16-bit copy,
    // converted once after each change (a new step, an evaluation after an
    // update) instead of at every call (kernels.h).
    char wcopy[64] = "";
    if (c->precision != DT_F32) {
        DT_TRY(dt_kernels_set_weights(info.params, info.nparams), done);
        snprintf(wcopy, sizeof wcopy, ", weights' %s copy %.1f MiB", fp16 ? "fp16" : "bf16",
                 (double)info.nparams * 2 / (1 << 20));
    }
    dt_loss_scaler scaler = dt_loss_scaler_default();
    if (fp16) {  // resumed: where the checkpoint's run left it
        scaler_from_state(&scaler, &ts);
        strat->loss_scale = scaler.scale;
    }
    if (rank == 0) {
        char ep[64] = "";
        if (epochs > 1) snprintf(ep, sizeof ep, " (%d epochs of %lld)", epochs, (long long)spe);
        const dt_cpu *cpu = dt_cpu_get();
        dt_log(DT_LOG_INFO, "%s: %s, %lld steps%s, %d worker%s x %d thread%s, strategy %s%s, precision %s%s; %s (%s)",
               c->name, info.describe, (long long)total, ep, W, W > 1 ? "s" : "", threads, threads > 1 ? "s" : "",
               sops->name, c->deterministic ? ", deterministic" : "", dt_kernels_describe((dt_dtype)c->precision),
               wcopy, cpu->name, dt_isa_name(cpu->isa));
    }

    // Ranks at their own pace (parameter servers outside mode sync) meet
    // only in the strategy's collectives, which a replacement for a rank
    // that died inside a meeting can join (ps.c): rank 0 evaluates alone.
    int alone = strat->own_pace && W > 1;
    int64_t step = ts.step, samples = 0, loss_n = ts.epoch_steps;
    double t_train = 0, loss_sum = ts.epoch_loss;
    uint64_t bytes_sent = 0;  // by this rank during the steps (dt_obs_bytes_sent)
    int stop = 0, evaluated = 0;
    double failed_at = 0;
    if (newcomer || lost_start) goto recover;
again:
    for (int e = (int)ts.epoch; e < epochs && (pieces || step < total || owed) && !stop; e++) {
        int64_t ebatch = e == ts.epoch ? ts.epoch_batch : 0;  // mid-epoch on resume
        tops->start_epoch(task, e, ebatch);
        // every worker's first piece is its own share of batch 0 (a replacement's first: server 0's word)
        if (pieces && !strat->rejoin_pieces) strat->unit = e * strat->units + rank;
        strat->rejoin_pieces = 0;
        while (!stop && (pieces || step < total || owed)) {
            dt_control ctl = {0};
            int redo = owed;  // this step's meeting, which its predecessor may have made in part
            if (owed) {  // a replacement: the meeting after its predecessor's last step, then on
                owed = 0;
                dt_obs_at(obs, &(dt_obs_step_info){.step = step, .total_steps = total, .epoch = e + 1, .epochs = epochs});
                goto meet;
            }
            if (strat->skip_steps > 0) {  // a step made without this rank (ps.c, backup): its batch passed over
                dt_task_batch b;
                int more;
                strat->skip_steps--;
                if ((st = tops->next_batch(task, &rng, &b, &more)) != DT_OK) goto done;
                if (!more) {  // (never: no step is made past a meeting, at the epoch's end, without every rank)
                    strat->skip_steps = 0;
                    break;
                }
                step++;
                ebatch++;
                dt_obs_at(obs, &(dt_obs_step_info){.step = step, .total_steps = total, .epoch = e + 1, .epochs = epochs});
                goto meet;
            }
            if (pieces && strat->unit < 0) break;  // this epoch's pieces are all out
            int64_t piece = pieces ? strat->unit % strat->units : -1, at = step;  // at: the schedule's step
            double t0 = dt_now();
            dt_task_batch b;
            int more;
            dt_obs_begin(obs, DT_OBS_DATA);
            if (pieces) {
                at = e * spe + piece / W;
                tops->seek(task, piece / W, (int)(piece % W));
            }
            st = tops->next_batch(task, &rng, &b, &more);
            dt_obs_end(obs, DT_OBS_DATA);
            if (st != DT_OK) goto done;
            if (!more) break;
            dt_obs_set_share(obs, b.share);
            if (!strat->grads_zero) tops->zero_grad(task);
            uint64_t sent0 = dt_obs_bytes_sent(obs);
            dt_kernels_weights_changed();  // by the last step's update (or the resume)
            double lsum;
            float lr, gnorm;
            int64_t skipped0 = scaler.skipped;
            st = sops->run_step ? sops->run_step(strat, tops, task, step, &b, &lsum)
                                : micro_steps(tops, task, strat, obs, step, &b, &lsum);
            if (st == DT_OK)
                st = finish_step(strat, &ck, obs, &sched, at, lsum, b.global, fp16 ? &scaler : NULL, &ctl, &lr, &gnorm);
            if (st == DT_OK && dyn) st = rebalance(dyn, obs, tops, task, rank, W, nunits, step + 1);
            if (st != DT_OK) {
                st = dt_error(st, "rank %d, step %lld: %s", rank, (long long)step + 1, dt_last_error());
                if (dt_worker_recoverable(st)) goto recover;
                goto done;
            }
            bytes_sent += dt_obs_bytes_sent(obs) - sent0;
            step++;
            // (pieces: the batch of the next piece, or the epoch's end when none is left)
            ebatch = !pieces ? ebatch + 1 : strat->unit < 0 ? spe : strat->unit % strat->units / W;
            loss_sum += ctl.loss;
            loss_n++;
            samples += b.global;
            stop = ctl.stop;
            t_train += dt_now() - t0;
            ck.state_opt = *ck.model.opt_step;  // the optimizer step of the state below (ZeRO's slices, --spares)
            dt_obs_step(obs, &(dt_obs_step_info){step, total, e + 1, epochs, ctl.loss, lr, gnorm, b.global,
                                                 (int64_t)b.global * info.tokens_per_sample, strat->has_staleness,
                                                 strat->staleness, fp16 ? scaler.scale : 0, scaler.skipped > skipped0,
                                                 scaler.skipped, piece + 1});
        meet:;  // the end of step `step`: what follows uses nothing of the step above but its count and ctl
            int epoch_end = ebatch == spe, last = pieces ? epoch_end && e + 1 == epochs : step == total;
            // this step's state, should the evaluation below be interrupted by a failure
            ts = (dt_train_state){step, epoch_end ? e + 1 : e, epoch_end ? 0 : ebatch, loss_n, loss_sum, rng, W,
                                  fp16 ? scaler.scale : 0, scaler.clean, scaler.skipped};
            // Evaluation at the end of the epoch and of the run, and every
            // eval_every steps; the training loss beside it is the mean
            // since the one before.
            if (epoch_end || last || (c->eval_every > 0 && step % c->eval_every == 0)) {
                float train_loss = (float)(loss_sum / (loss_n ? loss_n : 1));
                if (info.has_eval) {
                    float tl, ta;
                    if ((st = dt_strategy_params_sync(strat)) != DT_OK) goto done;
                    if ((st = dt_fault_at(rank, step, "eval")) != DT_OK) goto done;  // (a test's fault)
                    if (redo && alone && rank == 0 && dt_obs_logged_eval(obs, step, &tl, &ta)) {
                        dt_log(DT_LOG_INFO, "worker 0 (restarted): the evaluation after step %lld is in its "
                                            "predecessor's metrics log; not done again", (long long)step);
                        res->test_loss = tl;
                        res->test_accuracy = ta;
                    } else if (!alone || rank == 0) {
                        dt_obs_begin(obs, DT_OBS_EVAL);
                        st = dt_strategy_params_whole(strat, 1);
                        dt_kernels_weights_changed();  // by this step's update
                        if (st == DT_OK) st = tops->evaluate(task, alone ? NULL : comm, step, train_loss, &tl, &ta);
                        if (st == DT_OK) st = dt_strategy_params_whole(strat, 0);
                        dt_obs_end(obs, DT_OBS_EVAL);
                        if (dt_worker_recoverable(st)) goto recover;  // the evaluation is not redone
                        if (st != DT_OK) goto done;
                        res->test_loss = tl;
                        res->test_accuracy = ta;
                        dt_obs_eval(obs, train_loss, tl, ta);
                    }
                    evaluated = 1;
                }
                res->final_train_loss = train_loss;
                res->epochs = e + 1;
                loss_sum = 0;
                loss_n = 0;
            }
            ts = (dt_train_state){step, epoch_end ? e + 1 : e, epoch_end ? 0 : ebatch, loss_n, loss_sum, rng, W,
                                  fp16 ? scaler.scale : 0, scaler.clean, scaler.skipped};
            // Dynamic sharing: the workers' step counts differ, so their only
            // shared places, epochs' ends, are the checkpoints' (every
            // ceil(K / steps an epoch)-th epoch; their step the run's batches,
            // epoch x steps), decided by the epoch alone, as a replacement can.
            dt_train_state tc = ts;
            int save = ctl.save, here = 1;
            if (pieces && !stop) {
                int64_t every = c->ckpt_every_steps, ke = every > 0 ? (every + spe - 1) / spe : 0;
                here = epoch_end;
                tc.step = (e + 1) * spe;
                ck.last_step = tc.step - 1;  // (not due by a count of steps)
                save |= ke > 0 && (e + 1) % ke == 0;
            }
            if (here && dt_run_ckpt_due(&ck, tc.step, last, stop, save) && ck.dir[0] &&
                (st = dt_strategy_params_sync(strat)) != DT_OK)
                goto done;
            if (here && (st = dt_run_ckpt_step(&ck, &tc, last, stop, save)) != DT_OK) goto done;
            dt_heartbeat(step);
        }
    }
    if (0) {
    recover:  // a spare took a dead rank's place: rejoin, take the furthest replica's state, redo the step
        if (!failed_at) failed_at = dt_now();
        if (have_state) dt_log(DT_LOG_DEBUG, "%s; waiting for a spare to take the dead rank's place", dt_last_error());
        if (have_state && sops->abandon) sops->abandon(strat);  // its transfers over, the step to be redone
        if (have_state && !lost_start && (st = dt_comm_rejoin(comm, 0)) != DT_OK) {
            st = dt_error(st, "rank %d, after step %lld: %s", rank, (long long)ts.step, dt_last_error());
            goto done;
        }
        lost_start = 0;  // (rejoined in the start)
        int from;
        if ((st = dt_run_ckpt_share(&ck, &ts, have_state, &from)) != DT_OK) {
            st = dt_error(st, "rank %d, taking the state of a replica: %s", rank, dt_last_error());
            if (dt_worker_recoverable(st)) {  // another death meanwhile: again, with a new generation
                if (!have_state && (st = dt_comm_rejoin(comm, 0)) != DT_OK) goto done;
                goto recover;
            }
            goto done;
        }
        // A sharded strategy's slices: each rank's own, or from its buddy's
        // copy; before the first step, a newcomer's own (the seeded start's).
        int lost = 0;
        if (sops->take_over && (st = sops->take_over(strat, have_state || ts.step == 0, &lost)) != DT_OK) {
            st = dt_error(st, "rank %d, after step %lld: %s", rank, (long long)ts.step, dt_last_error());
            if (!lost && dt_worker_recoverable(st)) {  // another death meanwhile: again, with a new generation
                if (!have_state && (st = dt_comm_rejoin(comm, 0)) != DT_OK) goto done;
                goto recover;
            }
            goto done;
        }
        if (fp16) {  // the loss scale and its count of clean steps came with the state
            scaler_from_state(&scaler, &ts);
            strat->loss_scale = scaler.scale;
        }
        have_state = 1;
        newcomer = 0;
        step = ts.step;
        loss_n = ts.epoch_steps;
        loss_sum = ts.epoch_loss;
        rng = ts.rng;
        stop = 0;
        if (rank == 0)
            dt_log(DT_LOG_INFO, "spares: every worker rejoined and took rank %d's state at step %lld in %.2f s; "
                                "redoing step %lld",
                   from, (long long)step, dt_now() - failed_at, (long long)step + 1);
        failed_at = 0;
        dt_heartbeat(step);
        goto again;
    }
    if (stop) {  // asked to stop: the checkpoint has the state, no final files
        dt_log(DT_LOG_INFO, "stopped on request after step %lld", (long long)step);
        res->stopped = 1;
        run_dir = NULL;
    } else if (!evaluated && info.has_eval && (!alone || rank == 0)) {  // resumed from the run's last checkpoint
        dt_obs_begin(obs, DT_OBS_EVAL);
        st = dt_strategy_params_whole(strat, 1);
        dt_kernels_weights_changed();
        if (st == DT_OK)
            st = tops->evaluate(task, alone ? NULL : comm, step, res->final_train_loss, &res->test_loss,
                                &res->test_accuracy);
        dt_obs_end(obs, DT_OBS_EVAL);
        if (st != DT_OK) goto done;
    }
    if (loss_n) res->final_train_loss = (float)(loss_sum / loss_n);
    res->steps = step;
    res->train_seconds = t_train;
    res->samples_per_sec = t_train > 0 ? (double)samples / t_train : 0;
    res->comm_seconds = strat->comm_seconds;
    res->comm_exposed_seconds = strat->comm_exposed_seconds;
    res->loss_scale = fp16 ? scaler.scale : 0;
    res->skipped_steps = scaler.skipped;
    if (!stop) DT_TRY(dt_strategy_params_whole(strat, 1), done);  // the weights file, from every rank's slice
    res->bytes_sent = bytes_sent;
    if (!stop && (st = dt_strategy_params_sync(strat)) != DT_OK) goto done;
    if (!stop && (st = dt_fault_at(rank, step, "end")) != DT_OK) goto done;  // (a test's fault)
    if (run_dir) snprintf(path, sizeof path, "%s/model.safetensors", run_dir);
    if (!stop) DT_TRY(tops->save(task, run_dir ? path : NULL), done);
    res->wall_seconds = dt_now() - t_start;
    if (run_dir) {
        snprintf(path, sizeof path, "%s/summary.json", run_dir);
        st = write_summary(path, c, tops, task, strat, res, info.nparams);
    }
done:
    dt_kernels_set_weights(NULL, 0);
    if (strat && strat->skip_barriers > 0) dt_obs_leave(obs);  // its predecessor made the trace's closing barrier
    st = dt_obs_close(obs, st);
    if (st == DT_OK && res->steps > 0) st = dt_fault_at(rank, res->steps, "closed");  // (a test's fault)
    dt_strategy_free(strat);  // its transfers end before the communicator does
    dt_dynbatch_free(dyn);
    if (task && tops->close) tops->close(task);
    if (comm != all) st = dt_worker_exit(comm, st);  // the workers' own, before the world
    st = dt_worker_exit(all, st);
    st = dt_run_ckpt_end(&ck, st);  // the write in flight completes
    if (task) tops->destroy(task);
    return st;
}
