/*
 * comm.c - the communicator front end.
 *
 * dt_comm_init takes the backend from the registry's table (registry.h):
 * this file names no backend and has no #ifdef for one.
 *
 * What happens in a collective call, in order:
 *   1. validate the arguments (DT_ERR_ARG leaves the communicator usable);
 *   2. fail at once if the communicator is already broken (sticky error);
 *   3. number the call (seq 1, 2, ...), used in every error message;
 *   4. if non-blocking calls are still queued, queue this one behind them
 *      and wait, so that the order of operations is the order of calls;
 *   5. in check mode, allgather a small descriptor (op, count, dtype, root)
 *      and compare it across ranks;
 *   6. run the backend's function from the ops table;
 *   7. on DT_ERR_COMM / DT_ERR_TIMEOUT, mark the communicator broken.
 *
 * Non-blocking calls copy their arguments into a request and append it to a
 * FIFO that one progress thread per communicator serves (created on first
 * use). The thread sleeps on a condition variable when idle, so it costs
 * nothing between operations.
 *
 * Point to point is different: a send must be able to wait for its
 * receiver while the same rank waits in a collective or for the opposite
 * transfer, so transfers are not queued behind each other but progressed
 * together, in small non-blocking moves (the backend's p2p_progress), by
 * whoever waits for one and, once dt_isend/dt_irecv were used, by a second
 * background thread. Each has its own deadline: the timeout counts from the
 * last time it moved.
 */
#include "comm/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ----------------------------------------------------------------------------
// names

const char *dt_coll_name(dt_coll k) {
    static const char *names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                  "reduce",    "barrier",        "send",      "recv"};
    return (unsigned)k < DT_COLL_COUNT_ ? names[k] : "?";
}

const char *dt_redop_name(dt_redop op) {
    static const char *names[] = {"sum", "avg", "max", "min"};
    return (unsigned)op <= DT_MIN ? names[op] : "?";
}

// ----------------------------------------------------------------------------
// communicator objects

dt_comm_t dt_comm_alloc(void) {
    dt_comm_t c = calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->err_lock, NULL);
    pthread_mutex_init(&c->q_lock, NULL);
    pthread_cond_init(&c->q_cond, NULL);
    pthread_mutex_init(&c->obs_lock, NULL);
    pthread_cond_init(&c->p2p_cond, NULL);
    c->nnodes = 1;
    dt_comm_defaults(c);
    return c;
}

void dt_comm_defaults(dt_comm_t c) {
    c->timeout = 300.0;
    const char *t = getenv("DTRAIN_COMM_TIMEOUT");
    if (t && *t) {
        char *end;
        double v = strtod(t, &end);
        if (*end == 0 && v > 0) c->timeout = v;
        else dt_log(DT_LOG_WARN, "DTRAIN_COMM_TIMEOUT=%s is not a positive number of seconds", t);
    }
#ifdef NDEBUG
    c->check = 0;
#else
    c->check = 1;
#endif
    const char *k = getenv("DTRAIN_COMM_CHECK");
    if (k && *k) c->check = strcmp(k, "0") != 0;
}

dt_status dt_comm_fail(dt_comm_t c, dt_status s, const char *msg) {
    pthread_mutex_lock(&c->err_lock);
    if (atomic_load(&c->err) == DT_OK) {
        snprintf(c->err_msg, sizeof c->err_msg, "%s", msg);
        atomic_store(&c->err, (int)s);
    }
    pthread_mutex_unlock(&c->err_lock);
    return s;
}

static dt_status sticky(dt_comm_t c) {
    dt_status s = (dt_status)atomic_load(&c->err);
    if (s == DT_OK) return DT_OK;
    pthread_mutex_lock(&c->err_lock);
    dt_error(s, "communicator is broken: %s", c->err_msg);
    pthread_mutex_unlock(&c->err_lock);
    return s;
}

dt_comm_params dt_comm_default_params(void) {
    dt_comm_params p = {.backend = NULL, .rank = -1, .size = -1, .shm_name = NULL,
                        .timeout = 0, .check = -1};
    return p;
}

dt_status dt_comm_init_env(dt_comm_t *out) {
    dt_comm_params p = dt_comm_default_params();
    return dt_comm_init(&p, out);
}

// The backend named by p->backend or DTRAIN_COMM_BACKEND ("auto" or unset:
// the first one whose launcher started us, else the first), from the
// registry's table.
static dt_status pick_backend(const dt_comm_params *p, const dt_comm_backend_entry **out) {
    int n;
    const dt_comm_backend_entry *t = dt_comm_backends(&n);
    const char *be = p->backend ? p->backend : getenv("DTRAIN_COMM_BACKEND");
    if (be && *be && strcmp(be, "auto")) {
        for (int i = 0; i < n; i++)
            if (!strcmp(be, t[i].name)) {
                if (t[i].missing) return dt_error(DT_ERR_CONFIG, "backend %s: %s", be, t[i].missing);
                *out = &t[i];
                return DT_OK;
            }
        char names[256] = "";
        size_t len = 0;
        for (int i = 0; i < n && len < sizeof names; i++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "", t[i].name);
        return dt_error(DT_ERR_CONFIG, "%s=%s: expected %s or auto",
                        p->backend ? "backend" : "DTRAIN_COMM_BACKEND", be, names);
    }
    *out = &t[0];
    for (int i = 0; i < n; i++)
        if (t[i].launched && t[i].launched(p)) {
            *out = &t[i];
            return DT_OK;
        }
    // srun started several tasks but gave none of them MPI's environment
    // (PMIx or PMI-2): each would be a world of 1 and train alone.
    const char *ntasks = getenv("SLURM_STEP_NUM_TASKS");
    if (ntasks && atoi(ntasks) > 1)
        return dt_error(DT_ERR_CONFIG,
                        "SLURM_STEP_NUM_TASKS=%s: srun started %s tasks without MPI's environment, so each would "
                        "train alone; run srun --mpi=pmix (or set MpiDefault=pmix in slurm.conf), or force "
                        "DTRAIN_COMM_BACKEND=shm for separate runs",
                        ntasks, ntasks);
    return DT_OK;
}

dt_status dt_comm_init(const dt_comm_params *p, dt_comm_t *out) {
    if (!out || !p) return dt_error(DT_ERR_ARG, "dt_comm_init: NULL argument");
    *out = NULL;
    const dt_comm_backend_entry *be;
    dt_status rc = pick_backend(p, &be);
    if (rc != DT_OK) return rc;
    dt_comm_t c = dt_comm_alloc();
    if (!c) return dt_error(DT_ERR_NOMEM, "dt_comm_init: out of memory");
    if (p->timeout > 0) c->timeout = p->timeout;
    if (p->check >= 0) c->check = !!p->check;
    rc = be->init_world(c, p);
    if (rc != DT_OK) {
        dt_comm_destroy(c);
        return rc;
    }
    *out = c;
    dt_log(DT_LOG_DEBUG, "comm: rank %d of %d, backend %s, node %d of %d", c->rank, c->size,
           c->ops->name, c->node, c->nnodes);
    return DT_OK;
}

int dt_comm_env_launched(void) {
    dt_comm_params p = dt_comm_default_params();
    int n;
    const dt_comm_backend_entry *t = dt_comm_backends(&n);
    for (int i = 0; i < n; i++)
        if (t[i].launched && t[i].launched(&p)) return 1;
    return 0;
}

int dt_comm_rank(dt_comm_t c) { return c ? c->rank : -1; }
int dt_comm_size(dt_comm_t c) { return c ? c->size : 0; }
int dt_comm_local_rank(dt_comm_t c) { return c ? c->local_rank : -1; }
int dt_comm_local_size(dt_comm_t c) { return c ? c->local_size : 0; }
int dt_comm_node(dt_comm_t c) { return c ? c->node : -1; }
int dt_comm_nnodes(dt_comm_t c) { return c ? c->nnodes : 0; }
const char *dt_comm_backend(dt_comm_t c) { return c && c->ops ? c->ops->name : "none"; }

void dt_comm_set_timeout(dt_comm_t c, double seconds) {
    if (c && seconds > 0) c->timeout = seconds;
}
double dt_comm_timeout(dt_comm_t c) { return c ? c->timeout : 0; }
void dt_comm_set_check(dt_comm_t c, int on) {
    if (c) c->check = !!on;
}

dt_status dt_comm_get_async_error(dt_comm_t c) {
    if (!c) return dt_error(DT_ERR_ARG, "dt_comm_get_async_error: NULL communicator");
    return sticky(c);
}

dt_status dt_comm_abort(dt_comm_t c, const char *reason) {
    if (!c) return DT_OK;
    if (c->ops && c->ops->abort) c->ops->abort(c, reason);
    char msg[400];
    snprintf(msg, sizeof msg, "aborted by rank %d: %s", c->rank, reason ? reason : "");
    dt_comm_fail(c, DT_ERR_COMM, msg);
    return DT_OK;
}

dt_status dt_comm_rejoin(dt_comm_t c, double timeout) {
    if (!c) return dt_error(DT_ERR_ARG, "dt_comm_rejoin: NULL communicator");
    if (!c->ops->rejoin)
        return dt_error(DT_ERR_ARG, "dt_comm_rejoin: the %s backend cannot take a new process in a rank's place",
                        c->ops->name);
    if (timeout <= 0) timeout = c->timeout;
    // Queued collectives fail at once on a broken communicator; wait for
    // them (bounded) so that none runs into the new generation.
    double until = dt_now() + timeout;
    pthread_mutex_lock(&c->q_lock);
    while (c->q_pending && dt_now() < until) {
        pthread_mutex_unlock(&c->q_lock);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c->q_lock);
    }
    int pending = c->q_pending, p2p = c->p2p_head != NULL;
    pthread_mutex_unlock(&c->q_lock);
    if (pending || p2p)
        return dt_error(DT_ERR_ARG, "dt_comm_rejoin on rank %d: %s still in flight; wait for them first", c->rank,
                        p2p ? "point-to-point transfers" : "non-blocking collectives");
    uint64_t gen = 0;
    dt_status rc = c->ops->rejoin(c, timeout, &gen);
    if (rc != DT_OK) return rc;
    pthread_mutex_lock(&c->err_lock);
    c->seq = 0;
    c->nsplits = 0;  // (a split's name has the generation in it: the newcomer's count starts at 0 too)
    c->gen = gen;
    c->err_msg[0] = 0;
    atomic_store(&c->err, DT_OK);
    pthread_mutex_unlock(&c->err_lock);
    dt_log(DT_LOG_DEBUG, "comm: rank %d of %d joined generation %llu", c->rank, c->size, (unsigned long long)gen);
    return DT_OK;
}

uint64_t dt_comm_generation(dt_comm_t c) { return c ? c->gen : 0; }

// ----------------------------------------------------------------------------
// running one collective

/* The descriptor compared across ranks in check mode. */
typedef struct {
    int64_t kind, count, dtype, op, root, seq;
} check_desc;

static void desc_str(char *b, size_t n, int rank, const check_desc *d) {
    snprintf(b, n, "rank %d: %s count=%lld dtype=%s op=%s root=%lld seq=%lld", rank,
             dt_coll_name((dt_coll)d->kind), (long long)d->count,
             dt_dtype_name((dt_dtype)d->dtype), dt_redop_name((dt_redop)d->op),
             (long long)d->root, (long long)d->seq);
}

static dt_status check_args(dt_comm_t c, const dt_coll_args *a) {
    int n = c->size;
    check_desc me = {a->kind, (int64_t)a->count, a->dtype, a->op, a->root, (int64_t)a->seq};
    /* fields that do not apply are zeroed so they never differ */
    if (a->kind != DT_COLL_ALLREDUCE && a->kind != DT_COLL_REDUCE &&
        a->kind != DT_COLL_REDUCE_SCATTER)
        me.op = 0;
    if (a->kind != DT_COLL_BROADCAST && a->kind != DT_COLL_REDUCE) me.root = 0;
    if (a->kind == DT_COLL_BARRIER) me.count = me.dtype = 0;
    check_desc *all = malloc((size_t)n * sizeof *all);
    size_t *cnt = malloc((size_t)n * 2 * sizeof(size_t));
    if (!all || !cnt) {
        free(all);
        free(cnt);
        return dt_error(DT_ERR_NOMEM, "check mode: out of memory");
    }
    size_t w = sizeof(check_desc) / sizeof(int64_t);
    for (int p = 0; p < n; p++) {
        cnt[p] = w;
        cnt[n + p] = (size_t)p * w;
    }
    dt_coll_args g = {.kind = DT_COLL_ALLGATHERV, .send = &me, .recv = all, .count = w,
                      .dtype = DT_I64, .counts = cnt, .displs = cnt + n, .seq = a->seq,
                      .check_of = (int)a->kind + 1};
    dt_status rc = c->ops->allgatherv(c, &g);
    if (rc == DT_OK) {
        int bad = -1;
        for (int p = 0; p < n && bad < 0; p++) {
            check_desc d = all[p], m = me;
            if (a->kind == DT_COLL_ALLGATHERV) { /* each rank's count is its own */
                if ((size_t)d.count != a->counts[p]) bad = p;
                d.count = m.count = 0;
            }
            if (memcmp(&d, &m, sizeof d)) bad = p;
        }
        if (bad >= 0) {
            char s1[200], s2[200];
            desc_str(s1, sizeof s1, c->rank, &me);
            desc_str(s2, sizeof s2, bad, &all[bad]);
            if (a->kind == DT_COLL_ALLGATHERV)
                rc = dt_error(DT_ERR_COMM,
                              "%s seq %llu: argument mismatch across ranks (check mode): %s "
                              "(expects counts[%d]=%zu) vs %s",
                              dt_coll_name(a->kind), (unsigned long long)a->seq, s1, bad,
                              a->counts[bad], s2);
            else
                rc = dt_error(DT_ERR_COMM,
                              "%s seq %llu: argument mismatch across ranks (check mode): %s vs %s",
                              dt_coll_name(a->kind), (unsigned long long)a->seq, s1, s2);
        }
    }
    free(all);
    free(cnt);
    return rc;
}

// Bytes this rank sends and receives in collective a, as a ring algorithm
// moves them (see dt_comm_stats in comm.h).
static void ring_bytes(dt_comm_t c, const dt_coll_args *a, uint64_t *sent, uint64_t *recv) {
    uint64_t n = (uint64_t)c->size, es = dt_dtype_size(a->dtype), S = (uint64_t)a->count * es;
    *sent = *recv = 0;
    switch (a->kind) {
    case DT_COLL_ALLREDUCE: *sent = *recv = 2 * (n - 1) * S / n; break;
    case DT_COLL_REDUCE_SCATTER: *sent = *recv = (n - 1) * S; break;
    case DT_COLL_ALLGATHERV: {
        uint64_t tot = 0;
        for (int p = 0; p < c->size; p++) tot += (uint64_t)a->counts[p] * es;
        *sent = *recv = tot - S;
        break;
    }
    case DT_COLL_BROADCAST:
        if (c->rank == a->root) *sent = (n - 1) * S;
        else *recv = S;
        break;
    case DT_COLL_REDUCE:
        if (c->rank == a->root) *recv = (n - 1) * S;
        else *sent = S;
        break;
    case DT_COLL_SEND: *sent = S; break;
    case DT_COLL_RECV: *recv = S; break;
    default: break;
    }
}

// Counts a completed collective and tells the observer.
static void account(dt_comm_t c, const dt_coll_args *a, double t0, double t1) {
    uint64_t sent, recv;
    ring_bytes(c, a, &sent, &recv);
    atomic_fetch_add_explicit(&c->st_ops, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->st_sent, sent, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->st_recv, recv, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->st_busy_ns, (uint64_t)((t1 - t0) * 1e9), memory_order_relaxed);
    if (!atomic_load_explicit(&c->obs_set, memory_order_acquire)) return;  // no lock on the fast path
    pthread_mutex_lock(&c->obs_lock);
    if (c->obs_fn) c->obs_fn(dt_coll_name(a->kind), a->seq, sent + recv, t0, t1, c->obs_user);
    pthread_mutex_unlock(&c->obs_lock);
}

void dt_comm_get_stats(dt_comm_t c, dt_comm_stats *out) {
    memset(out, 0, sizeof *out);
    if (!c) return;
    out->ops = atomic_load(&c->st_ops);
    out->bytes_sent = atomic_load(&c->st_sent);
    out->bytes_recv = atomic_load(&c->st_recv);
    out->busy_seconds = (double)atomic_load(&c->st_busy_ns) * 1e-9;
}

void dt_comm_set_observer(dt_comm_t c, dt_comm_observer fn, void *user) {
    if (!c) return;
    pthread_mutex_lock(&c->obs_lock);
    c->obs_fn = fn;
    atomic_store_explicit(&c->obs_set, fn != NULL, memory_order_release);
    c->obs_user = user;
    pthread_mutex_unlock(&c->obs_lock);
}

/* After DT_ERR_COMM / DT_ERR_TIMEOUT (dt_last_error() says why): tell the
 * peers, so that they fail now rather than at their timeout, and mark the
 * communicator broken. Returns rc. */
static dt_status broken(dt_comm_t c, dt_status rc) {
    if (rc == DT_ERR_COMM || rc == DT_ERR_TIMEOUT) {
        if (atomic_load(&c->err) == DT_OK && c->ops->abort) c->ops->abort(c, dt_last_error());
        dt_comm_fail(c, rc, dt_last_error());
    }
    return rc;
}

/* Runs a validated, numbered collective on the calling thread. */
static dt_status execute(dt_comm_t c, const dt_coll_args *a) {
    dt_status rc = sticky(c);
    if (rc != DT_OK) return rc;
    double t0 = dt_now();
    if (c->check && c->size > 1) {
        rc = check_args(c, a);
        if (rc != DT_OK) goto err;
    }
    const struct dt_comm_ops *o = c->ops;
    switch (a->kind) {
    case DT_COLL_ALLREDUCE: rc = o->allreduce(c, a); break;
    case DT_COLL_REDUCE_SCATTER: rc = o->reduce_scatter(c, a); break;
    case DT_COLL_ALLGATHERV: rc = o->allgatherv(c, a); break;
    case DT_COLL_BROADCAST: rc = o->broadcast(c, a); break;
    case DT_COLL_REDUCE: rc = o->reduce(c, a); break;
    case DT_COLL_BARRIER: rc = o->barrier(c, a); break;
    default: rc = dt_error(DT_ERR_INTERNAL, "unknown collective %d", (int)a->kind);
    }
    if (rc == DT_OK) {
        account(c, a, t0, dt_now());
        return DT_OK;
    }
err:
    return broken(c, rc);
}

// ----------------------------------------------------------------------------
// requests and the progress thread

struct dt_request {
    dt_comm_t comm;
    dt_coll_args args;
    size_t *vec; /* owned copy of counts + displs (allgatherv) */
    dt_status status;
    int done;
    char msg[512];
    struct dt_request *next;
    int is_p2p;      /* a send or recv: in c->p2p_head's list, not the FIFO */
    dt_p2p io;
    double deadline; /* p2p: last move + timeout */
    double t0;       /* p2p: when it was submitted (dt_comm_get_stats) */
};

static void *progress_main(void *arg) {
    dt_comm_t c = arg;
    pthread_mutex_lock(&c->q_lock);
    for (;;) {
        while (!c->q_head && !c->q_stop) pthread_cond_wait(&c->q_cond, &c->q_lock);
        if (!c->q_head) break;
        struct dt_request *r = c->q_head;
        c->q_head = r->next;
        if (!c->q_head) c->q_tail = NULL;
        pthread_mutex_unlock(&c->q_lock);

        dt_status s = execute(c, &r->args);

        pthread_mutex_lock(&c->q_lock);
        r->status = s;
        if (s != DT_OK) snprintf(r->msg, sizeof r->msg, "%s", dt_last_error());
        r->done = 1;
        c->q_pending--;
        pthread_cond_broadcast(&c->q_cond);
    }
    pthread_mutex_unlock(&c->q_lock);
    return NULL;
}

static struct dt_request *request_new(dt_comm_t c, const dt_coll_args *a) {
    struct dt_request *r = calloc(1, sizeof *r);
    if (!r) {
        dt_error(DT_ERR_NOMEM, "%s: out of memory for a request", dt_coll_name(a->kind));
        return NULL;
    }
    r->comm = c;
    r->args = *a;
    return r;
}

static dt_status enqueue(dt_comm_t c, const dt_coll_args *a, dt_request_t *out) {
    struct dt_request *r = request_new(c, a);
    if (!r) return DT_ERR_NOMEM;
    if (a->kind == DT_COLL_ALLGATHERV) {
        r->vec = malloc((size_t)c->size * 2 * sizeof(size_t));
        if (!r->vec) {
            free(r);
            return dt_error(DT_ERR_NOMEM, "allgather: out of memory for a request");
        }
        memcpy(r->vec, a->counts, (size_t)c->size * sizeof(size_t));
        memcpy(r->vec + c->size, a->displs, (size_t)c->size * sizeof(size_t));
        r->args.counts = r->vec;
        r->args.displs = r->vec + c->size;
    }
    pthread_mutex_lock(&c->q_lock);
    if (!c->thread_started) {
        if (pthread_create(&c->thread, NULL, progress_main, c) != 0) {
            pthread_mutex_unlock(&c->q_lock);
            free(r->vec);
            free(r);
            return dt_error(DT_ERR_INTERNAL, "cannot start the communicator's progress thread");
        }
        c->thread_started = 1;
    }
    if (c->q_tail) c->q_tail->next = r;
    else c->q_head = r;
    c->q_tail = r;
    c->q_pending++;
    pthread_cond_broadcast(&c->q_cond);
    pthread_mutex_unlock(&c->q_lock);
    *out = r;
    return DT_OK;
}

// ----------------------------------------------------------------------------
// point-to-point requests

static void p2p_finish(dt_comm_t c, struct dt_request *r, dt_status s) {
    if (s != DT_OK) {
        if (r->io.started) c->ops->p2p_cancel(c, &r->io);
        snprintf(r->msg, sizeof r->msg, "%s", dt_last_error());
        if (!(c->peer_faults && r->io.peer_gone)) broken(c, s);
    } else {
        account(c, &r->args, r->t0, dt_now());
    }
    r->status = s;
    r->done = 1;
    pthread_cond_broadcast(&c->q_cond);
}

/* One pass over the transfers in flight (q_lock held): each that is first
 * in line for its (direction, peer) moves what it can. Returns 1 if
 * anything moved or finished. */
static int p2p_sweep(dt_comm_t c, int slow) {
    int any = 0;
    double now = dt_now();
    struct dt_request **link = &c->p2p_head;
    while (*link) {
        struct dt_request *r = *link;
        int queued = 0;
        for (struct dt_request *q = c->p2p_head; q != r && !queued; q = q->next)
            queued = q->args.kind == r->args.kind && q->args.root == r->args.root;
        dt_status s = DT_OK;
        if (atomic_load(&c->err) != DT_OK) {
            s = sticky(c);
        } else if (!queued) {
            int moved = 0;
            s = c->ops->p2p_progress(c, &r->io, slow, &moved);
            if (moved) {
                r->deadline = now + c->timeout;
                any = 1;
            } else if (s == DT_OK && !r->io.done && now >= r->deadline) {
                const dt_coll_args *a = &r->args;
                s = dt_error(DT_ERR_TIMEOUT,
                             "%s (%zu x %s, peer %d) on rank %d: timed out after %.3g s; ranks "
                             "not arrived: %d",
                             dt_coll_name(a->kind), a->count, dt_dtype_name(a->dtype), a->root,
                             c->rank, c->timeout, a->root);
            }
        }
        if (s == DT_OK && !r->io.done) {
            link = &r->next;
            continue;
        }
        *link = r->next; /* done or failed: out of the list */
        p2p_finish(c, r, s);
        any = 1;
    }
    return any;
}

/* Moves the transfers along until `r` is done (q_lock held; released while
 * pausing). */
static void p2p_drive(dt_comm_t c, struct dt_request *r) {
    dt_waiter w;
    dt_waiter_init(&w, c->timeout, c->local_size);
    int slow = 0;
    while (r ? !r->done : c->p2p_head != NULL) {
        if (p2p_sweep(c, slow)) {
            dt_waiter_init(&w, c->timeout, c->local_size);
            slow = 0;
            continue;
        }
        pthread_mutex_unlock(&c->q_lock);
        slow = dt_waiter_step(&w);
        // A caller waiting for its transfer says what it waits on, as a
        // collective does (the process's wait hook: a waiting rank is alive).
        if (slow && r) dt_waiter_note(&r->args, r->args.root);
        pthread_mutex_lock(&c->q_lock);
    }
}

/* The background mover, started by the first dt_isend/dt_irecv. */
static void *p2p_main(void *arg) {
    dt_comm_t c = arg;
    pthread_mutex_lock(&c->q_lock);
    for (;;) {
        while (!c->p2p_head && !c->q_stop) pthread_cond_wait(&c->p2p_cond, &c->q_lock);
        if (!c->p2p_head) break;
        p2p_drive(c, NULL);
    }
    pthread_mutex_unlock(&c->q_lock);
    return NULL;
}

static dt_status p2p_submit(dt_comm_t c, const dt_coll_args *a, dt_request_t *req) {
    if (!c->ops->p2p_progress)
        return dt_error(DT_ERR_ARG, "%s on rank %d: a %s communicator has no point to point", dt_coll_name(a->kind),
                        c->rank, c->ops->name);
    struct dt_request *r = request_new(c, a);
    if (!r) return DT_ERR_NOMEM;
    r->is_p2p = 1;
    r->io.args = *a;
    r->t0 = dt_now();
    r->deadline = r->t0 + c->timeout;
    pthread_mutex_lock(&c->q_lock);
    if (req && !c->p2p_started) {
        if (pthread_create(&c->p2p_thread, NULL, p2p_main, c) != 0) {
            pthread_mutex_unlock(&c->q_lock);
            free(r);
            return dt_error(DT_ERR_INTERNAL, "cannot start the communicator's transfer thread");
        }
        c->p2p_started = 1;
    }
    struct dt_request **link = &c->p2p_head;
    while (*link) link = &(*link)->next;
    *link = r;
    pthread_cond_broadcast(&c->p2p_cond);
    pthread_mutex_unlock(&c->q_lock);
    if (req) {
        *req = r;
        return DT_OK;
    }
    return dt_wait(&r);
}

dt_status dt_wait(dt_request_t *req) {
    if (!req || !*req) return DT_OK;
    struct dt_request *r = *req;
    dt_comm_t c = r->comm;
    pthread_mutex_lock(&c->q_lock);
    if (r->is_p2p) p2p_drive(c, r);
    while (!r->done) pthread_cond_wait(&c->q_cond, &c->q_lock);
    pthread_mutex_unlock(&c->q_lock);
    if (r->is_p2p) dt_waiter_done();
    dt_status s = r->status;
    if (s != DT_OK) dt_error(s, "%s", r->msg);
    free(r->vec);
    free(r);
    *req = NULL;
    return s;
}

dt_status dt_test(dt_request_t *req, int *done) {
    if (done) *done = 1;
    if (!req || !*req) return DT_OK;
    struct dt_request *r = *req;
    pthread_mutex_lock(&r->comm->q_lock);
    if (r->is_p2p && !r->done) p2p_sweep(r->comm, 0);
    int d = r->done;
    pthread_mutex_unlock(&r->comm->q_lock);
    if (!d) {
        if (done) *done = 0;
        return DT_OK;
    }
    return dt_wait(req);
}

/* Blocking entry: run now, or behind the queued non-blocking calls. */
static dt_status run_blocking(dt_comm_t c, dt_coll_args *a) {
    pthread_mutex_lock(&c->q_lock);
    int pending = c->q_pending;
    pthread_mutex_unlock(&c->q_lock);
    if (!pending) return execute(c, a);
    dt_request_t r;
    dt_status s = enqueue(c, a, &r);
    if (s != DT_OK) return s;
    return dt_wait(&r);
}

void dt_comm_destroy(dt_comm_t c) {
    if (!c) return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->q_lock);
        while (c->q_pending) pthread_cond_wait(&c->q_cond, &c->q_lock);
        c->q_stop = 1;
        pthread_cond_broadcast(&c->q_cond);
        pthread_mutex_unlock(&c->q_lock);
        pthread_join(c->thread, NULL);
    }
    pthread_mutex_lock(&c->q_lock);
    if (c->p2p_head) p2p_drive(c, NULL); /* each ends by its deadline at the latest */
    c->q_stop = 1;
    pthread_cond_broadcast(&c->p2p_cond);
    pthread_mutex_unlock(&c->q_lock);
    if (c->p2p_started) pthread_join(c->p2p_thread, NULL);
    if (c->ops && c->ops->destroy) c->ops->destroy(c);
    pthread_mutex_destroy(&c->err_lock);
    pthread_mutex_destroy(&c->q_lock);
    pthread_cond_destroy(&c->q_cond);
    pthread_mutex_destroy(&c->obs_lock);
    pthread_cond_destroy(&c->p2p_cond);
    free(c);
}

// ----------------------------------------------------------------------------
// argument validation and the public collectives

static dt_status validate(dt_comm_t c, const dt_coll_args *a) {
    const char *nm = dt_coll_name(a->kind);
    if (!c) return dt_error(DT_ERR_ARG, "%s: NULL communicator", nm);
    if ((unsigned)a->dtype > DT_U8) return dt_error(DT_ERR_ARG, "%s: bad dtype %d", nm, (int)a->dtype);
    int reduces = a->kind == DT_COLL_ALLREDUCE || a->kind == DT_COLL_REDUCE ||
                  a->kind == DT_COLL_REDUCE_SCATTER;
    if (reduces && (unsigned)a->op > DT_MIN)
        return dt_error(DT_ERR_ARG, "%s: bad reduction op %d", nm, (int)a->op);
    if ((a->kind == DT_COLL_BROADCAST || a->kind == DT_COLL_REDUCE) &&
        (a->root < 0 || a->root >= c->size))
        return dt_error(DT_ERR_ARG, "%s: root %d out of range [0, %d)", nm, a->root, c->size);
    if ((a->kind == DT_COLL_SEND || a->kind == DT_COLL_RECV) &&
        (a->root < 0 || a->root >= c->size || a->root == c->rank))
        return dt_error(DT_ERR_ARG, "%s on rank %d: peer %d is not another rank of [0, %d)", nm,
                        c->rank, a->root, c->size);
    size_t n = a->count;
    if (a->kind == DT_COLL_REDUCE_SCATTER) n *= (size_t)c->size;
    if (n && a->kind != DT_COLL_BARRIER) {
        int needs_send = a->kind != DT_COLL_RECV &&
                         !(a->kind == DT_COLL_BROADCAST && c->rank != a->root);
        int needs_recv = a->kind != DT_COLL_SEND &&
                         !(a->kind == DT_COLL_REDUCE && c->rank != a->root);
        if (needs_send && !a->send) return dt_error(DT_ERR_ARG, "%s: send buffer is NULL", nm);
        if (needs_recv && !a->recv) return dt_error(DT_ERR_ARG, "%s: recv buffer is NULL", nm);
    }
    if (a->kind == DT_COLL_ALLGATHERV) {
        if (!a->counts || !a->displs) return dt_error(DT_ERR_ARG, "%s: counts/displs is NULL", nm);
        if (a->counts[c->rank] != a->count)
            return dt_error(DT_ERR_ARG, "%s on rank %d: sendcount %zu != counts[%d] = %zu", nm,
                            c->rank, a->count, c->rank, a->counts[c->rank]);
        size_t tot = 0;
        for (int p = 0; p < c->size; p++) tot += a->counts[p];
        if (tot && !a->recv) return dt_error(DT_ERR_ARG, "%s: recv buffer is NULL", nm);
    }
    return DT_OK;
}

/* Validates, numbers, then runs (blocking) or queues (req != NULL). */
static dt_status submit(dt_comm_t c, dt_coll_args *a, dt_request_t *req) {
    if (req) *req = NULL;
    dt_status s = validate(c, a);
    if (s != DT_OK) return s;
    if (a->kind == DT_COLL_SEND || a->kind == DT_COLL_RECV) return p2p_submit(c, a, req);
    a->seq = ++c->seq;
    if (req) return enqueue(c, a, req);
    return run_blocking(c, a);
}

dt_status dt_comm_submit(dt_comm_t c, dt_coll_args *a, dt_request_t *req) { return submit(c, a, req); }

dt_status dt_allreduce(const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op,
                       dt_comm_t c) {
    dt_coll_args a = {.kind = DT_COLL_ALLREDUCE, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .op = op};
    return submit(c, &a, NULL);
}

dt_status dt_iallreduce(const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op,
                        dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "iallreduce: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_ALLREDUCE, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .op = op};
    return submit(c, &a, req);
}

dt_status dt_reduce_scatter(const void *send, void *recv, size_t recvcount, dt_dtype dtype,
                            dt_redop op, dt_comm_t c) {
    dt_coll_args a = {.kind = DT_COLL_REDUCE_SCATTER, .send = send, .recv = recv,
                      .count = recvcount, .dtype = dtype, .op = op};
    return submit(c, &a, NULL);
}

dt_status dt_ireduce_scatter(const void *send, void *recv, size_t recvcount, dt_dtype dtype,
                             dt_redop op, dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "ireduce_scatter: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_REDUCE_SCATTER, .send = send, .recv = recv,
                      .count = recvcount, .dtype = dtype, .op = op};
    return submit(c, &a, req);
}

/* Equal-count allgather through the allgatherv machinery; counts/displs
 * live on the stack for small worlds (copied into the request if queued). */
static dt_status allgather_common(const void *send, void *recv, size_t sendcount,
                                  dt_dtype dtype, dt_comm_t c, dt_request_t *req) {
    if (!c) return dt_error(DT_ERR_ARG, "allgather: NULL communicator");
    size_t stack[128], *v = c->size <= 64 ? stack : malloc((size_t)c->size * 2 * sizeof(size_t));
    if (!v) return dt_error(DT_ERR_NOMEM, "allgather: out of memory");
    for (int p = 0; p < c->size; p++) {
        v[p] = sendcount;
        v[c->size + p] = (size_t)p * sendcount;
    }
    dt_coll_args a = {.kind = DT_COLL_ALLGATHERV, .send = send, .recv = recv, .count = sendcount,
                      .dtype = dtype, .counts = v, .displs = v + c->size};
    dt_status s = submit(c, &a, req);
    if (v != stack) free(v);
    return s;
}

dt_status dt_allgather(const void *send, void *recv, size_t sendcount, dt_dtype dtype,
                       dt_comm_t c) {
    return allgather_common(send, recv, sendcount, dtype, c, NULL);
}

dt_status dt_iallgather(const void *send, void *recv, size_t sendcount, dt_dtype dtype,
                        dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "iallgather: req is NULL");
    return allgather_common(send, recv, sendcount, dtype, c, req);
}

dt_status dt_allgatherv(const void *send, size_t sendcount, void *recv, const size_t *counts,
                        const size_t *displs, dt_dtype dtype, dt_comm_t c) {
    dt_coll_args a = {.kind = DT_COLL_ALLGATHERV, .send = send, .recv = recv, .count = sendcount,
                      .dtype = dtype, .counts = counts, .displs = displs};
    return submit(c, &a, NULL);
}

dt_status dt_iallgatherv(const void *send, size_t sendcount, void *recv, const size_t *counts,
                         const size_t *displs, dt_dtype dtype, dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "iallgatherv: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_ALLGATHERV, .send = send, .recv = recv, .count = sendcount,
                      .dtype = dtype, .counts = counts, .displs = displs};
    return submit(c, &a, req);
}

dt_status dt_broadcast(const void *send, void *recv, size_t count, dt_dtype dtype, int root,
                       dt_comm_t c) {
    dt_coll_args a = {.kind = DT_COLL_BROADCAST, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .root = root};
    return submit(c, &a, NULL);
}

dt_status dt_ibroadcast(const void *send, void *recv, size_t count, dt_dtype dtype, int root,
                        dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "ibroadcast: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_BROADCAST, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .root = root};
    return submit(c, &a, req);
}

dt_status dt_reduce(const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op,
                    int root, dt_comm_t c) {
    dt_coll_args a = {.kind = DT_COLL_REDUCE, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .op = op, .root = root};
    return submit(c, &a, NULL);
}

dt_status dt_ireduce(const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op,
                     int root, dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "ireduce: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_REDUCE, .send = send, .recv = recv, .count = count,
                      .dtype = dtype, .op = op, .root = root};
    return submit(c, &a, req);
}

dt_status dt_ibarrier(dt_comm_t c, dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "ibarrier: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_BARRIER};
    return submit(c, &a, req);
}

dt_status dt_barrier(dt_comm_t c) {
    dt_coll_args a = {.kind = DT_COLL_BARRIER};
    return submit(c, &a, NULL);
}

dt_status dt_send(const void *buf, size_t count, dt_dtype dtype, int peer, dt_comm_t c) {
    dt_coll_args a = {.kind = DT_COLL_SEND, .send = buf, .count = count, .dtype = dtype,
                      .root = peer};
    return submit(c, &a, NULL);
}

dt_status dt_recv(void *buf, size_t count, dt_dtype dtype, int peer, dt_comm_t c) {
    dt_coll_args a = {.kind = DT_COLL_RECV, .recv = buf, .count = count, .dtype = dtype,
                      .root = peer};
    return submit(c, &a, NULL);
}

dt_status dt_isend(const void *buf, size_t count, dt_dtype dtype, int peer, dt_comm_t c,
                   dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "isend: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_SEND, .send = buf, .count = count, .dtype = dtype,
                      .root = peer};
    return submit(c, &a, req);
}

dt_status dt_irecv(void *buf, size_t count, dt_dtype dtype, int peer, dt_comm_t c,
                   dt_request_t *req) {
    if (!req) return dt_error(DT_ERR_ARG, "irecv: req is NULL");
    dt_coll_args a = {.kind = DT_COLL_RECV, .recv = buf, .count = count, .dtype = dtype,
                      .root = peer};
    return submit(c, &a, req);
}

// ----------------------------------------------------------------------------
// split

typedef struct {
    int color, key, rank;
} split_ent;

static int split_cmp(const void *x, const void *y) {
    const split_ent *a = x, *b = y;
    if (a->color != b->color) return a->color < b->color ? -1 : 1;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

// ----------------------------------------------------------------------------
// replaceable ranks (comm.h)

void dt_comm_set_peer_faults(dt_comm_t c, int tolerate) {
    if (c) c->peer_faults = tolerate;
}

int dt_comm_replaced(dt_comm_t c) { return c && c->ops->replaced ? c->ops->replaced(c) : -1; }

int dt_comm_regrouped(dt_comm_t c) { return c && c->ops->regrouped ? c->ops->regrouped(c) : 0; }

int dt_comm_peer_state(dt_comm_t c, int peer, int *incarnation) {
    if (incarnation) *incarnation = 0;
    if (!c || peer < 0 || peer >= c->size || !c->ops->peer_state) return DT_PEER_RUNNING;
    return c->ops->peer_state(c, peer, incarnation);
}

dt_status dt_comm_peer_reset(dt_comm_t c, int peer) {
    if (!c || peer < 0 || peer >= c->size || peer == c->rank)
        return dt_error(DT_ERR_ARG, "dt_comm_peer_reset: peer %d is not another rank", peer);
    if (!c->ops->peer_reset) return dt_error(DT_ERR_COMM, "the %s backend does not replace ranks", c->ops->name);
    return c->ops->peer_reset(c, peer);
}

dt_status dt_comm_rejoin_peers(dt_comm_t c, const int *peers, int npeers) {
    if (!c) return dt_error(DT_ERR_ARG, "dt_comm_rejoin_peers: NULL communicator");
    if (!c->ops->rejoin_peers) return dt_error(DT_ERR_COMM, "the %s backend does not replace ranks", c->ops->name);
    return c->ops->rejoin_peers(c, peers, npeers);
}

int dt_comm_peer_ready(dt_comm_t c, int peer) {
    if (!c || peer < 0 || peer >= c->size || !c->ops->peer_ready) return 1;
    return c->ops->peer_ready(c, peer);
}

int dt_comm_incarnation(dt_comm_t c) {
    int inc = 0;
    if (c && c->ops->peer_state) c->ops->peer_state(c, c->rank, &inc);
    return inc;
}

uint64_t dt_comm_seq(dt_comm_t c) { return c ? c->seq : 0; }

dt_status dt_comm_split_rejoin(dt_comm_t c, int color, dt_comm_t *out) {
    if (!c || !out) return dt_error(DT_ERR_ARG, "dt_comm_split_rejoin: NULL argument");
    *out = NULL;
    if (!c->ops->split_rejoin) return dt_error(DT_ERR_COMM, "the %s backend does not replace ranks", c->ops->name);
    dt_comm_t child = dt_comm_alloc();
    if (!child) return dt_error(DT_ERR_NOMEM, "dt_comm_split_rejoin: out of memory");
    child->world_rank = c->world_rank;
    child->timeout = c->timeout;
    child->check = c->check;
    child->node = c->node;
    child->nnodes = 1;
    dt_status s = c->ops->split_rejoin(c, child, color);
    c->nsplits++;
    if (s != DT_OK) {
        dt_comm_destroy(child);
        return s;
    }
    *out = child;
    return DT_OK;
}

dt_status dt_comm_split(dt_comm_t c, int color, int key, dt_comm_t *out) {
    if (!c || !out) return dt_error(DT_ERR_ARG, "dt_comm_split: NULL argument");
    *out = NULL;
    if (color < 0 && color != DT_COMM_UNDEFINED)
        return dt_error(DT_ERR_ARG, "dt_comm_split: color %d is negative", color);
    if (!c->ops->split) return dt_error(DT_ERR_ARG, "dt_comm_split: a %s communicator cannot be split", c->ops->name);
    /* order with the non-blocking calls already queued */
    dt_barrier(c);
    dt_status s = sticky(c);
    if (s != DT_OK) return s;
    int n = c->size;
    int64_t mine[3] = {color, key, c->rank};
    int64_t *all = malloc((size_t)n * 3 * sizeof(int64_t));
    split_ent *ents = malloc((size_t)n * sizeof *ents);
    int *members = malloc((size_t)n * sizeof(int));
    if (!all || !ents || !members) {
        free(all);
        free(ents);
        free(members);
        return dt_error(DT_ERR_NOMEM, "dt_comm_split: out of memory");
    }
    s = dt_allgather(mine, all, 3, DT_I64, c);
    dt_comm_t child = NULL;
    int nm = 0, color_index = 0;
    if (s != DT_OK) goto out;
    for (int p = 0; p < n; p++) ents[p] = (split_ent){(int)all[3 * p], (int)all[3 * p + 1], p};
    qsort(ents, (size_t)n, sizeof *ents, split_cmp);
    for (int p = 0, prev = -2; p < n; p++) {
        if (ents[p].color != prev && ents[p].color < color) color_index++;
        prev = ents[p].color;
        if (ents[p].color == color) members[nm++] = ents[p].rank;
    }
    if (color != DT_COMM_UNDEFINED) {
        child = dt_comm_alloc();
        if (!child) {
            s = dt_error(DT_ERR_NOMEM, "dt_comm_split: out of memory");
            goto out; /* the peers then fail in the backend's rendezvous */
        }
        for (int i = 0; i < nm; i++)
            if (members[i] == c->rank) child->rank = i;
        child->size = nm;
        child->world_rank = c->world_rank;
        child->timeout = c->timeout;
        child->check = c->check;
        child->local_rank = child->rank;
        child->local_size = nm;
        child->node = c->node;
        child->nnodes = 1;
    }
    s = c->ops->split(c, child, members, nm, color, color_index);
    c->nsplits++;
    if (s != DT_OK) {
        if (s == DT_ERR_COMM || s == DT_ERR_TIMEOUT) dt_comm_fail(c, s, dt_last_error());
        dt_comm_destroy(child);
        child = NULL;
    }
out:
    free(all);
    free(ents);
    free(members);
    *out = child;
    return s;
}
