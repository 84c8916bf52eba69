/*
 * mpi.c - the MPI backend: Open MPI or MPICH, selected when the process was
 * started by mpirun / srun (or DTRAIN_COMM_BACKEND=mpi).
 *
 * MPI's own collectives are used where they do the job (allreduce,
 * reduce_scatter_block, allgatherv, bcast, reduce, barrier), but always in
 * their non-blocking form (MPI_Iallreduce, ...) followed by a polling wait:
 * that is how a blocking dtrain call gets a timeout, which MPI itself does
 * not offer. The wait spins briefly, then yields and sleeps (wait.c), so a
 * rank blocked in a collective leaves its core to the compute threads.
 *
 * DTRAIN_COMM_ALGO=ring|rhd|tree runs dtrain's own algorithms (algo.c)
 * over MPI_Isend/MPI_Irecv instead (mpi_choose).
 *
 * What MPI does not do the way dtrain promises is done here:
 *   - fp16/bf16 allreduce, reduce-scatter and reduce: 16 bits on the wire,
 *     summed in fp32 in rank order and rounded once (half_collective:
 *     MPI_Ialltoallv of the blocks or MPI_Igather to the root, a local sum,
 *     MPI_Iallgatherv of the results); a forced algorithm widens them;
 *   - DT_AVG: a sum, then a division;
 *   - counts above INT_MAX: split into chunks (allreduce, bcast, reduce).
 *
 * A dead peer: Open MPI and MPICH normally take the whole job down; if they
 * do not, the wait times out with DT_ERR_TIMEOUT, and the rank that timed
 * out tells the others (see "aborts" below). MPI itself cannot say which
 * ranks did not arrive, so every communicator has an RMA window in which
 * each rank publishes the sequence number of the collective it is in; a
 * rank that times out reads the others' and names those behind (see
 * "who did not arrive" below).
 */
#include "comm/mpi/mpi_impl.h"

#include <limits.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// MPI library state

static int g_thread_level;
static pthread_mutex_t g_mpi_lock = PTHREAD_MUTEX_INITIALIZER;

/* Without MPI_THREAD_MULTIPLE, calls from the progress threads and the user
 * thread are serialised by one lock. */
#define MPI_LOCK()                                                              \
    do {                                                                        \
        if (g_thread_level < MPI_THREAD_MULTIPLE) pthread_mutex_lock(&g_mpi_lock); \
    } while (0)
#define MPI_UNLOCK()                                                              \
    do {                                                                          \
        if (g_thread_level < MPI_THREAD_MULTIPLE) pthread_mutex_unlock(&g_mpi_lock); \
    } while (0)

int dt_mpi_env_present(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                 "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return 1;
    }
    return 0;
}

static dt_status mpi_err(const char *what, int code) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, s, &len);
    return dt_error(DT_ERR_COMM, "%s: MPI error: %s", what, s);
}

/* MPI cannot be initialised twice, so a world communicator destroyed and
 * created again keeps MPI up; it is finalised when the process exits. */
static void finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

dt_status dt_mpi_library_init(void) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) return dt_error(DT_ERR_COMM, "MPI_Init_thread failed (%d)", rc);
        g_thread_level = provided;
        atexit(finalize_at_exit);
    } else {
        MPI_Query_thread(&g_thread_level);
    }
    return DT_OK;
}

// ----------------------------------------------------------------------------
// waiting for a request with a deadline

// ----------------------------------------------------------------------------
// aborts between MPI ranks
//
// MPI's only way to stop peers is MPI_Abort, which kills the job. Instead,
// a rank that gives up (dt_comm_abort, or a timeout) sends its reason to
// every peer with a reserved tag; waiting ranks probe for it at each slow
// check (every 10-50 ms) and fail with the sender's reason.

#define ABORT_TAG 7399
#define ABORT_LEN 400

static dt_status check_abort(dt_comm_t c, const char *what) {
    mpi_state *s = c->be;
    int flag = 0;
    MPI_Status st;
    MPI_Message msg;
    char reason[ABORT_LEN] = "";
    /* a matched probe: two threads (collectives, transfers) may look at once */
    MPI_LOCK();
    MPI_Improbe(MPI_ANY_SOURCE, ABORT_TAG, s->comm, &flag, &msg, &st);
    if (flag) MPI_Mrecv(reason, ABORT_LEN, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
    MPI_UNLOCK();
    if (!flag) return DT_OK;
    reason[ABORT_LEN - 1] = 0;
    return dt_error(DT_ERR_COMM, "%s on rank %d: rank %d aborted the communicator: %s", what,
                    c->rank, st.MPI_SOURCE, reason);
}

static void mpi_abort(dt_comm_t c, const char *reason) {
    mpi_state *s = c->be;
    if (!s || s->aborted) return;
    s->aborted = 1;
    snprintf(s->abort_msg, sizeof s->abort_msg, "%s", reason ? reason : "");
    MPI_LOCK();
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        MPI_Request rq;
        /* fire and forget: the request is never waited for */
        if (MPI_Isend(s->abort_msg, ABORT_LEN, MPI_CHAR, p, ABORT_TAG, s->comm, &rq) == MPI_SUCCESS)
            MPI_Request_free(&rq);
    }
    MPI_UNLOCK();
}

// ----------------------------------------------------------------------------
// who did not arrive
//
// Each communicator has a window of one uint64 per rank, locked (shared)
// by every rank for its whole life. A rank waiting in collective `seq`
// stores seq in its own slot (a plain store and MPI_Win_sync: no message).
// A rank that times out reads every slot with MPI_Rget (passive target:
// the peers need not be in MPI, with Open MPI's shared-memory "sm" window
// not even awake) and names the ranks whose number is lower: they have not
// reached this collective. The reads get 2 s; if they do not complete
// (a one-sided implementation that needs the target's attention), the
// message says the ranks are unknown.

static void publish_seq(mpi_state *s, uint64_t seq) {
    if (s->win == MPI_WIN_NULL || __atomic_load_n(s->at, __ATOMIC_RELAXED) == seq) return;
    __atomic_store_n(s->at, seq, __ATOMIC_RELEASE);
    MPI_LOCK();
    MPI_Win_sync(s->win);
    MPI_UNLOCK();
}

/* Writes "2 (at seq 4), 5 (at seq 4)" or why it cannot into buf. */
static void ranks_behind(dt_comm_t c, uint64_t seq, char *buf, size_t n) {
    mpi_state *s = c->be;
    int np = c->size, done = 0;
    uint64_t *v = calloc((size_t)np, sizeof *v);
    MPI_Request *rq = malloc((size_t)np * sizeof *rq);
    if (s->win == MPI_WIN_NULL || !v || !rq) {
        snprintf(buf, n, "unknown (no window)");
        free(v);
        free(rq);
        return;
    }
    MPI_LOCK();
    for (int p = 0; p < np; p++) {
        rq[p] = MPI_REQUEST_NULL;
        if (p != c->rank && MPI_Rget(&v[p], 1, MPI_UINT64_T, p, 0, 1, MPI_UINT64_T, s->win,
                                     &rq[p]) != MPI_SUCCESS)
            rq[p] = MPI_REQUEST_NULL;
    }
    MPI_UNLOCK();
    for (double until = dt_now() + 2.0; !done && dt_now() < until;) {
        MPI_LOCK();
        MPI_Testall(np, rq, &done, MPI_STATUSES_IGNORE);
        MPI_UNLOCK();
        if (!done) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    if (!done) { /* v and rq stay allocated: the reads may still land */
        snprintf(buf, n, "unknown (the peers' positions could not be read)");
        return;
    }
    size_t len = 0;
    buf[0] = 0;
    for (int p = 0; p < np && len + 40 < n; p++)
        if (p != c->rank && v[p] < seq)
            len += (size_t)snprintf(buf + len, n - len, "%s%d (at seq %llu)", len ? ", " : "",
                                    s->names ? s->names[p] : p, (unsigned long long)v[p]);
    if (!len) snprintf(buf, n, "none (every rank reached seq %llu: stuck inside MPI)",
                       (unsigned long long)seq);
    free(v);
    free(rq);
}

static dt_status wait_any_impl(dt_comm_t c, int n, MPI_Request *rq, int *idx, const dt_coll_args *a,
                               dt_waiter *w);

/* Waits until one of rq[0..n) completes and sets *idx to it (MPI_UNDEFINED
 * when all of them are MPI_REQUEST_NULL), or until w's deadline. w spans
 * all the waits of one exchange: one that began long ago sleeps between
 * tests instead of spinning and yielding again after every message. */
static dt_status wait_any(dt_comm_t c, int n, MPI_Request *rq, int *idx, const dt_coll_args *a, dt_waiter *w) {
    dt_status rc = wait_any_impl(c, n, rq, idx, a, w);
    dt_waiter_done();
    return rc;
}

static dt_status wait_req(dt_comm_t c, MPI_Request *rq, const dt_coll_args *a) {
    int idx;
    dt_waiter w;
    dt_waiter_init(&w, c->timeout, c->local_size);
    return wait_any(c, 1, rq, &idx, a, &w);
}

static dt_status wait_any_impl(dt_comm_t c, int n, MPI_Request *rq, int *idx, const dt_coll_args *a,
                               dt_waiter *w) {
    mpi_state *s = c->be;
    publish_seq(s, a->seq);
    for (;;) {
        int done = 0;
        MPI_LOCK();
        int rc = MPI_Testany(n, rq, idx, &done, MPI_STATUS_IGNORE);
        MPI_UNLOCK();
        if (rc != MPI_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "%s (seq %llu)", dt_coll_name(a->kind),
                     (unsigned long long)a->seq);
            return mpi_err(what, rc);
        }
        if (done) return DT_OK;
        if (dt_waiter_step(w)) {
            dt_waiter_note(a, -1);
            if (atomic_load(&c->err) != DT_OK)
                return dt_error((dt_status)atomic_load(&c->err), "%s (seq %llu): %s",
                                dt_coll_name(a->kind), (unsigned long long)a->seq, c->err_msg);
            char what[96];
            snprintf(what, sizeof what, "%s (seq %llu)", dt_coll_name(a->kind),
                     (unsigned long long)a->seq);
            dt_status ab = check_abort(c, what);
            if (ab != DT_OK) return ab;
            if (dt_waiter_expired(w)) {
                char who[256];
                ranks_behind(c, a->seq, who, sizeof who);
                return dt_error(DT_ERR_TIMEOUT,
                                "%s (seq %llu, %zu x %s) on rank %d: timed out after %.3g s; "
                                "ranks not arrived: %s",
                                dt_coll_name(a->kind), (unsigned long long)a->seq, a->count,
                                dt_dtype_name(a->dtype), s->names ? s->names[c->rank] : c->rank, c->timeout, who);
            }
        }
    }
}

#define CALL(expr, a)                                                  \
    do {                                                               \
        MPI_LOCK();                                                    \
        int rc_ = (expr);                                              \
        MPI_UNLOCK();                                                  \
        if (rc_ != MPI_SUCCESS) return mpi_err(dt_coll_name((a)->kind), rc_); \
    } while (0)

// ----------------------------------------------------------------------------
// types

static MPI_Datatype mpi_type(dt_dtype t) {
    switch (t) {
    case DT_F32: return MPI_FLOAT;
    case DT_I32: return MPI_INT32_T;
    case DT_I64: return MPI_INT64_T;
    case DT_U8: return MPI_UINT8_T;
    default: return MPI_FLOAT; /* fp16/bf16 travel as fp32 */
    }
}

static MPI_Op mpi_op(dt_redop op) {
    switch (op) {
    case DT_MAX: return MPI_MAX;
    case DT_MIN: return MPI_MIN;
    default: return MPI_SUM;
    }
}

static int is_half(dt_dtype t) { return t == DT_F16 || t == DT_BF16; }

/* For DT_AVG: divide n elements in place by the rank count. */
static void finish_avg(void *buf, size_t n, dt_dtype t, dt_redop op, int size) {
    if (op == DT_AVG) dt_avg_finish(buf, n, t, size);
}

// ----------------------------------------------------------------------------
// collectives

static dt_status mpi_allreduce_chunk(dt_comm_t c, const dt_coll_args *a, const void *send,
                                     void *recv, size_t n) {
    mpi_state *s = c->be;
    MPI_Request rq;
    CALL(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)n, mpi_type(a->dtype),
                        mpi_op(a->op), s->comm, &rq),
         a);
    return wait_req(c, &rq, a);
}

// ----------------------------------------------------------------------------
// dtrain's own algorithms over MPI point to point (algo.c)

#define ALGO_TAG 7302
#define XCHG_CHUNK ((size_t)60 << 10) /* bytes per message: under Open MPI's TCP eager limit */
#define XCHG_WINDOW 16                /* messages in flight each way */

/* One step of an algorithm: send sbytes to `to` while receiving rbytes
 * from `from`, as messages of at most XCHG_CHUNK bytes (in order, one tag:
 * MPI matches them in order), up to XCHG_WINDOW of them in flight each
 * way. Why small messages: over Open MPI's TCP transport both directions
 * between two ranks share one connection, and a message above the eager
 * limit (64 KiB with its header) waits for the receiver's reply before its
 * data moves; that reply queues behind the data this rank is sending, so
 * the two directions take turns instead of overlapping. Between pretend
 * hosts on a 1 Gbit/s link a 2-rank ring reached 48% of the link in one
 * message per step or in 1 MiB messages, 90-96% in 60 KiB messages
 * (docs/benchmarks.md). */
static dt_status mpi_sendrecv(dt_comm_t c, const dt_coll_args *a, const void *sbuf, size_t sbytes,
                              int to, void *rbuf, size_t rbytes, int from, size_t round_max) {
    (void)round_max;
    mpi_state *s = c->be;
    MPI_Request rq[2 * XCHG_WINDOW];
    /* way 0 receives, way 1 sends; a peer gets at least one (maybe empty) message */
    size_t total[2] = {rbytes, sbytes}, at[2] = {0, 0};
    size_t left[2] = {from < 0 ? 0 : (rbytes + XCHG_CHUNK - 1) / XCHG_CHUNK,
                      to < 0 ? 0 : (sbytes + XCHG_CHUNK - 1) / XCHG_CHUNK};
    for (int w = 0; w < 2; w++)
        if ((w ? to : from) >= 0 && !left[w]) left[w] = 1;
    for (int i = 0; i < 2 * XCHG_WINDOW; i++) rq[i] = MPI_REQUEST_NULL;
    dt_status rc = DT_OK;
    dt_waiter wt;
    dt_waiter_init(&wt, c->timeout, c->local_size);
    for (int idx = -1;;) {
        /* refill the slot that completed (every slot at the start) */
        for (int i = idx < 0 ? 0 : idx; i < (idx < 0 ? 2 * XCHG_WINDOW : idx + 1); i++) {
            int w = i / XCHG_WINDOW, e;
            if (!left[w]) continue;
            size_t len = total[w] - at[w] < XCHG_CHUNK ? total[w] - at[w] : XCHG_CHUNK;
            MPI_LOCK();
            if (w) e = MPI_Isend((const char *)sbuf + at[w], (int)len, MPI_BYTE, to, ALGO_TAG, s->comm, &rq[i]);
            else e = MPI_Irecv((char *)rbuf + at[w], (int)len, MPI_BYTE, from, ALGO_TAG, s->comm, &rq[i]);
            MPI_UNLOCK();
            if (e != MPI_SUCCESS) return mpi_err(dt_coll_name(a->kind), e);
            at[w] += len;
            left[w]--;
        }
        if ((rc = wait_any(c, 2 * XCHG_WINDOW, rq, &idx, a, &wt)) != DT_OK || idx == MPI_UNDEFINED) break;
    }
    return rc;
}

/* The mpi backend's choice: MPI's own collective unless DTRAIN_COMM_ALGO
 * forces one of dtrain's where it applies (ring, rhd: allreduce; tree:
 * broadcast, reduce) and the messages fit MPI's int counts. MPI libraries
 * already switch between such algorithms by size and rank count (Open
 * MPI's "tuned" component), tuned to the network, so auto is MPI's, except
 * for the allreduce between hier's host leaders (s->own): there dtrain's
 * ring (from 64 KiB; halving-doubling below) was 1.5-4.2x Open MPI's
 * MPI_Allreduce over TCP between pretend hosts on 1 Gbit/s links
 * (docs/benchmarks.md). */
static dt_algo mpi_choose(dt_comm_t c, const dt_coll_args *a) {
    mpi_state *s = c->be;
    dt_coll k = a->kind;
    size_t bytes = a->count * (is_half(a->dtype) ? sizeof(float) : dt_dtype_size(a->dtype));
    dt_algo algo = DT_ALGO_MPI;
    if (c->size > 1 && bytes <= INT_MAX / 2) {
        if ((s->algo == DT_ALGO_RING || s->algo == DT_ALGO_RHD) && k == DT_COLL_ALLREDUCE)
            algo = s->algo;
        if (s->algo == DT_ALGO_AUTO && s->own && k == DT_COLL_ALLREDUCE)
            algo = bytes < (64u << 10) ? DT_ALGO_RHD : DT_ALGO_RING;

        if (s->algo == DT_ALGO_TREE && (k == DT_COLL_BROADCAST || k == DT_COLL_REDUCE))
            algo = DT_ALGO_TREE;
    }
    // fp16/bf16 in 16 bits (half_collective), unless another algorithm is
    // forced (DTRAIN_COMM_ALGO=rsag names this one)
    if (c->size > 1 && is_half(a->dtype) &&
        (k == DT_COLL_ALLREDUCE || k == DT_COLL_REDUCE_SCATTER || k == DT_COLL_REDUCE) &&
        (s->algo == DT_ALGO_AUTO || s->algo == DT_ALGO_RSAG))
        algo = DT_ALGO_RSAG;
    dt_algo_log(c, a, bytes, algo);
    return algo;
}

// ----------------------------------------------------------------------------
// fp16/bf16 in 16 bits

/* One reduce-scatter of 16-bit elements, and for an allreduce (gather) the
 * allgather after it, without widening them on the wire: block p of every
 * rank's vector (cnt[p] elements at off[p] of send) goes to rank p
 * (MPI_Ialltoallv of bytes); each rank sums the n blocks it gets in fp32, in
 * rank order, and rounds once (dt_reduce_kernel: the shm backend's sum), into
 * mine; the allgather (MPI_Iallgatherv, in place in recv) then gives every
 * rank every block. Each rank sends (n-1)/n of the vector's 16-bit bytes in
 * each half, as a ring's reduce-scatter and allgather do: half of fp32's.
 * scratch holds n * cnt[rank] elements; iv 4n ints. */
static dt_status half_exchange(dt_comm_t c, const dt_coll_args *a, const char *send, char *recv, char *mine,
                               const size_t *cnt, const size_t *off, int gather, char *scratch, int *iv) {
    mpi_state *s = c->be;
    int n = c->size, me = c->rank;
    int *sc = iv, *sd = iv + n, *rcn = iv + 2 * n, *rd = iv + 3 * n;
    for (int p = 0; p < n; p++) {
        sc[p] = (int)(cnt[p] * 2);
        sd[p] = (int)(off[p] * 2);
        rcn[p] = (int)(cnt[me] * 2);
        rd[p] = (int)((size_t)p * cnt[me] * 2);
    }
    MPI_Request rq;
    CALL(MPI_Ialltoallv(send, sc, sd, MPI_BYTE, scratch, rcn, rd, MPI_BYTE, s->comm, &rq), a);
    dt_status rc = wait_req(c, &rq, a);
    if (rc != DT_OK) return rc;
    const void *src[256], **srcs = n <= 256 ? src : malloc((size_t)n * sizeof *srcs);
    if (!srcs) return dt_error(DT_ERR_NOMEM, "%s: out of memory", dt_coll_name(a->kind));
    for (int p = 0; p < n; p++) srcs[p] = scratch + (size_t)p * cnt[me] * 2;
    dt_reduce_kernel(mine, srcs, n, cnt[me], a->dtype, a->op, n);
    if (srcs != src) free(srcs);
    if (!gather) return DT_OK;
    CALL(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, recv, sc, sd, MPI_BYTE, s->comm, &rq), a);
    return wait_req(c, &rq, a);
}

/* A reduce of 16-bit elements to the root in 16 bits: every rank's vector
 * gathered there (MPI_Igather, pieces of 2^24 / n elements), summed in fp32
 * in rank order and rounded once. A rank other than the root sends its
 * vector's 16-bit bytes once, as in a reduce's tree. */
static dt_status half_reduce(dt_comm_t c, const dt_coll_args *a) {
    mpi_state *s = c->be;
    int n = c->size, root = c->rank == a->root;
    size_t piece = (((size_t)1 << 24) + (size_t)n - 1) / (size_t)n;
    size_t m = a->count < piece ? a->count : piece;
    char *scratch = root ? malloc((size_t)n * m * 2 + 2) : NULL;
    const void *src[256], **srcs = n <= 256 ? src : malloc((size_t)n * sizeof *srcs);
    if ((root && !scratch) || !srcs) {
        free(scratch);
        if (srcs != src) free(srcs);
        return dt_error(DT_ERR_NOMEM, "reduce: out of memory");
    }
    dt_status rc = DT_OK;
    for (size_t at = 0; at < a->count && rc == DT_OK; at += piece) {
        size_t len = a->count - at < piece ? a->count - at : piece;
        MPI_Request rq;
        MPI_LOCK();
        int e = MPI_Igather((const char *)a->send + at * 2, (int)(len * 2), MPI_BYTE, scratch, (int)(len * 2),
                            MPI_BYTE, a->root, s->comm, &rq);
        MPI_UNLOCK();
        rc = e == MPI_SUCCESS ? wait_req(c, &rq, a) : mpi_err("reduce", e);
        if (rc != DT_OK || !root) continue;
        for (int p = 0; p < n; p++) srcs[p] = scratch + (size_t)p * len * 2;
        dt_reduce_kernel((char *)a->recv + at * 2, srcs, n, len, a->dtype, a->op, n);
    }
    free(scratch);
    if (srcs != src) free(srcs);
    return rc;
}

/* An fp16/bf16 allreduce (recv_all), reduce-scatter (a->counts or
 * a->count a rank) or reduce in 16 bits: the first two through
 * half_exchange, the allreduce in pieces of at most 2^24 elements (bounded
 * scratch), split by dt_shard_range. */
static dt_status half_collective(dt_comm_t c, const dt_coll_args *a) {
    if (a->kind == DT_COLL_REDUCE) return half_reduce(c, a);
    int n = c->size, me = c->rank, ar = a->kind == DT_COLL_ALLREDUCE;
    size_t piece = (size_t)1 << 24, total = 0;
    size_t *cnt = malloc((size_t)n * 2 * sizeof *cnt);
    int *iv = malloc((size_t)n * 4 * sizeof *iv);
    char *scratch = NULL;
    dt_status rc = DT_OK;
    if (!cnt || !iv) goto nomem;
    size_t *off = cnt + n;
    if (!ar) {
        for (int p = 0; p < n; p++) {
            cnt[p] = a->counts ? a->counts[p] : a->count;
            off[p] = total;
            total += cnt[p];
        }
        if (total * 2 > INT_MAX) {
            rc = dt_error(DT_ERR_ARG, "reduce_scatter (seq %llu): %zu elements exceed MPI's int counts",
                          (unsigned long long)a->seq, total);
            goto done;
        }
        if (!(scratch = malloc((size_t)n * cnt[me] * 2 + 2))) goto nomem;
        // In place (recv at this rank's block of send) works too: the
        // blocks are all sent before the sum is written.
        rc = half_exchange(c, a, a->send, NULL, a->recv, cnt, off, 0, scratch, iv);
        goto done;
    }
    if (a->send != a->recv && a->count) memcpy(a->recv, a->send, a->count * 2);
    size_t m = a->count < piece ? a->count : piece;
    if (!(scratch = malloc(((m + (size_t)n - 1) / (size_t)n) * (size_t)n * 2 + 2))) goto nomem;
    for (size_t at = 0; at < a->count && rc == DT_OK; at += piece) {
        size_t len = a->count - at < piece ? a->count - at : piece;
        for (int p = 0; p < n; p++) {
            size_t b, e;
            dt_shard_range(len, p, n, &b, &e);
            cnt[p] = e - b;
            off[p] = b;
        }
        char *v = (char *)a->recv + at * 2;
        rc = half_exchange(c, a, v, v, v + off[me] * 2, cnt, off, 1, scratch, iv);
    }
    goto done;
nomem:
    rc = dt_error(DT_ERR_NOMEM, "%s: out of memory", dt_coll_name(a->kind));
done:
    free(scratch);
    free(iv);
    free(cnt);
    return rc;
}

/* Runs MPI_Iallreduce over chunks of at most INT_MAX/2 elements. */
static dt_status mpi_allreduce(dt_comm_t c, const dt_coll_args *a) {
    switch (mpi_choose(c, a)) {
    case DT_ALGO_RING: return dt_algo_ring_allreduce(c, a, mpi_sendrecv);
    case DT_ALGO_RHD: return dt_algo_rhd_allreduce(c, a, mpi_sendrecv);
    case DT_ALGO_RSAG: return half_collective(c, a);
    default: break;
    }
    size_t es = dt_dtype_size(a->dtype), step = INT_MAX / 2;
    if (is_half(a->dtype)) step = 1u << 22; /* bounded fp32 scratch */
    float *tmp = NULL;
    if (is_half(a->dtype) && a->count) {
        tmp = malloc((a->count < step ? a->count : step) * sizeof(float));
        if (!tmp) return dt_error(DT_ERR_NOMEM, "allreduce: out of memory");
    }
    dt_status rc = DT_OK;
    for (size_t off = 0; off < a->count && rc == DT_OK; off += step) {
        size_t n = a->count - off < step ? a->count - off : step;
        const char *snd = (const char *)a->send + off * es;
        char *rcv = (char *)a->recv + off * es;
        if (tmp) {
            dt_to_f32(tmp, snd, n, a->dtype);
            rc = mpi_allreduce_chunk(c, a, tmp, tmp, n);
            if (a->op == DT_AVG)
                for (size_t i = 0; i < n; i++) tmp[i] /= (float)c->size;
            dt_from_f32(rcv, tmp, n, a->dtype);
        } else {
            rc = mpi_allreduce_chunk(c, a, snd, rcv, n);
            if (rc == DT_OK) finish_avg(rcv, n, a->dtype, a->op, c->size);
        }
    }
    free(tmp);
    return rc;
}

static dt_status mpi_reduce(dt_comm_t c, const dt_coll_args *a) {
    dt_algo algo = mpi_choose(c, a);
    if (algo == DT_ALGO_TREE) return dt_algo_tree_reduce(c, a, mpi_sendrecv);
    if (algo == DT_ALGO_RSAG) return half_collective(c, a);
    mpi_state *s = c->be;
    size_t es = dt_dtype_size(a->dtype), step = is_half(a->dtype) ? 1u << 22 : INT_MAX / 2;
    int root = c->rank == a->root;
    float *tin = NULL, *tout = NULL;
    if (is_half(a->dtype) && a->count) {
        size_t m = a->count < step ? a->count : step;
        tin = malloc(m * sizeof(float));
        tout = malloc(m * sizeof(float));
        if (!tin || !tout) {
            free(tin);
            free(tout);
            return dt_error(DT_ERR_NOMEM, "reduce: out of memory");
        }
    }
    dt_status rc = DT_OK;
    for (size_t off = 0; off < a->count && rc == DT_OK; off += step) {
        size_t n = a->count - off < step ? a->count - off : step;
        const void *snd = (const char *)a->send + off * es;
        void *rcv = root ? (char *)a->recv + off * es : NULL;
        if (tin) {
            dt_to_f32(tin, snd, n, a->dtype);
            snd = tin;
            rcv = tout;
        }
        const void *sb = root && snd == rcv ? MPI_IN_PLACE : snd;
        MPI_Request rq;
        CALL(MPI_Ireduce(sb, rcv, (int)n, mpi_type(a->dtype), mpi_op(a->op), a->root, s->comm,
                         &rq),
             a);
        rc = wait_req(c, &rq, a);
        if (rc == DT_OK && root) {
            if (tin) {
                if (a->op == DT_AVG)
                    for (size_t i = 0; i < n; i++) tout[i] /= (float)c->size;
                dt_from_f32((char *)a->recv + off * es, tout, n, a->dtype);
            } else {
                finish_avg(rcv, n, a->dtype, a->op, c->size);
            }
        }
    }
    free(tin);
    free(tout);
    return rc;
}

/* With a->counts (hier's leaders), rank p's block has counts[p] elements. */
static dt_status mpi_reduce_scatter(dt_comm_t c, const dt_coll_args *a) {
    if (mpi_choose(c, a) == DT_ALGO_RSAG) return half_collective(c, a);
    mpi_state *s = c->be;
    size_t es = dt_dtype_size(a->dtype), rcnt = a->counts ? a->counts[c->rank] : a->count;
    size_t total = rcnt * (size_t)c->size;
    int counts[64], *ic = NULL;
    if (a->counts) {
        ic = c->size <= 64 ? counts : malloc((size_t)c->size * sizeof(int));
        if (!ic) return dt_error(DT_ERR_NOMEM, "reduce_scatter: out of memory");
        total = 0;
        for (int p = 0; p < c->size; p++) {
            total += a->counts[p];
            ic[p] = (int)a->counts[p];
        }
    }
    if (total > INT_MAX) {
        if (ic != counts) free(ic);
        return dt_error(DT_ERR_ARG, "reduce_scatter (seq %llu): %zu elements exceed MPI's int counts",
                        (unsigned long long)a->seq, total);
    }
    const void *snd = a->send;
    void *rcv = a->recv;
    float *tin = NULL, *tout = NULL;
    void *scratch = NULL;
    if (is_half(a->dtype)) {
        tin = malloc(total * sizeof(float) + 4);
        tout = malloc(rcnt * sizeof(float) + 4);
        if (!tin || !tout) {
            free(tin);
            free(tout);
            if (ic != counts) free(ic);
            return dt_error(DT_ERR_NOMEM, "reduce_scatter: out of memory");
        }
        dt_to_f32(tin, snd, total, a->dtype);
        snd = tin;
        rcv = tout;
    } else if (rcv != snd && (char *)rcv < (const char *)snd + total * es &&
               (char *)rcv + rcnt * es > (const char *)snd) {
        /* overlapping but not MPI_IN_PLACE-shaped: go through scratch */
        scratch = malloc(rcnt * es + 1);
        if (!scratch) {
            if (ic != counts) free(ic);
            return dt_error(DT_ERR_NOMEM, "reduce_scatter: out of memory");
        }
        rcv = scratch;
    }
    MPI_Request rq;
    dt_status rc;
    MPI_LOCK();
    const void *sb = snd == rcv ? MPI_IN_PLACE : snd;
    void *rb = (void *)(snd == rcv ? snd : rcv);
    int e = ic ? MPI_Ireduce_scatter(sb, rb, ic, mpi_type(a->dtype), mpi_op(a->op), s->comm, &rq)
               : MPI_Ireduce_scatter_block(sb, rb, (int)rcnt, mpi_type(a->dtype), mpi_op(a->op),
                                           s->comm, &rq);
    MPI_UNLOCK();
    rc = e == MPI_SUCCESS ? wait_req(c, &rq, a) : mpi_err("reduce_scatter", e);
    if (rc == DT_OK) {
        if (tin) {
            if (a->op == DT_AVG)
                for (size_t i = 0; i < rcnt; i++) tout[i] /= (float)c->size;
            dt_from_f32(a->recv, tout, rcnt, a->dtype);
        } else {
            if (scratch) memcpy(a->recv, scratch, rcnt * es);
            finish_avg(a->recv, rcnt, a->dtype, a->op, c->size);
        }
    }
    free(tin);
    free(tout);
    free(scratch);
    if (ic != counts) free(ic);
    return rc;
}

static dt_status mpi_allgatherv(dt_comm_t c, const dt_coll_args *a) {
    mpi_state *s = c->be;
    size_t es = dt_dtype_size(a->dtype);
    int n = c->size;
    int *ic = malloc((size_t)n * 2 * sizeof(int));
    if (!ic) return dt_error(DT_ERR_NOMEM, "allgather: out of memory");
    for (int p = 0; p < n; p++) {
        size_t bytes = a->counts[p] * es, disp = a->displs[p] * es;
        if (bytes > INT_MAX || disp > INT_MAX) {
            free(ic);
            return dt_error(DT_ERR_ARG, "allgather (seq %llu): block of rank %d exceeds MPI's int counts",
                            (unsigned long long)a->seq, p);
        }
        ic[p] = (int)bytes;
        ic[n + p] = (int)disp;
    }
    const void *snd = a->send;
    if ((const char *)snd == (const char *)a->recv + a->displs[c->rank] * es) snd = MPI_IN_PLACE;
    MPI_Request rq;
    MPI_LOCK();
    int e = MPI_Iallgatherv(snd, (int)(a->count * es), MPI_BYTE, a->recv, ic, ic + n, MPI_BYTE,
                            s->comm, &rq);
    MPI_UNLOCK();
    dt_status rc = e == MPI_SUCCESS ? wait_req(c, &rq, a) : mpi_err("allgather", e);
    free(ic);
    return rc;
}

static dt_status mpi_broadcast(dt_comm_t c, const dt_coll_args *a) {
    if (mpi_choose(c, a) == DT_ALGO_TREE) return dt_algo_tree_broadcast(c, a, mpi_sendrecv);
    mpi_state *s = c->be;
    size_t es = dt_dtype_size(a->dtype), bytes = a->count * es, step = INT_MAX / 2;
    if (c->rank == a->root && a->send != a->recv && bytes) memmove(a->recv, a->send, bytes);
    for (size_t off = 0; off < bytes; off += step) {
        size_t m = bytes - off < step ? bytes - off : step;
        MPI_Request rq;
        CALL(MPI_Ibcast((char *)a->recv + off, (int)m, MPI_BYTE, a->root, s->comm, &rq), a);
        dt_status rc = wait_req(c, &rq, a);
        if (rc != DT_OK) return rc;
    }
    return DT_OK;
}

static dt_status mpi_barrier(dt_comm_t c, const dt_coll_args *a) {
    mpi_state *s = c->be;
    MPI_Request rq;
    CALL(MPI_Ibarrier(s->comm, &rq), a);
    return wait_req(c, &rq, a);
}

// ----------------------------------------------------------------------------
// point to point, never blocking (the front end waits and keeps deadlines)

#define P2P_TAG 7301
_Static_assert(sizeof(MPI_Request) <= sizeof(((dt_p2p *)0)->be), "dt_p2p.be too small");

static dt_status mpi_p2p_progress(dt_comm_t c, dt_p2p *p, int slow, int *moved) {
    mpi_state *s = c->be;
    const dt_coll_args *a = &p->args;
    MPI_Request *rq = (MPI_Request *)p->be;
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    char what[96];
    snprintf(what, sizeof what, "%s (%zu x %s, peer %d)", dt_coll_name(a->kind), a->count,
             dt_dtype_name(a->dtype), a->root);
    if (bytes > INT_MAX) return dt_error(DT_ERR_ARG, "%s: %zu bytes exceed MPI's int counts", what, bytes);
    int rc = MPI_SUCCESS;
    if (!p->started) *rq = MPI_REQUEST_NULL;
    if (!p->started && a->kind == DT_COLL_SEND) {
        MPI_LOCK();
        rc = MPI_Isend(a->send, (int)bytes, MPI_BYTE, a->root, P2P_TAG, s->comm, rq);
        MPI_UNLOCK();
        p->started = 1;
    } else if (!p->started) {
        /* a matched probe first, so that a size mismatch is an error, not a
         * truncation */
        int flag = 0, got = 0;
        MPI_Message msg;
        MPI_Status st;
        MPI_LOCK();
        MPI_Improbe(a->root, P2P_TAG, s->comm, &flag, &msg, &st);
        if (flag) {
            MPI_Get_count(&st, MPI_BYTE, &got);
            if ((size_t)got == bytes) {
                rc = MPI_Imrecv(a->recv, (int)bytes, MPI_BYTE, &msg, rq);
                p->started = 1;
            } else {
                char *junk = malloc((size_t)got + 1);
                MPI_Mrecv(junk, got, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
                free(junk);
            }
        }
        MPI_UNLOCK();
        if (flag && (size_t)got != bytes)
            return dt_error(DT_ERR_COMM, "%s on rank %d: message of %d bytes, expected %zu", what,
                            c->rank, got, bytes);
    }
    if (rc != MPI_SUCCESS) return mpi_err(what, rc);
    if (p->started) {
        int done = 0;
        MPI_LOCK();
        rc = MPI_Test(rq, &done, MPI_STATUS_IGNORE);
        MPI_UNLOCK();
        if (rc != MPI_SUCCESS) return mpi_err(what, rc);
        if (done) {
            p->done = 1;
            *moved = 1;
            return DT_OK;
        }
    }
    return slow ? check_abort(c, what) : DT_OK;
}

static void mpi_p2p_cancel(dt_comm_t c, dt_p2p *p) {
    (void)c;
    MPI_Request *rq = (MPI_Request *)p->be;
    if (*rq == MPI_REQUEST_NULL) return;
    MPI_LOCK();
    MPI_Cancel(rq);
    MPI_Request_free(rq);
    MPI_UNLOCK();
}

// ----------------------------------------------------------------------------
// creation, split, destroy

/* Fills rank, size and the host layout of c from an MPI communicator (which
 * c then owns). DTRAIN_FAKE_NODES=k pretends the ranks are spread over k
 * hosts in contiguous blocks (k:cyclic: round robin), to test the
 * hierarchical path on one host. */
dt_status dt_mpi_attach(dt_comm_t c, MPI_Comm comm) {
    mpi_state *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "mpi backend: out of memory");
    s->comm = comm;
    s->algo = dt_algo_from_env();
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    s->win = MPI_WIN_NULL;
    if (MPI_Win_allocate(sizeof(uint64_t), sizeof(uint64_t), MPI_INFO_NULL, comm, &s->at,
                         &s->win) == MPI_SUCCESS) {
        MPI_Win_set_errhandler(s->win, MPI_ERRORS_RETURN);
        *s->at = 0;
        MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win);
    } else {
        s->win = MPI_WIN_NULL;
    }
    const char *fake = getenv("DTRAIN_FAKE_NODES");
    int k = fake ? atoi(fake) : 0, cyclic = fake && strstr(fake, ":cyclic");
    int rc;
    if (k > 1) {
        if (k > c->size) k = c->size;
        int per = (c->size + k - 1) / k;
        rc = MPI_Comm_split(comm, cyclic ? c->rank % k : c->rank / per, c->rank, &s->node_comm);
    } else {
        rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &s->node_comm);
    }
    if (rc != MPI_SUCCESS) {
        free(s);
        return mpi_err("splitting ranks by host", rc);
    }
    MPI_Comm_rank(s->node_comm, &c->local_rank);
    MPI_Comm_size(s->node_comm, &c->local_size);
    /* node index = rank of the host's first rank among the hosts' first ranks */
    MPI_Comm lead;
    MPI_Comm_split(comm, c->local_rank == 0 ? 0 : MPI_UNDEFINED, c->rank, &lead);
    int ids[2] = {0, 0};
    if (lead != MPI_COMM_NULL) {
        MPI_Comm_rank(lead, &ids[0]);
        MPI_Comm_size(lead, &ids[1]);
        MPI_Comm_free(&lead);
    }
    MPI_Bcast(ids, 2, MPI_INT, 0, s->node_comm);
    c->node = ids[0];
    c->nnodes = ids[1];
    c->be = s;
    c->ops = &dt_mpi_ops;
    return DT_OK;
}

void dt_mpi_name_ranks(dt_comm_t c, MPI_Comm parent) {
    mpi_state *s = c->be;
    int *idx = malloc((size_t)c->size * sizeof(int));
    s->names = malloc((size_t)c->size * sizeof(int));
    if (!idx || !s->names) {
        free(idx);
        free(s->names);
        s->names = NULL;
        return;
    }
    for (int i = 0; i < c->size; i++) idx[i] = i;
    MPI_Group mine, theirs;
    MPI_Comm_group(s->comm, &mine);
    MPI_Comm_group(parent, &theirs);
    MPI_Group_translate_ranks(mine, c->size, idx, theirs, s->names);
    MPI_Group_free(&mine);
    MPI_Group_free(&theirs);
    free(idx);
}

dt_status dt_mpi_init_world(dt_comm_t c) {
    dt_status rc = dt_mpi_library_init();
    if (rc != DT_OK) return rc;
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    rc = dt_mpi_attach(c, dup);
    if (rc != DT_OK) {
        MPI_Comm_free(&dup);
        return rc;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &c->world_rank);
    ((mpi_state *)c->be)->world = 1;
    return DT_OK;
}

static dt_status mpi_split(dt_comm_t parent, dt_comm_t child, const int *members, int nmembers,
                           int color, int color_index) {
    (void)members;
    (void)nmembers;
    (void)color_index;
    mpi_state *ps = parent->be;
    MPI_Comm out;
    int key = child ? child->rank : 0;
    int rc = MPI_Comm_split(ps->comm, child ? color : MPI_UNDEFINED, key, &out);
    if (rc != MPI_SUCCESS) return mpi_err("dt_comm_split", rc);
    if (!child) return DT_OK;
    return dt_mpi_attach(child, out);
}

static void mpi_destroy(dt_comm_t c) {
    mpi_state *s = c->be;
    if (!s) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        /* The window stays until MPI_Finalize releases it: MPI_Win_free
         * waits for every rank of the window, and destroying a communicator
         * must not (a peer that saw it break never frees its side). One
         * 8-byte window per communicator ever created. */
        if (s->node_comm != MPI_COMM_NULL) MPI_Comm_free(&s->node_comm);
        MPI_Comm_free(&s->comm);
    }
    free(s->names);
    free(s);
    c->be = NULL;
}

const struct dt_comm_ops dt_mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgatherv = mpi_allgatherv,
    .broadcast = mpi_broadcast,
    .reduce = mpi_reduce,
    .barrier = mpi_barrier,
    .p2p_progress = mpi_p2p_progress,
    .p2p_cancel = mpi_p2p_cancel,
    .split = mpi_split,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};
