/* registry.h - the communicator backends, in one table (registry.c).
 *
 * comm.c's dt_comm_init picks an entry by name (DTRAIN_COMM_BACKEND or the
 * params' backend), or for "auto" the first entry whose launcher started
 * this process, else the first entry (shm: a private world of 1). Adding a
 * backend is one row in registry.c and its init function; the front end
 * does not change. */
#ifndef DT_COMM_REGISTRY_H
#define DT_COMM_REGISTRY_H

#include "comm/comm_impl.h"
#include "comm/device.h"

typedef struct {
    const char *name;     /* "shm", "mpi", "hier": DTRAIN_COMM_BACKEND's values */
    const char *missing;  /* NULL when compiled in; else why not, for the error */
    /* 1 when this backend's launcher started the process ("auto" picks the
     * first such entry); NULL: "auto" never picks it. */
    int (*launched)(const dt_comm_params *p);
    /* Makes c (allocated, timeout and check mode set) a world communicator:
     * rank, size, node fields and ops. */
    dt_status (*init_world)(dt_comm_t c, const dt_comm_params *p);
} dt_comm_backend_entry;

/* The table, in the order of the error message's list; *n its length. */
DT_HIDDEN const dt_comm_backend_entry *dt_comm_backends(int *n);

/* The device communicators' backends (comm/device.h), in the order "auto"
 * prefers them: dt_comm_init_device takes the first that every rank can
 * use. */
typedef struct {
    const char *name;     /* "nccl", "staging": DTRAIN_GPU_COMM's values */
    /* 1 when this rank can use it, else 0 with the reason in why[n]; why
     * also says what it is when usable (for the log). */
    int (*usable)(const dt_comm_device_params *p, char *why, size_t n);
    /* Makes c (front-end fields set from host) a communicator of this
     * backend over host's ranks: a collective over host. */
    dt_status (*init)(dt_comm_t c, dt_comm_t host, const dt_comm_device_params *p);
} dt_comm_device_entry;

DT_HIDDEN const dt_comm_device_entry *dt_comm_device_backends(int *n);

#endif
