/* dt_obs (obs.h): per-step phase timers, the per-rank metrics log (JSON
 * Lines), the exchange that tells rank 0 every rank's timings, progress,
 * straggler warnings, and the figures behind the Prometheus endpoint. */
#include "obs/obs.h"

#include "obs/prom.h"
#include "obs/straggler.h"
#include "obs/trace.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

// What every rank sends in dt_obs_allreduce's allgather (doubles). X_DATA ..
// X_OPTIM follow DT_OBS_DATA .. DT_OBS_OPTIMIZER.
enum { X_DATA, X_FORWARD, X_BACKWARD, X_COMM, X_OPTIM, X_COMM_BUSY, X_SENT, X_RECV, X_PEAK, X_MEM,
       X_SHARE = X_MEM + DT_OBS_MEM_KINDS, X_SUMS, NX = X_SUMS + DT_OBS_MAX_SUMS };
static const char *const mem_kinds[DT_OBS_MEM_KINDS] = {"weights", "gradients", "optimizer_state", "comm_buffers",
                                                            "activations"};
// The phases that make up a rank's own work in a step (straggler step time).
static const int work_phases[] = {DT_OBS_DATA, DT_OBS_FORWARD, DT_OBS_BACKWARD, DT_OBS_OPTIMIZER};
#define NWORK 4

static const char *const phase_names[DT_OBS_NPHASES] = {"data", "forward", "backward", "comm",
                                                         "optimizer", "eval", "checkpoint"};

const char *dt_obs_phase_name(dt_obs_phase p) {
    return (unsigned)p < DT_OBS_NPHASES ? phase_names[p] : "?";
}

struct dt_obs {
    dt_comm_t comm;
    dt_comm_t all;  // with the ranks of another role (a parameter server's; NULL: none): counted too
    int left;       // dt_obs_leave: no closing barrier
    int rank, W;
    int pipeline;                 // [parallel] pipeline: stages, to name the slowest rank's
    int auc;                      // the evaluation's figure is an AUC (the recommender), not an accuracy
    dt_progress_fn progress;
    void *user;
    char name[64];
    double t0;                    // time zero, the same on every rank (after a barrier)

    // phase timing (training thread)
    double open[DT_OBS_NPHASES];  // start of an open phase, or 0
    double acc[DT_OBS_NPHASES];   // seconds this step (eval, checkpoint: since last reported)
    double step_start;            // 0 between steps
    double prev_opt;              // the last step's optimizer seconds
    dt_comm_stats cs;             // communicator totals at the end of the last step
    double win_t, rate, trate;    // throughput over a window of >= 0.5 s
    int64_t win_samples, win_tokens;

    FILE *log;                    // run_dir/metrics/rank-NNNNN.jsonl
    char log_path[4096];
    int log_failed;

    dt_trace *trace;
    char trace_path[512];

    double *x;                    // W x NX: this step's allgather
    dt_straggler *strag;          // rank 0
    dt_straggler_report *reports;
    float margin;
    int strag_steps;

    // What the endpoint shows (guarded by mu; the trace too).
    pthread_mutex_t mu;
    dt_prom *prom;
    double *xs;                   // W x NX: the last step's figures
    double *totals;               // W x (NX): cumulative phase seconds and bytes
    dt_obs_step_info last;
    double eta;
    int64_t samples_total, tokens_total;
    float eval_loss, eval_acc;
    int have_eval;
    uint64_t stragglers_total;
    double mem[DT_OBS_MEM_KINDS]; // this rank's bytes by kind (dt_obs_set_memory)
    double gpu[DT_DEV_KINDS];     // a device run's GPU bytes by kind (dt_obs_set_gpu_memory)
    int has_gpu;
    int share;                    // this rank's samples in the step (dt_obs_set_share)
};

static double peak_rss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : 0;
}

// ----------------------------------------------------------------------------
// the metrics log

// Appends o as one line of this rank's log, then frees it. A failing write
// is reported once and the run goes on.
static void log_record(dt_obs *o, cJSON *j) {
    if (o->log && !o->log_failed) {
        char *s = cJSON_PrintUnformatted(j);
        if (!s || fputs(s, o->log) < 0 || fputc('\n', o->log) < 0 || fflush(o->log) != 0) {
            o->log_failed = 1;
            dt_log(DT_LOG_WARN, "%s: cannot write the metrics log: %s (the run goes on without it)", o->log_path,
                   strerror(errno));
        }
        free(s);
    }
    cJSON_Delete(j);
}

// A number with 7 significant digits (no float noise in the log); times
// since the start with microseconds.
static void num(cJSON *j, const char *key, double v) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", v);
    cJSON_AddNumberToObject(j, key, strtod(b, NULL));
}

static cJSON *record(dt_obs *o, const char *type, int64_t step, double now) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", type);
    cJSON_AddNumberToObject(j, "step", (double)step);
    cJSON_AddNumberToObject(j, "time", round((now - o->t0) * 1e6) / 1e6);
    return j;
}

// ----------------------------------------------------------------------------
// the trace and the communicator's observer

static void span(dt_obs *o, const char *name, const char *cat, int tid, double t0, double t1, const char *args) {
    pthread_mutex_lock(&o->mu);
    dt_trace_span(o->trace, name, cat, tid, (t0 - o->t0) * 1e6, (t1 - t0) * 1e6, args);
    pthread_mutex_unlock(&o->mu);
}

static void on_collective(const char *op, uint64_t seq, uint64_t bytes, double start, double end, void *user) {
    char args[96];
    snprintf(args, sizeof args, "{\"seq\":%llu,\"bytes\":%llu}", (unsigned long long)seq, (unsigned long long)bytes);
    span(user, op, "comm", DT_TRACE_COMM, start, end, args);
}

void dt_obs_trace_comm(dt_obs *o, dt_comm_t c) {
    if (o && o->trace) dt_comm_set_observer(c, on_collective, o);
}

// ----------------------------------------------------------------------------
// the Prometheus endpoint's page (server thread)

static void rank_family(FILE *f, dt_obs *o, const double *v, int idx, const char *name, const char *type,
                        const char *help) {
    char lab[32];
    dt_prom_family(f, name, type, help);
    for (int r = 0; r < o->W; r++) {
        snprintf(lab, sizeof lab, "rank=\"%d\"", r);
        dt_prom_sample(f, name, lab, v[(size_t)r * NX + idx]);
    }
}

static void phase_family(FILE *f, dt_obs *o, const double *v, const char *name, const char *type,
                         const char *help) {
    char lab[64];
    dt_prom_family(f, name, type, help);
    for (int r = 0; r < o->W; r++)
        for (int p = X_DATA; p <= X_OPTIM; p++) {
            snprintf(lab, sizeof lab, "rank=\"%d\",phase=\"%s\"", r, phase_names[p]);
            dt_prom_sample(f, name, lab, v[(size_t)r * NX + p]);
        }
}

static void render(FILE *f, void *user) {
    dt_obs *o = user;
    pthread_mutex_lock(&o->mu);
    char lab[160], esc[140];
    size_t k = 0;
    for (const char *s = o->name; *s && k + 2 < sizeof esc; s++) {  // label value escaping
        if (*s == '"' || *s == '\\') esc[k++] = '\\';
        esc[k++] = *s == '\n' ? ' ' : *s;
    }
    esc[k] = 0;
    snprintf(lab, sizeof lab, "name=\"%s\",version=\"%s\"", esc, dt_version());
    dt_prom_family(f, "dtrain_info", "gauge", "The run's name and dtrain's version (value 1).");
    dt_prom_sample(f, "dtrain_info", lab, 1);
    dt_prom_family(f, "dtrain_workers", "gauge", "Data-parallel workers (ranks).");
    dt_prom_sample(f, "dtrain_workers", "", o->W);
    dt_prom_family(f, "dtrain_step", "gauge", "Last completed training step.");
    dt_prom_sample(f, "dtrain_step", "", (double)o->last.step);
    dt_prom_family(f, "dtrain_total_steps", "gauge", "Steps the run will take.");
    dt_prom_sample(f, "dtrain_total_steps", "", (double)o->last.total_steps);
    dt_prom_family(f, "dtrain_epoch", "gauge", "Current epoch (from 1).");
    dt_prom_sample(f, "dtrain_epoch", "", o->last.epoch);
    dt_prom_family(f, "dtrain_loss", "gauge", "Training loss of the last step (global batch mean).");
    dt_prom_sample(f, "dtrain_loss", "", o->last.loss);
    dt_prom_family(f, "dtrain_learning_rate", "gauge", "Learning rate of the last step.");
    dt_prom_sample(f, "dtrain_learning_rate", "", o->last.lr);
    dt_prom_family(f, "dtrain_grad_norm", "gauge", "Global L2 norm of the last step's gradient, before clipping.");
    dt_prom_sample(f, "dtrain_grad_norm", "", o->last.grad_norm);
    if (o->last.loss_scale > 0) {
        dt_prom_family(f, "dtrain_loss_scale", "gauge", "fp16 dynamic loss scale after the last step.");
        dt_prom_sample(f, "dtrain_loss_scale", "", o->last.loss_scale);
    }
    if (o->last.loss_scale > 0 || o->last.skipped_total > 0) {
        dt_prom_family(f, "dtrain_skipped_steps", "counter", "Steps skipped for an inf/NaN gradient (fp16 overflow, "
                       "or a faulty gradient in any precision).");
        dt_prom_sample(f, "dtrain_skipped_steps", "", (double)o->last.skipped_total);
    }
    dt_prom_family(f, "dtrain_samples_per_second", "gauge", "Training throughput over the last >= 0.5 s.");
    dt_prom_sample(f, "dtrain_samples_per_second", "", o->rate);
    dt_prom_family(f, "dtrain_eta_seconds", "gauge", "Estimated time to the last step.");
    dt_prom_sample(f, "dtrain_eta_seconds", "", o->eta);
    dt_prom_family(f, "dtrain_samples_total", "counter", "Training samples (sequences) processed.");
    dt_prom_sample(f, "dtrain_samples_total", "", (double)o->samples_total);
    if (o->tokens_total) {
        dt_prom_family(f, "dtrain_tokens_per_second", "gauge", "Training tokens per second over the last >= 0.5 s.");
        dt_prom_sample(f, "dtrain_tokens_per_second", "", o->trate);
        dt_prom_family(f, "dtrain_tokens_total", "counter", "Training tokens processed.");
        dt_prom_sample(f, "dtrain_tokens_total", "", (double)o->tokens_total);
    }
    if (o->have_eval) {
        dt_prom_family(f, "dtrain_eval_loss", "gauge", "Loss of the last evaluation.");
        dt_prom_sample(f, "dtrain_eval_loss", "", o->eval_loss);
        if (o->eval_acc >= 0) {
            dt_prom_family(f, "dtrain_eval_accuracy", "gauge", "Accuracy of the last evaluation (0..1).");
            dt_prom_sample(f, "dtrain_eval_accuracy", "", o->eval_acc);
        }
    }
    dt_prom_family(f, "dtrain_stragglers_total", "counter", "Straggler reports (a rank slow for straggler_steps steps).");
    dt_prom_sample(f, "dtrain_stragglers_total", "", (double)o->stragglers_total);

    // Per rank.
    dt_prom_family(f, "dtrain_rank_step_seconds", "gauge",
                   "A rank's own work in the last step: data + forward + backward + optimizer.");
    for (int r = 0; r < o->W; r++) {
        const double *v = o->xs + (size_t)r * NX;
        snprintf(lab, sizeof lab, "rank=\"%d\"", r);
        dt_prom_sample(f, "dtrain_rank_step_seconds", lab, v[X_DATA] + v[X_FORWARD] + v[X_BACKWARD] + v[X_OPTIM]);
    }
    phase_family(f, o, o->xs, "dtrain_rank_phase_seconds", "gauge",
                 "Seconds of the last step per phase (comm: waiting for communication).");
    phase_family(f, o, o->totals, "dtrain_rank_phase_seconds_total", "counter", "Seconds per phase since the start.");
    rank_family(f, o, o->totals, X_SENT, "dtrain_rank_comm_sent_bytes_total", "counter",
                "Bytes sent by collectives (as a ring algorithm moves them).");
    rank_family(f, o, o->totals, X_RECV, "dtrain_rank_comm_received_bytes_total", "counter",
                "Bytes received by collectives (as a ring algorithm moves them).");
    rank_family(f, o, o->xs, X_PEAK, "dtrain_rank_peak_memory_bytes", "gauge", "Peak resident memory of the rank's process.");
    dt_prom_family(f, "dtrain_rank_memory_bytes", "gauge",
                   "Model-state bytes a rank holds by kind at its ZeRO stage (docs/zero.md).");
    for (int r = 0; r < o->W; r++)
        for (int k = 0; k < DT_OBS_MEM_KINDS; k++) {
            snprintf(lab, sizeof lab, "rank=\"%d\",kind=\"%s\"", r, mem_kinds[k]);
            dt_prom_sample(f, "dtrain_rank_memory_bytes", lab, o->xs[(size_t)r * NX + X_MEM + k]);
        }
    if (o->has_gpu) {
        dt_prom_family(f, "dtrain_gpu_memory_bytes", "gauge",
                       "GPU memory of a device run by kind, in the one arena planned at its start (docs/gpu.md).");
        for (int k = 0; k < DT_DEV_KINDS; k++) {
            snprintf(lab, sizeof lab, "kind=\"%s\"", dt_dev_kind_names[k]);
            dt_prom_sample(f, "dtrain_gpu_memory_bytes", lab, o->gpu[k]);
        }
    }
    dt_prom_family(f, "dtrain_rank_straggler", "gauge", "1 while the rank is a reported straggler.");
    for (int r = 0; r < o->W; r++) {
        snprintf(lab, sizeof lab, "rank=\"%d\"", r);
        dt_prom_sample(f, "dtrain_rank_straggler", lab, dt_straggler_flagged(o->strag, r));
    }
    pthread_mutex_unlock(&o->mu);
}

// ----------------------------------------------------------------------------
// creation and the step calls

void dt_obs_set_memory(dt_obs *o, const double bytes[DT_OBS_MEM_KINDS]) {
    if (o) memcpy(o->mem, bytes, sizeof o->mem);
}

void dt_obs_set_gpu_memory(dt_obs *o, const double bytes[DT_DEV_KINDS]) {
    if (!o) return;
    memcpy(o->gpu, bytes, sizeof o->gpu);
    o->has_gpu = 1;
}

void dt_obs_set_share(dt_obs *o, int share) {
    if (o) o->share = share;
}

int dt_obs_rank_work(const dt_obs *o, int r, double *seconds) {
    const double *v = o->x + (size_t)r * NX;
    *seconds = v[X_FORWARD] + v[X_BACKWARD];
    return (int)v[X_SHARE];
}

// This rank's communication so far: over comm, and over all when set.
static void comm_stats(const dt_obs *o, dt_comm_stats *cs) {
    dt_comm_get_stats(o->comm, cs);
    if (!o->all) return;
    dt_comm_stats a;
    dt_comm_get_stats(o->all, &a);
    cs->ops += a.ops;
    cs->bytes_sent += a.bytes_sent;
    cs->bytes_recv += a.bytes_recv;
    cs->busy_seconds += a.busy_seconds;
}

uint64_t dt_obs_bytes_sent(const dt_obs *o) {
    if (!o) return 0;
    dt_comm_stats cs;
    comm_stats(o, &cs);
    return cs.bytes_sent;
}

void dt_obs_leave(dt_obs *o) {
    if (o) o->left = 1;
}

void dt_obs_set_all(dt_obs *o, dt_comm_t all) {
    if (!o || all == o->comm) return;
    o->all = all;
    comm_stats(o, &o->cs);
}

dt_status dt_obs_create(dt_obs **out, const dt_config *c, const char *run_dir, dt_comm_t comm,
                        dt_progress_fn progress, void *user) {
    *out = NULL;
    dt_obs *o = calloc(1, sizeof *o);
    if (!o) return dt_error(DT_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&o->mu, NULL);
    o->comm = comm;
    o->rank = dt_comm_rank(comm);
    o->W = dt_comm_size(comm);
    o->pipeline = c->pipeline;
    o->auc = c->recsys;
    if (o->rank == 0) {
        o->progress = progress;
        o->user = user;
    }
    snprintf(o->name, sizeof o->name, "%s", c->name);
    o->margin = c->straggler_margin;
    o->strag_steps = c->straggler_steps;
    dt_status st = DT_OK;
    o->x = calloc((size_t)o->W * NX, sizeof *o->x);
    o->xs = calloc((size_t)o->W * NX, sizeof *o->xs);
    o->totals = calloc((size_t)o->W * NX, sizeof *o->totals);
    if (!o->x || !o->xs || !o->totals) {
        st = dt_error(DT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (run_dir) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/metrics", run_dir);
        if ((st = dt_make_dirs(dir)) != DT_OK) goto fail;
        snprintf(o->log_path, sizeof o->log_path, "%s/metrics/rank-%05d.jsonl", run_dir, o->rank);
        // Appended to: a run resumed from a checkpoint goes on in the same log.
        int fd = -1;
        if (dt_open_write(o->log_path, O_APPEND, &fd) != DT_OK || !(o->log = fdopen(fd, "a"))) {
            st = dt_error(DT_ERR_IO, "the metrics log %s", fd < 0 ? dt_last_error() : strerror(errno));
            if (fd >= 0) close(fd);
            goto fail;
        }
    }
    if (c->trace[0]) {
        snprintf(o->trace_path, sizeof o->trace_path, "%s", c->trace);
        // Model parallel: each rank's track names its stage (rank = (stage x
        // D + replica) x T + t, docs/model-parallel.md).
        char label[96] = "";
        int P = c->pipeline, T = c->tensor;
        if ((P > 1 || T > 1) && o->W % (P * T) == 0) {
            int D = o->W / (P * T);
            snprintf(label, sizeof label, ": stage %d of %d, tensor %d, replica %d", o->rank / T / D, P, o->rank % T,
                     o->rank / T % D);
        }
        if ((st = dt_trace_open(&o->trace, c->trace, o->rank, label)) != DT_OK) goto fail;
    }
    if (o->rank == 0) {
        o->strag = dt_straggler_create(o->W, c->straggler_margin, c->straggler_steps);
        o->reports = calloc(o->W, sizeof *o->reports);
        if (!o->strag || !o->reports) {
            st = dt_error(DT_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if (c->metrics_port > 0 &&
            (st = dt_prom_start(&o->prom, c->metrics_addr, c->metrics_port, render, o)) != DT_OK)
            goto fail;
    }
    // One time zero for all ranks: the end of a barrier (not for a process
    // that took a dead rank's place: the others are past it).
    if (o->W > 1 && dt_comm_generation(comm) == 0 && dt_comm_incarnation(comm) == 0 && (st = dt_barrier(comm)) != DT_OK) {
        st = dt_error(st, "rank %d, start of the run: %s", o->rank, dt_last_error());
        goto fail;
    }
    o->t0 = dt_now();
    dt_comm_get_stats(comm, &o->cs);
    if (o->trace) dt_comm_set_observer(comm, on_collective, o);
    cJSON *j = record(o, "run", 0, o->t0);
    cJSON_AddStringToObject(j, "name", c->name);
    cJSON_AddStringToObject(j, "dtrain_version", dt_version());
    cJSON_AddNumberToObject(j, "rank", o->rank);
    cJSON_AddNumberToObject(j, "workers", o->W);
    cJSON_AddStringToObject(j, "comm_backend", dt_comm_backend(comm));
    cJSON_AddNumberToObject(j, "host", dt_comm_node(comm));
    cJSON_AddNumberToObject(j, "hosts", dt_comm_nnodes(comm));
    char hn[256] = "";
    if (gethostname(hn, sizeof hn - 1) == 0) cJSON_AddStringToObject(j, "hostname", hn);
    cJSON_AddNumberToObject(j, "start_unix", (double)time(NULL));
    num(j, "straggler_margin", c->straggler_margin);
    cJSON_AddNumberToObject(j, "straggler_steps", c->straggler_steps);
    log_record(o, j);
    *out = o;
    return DT_OK;
fail:
    return dt_obs_close(o, st);
}

void dt_obs_begin(dt_obs *o, dt_obs_phase p) {
    if (!o || (unsigned)p >= DT_OBS_NPHASES) return;
    double now = dt_now();
    if (p < DT_OBS_STEP_PHASES && !o->step_start) o->step_start = now;
    int started = o->open[DT_OBS_DATA] != 0;
    for (int q = DT_OBS_FORWARD; q < DT_OBS_STEP_PHASES; q++) started |= o->acc[q] > 0 || o->open[q];
    if (p >= DT_OBS_STEP_PHASES && !started) {
        // An evaluation after the last batch of an epoch: the data wait
        // that found no batch belongs to no step.
        o->step_start = 0;
        o->acc[DT_OBS_DATA] = 0;
    }
    if (!o->win_t) o->win_t = now;
    o->open[p] = now;
}

void dt_obs_end(dt_obs *o, dt_obs_phase p) {
    if (!o || (unsigned)p >= DT_OBS_NPHASES || !o->open[p]) return;
    double now = dt_now(), t0 = o->open[p];
    o->acc[p] += now - t0;
    o->open[p] = 0;
    if (o->trace) {
        char args[48];
        snprintf(args, sizeof args, "{\"step\":%lld}", (long long)o->last.step + (p < DT_OBS_STEP_PHASES));
        span(o, phase_names[p], p < DT_OBS_STEP_PHASES ? "step" : phase_names[p], DT_TRACE_COMPUTE, t0, now, args);
    }
}

dt_status dt_obs_allreduce(dt_obs *o, float *v, int n, dt_comm_t comm) {
    if (!o || n > DT_OBS_MAX_SUMS) return dt_comm_size(comm) > 1 ? dt_allreduce(v, v, n, DT_F32, DT_SUM, comm) : DT_OK;
    double now = dt_now(), mine[NX] = {0};
    for (int p = X_DATA; p <= X_OPTIM; p++) mine[p] = o->acc[p] + (o->open[p] ? now - o->open[p] : 0);
    mine[X_OPTIM] = o->prev_opt;  // this step's has not run yet
    dt_comm_stats cs;
    comm_stats(o, &cs);
    mine[X_COMM_BUSY] = cs.busy_seconds - o->cs.busy_seconds;
    mine[X_SENT] = (double)(cs.bytes_sent - o->cs.bytes_sent);
    mine[X_RECV] = (double)(cs.bytes_recv - o->cs.bytes_recv);
    mine[X_PEAK] = peak_rss_bytes();
    for (int k = 0; k < DT_OBS_MEM_KINDS; k++) mine[X_MEM + k] = o->mem[k];
    mine[X_SHARE] = o->share;
    for (int i = 0; i < n; i++) mine[X_SUMS + i] = v[i];
    if (o->W == 1) {
        memcpy(o->x, mine, sizeof mine);
        return DT_OK;
    }
    // Raw bytes: the figures are only copied; the sums are formed here, in
    // rank order, the same on every rank.
    dt_status st = dt_allgather(mine, o->x, sizeof mine, DT_U8, comm);
    if (st != DT_OK) return st;
    for (int i = 0; i < n; i++) {
        double sum = 0;
        for (int r = 0; r < o->W; r++) sum += o->x[(size_t)r * NX + X_SUMS + i];
        v[i] = (float)sum;
    }
    return DT_OK;
}

// Rank r's own work in this step (x from the allgather).
static double work_seconds(const dt_obs *o, int r) {
    const double *v = o->x + (size_t)r * NX;
    return v[X_DATA] + v[X_FORWARD] + v[X_BACKWARD] + v[X_OPTIM];
}

// The pipeline stage of rank r (rank = stage x W / P + ...); -1 without a pipeline.
static int stage_of(const dt_obs *o, int r) {
    int P = o->pipeline;
    return P > 1 && o->W % P == 0 ? r / (o->W / P) : -1;
}

// Rank 0: the slowest rank of this step, and straggler reports.
static int rank0_step(dt_obs *o, int64_t step, double now) {
    int W = o->W, slowest = 0;
    double busy[W], work[W * NWORK], worst = -1;
    for (int r = 0; r < W; r++) {
        const double *v = o->x + (size_t)r * NX;
        busy[r] = 0;
        for (int k = 0; k < NWORK; k++) busy[r] += work[r * NWORK + k] = v[work_phases[k]];
        if (busy[r] > worst) worst = busy[r], slowest = r;
    }
    pthread_mutex_lock(&o->mu);  // the metrics endpoint reads the flags
    int n = dt_straggler_update(o->strag, busy, work, NWORK, o->reports);
    pthread_mutex_unlock(&o->mu);
    for (int i = 0; i < n; i++) {
        const dt_straggler_report *s = &o->reports[i];
        const char *ph = phase_names[work_phases[s->phase]];
        if (s->loud)
            dt_log(DT_LOG_WARN,
                   "straggler: rank %d at step %lld: step time %.1f ms is %.0f%% above the median %.1f ms "
                   "(straggler_margin %.0f%%), %d steps in a row; slow phase: %s (+%.1f ms over the other ranks' "
                   "median)",
                   s->rank, (long long)step, s->seconds * 1e3, 100 * (s->seconds / s->median - 1), s->median * 1e3,
                   100.0 * o->margin, o->strag_steps, ph, s->excess * 1e3);
        cJSON *j = record(o, "straggler", step, now);
        cJSON_AddNumberToObject(j, "rank", s->rank);
        cJSON_AddStringToObject(j, "phase", ph);
        num(j, "step_seconds", s->seconds);
        num(j, "median_seconds", s->median);
        num(j, "phase_excess_seconds", s->excess);
        log_record(o, j);
    }
    pthread_mutex_lock(&o->mu);
    memcpy(o->xs, o->x, sizeof *o->x * (size_t)W * NX);
    for (size_t i = 0; i < (size_t)W * NX; i++) o->totals[i] += o->x[i];
    o->stragglers_total += (uint64_t)n;
    pthread_mutex_unlock(&o->mu);
    return slowest;
}

void dt_obs_schedule(dt_obs *o, const dt_obs_sched *h, const dt_obs_span *s, int n) {
    if (!o || !o->log) return;
    cJSON *j = record(o, "schedule", h->step, dt_now());
    cJSON_AddNumberToObject(j, "stage", h->stage);
    cJSON_AddNumberToObject(j, "stages", h->stages);
    cJSON_AddNumberToObject(j, "virtual_stages", h->virtual_stages);
    cJSON_AddNumberToObject(j, "micro_batches", h->micro_batches);
    cJSON_AddNumberToObject(j, "tensor", h->tensor);
    cJSON_AddNumberToObject(j, "replica", h->replica);
    cJSON *a = cJSON_AddArrayToObject(j, "spans");  // [forward?, micro-batch, chunk, start, end] (seconds)
    for (int i = 0; i < n && a; i++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber(s[i].fwd));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(s[i].mb));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(s[i].chunk));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(round((s[i].t0 - o->t0) * 1e6) / 1e6));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(round((s[i].t1 - o->t0) * 1e6) / 1e6));
        cJSON_AddItemToArray(a, e);
    }
    log_record(o, j);
}

void dt_obs_pipeline_split(dt_obs *o, const char *balance, const int *bounds, int nstages,
                           const double *layer_seconds, int nlayers) {
    if (!o || !o->log) return;
    cJSON *j = record(o, "pipeline_split", 0, dt_now());
    cJSON_AddStringToObject(j, "balance", balance);
    cJSON *a = cJSON_AddArrayToObject(j, "stages");  // [first layer, end] of each (virtual) stage
    for (int s = 0; s < nstages && a; s++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber(bounds[s]));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(bounds[s + 1]));
        cJSON_AddItemToArray(a, e);
    }
    if (layer_seconds) {
        cJSON *l = cJSON_AddArrayToObject(j, "layer_seconds");
        for (int i = 0; i < nlayers && l; i++)
            cJSON_AddItemToArray(l, cJSON_CreateNumber(round(layer_seconds[i] * 1e9) / 1e9));
    }
    log_record(o, j);
}

void dt_obs_at(dt_obs *o, const dt_obs_step_info *s) {
    if (o) o->last = *s;
}

void dt_obs_step(dt_obs *o, const dt_obs_step_info *s) {
    if (!o) return;
    double now = dt_now(), step_s = o->step_start ? now - o->step_start : 0;
    dt_comm_stats cs;
    comm_stats(o, &cs);
    double busy = cs.busy_seconds - o->cs.busy_seconds, exposed = o->acc[DT_OBS_COMM];
    o->win_samples += s->samples;
    o->win_tokens += s->tokens;
    // rate and trate are read by the metrics endpoint's thread: written
    // under the mutex (this thread alone writes them, so reads here need none).
    double rate = o->rate, trate = o->trate;
    if (now - o->win_t >= 0.5 || rate == 0) {
        double dt = now - o->win_t > 1e-9 ? now - o->win_t : 1e-9;
        rate = o->win_samples / dt;
        trate = o->win_tokens / dt;
        o->win_t = now;
        o->win_samples = o->win_tokens = 0;
    }
    double eta = rate > 0 ? (double)(s->total_steps - s->step) * s->samples / rate : 0;
    int slowest = o->rank == 0 ? rank0_step(o, s->step, now) : 0;
    pthread_mutex_lock(&o->mu);
    o->rate = rate;
    o->trate = trate;
    o->last = *s;
    o->eta = eta;
    o->samples_total += s->samples;
    o->tokens_total += s->tokens;
    pthread_mutex_unlock(&o->mu);

    cJSON *j = record(o, "step", s->step, now);
    cJSON_AddNumberToObject(j, "epoch", s->epoch);
    num(j, "loss", s->loss);
    num(j, "lr", s->lr);
    num(j, "grad_norm", s->grad_norm);
    if (s->has_staleness) cJSON_AddNumberToObject(j, "staleness", s->staleness);
    if (s->piece > 0) {  // dynamic sharing: which batch of the epoch, and which part of it
        cJSON_AddNumberToObject(j, "batch", (double)((s->piece - 1) / (o->W > 0 ? o->W : 1)));
        cJSON_AddNumberToObject(j, "part", (double)((s->piece - 1) % (o->W > 0 ? o->W : 1)));
    }
    if (s->loss_scale > 0) num(j, "loss_scale", s->loss_scale);  // fp16's dynamic loss scaling
    if (s->loss_scale > 0 || s->skipped_total > 0) {  // (any precision: a step skipped for a NaN/Inf gradient)
        cJSON_AddBoolToObject(j, "skipped", s->skipped);
        cJSON_AddNumberToObject(j, "skipped_steps", (double)s->skipped_total);
    }
    cJSON_AddNumberToObject(j, "samples", (double)s->samples);
    if (o->W > 1) cJSON_AddNumberToObject(j, "share", o->share);
    num(j, "samples_per_sec", step_s > 0 ? s->samples / step_s : 0);
    if (s->tokens) num(j, "tokens_per_sec", step_s > 0 ? s->tokens / step_s : 0);
    num(j, "step_seconds", step_s);
    num(j, "data_seconds", o->acc[DT_OBS_DATA]);
    num(j, "forward_seconds", o->acc[DT_OBS_FORWARD]);
    num(j, "backward_seconds", o->acc[DT_OBS_BACKWARD]);
    num(j, "comm_exposed_seconds", exposed);
    num(j, "comm_hidden_seconds", busy > exposed ? busy - exposed : 0);
    num(j, "optimizer_seconds", o->acc[DT_OBS_OPTIMIZER]);
    if (o->acc[DT_OBS_CHECKPOINT] > 0) num(j, "checkpoint_seconds", o->acc[DT_OBS_CHECKPOINT]);
    cJSON_AddNumberToObject(j, "bytes_sent", (double)(cs.bytes_sent - o->cs.bytes_sent));
    cJSON_AddNumberToObject(j, "bytes_recv", (double)(cs.bytes_recv - o->cs.bytes_recv));
    cJSON_AddNumberToObject(j, "peak_rss_bytes", peak_rss_bytes());
    cJSON *mb = cJSON_AddObjectToObject(j, "memory_bytes");
    for (int k = 0; k < DT_OBS_MEM_KINDS; k++) cJSON_AddNumberToObject(mb, mem_kinds[k], o->mem[k]);
    if (o->has_gpu) {
        cJSON *gb = cJSON_AddObjectToObject(j, "gpu_memory_bytes");
        for (int k = 0; k < DT_DEV_KINDS; k++) cJSON_AddNumberToObject(gb, dt_dev_kind_names[k], o->gpu[k]);
    }
    int sstage = stage_of(o, slowest);
    if (o->rank == 0 && o->W > 1) {
        cJSON_AddNumberToObject(j, "slowest_rank", slowest);
        if (sstage >= 0) cJSON_AddNumberToObject(j, "slowest_stage", sstage);
        num(j, "slowest_step_seconds", work_seconds(o, slowest));
    }
    log_record(o, j);

    if (o->progress) {
        dt_progress p = {s->step, s->total_steps, s->epoch, s->epochs, s->loss, s->lr, o->rate, eta, 0, 0, 0,
                         o->trate, o->W, slowest, work_seconds(o, slowest), sstage, s->rounds, o->auc};
        o->progress(&p, o->user);
    }
    o->prev_opt = o->acc[DT_OBS_OPTIMIZER];
    for (int p = 0; p < DT_OBS_STEP_PHASES; p++) o->acc[p] = 0;
    o->acc[DT_OBS_CHECKPOINT] = 0;
    o->step_start = 0;
    o->cs = cs;
}

void dt_obs_eval(dt_obs *o, float train_loss, float eval_loss, float eval_accuracy) {
    if (!o) return;
    const dt_obs_step_info *s = &o->last;
    cJSON *j = record(o, "eval", s->step, dt_now());
    cJSON_AddNumberToObject(j, "epoch", s->epoch);
    num(j, "train_loss", train_loss);
    num(j, "loss", eval_loss);
    if (eval_accuracy >= 0) num(j, "accuracy", eval_accuracy);  // (the recommender's: its AUC)
    num(j, "seconds", o->acc[DT_OBS_EVAL]);
    log_record(o, j);
    o->acc[DT_OBS_EVAL] = 0;
    pthread_mutex_lock(&o->mu);
    o->eval_loss = eval_loss;
    o->eval_acc = eval_accuracy;
    o->have_eval = 1;
    pthread_mutex_unlock(&o->mu);
    if (o->progress) {
        dt_progress p = {s->step, s->total_steps, s->epoch, s->epochs, train_loss, s->lr, o->rate, 0, 1, eval_loss,
                         eval_accuracy, o->trate, o->W, -1, 0, -1, s->rounds, o->auc};
        o->progress(&p, o->user);
    }
}

int dt_obs_logged_eval(dt_obs *o, int64_t step, float *eval_loss, float *eval_accuracy) {
    FILE *f = o && o->log_path[0] ? dt_fopen_read(o->log_path) : NULL;
    if (!f) return 0;
    char key[64], line[8192];
    snprintf(key, sizeof key, "\"type\":\"eval\",\"step\":%lld,", (long long)step);
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, key)) {  // the last one, should there be several
            cJSON *j = cJSON_Parse(line), *l = cJSON_GetObjectItem(j, "loss"), *a = cJSON_GetObjectItem(j, "accuracy");
            if (cJSON_IsNumber(l)) {
                found = 1;
                *eval_loss = (float)l->valuedouble;
                *eval_accuracy = cJSON_IsNumber(a) ? (float)a->valuedouble : -1;
            }
            cJSON_Delete(j);
        }
    fclose(f);
    return found;
}

dt_status dt_obs_close(dt_obs *o, dt_status st) {
    if (!o) return st;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", dt_last_error());
    dt_comm_set_observer(o->comm, NULL, NULL);
    dt_prom_stop(o->prom);
    dt_status s2 = dt_trace_finish(o->trace);
    if (o->trace && !o->left && st == DT_OK && s2 == DT_OK) {
        // Every part is complete once every rank has passed the barrier.
        if (o->W > 1 && (s2 = dt_barrier(o->comm)) != DT_OK)
            s2 = dt_error(s2, "rank %d, trace: %s", o->rank, dt_last_error());
        if (s2 == DT_OK && o->rank == 0) s2 = dt_trace_merge(o->trace_path, o->W);
    }
    if (o->log && fclose(o->log) != 0 && !o->log_failed)
        dt_log(DT_LOG_WARN, "%s: cannot write the metrics log: %s", o->log_path, strerror(errno));
    for (int r = 0; o->strag && r < o->W; r++) {  // (the reports not shown, summed)
        int loud, n = dt_straggler_reports(o->strag, r, &loud);
        if (n > loud)
            dt_log(DT_LOG_WARN, "straggler: rank %d was reported %d times in all (%d warned of: one at most every %d steps; "
                                "every report is in the metrics log)", r, n, loud, DT_STRAGGLER_QUIET);
    }
    dt_straggler_free(o->strag);
    free(o->reports);
    free(o->x);
    free(o->xs);
    free(o->totals);
    pthread_mutex_destroy(&o->mu);
    free(o);
    if (st != DT_OK) {
        dt_error(st, "%s", saved);
        return st;
    }
    return s2;
}
