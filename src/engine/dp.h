/* Data-parallel gradient averaging in buckets, overlapped with backward.
 *
 * The gradients are taken in the model's gradient order: a list of ranges of
 * the block whose concatenation backward finishes from its end (for a
 * classifier, the block itself: order NULL; for the GPT, its slices layer by
 * layer, dt_gpt_grad_order). The order is cut into buckets of about
 * bucket_floats, from its end towards its start; a bucket is one piece of
 * the block, or several where it spans ranges that do not touch (one
 * allreduce each). During the last micro-step's backward, the model's grad
 * hook reports how far the final part of the order has grown; every bucket
 * wholly inside it is handed to the communicator's progress thread at once
 * (dt_iallreduce, SUM), so that its transfer overlaps the rest of backward.
 * dt_dp_finish() starts what is left and waits for all of it. Gradients must
 * already carry the weight local / global batch (dt_model_set_loss_scale),
 * so the SUM is the global mean.
 *
 * Deterministic mode sums in int64 fixed point instead (dt_dp_fixed_*):
 * integer addition is associative, so the result is bitwise the same for
 * any number of ranks and any order. */
#ifndef DT_ENGINE_DP_H
#define DT_ENGINE_DP_H

#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "obs/obs.h"

typedef struct dt_dp dt_dp;

/* For grads[n] in the gradient order order[norder] (NULL: the block from
 * its end); DT_ERR_ARG when the ranges do not add up to n. */
dt_status dt_dp_create(dt_dp **out, dt_comm_t comm, float *grads, size_t n, size_t bucket_floats,
                       const dt_grad_range *order, int norder);
void dt_dp_free(dt_dp *d);
/* Arms the buckets for one step's allreduce (call before the last
 * micro-step's backward). */
void dt_dp_begin(dt_dp *d);
/* The model's grad hook: gradients at positions >= pos of the order are
 * final. */
void dt_dp_ready(size_t pos, void *dp);
/* Starts the buckets not yet started and waits for all. */
dt_status dt_dp_finish(dt_dp *d);
/* Seconds of the last step's communication window (first bucket started to
 * last one done) and the part of it spent waiting after backward. */
void dt_dp_last_times(const dt_dp *d, double *window, double *exposed);
int dt_dp_num_buckets(const dt_dp *d);

/* Deterministic mode: acc[n] += round(g * 2^32) for each shard's gradient,
 * then one int64 SUM allreduce, then grads = acc / 2^32. */
void dt_dp_fixed_add(int64_t *acc, const float *g, size_t n);
dt_status dt_dp_fixed_reduce(int64_t *acc, float *grads, size_t n, dt_comm_t comm);

/* ---- one training step, as every training loop runs it -------------------
 *
 * A rank's share of a global batch is cut into micro-batches (deterministic
 * mode: the fixed shards of the global batch that fall in the share;
 * otherwise train.grad_accum parts of the share); each one's loss is scaled
 * by its size / the global batch; the last one's backward starts the
 * bucketed allreduce (or, deterministic, every one's gradient goes into the
 * fixed-point sums). After dt_dp_step_end the gradient block holds the
 * global batch's mean gradient on every rank, for one process as for W:
 *
 *   int nm = dt_dp_step_begin(&s, first, share, global);
 *   for (int k = 0; k < nm; k++) {
 *       scale the loss by s.len[k] / global; forward over the samples
 *       first + s.off[k] .. + s.len[k]; grad hook dt_dp_step_hook(&s, k),
 *       s.dp; backward; dt_dp_step_micro_end(&s, k, loss);
 *   }
 *   dt_dp_step_end(&s, &loss);   // loss: the global batch's mean */
typedef struct {
    const dt_config *c;
    dt_comm_t comm;
    float *grads;
    size_t n;
    dt_dp *dp;              // buckets overlapped with backward (W > 1)
    int64_t *acc;           // deterministic mode's fixed-point sums
    int nmicro, *off, *len; // this step's micro-batches, from its first sample
    int global;
    double loss;            // sum over this step's micro-batches of loss x size
    double comm_seconds, comm_exposed_seconds;  // summed over steps
    float save_vote;        // before dt_dp_step_end: this rank's vote for a checkpoint
    int stop;               // after dt_dp_step_end: some rank was asked to stop
    int save;               // after dt_dp_step_end: some rank voted for a checkpoint
    dt_obs *obs;            // the loop's, or NULL: the loss allreduce carries its timings
} dt_dp_step;

/* Checks c against the W workers (a global batch of at least W samples; in
 * deterministic mode micro_shards a multiple of W); DT_ERR_CONFIG naming
 * the field otherwise. */
dt_status dt_dp_check(const dt_config *c, int W);
/* The largest micro-batch a rank runs: the model's batch capacity. */
int dt_dp_max_micro(const dt_config *c, int W);
/* For the gradient block grads[n] (the model's, which must outlive s) and
 * its gradient order (see dt_dp_create; NULL, 0 for the block itself). */
dt_status dt_dp_step_init(dt_dp_step *s, const dt_config *c, dt_comm_t comm, float *grads, size_t n,
                          const dt_grad_range *order, int norder);
void dt_dp_step_free(dt_dp_step *s);
/* Plans a step over this rank's samples [first, first + share) of a global
 * batch of `global`, and arms the buckets; returns the micro-batches. The
 * gradient block must be zero. */
int dt_dp_step_begin(dt_dp_step *s, int first, int share, int global);
/* The grad hook for micro-batch k's backward (NULL but for the last). */
dt_grad_ready_fn dt_dp_step_hook(const dt_dp_step *s, int k);
/* After micro-batch k's backward, whose mean loss was `loss`. */
void dt_dp_step_micro_end(dt_dp_step *s, int k, float loss);
/* Completes the gradient sum and sets *loss to the global batch's mean,
 * s->stop when any rank was asked to stop (dt_train_request_stop) and
 * s->save when any rank set save_vote: one allreduce agrees on all three. */
dt_status dt_dp_step_end(dt_dp_step *s, float *loss);

/* The rest of a step, the same in every loop: ck's vote for a checkpoint
 * (dt_run_ckpt_vote), dt_dp_step_end, then the gradient norm, clipping to
 * [optim] clip_norm, the learning rate of step `step` (0-based) and the
 * optimizer update of params, each timed in s->obs. Sets the global batch's
 * mean *loss, *lr and the norm *gnorm; errors name the rank and the step. */
struct dt_run_ckpt;
dt_status dt_dp_step_update(dt_dp_step *s, struct dt_run_ckpt *ck, dt_optim *opt, const dt_schedule *sched,
                            float *params, int64_t step, float *loss, float *lr, float *gnorm);

#endif
