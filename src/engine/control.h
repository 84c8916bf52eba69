/* The control plane: what all ranks agree on once per step, outside the
 * gradient path.
 *
 * After a step's gradients are synchronised, one small allreduce (through
 * the observer, which also brings rank 0 every rank's phase times) sums
 * four things: the step's loss (each rank's micro-batch losses weighted by
 * their sizes), whether any rank was asked to stop (SIGUSR1,
 * dt_train_request_stop), any rank's vote for a timed checkpoint, and
 * whether any rank saw an inf or NaN in the gradients it updates (fp16's
 * loss scaling). So every rank stops after, saves at and skips the same
 * step. */
#ifndef DT_ENGINE_CONTROL_H
#define DT_ENGINE_CONTROL_H

#include "dtrain/comm.h"
#include "obs/obs.h"

typedef struct {
    float loss;  /* the global batch's mean loss */
    int stop;    /* some rank was asked to stop */
    int save;    /* some rank voted for a checkpoint */
    int overflow; /* some rank's gradients held an inf or a NaN */
} dt_control;

/* loss_sum: this rank's sum of micro-batch loss x size; global: samples in
 * the global batch; save_vote: this rank's vote (0 or 1); overflow: this
 * rank's gradients held an inf or a NaN (0 or 1). obs may be NULL. */
dt_status dt_control_agree(dt_obs *obs, dt_comm_t comm, double loss_sum, int global, int save_vote,
                           int overflow, dt_control *out);

/* The same for a rank that steps at its own pace (a strategy's own_pace:
 * asynchronous parameter servers): its own loss (loss_sum / denom), stop
 * request and vote, without a collective. */
void dt_control_local(double loss_sum, int denom, int save_vote, int overflow, dt_control *out);

/* A stop at the next step boundary was requested in this process. */
int dt_control_stop_requested(void);

#endif
