/* What every training loop does first: join the group of workers. */
#ifndef DT_ENGINE_WORKER_H
#define DT_ENGINE_WORKER_H

#include "dtrain/comm.h"
#include "dtrain/config.h"

/* Creates *comm from the environment (a world of 1 when not launched) and
 * sets this worker's compute threads, returned in *threads: c->threads,
 * else the host's cores shared among the workers on it (1 in deterministic
 * mode, where results must not depend on it). */
dt_status dt_worker_init(const dt_config *c, dt_comm_t *comm, int *threads);

/* Injected faults, testing aids that show how failures are handled:
 *   DTRAIN_FAULT_STEP=R:S[:KIND]  rank R fails at step S: KIND error (the
 *       default: the step returns an error), kill (SIGKILL to itself) or
 *       hang (stops, without heartbeats);
 *   DTRAIN_FAULT_ONCE=FILE  the step fault fires only if FILE does not
 *       exist, and creates it (so that a restarted run gets past it);
 *   DTRAIN_FAULT_START=R:FILE  rank R fails as it starts while FILE exists
 *       (a worker that cannot come back). */
dt_status dt_fault_step(int rank, int64_t step);
dt_status dt_fault_start(int rank);

#endif
