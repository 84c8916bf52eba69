/*
 * dtrain/train.h - training and evaluation runs.
 *
 * dt_train() builds the model, data and optimizer a dt_config describes and
 * trains it, writing into the run directory:
 *   config.ini          the resolved config
 *   model.safetensors   final weights
 *   summary.json        steps, losses, evaluation metrics, time, throughput
 */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/config.h"
#include "dtrain/data.h"

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
 * (docs/data-parallel.md). Only rank 0 writes run_dir and calls progress. */
DT_API dt_status dt_train(const dt_config *c, const char *run_dir, dt_progress_fn progress,
                          void *user, dt_train_result *res);

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

/* Formats a progress line into buf: "step 120/2340 | epoch 1/10 | loss 0.4312
 * | lr 1.0e-03 | 5123 samples/s | ETA 1m02s". */
DT_API void dt_progress_format(const dt_progress *p, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
