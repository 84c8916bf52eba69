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

#endif
