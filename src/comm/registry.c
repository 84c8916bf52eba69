/* The communicator backends, in one table: the only place that knows
 * which exist and whether MPI was compiled in (registry.h). */
#include "comm/registry.h"
#include "comm/nccl/nccl.h"
#include "comm/shm/shm.h"
#include "comm/staging/staging.h"
#ifdef DTRAIN_HAVE_MPI
#include "comm/mpi/mpi_impl.h"
#endif

#include <stdio.h>

#ifdef DTRAIN_HAVE_MPI
static int mpi_launched(const dt_comm_params *p) {
    (void)p;
    return dt_mpi_env_present();
}
static dt_status mpi_init(dt_comm_t c, const dt_comm_params *p) {
    (void)p;
    return dt_mpi_init_world(c);
}
static dt_status hier_init(dt_comm_t c, const dt_comm_params *p) {
    (void)p;
    return dt_hier_init_world(c);
}
#define MPI_BACKEND(name, launched, init) {name, NULL, launched, init}
#else
#define MPI_BACKEND(name, launched, init) {name, "this libdtrain was built without MPI", NULL, NULL}
#endif

// Under mpirun "auto" picks hier (shared memory inside each host), never
// the flat mpi backend: only hier has a `launched` test.
static const dt_comm_backend_entry backends[] = {
    {"shm", NULL, dt_shm_launched, dt_shm_init_params},
    MPI_BACKEND("mpi", NULL, mpi_init),
    MPI_BACKEND("hier", mpi_launched, hier_init),
};

const dt_comm_backend_entry *dt_comm_backends(int *n) {
    *n = (int)(sizeof backends / sizeof backends[0]);
    return backends;
}

static int staging_usable(const dt_comm_device_params *p, char *why, size_t n) {
    (void)p;
    snprintf(why, n, "pinned host buffers and the host's communicator");
    return 1;
}

static const dt_comm_device_entry device_backends[] = {
    {"nccl", dt_nccl_usable, dt_nccl_init},
    {"staging", staging_usable, dt_staging_init},
};

const dt_comm_device_entry *dt_comm_device_backends(int *n) {
    *n = (int)(sizeof device_backends / sizeof device_backends[0]);
    return device_backends;
}
