/*
 * dtrain/launch.h - the built-in local launcher behind `dtrain run`.
 *
 *   dtrain run -n 4 -- ./my_trainer --lr 0.1
 *
 * starts 4 copies of the program as ranks 0..3 of one shared-memory world:
 * each child gets DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK,
 * DTRAIN_LOCAL_SIZE and DTRAIN_SHM_NAME, and dt_comm_init_env() picks them
 * up. The launcher owns the shared-memory segment (created before the
 * first fork; its name is unlinked as soon as every rank has mapped it, or
 * after the last child is reaped) and supervises:
 *
 *   - a rank that dies or exits non-zero is marked dead in the segment, so
 *     its peers' collectives fail within milliseconds with an error naming
 *     it; after a grace period the launcher stops the ranks that remain
 *     (SIGTERM, then SIGKILL);
 *   - SIGUSR1 to the launcher is passed on to every rank (dtrain train:
 *     checkpoint and stop);
 *   - SIGINT / SIGTERM to the launcher (Ctrl-C) stop every rank (SIGTERM,
 *     then SIGKILL after term_grace; a second Ctrl-C kills at once);
 *   - heartbeats: each rank reports its progress (dt_heartbeat) into a
 *     small shared table; a rank silent for heartbeat_timeout seconds is
 *     taken for hung: the launcher names it and stops every rank. A rank
 *     blocked in a collective is not silent: it beats while it waits and
 *     publishes what it waits on (dt_heartbeat_wait), so the rank named is
 *     the one that stopped, and the message says which collective (and
 *     sequence number) the others wait in;
 *   - a dead rank's place taken by a new process (one path for every
 *     replacement, docs/internals.md "Replacement"): a ready spare (below),
 *     else, with respawn_from >= 0, a process started for it, up to
 *     max_respawns times. Ranks from respawn_from on are let in alone by
 *     their peers (their incarnation one higher, shm_host.h) while the
 *     others go on, once they are past the run's start (they reported a
 *     step with dt_heartbeat: a process let in alone skips the start, in
 *     whose collectives the others would wait for it; a death before that
 *     stops the group); the segment's name and its splits' names then stay
 *     until the end, for the replacement;
 *   - the exit status is the first failing rank's (128 + signal number if
 *     it was killed), else 0.
 *
 *   - spares (nspares): idle copies of the program started with the ranks,
 *     with DTRAIN_SPARE set instead of a rank. When a rank is killed by a
 *     signal (or hangs, and is killed for it) while a spare is ready, the
 *     launcher reaps it, gives its rank to the spare (dt_spare_wait
 *     returns) and starts a new generation of the segment; the survivors
 *     and the newcomer meet in dt_comm_rejoin (dtrain/comm.h) and go on.
 *     With respawn_from >= 0 a spare takes a rank's place from there on as
 *     a restart does, let in alone (DTRAIN_ALONE_FROM tells the ranks).
 *     Without a spare left, or for a rank that exits with an error status
 *     (which a new process would repeat), the group is stopped as above
 *     and ranks waiting in dt_comm_rejoin fail at once. Spares left at the
 *     end are released and exit 0.
 *
 * Restarting a failed group from its newest checkpoint, and elastic
 * resizing, are the business of `dtrain train` on top of this
 * (docs/checkpoints.md).
 */
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int nranks;        /* number of local ranks to start (>= 1) */
    double grace;      /* seconds the survivors get to report a dead peer
                          before they are stopped; default 3 */
    double term_grace; /* seconds between SIGTERM and SIGKILL; default 2 */
    int verbose;       /* log each rank's start and exit at info level */
    double heartbeat_timeout; /* seconds without a heartbeat before a rank
                                 counts as hung (0 = no check); before its
                                 first heartbeat, counted from the start */
    double stop_after; /* > 0: this many seconds after the start, send every
                          rank SIGUSR1 once (dtrain train: checkpoint and
                          stop, for elastic resizing) */
    double failed_at;  /* > 0: a restart after a failure seen at this
                          dt_now(); the first finished step is logged as
                          the recovery, with the steps lost since
                          failed_step */
    int64_t failed_step;
    int respawn_from;  /* >= 0: a rank >= this one that dies or hangs is
                          replaced alone, by a ready spare or a process
                          started for it, while the others go on (the
                          parameter servers' ranks outside mode sync,
                          dt_train_alone_from); -1 (default): a death is
                          repaired by a spare in a new generation, or
                          stops all */
    int max_respawns;  /* how many processes started for a place, in all */
    int nspares;       /* idle processes started beside the ranks (spares,
                          below); default 0 */
    double graceful;   /* > 0: the first SIGINT, SIGTERM or SIGHUP the
                          launcher gets is passed on as SIGUSR1 (every rank
                          checkpoints and stops at the end of its step,
                          DT_EXIT_STOPPED), the ranks stopped for good after
                          this many seconds; a second signal stops them at
                          once. 0 (default): passed on as SIGTERM at once */
} dt_launch_params;

/* How a launch ended. */
typedef struct {
    int exit_code;         /* the first failing rank's, else 0 */
    int failed_rank;       /* that rank, or -1 */
    int signal;            /* the signal that killed it, or 0 */
    int hung;              /* it was stopped for missing heartbeats */
    int failed_early;      /* it failed before finishing a step of its own */
    int stopped;           /* the ranks stopped on request (DT_EXIT_STOPPED) */
    int stop_asked;        /* the launcher got SIGUSR1 and passed it on */
    int64_t start_step;    /* the step the ranks started from (-1: unknown) */
    int64_t last_step;     /* the highest step a rank reported (-1: none) */
    double first_step_at;  /* dt_now() when a rank first finished a step, or 0 */
    double failed_at;      /* dt_now() when the failure was seen, or 0 */
    int respawns;          /* ranks restarted alone (respawn_from) */
    int replaced;          /* ranks whose place a spare took */
    int interrupted;       /* the signal the launcher got from outside
                              (SIGINT, SIGTERM, SIGHUP), or 0: the user's
                              stop, never a failure to repair */
} dt_launch_result;

/* The exit status of a rank that stopped on request at a checkpoint. */
#define DT_EXIT_STOPPED 75

/* Reports progress to the launcher: call with the step the loop starts
 * from, then after every step; step -1 (during long phases such as an
 * evaluation) says "alive" without a step. A no-op outside a dtrain
 * launcher. Thread-safe. */
DT_API void dt_heartbeat(int64_t step);

/* What a rank is doing, for the launcher's word on its death ("killed
 * ... in an evaluation after step 5"). A no-op outside a dtrain launcher. */
typedef enum {
    DT_PHASE_START, DT_PHASE_STEP, DT_PHASE_EVAL, DT_PHASE_CKPT, DT_PHASE_WEIGHTS, DT_PHASE_END
} dt_phase;
DT_API void dt_heartbeat_phase(dt_phase phase);

/* Reports "alive, blocked in collective `op` number `seq`, waiting for
 * rank `peer`" (-1: unknown); op == NULL: that wait is over. Shaped to be
 * called from a dt_comm_set_wait_hook() hook, as dtrain's training loops
 * do. A no-op outside a dtrain launcher. Thread-safe. */
DT_API void dt_heartbeat_wait(const char *op, uint64_t seq, int peer);

/* 1 in a process that the launcher started as a spare (DTRAIN_SPARE set)
 * and that has not been given a rank yet. */
DT_API int dt_spare_is(void);
/* The rank this process took as a spare (dt_spare_wait), or -1. */
DT_API int dt_spare_rank(void);

/* A spare's idle wait (its process name "dtrain spare", then "dtrain
 * rank R" once it has one): maps the world's shared-memory segment at once
 * (its name is removed once every rank and spare has it), then waits
 * until the launcher gives this process a rank, for as long as the run
 * lasts (the launcher's exit ends the process, PR_SET_PDEATHSIG). On a
 * rank: sets DTRAIN_RANK (and DTRAIN_LOCAL_RANK) so that
 * dt_comm_init_env() and dt_heartbeat() take it, *rank = it, DT_OK; the
 * caller then joins with dt_comm_init_env() and dt_comm_rejoin(). Released
 * at the end of the run: *rank = -1, DT_OK (exit 0). DT_ERR_CONFIG outside
 * a launcher's spare, DT_ERR_COMM/DT_ERR_IO when the segment or the
 * launcher's table cannot be mapped. */
DT_API dt_status dt_spare_wait(int *rank);
/* The same, running idle(user) once the spare is ready and before it
 * waits: a spare's preparation (its data). A rank given meanwhile is taken
 * when idle returns. */
DT_API dt_status dt_spare_wait_idle(int *rank, void (*idle)(void *user), void *user);

/* One run per run directory. Creates `dir` (and its parents) and takes an
 * exclusive flock(2) on DIR/.lock, writing this process's PID into it; the
 * lock lasts until dt_run_dir_unlock(*fd) or the end of the process (the
 * kernel drops it even after SIGKILL, so a lock file left by a dead run
 * does not block). The taker also renames an earlier run's summary.json to
 * summary.previous.json, so that a run that fails leaves no summary that
 * looks like its own.
 *
 * In a group started by a launcher (dtrain run, mpirun, srun) only world
 * rank 0 takes it; the other ranks, and a rank 0 whose parent process
 * holds the lock (the workers that `dtrain train --workers` starts), get
 * *fd = -1 and DT_OK. Returns DT_ERR_IO, naming the holder's PID, when
 * another process holds the lock, or when the directory or lock file cannot
 * be made. */
DT_API dt_status dt_run_dir_lock(const char *dir, int *fd);
/* Releases a lock of dt_run_dir_lock (fd -1: nothing to do). */
DT_API void dt_run_dir_unlock(int fd);

DT_API dt_launch_params dt_launch_default_params(void);

/* Runs argv[0] (looked up in PATH) with argv as nranks local ranks and
 * waits for all of them. On DT_OK, *r tells how it ended (r->exit_code: the
 * job's exit status as described above). Returns DT_ERR_ARG for bad
 * parameters, DT_ERR_COMM if
 * the shared-memory segment cannot be created, DT_ERR_INTERNAL if fork
 * fails (ranks already started are then stopped). */
DT_API dt_status dt_launch(const dt_launch_params *p, char *const argv[], dt_launch_result *r);

#ifdef __cplusplus
}
#endif
#endif
