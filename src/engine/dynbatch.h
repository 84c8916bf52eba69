/* Dynamic batching ([train] dynamic_batch = true): each rank's share of the
 * global batch follows its measured speed, so that all ranks finish their
 * forward and backward together.
 *
 * The global batch is cut into N equal units (its samples; in deterministic
 * mode the [parallel] micro_shards fixed shards, which dp-deterministic
 * runs whole), and rank r takes units[r] consecutive ones
 * (dt_loader_set_shares). After each step every rank has every rank's
 * forward + backward seconds and share (the observer's allgather), smooths
 * each rank's seconds per sample, and deals the units in proportion to the
 * speeds, each rank at least one unit and at most dt_dynbatch_max_share
 * samples. Every rank computes the same split from the same numbers, so no
 * extra message is sent. The gradient is the sum over the global batch's
 * samples, each loss scaled by 1 / global (strategy.h): the split changes
 * who computes what, not the result, and dp-deterministic's fixed-point sums
 * make it bitwise the fixed split's. */
#ifndef DT_ENGINE_DYNBATCH_H
#define DT_ENGINE_DYNBATCH_H

#include "dtrain/comm.h"
#include "dtrain/core.h"

typedef struct dt_dynbatch dt_dynbatch;

/* The most samples of a global batch of `global` that a rank may be given:
 * twice the even share (the loader's slots and the model's rows are sized
 * for it), at most the batch. */
int dt_dynbatch_max_share(int global, int W);

/* For W ranks, the global batch `global` cut into nunits units. */
dt_status dt_dynbatch_create(dt_dynbatch **out, int W, int global, int nunits);
void dt_dynbatch_free(dt_dynbatch *d);
/* After a step: seconds[r] and share[r], every rank's forward + backward
 * time and samples. Returns 1 and fills units[W] when the split changes. */
int dt_dynbatch_update(dt_dynbatch *d, const double *seconds, const int *share, int *units);

/* After a spare took a dead rank's place (--spares): every rank takes
 * rank `from`'s estimates and split, one broadcast over comm, and units[W]
 * gets the split in force, for the task's set_shares (the spare's own is
 * the even one it started with). */
dt_status dt_dynbatch_share(dt_dynbatch *d, dt_comm_t comm, int from, int *units);
#endif
