/*
 * mpi_bytes.c - what a process hands to MPI, counted through MPI's
 * profiling interface (each MPI_X here counts, then calls PMPI_X). Loaded
 * into the ranks with mpirun -x LD_PRELOAD=libmpi_bytes.so, it sees the
 * calls dtrain's mpi backend makes, whatever the backend thinks it does.
 * comm_worker's "wire" mode reads (and zeroes) the counters through dlsym
 * (dt_test_mpi_bytes) around each collective it checks.
 *
 * Counted per process:
 *   moved   bytes this rank gives MPI to deliver to the other ranks, from
 *           the calls that only move data: alltoallv (its blocks for the
 *           others), allgatherv (its block, once per other rank), gather
 *           (its block, from a rank other than the root), send,
 *           broadcast (the root's buffer, once per other rank);
 *   reduced elements x type size given to MPI's own reductions (allreduce,
 *           reduce, reduce-scatter): there MPI moves what it wants;
 *   widest  the largest element type size of any call.
 */
#include <mpi.h>
#include <stdatomic.h>
#include <stdint.h>

static _Atomic uint64_t g_moved, g_reduced;
static _Atomic int g_widest;

static int type_size(MPI_Datatype t) {
    int s = 0;
    PMPI_Type_size(t, &s);
    int w = atomic_load(&g_widest);
    while (s > w && !atomic_compare_exchange_weak(&g_widest, &w, s)) {
    }
    return s;
}

static int others(MPI_Comm c) {
    int n = 1;
    PMPI_Comm_size(c, &n);
    return n - 1;
}

/* The counters since the last call (moved bytes, reduced bytes, widest
 * element size), which zeroes them. */
__attribute__((visibility("default"))) void dt_test_mpi_bytes(uint64_t *moved, uint64_t *reduced, int *widest) {
    *moved = atomic_exchange(&g_moved, 0);
    *reduced = atomic_exchange(&g_reduced, 0);
    *widest = atomic_exchange(&g_widest, 0);
}

int MPI_Ialltoallv(const void *sb, const int sc[], const int sd[], MPI_Datatype st, void *rb, const int rc[],
                   const int rd[], MPI_Datatype rt, MPI_Comm c, MPI_Request *rq) {
    int me = 0, n = 1, es = type_size(st);
    PMPI_Comm_rank(c, &me);
    PMPI_Comm_size(c, &n);
    uint64_t b = 0;
    for (int p = 0; p < n; p++)
        if (p != me) b += (uint64_t)sc[p] * (uint64_t)es;
    atomic_fetch_add(&g_moved, b);
    return PMPI_Ialltoallv(sb, sc, sd, st, rb, rc, rd, rt, c, rq);
}

int MPI_Iallgatherv(const void *sb, int sc, MPI_Datatype st, void *rb, const int rc[], const int rd[],
                    MPI_Datatype rt, MPI_Comm c, MPI_Request *rq) {
    int me = 0;
    PMPI_Comm_rank(c, &me);
    // In place, this rank's block is rc[me] elements of rt.
    uint64_t mine = sb == MPI_IN_PLACE ? (uint64_t)rc[me] * (uint64_t)type_size(rt)
                                       : (uint64_t)sc * (uint64_t)type_size(st);
    atomic_fetch_add(&g_moved, mine * (uint64_t)others(c));
    return PMPI_Iallgatherv(sb, sc, st, rb, rc, rd, rt, c, rq);
}

int MPI_Igather(const void *sb, int sc, MPI_Datatype st, void *rb, int rc, MPI_Datatype rt, int root, MPI_Comm c,
                MPI_Request *rq) {
    int me = 0;
    PMPI_Comm_rank(c, &me);
    if (me != root) atomic_fetch_add(&g_moved, (uint64_t)sc * (uint64_t)type_size(st));
    return PMPI_Igather(sb, sc, st, rb, rc, rt, root, c, rq);
}

int MPI_Isend(const void *b, int n, MPI_Datatype t, int to, int tag, MPI_Comm c, MPI_Request *rq) {
    atomic_fetch_add(&g_moved, (uint64_t)n * (uint64_t)type_size(t));
    return PMPI_Isend(b, n, t, to, tag, c, rq);
}

int MPI_Ibcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request *rq) {
    int me = 0;
    PMPI_Comm_rank(c, &me);
    uint64_t bytes = (uint64_t)n * (uint64_t)type_size(t);
    if (me == root) atomic_fetch_add(&g_moved, bytes * (uint64_t)others(c));
    return PMPI_Ibcast(b, n, t, root, c, rq);
}

int MPI_Iallreduce(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *rq) {
    atomic_fetch_add(&g_reduced, (uint64_t)n * (uint64_t)type_size(t));
    return PMPI_Iallreduce(sb, rb, n, t, op, c, rq);
}

int MPI_Ireduce(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c,
                MPI_Request *rq) {
    atomic_fetch_add(&g_reduced, (uint64_t)n * (uint64_t)type_size(t));
    return PMPI_Ireduce(sb, rb, n, t, op, root, c, rq);
}

int MPI_Ireduce_scatter_block(const void *sb, void *rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                              MPI_Request *rq) {
    atomic_fetch_add(&g_reduced, (uint64_t)n * (uint64_t)(others(c) + 1) * (uint64_t)type_size(t));
    return PMPI_Ireduce_scatter_block(sb, rb, n, t, op, c, rq);
}

int MPI_Ireduce_scatter(const void *sb, void *rb, const int rc[], MPI_Datatype t, MPI_Op op, MPI_Comm c,
                        MPI_Request *rq) {
    uint64_t all = 0;
    for (int p = 0; p <= others(c); p++) all += (uint64_t)rc[p];
    atomic_fetch_add(&g_reduced, all * (uint64_t)type_size(t));
    return PMPI_Ireduce_scatter(sb, rb, rc, t, op, c, rq);
}
