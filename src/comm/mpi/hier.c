/*
 * hier.c - the hierarchical backend: shared memory inside a host, MPI
 * between hosts. Chosen automatically when mpirun / srun put several ranks
 * on one host (DTRAIN_COMM_BACKEND=hier forces it; DTRAIN_FAKE_NODES=k
 * splits one host into k pretend hosts for testing).
 *
 * Every collective crosses the network once per host instead of once per
 * rank: the ranks of a host meet over shm, their first rank ("leader")
 * talks to the other leaders over MPI.
 *
 * allreduce = shm reduce to the leader, leaders' allreduce (dtrain's ring
 *             over MPI point to point; halving-doubling below 64 KiB), shm
 *             broadcast back.
 * reduce    = shm reduce to the leader, leaders' MPI reduce to the root's
 *             leader, and (if the root is not its host's leader) an shm
 *             send to the root.
 * broadcast = on the root's host an shm broadcast from the root; leaders'
 *             MPI broadcast from the root's leader; on the other hosts an
 *             shm broadcast from the leader.
 * allgather = shm allgather into a buffer ordered by host, leaders' MPI
 *             allgather of the hosts' parts, shm broadcast of the whole,
 *             and every rank copies the blocks to their displacements.
 * reduce_scatter = shm reduce of the whole vector to the leader, leaders'
 *             MPI reduce-scatter of the blocks by host, shm broadcast of
 *             the host's blocks, each rank keeps its own.
 * barrier   = shm barrier, leaders' MPI barrier, shm barrier.
 * point to point and split: MPI over all ranks.
 * When every rank is on one host, everything runs over shm, and
 * sub-communicators are shm communicators too.
 *
 * fp16/bf16: the host-local stage accumulates in fp32 and rounds, the MPI
 * stage again; with one host this is exactly the shm result. DT_AVG is a
 * sum through the stages and one division at the end.
 *
 * The segment is created by the host's first rank under a unique name that
 * is broadcast over MPI, attached by the others, and unlinked at once, so
 * nothing is left in /dev/shm whatever happens afterwards.
 */
#include "comm/mpi/mpi_impl.h"
#include "comm/shm/shm.h"

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
    /* where every rank is: host and rank on it, and all ranks ordered by
     * (host, rank on the host), host k's from by_host[host_start[k]] */
    int *host_of, *lrank_of, *by_host, *host_start;
    int in_order; /* by_host is 0, 1, ..., n-1 */
} hier_state;

static void hier_state_free(hier_state *h) {
    dt_comm_destroy(h->local);
    dt_comm_destroy(h->leaders);
    dt_comm_destroy(h->flat); /* last: may finalize MPI */
    free(h->host_of);
    free(h);
}

/* Fills the rank tables from an allgather of (host, rank on host). */
static dt_status map_hosts(hier_state *h, dt_comm_t c, MPI_Comm flat) {
    int n = c->size, nn = c->nnodes;
    h->host_of = malloc((size_t)(4 * n + nn + 1) * sizeof(int));
    if (!h->host_of) return dt_error(DT_ERR_NOMEM, "hier backend: out of memory");
    h->lrank_of = h->host_of + n;
    h->by_host = h->host_of + 2 * n;
    h->host_start = h->host_of + 3 * n;
    int mine[2] = {c->node, c->local_rank}, *all = malloc((size_t)n * 2 * sizeof(int));
    if (!all) return dt_error(DT_ERR_NOMEM, "hier backend: out of memory");
    MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, flat);
    for (int k = 0; k <= nn; k++) h->host_start[k] = 0;
    for (int p = 0; p < n; p++) {
        h->host_of[p] = all[2 * p];
        h->lrank_of[p] = all[2 * p + 1];
        h->host_start[all[2 * p] + 1]++;
    }
    for (int k = 0; k < nn; k++) h->host_start[k + 1] += h->host_start[k];
    h->in_order = 1;
    for (int p = 0; p < n; p++) {
        int i = h->host_start[h->host_of[p]] + h->lrank_of[p];
        h->by_host[i] = p;
        if (i != p) h->in_order = 0;
    }
    free(all);
    return DT_OK;
}

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
        if ((rc = map_hosts(h, c, ms->comm)) != DT_OK) goto fail;
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
            ((mpi_state *)h->leaders->be)->own = 1;
            dt_mpi_name_ranks(h->leaders, ms->comm);
        }
    }
    c->be = h;
    c->ops = &dt_hier_ops;
    return DT_OK;
fail:
    hier_state_free(h);
    return rc;
}

static hier_state *HS(dt_comm_t c) {
    hier_state *h = c->be;
    h->local->timeout = h->flat->timeout = c->timeout;
    if (h->leaders) h->leaders->timeout = c->timeout;
    return h;
}

static dt_status hier_barrier(dt_comm_t c, const dt_coll_args *a) {
    hier_state *h = HS(c);
    dt_status rc = dt_shm_ops.barrier(h->local, a);
    if (rc != DT_OK || h->single_host) return rc;
    if (h->leaders && (rc = dt_mpi_ops.barrier(h->leaders, a)) != DT_OK) return rc;
    return dt_shm_ops.barrier(h->local, a);
}

/* A copy of a for one stage: another kind, root, buffers; DT_AVG as a sum. */
static dt_coll_args stage(const dt_coll_args *a, dt_coll kind, const void *send, void *recv,
                          size_t count, int root) {
    dt_coll_args b = *a;
    b.kind = kind;
    b.send = send;
    b.recv = recv;
    b.count = count;
    b.root = root;
    if (b.op == DT_AVG) b.op = DT_SUM;
    b.counts = b.displs = NULL;
    return b;
}

static dt_status hier_allreduce(dt_comm_t c, const dt_coll_args *a) {
    hier_state *h = HS(c);
    if (h->single_host) return dt_shm_ops.allreduce(h->local, a);
    /* a host of one rank has nothing to reduce or broadcast: its stages
     * through the segment would only copy (between two pretend hosts of one
     * rank on 1 Gbit/s links that made hier 0.78-0.92x dtrain's flat ring at
     * 4-64 MiB; 0.98-1.03x without) */
    int alone = h->local->size == 1;
    dt_coll_args in_host = stage(a, DT_COLL_REDUCE, a->send, a->recv, a->count, 0);
    dt_status rc = DT_OK;
    if (!alone) rc = dt_shm_ops.reduce(h->local, &in_host);
    else if (a->send != a->recv && a->count) memcpy(a->recv, a->send, a->count * dt_dtype_size(a->dtype));
    if (rc != DT_OK) return rc;
    if (h->leaders) {
        dt_coll_args lead = stage(a, DT_COLL_ALLREDUCE, a->recv, a->recv, a->count, 0);
        if ((rc = dt_mpi_ops.allreduce(h->leaders, &lead)) != DT_OK) return rc;
    }
    dt_coll_args bc = stage(a, DT_COLL_BROADCAST, a->recv, a->recv, a->count, 0);
    if (!alone && (rc = dt_shm_ops.broadcast(h->local, &bc)) != DT_OK) return rc;
    if (a->op == DT_AVG) dt_avg_finish(a->recv, a->count, a->dtype, c->size);
    return DT_OK;
}

static dt_status hier_broadcast(dt_comm_t c, const dt_coll_args *a) {
    hier_state *h = HS(c);
    if (h->single_host) return dt_shm_ops.broadcast(h->local, a);
    int host = h->host_of[a->root];
    dt_coll_args in_host = stage(a, DT_COLL_BROADCAST, a->recv, a->recv, a->count, 0);
    dt_coll_args lead = in_host;
    lead.root = host;
    dt_status rc;
    if (c->node == host) {
        in_host.send = a->send;
        in_host.root = h->lrank_of[a->root];
        if ((rc = dt_shm_ops.broadcast(h->local, &in_host)) != DT_OK) return rc;
        return h->leaders ? dt_mpi_ops.broadcast(h->leaders, &lead) : DT_OK;
    }
    if (h->leaders && (rc = dt_mpi_ops.broadcast(h->leaders, &lead)) != DT_OK) return rc;
    return dt_shm_ops.broadcast(h->local, &in_host);
}

static dt_status hier_reduce(dt_comm_t c, const dt_coll_args *a) {
    hier_state *h = HS(c);
    if (h->single_host) return dt_shm_ops.reduce(h->local, a);
    int host = h->host_of[a->root], me_root = c->rank == a->root;
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    /* the host's partial sum: on its leader, in recv if that is the root */
    char *part = NULL, *scratch = NULL;
    if (h->leaders) {
        part = me_root ? a->recv : (scratch = malloc(bytes + 1));
        if (!part) return dt_error(DT_ERR_NOMEM, "reduce: out of memory");
    }
    dt_coll_args in_host = stage(a, DT_COLL_REDUCE, a->send, part, a->count, 0);
    dt_status rc = dt_shm_ops.reduce(h->local, &in_host);
    if (rc == DT_OK && h->leaders) {
        dt_coll_args lead = stage(a, DT_COLL_REDUCE, part, part, a->count, host);
        rc = dt_mpi_ops.reduce(h->leaders, &lead);
    }
    /* the root's leader hands the result to the root (shm carries no user
     * transfers across hosts: those go over MPI) */
    if (rc == DT_OK && c->node == host && h->lrank_of[a->root] != 0) {
        if (h->leaders) rc = dt_send(part, a->count, a->dtype, h->lrank_of[a->root], h->local);
        else if (me_root) rc = dt_recv(a->recv, a->count, a->dtype, 0, h->local);
    }
    if (rc == DT_OK && me_root && a->op == DT_AVG) dt_avg_finish(a->recv, a->count, a->dtype, c->size);
    free(scratch);
    return rc;
}

/* Allgather: each rank's block goes to `packed` at its place in host order,
 * so that a host's blocks are contiguous for the leaders. */
static dt_status hier_allgatherv(dt_comm_t c, const dt_coll_args *a) {
    hier_state *h = HS(c);
    if (h->single_host) return dt_shm_ops.allgatherv(h->local, a);
    int n = c->size, nn = c->nnodes, ln = c->local_size;
    size_t es = dt_dtype_size(a->dtype), total = 0;
    size_t *v = malloc((size_t)(n + 2 * ln + 2 * nn) * sizeof(size_t));
    if (!v) return dt_error(DT_ERR_NOMEM, "allgather: out of memory");
    size_t *pos = v, *lcount = v + n, *ldispl = v + n + ln, *hcount = v + n + 2 * ln,
           *hdispl = hcount + nn;
    for (int k = 0; k < nn; k++) {
        hdispl[k] = total;
        for (int i = h->host_start[k]; i < h->host_start[k + 1]; i++) {
            pos[h->by_host[i]] = total;
            total += a->counts[h->by_host[i]];
        }
        hcount[k] = total - hdispl[k];
    }
    dt_status rc = DT_OK;
    char *packed = total ? malloc(total * es) : NULL;
    if (total && !packed) rc = dt_error(DT_ERR_NOMEM, "allgather: out of memory");
    if (total && rc == DT_OK) {
        for (int i = 0; i < ln; i++) {
            int p = h->by_host[h->host_start[c->node] + i];
            lcount[i] = a->counts[p];
            ldispl[i] = pos[p];
        }
        dt_coll_args in_host = stage(a, DT_COLL_ALLGATHERV, a->send, packed, a->count, 0);
        in_host.counts = lcount;
        in_host.displs = ldispl;
        rc = dt_shm_ops.allgatherv(h->local, &in_host);
        if (rc == DT_OK && h->leaders) {
            dt_coll_args lead = stage(a, DT_COLL_ALLGATHERV, packed + hdispl[c->node] * es, packed,
                                      hcount[c->node], 0);
            lead.counts = hcount;
            lead.displs = hdispl;
            rc = dt_mpi_ops.allgatherv(h->leaders, &lead);
        }
        dt_coll_args bc = stage(a, DT_COLL_BROADCAST, packed, packed, total, 0);
        if (rc == DT_OK) rc = dt_shm_ops.broadcast(h->local, &bc);
        for (int p = 0; p < n && rc == DT_OK; p++)
            if (a->counts[p]) memmove((char *)a->recv + a->displs[p] * es, packed + pos[p] * es,
                                      a->counts[p] * es);
    }
    free(packed);
    free(v);
    return rc;
}

/* Reduce-scatter: the whole vector is reduced to the leader, the leaders
 * reduce-scatter it by host (blocks in host order), and each host's leader
 * broadcasts its host's blocks. */
static dt_status hier_reduce_scatter(dt_comm_t c, const dt_coll_args *a) {
    hier_state *h = HS(c);
    if (h->single_host) return dt_shm_ops.reduce_scatter(h->local, a);
    int n = c->size, nn = c->nnodes, ln = c->local_size;
    size_t es = dt_dtype_size(a->dtype), rc_ = a->count, all = rc_ * (size_t)n;
    size_t mine_n = rc_ * (size_t)ln;
    char *full = NULL, *perm = NULL, *mine = malloc(mine_n * es + 1);
    size_t *hcount = malloc((size_t)nn * sizeof(size_t));
    dt_status rc = DT_OK;
    if (h->leaders) {
        full = malloc(all * es + 1);
        perm = h->in_order ? full : malloc(all * es + 1);
    }
    if (!mine || !hcount || (h->leaders && (!full || !perm))) {
        rc = dt_error(DT_ERR_NOMEM, "reduce_scatter: out of memory");
        goto out;
    }
    dt_coll_args in_host = stage(a, DT_COLL_REDUCE, a->send, full, all, 0);
    if ((rc = dt_shm_ops.reduce(h->local, &in_host)) != DT_OK) goto out;
    if (h->leaders) {
        if (perm != full)
            for (int i = 0; i < n; i++)
                memcpy(perm + (size_t)i * rc_ * es, full + (size_t)h->by_host[i] * rc_ * es, rc_ * es);
        for (int k = 0; k < nn; k++)
            hcount[k] = rc_ * (size_t)(h->host_start[k + 1] - h->host_start[k]);
        dt_coll_args lead = stage(a, DT_COLL_REDUCE_SCATTER, perm, mine, rc_, 0);
        lead.counts = hcount;
        if ((rc = dt_mpi_ops.reduce_scatter(h->leaders, &lead)) != DT_OK) goto out;
    }
    dt_coll_args bc = stage(a, DT_COLL_BROADCAST, mine, mine, mine_n, 0);
    if ((rc = dt_shm_ops.broadcast(h->local, &bc)) != DT_OK) goto out;
    if (rc_) memmove(a->recv, mine + (size_t)c->local_rank * rc_ * es, rc_ * es);
    if (a->op == DT_AVG) dt_avg_finish(a->recv, rc_, a->dtype, n);
out:
    if (perm != full) free(perm);
    free(full);
    free(mine);
    free(hcount);
    return rc;
}

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
    hier_state_free(h);
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
