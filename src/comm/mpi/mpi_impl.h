/* mpi_impl.h - the mpi and hier backends' entry points (for the registry)
 * and what mpi.c shares with hier.c (compiled only with MPI). */
#ifndef DT_MPI_IMPL_H
#define DT_MPI_IMPL_H

#include "comm/comm_impl.h"

#include <mpi.h>

typedef struct {
    MPI_Comm comm;      /* owned duplicate */
    MPI_Comm node_comm; /* the ranks sharing this host (or fake node) */
    int world;          /* created by dt_comm_init_env */
    dt_algo algo;       /* DTRAIN_COMM_ALGO */
    int own;            /* allreduce by dtrain's algorithms when algo is auto (hier's leaders) */
    MPI_Win win;        /* one slot per rank: the seq of its latest collective */
    uint64_t *at;       /* this rank's slot */
    int *names;         /* rank to name in messages for each rank (NULL: itself) */
    int aborted;        /* this rank told its peers it gave up */
    char abort_msg[400];/* the message sent (must outlive the sends) */
} mpi_state;

DT_HIDDEN extern const struct dt_comm_ops dt_mpi_ops;
DT_HIDDEN extern const struct dt_comm_ops dt_hier_ops;
/* 1 when mpirun (Open MPI, MPICH, PMIx) started this process. */
DT_HIDDEN int dt_mpi_env_present(void);
/* World communicators over MPI_COMM_WORLD: flat MPI, or shared memory
 * inside each host and MPI between host leaders. */
DT_HIDDEN dt_status dt_mpi_init_world(dt_comm_t c);
DT_HIDDEN dt_status dt_hier_init_world(dt_comm_t c);

/* MPI_Init_thread unless the program already initialised MPI. */
DT_HIDDEN dt_status dt_mpi_library_init(void);
/* Makes c an mpi-backend communicator over `comm` (which c then owns). */
DT_HIDDEN dt_status dt_mpi_attach(dt_comm_t c, MPI_Comm comm);
/* Error messages about c's ranks name them by their ranks in `parent`. */
DT_HIDDEN void dt_mpi_name_ranks(dt_comm_t c, MPI_Comm parent);

#endif
