/* The communicator backends, in one table: the only place that knows
 * which exist and whether MPI was compiled in (registry.h). */
#include "comm/registry.h"
#include "comm/shm/shm.h"
#ifdef DTRAIN_HAVE_MPI
#include "comm/mpi/mpi_impl.h"
#endif

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
