/*
 * dtrain/train.h - training and evaluation runs.
 *
 * dt_train() builds the model, data and optimizer a dt_config describes and
 * trains it, writing into the run directory:
 *   config.ini          the resolved config
 *   model.safetensors   final weights
 *   summary.json        steps, losses, evaluation metrics, time, throughput
 *   metrics/rank-NNNNN.jsonl  every rank: one JSON object per step and
 *                       evaluation (docs/observability.md)
 * and, as c's [obs] section asks, a Prometheus endpoint on rank 0 and a
 * Chrome trace file.
 */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a progress callback sees, once per step. */
typedef struct {
    int64_t step, total_steps;   /* step counts from 1 */
    int epoch, epochs;
    float loss;                  /* this step's training loss */
    float lr;
    double samples_per_sec;      /* over the recent window */
    double eta_seconds;
    int is_eval;                 /* 1: an evaluation just ended (eval_* set) */
    float eval_loss, eval_accuracy; /* eval_accuracy < 0: none (language models) */
    double tokens_per_sec;       /* language models, over the recent window; else 0 */
    int workers;                 /* data-parallel ranks */
    int slowest_rank;            /* workers > 1: the rank with the longest step time */
    double slowest_step_seconds; /* its own work in the step (data + forward +
                                    backward + optimizer), not waiting for others */
} dt_progress;

typedef void (*dt_progress_fn)(const dt_progress *p, void *user);

typedef struct {
    int64_t steps;
    int epochs;                  /* epochs started */
    float final_train_loss;      /* mean over the last epoch's (or run's last) steps */
    float test_loss, test_accuracy;
    double wall_seconds;         /* whole run including data loading and evaluation */
    double train_seconds;        /* training steps only */
    double samples_per_sec;      /* training samples / train_seconds */
    int rank, workers, threads;  /* this worker, data-parallel workers, threads each */
    double comm_seconds;         /* gradient allreduce windows (first bucket
                                    started to last done), summed over steps */
    double comm_exposed_seconds; /* the part of them after backward had ended */
    int stopped;                 /* 1: stopped early on request, at a checkpoint */
    int64_t resumed_step;        /* the step a resumed run started from (0: none) */
} dt_train_result;

/* Trains as c says. run_dir (created if missing, may be NULL for no files).
 * progress may be NULL.
 *
 * Data parallel: when the process is one rank of several (started by
 * `dtrain run`, `dtrain train --workers N`, mpirun or srun; see comm.h), each
 * rank trains on its share of every global batch of c->batch samples and
 * the gradients are averaged, so the run gives the model one process would
 * (docs/data-parallel.md). Only rank 0 calls progress and writes run_dir's
 * files, except that every rank writes its own metrics log there. */
DT_API dt_status dt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress,
                          void *user, dt_train_result *res);

/* Checks c against a run on W workers, as dt_train will before it builds
 * anything (the distribution strategy's own checks: a global batch of at
 * least W samples; in deterministic mode micro_shards a multiple of W);
 * DT_ERR_CONFIG naming the field otherwise. */
DT_API dt_status dt_train_check(const dt_config *c, int W);

/* Federated averaging (docs/federated.md, `dtrain federate`): c's
 * [federated] section splits the training set over simulated clients;
 * each round a sample of them trains locally from the global model on the
 * workers of the run (under --workers or mpirun, as dt_train) and the
 * server averages their updates weighted by sample count (FedAvg, FedAvgM,
 * FedAdam; FedProx's mu; dropouts; secure aggregation). run_dir gets
 * clients.json (each client's class histogram), metrics/ (one record and
 * one evaluation per round), model.safetensors and summary.json (the test
 * accuracy of every round). In res, steps counts rounds. */
DT_API dt_status dt_federate(const dt_config *c, const char *run_dir, dt_progress_fn progress, void *user,
                             dt_train_result *res);
/* What dt_federate refuses before any work, for W workers (DT_ERR_CONFIG
 * naming the field). */
DT_API dt_status dt_federate_check(const dt_config *c, int W);

/* Asks the running dt_train (of this process) to stop after the current
 * step: every rank stops after the same step, a checkpoint is written when
 * checkpoints are on, and dt_train returns DT_OK with res->stopped = 1.
 * Async-signal-safe: the CLI calls it from its SIGUSR1 handler. */
DT_API void dt_train_request_stop(void);

/* The GPT training loop (c->gpt set; dt_train calls it for such configs):
 * random windows of seq_len+1 tokens from [data] train_file, the optimizer
 * and schedule, the validation loss over [data] val_file every eval_every
 * steps and at the end. Writes config.ini, model.safetensors (dt_gpt_save)
 * and summary.json (val_loss, val_history, tokens_per_sec, ...) into run_dir.
 * In res, test_loss is the final validation loss and test_accuracy -1;
 * progress reports sequences as samples. Data parallel as dt_train, with
 * the same options (grad_accum, deterministic, lr_scaling): each of W ranks
 * trains on its share of the same global batch of windows and the
 * gradients are averaged in buckets during backward, so the run gives the
 * model one process would (docs/gpt.md). */
DT_API dt_status dt_gpt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress,
                              void *user, dt_train_result *res);
/* A GPT's loss and next-token accuracy over eval_batches batches of
 * consecutive windows of [data] val_file (train_file when there is none);
 * *n is the number of tokens. dt_eval_checkpoint calls this for GPTs. */
DT_API dt_status dt_gpt_eval_checkpoint(const dt_config *c, const char *weights, float *loss,
                                        float *accuracy, int *n);

/* Mean loss and accuracy of m over ds, in batches of `batch`. */
DT_API dt_status dt_evaluate(dt_model *m, const dt_dataset *ds, int batch, float *loss,
                             float *accuracy);

/* Loads the test split named by c, the weights in `weights`, and evaluates. */
DT_API dt_status dt_eval_checkpoint(const dt_config *c, const char *weights, float *loss,
                                    float *accuracy, int *n);

/* What a memory check is for: a training run, dt_eval_checkpoint, or
 * sampling text from a GPT (batch 1, block_size tokens). */
typedef enum { DT_MEM_TRAIN, DT_MEM_EVAL, DT_MEM_SAMPLE } dt_mem_use;

/* Works out, from c's validated sizes and without allocating them, the
 * memory one worker needs: the model's activations for its largest batch
 * (a classifier's for min(batch, samples) rows: train.batch's micro-batch
 * or train.eval_batch, whichever is larger; a GPT's for its micro-batch x
 * seq_len tokens), parameters, gradients and optimizer state, and the data
 * (the splits as floats, the loader's buffers; token files, read whole).
 * workers: the run's data-parallel workers. starting = 1: all of them are
 * about to start on this machine (the CLI, before it starts them) and must
 * fit together; 0: this process is one of them and checks its own need
 * (against its share of dt_mem_limit() when launched locally: --workers N
 * or dtrain run; under mpirun or srun each rank has the whole limit). Fails with DT_ERR_NOMEM when the
 * need exceeds dt_mem_available(), with a message naming the field behind
 * the largest part and the bytes; with the data files' errors when their
 * headers cannot be read. *model_rows (may be NULL) gets the batch rows a
 * classifier's model needs. */
DT_API dt_status dt_check_memory(const dt_config *c, dt_mem_use use, int workers, int starting,
                                 int *model_rows);

/* Formats a progress line into buf: "step 120/2340 | epoch 1/10 | loss 0.4312
 * | lr 1.0e-03 | 5123 samples/s | ETA 1m02s | slowest rank 1 (12 ms)". */
DT_API void dt_progress_format(const dt_progress *p, char *buf, size_t n);
/* The same as one line of JSON: {"type":"step"|"eval", "step": ..., ...}
 * (docs/observability.md lists the keys). */
DT_API void dt_progress_format_json(const dt_progress *p, char *buf, size_t n);

/* Writes a self-contained HTML report (inline SVG charts: loss and
 * accuracy, throughput, per-rank time by phase, stragglers) of the run in
 * run_dir, from its metrics logs (metrics/rank-*.jsonl) and summary.json,
 * to out_path. Errors name the file and line of bad input. */
DT_API dt_status dt_report_html(const char *run_dir, const char *out_path);

#ifdef __cplusplus
}
#endif
#endif
