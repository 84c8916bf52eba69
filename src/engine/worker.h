/* What the run loop needs outside the step (engine/loop.c):
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
 * mode, where results must not depend on it), and reports the waits of
 * its collectives as launcher heartbeats (dt_heartbeat_wait). An injected
 * start failure (DTRAIN_FAULT_START, below) leaves the group as
 * dt_worker_exit does. */
dt_status dt_worker_init(const dt_config *c, dt_comm_t *comm, int *threads);
/* With a memory limit set (dt_mem_set_limit: --memory-limit), the worker
 * is first capped at it (dt_mem_cap); dt_worker_mem_cap() then says how
 * ("" when not capped). */
const char *dt_worker_mem_cap(void);
/* The spares the launcher started beside the workers for a dead rank's
 * place in a new generation (DTRAIN_SPARES), 0 without, and where ranks
 * are let in alone (DTRAIN_ALONE_FROM: a spare there takes a place as a
 * restart does): a rank whose collective fails on a peer's death then
 * waits for a spare and goes on (engine/loop.c). */
int dt_worker_spares(void);
/* How this process came to its rank, which says what it receives and
 * where it joins (docs/internals.md, "Replacement"): one of the run's
 * first processes; or one that takes a dead rank's place, given it by the
 * launcher (a spare, or a process started for the place), and either met
 * by every rank in a new generation (DT_PLACE_REPLICA: dt_comm_rejoin,
 * then the state of the replica that got furthest) or let in alone by its
 * peers while the others go on (DT_PLACE_ALONE, its incarnation above 0:
 * the strategy's restore gives its state and its place in the loop; the
 * parameter servers' ranks). */
typedef enum { DT_PLACE_START, DT_PLACE_REPLICA, DT_PLACE_ALONE } dt_place;
dt_place dt_worker_place(dt_comm_t comm);
/* A failure a spare can repair: there are spares and st says a peer died
 * or hung in a collective (DT_ERR_COMM, DT_ERR_TIMEOUT). */
int dt_worker_recoverable(dt_status st);
/* The run directory (rank 0's; NULL: none): created, with config.ini. */
dt_status dt_worker_run_dir(const dt_config *c, const char *run_dir);

/* Leaves the group at the end of a run whose status is st: on failure first
 * aborts comm with the error message, so that the others' next collective
 * fails with an error naming this rank instead of waiting for it; then
 * destroys comm, keeping the message. Returns st. */
dt_status dt_worker_exit(dt_comm_t comm, dt_status st);

/* The schedule of a run of `total` steps: [schedule] with the peak rate
 * [optim] lr, times batch / base_batch under lr_scaling = linear (Goyal et
 * al.: the peak grows with the batch; the warmup ramps up to it). */
dt_schedule dt_worker_schedule(const dt_config *c, int64_t total);

/* Injected faults, testing aids that show how failures are handled:
 *   DTRAIN_FAULT_STEP=R:S[:KIND]  rank R fails at step S: KIND error (the
 *       default: the step returns an error), kill (SIGKILL to itself),
 *       hang (stops, without heartbeats) or stop (SIGSTOP to itself); R =
 *       -1 - j is parameter server j (engine/strategies/ps/), after its step
 *       S; several faults separated by commas (R:S:kill,R2:S2:kill) fire each
 *       at its own step;
 *   DTRAIN_FAULT_STEP=R:S:KIND:PLACE  the same inside the meeting after
 *       step S (parameter servers outside mode sync: dt_fault_at): PLACE
 *       fetch (a worker that fetched the weights, before the barrier after
 *       it), eval (before the evaluation), save (in the servers'
 *       checkpoint: worker 0 once it asked the servers to save) or end
 *       (after the final weights were fetched, before they are written);
 *       for a server (R = -1 - j, any mode) fetch (as it answers a FETCH
 *       of step S, before it sends its range: the meetings' and, in mode
 *       sync, the checkpoints' fetch) and save (outside mode sync, once it
 *       has the SAVE of step S, before its shard is written);
 *   DTRAIN_FAULT_ONCE=FILE  the step fault fires only if FILE does not
 *       exist, and creates it (so that a restarted run gets past it); the
 *       k-th fault of a list (from 0) uses FILE.k for k > 0;
 *   DTRAIN_FAULT_START=R:FILE  rank R fails as it starts while FILE exists
 *       (a worker that cannot come back);
 *   DTRAIN_SLOW_RANK=R:MS  rank R sleeps MS milliseconds in every step's
 *       forward (a straggler);
 *   DTRAIN_SLOW_RANK=R:xF  rank R is F times slower: after each
 *       micro-batch's forward and backward it sleeps F - 1 times as long
 *       (dt_fault_slow);
 *   DTRAIN_SLOW_RANK=*:20,1:20  both forms take a list, R * for every
 *       worker (not the servers); a rank's entries add up (here rank 1
 *       sleeps 40 ms a step, the others 20: compute modelled as time
 *       spent off this machine's cores);
 *   DTRAIN_FAULT_OVERFLOW=R:S  rank R finds an inf among its gradients at
 *       step S (fp16's loss scaling, which every rank must then skip);
 *   DTRAIN_SLOW_LAYER=R:L:MS  rank R sleeps MS milliseconds in each timed
 *       forward of layer L while the layers are timed (dt_task_time_layers: a
 *       pipeline's measured balance, [train] time_layers; one rank
 *       seeing a layer slower than the others do: dt_fault_slow_layer). */
dt_status dt_fault_step(int rank, int64_t step);
dt_status dt_fault_at(int rank, int64_t step, const char *place);
void dt_fault_slow(int rank, double seconds);
void dt_fault_slow_layer(int rank, int layer);
int dt_fault_overflow(int rank, int64_t step);
dt_status dt_fault_start(int rank);

#endif
