/* Federated averaging: dt_federate (dtrain federate, docs/federated.md).
 *
 * The training set is split over C simulated clients (fedparts.h:
 * iid, shards or Dirichlet label skew). Each round samples max(1,
 * round(C x fraction)) of them from the seed and the round; the sampled
 * clients are dealt to the worker processes in turn (client j of the
 * round to rank j mod W). A client starts from the global model, trains E
 * local epochs over its own samples in batches of B through the task's
 * ordinary forward and backward and a fresh client optimizer ([optim]),
 * with FedProx's proximal term mu (w - w_global) added to its gradient,
 * and contributes its update w - w_global weighted by its share of the
 * round's samples. A first small allreduce carries which clients
 * reported, their updates' squared norms and their losses; every rank
 * then screens the same way (robust.h: an update holding NaN or Inf, or
 * with a norm above [federated] outlier x the median, is left out and
 * named). The kept weighted updates are summed in int64 fixed point
 * (the same bits for any worker count and any order; strategy.h's
 * dt_fixed_add), or, with secure aggregation, as masked 32-bit fixed-point
 * vectors whose masks cancel in the sum (fedparts.h), in one int64
 * allreduce. With a robust [federated] aggregator the updates themselves
 * go to every rank instead (one fp32 allreduce of m x n, each slot one
 * client's) and every rank combines them alike. DP-FedAvg: each client
 * clips its update to dp_clip, the sum is unweighted, and the server adds
 * Gaussian noise of sigma x dp_clip and divides by m (privacy.h accounts
 * the epsilon spent).
 *
 * Clients that fail (an injected fault, local training whose loss is no
 * longer finite, or an update too large for the fixed-point sum) or miss
 * the round's deadline send nothing: the update
 * is renormalised over the clients that reported (their masks with the
 * dropped clients removed under secure aggregation), and a round with
 * fewer than min_clients reports leaves the model unchanged. The server
 * then takes the mean update as a negative gradient into its optimizer:
 * plain SGD with server_lr (FedAvg; server_lr 1 adds the mean update),
 * SGD with momentum (FedAvgM) or AdamW without weight decay (FedAdam, with
 * AdamW's bias correction). After every round the test set is evaluated
 * (sharded over the workers) into the metrics log; summary.json has the
 * accuracy of every round.
 *
 * Failures and delays are injected by round and client for tests:
 * DTRAIN_FED_FAIL="R:K,..." (client K fails in round R, counted from 1)
 * and DTRAIN_FED_DELAY="R:K:SECONDS,..." (client K takes that much longer);
 * attackers by DTRAIN_ATTACK="KIND:FRACTION" (engine/robust/robust.h). */
#include "dtrain/launch.h"
#include "dtrain/train.h"
#include "engine/federated/fedparts.h"
#include "engine/federated/privacy.h"
#include "engine/federated/round.h"
#include "engine/robust/robust.h"
#include "engine/strategies/strategy.h"
#include "engine/tasks/task.h"
#include "engine/worker.h"
#include "obs/json.h"
#include "obs/obs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>



static int clients_per_round(const dt_config *c) {
    long m = lround((double)c->fed_clients * c->fed_fraction);
    return m < 1 ? 1 : m > c->fed_clients ? c->fed_clients : (int)m;
}

// DP-FedAvg's keys: dp_clip turns it on, with dp_noise or dp_epsilon.
static dt_status dp_check(const dt_config *c, int m) {
    int noise = c->fed_dp_noise > 0, eps = c->fed_dp_epsilon > 0;
    if (c->fed_dp_clip <= 0 && (noise || eps))
        return dt_error(DT_ERR_CONFIG, "[federated] dp_clip = %g: DP-FedAvg (dp_noise = %g, dp_epsilon = %g) needs a "
                        "finite, positive bound on every client's update", (double)c->fed_dp_clip,
                        (double)c->fed_dp_noise, (double)c->fed_dp_epsilon);
    if (c->fed_dp_clip <= 0) return DT_OK;
    if (noise == eps)
        return dt_error(DT_ERR_CONFIG, "[federated] dp_clip = %g: DP-FedAvg needs exactly one of dp_noise (the noise "
                        "multiplier, finite and positive) and dp_epsilon (the epsilon to spend); got dp_noise = %g, "
                        "dp_epsilon = %g", (double)c->fed_dp_clip, (double)c->fed_dp_noise, (double)c->fed_dp_epsilon);
    if (c->fed_robust.kind != DT_AGG_MEAN)
        return dt_error(DT_ERR_CONFIG, "[federated] aggregator = %s: DP-FedAvg (dp_clip = %g) adds its noise to the "
                        "sum of the clipped updates; use aggregator = mean", dt_agg_names[c->fed_robust.kind],
                        (double)c->fed_dp_clip);
    if (c->fed_secure && (double)c->fed_dp_clip * m >= 128)
        return dt_error(DT_ERR_CONFIG, "[federated] dp_clip = %g: with secure aggregation the sum of the %d clipped "
                        "updates must stay within the masks' fixed point (+-128): use dp_clip < %g",
                        (double)c->fed_dp_clip, m, 128.0 / m);
    return DT_OK;
}

dt_status dt_federate_check(const dt_config *c, int W) {
    (void)W;
    if (dt_device_index(c->device) >= 0)
        return dt_error(DT_ERR_CONFIG, "[train] device = %s: dtrain federate on a GPU is not in this dtrain yet "
                        "(docs/gpu.md)", c->device);
    if (c->gpt)
        return dt_error(DT_ERR_CONFIG, "[model] preset = %s: dtrain federate trains classifiers on IDX images, not GPT models",
                        c->preset);
    if (dt_layers_have_batchnorm(c->layers, c->nlayers))
        return dt_error(DT_ERR_CONFIG, "[model]: batch norm (a batchnorm or block layer) cannot be used with dtrain "
                        "federate yet: its clients' optimizer would change the running statistics");
    int m = clients_per_round(c);
    if (c->fed_min_clients > m)
        return dt_error(DT_ERR_CONFIG, "[federated] min_clients = %d: more than the %d clients sampled per round "
                                       "(clients %d x fraction %g)",
                        c->fed_min_clients, m, c->fed_clients, c->fed_fraction);
    if (c->ckpt_every_steps > 0 || c->ckpt_every_seconds > 0 || c->resume[0])
        return dt_error(DT_ERR_CONFIG, "[checkpoint]: dtrain federate does not write or resume checkpoints; "
                                       "leave every_steps, every_seconds and resume unset");
    // dtrain train's settings, which a federated run would not apply: refused by name.
    dt_config d;
    dt_config_defaults(&d);
    const struct { const char *key; int set; } only[] = {
        {"[parallel] servers (--servers)", c->ps_servers != d.ps_servers},
        {"[ps] mode", c->ps_mode != d.ps_mode},
        {"[ps] aggregator", c->ps_robust.kind != d.ps_robust.kind},
        {"[parallel] zero (--zero)", c->zero != d.zero},
        {"[parallel] offload", c->offload != d.offload},
        {"[parallel] pipeline", c->pipeline != d.pipeline},
        {"[parallel] tensor", c->tensor != d.tensor},
        {"[parallel] micro_batches", c->micro_batches != d.micro_batches},
        {"[parallel] sync_every", c->sync_every != d.sync_every},
        {"[parallel] deterministic (--deterministic)", c->deterministic != d.deterministic},
        {"[parallel] grad_dtype", c->grad_dtype != d.grad_dtype},
        {"[compression] method", c->comp_method != d.comp_method},
        {"[train] max_steps", c->max_steps != d.max_steps},
        {"[train] grad_accum", c->grad_accum != d.grad_accum},
        {"[train] dynamic_batch", c->dynamic_batch != d.dynamic_batch},
        {"[data] shard = ranks", c->data_shard == DT_DATA_SHARD_RANKS},
    };
    for (size_t i = 0; i < sizeof only / sizeof *only; i++)
        if (only[i].set)
            return dt_error(DT_ERR_CONFIG, "%s: applies to dtrain train, not to dtrain federate (its rounds, clients "
                            "and local epochs are set in [federated]); leave it unset", only[i].key);
    if (c->precision == DT_F16)
        return dt_error(DT_ERR_CONFIG, "[train] precision = fp16: dtrain federate has no loss scaling (fp16 gradients "
                                       "would underflow); use bf16 or fp32");
    dt_status st = dt_robust_check(&c->fed_robust, m, "[federated]", c->fed_secure);
    return st != DT_OK ? st : dp_check(c, m);
}

// DTRAIN_FED_FAIL / DTRAIN_FED_DELAY into f->faults.
static dt_status parse_faults(fed *f, const char *var, int delay) {
    const char *s = getenv(var);
    if (!s || !*s) return DT_OK;
    while (*s) {
        int r, k, used = 0;
        double d = -1;
        int got = delay ? sscanf(s, "%d:%d:%lf%n", &r, &k, &d, &used) : sscanf(s, "%d:%d%n", &r, &k, &used);
        if (got != (delay ? 3 : 2) || r < 1 || k < 0 || k >= f->C || (delay && d < 0) ||
            (s[used] && s[used] != ','))
            return dt_error(DT_ERR_CONFIG, "%s: expected %s, with R >= 1 and 0 <= K < %d clients, got '%s'", var,
                            delay ? "ROUND:CLIENT:SECONDS[,...]" : "ROUND:CLIENT[,...]", f->C, getenv(var));
        fault *nf = realloc(f->faults, sizeof *nf * (size_t)(f->nfaults + 1));
        if (!nf) return dt_error(DT_ERR_NOMEM, "out of memory");
        f->faults = nf;
        f->faults[f->nfaults++] = (fault){r, k, delay ? d : -1};
        s += used + (s[used] == ',');
    }
    return DT_OK;
}

// The injected fault of client k in round r: 0 none, -1 fails, else a delay.
static double injected(const fed *f, int r, int k) {
    for (int i = 0; i < f->nfaults; i++)
        if (f->faults[i].round == r && f->faults[i].client == k) return f->faults[i].delay;
    return 0;
}

// The round's clients: the first m of a seeded permutation, ascending.
static void sample_clients(fed *f, int r) {
    uint32_t *perm = (uint32_t *)f->masked;  // scratch of at least C entries, see alloc
    for (int k = 0; k < f->C; k++) perm[k] = (uint32_t)k;
    dt_rng g;
    dt_rng_seed(&g, fed_round_key(f->c, r, -1));
    dt_rng_shuffle(&g, perm, (size_t)f->C);
    for (int j = 0; j < f->m; j++) f->sampled[j] = (int)perm[j];
    for (int a = 1; a < f->m; a++)  // insertion sort: m is small
        for (int b = a; b > 0 && f->sampled[b - 1] > f->sampled[b]; b--) {
            int t = f->sampled[b];
            f->sampled[b] = f->sampled[b - 1];
            f->sampled[b - 1] = t;
        }
}

static void reset_optim(dt_optim *o, size_t n) {
    for (int j = 0; j < dt_optim_num_states(o); j++) memset(dt_optim_state(o, j), 0, sizeof(float) * n);
    *dt_optim_step_count(o) = 0;
}

// Client k's local training in round r, from the global model; *loss: its
// mean training loss.
static dt_status train_client(fed *f, int r, int k, float *loss_out) {
    const dt_config *c = f->c;
    size_t n = f->n;
    memcpy(f->params, f->global, sizeof(float) * n);
    reset_optim(f->client_opt, n);
    int nk = f->start[k + 1] - f->start[k];
    dt_status st = f->tops->set_subset(f->task, f->idx + f->start[k], nk, c->fed_local_batch, fed_round_key(c, r, k));
    double loss_sum = 0;
    long seen = 0;
    int64_t local = 0;
    dt_rng unused;
    dt_rng_seed(&unused, 0);
    for (int e = 0; st == DT_OK && e < c->fed_local_epochs; e++) {
        f->tops->start_epoch(f->task, e, 0);
        for (;;) {
            dt_task_batch b;
            int more;
            if ((st = f->tops->next_batch(f->task, &unused, &b, &more)) != DT_OK || !more) break;
            f->tops->zero_grad(f->task);
            float loss;
            // Dropout keyed by round, client and local step.
            int64_t key = ((int64_t)r << 40) ^ ((int64_t)k << 20) ^ local++;
            if ((st = f->tops->forward(f->task, key, 0, b.share, 1.0f, &loss)) != DT_OK) break;
            if ((st = f->tops->backward(f->task, NULL, NULL)) != DT_OK) break;
            if (c->fed_mu > 0) {  // FedProx: the gradient of mu/2 |w - w_global|^2
                float mu = c->fed_mu;
#pragma omp parallel for schedule(static)
                for (size_t i = 0; i < n; i++) f->grads[i] += mu * (f->params[i] - f->global[i]);
            }
            float scale = c->optim.clip_norm > 0 ? dt_clip_scale(sqrt(dt_sum_squares(f->grads, n)), c->optim.clip_norm) : 1;
            dt_optim_step(f->client_opt, f->params, f->grads, c->optim.lr, scale);
            loss_sum += (double)loss * b.share;
            seen += b.share;
        }
    }
    if (st != DT_OK) return dt_error(st, "round %d, client %d: %s", r, k, dt_last_error());
    *loss_out = seen ? (float)(loss_sum / seen) : 0;
    return DT_OK;
}

// Client k's labels y -> classes - 1 - y (twice: as they were).
static void flip_labels(fed *f, int k) {
    for (int i = f->start[k]; i < f->start[k + 1]; i++) f->labels[f->idx[i]] = f->classes - 1 - f->labels[f->idx[i]];
}

// Client f->sampled[j] of the round's m, on this rank: its local training,
// then its update w_k - w into row j of f->rows (an attacker's replaced,
// DTRAIN_ATTACK; clipped to dp_clip under DP), and into the round's meta
// that it reported, its squared norm and its loss. One that fails,
// diverges, misses the deadline or whose update would not fit the
// fixed-point sum does not report.
static dt_status client_update(fed *f, int r, int j, long total) {
    const dt_config *c = f->c;
    size_t n = f->n;
    int m = f->m, k = f->sampled[j];
    float *row = f->rows + (size_t)j * n;
    if (f->start[k + 1] == f->start[k]) return DT_OK;  // no samples: nothing to send
    double fault_s = injected(f, r, k);
    if (fault_s < 0) {
        dt_log(DT_LOG_INFO, "round %d: client %d failed (injected)", r, k);
        return DT_OK;
    }
    double t0 = dt_now();
    float closs = 0;
    int flip = j < f->evil && f->attack.kind == DT_ATTACK_LABELFLIP;
    if (flip) flip_labels(f, k);
    dt_status st = train_client(f, r, k, &closs);
    if (flip) flip_labels(f, k);
    if (st == DT_ERR_NUMERIC) {  // its local training diverged: a failed client, left out of the round
        dt_log(DT_LOG_WARN, "round %d: client %d left out: %s", r, k, dt_last_error());
        return DT_OK;
    }
    if (st != DT_OK) return st;
    if (fault_s > 0) {
        struct timespec ts = {(time_t)fault_s, (long)((fault_s - floor(fault_s)) * 1e9)};
        nanosleep(&ts, NULL);
    }
    double took = dt_now() - t0;
    if (c->fed_deadline > 0 && took > c->fed_deadline) {
        dt_log(DT_LOG_INFO, "round %d: client %d took %.2f s, past the %.2f s deadline: left out", r, k, took,
               c->fed_deadline);
        return DT_OK;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) row[i] = f->params[i] - f->global[i];
    if (j < f->evil && f->attack.kind != DT_ATTACK_LIE && f->attack.kind != DT_ATTACK_LABELFLIP)
        dt_attack_row(&f->attack, row, n, fed_round_key(c, r, k) ^ 0x61747461636bull);
    double sq = dt_sum_squares(row, n), p = fed_share_of(f, k, total), weight = f->sigma > 0 ? 1 : p;
    if (f->sigma > 0 && sqrt(sq) > c->fed_dp_clip) {  // DP: the client clips its own update
        float s = (float)(c->fed_dp_clip / sqrt(sq));
        for (size_t i = 0; i < n; i++) row[i] *= s;
        sq = dt_sum_squares(row, n);
    }
    // The int64 fixed-point sum holds m contributions of up to 4e18 / m
    // each: a client whose finite update or loss would not fit (one that
    // all but diverged) is left out too. A non-finite one reports and is
    // screened out by name (screen).
    float big = 0;
    for (size_t i = 0; i < n && isfinite(sq); i++) big = fmaxf(big, fabsf(row[i]));
    if (!f->gather && isfinite(sq) && !((double)fmaxf(big, fabsf(closs)) * weight * DT_FIXED_SCALE <= 4e18 / m)) {
        dt_log(DT_LOG_WARN, "round %d: client %d left out: its update (largest change %g) or loss (%g) is too large "
               "to sum", r, k, (double)big, (double)closs);
        return DT_OK;
    }
    f->meta[j] = 1;
    fed_put_double(&f->meta[m + j], sq);
    fed_put_double(&f->meta[2 * m + j], isfinite(closs) ? closs : 0);
    return DT_OK;
}

// One round: this rank's clients, the reports' allreduce and the screen,
// the updates' allreduce (sums, or the rows in the clear when gathered),
// the server step. Fills *reported, *loss, *norm (of the mean update);
// *applied = 0 when too few clients reported.
static dt_status run_round(fed *f, int r, int *reported, float *loss, float *norm, int *applied) {
    size_t n = f->n;
    int m = f->m;
    sample_clients(f, r);
    long total = 0;  // samples of the round's clients
    for (int j = 0; j < m; j++) total += f->start[f->sampled[j] + 1] - f->start[f->sampled[j]];
    memset(f->meta, 0, sizeof(int64_t) * 3 * (size_t)m);
    memset(f->rows, 0, sizeof(float) * n * (size_t)m);
    uint64_t key = fed_round_key(f->c, r, -2);
    for (int j = f->rank; j < m; j += f->W) {
        dt_status st = client_update(f, r, j, total);
        if (st != DT_OK) return st;
    }
    dt_status st = dt_allreduce(f->meta, f->meta, 3 * (size_t)m, DT_I64, DT_SUM, f->comm);
    if (st != DT_OK) return dt_error(st, "round %d: reports allreduce: %s", r, dt_last_error());
    fed_screen(f, r);
    if (f->gather) {  // every slot is one client's (zeros elsewhere): the sum is exact
        st = dt_allreduce(f->rows, f->rows, n * (size_t)m, DT_F32, DT_SUM, f->comm);
    } else {
        fed_sum_rows(f, total, key);
        st = dt_allreduce(f->acc, f->acc, n, DT_I64, DT_SUM, f->comm);
    }
    if (st != DT_OK) return dt_error(st, "round %d: update allreduce: %s", r, dt_last_error());
    return fed_server_step(f, r, total, key, reported, loss, norm, applied);
}

// RUN_DIR/clients.json: every client's sample count and class histogram.
static dt_status write_clients(const fed *f, const char *path, const int32_t *y, int classes) {
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "clients");
    const char *parts[] = {"iid", "shards", "dirichlet"};
    cJSON_AddStringToObject(o, "partition", parts[f->c->fed_partition]);
    if (f->c->fed_partition == 2) cJSON_AddNumberToObject(o, "alpha", f->c->fed_alpha);
    if (f->c->fed_partition == 1) cJSON_AddNumberToObject(o, "shards", f->c->fed_shards);
    cJSON_AddNumberToObject(o, "classes", classes);
    int *h = calloc((size_t)classes, sizeof(int));
    for (int k = 0; k < f->C && h; k++) {
        memset(h, 0, sizeof(int) * (size_t)classes);
        for (int i = f->start[k]; i < f->start[k + 1]; i++) h[y[f->idx[i]]]++;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "client", k);
        cJSON_AddNumberToObject(e, "samples", f->start[k + 1] - f->start[k]);
        cJSON_AddItemToObject(e, "histogram", cJSON_CreateIntArray(h, classes));
        cJSON_AddItemToArray(a, e);
    }
    free(h);
    return dt_json_write(path, o);
}

static dt_status make_server_optim(fed *f) {
    const dt_config *c = f->c;
    dt_optim_params p = dt_optim_default_params(c->fed_algorithm == 2 ? DT_OPTIM_ADAMW : DT_OPTIM_SGD);
    p.lr = c->fed_server_lr;
    p.weight_decay = 0;
    p.clip_norm = 0;
    p.momentum = c->fed_algorithm == 1 ? c->fed_server_momentum : 0;
    if (c->fed_algorithm == 2) {
        p.beta1 = c->fed_server_beta1;
        p.beta2 = c->fed_server_beta2;
        p.eps = c->fed_server_eps;
    }
    return dt_optim_create(&f->server_opt, &p, f->n);
}

static void fed_free(fed *f) {
    dt_optim_free(f->client_opt);
    dt_optim_free(f->server_opt);
    dt_free(f->global);
    dt_free(f->acc);
    dt_free(f->masked);
    dt_free(f->msum);
    dt_free(f->rows);
    free(f->meta);
    free(f->bad);
    free(f->eps);
    cJSON_Delete(f->left_out);
    free(f->idx);
    free(f->start);
    free(f->sampled);
    free(f->faults);
    if (f->task) f->tops->destroy(f->task);
}

static const char *const algos[] = {"fedavg", "fedavgm", "fedadam"};

// The simulated attack (DTRAIN_ATTACK: the first evil of each round's
// clients, in ascending order), whether the updates are gathered, and
// DP-FedAvg's noise multiplier (dp_noise, or solved for dp_epsilon over
// the rounds at the sampling rate m / C).
static dt_status robust_setup(fed *f, int32_t *y, int classes) {
    const dt_config *c = f->c;
    dt_status st = dt_attack_from_env(&f->attack);
    if (st != DT_OK) return st;
    if (f->attack.kind == DT_ATTACK_LIE && c->fed_secure)
        return dt_error(DT_ERR_CONFIG, "DTRAIN_ATTACK=lie: the attack reads the honest updates, which secure "
                        "aggregation hides; use secure = false");
    f->evil = dt_attack_count(&f->attack, f->m);
    f->labels = y;
    f->classes = classes;
    f->gather = c->fed_robust.kind != DT_AGG_MEAN || f->attack.kind == DT_ATTACK_LIE;
    f->q = (double)f->m / f->C;
    if (c->fed_dp_clip > 0)
        f->sigma = c->fed_dp_noise > 0 ? c->fed_dp_noise
                                       : dt_rdp_noise_for(f->q, c->fed_rounds, c->fed_dp_delta, c->fed_dp_epsilon);
    if (f->rank == 0 && f->attack.kind)
        dt_log(DT_LOG_WARN, "DTRAIN_ATTACK: %d of each round's %d clients attack (a simulation for tests and benches)",
               f->evil, f->m);
    if (f->rank == 0 && f->sigma > 0)
        dt_log(DT_LOG_INFO, "DP-FedAvg: updates clipped to %g, noise multiplier %.4f, sampling rate %g, delta %g: "
               "epsilon %.3f after %d rounds", (double)c->fed_dp_clip, f->sigma, f->q, (double)c->fed_dp_delta,
               dt_rdp_epsilon(f->q, f->sigma, c->fed_rounds, c->fed_dp_delta, NULL), c->fed_rounds);
    return DT_OK;
}

// The task, the clients' partitions, the injected faults, the rounds'
// buffers and the two optimizers; clients.json on rank 0 (run_dir).
static dt_status fed_setup(fed *f, const char *run_dir, int rows, float **history) {
    const dt_config *c = f->c;
    dt_task_info info;
    dt_status st = f->tops->create(&f->task, c, f->comm, c->batch, rows, &info);
    if (st != DT_OK) return st;
    f->params = info.params;
    f->grads = info.grads;
    f->n = info.nparams;
    if ((st = dt_broadcast(f->params, f->params, f->n, DT_F32, 0, f->comm)) != DT_OK)
        return dt_error(st, "broadcast of the initial parameters: %s", dt_last_error());
    int32_t *y;
    int ny = f->tops->train_labels(f->task, &y), classes = 0;
    for (int i = 0; i < ny; i++) classes = y[i] + 1 > classes ? y[i] + 1 : classes;
    if ((st = dt_fed_partition(c, y, ny, classes, &f->idx, &f->start)) != DT_OK) return st;
    if ((st = parse_faults(f, "DTRAIN_FED_FAIL", 0)) != DT_OK) return st;
    if ((st = parse_faults(f, "DTRAIN_FED_DELAY", 1)) != DT_OK) return st;
    if ((st = robust_setup(f, y, classes)) != DT_OK) return st;
    size_t scratch = f->n > (size_t)f->C ? f->n : (size_t)f->C;
    f->global = dt_alloc(sizeof(float) * (f->n ? f->n : 1));
    f->acc = dt_alloc(sizeof(int64_t) * (f->n + (size_t)f->m + 1));
    f->masked = dt_alloc(sizeof(uint32_t) * scratch);
    f->msum = dt_alloc(sizeof(uint32_t) * (f->n ? f->n : 1));
    f->sampled = malloc(sizeof(int) * (size_t)f->m);
    f->rows = dt_alloc(sizeof(float) * (f->n ? f->n : 1) * (size_t)f->m);
    f->meta = malloc(sizeof(int64_t) * 3 * (size_t)f->m);
    f->bad = malloc((size_t)f->m);
    f->eps = malloc(sizeof(float) * (size_t)c->fed_rounds);
    f->left_out = cJSON_CreateArray();
    *history = malloc(sizeof(float) * (size_t)c->fed_rounds);
    if (!f->global || !f->acc || !f->masked || !f->msum || !f->sampled || !f->rows || !f->meta || !f->bad || !f->eps ||
        !*history)
        return dt_error(DT_ERR_NOMEM, "federated state for %zu parameters: out of memory", f->n);
    memcpy(f->global, f->params, sizeof(float) * f->n);
    if ((st = dt_optim_create(&f->client_opt, &c->optim, f->n)) != DT_OK) return st;
    if ((st = make_server_optim(f)) != DT_OK) return st;
    if (run_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/clients.json", run_dir);
        if ((st = write_clients(f, path, y, classes)) != DT_OK) return st;
    }
    if (f->rank == 0)
        dt_log(DT_LOG_INFO, "%s: %s; %d clients, %d per round, %d rounds of %d local epoch%s at batch %d, %s%s%s%s%s, "
               "%d worker%s", c->name, info.describe, f->C, f->m, c->fed_rounds, c->fed_local_epochs,
               c->fed_local_epochs > 1 ? "s" : "", c->fed_local_batch, algos[c->fed_algorithm],
               c->fed_mu > 0 ? " + FedProx" : "", c->fed_robust.kind ? ", aggregator " : "",
               c->fed_robust.kind ? dt_agg_names[c->fed_robust.kind] : "", c->fed_secure ? ", secure aggregation" : "",
               f->W, f->W > 1 ? "s" : "");
    return DT_OK;
}

// The rounds: the clients' local training and the server update
// (run_round), every rank's phase times to rank 0, and an evaluation each;
// *skipped counts the rounds without an update, *samples the clients'.
static dt_status fed_rounds(fed *f, dt_obs *obs, float *history, dt_train_result *res, int *skipped, long *samples) {
    const dt_config *c = f->c;
    dt_status st = DT_OK;
    for (int r = 1; r <= c->fed_rounds; r++) {
        int reported = 0, applied = 0;
        float loss = 0, norm = 0;
        dt_obs_begin(obs, DT_OBS_FORWARD);  // the clients' local training
        st = run_round(f, r, &reported, &loss, &norm, &applied);
        dt_obs_end(obs, DT_OBS_FORWARD);
        if (st != DT_OK) return st;
        *skipped += !applied;
        float v[2] = {0, 0};  // every rank's phase times to rank 0 (the sums are already global)
        dt_obs_begin(obs, DT_OBS_COMM);
        st = dt_obs_allreduce(obs, v, 2, f->comm);
        dt_obs_end(obs, DT_OBS_COMM);
        if (st != DT_OK) return st;
        memcpy(f->params, f->global, sizeof(float) * f->n);
        long round_samples = 0;
        for (int j = 0; j < f->m; j++) round_samples += f->start[f->sampled[j] + 1] - f->start[f->sampled[j]];
        *samples += round_samples;
        dt_obs_step(obs, &(dt_obs_step_info){.step = r, .total_steps = c->fed_rounds, .epoch = r,
                                             .epochs = c->fed_rounds, .loss = loss, .lr = c->optim.lr,
                                             .grad_norm = norm, .samples = round_samples, .rounds = 1});
        float tl, ta;
        dt_obs_begin(obs, DT_OBS_EVAL);
        st = f->tops->evaluate(f->task, f->comm, r, loss, &tl, &ta);
        dt_obs_end(obs, DT_OBS_EVAL);
        if (st != DT_OK) return st;
        dt_obs_eval(obs, loss, tl, ta);
        history[r - 1] = ta;
        f->eps[r - 1] = f->sigma > 0 ? (float)dt_rdp_epsilon(f->q, f->sigma, r, c->fed_dp_delta, NULL) : INFINITY;
        if (f->sigma > 0 && f->rank == 0)
            dt_log(DT_LOG_INFO, "round %d: DP (epsilon, delta) = (%.4f, %g) spent", r, (double)f->eps[r - 1],
                   (double)c->fed_dp_delta);
        res->test_loss = tl;
        res->test_accuracy = ta;
        res->final_train_loss = loss;
        res->steps = r;
        dt_heartbeat(r);
    }
    return st;
}

// Rank 0's summary.json; bytes: the update allreduce's per round, as rank 0
// counts them (comm.h).
static dt_status fed_summary(const fed *f, const char *path, const dt_train_result *res, const float *history,
                             int skipped, double bytes) {
    const dt_config *c = f->c;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "dtrain_version", dt_version());
    cJSON_AddStringToObject(o, "mode", "federated");
    cJSON_AddStringToObject(o, "algorithm", algos[c->fed_algorithm]);
    cJSON_AddNumberToObject(o, "params", (double)f->n);
    cJSON_AddNumberToObject(o, "clients", f->C);
    cJSON_AddNumberToObject(o, "clients_per_round", f->m);
    cJSON_AddNumberToObject(o, "rounds", c->fed_rounds);
    cJSON_AddNumberToObject(o, "rounds_skipped", skipped);
    cJSON_AddNumberToObject(o, "final_train_loss", res->final_train_loss);
    cJSON_AddNumberToObject(o, "test_loss", res->test_loss);
    cJSON_AddNumberToObject(o, "test_accuracy", res->test_accuracy);
    cJSON_AddItemToObject(o, "round_test_accuracy", cJSON_CreateFloatArray(history, c->fed_rounds));
    int to85 = 0;
    for (int r = 0; r < c->fed_rounds && !to85; r++)
        if (history[r] >= 0.85f) to85 = r + 1;
    cJSON_AddNumberToObject(o, "rounds_to_85", to85 ? to85 : -1);
    cJSON_AddNumberToObject(o, "bytes_sent_per_round", bytes);
    cJSON_AddStringToObject(o, "aggregator", dt_agg_names[c->fed_robust.kind]);
    cJSON_AddNumberToObject(o, "updates_left_out", f->nleft);
    cJSON_AddItemToObject(o, "left_out", cJSON_Duplicate(f->left_out, 1));
    if (f->sigma > 0) {
        cJSON *dp = cJSON_AddObjectToObject(o, "dp");
        cJSON_AddNumberToObject(dp, "clip", c->fed_dp_clip);
        cJSON_AddNumberToObject(dp, "noise_multiplier", f->sigma);
        cJSON_AddNumberToObject(dp, "sampling_rate", f->q);
        cJSON_AddNumberToObject(dp, "delta", c->fed_dp_delta);
        cJSON_AddNumberToObject(dp, "epsilon", f->eps[c->fed_rounds - 1]);
        cJSON_AddItemToObject(dp, "round_epsilon", cJSON_CreateFloatArray(f->eps, c->fed_rounds));
    }
    cJSON_AddNumberToObject(o, "wall_seconds", res->wall_seconds);
    dt_json_add_parallel(o, res);
    return dt_json_write(path, o);
}

dt_status dt_federate(const dt_config *cfg, const char *run_dir, dt_progress_fn progress, void *user,
                      dt_train_result *res) {
    double t_start = dt_now();
    memset(res, 0, sizeof *res);
    res->test_loss = -1;
    res->test_accuracy = -1;
    // The task sees the clients' batch; one pass of the loader is a local epoch.
    dt_config lc = *cfg;
    lc.batch = cfg->fed_local_batch;
    lc.epochs = 1;
    lc.max_steps = 0;
    lc.data_shard = DT_DATA_SHARD_NONE;  // (the clients' samples come from the whole training set)
    const dt_config *c = &lc;
    fed f = {.c = c, .tops = dt_task_for(c), .C = c->fed_clients, .m = clients_per_round(c)};
    dt_obs *obs = NULL;
    float *history = NULL;
    int threads, rows, skipped = 0;
    long samples = 0;
    dt_status st = dt_worker_init(c, &f.comm, &threads);
    if (st != DT_OK) return st;
    f.rank = dt_comm_rank(f.comm);
    f.W = dt_comm_size(f.comm);
    DT_TRY(dt_obs_create(&obs, c, run_dir, f.comm, progress, user), done);
    if (f.rank != 0) run_dir = NULL;
    res->rank = f.rank;
    res->workers = f.W;
    res->threads = threads;
    DT_TRY(dt_federate_check(c, f.W), done);
    if (!f.tops->set_subset) {
        st = dt_error(DT_ERR_CONFIG, "dtrain federate: the %s task has no clients", f.tops->name);
        goto done;
    }
    DT_TRY(dt_check_memory(c, DT_MEM_TRAIN, f.W, 0, &rows), done);
    DT_TRY(dt_worker_run_dir(c, run_dir), done);
    DT_TRY(fed_setup(&f, run_dir, rows, &history), done);
    dt_comm_stats cs0, cs1;
    dt_comm_get_stats(f.comm, &cs0);
    DT_TRY(fed_rounds(&f, obs, history, res, &skipped, &samples), done);
    dt_comm_get_stats(f.comm, &cs1);
    res->epochs = c->fed_rounds;
    res->wall_seconds = dt_now() - t_start;
    res->train_seconds = res->wall_seconds;
    res->samples_per_sec = res->wall_seconds > 0 ? (double)samples * c->fed_local_epochs / res->wall_seconds : 0;
    if (run_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", run_dir);
        DT_TRY(f.tops->save(f.task, path, NULL, 0, SIZE_MAX), done);
        snprintf(path, sizeof path, "%s/summary.json", run_dir);
        st = fed_summary(&f, path, res, history, skipped, (double)(cs1.bytes_sent - cs0.bytes_sent) / c->fed_rounds);
    }
done:
    st = dt_obs_close(obs, st);
    free(history);
    fed_free(&f);
    return dt_worker_exit(f.comm, st);
}
