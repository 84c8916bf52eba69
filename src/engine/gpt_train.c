/* GPT training runs: token windows -> model -> optimizer, the validation
 * loss, and the files of the run directory (the same three as dt_train:
 * config.ini, model.safetensors, summary.json).
 *
 * Data parallel (when the process is one of W ranks, as for dt_train): every
 * rank draws the same global batch of B windows from the same seeded
 * stream and trains on its share of them (windows B*r/W up to B*(r+1)/W);
 * the step's micro-batches, loss scales and gradient allreduce are
 * engine/dp.h's, as in dt_train, so W workers follow the single-process run
 * up to float rounding (bitwise in deterministic mode). Validation splits
 * its windows the same way. */
#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
#include "dtrain/gpt.h"
#include "dtrain/launch.h"
#include "dtrain/train.h"

#include "engine/checkpoints.h"
#include "engine/dp.h"
#include "engine/worker.h"
#include "obs/json.h"
#include "obs/obs.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// Mean loss (and next-token accuracy when acc is not NULL) over the first
// `windows` consecutive windows of the validation file: rank r takes
// windows windows*r/W up to windows*(r+1)/W, in chunks of up to Bc (the
// model's batch), and the sums meet in one allreduce (comm may be NULL for
// one process).
static dt_status val_loss(dt_gpt *m, const dt_tokens *val, int windows, int Bc, int T, int32_t *x,
                          int32_t *y, float *out, float *acc, dt_comm_t comm) {
    int rank = comm ? dt_comm_rank(comm) : 0, W = comm ? dt_comm_size(comm) : 1;
    int V = dt_gpt_get_config(m)->vocab_size;
    int lo = (int)((long)windows * rank / W), hi = (int)((long)windows * (rank + 1) / W);
    double sums[2] = {0, 0};  // sum of window losses, correct predictions
    float fs[2];
    for (int i = lo; i < hi; i += Bc) {
        int n = hi - i < Bc ? hi - i : Bc;
        float l;
        dt_status st = DT_OK;
        dt_heartbeat(-1);
        for (int b = 0; b < n && st == DT_OK; b++)
            st = dt_tokens_window(val, i + b, 1, T, x + (size_t)b * T, y + (size_t)b * T);
        if (st == DT_OK) st = dt_gpt_forward(m, x, y, n, T, &l);
        if (st != DT_OK) return st;
        sums[0] += (double)l * n;
        if (acc) {
            const float *lg = dt_gpt_logits(m);
            for (int r = 0; r < n * T; r++) {
                int arg = 0;
                for (int v = 1; v < V; v++)
                    if (lg[(size_t)r * V + v] > lg[(size_t)r * V + arg]) arg = v;
                sums[1] += arg == y[r];
            }
        }
    }
    if (W > 1) {  // (counts stay exact in float up to 2^24 tokens)
        fs[0] = (float)sums[0];
        fs[1] = (float)sums[1];
        dt_status st = dt_allreduce(fs, fs, 2, DT_F32, DT_SUM, comm);
        if (st != DT_OK) return st;
        sums[0] = fs[0];
        sums[1] = fs[1];
    }
    *out = (float)(sums[0] / windows);
    if (acc) *acc = (float)(sums[1] / ((double)windows * T));
    return DT_OK;
}

dt_status dt_gpt_eval_checkpoint(const dt_config *c, const char *weights, float *loss, float *accuracy,
                                 int *n) {
    dt_set_threads(c->threads);
    const char *file = c->val_file[0] ? c->val_file : c->train_file;
    dt_gpt_config gc = {c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size, c->padded_vocab_size};
    int B = c->batch, T = c->seq_len;
    dt_tokens val = {0};
    dt_gpt *m = NULL;
    dt_status st = dt_check_memory(c, DT_MEM_EVAL, 1, 0, NULL);
    int32_t *x = malloc(sizeof(int32_t) * B * T), *y = malloc(sizeof(int32_t) * B * T);
    if (st == DT_OK && !(x && y)) st = dt_error(DT_ERR_NOMEM, "out of memory");
    if (st == DT_OK) st = dt_tokens_open(&val, file, c->vocab_size);
    if (st == DT_OK) st = dt_gpt_create(&m, &gc, B, T);
    if (st == DT_OK) st = dt_gpt_load(m, weights);
    if (st == DT_OK) st = val_loss(m, &val, c->eval_batches * B, B, T, x, y, loss, accuracy, NULL);
    if (n) *n = c->eval_batches * B * T;
    dt_gpt_free(m);
    dt_tokens_close(&val);
    free(x);
    free(y);
    return st;
}

static dt_status write_summary(const char *path, const dt_config *c, const dt_train_result *r,
                               size_t nparams, double tokens_per_sec, cJSON *history) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "dtrain_version", dt_version());
    cJSON_AddStringToObject(o, "model", c->preset);
    cJSON_AddNumberToObject(o, "params", (double)nparams);
    cJSON_AddNumberToObject(o, "threads", dt_get_threads());
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    cJSON_AddNumberToObject(o, "batch", c->batch);
    cJSON_AddNumberToObject(o, "seq_len", c->seq_len);
    cJSON_AddNumberToObject(o, "final_train_loss", r->final_train_loss);
    if (r->test_loss >= 0) cJSON_AddNumberToObject(o, "val_loss", r->test_loss);
    else cJSON_AddNullToObject(o, "val_loss");
    cJSON_AddItemReferenceToObject(o, "val_history", history);
    cJSON_AddNumberToObject(o, "wall_seconds", r->wall_seconds);
    cJSON_AddNumberToObject(o, "train_seconds", r->train_seconds);
    cJSON_AddNumberToObject(o, "samples_per_sec", r->samples_per_sec);
    cJSON_AddNumberToObject(o, "tokens_per_sec", tokens_per_sec);
    dt_json_add_parallel(o, r);
    return dt_json_write(path, o);
}

dt_status dt_gpt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress, void *user,
                       dt_train_result *res) {
    double t_start = dt_now();
    memset(res, 0, sizeof *res);
    res->test_loss = -1;
    res->test_accuracy = -1;
    if (!c->gpt) return dt_error(DT_ERR_ARG, "dt_gpt_train: the config's model is not a GPT");
    dt_gpt_config gc = {c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size, c->padded_vocab_size};
    int B = c->batch, T = c->seq_len;
    dt_tokens train = {0}, val = {0};
    dt_gpt *m = NULL;
    dt_optim *opt = NULL;
    int32_t *x = NULL, *y = NULL;
    cJSON *history = NULL;
    char path[4096];
    dt_comm_t comm = NULL;
    dt_dp_step sync = {0};
    dt_run_ckpt ck = {0};
    dt_obs *obs = NULL;
    int threads;
    dt_status st = dt_worker_init(c, &comm, &threads);
    if (st != DT_OK) return st;
    int rank = dt_comm_rank(comm), W = dt_comm_size(comm);
    if ((st = dt_obs_create(&obs, c, run_dir, comm, progress, user)) != DT_OK) goto done;
    const char *ckpt_run_dir = run_dir;  // sharded checkpoints: every rank writes
    if (rank != 0) {  // only rank 0 writes files and reports progress
        run_dir = NULL;
        progress = NULL;
    }
    res->rank = rank;
    res->workers = W;
    res->threads = threads;
    history = cJSON_CreateArray();
    if ((st = dt_dp_check(c, W)) != DT_OK) goto done;
    if ((st = dt_check_memory(c, DT_MEM_TRAIN, W, 0, NULL)) != DT_OK) goto done;
    // This rank's windows of each global batch, and the model's batch.
    int first = (int)((long)B * rank / W), share = (int)((long)B * (rank + 1) / W) - first;
    int Bm = dt_dp_max_micro(c, W);

    if ((st = dt_worker_run_dir(c, run_dir)) != DT_OK) goto done;
    if ((st = dt_tokens_open(&train, c->train_file, c->vocab_size)) != DT_OK) goto done;
    if (train.n < (size_t)T + 1) {
        st = dt_error(DT_ERR_CONFIG, "%s: %zu tokens, fewer than one window of [train] seq_len + 1 = %d",
                      c->train_file, train.n, T + 1);
        goto done;
    }
    if (c->val_file[0]) {
        if ((st = dt_tokens_open(&val, c->val_file, c->vocab_size)) != DT_OK) goto done;
        if (val.n < (size_t)T + 1) {
            st = dt_error(DT_ERR_CONFIG, "%s: %zu tokens, fewer than one window of [train] seq_len + 1 = %d",
                          c->val_file, val.n, T + 1);
            goto done;
        }
    }
    if ((st = dt_gpt_create(&m, &gc, Bm, T)) != DT_OK) goto done;
    dt_gpt_init(m, c->seed);
    if (c->init_from[0] && (st = dt_gpt_load(m, c->init_from)) != DT_OK) goto done;
    size_t np = dt_gpt_num_params(m);
    if (W > 1 && (st = dt_broadcast(dt_gpt_params(m), dt_gpt_params(m), np, DT_F32, 0, comm)) != DT_OK) {
        st = dt_error(st, "broadcast of the initial parameters: %s", dt_last_error());
        goto done;
    }
    if ((st = dt_optim_create(&opt, &c->optim, np)) != DT_OK) goto done;
    float *params = dt_gpt_params(m), *grads = dt_gpt_grads(m);
    int norder;
    const dt_grad_range *order = dt_gpt_grad_order(m, &norder);
    if ((st = dt_dp_step_init(&sync, c, comm, grads, np, order, norder)) != DT_OK) goto done;
    sync.obs = obs;
    x = malloc(sizeof(int32_t) * B * T);
    y = malloc(sizeof(int32_t) * B * T);
    if (!x || !y) {
        st = dt_error(DT_ERR_NOMEM, "out of memory");
        goto done;
    }
    int64_t total = c->max_steps;
    dt_schedule sched = dt_worker_schedule(c, total);
    dt_rng rng;
    dt_rng_seed(&rng, c->seed ^ 0x746f6b656e73ull);  // the data stream, apart from init's
    // Checkpoints: the weights, the optimizer state, the data stream's RNG.
    dt_tensor_info tinfo[16];
    for (int i = 0; i < 16; i++) tinfo[i] = *dt_gpt_tensor(m, i);
    char mvals[6][16];
    dt_st_meta wmeta[7];
    dt_ckpt_model cm = {tinfo, 16, params, np, dt_optim_num_states(opt), {NULL, NULL}, dt_optim_step_count(opt),
                        dt_optim_kind_name(c->optim.kind), NULL, wmeta, dt_gpt_weights_meta(&gc, mvals, wmeta)};
    for (int j = 0; j < cm.nstates; j++) cm.states[j] = dt_optim_state(opt, j);
    dt_train_state ts = {.rng = rng};
    if ((st = dt_run_ckpt_begin(&ck, c, ckpt_run_dir, comm, &cm, &ts)) != DT_OK) goto done;
    ck.obs = obs;
    rng = ts.rng;
    res->resumed_step = ts.step;
    dt_heartbeat(ts.step);
    if (rank == 0)
        dt_log(DT_LOG_INFO, "%s: GPT L%d H%d C%d V%d, %zu parameters; %zu train / %zu val tokens; B=%d T=%d, %lld steps, %d worker%s x %d thread%s%s",
               c->name, gc.n_layer, gc.n_head, gc.n_embd, gc.vocab_size, np, train.n, val.n, B, T,
               (long long)total, W, W > 1 ? "s" : "", threads, threads > 1 ? "s" : "",
               c->deterministic ? ", deterministic" : "");

    double t_train = 0, loss_sum = ts.epoch_loss;
    int64_t loss_n = ts.epoch_steps;
    int stop = 0;
    res->steps = ts.step;
    for (int64_t step = ts.step; step < total && !stop; step++) {
        double t0 = dt_now();
        float loss;
        // The global batch (the same on every rank); this rank's share.
        dt_obs_begin(obs, DT_OBS_DATA);
        st = dt_tokens_sample(&train, &rng, B, T, x, y);
        dt_obs_end(obs, DT_OBS_DATA);
        if (st != DT_OK) goto done;
        dt_gpt_zero_grad(m);
        int nm = dt_dp_step_begin(&sync, first, share, B);
        for (int k = 0; k < nm; k++) {
            size_t o = (size_t)(first + sync.off[k]) * T;
            dt_gpt_set_loss_scale(m, (float)sync.len[k] / (float)B);
            dt_obs_begin(obs, DT_OBS_FORWARD);
            st = dt_gpt_forward(m, x + o, y + o, sync.len[k], T, &loss);
            if (st == DT_OK && k == 0) st = dt_fault_step(rank, step + 1);
            dt_obs_end(obs, DT_OBS_FORWARD);
            if (st != DT_OK) {
                st = dt_error(st, "rank %d, step %lld: %s", rank, (long long)step + 1, dt_last_error());
                goto done;
            }
            dt_gpt_set_grad_hook(m, dt_dp_step_hook(&sync, k), sync.dp);
            dt_obs_begin(obs, DT_OBS_BACKWARD);
            dt_gpt_backward(m);
            dt_dp_step_micro_end(&sync, k, loss);
            dt_obs_end(obs, DT_OBS_BACKWARD);
        }
        float lr, gnorm;
        if ((st = dt_dp_step_update(&sync, &ck, opt, &sched, params, step, &loss, &lr, &gnorm)) != DT_OK) goto done;
        double now = dt_now();
        t_train += now - t0;
        res->steps = step + 1;
        loss_sum += loss;
        loss_n++;
        dt_obs_step(obs, &(dt_obs_step_info){step + 1, total, 1, 1, loss, lr, gnorm, B, (int64_t)B * T});
        int last = step + 1 == total;
        if (val.tokens && (last || (c->eval_every > 0 && (step + 1) % c->eval_every == 0))) {
            float vl;
            dt_obs_begin(obs, DT_OBS_EVAL);
            if ((st = val_loss(m, &val, c->eval_batches * B, Bm, T, x, y, &vl, NULL, comm)) != DT_OK) goto done;
            dt_obs_end(obs, DT_OBS_EVAL);
            res->test_loss = vl;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "step", (double)(step + 1));
            cJSON_AddNumberToObject(e, "train_loss", loss_sum / loss_n);
            cJSON_AddNumberToObject(e, "val_loss", vl);
            cJSON_AddItemToArray(history, e);
            dt_obs_eval(obs, (float)(loss_sum / loss_n), vl, -1);
        }
        if (last || (c->eval_every > 0 && (step + 1) % c->eval_every == 0)) {
            res->final_train_loss = (float)(loss_sum / loss_n);
            loss_sum = 0;
            loss_n = 0;
        }
        stop = sync.stop;
        ts = (dt_train_state){step + 1, 0, 0, loss_n, loss_sum, rng, W};
        if ((st = dt_run_ckpt_step(&ck, &ts, last, stop, sync.save)) != DT_OK) goto done;
        dt_heartbeat(step + 1);
    }
    if (stop) {  // asked to stop: the checkpoint has the state, no final files
        dt_log(DT_LOG_INFO, "stopped on request after step %lld", (long long)res->steps);
        res->stopped = 1;
        run_dir = NULL;
    }
    res->epochs = 1;
    res->train_seconds = t_train;
    res->samples_per_sec = t_train > 0 ? (double)res->steps * B / t_train : 0;
    res->comm_seconds = sync.comm_seconds;
    res->comm_exposed_seconds = sync.comm_exposed_seconds;
    if (run_dir) {
        snprintf(path, sizeof path, "%s/model.safetensors", run_dir);
        if ((st = dt_gpt_save(m, path)) != DT_OK) goto done;
    }
    res->wall_seconds = dt_now() - t_start;
    if (run_dir) {
        snprintf(path, sizeof path, "%s/summary.json", run_dir);
        st = write_summary(path, c, res, np, res->samples_per_sec * T, history);
    }
done:
    st = dt_obs_close(obs, st);
    dt_dp_step_free(&sync);
    st = dt_worker_exit(comm, st);
    st = dt_run_ckpt_end(&ck, st);  // the write in flight completes
    cJSON_Delete(history);
    free(x);
    free(y);
    dt_optim_free(opt);
    dt_gpt_free(m);
    dt_tokens_close(&train);
    dt_tokens_close(&val);
    return st;
}
