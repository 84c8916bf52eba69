/* Single-process training runs: data -> model -> optimizer, the loop, the
 * evaluation, and the files of the run directory. */
#include "dtrain/ckpt.h"
#include "dtrain/comm.h"
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

static dt_status load_split(const dt_config *c, const char *split, dt_dataset *ds) {
    char img[1024], lab[1024];
    const char *pre = !strcmp(split, "train") ? "train" : "t10k";
    dt_status st = dt_idx_find_split(c->data_dir, pre, img, lab, sizeof img);
    if (st == DT_OK) st = dt_dataset_load_idx(ds, img, lab, 10, c->mean, c->std);
    if (st != DT_OK) return st;
    int want = c->input[0] * c->input[1] * c->input[2];
    if ((int)dt_dataset_sample_size(ds) != want) {
        st = dt_error(DT_ERR_CONFIG, "[model] input is %dx%dx%d (%d values) but %s samples have %zu",
                      c->input[0], c->input[1], c->input[2], want, img, dt_dataset_sample_size(ds));
        dt_dataset_free(ds);
        return st;
    }
    // The dataset's own shape wins for images; an MLP input stays flat.
    memcpy(ds->shape, c->input, sizeof ds->shape);
    return DT_OK;
}

// Sums the loss and counts correct predictions over samples [lo, hi).
static dt_status eval_range(dt_model *m, const dt_dataset *ds, int lo, int hi, int batch, double *loss_sum,
                            long *correct) {
    size_t ss = dt_dataset_sample_size(ds);
    int V = dt_model_num_classes(m);
    *loss_sum = 0;
    *correct = 0;
    for (int i = lo; i < hi; i += batch) {
        int B = hi - i < batch ? hi - i : batch;
        float l;
        dt_heartbeat(-1);
        dt_status st = dt_model_forward(m, ds->x + (size_t)i * ss, ds->y + i, B, 0, &l);
        if (st != DT_OK) return st;
        *loss_sum += (double)l * B;
        const float *p = dt_model_probs(m);
        for (int b = 0; b < B; b++) {
            int arg = 0;
            for (int v = 1; v < V; v++)
                if (p[(size_t)b * V + v] > p[(size_t)b * V + arg]) arg = v;
            *correct += arg == ds->y[i + b];
        }
    }
    return DT_OK;
}

dt_status dt_evaluate(dt_model *m, const dt_dataset *ds, int batch, float *loss, float *accuracy) {
    double sum;
    long correct;
    dt_status st = eval_range(m, ds, 0, ds->n, batch, &sum, &correct);
    if (st != DT_OK) return st;
    if (loss) *loss = ds->n ? (float)(sum / ds->n) : 0.0f;
    if (accuracy) *accuracy = ds->n ? (float)correct / ds->n : 0.0f;
    return DT_OK;
}

// Evaluation sharded across the ranks of comm and reduced.
static dt_status evaluate_sharded(dt_model *m, const dt_dataset *ds, int batch, dt_comm_t comm, float *loss,
                                  float *accuracy) {
    int r = dt_comm_rank(comm), W = dt_comm_size(comm);
    int lo = (int)((long)ds->n * r / W), hi = (int)((long)ds->n * (r + 1) / W);
    double sum;
    long correct;
    dt_status st = eval_range(m, ds, lo, hi, batch, &sum, &correct);
    if (st != DT_OK) return st;
    float v[2] = {(float)sum, (float)correct};
    if ((st = dt_allreduce(v, v, 2, DT_F32, DT_SUM, comm)) != DT_OK)
        return dt_error(st, "evaluation: %s", dt_last_error());
    *loss = ds->n ? v[0] / ds->n : 0.0f;
    *accuracy = ds->n ? v[1] / ds->n : 0.0f;
    return DT_OK;
}

static dt_status write_summary(const char *path, const dt_config *c, const dt_train_result *r, size_t nparams) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "dtrain_version", dt_version());
    cJSON_AddNumberToObject(o, "params", (double)nparams);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    cJSON_AddNumberToObject(o, "epochs", r->epochs);
    cJSON_AddNumberToObject(o, "batch", c->batch);
    cJSON_AddNumberToObject(o, "final_train_loss", r->final_train_loss);
    cJSON_AddNumberToObject(o, "test_loss", r->test_loss);
    cJSON_AddNumberToObject(o, "test_accuracy", r->test_accuracy);
    cJSON_AddNumberToObject(o, "wall_seconds", r->wall_seconds);
    cJSON_AddNumberToObject(o, "train_seconds", r->train_seconds);
    cJSON_AddNumberToObject(o, "samples_per_sec", r->samples_per_sec);
    dt_json_add_parallel(o, r);
    return dt_json_write(path, o);
}

dt_status dt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress, void *user,
                   dt_train_result *res) {
    if (c->gpt) return dt_gpt_train(c, run_dir, progress, user, res);
    double t_start = dt_now();
    memset(res, 0, sizeof *res);
    dt_dataset train = {0}, test = {0};
    dt_model *m = NULL;
    dt_optim *opt = NULL;
    dt_loader *loader = NULL;
    dt_comm_t comm = NULL;
    dt_dp_step sync = {0};
    dt_tensor_info *tinfo = NULL;
    dt_run_ckpt ck = {0};
    dt_obs *obs = NULL;
    char path[4096];
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

    if ((st = dt_worker_run_dir(c, run_dir)) != DT_OK) goto done;
    if ((st = dt_dp_check(c, W)) != DT_OK) goto done;
    if ((st = load_split(c, "train", &train)) != DT_OK) goto done;
    if ((st = load_split(c, "test", &test)) != DT_OK) goto done;
    int max_micro = dt_dp_max_micro(c, W);
    int max_batch = max_micro > c->eval_batch ? max_micro : c->eval_batch;
    if ((st = dt_model_create(&m, c->input, c->layers, c->nlayers, max_batch)) != DT_OK) goto done;
    if (dt_model_num_classes(m) != train.classes) {
        st = dt_error(DT_ERR_CONFIG, "[model]: the last layer has %d outputs but the dataset has %d classes",
                      dt_model_num_classes(m), train.classes);
        goto done;
    }
    dt_model_init(m, c->seed);
    float *params = dt_model_params(m), *grads = dt_model_grads(m);
    size_t np = dt_model_num_params(m);
    // Every rank starts from rank 0's parameters.
    if ((st = dt_broadcast(params, params, np, DT_F32, 0, comm)) != DT_OK) {
        st = dt_error(st, "broadcast of the initial parameters: %s", dt_last_error());
        goto done;
    }
    if ((st = dt_optim_create(&opt, &c->optim, np)) != DT_OK) goto done;
    dt_loader_params lp = dt_loader_default_params();
    lp.batch = c->batch;
    lp.shuffle = c->shuffle;
    lp.drop_last = c->drop_last;
    lp.prefetch = c->prefetch;
    lp.seed = c->seed;
    lp.rank = rank;
    lp.world = W;
    if ((st = dt_loader_create(&loader, &train, &lp)) != DT_OK) goto done;
    if ((st = dt_dp_step_init(&sync, c, comm, grads, np, NULL, 0)) != DT_OK) goto done;
    sync.obs = obs;

    // Checkpoints: the weights, the optimizer state, the loop's position.
    int nt = dt_model_num_tensors(m);
    if (!(tinfo = malloc(sizeof *tinfo * (nt > 0 ? nt : 1)))) {
        st = dt_error(DT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < nt; i++) tinfo[i] = *dt_model_tensor(m, i);
    dt_st_meta wmeta[] = {{"format", "dtrain-weights"}, {"name", c->name}};
    dt_ckpt_model cm = {tinfo, nt, params, np, dt_optim_num_states(opt), {NULL, NULL}, dt_optim_step_count(opt),
                        dt_optim_kind_name(c->optim.kind), NULL, wmeta, 2};
    for (int j = 0; j < cm.nstates; j++) cm.states[j] = dt_optim_state(opt, j);
    dt_train_state ts = {0};
    if ((st = dt_run_ckpt_begin(&ck, c, ckpt_run_dir, comm, &cm, &ts)) != DT_OK) goto done;
    ck.obs = obs;
    res->resumed_step = ts.step;
    dt_heartbeat(ts.step);

    int64_t spe = dt_loader_steps_per_epoch(loader);
    int64_t total = c->epochs > 0 ? (int64_t)c->epochs * spe : c->max_steps;
    if (c->max_steps > 0 && c->max_steps < total) total = c->max_steps;
    int epochs = (int)((total + spe - 1) / spe);
    dt_schedule sched = dt_worker_schedule(c, total);
    if (rank == 0)
        dt_log(DT_LOG_INFO, "%s: %zu parameters, %d train / %d test samples, %lld steps (%d epochs of %lld), %d worker%s x %d thread%s%s",
               c->name, np, train.n, test.n, (long long)total, epochs, (long long)spe, W, W > 1 ? "s" : "", threads,
               threads > 1 ? "s" : "", c->deterministic ? ", deterministic" : "");

    int64_t step = ts.step, samples = 0, epoch_steps = ts.epoch_steps;
    double t_train = 0, epoch_loss = ts.epoch_loss;
    int stop = 0;
    for (int e = (int)ts.epoch; e < epochs && step < total && !stop; e++) {
        int64_t ebatch = e == ts.epoch ? ts.epoch_batch : 0;  // mid-epoch on resume
        dt_loader_start_epoch(loader, e, ebatch);
        if (e != ts.epoch) {
            epoch_loss = 0;
            epoch_steps = 0;
        }
        double t0 = dt_now();
        dt_batch b;
        while (!stop && step < total) {
            dt_obs_begin(obs, DT_OBS_DATA);
            int more = dt_loader_next(loader, &b);
            dt_obs_end(obs, DT_OBS_DATA);
            if (!more) break;
            dt_model_zero_grad(m);
            int nm = dt_dp_step_begin(&sync, b.first, b.B, b.global_B);
            for (int k = 0; k < nm; k++) {
                float loss;
                size_t ss = dt_dataset_sample_size(&train), o = (size_t)sync.off[k];
                dt_model_set_dropout_key(m, (uint64_t)step, (int64_t)b.first + sync.off[k]);
                dt_model_set_loss_scale(m, (float)sync.len[k] / (float)b.global_B);
                dt_obs_begin(obs, DT_OBS_FORWARD);
                st = dt_model_forward(m, b.x + o * ss, b.y + o, sync.len[k], 1, &loss);
                if (st == DT_OK && k == 0) st = dt_fault_step(rank, step + 1);
                dt_obs_end(obs, DT_OBS_FORWARD);
                if (st != DT_OK) {
                    st = dt_error(st, "rank %d, step %lld (epoch %d): %s", rank, (long long)step + 1, e + 1,
                                  dt_last_error());
                    goto done;
                }
                dt_model_set_grad_hook(m, dt_dp_step_hook(&sync, k), sync.dp);
                dt_obs_begin(obs, DT_OBS_BACKWARD);
                dt_model_backward(m);
                dt_dp_step_micro_end(&sync, k, loss);
                dt_obs_end(obs, DT_OBS_BACKWARD);
            }
            float loss, lr, gnorm;
            if ((st = dt_dp_step_update(&sync, &ck, opt, &sched, params, step, &loss, &lr, &gnorm)) != DT_OK)
                goto done;
            step++;
            epoch_loss += loss;
            epoch_steps++;
            ebatch++;
            stop = sync.stop;
            ts = (dt_train_state){step, e, ebatch, epoch_steps, epoch_loss, ts.rng, W};
            if ((st = dt_run_ckpt_step(&ck, &ts, step == total, stop, sync.save)) != DT_OK) goto done;
            dt_heartbeat(step);
            samples += b.global_B;
            dt_obs_step(obs, &(dt_obs_step_info){step, total, e + 1, epochs, loss, lr, gnorm, b.global_B, 0});
        }
        t_train += dt_now() - t0;
        if (stop) break;
        // Evaluate at the end of each epoch (and of the run).
        float tl = 0, ta = 0;
        dt_obs_begin(obs, DT_OBS_EVAL);
        if ((st = evaluate_sharded(m, &test, c->eval_batch, comm, &tl, &ta)) != DT_OK) goto done;
        dt_obs_end(obs, DT_OBS_EVAL);
        res->test_loss = tl;
        res->test_accuracy = ta;
        res->epochs = e + 1;
        dt_obs_eval(obs, (float)(epoch_loss / (epoch_steps ? epoch_steps : 1)), tl, ta);
    }
    if (stop) {  // asked to stop: the checkpoint has the state, no final files
        dt_log(DT_LOG_INFO, "stopped on request after step %lld", (long long)step);
        res->stopped = 1;
    } else if (res->epochs == 0) {  // resumed from the run's last checkpoint
        if ((st = evaluate_sharded(m, &test, c->eval_batch, comm, &res->test_loss, &res->test_accuracy)) != DT_OK)
            goto done;
    }
    res->steps = step;
    res->rank = rank;
    res->workers = W;
    res->threads = threads;
    res->final_train_loss = epoch_steps ? (float)(epoch_loss / epoch_steps) : 0.0f;
    res->train_seconds = t_train;
    res->samples_per_sec = t_train > 0 ? (double)samples / t_train : 0;
    res->comm_seconds = sync.comm_seconds;
    res->comm_exposed_seconds = sync.comm_exposed_seconds;
    if (run_dir && !stop) {
        dt_st_meta meta[] = {{"format", "dtrain-weights"}, {"dtrain_version", dt_version()}, {"name", c->name}};
        snprintf(path, sizeof path, "%s/model.safetensors", run_dir);
        if ((st = dt_model_save(m, path, meta, 3)) != DT_OK) goto done;
    }
    res->wall_seconds = dt_now() - t_start;
    if (run_dir && !stop) {
        snprintf(path, sizeof path, "%s/summary.json", run_dir);
        st = write_summary(path, c, res, np);
    }
done:
    st = dt_obs_close(obs, st);
    dt_dp_step_free(&sync);
    st = dt_worker_exit(comm, st);
    st = dt_run_ckpt_end(&ck, st);  // the write in flight completes
    free(tinfo);
    dt_loader_free(loader);
    dt_optim_free(opt);
    dt_model_free(m);
    dt_dataset_free(&train);
    dt_dataset_free(&test);
    return st;
}

dt_status dt_eval_checkpoint(const dt_config *c, const char *weights, float *loss, float *accuracy, int *n) {
    if (c->gpt) return dt_gpt_eval_checkpoint(c, weights, loss, accuracy, n);
    dt_set_threads(c->threads);
    dt_dataset test = {0};
    dt_model *m = NULL;
    // The weights first: a wrong file is reported before the data loads.
    dt_status st = dt_model_create(&m, c->input, c->layers, c->nlayers, c->eval_batch);
    if (st == DT_OK) st = dt_model_load(m, weights);
    if (st == DT_OK) st = load_split(c, "test", &test);
    if (st == DT_OK) st = dt_evaluate(m, &test, c->eval_batch, loss, accuracy);
    if (n) *n = test.n;
    dt_model_free(m);
    dt_dataset_free(&test);
    return st;
}
