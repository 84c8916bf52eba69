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
 *   - SIGINT / SIGTERM to the launcher (Ctrl-C) stop every rank (SIGTERM,
 *     then SIGKILL after term_grace; a second Ctrl-C kills at once);
 *   - the exit status is the first failing rank's (128 + signal number if
 *     it was killed), else 0.
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
} dt_launch_params;

DT_API dt_launch_params dt_launch_default_params(void);

/* Runs argv[0] (looked up in PATH) with argv as nranks local ranks and
 * waits for all of them. On DT_OK, *exit_code is the job's exit status as
 * described above. Returns DT_ERR_ARG for bad parameters, DT_ERR_COMM if
 * the shared-memory segment cannot be created, DT_ERR_INTERNAL if fork
 * fails (ranks already started are then stopped). */
DT_API dt_status dt_launch(const dt_launch_params *p, char *const argv[], int *exit_code);

#ifdef __cplusplus
}
#endif
#endif
