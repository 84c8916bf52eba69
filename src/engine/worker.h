/* What every training loop shares outside the gradient step (engine/dp.h):
 * joining the group of workers, the learning-rate schedule, fault
 * injection. */
#ifndef DT_ENGINE_WORKER_H
#define DT_ENGINE_WORKER_H

#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "dtrain/optim.h"

/* Creates *comm from the environment (a world of 1 when not launched) and
 * sets this worker's compute threads, returned in *threads: c->threads,
 * else the host's cores shared among the workers on it (1 in deterministic
 * mode, where results must not depend on it). */
dt_status dt_worker_init(const dt_config *c, dt_comm_t *comm, int *threads);

/* Leaves the group at the end of a run whose status is st: on failure first
 * aborts comm with the error message, so that the others' next collective
 * fails with an error naming this rank instead of waiting for it; then
 * destroys comm, keeping the message. Returns st. */
dt_status dt_worker_exit(dt_comm_t comm, dt_status st);

/* The schedule of a run of `total` steps: [schedule] with the peak rate
 * [optim] lr, times batch / base_batch under lr_scaling = linear (Goyal et
 * al.: the peak grows with the batch; the warmup ramps up to it). */
dt_schedule dt_worker_schedule(const dt_config *c, int64_t total);

/* DTRAIN_FAULT_STEP=R:S makes rank R fail at step S (a testing aid: it
 * shows how a failing worker stops the others). DT_OK but then. */
dt_status dt_worker_fault(int rank, int64_t step);

#endif
