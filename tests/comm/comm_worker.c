/*
 * comm_worker.c - one rank of the communication tests. Started N times by
 * `dtrun -n N -- comm_worker MODE` (the launcher behind `dtrain run`) or by
 * `mpirun -np N comm_worker MODE`.
 *
 * Every rank generates every rank's input from (rank, case, index), so it can
 * compute the serial reference itself: the reduction in rank order 0..n-1,
 * fp16/bf16 accumulated in fp32 and rounded once. On the shm backend the
 * result must match the reference bit for bit; on MPI (whose reduction
 * order is its own) floats must match to a tolerance scaled by sum |x|.
 *
 * Modes:
 *   all       every collective x dtype x op x count, in and out of place,
 *             non-blocking twins, split, send/recv, determinism
 *   big       64 MiB allreduce, reduce_scatter, allgather, broadcast, reduce
 *   algos     every algorithm of the backend forced in turn: allreduce,
 *             reduce, broadcast x dtype x op x count
 *   kill      the last rank SIGKILLs itself during a stream of allreduces;
 *             the others must fail with DT_ERR_COMM (exit 3)
 *   mismatch  rank 1 passes a different count (check mode on); every rank
 *             must fail with a mismatch error (exit 4)
 *   mismatch_fast, mismatch_dtype
 *             the same with check mode off (the shm backend's own check)
 *   hang      the last rank sleeps; the others must time out (exit 5)
 *   abort     rank 0 aborts the communicator; the others must fail (exit 6)
 *   p2p_hang  the last rank never takes part; the others' dt_irecv/dt_isend
 *             from/to it must time out naming it (exit 7)
 *   p2p_kill  the same, but the last rank dies (exit 3)
 *   wire      under mpirun with mpi_bytes.c preloaded: fp16/bf16 allreduce,
 *             reduce_scatter and reduce hand MPI 16-bit elements only, no
 *             MPI reduction, (n-1)/n of the vector per half of an
 *             allreduce, the vector once to a reduce's root (exactly, on
 *             the mpi backend; results bitwise the serial reference there)
 *   spare V,V,...
 *             started with `dtrun --spares K`: in generation g (how many
 *             times the communicator rejoined) rank V[g] SIGKILLs itself
 *             while the others are inside a 16 MiB allreduce; a spare takes
 *             its place, every rank meets in dt_comm_rejoin, and the
 *             stream goes on; after the last victim, every collective of a
 *             short suite against the serial reference (exit 0), on the
 *             survivors and the newcomers alike. A spare released at the
 *             end says so ("comm_worker spare: released") and exits 0.
 * A second argument names the backend the ranks must have picked.
 * Exit status 0 = all checks passed, 1 = a check failed, 2 = setup error.
 */
#include "dtrain/comm.h"
#include "dtrain/launch.h"

#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_rank, g_size, g_exact, g_failed, g_checks;
static dt_comm_t W;

#define FAILF(...)                                                                   \
    do {                                                                             \
        g_failed++;                                                                  \
        fprintf(stderr, "rank %d: FAIL %s:%d: ", g_rank, __FILE__, __LINE__);        \
        fprintf(stderr, __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                         \
    } while (0)

#define OK(call)                                                                     \
    do {                                                                             \
        dt_status s_ = (call);                                                       \
        if (s_ != DT_OK) {                                                           \
            fprintf(stderr, "rank %d: %s:%d: %s failed: %s: %s\n", g_rank, __FILE__, \
                    __LINE__, #call, dt_status_string(s_), dt_last_error());          \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

// ----------------------------------------------------------------------------
// inputs and conversions

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float bf16_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
#if defined(__FLT16_MAX__)
static float f16_f(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
static uint16_t f_f16(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
#else
/* Compilers without _Float16 on this target (clang before 15 on x86, used
 * by the sanitizer builds): the library's own conversion, so the fp16 cases
 * then check the reduction but not the conversion. */
static float f16_f(uint16_t h) {
    float f;
    dt_to_f32(&f, &h, 1, DT_F16);
    return f;
}
static uint16_t f_f16(float f) {
    uint16_t h;
    dt_from_f32(&h, &f, 1, DT_F16);
    return h;
}
#endif

/* Element i of rank r's input for case `salt`, as a double. */
static double gen(int r, uint64_t salt, size_t i) {
    uint64_t h = mix(salt * 0x100000001b3ull ^ ((uint64_t)r << 40) ^ i);
    double v = (double)(int64_t)(h % 2001) - 1000.0;
    return v / (double)(1u << (h >> 60)); /* mixed magnitudes */
}

static void fill(void *buf, dt_dtype t, int r, uint64_t salt, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double v = gen(r, salt, i);
        switch (t) {
        case DT_F32: ((float *)buf)[i] = (float)v; break;
        case DT_F16: ((uint16_t *)buf)[i] = f_f16((float)v); break;
        case DT_BF16: ((uint16_t *)buf)[i] = f_bf16((float)v); break;
        case DT_I32: ((int32_t *)buf)[i] = (int32_t)(v * 16); break;
        case DT_I64: ((int64_t *)buf)[i] = (int64_t)(v * 16) * 1000000007ll; break;
        default: break;
        }
    }
}

static double get(const void *buf, dt_dtype t, size_t i) {
    switch (t) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F16: return f16_f(((const uint16_t *)buf)[i]);
    case DT_BF16: return bf16_f(((const uint16_t *)buf)[i]);
    case DT_I32: return ((const int32_t *)buf)[i];
    case DT_I64: return (double)((const int64_t *)buf)[i];
    default: return 0;
    }
}

/* Serial reference of an elementwise reduction over ranks 0..n-1 of the
 * inputs for `salt`, elements [first, first+n). abssum gets sum |x| for the
 * tolerance of non-exact backends. */
static void reference(void *out, double *abssum, dt_dtype t, dt_redop op, int nranks,
                      uint64_t salt, size_t first, size_t n) {
    size_t es = dt_dtype_size(t);
    void *tmp = malloc((first + n) * es + 1);
    for (size_t i = 0; i < n; i++) abssum[i] = 0;
    float *af = malloc(n * sizeof(float) + 1);
    int64_t *ai = malloc(n * sizeof(int64_t) + 1);
    for (int r = 0; r < nranks; r++) {
        fill(tmp, t, r, salt, first + n);
        for (size_t i = 0; i < n; i++) {
            double v = get(tmp, t, first + i);
            abssum[i] += fabs(v);
            if (t == DT_I32 || t == DT_I64) {
                int64_t x = t == DT_I32 ? ((int32_t *)tmp)[first + i] : ((int64_t *)tmp)[first + i];
                if (r == 0) ai[i] = x;
                else if (op == DT_SUM || op == DT_AVG) ai[i] += x;
                else if (op == DT_MAX) ai[i] = x > ai[i] ? x : ai[i];
                else ai[i] = x < ai[i] ? x : ai[i];
            } else {
                float x = (float)v;
                if (r == 0) af[i] = x;
                else if (op == DT_SUM || op == DT_AVG) af[i] += x;
                else if (op == DT_MAX) af[i] = x > af[i] ? x : af[i];
                else af[i] = x < af[i] ? x : af[i];
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (op == DT_AVG) {
            if (t == DT_I32 || t == DT_I64) ai[i] /= nranks;
            else af[i] /= (float)nranks;
        }
        switch (t) {
        case DT_F32: ((float *)out)[i] = af[i]; break;
        case DT_F16: ((uint16_t *)out)[i] = f_f16(af[i]); break;
        case DT_BF16: ((uint16_t *)out)[i] = f_bf16(af[i]); break;
        case DT_I32: ((int32_t *)out)[i] = (int32_t)ai[i]; break;
        case DT_I64: ((int64_t *)out)[i] = ai[i]; break;
        default: break;
        }
    }
    free(tmp);
    free(af);
    free(ai);
}

/* Compares n elements; exact unless the backend reduces in its own order. */
static void compare(const char *what, const void *got, const void *want, const double *abssum,
                    dt_dtype t, size_t n, int exact) {
    g_checks++;
    size_t es = dt_dtype_size(t);
    if (exact || t == DT_I32 || t == DT_I64 || !abssum) {
        if (n && memcmp(got, want, n * es)) {
            size_t i = 0;
            for (; i < n; i++)
                if (memcmp((const char *)got + i * es, (const char *)want + i * es, es)) break;
            FAILF("%s: element %zu of %zu is %.9g, expected %.9g", what, i, n, get(got, t, i),
                  get(want, t, i));
        }
        return;
    }
    double tol = t == DT_F32 ? 1e-6 : 1e-2;
    for (size_t i = 0; i < n; i++) {
        double g = get(got, t, i), w = get(want, t, i);
        if (fabs(g - w) > tol * (abssum[i] + fabs(w)) + 1e-30) {
            FAILF("%s: element %zu of %zu is %.9g, expected %.9g (tolerance)", what, i, n, g, w);
            return;
        }
    }
}

// ----------------------------------------------------------------------------
// the collectives, one checker each

static const dt_dtype DTYPES[] = {DT_F32, DT_F16, DT_BF16, DT_I32, DT_I64};
static const char *const DTN[] = {"f32", "f16", "bf16", "i32", "i64", "u8"};
static const dt_redop OPS[] = {DT_SUM, DT_AVG, DT_MAX, DT_MIN};

static void check_allreduce(dt_dtype t, dt_redop op, size_t n, uint64_t salt, int inplace,
                            int nonblocking) {
    size_t es = dt_dtype_size(t);
    char *in = malloc(n * es + 1), *out = malloc(n * es + 1), *ref = malloc(n * es + 1);
    double *abs_ = malloc(n * sizeof(double) + 1);
    fill(in, t, g_rank, salt, n);
    void *dst = inplace ? in : out;
    if (nonblocking) {
        dt_request_t rq;
        OK(dt_iallreduce(in, dst, n, t, op, W, &rq));
        OK(dt_wait(&rq));
    } else {
        OK(dt_allreduce(in, dst, n, t, op, W));
    }
    reference(ref, abs_, t, op, g_size, salt, 0, n);
    char what[128];
    snprintf(what, sizeof what, "allreduce %s %s n=%zu%s%s", DTN[t], dt_redop_name(op), n,
             inplace ? " in-place" : "", nonblocking ? " nonblocking" : "");
    compare(what, dst, ref, abs_, t, n, g_exact);
    free(in);
    free(out);
    free(ref);
    free(abs_);
}

static void check_reduce(dt_dtype t, dt_redop op, size_t n, uint64_t salt, int root) {
    size_t es = dt_dtype_size(t);
    char *in = malloc(n * es + 1), *out = malloc(n * es + 1), *ref = malloc(n * es + 1);
    double *abs_ = malloc(n * sizeof(double) + 1);
    fill(in, t, g_rank, salt, n);
    memset(out, 0x5a, n * es);
    OK(dt_reduce(in, g_rank == root ? out : NULL, n, t, op, root, W));
    if (g_rank == root) {
        reference(ref, abs_, t, op, g_size, salt, 0, n);
        char what[128];
        snprintf(what, sizeof what, "reduce %s %s n=%zu root=%d", DTN[t], dt_redop_name(op), n,
                 root);
        compare(what, out, ref, abs_, t, n, g_exact);
    }
    free(in);
    free(out);
    free(ref);
    free(abs_);
}

static void check_reduce_scatter(dt_dtype t, dt_redop op, size_t rc, uint64_t salt, int inplace,
                                 int nonblocking) {
    size_t es = dt_dtype_size(t), n = rc * (size_t)g_size;
    char *in = malloc(n * es + 1), *out = malloc(rc * es + 1), *ref = malloc(rc * es + 1);
    double *abs_ = malloc(rc * sizeof(double) + 1);
    fill(in, t, g_rank, salt, n);
    void *dst = inplace ? in : out;
    if (nonblocking) {
        dt_request_t rq;
        OK(dt_ireduce_scatter(in, dst, rc, t, op, W, &rq));
        OK(dt_wait(&rq));
    } else {
        OK(dt_reduce_scatter(in, dst, rc, t, op, W));
    }
    reference(ref, abs_, t, op, g_size, salt, (size_t)g_rank * rc, rc);
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter %s %s recvcount=%zu%s%s", DTN[t],
             dt_redop_name(op), rc, inplace ? " in-place" : "", nonblocking ? " nonblocking" : "");
    compare(what, dst, ref, abs_, t, rc, g_exact);
    free(in);
    free(out);
    free(ref);
    free(abs_);
}

/* counts[p] = c + p*skew (uneven when skew != 0); zero_odd makes odd ranks
 * contribute nothing. */
static void check_allgather(dt_dtype t, size_t c, uint64_t salt, int skew, int zero_odd,
                            int inplace, int nonblocking) {
    size_t es = dt_dtype_size(t);
    size_t *counts = malloc((size_t)g_size * sizeof(size_t));
    size_t *displs = malloc((size_t)g_size * sizeof(size_t));
    size_t tot = 0;
    for (int p = 0; p < g_size; p++) {
        counts[p] = (zero_odd && (p & 1)) ? 0 : c + (size_t)p * (size_t)skew;
        displs[p] = tot + (size_t)p; /* a gap of p elements: displs are honoured */
        tot += counts[p];
    }
    tot += (size_t)g_size;
    char *out = malloc(tot * es + 1), *ref = malloc(tot * es + 1), *in = malloc(counts[g_rank] * es + 1);
    memset(out, 0x33, tot * es);
    memset(ref, 0x33, tot * es);
    for (int p = 0; p < g_size; p++) fill(ref + displs[p] * es, t, p, salt, counts[p]);
    fill(in, t, g_rank, salt, counts[g_rank]);
    const void *src = in;
    if (inplace) {
        memcpy(out + displs[g_rank] * es, in, counts[g_rank] * es);
        src = out + displs[g_rank] * es;
    }
    int equal = !skew && !zero_odd;
    if (nonblocking && equal) {
        /* equal counts with gaps cannot be expressed by allgather; use plain layout */
        free(out);
        free(ref);
        out = malloc(c * (size_t)g_size * es + 1);
        ref = malloc(c * (size_t)g_size * es + 1);
        for (int p = 0; p < g_size; p++) fill(ref + (size_t)p * c * es, t, p, salt, c);
        dt_request_t rq;
        OK(dt_iallgather(in, out, c, t, W, &rq));
        OK(dt_wait(&rq));
        tot = c * (size_t)g_size;
    } else if (equal && !inplace) {
        free(out);
        free(ref);
        out = malloc(c * (size_t)g_size * es + 1);
        ref = malloc(c * (size_t)g_size * es + 1);
        for (int p = 0; p < g_size; p++) fill(ref + (size_t)p * c * es, t, p, salt, c);
        OK(dt_allgather(in, out, c, t, W));
        tot = c * (size_t)g_size;
    } else {
        OK(dt_allgatherv(src, counts[g_rank], out, counts, displs, t, W));
    }
    char what[128];
    snprintf(what, sizeof what, "allgather%s %s count=%zu skew=%d%s%s", equal ? "" : "v",
             DTN[t], c, skew, inplace ? " in-place" : "", nonblocking ? " nonblocking" : "");
    compare(what, out, ref, NULL, t, tot, 1);
    free(out);
    free(ref);
    free(in);
    free(counts);
    free(displs);
}

static void check_broadcast(dt_dtype t, size_t n, uint64_t salt, int root, int inplace,
                            int nonblocking) {
    size_t es = dt_dtype_size(t);
    char *buf = malloc(n * es + 1), *out = malloc(n * es + 1), *ref = malloc(n * es + 1);
    fill(ref, t, root, salt, n);
    if (g_rank == root) fill(buf, t, root, salt, n);
    else memset(buf, 0x11, n * es);
    void *dst = inplace ? buf : out;
    if (nonblocking) {
        dt_request_t rq;
        OK(dt_ibroadcast(buf, dst, n, t, root, W, &rq));
        OK(dt_wait(&rq));
    } else {
        OK(dt_broadcast(buf, dst, n, t, root, W));
    }
    char what[128];
    snprintf(what, sizeof what, "broadcast %s n=%zu root=%d%s", DTN[t], n, root,
             inplace ? " in-place" : "");
    compare(what, dst, ref, NULL, t, n, 1);
    free(buf);
    free(out);
    free(ref);
}

static void check_sendrecv(size_t n, uint64_t salt) {
    if (g_size < 2) return;
    float *out = malloc(n * 4 + 4), *in = malloc(n * 4 + 4), *ref = malloc(n * 4 + 4);
    int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    fill(out, DT_F32, g_rank, salt, n);
    fill(ref, DT_F32, prev, salt, n);
    if (g_rank % 2 == 0) {
        OK(dt_send(out, n, DT_F32, next, W));
        OK(dt_recv(in, n, DT_F32, prev, W));
    } else {
        OK(dt_recv(in, n, DT_F32, prev, W));
        OK(dt_send(out, n, DT_F32, next, W));
    }
    char what[64];
    snprintf(what, sizeof what, "send/recv ring n=%zu", n);
    compare(what, in, ref, NULL, DT_F32, n, 1);
    free(out);
    free(in);
    free(ref);
}

/* Non-blocking point to point: both directions at once with messages far
 * larger than the channels (a blocking send-first exchange would wait for
 * ever), several messages to one peer in flight (order kept), completion
 * by polling, and a transfer in flight across a collective. */
static void check_p2p(void) {
    if (g_size < 2) return;
    int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    size_t n = (4u << 20) / 4, sizes[3] = {0, 70001, 13};
    float *out = malloc(n * 4), *in = malloc(n * 4), *ref = malloc(n * 4);
    fill(out, DT_F32, g_rank, 4001, n);
    fill(ref, DT_F32, prev, 4001, n);
    dt_request_t rr, rs;
    OK(dt_irecv(in, n, DT_F32, prev, W, &rr));
    OK(dt_isend(out, n, DT_F32, next, W, &rs));
    OK(dt_wait(&rs));
    OK(dt_wait(&rr));
    compare("isend/irecv ring 4 MiB", in, ref, NULL, DT_F32, n, 1);

    /* three messages to one peer in flight, waited for in reverse order */
    float *m_out[3], *m_in[3];
    dt_request_t q_out[3], q_in[3];
    for (int k = 0; k < 3; k++) {
        m_out[k] = malloc(sizes[k] * 4 + 4);
        m_in[k] = malloc(sizes[k] * 4 + 4);
        fill(m_out[k], DT_F32, g_rank, 4100 + (uint64_t)k, sizes[k]);
        OK(dt_isend(m_out[k], sizes[k], DT_F32, next, W, &q_out[k]));
    }
    for (int k = 0; k < 3; k++) OK(dt_irecv(m_in[k], sizes[k], DT_F32, prev, W, &q_in[k]));
    for (int k = 2; k >= 0; k--) {
        OK(dt_wait(&q_in[k]));
        OK(dt_wait(&q_out[k]));
        fill(ref, DT_F32, prev, 4100 + (uint64_t)k, sizes[k]);
        compare("isend/irecv in order", m_in[k], ref, NULL, DT_F32, sizes[k], 1);
        free(m_out[k]);
        free(m_in[k]);
    }

    /* polled to completion with dt_test, a collective in between */
    OK(dt_isend(out, n, DT_F32, next, W, &rs));
    OK(dt_irecv(in, n, DT_F32, prev, W, &rr));
    float x = 1;
    OK(dt_allreduce(&x, &x, 1, DT_F32, DT_SUM, W));
    g_checks++;
    if (x != (float)g_size) FAILF("allreduce beside transfers gave %g", x);
    for (int done_r = 0, done_s = 0; !done_r || !done_s;) {
        if (!done_r) OK(dt_test(&rr, &done_r));
        if (!done_s) OK(dt_test(&rs, &done_s));
        if (!done_r || !done_s) usleep(100);
    }
    g_checks++;
    if (rr || rs) FAILF("dt_test: completed requests were not freed");
    fill(ref, DT_F32, prev, 4001, n);
    compare("isend/irecv polled", in, ref, NULL, DT_F32, n, 1);
    free(out);
    free(in);
    free(ref);
}

/* Several non-blocking ops in flight, then a blocking one: results and
 * order must be right. */
static void check_overlap(void) {
    size_t n = 300007;
    float *a = malloc(n * 4), *b = malloc(n * 4 * (size_t)g_size), *c = malloc(n * 4);
    float *ra = malloc(n * 4), *rb = malloc(n * 4 * (size_t)g_size), *rc = malloc(n * 4);
    double *abs_ = malloc(n * sizeof(double));
    fill(a, DT_F32, g_rank, 901, n);
    fill(c, DT_F32, g_rank, 903, n);
    dt_request_t q1, q2, q3;
    OK(dt_iallreduce(a, a, n, DT_F32, DT_SUM, W, &q1));
    OK(dt_iallgather(c, b, n, DT_F32, W, &q2));
    OK(dt_ibroadcast(c, c, 1000, DT_F32, g_size - 1, W, &q3));
    int done = 0;
    OK(dt_test(&q1, &done)); /* either answer is fine; must not block */
    /* the other twins, in flight together */
    size_t *cnt = malloc((size_t)g_size * 2 * sizeof(size_t));
    size_t tot = 0;
    for (int p = 0; p < g_size; p++) {
        cnt[p] = (size_t)p + 1;
        cnt[g_size + p] = tot;
        tot += (size_t)p + 1;
    }
    int32_t mine[64], gv[64 * 64 + 64], red[7], rin[7];
    for (int k = 0; k <= g_rank; k++) mine[k] = g_rank * 100 + k;
    for (int k = 0; k < 7; k++) rin[k] = g_rank + k;
    dt_request_t q4, q5, q6;
    OK(dt_iallgatherv(mine, (size_t)g_rank + 1, gv, cnt, cnt + g_size, DT_I32, W, &q4));
    free(cnt); /* counts/displs may go once the call returns */
    OK(dt_ireduce(rin, red, 7, DT_I32, DT_MAX, 0, W, &q5));
    OK(dt_ibarrier(W, &q6));
    OK(dt_wait(&q6));
    OK(dt_wait(&q5));
    OK(dt_wait(&q4));
    g_checks += 2;
    for (int p = 0, o = 0; p < g_size; p++)
        for (int k = 0; k <= p; k++, o++)
            if (gv[o] != p * 100 + k) FAILF("iallgatherv: element %d = %d", o, gv[o]);
    if (g_rank == 0)
        for (int k = 0; k < 7; k++)
            if (red[k] != g_size - 1 + k) FAILF("ireduce: element %d = %d", k, red[k]);
    float x = 1;
    OK(dt_allreduce(&x, &x, 1, DT_F32, DT_SUM, W));
    OK(dt_wait(&q3));
    OK(dt_wait(&q2));
    OK(dt_wait(&q1));
    OK(dt_wait(&q1)); /* NULL request: no-op */
    reference(ra, abs_, DT_F32, DT_SUM, g_size, 901, 0, n);
    compare("overlap iallreduce", a, ra, abs_, DT_F32, n, g_exact);
    for (int p = 0; p < g_size; p++) fill(rb + (size_t)p * n, DT_F32, p, 903, n);
    compare("overlap iallgather", b, rb, NULL, DT_F32, n * (size_t)g_size, 1);
    fill(rc, DT_F32, g_size - 1, 903, 1000);
    compare("overlap ibroadcast", c, rc, NULL, DT_F32, 1000, 1);
    g_checks++;
    if (x != (float)g_size) FAILF("overlap: blocking allreduce gave %g, expected %d", x, g_size);
    free(a); free(b); free(c); free(ra); free(rb); free(rc); free(abs_);
}

/* Sub-communicators: by parity, and one that leaves rank 0 out. */
static void check_split(void) {
    dt_comm_t sub;
    OK(dt_comm_split(W, g_rank % 2, -g_rank, &sub));
    int members = (g_size + 1 - g_rank % 2) / 2;
    g_checks++;
    if (!sub || dt_comm_size(sub) != members) {
        FAILF("split: size %d, expected %d", sub ? dt_comm_size(sub) : -1, members);
        return;
    }
    /* key = -rank: the highest world rank of each color is sub rank 0 */
    int expect_rank = (g_size - 1 - g_rank) / 2;
    if (dt_comm_rank(sub) != expect_rank)
        FAILF("split: rank %d, expected %d", dt_comm_rank(sub), expect_rank);
    int64_t v = g_rank + 1, sum = 0;
    OK(dt_allreduce(&v, &sum, 1, DT_I64, DT_SUM, sub));
    int64_t want = 0;
    for (int p = g_rank % 2; p < g_size; p += 2) want += p + 1;
    if (sum != want) FAILF("split allreduce: %lld, expected %lld", (long long)sum, (long long)want);
    /* a large one through the sub-communicator's own segment */
    size_t n = 200003;
    float *buf = malloc(n * 4);
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 97);
    OK(dt_allreduce(buf, buf, n, DT_F32, DT_SUM, sub));
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(i % 97) * (float)members) {
            FAILF("split: large allreduce element %zu = %g", i, buf[i]);
            break;
        }
    free(buf);
    dt_comm_t sub2;
    OK(dt_comm_split(W, g_rank == 0 ? DT_COMM_UNDEFINED : 7, 0, &sub2));
    if ((g_rank == 0) != (sub2 == NULL)) FAILF("split with DT_COMM_UNDEFINED: wrong membership");
    if (sub2) {
        OK(dt_barrier(sub2));
        if (dt_comm_size(sub2) != g_size - 1) FAILF("split: sub2 size %d", dt_comm_size(sub2));
    }
    dt_comm_destroy(sub2);
    dt_comm_destroy(sub);
}

/* Same inputs twice, in and out of place: identical bits, and identical on
 * every rank (compared through an allgather of a hash). */
static void check_determinism(size_t n) {
    float *a = malloc(n * 4), *b = malloc(n * 4);
    fill(a, DT_F32, g_rank, 77, n);
    fill(b, DT_F32, g_rank, 77, n);
    float *o = malloc(n * 4);
    OK(dt_allreduce(a, o, n, DT_F32, DT_SUM, W));
    OK(dt_allreduce(b, b, n, DT_F32, DT_SUM, W));
    g_checks++;
    if (memcmp(o, b, n * 4)) FAILF("determinism: in-place and out-of-place results differ");
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)o;
    for (size_t i = 0; i < n * 4; i++) h = (h ^ p[i]) * 1099511628211ull;
    uint64_t *all = malloc((size_t)g_size * 8);
    OK(dt_allgather(&h, all, 1, DT_I64, W));
    for (int r = 0; r < g_size; r++)
        if (all[r] != h) FAILF("determinism: rank %d's result differs from rank %d's", r, g_rank);
    free(a); free(b); free(o); free(all);
}

/* Argument errors: DT_ERR_ARG, a message, and the communicator still works. */
static void check_arg_errors(void) {
    float x[4] = {1, 2, 3, 4};
    struct {
        dt_status s;
        const char *what;
    } cases[] = {
        {dt_allreduce(x, x, 4, (dt_dtype)99, DT_SUM, W), "bad dtype"},
        {dt_allreduce(x, x, 4, DT_F32, (dt_redop)9, W), "bad op"},
        {dt_allreduce(NULL, x, 4, DT_F32, DT_SUM, W), "NULL send"},
        {dt_broadcast(x, x, 4, DT_F32, g_size, W), "root out of range"},
        {dt_reduce(x, x, 4, DT_F32, DT_SUM, -1, W), "negative root"},
        {dt_send(x, 4, DT_F32, g_rank, W), "send to self"},
        {dt_recv(x, 4, DT_F32, g_size + 3, W), "recv from nobody"},
        {dt_allreduce(x, x, 4, DT_F32, DT_SUM, NULL), "NULL communicator"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g_checks++;
        if (cases[i].s != DT_ERR_ARG) FAILF("%s: status %d, expected DT_ERR_ARG", cases[i].what, cases[i].s);
    }
    g_checks++;
    if (dt_comm_get_async_error(W) != DT_OK) FAILF("argument errors broke the communicator");
    OK(dt_allreduce(x, x, 4, DT_F32, DT_SUM, W));
    g_checks++;
    if (x[3] != 4.0f * (float)g_size) FAILF("allreduce after argument errors: %g", x[3]);
    /* a world of more than one rank needs a launcher or MPI */
    dt_comm_params p = dt_comm_default_params();
    p.backend = "shm";
    p.shm_name = "";
    p.rank = 1;
    p.size = 2;
    dt_comm_t bad = NULL;
    g_checks++;
    if (dt_comm_init(&p, &bad) != DT_ERR_CONFIG || bad) FAILF("dt_comm_init without a segment accepted rank 1 of 2");
}

static void mode_all(void) {
    static const size_t counts[] = {0, 1, 2, 7, 13, 127, 1031, 4099, 8191, 8200, 65537, 262147};
    const int NC = (int)(sizeof counts / sizeof counts[0]);
    uint64_t salt = 1;
    for (int ti = 0; ti < 5; ti++) {
        dt_dtype t = DTYPES[ti];
        for (int oi = 0; oi < 4; oi++)
            for (int ci = 0; ci < NC; ci++) {
                size_t n = counts[ci];
                int bigc = n > 10000;
                if (n > 100000 && g_size > 4) continue; /* O(n^2) reference: keep it quick */
                if (bigc && !(oi == 0 || (oi == 2 && ti == 3) || (oi == 1 && ti == 2))) continue;
                check_allreduce(t, OPS[oi], n, salt++, ci % 2, 0);
                int root = (int)(salt % (uint64_t)g_size);
                if (!bigc || ti == 0) check_reduce(t, OPS[oi], n, salt++, root);
                size_t rc = n / (size_t)(g_size > 1 ? g_size : 1) + (n % 3);
                if (rc * (size_t)g_size < 400000) check_reduce_scatter(t, OPS[oi], rc, salt++, ci % 2, 0);
            }
        for (int ci = 0; ci < NC; ci++) {
            size_t n = counts[ci];
            if (n > 70000 && ti) continue;
            check_allgather(t, n, salt++, 0, 0, 0, 0);
            check_allgather(t, n, salt++, 3, 0, ci % 2, 0);
            check_allgather(t, n, salt++, 0, 1, 0, 0);
            check_broadcast(t, n, salt++, ci % g_size, ci % 2, 0);
        }
    }
    /* non-blocking twins */
    check_allreduce(DT_F32, DT_SUM, 100003, salt++, 0, 1);
    check_allreduce(DT_BF16, DT_AVG, 5, salt++, 1, 1);
    check_reduce_scatter(DT_F32, DT_SUM, 50021, salt++, 0, 1);
    check_allgather(DT_F32, 70001, salt++, 0, 0, 0, 1);
    check_broadcast(DT_I32, 300001, salt++, 0, 0, 1);
    check_overlap();
    check_arg_errors();
    for (int i = 0; i < 5; i++) OK(dt_barrier(W));
    check_sendrecv(0, salt++);
    check_sendrecv(1, salt++);
    check_sendrecv(100003, salt++);
    check_p2p();
    check_split();
    check_determinism(1000003);
    /* destroy and create the world again: the same segment, the same ranks,
     * this time through explicit parameters */
    dt_comm_destroy(W);
    dt_comm_params prm = dt_comm_default_params();
    prm.timeout = 60;
    prm.check = 1;
    OK(dt_comm_init(&prm, &W));
    if (dt_comm_rank(W) != g_rank || dt_comm_size(W) != g_size) FAILF("re-init: rank/size changed");
    check_allreduce(DT_F32, DT_SUM, 262147, salt++, 0, 0);
    check_allreduce(DT_F32, DT_SUM, 5, salt++, 0, 0);
}

/* 64 MiB: inputs whose sums are exact in fp32, so the reference is a formula. */
static void mode_big(void) {
    size_t n = (64u << 20) / 4;
    float *buf = malloc(n * 4);
    if (!buf) exit(2);
    for (size_t i = 0; i < n; i++) buf[i] = (float)((i % 1024) + (size_t)g_rank) * 0.5f;
    OK(dt_allreduce(buf, buf, n, DT_F32, DT_SUM, W));
    g_checks++;
    double tri = (double)g_size * (g_size - 1) / 2;
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(((double)(i % 1024) * g_size + tri) * 0.5)) {
            FAILF("big allreduce: element %zu = %g", i, buf[i]);
            break;
        }
    /* reduce_scatter of the same 64 MiB: rank r keeps block r */
    size_t rc = n / (size_t)g_size;
    for (size_t i = 0; i < n; i++) buf[i] = (float)((i % 1024) + (size_t)g_rank) * 0.5f;
    OK(dt_reduce_scatter(buf, buf, rc, DT_F32, DT_SUM, W));
    g_checks++;
    for (size_t i = 0; i < rc; i++) {
        size_t gi = (size_t)g_rank * rc + i;
        if (buf[i] != (float)(((double)(gi % 1024) * g_size + tri) * 0.5)) {
            FAILF("big reduce_scatter: element %zu = %g", i, buf[i]);
            break;
        }
    }
    /* allgather back to 64 MiB, in place */
    for (size_t i = 0; i < rc; i++) buf[(size_t)g_rank * rc + i] = (float)(g_rank * 3 + (int)(i % 5));
    OK(dt_allgather(buf + (size_t)g_rank * rc, buf, rc, DT_F32, W));
    g_checks++;
    for (size_t i = 0; i < rc * (size_t)g_size; i++)
        if (buf[i] != (float)((int)(i / rc) * 3 + (int)((i % rc) % 5))) {
            FAILF("big allgather: element %zu = %g", i, buf[i]);
            break;
        }
    /* broadcast 64 MiB from the last rank */
    int root = g_size - 1;
    for (size_t i = 0; i < n; i++) buf[i] = g_rank == root ? (float)(i % 4093) : -1.0f;
    OK(dt_broadcast(buf, buf, n, DT_F32, root, W));
    g_checks++;
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(i % 4093)) {
            FAILF("big broadcast: element %zu = %g", i, buf[i]);
            break;
        }
    /* reduce 64 MiB to rank 0 */
    float *out = g_rank == 0 ? malloc(n * 4) : NULL;
    for (size_t i = 0; i < n; i++) buf[i] = (float)((i % 1024) + (size_t)g_rank) * 0.5f;
    OK(dt_reduce(buf, out, n, DT_F32, DT_SUM, 0, W));
    if (g_rank == 0) {
        g_checks++;
        for (size_t i = 0; i < n; i++)
            if (out[i] != (float)(((double)(i % 1024) * g_size + tri) * 0.5)) {
                FAILF("big reduce: element %zu = %g", i, out[i]);
                break;
            }
        free(out);
    }
    free(buf);
}

/* Every algorithm of the backend, forced one at a time on a fresh
 * sub-communicator (DTRAIN_COMM_ALGO is read when a communicator is
 * created): allreduce, reduce and broadcast x dtypes x ops x counts against
 * the serial reference. ring, rhd and tree combine in tree or ring order,
 * not 0..n-1, so their float sums are compared with a tolerance; they must
 * still be bitwise repeatable and identical on every rank. */
static void mode_algos(void) {
    static const char *const shm_algos[] = {"direct", "rsag", "ring", "rhd", "tree", NULL};
    static const char *const mpi_algos[] = {"mpi", "ring", "rhd", "tree", NULL};
    static const size_t counts[] = {0, 1, 2, 3, 7, 13, 131, 1031, 8191, 70001};
    const int NC = (int)(sizeof counts / sizeof counts[0]);
    int shm = !strcmp(dt_comm_backend(W), "shm");
    const char *old = getenv("DTRAIN_COMM_ALGO");
    char *saved_env = old ? strdup(old) : NULL;
    dt_comm_t world = W;
    uint64_t salt = 5000;
    for (const char *const *al = shm ? shm_algos : mpi_algos; *al; al++) {
        setenv("DTRAIN_COMM_ALGO", *al, 1);
        OK(dt_comm_split(world, 0, g_rank, &W));
        int in_order = !strcmp(*al, "direct") || !strcmp(*al, "rsag");
        g_exact = shm && in_order;
        for (int ti = 0; ti < 5; ti++)
            for (int oi = 0; oi < 4; oi++)
                for (int ci = 0; ci < NC; ci++) {
                    size_t n = counts[ci];
                    if (n > 10000 && (ti || oi)) continue;
                    check_allreduce(DTYPES[ti], OPS[oi], n, salt++, ci % 2, 0);
                    int root = (int)(salt % (uint64_t)g_size);
                    check_reduce(DTYPES[ti], OPS[oi], n, salt++, root);
                    if (!oi) check_broadcast(DTYPES[ti], n, salt++, ci % g_size, ci % 2, 0);
                }
        /* MPI's own allreduce (mpi, and tree, which is not an allreduce)
         * promises no bitwise repeatability */
        if (shm || !strcmp(*al, "ring") || !strcmp(*al, "rhd")) check_determinism(100003);
        dt_comm_destroy(W);
        W = world;
    }
    if (saved_env) setenv("DTRAIN_COMM_ALGO", saved_env, 1);
    else unsetenv("DTRAIN_COMM_ALGO");
    free(saved_env);
    g_exact = shm;
}

// ----------------------------------------------------------------------------
// failure modes

static int expect_failure(dt_status s, int code, const char *what) {
    if (s == DT_OK) {
        fprintf(stderr, "rank %d: %s: expected an error, got DT_OK\n", g_rank, what);
        return 1;
    }
    fprintf(stderr, "rank %d: got expected error: %s: %s\n", g_rank, dt_status_string(s),
            dt_last_error());
    /* the communicator stays broken */
    float x = 0;
    if (dt_allreduce(&x, &x, 1, DT_F32, DT_SUM, W) == DT_OK) {
        fprintf(stderr, "rank %d: collective after the error succeeded\n", g_rank);
        return 1;
    }
    if (dt_comm_get_async_error(W) == DT_OK) {
        fprintf(stderr, "rank %d: dt_comm_get_async_error says healthy\n", g_rank);
        return 1;
    }
    return code;
}

static int mode_kill(void) {
    size_t n = (16u << 20) / 4;
    float *buf = calloc(n, 4);
    for (int it = 0; it < 1000000; it++) {
        if (g_rank == g_size - 1 && it == 3) {
            /* die while the others are inside the collective */
            usleep(100000);
            kill(getpid(), SIGKILL);
        }
        dt_status s = dt_allreduce(buf, buf, n, DT_F32, DT_SUM, W);
        if (s != DT_OK) {
            free(buf);
            return expect_failure(s, 3, "kill");
        }
    }
    free(buf);
    return 1;
}

static int mode_mismatch(void) {
    dt_comm_set_check(W, 1);
    float buf[16] = {0};
    OK(dt_allreduce(buf, buf, 16, DT_F32, DT_SUM, W));
    size_t n = g_rank == 1 ? 9 : 8;
    return expect_failure(dt_allreduce(buf, buf, n, DT_F32, DT_SUM, W), 4, "mismatch");
}

/* Check mode off: the shm backend's always-on check must still catch a
 * mismatch, here one that also sends the ranks down different paths (small
 * and pipelined), and a dtype mismatch. */
static int mode_mismatch_fast(const char *what) {
    dt_comm_set_check(W, 0);
    size_t n = 1 << 16;
    float *buf = calloc(n, 4);
    OK(dt_allreduce(buf, buf, 100, DT_F32, DT_SUM, W));
    dt_status s;
    if (!strcmp(what, "dtype"))
        s = dt_allreduce(buf, buf, 100, g_rank == 1 ? DT_I32 : DT_F32, DT_SUM, W);
    else
        s = dt_allreduce(buf, buf, g_rank == 1 ? 8200 : 8191, DT_F32, DT_SUM, W);
    free(buf);
    return expect_failure(s, 4, "mismatch without check mode");
}

static int mode_hang(void) {
    dt_comm_set_timeout(W, 0.5);
    float x = 1;
    OK(dt_allreduce(&x, &x, 1, DT_F32, DT_SUM, W));
    if (g_rank == g_size - 1) {
        sleep(3);
        return 5;
    }
    dt_status s = dt_allreduce(&x, &x, 1, DT_F32, DT_SUM, W);
    /* the message names the op, its seq and the sleeping rank (here or, if
     * a peer timed out first, in the reason it sent) */
    char who[64];
    snprintf(who, sizeof who, "ranks not arrived: %d", g_size - 1);
    if (s != DT_OK && (!strstr(dt_last_error(), "allreduce (seq 2") || !strstr(dt_last_error(), who))) {
        fprintf(stderr, "rank %d: hang: the error does not name op, seq 2 and rank %d: %s\n",
                g_rank, g_size - 1, dt_last_error());
        return 1;
    }
    return expect_failure(s, 5, "hang");
}

/* The last rank never sends or receives; the others wait for it in an
 * irecv (even ranks) or an isend too large for the channel (odd ranks) and
 * must time out naming it (exit 7); with `die`, it dies instead (exit 3). */
static int mode_p2p_fail(int die) {
    dt_comm_set_timeout(W, die ? 30 : 0.5);
    int last = g_size - 1;
    OK(dt_barrier(W));
    if (g_rank == last) {
        if (die) {
            usleep(200000);
            kill(getpid(), SIGKILL);
        }
        sleep(3);
        return 7;
    }
    size_t n = (4u << 20) / 4;
    float *buf = calloc(n, 4);
    dt_request_t r;
    if (g_rank % 2 == 0) OK(dt_irecv(buf, n, DT_F32, last, W, &r));
    else OK(dt_isend(buf, n, DT_F32, last, W, &r));
    int done = 1;
    OK(dt_test(&r, &done));
    if (done) {
        fprintf(stderr, "rank %d: dt_test says done before the peer took part\n", g_rank);
        return 1;
    }
    dt_status s = dt_wait(&r);
    free(buf);
    return expect_failure(s, die ? 3 : 7, die ? "p2p peer died" : "p2p hang");
}

static int mode_abort(void) {
    float x = 1;
    OK(dt_allreduce(&x, &x, 1, DT_F32, DT_SUM, W));
    if (g_rank == 0) {
        dt_comm_abort(W, "test abort");
        return expect_failure(dt_barrier(W), 6, "abort (self)");
    }
    size_t n = 1 << 20;
    float *buf = calloc(n, 4);
    dt_status s = dt_allreduce(buf, buf, n, DT_F32, DT_SUM, W);
    free(buf);
    return expect_failure(s, 6, "abort");
}

// ----------------------------------------------------------------------------
// wire: the bytes handed to MPI (mpi_bytes.c)

typedef void (*mpi_bytes_fn)(uint64_t *moved, uint64_t *reduced, int *widest);

static void wire_case(mpi_bytes_fn counters, dt_dtype t, int rs, size_t n, int inplace) {
    uint64_t moved, reduced;
    int widest;
    dt_barrier(W);
    counters(&moved, &reduced, &widest);
    if (rs == 2) check_reduce(t, DT_SUM, n, 77 + n, inplace);  // inplace: the root
    else if (rs) check_reduce_scatter(t, DT_SUM, n, 77 + n, inplace, 0);
    else check_allreduce(t, DT_SUM, n, 77 + n, inplace, 0);
    counters(&moved, &reduced, &widest);
    // What a ring would move in fp32: 2(n-1)/n of the vector for an
    // allreduce, (n-1) blocks for a reduce-scatter.
    size_t N = rs == 1 ? n * (size_t)g_size : n;
    double ring32 = (rs ? 1.0 : 2.0) * (g_size - 1) * (double)N * 4 / g_size;
    uint64_t want = 0;
    if (rs == 2) {  // a reduce: every rank but the root sends its vector
        want = g_rank == inplace ? 0 : (uint64_t)n * 2;
        ring32 = (double)n * 4;
    } else if (rs) {
        want = (uint64_t)(g_size - 1) * n * 2;
    } else {
        for (int p = 0; p < g_size; p++) {
            size_t b, e;
            dt_shard_range(n, p, g_size, &b, &e);
            want += p == g_rank ? (uint64_t)(e - b) * 2 * (uint64_t)(g_size - 1) : (uint64_t)(e - b) * 2;
        }
    }
    const char *what = rs == 2 ? "reduce" : rs ? "reduce_scatter" : "allreduce";
    g_checks++;
    int hier = !strcmp(dt_comm_backend(W), "hier");
    // hier: the host's ranks sum through shared memory, the leaders send
    // the host's sums between hosts (at most the allreduce's volume).
    if (reduced || widest > 2 || (hier ? moved > want : moved != want))
        FAILF("wire %s %s n=%zu%s: MPI got %llu bytes to move (want %s%llu), %llu to reduce (want 0), elements of "
              "up to %d bytes (want <= 2)", what, t == DT_BF16 ? "bf16" : "f16", n, inplace ? " in place" : "",
              (unsigned long long)moved, hier ? "<= " : "", (unsigned long long)want, (unsigned long long)reduced,
              widest);
    else if (g_rank == (rs == 2 && inplace == g_size - 1 ? 0 : g_size - 1) && n > 1000)  // a reduce: not the root
        printf("wire %s %s n=%zu%s on %d ranks (%s): rank %d handed MPI %llu bytes of 16-bit elements to move, "
               "none to reduce: %.3f of fp32's bytes\n", what, t == DT_BF16 ? "bf16" : "f16", n,
               inplace ? " in place" : "", g_size, dt_comm_backend(W), g_rank, (unsigned long long)moved, moved / ring32);
}

static int mode_wire(void) {
    mpi_bytes_fn counters = (mpi_bytes_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "dt_test_mpi_bytes");
    if (!counters) {
        fprintf(stderr, "comm_worker wire: run with mpirun -x LD_PRELOAD=libmpi_bytes.so (no byte counters)\n");
        return 2;
    }
    // The mpi backend sums the 16-bit blocks in rank order and rounds once:
    // the serial reference, bit for bit.
    if (!strcmp(dt_comm_backend(W), "mpi")) g_exact = 1;
    size_t sizes[] = {1, 7, 1000, 3 * (1u << 20) + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int inplace = 0; inplace < 2; inplace++) {
            wire_case(counters, DT_BF16, 0, sizes[i], inplace);
            wire_case(counters, DT_F16, 0, sizes[i], inplace);
            wire_case(counters, DT_BF16, 1, sizes[i], inplace);
            wire_case(counters, DT_BF16, 2, sizes[i], inplace);  // reduce to rank 0, then 1
        }
    return 0;
}

/* What every rank of every generation runs once the victims are gone:
 * collectives on both paths of the backend, against the reference. */
static void spare_suite(void) {
    for (int t = 0; t < 3; t++) {
        check_allreduce(DTYPES[t], DT_SUM, 7, 901 + t, 1, 0);
        check_allreduce(DTYPES[t], DT_SUM, 262147, 911 + t, 0, 0);
    }
    check_allreduce(DT_F32, DT_AVG, 65537, 921, 0, 1);
    check_broadcast(DT_F32, 8200, 931, g_size - 1, 1, 0);
    check_broadcast(DT_I64, 262147, 932, 0, 0, 0);
    check_sendrecv(100000, 941);
    check_determinism(1031);
}

static int mode_spare(const char *victims, int joined) {
    int v[16], nv = 0;
    for (const char *p = victims; p && *p && nv < 16;) {
        v[nv++] = atoi(p);
        p = strchr(p, ',');
        if (p) p++;
    }
    if (joined) {
        dt_status s = dt_comm_rejoin(W, 30);
        if (s != DT_OK) {
            fprintf(stderr, "rank %d (newcomer): rejoin failed: %s\n", g_rank, dt_last_error());
            return 1;
        }
        fprintf(stderr, "rank %d (newcomer): joined generation %llu\n", g_rank,
                (unsigned long long)dt_comm_generation(W));
    }
    size_t n = (16u << 20) / 4;
    float *buf = calloc(n, 4);
    for (;;) {
        uint64_t g = dt_comm_generation(W);
        int victim = g < (uint64_t)nv ? v[g] : -1;
        int failed = 0;
        for (int it = 0; it < (victim >= 0 ? 1000000 : 5) && !failed; it++) {
            if (g_rank == victim && it == 3) {
                usleep(100000); /* die while the others are inside the collective */
                kill(getpid(), SIGKILL);
            }
            dt_status s = dt_allreduce(buf, buf, n, DT_F32, DT_SUM, W);
            if (s == DT_OK) continue;
            fprintf(stderr, "rank %d: generation %llu: allreduce failed: %s\n", g_rank, (unsigned long long)g,
                    dt_last_error());
            double t0 = dt_now();
            if ((s = dt_comm_rejoin(W, 30)) != DT_OK) {
                fprintf(stderr, "rank %d: rejoin failed: %s\n", g_rank, dt_last_error());
                free(buf);
                return 1;
            }
            fprintf(stderr, "rank %d: rejoined generation %llu in %.3f s\n", g_rank,
                    (unsigned long long)dt_comm_generation(W), dt_now() - t0);
            failed = 1;
        }
        if (!failed) break;
    }
    free(buf);
    spare_suite();
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    int joined = 0;
    if (dt_spare_is()) {
        int r;
        if (dt_spare_wait(&r) != DT_OK) {
            fprintf(stderr, "comm_worker spare: %s\n", dt_last_error());
            return 2;
        }
        if (r < 0) { /* released: the run is over */
            fprintf(stderr, "comm_worker spare: released\n");
            return 0;
        }
        joined = 1;
    }
    if (dt_comm_init_env(&W) != DT_OK) {
        fprintf(stderr, "comm_worker: %s\n", dt_last_error());
        return 2;
    }
    g_rank = dt_comm_rank(W);
    g_size = dt_comm_size(W);
    g_exact = !strcmp(dt_comm_backend(W), "shm");
    if (argc > 2 && strcmp(argv[2], dt_comm_backend(W))) {
        fprintf(stderr, "comm_worker: backend %s, expected %s\n", dt_comm_backend(W), argv[2]);
        return 1;
    }
    int rc = 0;
    if (!strcmp(mode, "all")) mode_all();
    else if (!strcmp(mode, "big")) mode_big();
    else if (!strcmp(mode, "algos")) mode_algos();
    else if (!strcmp(mode, "kill")) rc = mode_kill();
    else if (!strcmp(mode, "mismatch")) rc = mode_mismatch();
    else if (!strcmp(mode, "mismatch_fast")) rc = mode_mismatch_fast("count");
    else if (!strcmp(mode, "mismatch_dtype")) rc = mode_mismatch_fast("dtype");
    else if (!strcmp(mode, "hang")) rc = mode_hang();
    else if (!strcmp(mode, "abort")) rc = mode_abort();
    else if (!strcmp(mode, "p2p_hang")) rc = mode_p2p_fail(0);
    else if (!strcmp(mode, "p2p_kill")) rc = mode_p2p_fail(1);
    else if (!strcmp(mode, "wire")) rc = mode_wire();
    else if (!strcmp(mode, "spare")) rc = mode_spare(argc > 3 ? argv[3] : "", joined);
    else {
        fprintf(stderr, "comm_worker: unknown mode '%s'\n", mode);
        rc = 2;
    }
    if (!rc) {
        if (g_rank == 0)
            printf("comm_worker %s: backend %s, %d ranks on %d node(s): %d checks, %d failed\n",
                   mode, dt_comm_backend(W), g_size, dt_comm_nnodes(W), g_checks, g_failed);
        rc = g_failed ? 1 : 0;
    }
    fflush(NULL);
    /* after a failure the peers may be gone: skip the collective teardown */
    dt_comm_destroy(W);
    return rc;
}
