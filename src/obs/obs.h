/* What the training loop reports while it runs: the one interface between the
 * loop (engine/loop.c) and every observability
 * output (docs/observability.md).
 *
 *   dt_obs *obs;
 *   dt_obs_create(&obs, c, run_dir, comm, progress, user);   // all ranks
 *   for each step:
 *       dt_obs_begin(obs, DT_OBS_DATA);  next batch;  dt_obs_end(obs, DT_OBS_DATA);
 *       ... DT_OBS_FORWARD, DT_OBS_BACKWARD (per micro-batch) ...
 *       dt_obs_begin(obs, DT_OBS_COMM);  wait for the gradients, and
 *       dt_obs_allreduce(obs, ...);      // the loss (engine/control.c)
 *       dt_obs_end(obs, DT_OBS_COMM);
 *       ... DT_OBS_OPTIMIZER ...
 *       dt_obs_step(obs, &info);         // one record per step
 *   dt_obs_eval(obs, train_loss, loss, accuracy) after an evaluation
 *       (wrapped in DT_OBS_EVAL begin/end);
 *   st = dt_obs_close(obs, st);          // all ranks, before the comm goes
 *
 * Phases are timed by begin/end pairs (they may nest; each pair is one span
 * of the trace). Anything else that takes time in the loop, such as saving
 * a checkpoint, is wrapped the same way: dt_obs_begin(obs, DT_OBS_CHECKPOINT)
 * ... dt_obs_end(obs, DT_OBS_CHECKPOINT).
 *
 * Outputs, each only when asked for:
 *   run_dir/metrics/rank-NNNNN.jsonl  every rank: one JSON object per step,
 *                                     evaluation and straggler (obs/metrics.c)
 *   progress callback                 rank 0, with the slowest rank
 *   Prometheus endpoint               rank 0, c->metrics_port (obs/prom.c)
 *   Chrome trace                      c->trace, merged by rank 0 (obs/trace.c)
 *   straggler warnings                rank 0 (obs/straggler.c)
 *
 * Every call but dt_obs_create does nothing on a NULL obs (and
 * dt_obs_allreduce is then a plain allreduce). */
#ifndef DT_OBS_OBS_H
#define DT_OBS_OBS_H

#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "dtrain/train.h"
#include "gpu/dev.h"

typedef struct dt_obs dt_obs;

typedef enum {
    DT_OBS_DATA = 0,    /* waiting for the next batch */
    DT_OBS_FORWARD,
    DT_OBS_BACKWARD,
    DT_OBS_COMM,        /* waiting for communication (the exposed part) */
    DT_OBS_OPTIMIZER,   /* clipping, schedule, update */
    DT_OBS_STEP_PHASES, /* the phases above make up a step */
    DT_OBS_EVAL = DT_OBS_STEP_PHASES,
    DT_OBS_CHECKPOINT,
    DT_OBS_NPHASES
} dt_obs_phase;

/* "data", "forward", "backward", "comm", "optimizer", "eval", "checkpoint". */
const char *dt_obs_phase_name(dt_obs_phase p);

/* One training step, as the loop knows it after the optimizer. */
typedef struct {
    int64_t step, total_steps; /* step counts from 1 */
    int epoch, epochs;         /* epoch counts from 1 */
    float loss;                /* the global batch's mean loss */
    float lr, grad_norm;       /* grad_norm: of the averaged gradient, before clipping */
    int64_t samples;           /* samples (sequences) in the global batch */
    int64_t tokens;            /* tokens in the global batch (language models), else 0 */
    int has_staleness;         /* parameter servers: the record carries staleness */
    int staleness;             /* updates between the weights this rank's gradient was computed from and
                                  those it was applied to; -1: dropped (a backup worker's late gradient) */
    float loss_scale;          /* fp16: the loss scale after the step (0: no loss scaling) */
    int skipped;               /* fp16: this step was skipped for an overflow */
    int64_t skipped_total;     /* fp16: steps skipped so far */
    int64_t piece;             /* parameter servers' dynamic sharing: 1 + the piece of the epoch this rank
                                  trained (batch x workers + part: part `part` of the batch's even split);
                                  0: none, the rank's own share */
    int rounds;                /* 1: the steps are federated averaging's rounds (dt_progress) */
} dt_obs_step_info;

/* Collective over comm. Opens this rank's metrics log (run_dir may be NULL:
 * none), on rank 0 the Prometheus endpoint, and the trace part; aligns the
 * ranks' clocks with a barrier. progress (may be NULL) is called on rank 0
 * only. Errors (an unwritable directory, a port in use) name what failed. */
dt_status dt_obs_create(dt_obs **out, const dt_config *c, const char *run_dir, dt_comm_t comm,
                        dt_progress_fn progress, void *user);
/* The run's communicator with the ranks of another role (a parameter
 * server's, over which the pushes go): its bytes and busy time count in
 * this rank's records too. */
void dt_obs_set_all(dt_obs *o, dt_comm_t all);
/* Another communicator of this rank's whose collectives go into the trace
 * (--trace) on the communication row, as the run's do (the GPUs'). */
void dt_obs_trace_comm(dt_obs *o, dt_comm_t c);
/* This rank ends without the others (a replacement for one that had
 * finished): dt_obs_close then skips the trace's closing barrier, which
 * its predecessor made. */
void dt_obs_leave(dt_obs *o);
/* The bytes this rank has sent so far, over both (comm.h's counts). */
uint64_t dt_obs_bytes_sent(const dt_obs *o);
void dt_obs_begin(dt_obs *o, dt_obs_phase p);
void dt_obs_end(dt_obs *o, dt_obs_phase p);
/* The per-step allreduce every loop does (the loss, a stop flag): sums
 * v[0..n) over the ranks of comm, n <= DT_OBS_MAX_SUMS. With an obs, it is
 * one allgather that also brings rank 0 every rank's phase times of this
 * step, bytes moved and peak memory; with NULL, a plain allreduce. */
#define DT_OBS_MAX_SUMS 4
dt_status dt_obs_allreduce(dt_obs *o, float *v, int n, dt_comm_t comm);
/* This rank's bytes by kind (weights, gradients, optimizer state,
 * communication buffers, activations; docs/zero.md): each step's metrics record
 * carries them, and rank 0's endpoint shows every rank's. */
#define DT_OBS_MEM_KINDS 5
void dt_obs_set_memory(dt_obs *o, const double bytes[DT_OBS_MEM_KINDS]);
/* A device run's GPU bytes by kind (weights, gradients, optimizer state,
 * activations, workspace: the arena's, gpu/dev.h): each step's record then
 * carries them ("gpu_memory_bytes"), and the endpoint shows them
 * (dtrain_gpu_memory_bytes{kind}). Not called: no GPU, neither appears. */
void dt_obs_set_gpu_memory(dt_obs *o, const double bytes[DT_DEV_KINDS]);
/* This rank's samples in the step under way (its record's "share"); the
 * allgather of dt_obs_allreduce carries it to every rank. */
void dt_obs_set_share(dt_obs *o, int share);
/* After dt_obs_allreduce with an obs, on every rank: rank r's forward and
 * backward seconds in this step (*seconds) and its share (returned). */
int dt_obs_rank_work(const dt_obs *o, int r, double *seconds);
/* Ends the step: its metrics record, progress, the endpoint's figures,
 * straggler detection. */
void dt_obs_step(dt_obs *o, const dt_obs_step_info *s);
/* Where a run stands that did not record the steps before (a process
 * taking a dead one's place after its step s->step): the last step for the
 * records that follow, without a step record of its own. */
void dt_obs_at(dt_obs *o, const dt_obs_step_info *s);
/* An evaluation just ended, after the last step recorded (accuracy < 0:
 * none); train_loss is the training loss to show beside it. */
void dt_obs_eval(dt_obs *o, float train_loss, float eval_loss, float eval_accuracy);
/* Whether this rank's metrics log already holds an evaluation at `step`
 * (made by the process this one replaces, before it died); its loss and
 * accuracy (-1: none) then. 0 without a log. */
int dt_obs_logged_eval(dt_obs *o, int64_t step, float *eval_loss, float *eval_accuracy);
/* A model-parallel step as one rank ran it: a "schedule" record of its
 * metrics log (dtrain report draws the stages' records of one step as the
 * pipeline timeline). Each span is a forward (fwd = 1) or backward of
 * micro-batch mb on virtual stage chunk, from t0 to t1 (dt_now()). */
typedef struct {
    int fwd, mb, chunk;
    double t0, t1;
} dt_obs_span;
typedef struct {
    int64_t step;      /* counts from 1 */
    int stage, stages, virtual_stages, micro_batches, tensor, replica;
} dt_obs_sched;
void dt_obs_schedule(dt_obs *o, const dt_obs_sched *h, const dt_obs_span *s, int n);
/* The pipeline's cut as this rank made it: a "pipeline_split" record of its
 * metrics log (every rank's must be the same). balance names how it was
 * chosen; bounds[0..nstages] the first layer of each (virtual) stage and
 * the layers; layer_seconds[nlayers] each layer's measured forward +
 * backward (NULL: not measured). */
void dt_obs_pipeline_split(dt_obs *o, const char *balance, const int *bounds, int nstages,
                           const double *layer_seconds, int nlayers);
/* Collective when st == DT_OK: finishes the trace (rank 0 merges every
 * rank's part into c->trace) and closes everything. Returns st if it is an
 * error, else the first error of closing. NULL is fine. */
dt_status dt_obs_close(dt_obs *o, dt_status st);

#endif
