/* Data-parallel gradient averaging in buckets, overlapped with backward.
 *
 * The gradient block is cut into buckets of about bucket_floats, from its end
 * (where backward finishes first) towards its start. During the last
 * micro-step's backward, the model's grad hook reports how far the final
 * region has grown; every bucket wholly inside it is handed to the
 * communicator's progress thread at once (dt_iallreduce, SUM), so that its
 * transfer overlaps the rest of backward. dt_dp_finish() starts what is left
 * and waits for all of it. Gradients must already carry the weight local /
 * global batch (dt_model_set_loss_scale), so the SUM is the global mean.
 *
 * Deterministic mode sums in int64 fixed point instead (dt_dp_fixed_*):
 * integer addition is associative, so the result is bitwise the same for
 * any number of ranks and any order. */
#ifndef DT_ENGINE_DP_H
#define DT_ENGINE_DP_H

#include "dtrain/comm.h"

typedef struct dt_dp dt_dp;

dt_status dt_dp_create(dt_dp **out, dt_comm_t comm, float *grads, size_t n, size_t bucket_floats);
void dt_dp_free(dt_dp *d);
/* Arms the buckets for one step's allreduce (call before the last
 * micro-step's backward). */
void dt_dp_begin(dt_dp *d);
/* The model's grad hook: gradients at offsets >= offset are final. */
void dt_dp_ready(size_t offset, void *dp);
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

#endif
