/* shm.h - the shm backend's entry points inside the comm layer: its world
 * communicator (for the registry) and the named segments the hier backend
 * builds each host's communicator on. */
#ifndef DT_SHM_H
#define DT_SHM_H

#include "comm/comm_impl.h"
#include "comm/shm/shm_host.h"

DT_HIDDEN extern const struct dt_comm_ops dt_shm_ops;

/* 1 when this process was started by dtrain's launcher: a segment name in
 * p->shm_name or DTRAIN_SHM_NAME. */
DT_HIDDEN int dt_shm_launched(const dt_comm_params *p);
/* The world communicator: rank and size from p or DTRAIN_RANK /
 * DTRAIN_WORLD_SIZE, attached to the launcher's segment; without a segment
 * a private one for a world of 1. */
DT_HIDDEN dt_status dt_shm_init_params(dt_comm_t c, const dt_comm_params *p);
/* Attaches c (rank and size set) to the segment called `name`, or to a
 * private one for a world of 1 (name == NULL). */
DT_HIDDEN dt_status dt_shm_init_world(dt_comm_t c, const char *name);

/* Shared-memory communicator over an arbitrary group, rendezvous done by
 * the caller: the creator (rank 0) makes the segment called `name`,
 * everyone attaches after `sync` (a barrier on some other communicator). */
DT_HIDDEN dt_status dt_shm_create_named(dt_comm_t c, const char *name, int creator);
DT_HIDDEN dt_status dt_shm_attach_named(dt_comm_t c, const char *name);
DT_HIDDEN void dt_shm_unlink_named(const char *name);
/* How many ranks share this host (decides whether waits may spin). */
DT_HIDDEN void dt_shm_set_host_ranks(int n);

#endif
