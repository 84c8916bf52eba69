/*
 * hier.c - the hierarchical backend: shared memory inside a host, MPI
 * between hosts. Chosen automatically when mpirun / srun put several ranks
 * on one host (DTRAIN_COMM_BACKEND=hier forces it; DTRAIN_FAKE_NODES=k
 * splits one host into k pretend hosts for testing).
 *
 * allreduce = reduce to the host's first rank over shm (the pipelined
 *             reduce-scatter + gather of shm.c), allreduce among those
 *             "leaders" over MPI, broadcast back over shm. Only one
 *             message per host crosses the network instead of one per rank.
 * barrier   = shm barrier, leaders' MPI barrier, shm barrier.
 * the rest  = MPI over all ranks (broadcast, allgather, reduce_scatter,
 *             reduce, point to point, split).
 * When every rank is on one host, everything runs over shm, and
 * sub-communicators are shm communicators too.
 *
 * fp16/bf16: the host-local stage accumulates in fp32 and rounds, the MPI
 * stage again; with one host this is exactly the shm result.
 *
 * The segment is created by the host's first rank under a unique name that
 * is broadcast over MPI, attached by the others, and unlinked at once, so
 * nothing is left in /dev/shm whatever happens afterwards.
 */
#include "comm/mpi/mpi_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    dt_comm_t local;   /* shm, the ranks of this host */
    dt_comm_t leaders; /* mpi, first rank of every host; NULL elsewhere */
    dt_comm_t flat;    /* mpi, all ranks */
    int single_host;
} hier_state;

/* Builds a shm communicator over the ranks of node_comm. */
static dt_status shm_over_mpi(dt_comm_t *out, MPI_Comm node_comm, dt_comm_t parent) {
    dt_comm_t l = dt_comm_alloc();
    if (!l) return dt_error(DT_ERR_NOMEM, "hier backend: out of memory");
    MPI_Comm_rank(node_comm, &l->rank);
    MPI_Comm_size(node_comm, &l->size);
    l->local_rank = l->rank;
    l->local_size = l->size;
    l->world_rank = parent->world_rank;
    l->check = 0;
    struct {
        char name[64];
        int ok;
    } msg = {{0}, 1};
    dt_status rc = DT_OK;
    if (l->rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(msg.name, sizeof msg.name, "/dtrain-mpi-%d-%lx", (int)getpid(),
                 (unsigned long)ts.tv_nsec);
        rc = dt_shm_create_named(l, msg.name, 1);
        msg.ok = rc == DT_OK;
    }
    MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, node_comm);
    if (msg.ok) rc = dt_shm_attach_named(l, msg.name);
    else if (l->rank != 0) rc = dt_error(DT_ERR_COMM, "hier backend: the host's first rank could not create shared memory");
    int ok = rc == DT_OK, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node_comm);
    if (l->rank == 0 && msg.ok) dt_shm_unlink_named(msg.name);
    if (!all_ok) {
        dt_comm_destroy(l);
        return rc != DT_OK ? rc : dt_error(DT_ERR_COMM, "hier backend: a peer could not attach shared memory");
    }
    dt_shm_set_host_ranks(l->size);
    *out = l;
    return DT_OK;
}

dt_status dt_hier_init_world(dt_comm_t c) {
    dt_status rc = dt_mpi_library_init();
    if (rc != DT_OK) return rc;
    hier_state *h = calloc(1, sizeof *h);
    if (!h) return dt_error(DT_ERR_NOMEM, "hier backend: out of memory");
    h->flat = dt_comm_alloc();
    if (!h->flat) {
        free(h);
        return dt_error(DT_ERR_NOMEM, "hier backend: out of memory");
    }
    h->flat->check = 0;
    rc = dt_mpi_init_world(h->flat);
    if (rc != DT_OK) goto fail;
    c->rank = h->flat->rank;
    c->size = h->flat->size;
    c->world_rank = h->flat->world_rank;
    c->local_rank = h->flat->local_rank;
    c->local_size = h->flat->local_size;
    c->node = h->flat->node;
    c->nnodes = h->flat->nnodes;
    mpi_state *ms = h->flat->be;
    rc = shm_over_mpi(&h->local, ms->node_comm, c);
    if (rc != DT_OK) goto fail;
    h->single_host = c->nnodes == 1;
    if (!h->single_host) {
        MPI_Comm lead;
        MPI_Comm_split(ms->comm, c->local_rank == 0 ? 0 : MPI_UNDEFINED, c->rank, &lead);
        if (lead != MPI_COMM_NULL) {
            h->leaders = dt_comm_alloc();
            if (!h->leaders) {
                MPI_Comm_free(&lead);
                rc = dt_error(DT_ERR_NOMEM, "hier backend: out of memory");
                goto fail;
            }
            h->leaders->check = 0;
            rc = dt_mpi_attach(h->leaders, lead);
            if (rc != DT_OK) goto fail;
            dt_mpi_name_ranks(h->leaders, ms->comm);
        }
    }
    c->be = h;
    c->ops = &dt_hier_ops;
    return DT_OK;
fail:
    dt_comm_destroy(h->leaders);
    dt_comm_destroy(h->local);
    dt_comm_destroy(h->flat);
    free(h);
    return rc;
}

static hier_state *HS(dt_comm_t c) {
    hier_state *h = c->be;
    h->local->timeout = h->flat->timeout = c->timeout;
    if (h->leaders) h->leaders->timeout = c->timeout;
    return h;
}

static dt_status hier_allreduce(dt_comm_t c, const dt_coll_args *a) {
    hier_state *h = HS(c);
    if (h->single_host) return dt_shm_ops.allreduce(h->local, a);
    dt_coll_args b = *a;
    if (b.op == DT_AVG) b.op = DT_SUM;
    dt_coll_args r = b;
    r.kind = DT_COLL_REDUCE;
    r.root = 0;
    dt_status rc = dt_shm_ops.reduce(h->local, &r);
    if (rc != DT_OK) return rc;
    if (h->leaders) {
        dt_coll_args l = b;
        l.send = l.recv;
        if ((rc = dt_mpi_ops.allreduce(h->leaders, &l)) != DT_OK) return rc;
    }
    dt_coll_args bc = b;
    bc.kind = DT_COLL_BROADCAST;
    bc.root = 0;
    bc.send = bc.recv;
    if ((rc = dt_shm_ops.broadcast(h->local, &bc)) != DT_OK) return rc;
    if (a->op == DT_AVG && a->count) {
        const void *src[1] = {a->recv};
        dt_reduce_kernel(a->recv, src, 1, a->count, a->dtype, DT_AVG, c->size);
    }
    return DT_OK;
}

static dt_status hier_barrier(dt_comm_t c, const dt_coll_args *a) {
    hier_state *h = HS(c);
    dt_status rc = dt_shm_ops.barrier(h->local, a);
    if (rc != DT_OK || h->single_host) return rc;
    if (h->leaders && (rc = dt_mpi_ops.barrier(h->leaders, a)) != DT_OK) return rc;
    return dt_shm_ops.barrier(h->local, a);
}

/* The other collectives: shm on one host, else MPI over all ranks. */
#define DELEGATE(NAME)                                                       \
    static dt_status hier_##NAME(dt_comm_t c, const dt_coll_args *a) {       \
        hier_state *h = HS(c);                                               \
        if (h->single_host) return dt_shm_ops.NAME(h->local, a);             \
        return dt_mpi_ops.NAME(h->flat, a);                                  \
    }
DELEGATE(reduce_scatter)
DELEGATE(allgatherv)
DELEGATE(broadcast)
DELEGATE(reduce)

/* Point to point: shm on one host, else MPI. (Not through HS(): this runs on
 * the transfer thread too.) */
static dt_status hier_p2p_progress(dt_comm_t c, dt_p2p *p, int slow, int *moved) {
    hier_state *h = c->be;
    if (h->single_host) return dt_shm_ops.p2p_progress(h->local, p, slow, moved);
    return dt_mpi_ops.p2p_progress(h->flat, p, slow, moved);
}

static void hier_p2p_cancel(dt_comm_t c, dt_p2p *p) {
    hier_state *h = c->be;
    if (h->single_host) dt_shm_ops.p2p_cancel(h->local, p);
    else dt_mpi_ops.p2p_cancel(h->flat, p);
}

/* On one host the sub-communicators are shm too; across hosts, MPI. */
static dt_status hier_split(dt_comm_t parent, dt_comm_t child, const int *members, int nmembers,
                            int color, int color_index) {
    hier_state *h = HS(parent);
    if (h->single_host) {
        h->local->nsplits = parent->nsplits;
        h->local->seq = parent->seq;
        return dt_shm_ops.split(h->local, child, members, nmembers, color, color_index);
    }
    return dt_mpi_ops.split(h->flat, child, members, nmembers, color, color_index);
}

static void hier_abort(dt_comm_t c, const char *reason) {
    hier_state *h = c->be;
    if (h && h->local) dt_shm_ops.abort(h->local, reason);
}

static void hier_destroy(dt_comm_t c) {
    hier_state *h = c->be;
    if (!h) return;
    dt_comm_destroy(h->local);
    dt_comm_destroy(h->leaders);
    dt_comm_destroy(h->flat); /* last: may finalize MPI */
    free(h);
    c->be = NULL;
}

const struct dt_comm_ops dt_hier_ops = {
    .name = "hier",
    .allreduce = hier_allreduce,
    .reduce_scatter = hier_reduce_scatter,
    .allgatherv = hier_allgatherv,
    .broadcast = hier_broadcast,
    .reduce = hier_reduce,
    .barrier = hier_barrier,
    .p2p_progress = hier_p2p_progress,
    .p2p_cancel = hier_p2p_cancel,
    .split = hier_split,
    .abort = hier_abort,
    .destroy = hier_destroy,
};
