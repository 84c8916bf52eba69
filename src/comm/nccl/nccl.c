/* nccl.c - device communicators on NCCL (comm/device.h), one GPU a rank.
 *
 * NCCL is loaded at run time (gpu.h's dt_gpu_lib_open: DTRAIN_NCCL, the
 * loader's path, PyTorch's packages; 2.18 or later) and called through
 * the few functions of nccl_api.h. Its communicator is bootstrapped
 * through dtrain's own: rank 0's unique id broadcast over a split of the
 * host communicator, which later also tells who is behind after a timeout.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0, its init
 * included), so no NCCL call waits: a collective is queued on the
 * communication stream (after the kernels queued so far: the seam's
 * stream_after_compute; or, dt_iallreduce_after, after those its caller's
 * event marked: a gradient bucket during backward) and the host polls,
 * until the communicator's state (ncclCommGetAsyncError) is no longer
 * ncclInProgress and the stream is done (stream_query). Every ~10-50 ms of a wait it also looks
 * at the host's peers (a rank the launcher saw exit: the error names it)
 * and at the deadline, the host communicator's timeout. On expiry it asks
 * the host split which ranks had issued the collective (the others are
 * the missing ones; if all had, NCCL itself is stuck) and fails with
 * DT_ERR_TIMEOUT naming the op, its sequence number and those ranks. The
 * front end then calls abort: ncclCommAbort, and the host split aborted
 * so that its peers stop at once.
 *
 * On dtrain's simulated GPU (DTRAIN_GPU=sim, with the tests' fake NCCL)
 * device memory is open to the host only inside ops: every NCCL call is
 * made between the seam's host_open(1) and host_open(0). */
#include "comm/nccl/nccl.h"
#include "comm/nccl/nccl_api.h"
#include "gpu/gpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_gpu_lib lib;
    nccl_get_unique_id_fn get_unique_id;
    nccl_comm_init_rank_config_fn init_rank_config;
    nccl_comm_get_async_error_fn get_async_error;
    nccl_comm_fn abort, destroy;
    nccl_get_error_string_fn error_string;
    nccl_get_last_error_fn last_error;  /* may be NULL */
    nccl_all_reduce_fn all_reduce;
    nccl_reduce_scatter_fn reduce_scatter;
    nccl_all_gather_fn all_gather;
    nccl_broadcast_fn broadcast;
    nccl_reduce_fn reduce;
    nccl_send_fn send;
    nccl_recv_fn recv;
    ncclComm_t comm;
    const dt_dev *d;
    int device;           /* this rank's GPU */
    void *stream;
    void *word;           /* 8 bytes of device memory: the barrier's allreduce */
    dt_comm_t host;       /* the split: the unique id, who is behind */
    dt_comm_t parent;     /* the host communicator: its peers' liveness */
    int64_t issued;       /* the last collective this rank handed to NCCL (0: the init, -1: none) */
    pthread_mutex_t mu;   /* every call into NCCL: an abort (another thread's) never frees comm under one */
} nccl_state;

#define NS(c) ((nccl_state *)(c)->be)

// A call into NCCL, under the state's lock; on the simulated GPU its
// memory open around it. NCCL_RUN: any call; NCCL: one on comm, which an
// abort made NULL gives ncclInvalidUsage.
#define NCCL_RUN(s, r, call)                                    \
    do {                                                        \
        pthread_mutex_lock(&(s)->mu);                           \
        if ((s)->d->host_open) (s)->d->host_open(1);            \
        (r) = (call);                                           \
        if ((s)->d->host_open) (s)->d->host_open(0);            \
        pthread_mutex_unlock(&(s)->mu);                         \
    } while (0)
#define NCCL(s, r, call) NCCL_RUN(s, r, (s)->comm ? (call) : ncclInvalidUsage)

// NCCL's words for r, and its last error's where it has one.
static void words(nccl_state *s, ncclResult_t r, char *out, size_t n) {
    pthread_mutex_lock(&s->mu);
    const char *last = s->last_error && s->comm ? s->last_error(s->comm) : NULL;
    snprintf(out, n, "%s (%s %d)%s%s", s->error_string ? s->error_string(r) : "?", "ncclResult", (int)r,
             last && *last ? ": " : "", last && *last ? last : "");
    pthread_mutex_unlock(&s->mu);
}

#define SYM(field, name)                                                                               \
    do {                                                                                               \
        if (!(*(void **)&s->field = dt_gpu_lib_sym(&s->lib, name)) && need)                            \
            return dt_error(DT_ERR_IO, "NCCL at %s has no %s", s->lib.path, name);                      \
    } while (0)

static dt_status load(nccl_state *s) {
    dt_status st = dt_gpu_lib_open("nccl", &s->lib);
    if (st != DT_OK) return st;
    int need = 1;
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(init_rank_config, "ncclCommInitRankConfig");
    SYM(get_async_error, "ncclCommGetAsyncError");
    SYM(abort, "ncclCommAbort");
    SYM(destroy, "ncclCommDestroy");
    SYM(error_string, "ncclGetErrorString");
    SYM(all_reduce, "ncclAllReduce");
    SYM(reduce_scatter, "ncclReduceScatter");
    SYM(all_gather, "ncclAllGather");
    SYM(broadcast, "ncclBroadcast");
    SYM(reduce, "ncclReduce");
    SYM(send, "ncclSend");
    SYM(recv, "ncclRecv");
    need = 0;
    SYM(last_error, "ncclGetLastError");
    return DT_OK;
}

int dt_nccl_usable(const dt_comm_device_params *p, char *why, size_t n) {
    if (p->shared) {
        snprintf(why, n, "%s, and NCCL takes one GPU a rank", p->shared);
        return 0;
    }
    dt_gpu_lib l;
    if (dt_gpu_lib_open("nccl", &l) != DT_OK) {
        snprintf(why, n, "%s", dt_last_error());
        return 0;
    }
    snprintf(why, n, "NCCL %ld.%ld.%ld (%s), one GPU a rank", l.version / 10000, l.version / 100 % 100,
             l.version % 100, l.path);
    dt_gpu_lib_close(&l);
    return 1;
}

// ---- waiting -------------------------------------------------------------------

// Whether what a wait waits for will not come: a rank of the host
// communicator that the launcher saw exit, or whose place a new process
// took (a spare; *rank that rank), or the world's regrouping after another
// rank's death (every rank left for the recovery; *rank -1); why[n] says
// which.
static int gone(nccl_state *s, int *rank, char *why, size_t n) {
    int p = dt_comm_replaced(s->parent);
    if (p >= 0) return *rank = p, snprintf(why, n, "rank %d died and a new process took its place; ranks not arrived: "
                                           "%d", p, p), 1;
    for (p = 0; p < dt_comm_size(s->parent); p++)
        if (p != dt_comm_rank(s->parent) && dt_comm_peer_state(s->parent, p, NULL) == DT_PEER_GONE)
            return *rank = p, snprintf(why, n, "rank %d exited; ranks not arrived: %d", p, p), 1;
    *rank = -1;
    if (!dt_comm_regrouped(s->parent)) return 0;
    snprintf(why, n, "a rank of the world died and a new process took its place: the ranks left it for the recovery");
    return 1;
}

// After a timeout: the ranks that had not issued collective seq (0: the
// init), asked over the host split (ranks that do not answer there are
// named by its error).
static void behind(nccl_state *s, int64_t seq, char *out, size_t n) {
    int W = dt_comm_size(s->host);
    int64_t mine = (int64_t)s->issued, *all = calloc((size_t)W, sizeof *all);
    if (!all) {
        snprintf(out, n, "unknown (out of memory)");
        return;
    }
    if (dt_allgather(&mine, all, 1, DT_I64, s->host) != DT_OK) {
        snprintf(out, n, "unknown to NCCL; the host communicator, asked: %s", dt_last_error());
        free(all);
        return;
    }
    size_t k = 0;
    out[0] = 0;
    for (int p = 0; p < W && k + 40 < n; p++)
        if (all[p] < seq)
            k += (size_t)snprintf(out + k, n - k, "%s%d (at seq %lld)", k ? ", " : "", p, (long long)all[p]);
    if (!k && seq) snprintf(out, n, "none (every rank issued seq %lld: stuck inside NCCL)", (long long)seq);
    else if (!k) snprintf(out, n, "none (every rank began it: stuck inside NCCL)");
    free(all);
}

static void describe(const dt_coll_args *a, char *out, size_t n) {
    if (a->kind == DT_COLL_COUNT_) snprintf(out, n, "NCCL's communicator init");
    else if (a->kind == DT_COLL_SEND || a->kind == DT_COLL_RECV)
        snprintf(out, n, "NCCL %s (%zu x %s, peer %d)", dt_coll_name(a->kind), a->count, dt_dtype_name(a->dtype),
                 a->root);
    else snprintf(out, n, "NCCL %s (seq %llu, %zu x %s)", dt_coll_name(a->kind), (unsigned long long)a->seq,
                  a->count, dt_dtype_name(a->dtype));
}

// One look at a's progress (never blocking): *done once the communicator
// is no longer in progress and the stream (NULL: none, the init) is done;
// NCCL's asynchronous error or the stream's, named.
static dt_status poll(dt_comm_t c, const dt_coll_args *a, void *stream, int *done) {
    nccl_state *s = NS(c);
    char what[160], why[600];
    ncclResult_t r, state = ncclInProgress;
    NCCL(s, r, s->get_async_error(s->comm, &state));
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) {
        describe(a, what, sizeof what);
        words(s, state, why, sizeof why);
        return dt_error(DT_ERR_COMM, "%s on rank %d: NCCL's asynchronous error: %s", what, c->rank, why);
    }
    *done = state == ncclSuccess && !stream;
    if (state == ncclSuccess && stream && s->d->stream_query(stream, done) != DT_OK) {
        describe(a, what, sizeof what);
        return dt_error(DT_ERR_COMM, "%s on rank %d: its stream: %s", what, c->rank, dt_last_error());
    }
    return DT_OK;
}

// Polls until a is done (poll); the deadline is c's timeout.
static dt_status await(dt_comm_t c, const dt_coll_args *a, void *stream) {
    nccl_state *s = NS(c);
    char what[160], why[600];
    dt_waiter w;
    dt_waiter_init(&w, c->timeout, c->local_size);
    for (;;) {
        int done = 0;
        dt_status st = poll(c, a, stream, &done);
        if (st != DT_OK) return st;
        if (done) return DT_OK;
        if (!dt_waiter_step(&w)) continue;
        if (a->kind != DT_COLL_COUNT_) dt_waiter_note(a, -1);
        describe(a, what, sizeof what);
        int who;
        if (gone(s, &who, why, sizeof why)) return dt_error(DT_ERR_COMM, "%s on rank %d: %s", what, c->rank, why);
        if (dt_waiter_expired(&w)) {
            behind(s, a->kind == DT_COLL_COUNT_ ? 0 : (int64_t)a->seq, why, sizeof why);
            return dt_error(DT_ERR_TIMEOUT, "%s on rank %d: timed out after %.3g s; ranks not arrived: %s", what,
                            c->rank, c->timeout, why);
        }
    }
}

// ---- the collectives ---------------------------------------------------------------

static int nccl_type(dt_dtype t) {
    static const int m[] = {[DT_F32] = ncclFloat32, [DT_F16] = ncclFloat16, [DT_BF16] = ncclBfloat16,
                            [DT_I32] = ncclInt32,   [DT_I64] = ncclInt64,   [DT_U8] = ncclUint8};
    return m[t];
}

static ncclRedOp_t nccl_op(dt_redop op) {
    return op == DT_AVG ? ncclAvg : op == DT_MAX ? ncclMax : op == DT_MIN ? ncclMin : ncclSum;
}

// Before a collective is queued: it reads what the kernels queued so far
// wrote, or those a->after marked (on this rank's GPU, whichever thread
// calls: a non-blocking twin runs on the front end's progress thread,
// later than its caller queued them).
static dt_status before(dt_comm_t c, const dt_coll_args *a) {
    nccl_state *s = NS(c);
    dt_status st = s->d->use(s->device);
    if (st == DT_OK)
        st = a->after ? s->d->stream_wait_event(s->stream, a->after) : s->d->stream_after_compute(s->stream);
    if (st == DT_OK) return DT_OK;
    return dt_error(DT_ERR_COMM, "NCCL %s (seq %llu) on rank %d: %s", dt_coll_name(a->kind),
                    (unsigned long long)a->seq, c->rank, dt_last_error());
}

// After NCCL took (r) collective a: its wait.
static dt_status issued(dt_comm_t c, const dt_coll_args *a, ncclResult_t r) {
    nccl_state *s = NS(c);
    if (r != ncclSuccess && r != ncclInProgress) {
        char what[160], why[600];
        describe(a, what, sizeof what);
        words(s, r, why, sizeof why);
        return dt_error(r == ncclInvalidArgument || r == ncclInvalidUsage ? DT_ERR_ARG : DT_ERR_COMM,
                        "%s on rank %d: %s", what, c->rank, why);
    }
    s->issued = (int64_t)a->seq;
    return await(c, a, s->stream);
}

static dt_status nc_allreduce(dt_comm_t c, const dt_coll_args *a) {
    nccl_state *s = NS(c);
    ncclResult_t r;
    dt_status st = before(c, a);
    if (st != DT_OK) return st;
    NCCL(s, r, s->all_reduce(a->send, a->recv, a->count, nccl_type(a->dtype), nccl_op(a->op), s->comm, s->stream));
    return issued(c, a, r);
}

static dt_status nc_reduce(dt_comm_t c, const dt_coll_args *a) {
    nccl_state *s = NS(c);
    ncclResult_t r;
    dt_status st = before(c, a);
    if (st != DT_OK) return st;
    NCCL(s, r, s->reduce(a->send, a->recv, a->count, nccl_type(a->dtype), nccl_op(a->op), a->root, s->comm,
                         s->stream));
    return issued(c, a, r);
}

static dt_status nc_reduce_scatter(dt_comm_t c, const dt_coll_args *a) {
    nccl_state *s = NS(c);
    ncclResult_t r;
    if (a->counts) return dt_error(DT_ERR_ARG, "NCCL reduce_scatter: blocks of unequal sizes are not in this dtrain");
    dt_status st = before(c, a);
    if (st != DT_OK) return st;
    NCCL(s, r, s->reduce_scatter(a->send, a->recv, a->count, nccl_type(a->dtype), nccl_op(a->op), s->comm,
                                 s->stream));
    return issued(c, a, r);
}

// ncclAllGather: equal blocks in rank order only.
static dt_status nc_allgatherv(dt_comm_t c, const dt_coll_args *a) {
    nccl_state *s = NS(c);
    ncclResult_t r;
    for (int p = 0; p < c->size; p++)
        if (a->counts[p] != a->count || a->displs[p] != (size_t)p * a->count)
            return dt_error(DT_ERR_ARG, "NCCL allgather (seq %llu): rank %d's block is %zu at %zu; NCCL gathers "
                            "equal blocks (%zu) in rank order", (unsigned long long)a->seq, p, a->counts[p],
                            a->displs[p], a->count);
    dt_status st = before(c, a);
    if (st != DT_OK) return st;
    NCCL(s, r, s->all_gather(a->send, a->recv, a->count, nccl_type(a->dtype), s->comm, s->stream));
    return issued(c, a, r);
}

static dt_status nc_broadcast(dt_comm_t c, const dt_coll_args *a) {
    nccl_state *s = NS(c);
    ncclResult_t r;
    dt_status st = before(c, a);
    if (st != DT_OK) return st;
    NCCL(s, r, s->broadcast(a->send, a->recv, a->count, nccl_type(a->dtype), a->root, s->comm, s->stream));
    return issued(c, a, r);
}

static dt_status nc_barrier(dt_comm_t c, const dt_coll_args *a) {
    nccl_state *s = NS(c);
    ncclResult_t r;
    dt_status st = before(c, a);
    if (st != DT_OK) return st;
    NCCL(s, r, s->all_reduce(s->word, s->word, 1, ncclInt64, ncclSum, s->comm, s->stream));
    return issued(c, a, r);
}

// ---- point to point ------------------------------------------------------------------
// ncclSend and ncclRecv wait on the GPU for their peer's match, and a
// communicator's operations run in the order issued: the front end hands
// over a (direction, peer)'s transfers one at a time, and a caller that
// has transfers both ways (a pipeline stage's streams) keeps each way on a
// communicator of its own, so that no transfer waits behind one its peer
// has not reached. A transfer is queued on the communication stream after
// the kernels queued so far (those that wrote what it sends, and those
// that read what it receives into), then polled: NCCL's state and the
// stream, never blocking; the front end owns the deadline.

static dt_status nc_p2p_progress(dt_comm_t c, dt_p2p *p, int slow, int *moved) {
    nccl_state *s = NS(c);
    const dt_coll_args *a = &p->args;
    char what[160], why[600];
    ncclResult_t r;
    if (!p->started) {
        dt_status st = before(c, a);
        if (st != DT_OK) return st;
        if (a->kind == DT_COLL_SEND)
            NCCL(s, r, s->send(a->send, a->count, nccl_type(a->dtype), a->root, s->comm, s->stream));
        else
            NCCL(s, r, s->recv(a->recv, a->count, nccl_type(a->dtype), a->root, s->comm, s->stream));
        p->started = 1;
        *moved = 1;
        if (r != ncclSuccess && r != ncclInProgress) {
            describe(a, what, sizeof what);
            words(s, r, why, sizeof why);
            return dt_error(DT_ERR_COMM, "%s on rank %d: %s", what, c->rank, why);
        }
    }
    int done = 0;
    dt_status st = poll(c, a, s->stream, &done);
    if (st != DT_OK) return st;
    if (done) {
        p->done = 1;
        *moved = 1;
        return DT_OK;
    }
    int who;
    if (slow && gone(s, &who, why, sizeof why)) {
        describe(a, what, sizeof what);
        p->peer_gone = who == a->root;
        return dt_error(DT_ERR_COMM, "%s on rank %d: %s", what, c->rank, why);
    }
    return DT_OK;
}

// (the communicator is aborted with the error: nothing of one transfer to undo)
static void nc_p2p_cancel(dt_comm_t c, dt_p2p *p) {
    (void)c;
    (void)p;
}

// NCCL's communicator aborted (abort) or destroyed, and gone: called under
// NCCL's lock, so a thread polling it meanwhile finds it NULL.
static ncclResult_t release(nccl_state *s, int abort) {
    ncclResult_t r = (abort ? s->abort : s->destroy)(s->comm);
    s->comm = NULL;
    return r;
}

static void nc_abort(dt_comm_t c, const char *reason) {
    nccl_state *s = NS(c);
    ncclResult_t r;
    NCCL(s, r, release(s, 1));
    (void)r;
    if (s->host) dt_comm_abort(s->host, reason);
}

static void nc_destroy(dt_comm_t c) {
    nccl_state *s = NS(c);
    if (!s) return;
    ncclResult_t r;
    NCCL(s, r, release(s, atomic_load(&c->err) != DT_OK));
    (void)r;
    if (s->word) s->d->free(s->word);
    if (s->stream) s->d->stream_destroy(s->stream);
    dt_comm_destroy(s->host);
    dt_gpu_lib_close(&s->lib);
    pthread_mutex_destroy(&s->mu);
    free(s);
    c->be = NULL;
}

static const struct dt_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nc_allreduce,
    .reduce_scatter = nc_reduce_scatter,
    .allgatherv = nc_allgatherv,
    .broadcast = nc_broadcast,
    .reduce = nc_reduce,
    .barrier = nc_barrier,
    .p2p_progress = nc_p2p_progress,
    .p2p_cancel = nc_p2p_cancel,
    .abort = nc_abort,
    .destroy = nc_destroy,
};

// ---- the communicator ------------------------------------------------------------------

// Rank 0's unique id to every rank, with whether rank 0 could make one.
static dt_status share_id(dt_comm_t c, nccl_state *s, ncclUniqueId *id) {
    unsigned char msg[1 + sizeof *id] = {0};
    ncclResult_t r = ncclSuccess;
    if (c->rank == 0) {
        NCCL_RUN(s, r, s->get_unique_id(id));
        msg[0] = r == ncclSuccess;
        memcpy(msg + 1, id, sizeof *id);
    }
    dt_status st = dt_broadcast(msg, msg, sizeof msg, DT_U8, 0, s->host);
    if (st != DT_OK) return dt_error(st, "NCCL's unique id from rank 0: %s", dt_last_error());
    if (!msg[0]) {
        char why[600] = "see rank 0's error";
        if (c->rank == 0) words(s, r, why, sizeof why);
        return dt_error(DT_ERR_COMM, "NCCL on rank %d: ncclGetUniqueId on rank 0 failed: %s", c->rank, why);
    }
    memcpy(id, msg + 1, sizeof *id);
    return DT_OK;
}

dt_status dt_nccl_init(dt_comm_t c, dt_comm_t host, const dt_comm_device_params *p) {
    nccl_state *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "NCCL: out of memory");
    pthread_mutex_init(&s->mu, NULL);
    s->d = p->d;
    s->device = p->device;
    s->parent = host;
    s->issued = -1;
    c->be = s;
    c->ops = &nccl_ops;
    dt_status st = load(s);
    if (st != DT_OK) return st;
    if ((st = dt_comm_split(host, 0, c->rank, &s->host)) != DT_OK)
        return dt_error(st, "NCCL: its host communicator: %s", dt_last_error());
    ncclUniqueId id;
    if ((st = share_id(c, s, &id)) != DT_OK) return st;
    if ((st = s->d->stream_create(&s->stream)) != DT_OK || (st = s->d->alloc(&s->word, 8)) != DT_OK ||
        (st = s->d->memset0(s->word, 8)) != DT_OK)
        return dt_error(st, "NCCL on rank %d: %s", c->rank, dt_last_error());
    dt_nccl_config cfg = {sizeof cfg, DT_NCCL_CONFIG_MAGIC, DT_NCCL_CONFIG_VERSION, 0, DT_NCCL_UNDEF_INT,
                          DT_NCCL_UNDEF_INT, DT_NCCL_UNDEF_INT, NULL, DT_NCCL_UNDEF_INT};
    ncclResult_t r;
    NCCL_RUN(s, r, s->init_rank_config(&s->comm, c->size, id, c->rank, &cfg));
    s->issued = 0;
    dt_coll_args init = {.kind = DT_COLL_COUNT_};
    if (r != ncclSuccess && r != ncclInProgress) {
        char why[600];
        words(s, r, why, sizeof why);
        return dt_error(DT_ERR_COMM, "NCCL's communicator init on rank %d (of %d, GPU %d): %s", c->rank, c->size,
                        p->device, why);
    }
    if ((st = await(c, &init, NULL)) != DT_OK) nc_abort(c, dt_last_error());
    return st;
}
