/*
 * algo.c - collective algorithms built from point-to-point exchanges,
 * shared by the backends: the shm backend runs them through its slots,
 * the mpi backend over MPI_Isend/MPI_Irecv. A backend passes one function,
 * a blocking send-and-receive (dt_sendrecv_fn in comm_impl.h).
 *
 *   ring   allreduce: n-1 steps of reduce-scatter around the ring, then n-1
 *          steps of allgather. Each rank sends 2(n-1)/n of the vector:
 *          bandwidth-optimal, but 2(n-1) latencies.
 *   rhd    allreduce: reduce-scatter by recursive halving (log2 p steps, the
 *          vector halves each step), then allgather by recursive doubling.
 *          The same bytes as the ring in 2 log2 p latencies. With n not a
 *          power of two, p = the largest power of two below n: the first
 *          2(n-p) ranks pair up, the even one of each pair hands its vector
 *          to the odd one and waits, and gets the result at the end.
 *   tree   broadcast and reduce: a binomial tree rooted at root, log2 n
 *          rounds; in round k the ranks that have the data pass it on to
 *          the ranks 2^k away (broadcast), or the other way round (reduce).
 *
 * Determinism: each element is combined in an order fixed by the rank count
 * (and the root): a partial over lower ranks always comes first. fp16/bf16
 * run in fp32 and are rounded once at the end; DT_AVG is a sum divided at
 * the end. The order is not the serial 0..n-1 order, so float sums may
 * differ from it in the last bits, but never between runs or ranks.
 */
#include "comm/comm_impl.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// names, DTRAIN_COMM_ALGO, logging the choice

static const char *const ALGO_NAMES[DT_ALGO_COUNT_] = {"auto", "direct", "rsag", "ring",
                                                       "rhd",  "tree",   "mpi"};

const char *dt_algo_name(dt_algo a) { return (unsigned)a < DT_ALGO_COUNT_ ? ALGO_NAMES[a] : "?"; }

dt_algo dt_algo_from_env(void) {
    const char *e = getenv("DTRAIN_COMM_ALGO");
    if (!e || !*e) return DT_ALGO_AUTO;
    for (int i = 0; i < DT_ALGO_COUNT_; i++)
        if (!strcmp(e, ALGO_NAMES[i])) return (dt_algo)i;
    dt_log(DT_LOG_WARN, "DTRAIN_COMM_ALGO=%s: unknown (auto, direct, rsag, ring, rhd, tree, mpi); "
                        "using auto", e);
    return DT_ALGO_AUTO;
}

void dt_algo_log(dt_comm_t c, const dt_coll_args *a, size_t bytes, dt_algo algo) {
    /* one bit per (backend, op, size class, algorithm) */
    static _Atomic uint32_t seen[4][DT_COLL_COUNT_][64];
    if (dt_log_get_level() < DT_LOG_DEBUG) return;
    const char *be = c->ops ? c->ops->name : "?";
    int b = be[0] == 's' ? 0 : be[0] == 'm' ? 1 : 2, cls = 0;
    while (cls < 63 && ((size_t)2 << cls) <= bytes) cls++;
    uint32_t bit = 1u << algo;
    if (atomic_fetch_or(&seen[b][a->kind][cls], bit) & bit) return;
    dt_log(DT_LOG_DEBUG, "comm %s: %s of %zu-%zu bytes on %d ranks -> %s", be,
           dt_coll_name(a->kind), cls ? (size_t)1 << cls : 0, ((size_t)2 << cls) - 1, c->size,
           dt_algo_name(algo));
}

// ----------------------------------------------------------------------------
// the working buffer: recv itself, scratch where this rank has no recv,
// or an fp32 copy for fp16/bf16

typedef struct {
    char *buf;   /* count elements of type t */
    dt_dtype t;  /* a->dtype, or DT_F32 for fp16/bf16 */
    size_t es;
    char *owned; /* buf when it is ours to free */
    char *tmp;   /* receive buffer */
} work;

static int is_half(dt_dtype t) { return t == DT_F16 || t == DT_BF16; }

/* dst: where the result goes on this rank, NULL for none. tmp_elems: the
 * largest piece received at once. */
static dt_status work_open(work *w, const dt_coll_args *a, void *dst, size_t tmp_elems) {
    size_t n = a->count;
    memset(w, 0, sizeof *w);
    w->t = is_half(a->dtype) ? DT_F32 : a->dtype;
    w->es = dt_dtype_size(w->t);
    w->tmp = malloc(tmp_elems * w->es + 64);
    if (w->t != a->dtype || !dst) {
        w->owned = malloc(n * w->es + 64);
        w->buf = w->owned;
    } else {
        w->buf = dst;
    }
    if (!w->tmp || !w->buf) {
        free(w->tmp);
        free(w->owned);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu elements", dt_coll_name(a->kind), n);
    }
    if (w->t != a->dtype) dt_to_f32((float *)w->buf, a->send, n, a->dtype);
    else if (n && w->buf != a->send) memcpy(w->buf, a->send, n * w->es);
    return DT_OK;
}

/* Finishes DT_AVG and rounds fp32 back into dst (if any), then frees. */
static dt_status work_close(work *w, const dt_coll_args *a, void *dst, int nranks, dt_status rc) {
    if (rc == DT_OK && dst) {
        if (a->op == DT_AVG) dt_avg_finish(w->buf, a->count, w->t, nranks);
        if (w->t != a->dtype) dt_from_f32(dst, (const float *)w->buf, a->count, a->dtype);
    }
    free(w->tmp);
    free(w->owned);
    return rc;
}

/* dst = lo op hi, elementwise (lo: the partial over the lower ranks). */
static void combine(const work *w, const dt_coll_args *a, void *dst, const void *lo, const void *hi,
                    size_t n) {
    const void *src[2] = {lo, hi};
    dt_reduce_kernel(dst, src, 2, n, w->t, a->op == DT_AVG ? DT_SUM : a->op, 1);
}

// ----------------------------------------------------------------------------
// ring allreduce

dt_status dt_algo_ring_allreduce(dt_comm_t c, const dt_coll_args *a, dt_sendrecv_fn x) {
    int n = c->size, r = c->rank;
    size_t N = a->count, per = (N + (size_t)n - 1) / (size_t)n;
    work w;
    dt_status rc = work_open(&w, a, a->recv, per);
    if (rc != DT_OK) return rc;
    size_t es = w.es;
#define CH_OFF(k) ((size_t)(k) * per < N ? (size_t)(k) * per : N)
#define CH_LEN(k) (CH_OFF((k) + 1) - CH_OFF(k))
    int right = (r + 1) % n, left = (r + n - 1) % n;
    for (int k = 0; k < n - 1 && rc == DT_OK; k++) {
        int sc = ((r - k) % n + n) % n, rcv = ((r - k - 1) % n + n) % n;
        rc = x(c, a, w.buf + CH_OFF(sc) * es, CH_LEN(sc) * es, right, w.tmp, CH_LEN(rcv) * es,
               left, per * es);
        if (rc == DT_OK) {
            char *dst = w.buf + CH_OFF(rcv) * es;
            combine(&w, a, dst, dst, w.tmp, CH_LEN(rcv));
        }
    }
    for (int k = 0; k < n - 1 && rc == DT_OK; k++) {
        int sc = ((r + 1 - k) % n + n) % n, rcv = ((r - k) % n + n) % n;
        rc = x(c, a, w.buf + CH_OFF(sc) * es, CH_LEN(sc) * es, right, w.buf + CH_OFF(rcv) * es,
               CH_LEN(rcv) * es, left, per * es);
    }
#undef CH_OFF
#undef CH_LEN
    return work_close(&w, a, a->recv, n, rc);
}

// ----------------------------------------------------------------------------
// recursive halving-doubling allreduce

dt_status dt_algo_rhd_allreduce(dt_comm_t c, const dt_coll_args *a, dt_sendrecv_fn x) {
    int n = c->size, r = c->rank, p = 1;
    while (p * 2 <= n) p *= 2;
    int rem = n - p;
    size_t N = a->count, bmax = (N + (size_t)p - 1) / (size_t)p;
    work w;
    dt_status rc = work_open(&w, a, a->recv, rem ? N : N - N / 2);
    if (rc != DT_OK) return rc;
    size_t es = w.es;
    char *buf = w.buf;
#define OFF(b) (N * (size_t)(b) / (size_t)p) /* block b of p, balanced */
#define REAL(v) ((v) < rem ? 2 * (v) + 1 : (v) + rem)

    /* fold the first 2*rem ranks pairwise into their odd members */
    int vr = r >= 2 * rem ? r - rem : (r & 1) ? r / 2 : -1;
    if (rem) {
        if (r < 2 * rem && !(r & 1)) {
            rc = x(c, a, buf, N * es, r + 1, NULL, 0, -1, N * es);
        } else if (r < 2 * rem) {
            rc = x(c, a, NULL, 0, -1, w.tmp, N * es, r - 1, N * es);
            if (rc == DT_OK) combine(&w, a, buf, w.tmp, buf, N);
        } else {
            rc = x(c, a, NULL, 0, -1, NULL, 0, -1, N * es);
        }
    }
    /* reduce-scatter: each step keeps half of the blocks and sends the
     * other half to the partner, until virtual rank v holds block v */
    size_t lo = 0, hi = (size_t)p;
    for (int mask = p / 2; mask >= 1 && rc == DT_OK; mask /= 2) {
        size_t half = (hi - lo) / 2, round = half * bmax * es;
        if (vr < 0) {
            rc = x(c, a, NULL, 0, -1, NULL, 0, -1, round);
            continue;
        }
        int pv = vr ^ mask, peer = REAL(pv);
        size_t klo = (vr & mask) ? lo + half : lo, slo = (vr & mask) ? lo : lo + half;
        size_t kn = OFF(klo + half) - OFF(klo), sn = OFF(slo + half) - OFF(slo);
        rc = x(c, a, buf + OFF(slo) * es, sn * es, peer, w.tmp, kn * es, peer, round);
        if (rc != DT_OK) break;
        char *mine = buf + OFF(klo) * es;
        if (vr < pv) combine(&w, a, mine, mine, w.tmp, kn);
        else combine(&w, a, mine, w.tmp, mine, kn);
        lo = klo;
        hi = klo + half;
    }
    /* allgather: each step swaps the blocks held with the partner's */
    for (int mask = 1; mask < p && rc == DT_OK; mask *= 2) {
        size_t round = (size_t)mask * bmax * es;
        if (vr < 0) {
            rc = x(c, a, NULL, 0, -1, NULL, 0, -1, round);
            continue;
        }
        int pv = vr ^ mask, peer = REAL(pv);
        size_t mlo = (size_t)(vr & ~(mask - 1)), plo = (size_t)(pv & ~(mask - 1)), m = (size_t)mask;
        rc = x(c, a, buf + OFF(mlo) * es, (OFF(mlo + m) - OFF(mlo)) * es, peer,
               buf + OFF(plo) * es, (OFF(plo + m) - OFF(plo)) * es, peer, round);
    }
    /* hand the result back to the folded ranks */
    if (rem && rc == DT_OK) {
        if (r < 2 * rem && !(r & 1)) rc = x(c, a, NULL, 0, -1, buf, N * es, r + 1, N * es);
        else if (r < 2 * rem) rc = x(c, a, buf, N * es, r - 1, NULL, 0, -1, N * es);
        else rc = x(c, a, NULL, 0, -1, NULL, 0, -1, N * es);
    }
#undef OFF
#undef REAL
    return work_close(&w, a, a->recv, n, rc);
}

// ----------------------------------------------------------------------------
// binomial trees

/* The highest power of two below n (1 for n <= 2). */
static int top_mask(int n) {
    int m = 1;
    while (m * 2 < n) m *= 2;
    return m;
}

dt_status dt_algo_tree_broadcast(dt_comm_t c, const dt_coll_args *a, dt_sendrecv_fn x) {
    int n = c->size, root = a->root, vr = (c->rank - root + n) % n;
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    if (vr == 0 && bytes && a->recv != a->send) memmove(a->recv, a->send, bytes);
    dt_status rc = DT_OK;
    /* round `mask`: ranks at multiples of 2*mask pass the data mask ranks on */
    for (int mask = n > 1 ? top_mask(n) : 0; mask >= 1 && rc == DT_OK; mask /= 2) {
        int to = -1, from = -1;
        if (vr % (2 * mask) == 0 && vr + mask < n) to = (vr + mask + root) % n;
        else if (vr % (2 * mask) == mask) from = (vr - mask + root) % n;
        rc = x(c, a, to >= 0 ? a->recv : NULL, to >= 0 ? bytes : 0, to, from >= 0 ? a->recv : NULL,
               from >= 0 ? bytes : 0, from, bytes);
    }
    return rc;
}

dt_status dt_algo_tree_reduce(dt_comm_t c, const dt_coll_args *a, dt_sendrecv_fn x) {
    int n = c->size, root = a->root, vr = (c->rank - root + n) % n;
    void *dst = vr == 0 ? a->recv : NULL;
    size_t N = a->count;
    work w;
    dt_status rc = work_open(&w, a, dst, N);
    if (rc != DT_OK) return rc;
    int sent = 0;
    /* round `mask`: the partial over ranks [vr, vr+mask) meets the one over
     * [vr+mask, vr+2*mask) at vr; lower ranks first */
    for (int mask = 1; mask < n && rc == DT_OK; mask *= 2) {
        int to = -1, from = -1;
        if (!sent && vr % (2 * mask) == mask) to = (vr - mask + root) % n;
        else if (!sent && vr % (2 * mask) == 0 && vr + mask < n) from = (vr + mask + root) % n;
        rc = x(c, a, to >= 0 ? w.buf : NULL, to >= 0 ? N * w.es : 0, to, from >= 0 ? w.tmp : NULL,
               from >= 0 ? N * w.es : 0, from, N * w.es);
        if (rc == DT_OK && from >= 0) combine(&w, a, w.buf, w.buf, w.tmp, N);
        if (to >= 0) sent = 1;
    }
    return work_close(&w, a, dst, n, rc);
}
