/*
 * comm_impl.h - what the communicator front end (comm.c) shares with its
 * backends (shm/, mpi/, hier.c).
 *
 * The front end owns everything that is the same for every transport:
 * argument validation, sequence numbers, the argument check, sticky errors,
 * the progress thread of the non-blocking calls, and splitting. A backend
 * fills in one `struct dt_comm_ops` table (like a ggml backend or Redis's
 * ae_epoll.c) and keeps its own state behind `c->be`. Which backends
 * exist, and how a world communicator is made with each, is in one table
 * (registry.c, registry.h); a backend's own entry points are in its header
 * (shm/shm.h, mpi/mpi_impl.h), which only the registry and the backends
 * built on it (hier.c on shm) include.
 *
 * Backend functions run with the collective already validated and numbered
 * (args->seq). They return DT_OK or an error set with dt_error(); on
 * DT_ERR_COMM / DT_ERR_TIMEOUT the front end marks the communicator broken.
 */
#ifndef DT_COMM_IMPL_H
#define DT_COMM_IMPL_H

#include "dtrain/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define DT_HIDDEN __attribute__((visibility("hidden")))

// ----------------------------------------------------------------------------
// one collective call, as the backends see it

typedef enum {
    DT_COLL_ALLREDUCE = 0,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_ALLGATHERV, /* dt_allgather is allgatherv with equal counts */
    DT_COLL_BROADCAST,
    DT_COLL_REDUCE,
    DT_COLL_BARRIER,
    DT_COLL_SEND,
    DT_COLL_RECV,
    DT_COLL_COUNT_
} dt_coll;

typedef struct {
    dt_coll kind;
    const void *send;
    void *recv;
    size_t count;          /* allreduce/reduce/bcast: elements; reduce_scatter:
                              recvcount; allgatherv: this rank's sendcount */
    dt_dtype dtype;
    dt_redop op;
    int root;              /* broadcast/reduce root; send/recv peer */
    const size_t *counts;  /* allgatherv: size entries; reduce_scatter: NULL, or
                              per-rank block sizes (hier's leaders) */
    const size_t *displs;  /* allgatherv only: size entries */
    uint64_t seq;          /* 1, 2, ... per communicator (user-visible ops) */
    int check_of;          /* internal allgather of check mode: kind + 1 of the
                              collective being checked, for error messages */
    void *after;           /* device communicators: an event of the kernels'
                              stream (gpu/dev.h) the collective starts after;
                              NULL: after every kernel queued when it is issued */
} dt_coll_args;

DT_HIDDEN const char *dt_coll_name(dt_coll k);

/* Numbers a and runs it (req NULL), or queues it for the progress thread
 * (*req: dt_wait's), as the public calls do; for the device communicators'
 * own entries (comm/device.h). */
DT_HIDDEN dt_status dt_comm_submit(dt_comm_t c, dt_coll_args *a, dt_request_t *req);

/* A point-to-point transfer in flight (dt_isend/dt_irecv, and the blocking
 * dt_send/dt_recv, which wait for one at once). */
typedef struct {
    dt_coll_args args; /* DT_COLL_SEND or DT_COLL_RECV; root = the peer */
    size_t pos;        /* the backend's progress (shm: pieces through the channel) */
    int started, done;
    int peer_gone;     /* it failed because the peer died (dt_comm_set_peer_faults) */
    _Alignas(16) unsigned char be[32]; /* the backend's handle (MPI: the request) */
} dt_p2p;

// ----------------------------------------------------------------------------
// the ops table

struct dt_comm_ops {
    const char *name;
    dt_status (*allreduce)(dt_comm_t c, const dt_coll_args *a);
    dt_status (*reduce_scatter)(dt_comm_t c, const dt_coll_args *a);
    dt_status (*allgatherv)(dt_comm_t c, const dt_coll_args *a);
    dt_status (*broadcast)(dt_comm_t c, const dt_coll_args *a);
    dt_status (*reduce)(dt_comm_t c, const dt_coll_args *a);
    dt_status (*barrier)(dt_comm_t c, const dt_coll_args *a);
    /* Point to point, never blocking: moves what it can of p (the first
     * call starts it), sets p->done once complete and *moved if anything
     * happened; `slow` asks for the peer-liveness and abort checks too
     * (every ~10 ms while stuck). The front end passes the transfers of one
     * (direction, peer) one at a time, in issue order, and owns deadlines. */
    dt_status (*p2p_progress)(dt_comm_t c, dt_p2p *p, int slow, int *moved);
    /* Gives up on p after an error or a timeout. */
    void (*p2p_cancel)(dt_comm_t c, dt_p2p *p);
    /* Builds the backend state of `child` (rank/size already set) for the
     * ranks `members` (parent ranks, in child rank order). Collective over
     * the parent: every parent rank calls it, those with no group with
     * child == NULL. */
    dt_status (*split)(dt_comm_t parent, dt_comm_t child, const int *members, int nmembers,
                       int color, int ncolors_before);
    /* After a peer died and a new process took its place (dt_comm_rejoin):
     * meets every rank of the new generation, resets the backend's
     * counters to a fresh start and stores the generation in *gen. NULL:
     * the backend cannot. */
    dt_status (*rejoin)(dt_comm_t c, double timeout, uint64_t *gen);
    /* Tells the peers that this rank gave up (best effort, never blocks). */
    void (*abort)(dt_comm_t c, const char *reason);
    /* Replaceable ranks (optional; comm.h's dt_comm_peer_state and the
     * others): a peer's state and incarnation; the point-to-point channels
     * with a dead peer made empty for its replacement; the replacement's
     * wait for those; and its place in a split made before it started. */
    int (*peer_state)(dt_comm_t c, int peer, int *incarnation);
    int (*replaced)(dt_comm_t c);
    int (*regrouped)(dt_comm_t c);
    dt_status (*peer_reset)(dt_comm_t c, int peer);
    dt_status (*rejoin_peers)(dt_comm_t c, const int *peers, int npeers);
    int (*peer_ready)(dt_comm_t c, int peer);
    dt_status (*split_rejoin)(dt_comm_t parent, dt_comm_t child, int color);
    void (*destroy)(dt_comm_t c);
};

// ----------------------------------------------------------------------------
// the communicator

struct dt_comm {
    const struct dt_comm_ops *ops;
    void *be; /* backend state */

    int rank, size;
    int local_rank, local_size, node, nnodes;
    int world_rank; /* this process's rank in the world communicator */

    uint64_t seq;    /* user-visible collectives issued so far */
    double timeout;  /* seconds, every blocking wait */
    int check;       /* compare arguments across ranks before each collective */
    int nsplits;     /* splits made from this communicator (names segments) */
    int peer_faults; /* a transfer with a dead peer fails alone (dt_comm_set_peer_faults) */
    uint64_t gen;    /* the generation last joined (dt_comm_rejoin); 0 until then */

    /* Sticky error: once set, every call fails with it. */
    _Atomic int err;
    char err_msg[512];
    pthread_mutex_t err_lock;

    /* Non-blocking operations: a FIFO served by one progress thread. */
    pthread_mutex_t q_lock;
    pthread_cond_t q_cond;      /* signalled on enqueue and on completion */
    struct dt_request *q_head, *q_tail;
    int q_pending;              /* queued or running */
    int q_stop, thread_started;
    pthread_t thread;

    /* dt_comm_stats and the observer (comm.c). */
    _Atomic uint64_t st_ops, st_sent, st_recv, st_busy_ns;
    pthread_mutex_t obs_lock;
    dt_comm_observer obs_fn;
    _Atomic int obs_set;     /* obs_fn is set: account() takes obs_lock only then */
    void *obs_user;
    /* Point-to-point requests in flight, in issue order (under q_lock).
     * Whoever waits for one moves them all along; after the first
     * dt_isend/dt_irecv a second thread does so in the background. */
    struct dt_request *p2p_head;
    pthread_cond_t p2p_cond; /* signalled when a transfer is added */
    int p2p_started;
    pthread_t p2p_thread;
};

/* Records a communicator-breaking error (first one wins) and returns it. */
DT_HIDDEN dt_status dt_comm_fail(dt_comm_t c, dt_status s, const char *msg);

/* Default timeout and check mode from DTRAIN_COMM_TIMEOUT / DTRAIN_COMM_CHECK. */
DT_HIDDEN void dt_comm_defaults(dt_comm_t c);

/* Allocates a communicator with the front-end fields initialised. */
DT_HIDDEN dt_comm_t dt_comm_alloc(void);

// ----------------------------------------------------------------------------
// reduction kernels (reduce.c)

/* dst[i] = op(src[0][i], src[1][i], ..., src[nsrc-1][i]) combined in that
 * order; DT_AVG divides the sum by `avg_div`. fp16/bf16 accumulate in fp32
 * and round once. dst may alias any src. */
DT_HIDDEN void dt_reduce_kernel(void *dst, const void *const *src, int nsrc, size_t n,
                                dt_dtype t, dt_redop op, int avg_div);

/* The same, also storing the result to dst2 (may be NULL) in the same pass:
 * dst and dst2 must not overlap each other except exactly. */
DT_HIDDEN void dt_reduce_kernel2(void *dst, void *dst2, const void *const *src, int nsrc,
                                 size_t n, dt_dtype t, dt_redop op, int avg_div);


/* Divides n elements of buf in place by `nranks` (the end of a DT_AVG that
 * was run as a sum). */
DT_HIDDEN void dt_avg_finish(void *buf, size_t n, dt_dtype t, int nranks);

// ----------------------------------------------------------------------------
// algorithms (algo.c)
//
// DTRAIN_COMM_ALGO names one; each backend has one small function that
// picks among those it implements by message size and rank count, and
// uses a forced one only for the collectives it applies to.

typedef enum {
    DT_ALGO_AUTO = 0,
    DT_ALGO_DIRECT, /* shm: every rank reads every buffer, one synchronisation */
    DT_ALGO_RSAG,   /* shm: pipelined reduce-scatter + allgather through slots */
    DT_ALGO_RING,   /* allreduce: ring reduce-scatter + ring allgather */
    DT_ALGO_RHD,    /* allreduce: recursive halving + recursive doubling */
    DT_ALGO_TREE,   /* broadcast, reduce: binomial tree */
    DT_ALGO_MPI,    /* mpi: MPI's own collective */
    DT_ALGO_COUNT_
} dt_algo;

DT_HIDDEN const char *dt_algo_name(dt_algo a);
/* DTRAIN_COMM_ALGO (read when a communicator is created); unknown names
 * are logged and give DT_ALGO_AUTO. */
DT_HIDDEN dt_algo dt_algo_from_env(void);
/* Logs the choice at debug level, once per (backend, op, power-of-two
 * size class, algorithm) in the process. */
DT_HIDDEN void dt_algo_log(dt_comm_t c, const dt_coll_args *a, size_t bytes, dt_algo algo);

/* The one transport the point-to-point algorithms need: send sbytes from
 * sbuf to rank `to` while receiving rbytes into rbuf from rank `from`
 * (either may be -1: nothing). Every rank of the communicator calls it the
 * same number of times per collective, with the same `round_max`, the
 * largest message any rank moves in that call (the shm backend steps all
 * ranks in lockstep pieces; MPI ignores it). */
typedef dt_status (*dt_sendrecv_fn)(dt_comm_t c, const dt_coll_args *a, const void *sbuf,
                                    size_t sbytes, int to, void *rbuf, size_t rbytes, int from,
                                    size_t round_max);

/* allreduce / broadcast / reduce over `x`. fp16/bf16 are reduced in fp32
 * and rounded once, DT_AVG is a sum and a division; every element is
 * combined in an order fixed by the rank count (and root), so results are
 * identical on every rank and from run to run. */
DT_HIDDEN dt_status dt_algo_ring_allreduce(dt_comm_t c, const dt_coll_args *a, dt_sendrecv_fn x);
DT_HIDDEN dt_status dt_algo_rhd_allreduce(dt_comm_t c, const dt_coll_args *a, dt_sendrecv_fn x);
DT_HIDDEN dt_status dt_algo_tree_broadcast(dt_comm_t c, const dt_coll_args *a, dt_sendrecv_fn x);
DT_HIDDEN dt_status dt_algo_tree_reduce(dt_comm_t c, const dt_coll_args *a, dt_sendrecv_fn x);

// ----------------------------------------------------------------------------
// waiting without burning a shared core (wait.c)

/* A waiter spins briefly (only when the ranks have a core each), then
 * yields, then sleeps in growing steps up to 1 ms. */
typedef struct {
    double start, deadline, next_check;
    unsigned iters;
    int spin_limit; /* 1 while still in the spinning phase */
} dt_waiter;

DT_HIDDEN void dt_waiter_init(dt_waiter *w, double timeout, int nranks_on_host);
/* One pause/yield/sleep step. Returns 1 when it is time for the slow checks
 * (peer liveness, deadline), at most every ~50 ms once sleeping. */
DT_HIDDEN int dt_waiter_step(dt_waiter *w);
DT_HIDDEN int dt_waiter_expired(const dt_waiter *w);
/* 1 once spinning and yielding are over and the caller should block. */
DT_HIDDEN int dt_waiter_should_block(const dt_waiter *w);
/* 1 when the slow checks are due (for callers that block on their own). */
DT_HIDDEN int dt_waiter_tick(dt_waiter *w);
/* Tells the wait hook (dt_comm_set_wait_hook) that this thread is still
 * waiting in collective `a` for rank `peer` (-1: unknown); call at the slow
 * checks. dt_waiter_done() ends it, once the wait returns (a no-op if
 * nothing was reported). */
DT_HIDDEN void dt_waiter_note(const dt_coll_args *a, int peer);
DT_HIDDEN void dt_waiter_done(void);
/* The same for a wait that is not a collective (rejoin): op by name. */
DT_HIDDEN void dt_waiter_note_op(const char *op, uint64_t seq, int peer);

#endif
