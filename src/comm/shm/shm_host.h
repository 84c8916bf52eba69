/* shm_host.h - the host side of the shm backend: what a launcher needs to
 * start ranks that talk through one POSIX shared-memory segment
 * (run/launch.c uses it). It exposes no communicator internals: the
 * launcher sizes and initialises the segment, hands its name and each
 * rank's place to the ranks in the environment variables below, and marks
 * ranks that are gone so their peers stop waiting for them. */
#ifndef DT_SHM_HOST_H
#define DT_SHM_HOST_H

#include "dtrain/core.h"

#include <stddef.h>

#ifndef DT_HIDDEN
#define DT_HIDDEN __attribute__((visibility("hidden")))
#endif

/* The environment a launched rank reads in dt_comm_init. */
#define DT_ENV_SHM_NAME "DTRAIN_SHM_NAME"     /* the segment's shm_open name */
#define DT_ENV_RANK "DTRAIN_RANK"             /* 0 <= rank < size */
#define DT_ENV_WORLD_SIZE "DTRAIN_WORLD_SIZE" /* ranks in the segment */
#define DT_ENV_LOCAL_RANK "DTRAIN_LOCAL_RANK" /* the same on one host */
#define DT_ENV_LOCAL_SIZE "DTRAIN_LOCAL_SIZE"

/* Bytes of the segment for n ranks. */
DT_HIDDEN size_t dt_shm_segment_size(int n);
/* Initialises a fresh (zeroed) segment for n ranks. */
DT_HIDDEN void dt_shm_segment_init(void *base, int n);
/* Marks a rank's process as gone (state 1 = exited, 2 = died; detail the
 * exit code or signal) so its peers stop waiting for it. */
DT_HIDDEN void dt_shm_mark_rank(void *base, int rank, int state, int detail)
   ;
/* 1 once every rank has attached to the segment (the name can then go). */
DT_HIDDEN int dt_shm_all_attached(void *base);
/* Ranks of this segment may be replaced: the segments of its splits keep
 * their names (the launcher removes them at the end) so that a replacement
 * can attach to them. */
DT_HIDDEN void dt_shm_set_respawn(void *base);
/* A new process takes `rank`'s place (the launcher's one way to replace a
 * dead rank: a spare, or a process it starts for the place). alone = 1:
 * only its peers notice: its incarnation grows by one and it is marked
 * restarting, so point-to-point transfers with it fail and collectives
 * wait for the replacement (dt_comm_rejoin_peers); returns the
 * incarnation. alone = 0 (after the dead process is reaped): every rank
 * meets it in a new generation: it is marked running, the generation
 * grows, and the process that takes the place joins as that rank and
 * calls dt_comm_rejoin, as do the survivors; returns the generation. */
DT_HIDDEN int dt_shm_take_place(void *base, int rank, int alone);
/* Tells ranks waiting in dt_comm_rejoin that no process will come: they
 * fail at once instead of at their timeout. */
DT_HIDDEN void dt_shm_refuse_rejoin(void *base);
/* In a process that will join the world later (a spare): maps the
 * segment called `name` now, while its name exists, and keeps it for the
 * dt_comm_init that follows. Returns DT_ERR_COMM naming the segment if it
 * cannot. */
DT_HIDDEN dt_status dt_shm_map_world(const char *name);

#endif
