/* staging.c - device communicators whose collectives go through host memory
 * (comm/device.h): ranks that share a GPU (NCCL takes one GPU a rank), or
 * no NCCL. Each collective copies what this rank sends from the device to
 * a pinned host buffer (the seam's host_alloc), runs the same collective
 * on the host communicator (a split of the one it was made over, so that
 * its numbering is its own: shm or MPI, their timeouts and their errors
 * naming the missing ranks) and copies the result back to the device.
 * One collective at a time (the front end runs a communicator's calls in
 * order), so one buffer, grown to the largest. A non-blocking twin runs on
 * the front end's progress thread while the caller goes on queuing kernels
 * (a gradient bucket during backward): its copies wait for every kernel
 * queued before them, the bucket's among them (an event passed is not
 * needed). Point to point likewise: a send copied to a pinned buffer and
 * sent by the host communicator's dt_isend, a receive received into one
 * and copied to the device; one send and one receive in flight at a time,
 * each through its own buffer (a later one waits, not started, for the
 * buffer). */
#include "comm/staging/staging.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    char *buf;  /* pinned */
    size_t cap;
} pinned;

typedef struct {
    const dt_dev *d;
    int device;         /* this rank's GPU, taken by whichever thread copies */
    dt_comm_t host;     /* the split of the host communicator */
    pinned coll;        /* the collectives' */
    pinned way[2];      /* point to point's: the send's, the receive's */
    dt_p2p *using[2];   /* the transfer each way's buffer serves (NULL: free) */
} staging;

/* A transfer's host request, in its dt_p2p's backend handle. */
typedef struct {
    dt_request_t req;
} st_p2p;

#define ST(c) ((staging *)(c)->be)

static dt_status grow(const dt_dev *d, pinned *b, size_t bytes) {
    if (bytes <= b->cap) return DT_OK;
    size_t want = b->cap * 2 > bytes ? b->cap * 2 : bytes;
    void *p = NULL;
    dt_status st = d->host_alloc(&p, want);
    if (st != DT_OK) return dt_error(st, "staging through host memory: %s", dt_last_error());
    if (b->buf) d->host_free(b->buf);
    b->buf = p;
    b->cap = want;
    return DT_OK;
}

static dt_status room(staging *s, size_t bytes) { return grow(s->d, &s->coll, bytes); }

// The host collective's failure, as this communicator's (the front end
// marks it broken on DT_ERR_COMM / DT_ERR_TIMEOUT).
static dt_status host_failed(dt_status st) {
    return dt_error(st, "staged through host memory: %s", dt_last_error());
}

static dt_status copy_failed(const dt_coll_args *a, const char *way, dt_status st) {
    return dt_error(st, "%s (seq %llu) on the device, the copy %s host memory: %s", dt_coll_name(a->kind),
                    (unsigned long long)a->seq, way, dt_last_error());
}

// (The copies are the kernels' stream's: after every kernel queued before
// them, on this rank's GPU from the progress thread too.)
static dt_status to_host(staging *s, const dt_coll_args *a, void *h, const void *dev, size_t bytes) {
    dt_status st = bytes ? s->d->use(s->device) : DT_OK;
    if (st == DT_OK && bytes) st = s->d->to_host(h, dev, bytes);
    return st == DT_OK ? DT_OK : copy_failed(a, "to", st);
}

static dt_status to_device(staging *s, const dt_coll_args *a, void *dev, const void *h, size_t bytes) {
    dt_status st = bytes ? s->d->use(s->device) : DT_OK;
    if (st == DT_OK && bytes) st = s->d->to_device(dev, h, bytes);
    return st == DT_OK ? DT_OK : copy_failed(a, "from", st);
}

static dt_status st_allreduce(dt_comm_t c, const dt_coll_args *a) {
    staging *s = ST(c);
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    dt_status st;
    DT_TRY(room(s, bytes), done);
    DT_TRY(to_host(s, a, s->coll.buf, a->send, bytes), done);
    if ((st = dt_allreduce(s->coll.buf, s->coll.buf, a->count, a->dtype, a->op, s->host)) != DT_OK)
        return host_failed(st);
    st = to_device(s, a, a->recv, s->coll.buf, bytes);
done:
    return st;
}

static dt_status st_reduce(dt_comm_t c, const dt_coll_args *a) {
    staging *s = ST(c);
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    dt_status st;
    DT_TRY(room(s, bytes), done);
    DT_TRY(to_host(s, a, s->coll.buf, a->send, bytes), done);
    if ((st = dt_reduce(s->coll.buf, s->coll.buf, a->count, a->dtype, a->op, a->root, s->host)) != DT_OK)
        return host_failed(st);
    st = c->rank == a->root ? to_device(s, a, a->recv, s->coll.buf, bytes) : DT_OK;
done:
    return st;
}

// send [count x size] in the buffer, this rank's block after it.
static dt_status st_reduce_scatter(dt_comm_t c, const dt_coll_args *a) {
    staging *s = ST(c);
    size_t es = dt_dtype_size(a->dtype), bytes = a->count * es, all = bytes * (size_t)c->size;
    dt_status st;
    DT_TRY(room(s, all + bytes), done);
    DT_TRY(to_host(s, a, s->coll.buf, a->send, all), done);
    if ((st = dt_reduce_scatter(s->coll.buf, s->coll.buf + all, a->count, a->dtype, a->op, s->host)) != DT_OK)
        return host_failed(st);
    st = to_device(s, a, a->recv, s->coll.buf + all, bytes);
done:
    return st;
}

// The gathered blocks in the buffer, this rank's own after them.
static dt_status st_allgatherv(dt_comm_t c, const dt_coll_args *a) {
    staging *s = ST(c);
    size_t es = dt_dtype_size(a->dtype), total = 0, mine = a->count * es;
    for (int p = 0; p < c->size; p++)
        if (a->displs[p] + a->counts[p] > total) total = a->displs[p] + a->counts[p];
    total *= es;
    dt_status st;
    DT_TRY(room(s, total + mine), done);
    DT_TRY(to_host(s, a, s->coll.buf + total, a->send, mine), done);
    st = dt_allgatherv(s->coll.buf + total, a->count, s->coll.buf, a->counts, a->displs, a->dtype, s->host);
    if (st != DT_OK) return host_failed(st);
    st = to_device(s, a, a->recv, s->coll.buf, total);
done:
    return st;
}

static dt_status st_broadcast(dt_comm_t c, const dt_coll_args *a) {
    staging *s = ST(c);
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    dt_status st;
    DT_TRY(room(s, bytes), done);
    if (c->rank == a->root) DT_TRY(to_host(s, a, s->coll.buf, a->send, bytes), done);
    if ((st = dt_broadcast(s->coll.buf, s->coll.buf, a->count, a->dtype, a->root, s->host)) != DT_OK)
        return host_failed(st);
    st = to_device(s, a, a->recv, s->coll.buf, bytes);
done:
    return st;
}

static dt_status st_barrier(dt_comm_t c, const dt_coll_args *a) {
    (void)a;
    dt_status st = dt_barrier(ST(c)->host);
    return st == DT_OK ? DT_OK : host_failed(st);
}

// ---- point to point ----

static dt_status st_p2p_progress(dt_comm_t c, dt_p2p *p, int slow, int *moved) {
    staging *s = ST(c);
    const dt_coll_args *a = &p->args;
    int w = a->kind == DT_COLL_RECV;
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    st_p2p *h = (st_p2p *)p->be;
    dt_status st;
    (void)slow;  // (the host communicator watches its peers in its own waits)
    if (!p->started) {
        if (s->using[w]) return DT_OK;  // (its buffer serves another transfer yet)
        DT_TRY(grow(s->d, &s->way[w], bytes), done);
        if (!w) DT_TRY(to_host(s, a, s->way[w].buf, a->send, bytes), done);
        st = w ? dt_irecv(s->way[w].buf, a->count, a->dtype, a->root, s->host, &h->req)
               : dt_isend(s->way[w].buf, a->count, a->dtype, a->root, s->host, &h->req);
        if (st != DT_OK) return host_failed(st);
        s->using[w] = p;
        p->started = 1;
        *moved = 1;
    }
    int fin = 0;
    if ((st = dt_test(&h->req, &fin)) != DT_OK) {
        s->using[w] = NULL;
        return host_failed(st);
    }
    if (!fin) return DT_OK;
    s->using[w] = NULL;
    st = w ? to_device(s, a, a->recv, s->way[w].buf, bytes) : DT_OK;
    p->done = st == DT_OK;
    *moved = 1;
done:
    return st;
}

// A transfer given up: the host's ended too (its communicator aborted: the
// device's is broken with it).
static void st_p2p_cancel(dt_comm_t c, dt_p2p *p) {
    staging *s = ST(c);
    st_p2p *h = (st_p2p *)p->be;
    if (!h->req) return;
    dt_comm_abort(s->host, "a transfer through host memory failed");
    dt_wait(&h->req);
    s->using[p->args.kind == DT_COLL_RECV] = NULL;
}

static void st_abort(dt_comm_t c, const char *reason) { dt_comm_abort(ST(c)->host, reason); }

static void st_destroy(dt_comm_t c) {
    staging *s = ST(c);
    if (!s) return;
    dt_comm_destroy(s->host);
    if (s->coll.buf) s->d->host_free(s->coll.buf);
    for (int w = 0; w < 2; w++)
        if (s->way[w].buf) s->d->host_free(s->way[w].buf);
    free(s);
    c->be = NULL;
}

static const struct dt_comm_ops staging_ops = {
    .name = "staging",
    .allreduce = st_allreduce,
    .reduce_scatter = st_reduce_scatter,
    .allgatherv = st_allgatherv,
    .broadcast = st_broadcast,
    .reduce = st_reduce,
    .barrier = st_barrier,
    .p2p_progress = st_p2p_progress,
    .p2p_cancel = st_p2p_cancel,
    .abort = st_abort,
    .destroy = st_destroy,
};

dt_status dt_staging_init(dt_comm_t c, dt_comm_t host, const dt_comm_device_params *p) {
    staging *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "staging through host memory: out of memory");
    s->d = p->d;
    s->device = p->device;
    c->be = s;
    c->ops = &staging_ops;
    dt_status st = dt_comm_split(host, 0, dt_comm_rank(host), &s->host);
    if (st != DT_OK) return dt_error(st, "staging through host memory: its host communicator: %s", dt_last_error());
    return DT_OK;
}
