/* Mode sync's robust step (ps.c has the overview): the screen of faulty
 * gradients and [ps] aggregator over the N pushes of a step, each server
 * over its range, with the whole-vector figures (squared norms, Krum's
 * distances) summed over the servers, so that every server leaves out and
 * chooses the same workers (engine/robust/robust.h). */
#include "engine/strategies/ps/ps_impl.h"

#include <math.h>
#include <stdlib.h>

// The pushes as float rows: the buffers, or (deterministic: int64 sums)
// their values in sv->rows.
static void rows_of(server *sv, float **rows) {
    for (int wi = 0; wi < sv->N; wi++) {
        rows[wi] = sv->det ? sv->rows + (size_t)wi * sv->len : (float *)sv->w[wi].buf;
        if (sv->det) dt_fixed_to_float(rows[wi], sv->w[wi].buf, sv->len);
    }
}

// Deterministic, no rows: the squared norms of the int64 pushes.
static void fixed_sq(const server *sv, double *sq) {
    for (int wi = 0; wi < sv->N; wi++) {
        const int64_t *a = sv->w[wi].buf;
        double s = 0;
        for (size_t i = 0; i < sv->len; i++) {
            double x = (double)a[i] / DT_FIXED_SCALE;
            s += x * x;
        }
        sq[wi] = s;
    }
}

// The sum of the kept pushes in worker order (bad NULL: all), into sv->grad:
// the int64 sums when deterministic (exact), else floats (rows: the
// deterministic pushes' float copies, which an attack changed).
static int sum_kept(server *sv, float **rows, const uint8_t *bad) {
    size_t len = sv->len;
    int first = -1, kept = 0;
    for (int wi = 0; wi < sv->N; wi++) {
        if (bad && bad[wi]) continue;
        kept++;
        if (sv->det && !rows) {
            int64_t *a = sv->w[first < 0 ? wi : first].buf;
            const int64_t *b = sv->w[wi].buf;
            if (first >= 0)
#pragma omp parallel for schedule(static)
                for (size_t i = 0; i < len; i++) a[i] += b[i];
        } else {
            const float *b = rows ? rows[wi] : (const float *)sv->w[wi].buf;
            if (first < 0) memcpy(sv->grad, b, sizeof(float) * len);
            else
#pragma omp parallel for schedule(static)
                for (size_t i = 0; i < len; i++) sv->grad[i] += b[i];
        }
        if (first < 0) first = wi;
    }
    if (first < 0) memset(sv->grad, 0, sizeof(float) * len);
    else if (sv->det && !rows) dt_fixed_to_float(sv->grad, sv->w[first].buf, len);
    return kept;
}

// The simulated attack of the first workers (DTRAIN_ATTACK, tests and benches).
static void attack(server *sv, float **rows) {
    int evil = dt_attack_count(&sv->attack, sv->N);
    if (sv->attack.kind == DT_ATTACK_LIE) {
        uint8_t *mask = calloc((size_t)sv->N, 1);
        for (int wi = 0; wi < evil && mask; wi++) mask[wi] = 1;
        if (mask) dt_attack_lie(rows, sv->N, mask, 0, sv->len);
        free(mask);
        return;
    }
    for (int wi = 0; wi < evil; wi++)
        dt_attack_row(&sv->attack, rows[wi], sv->len, (uint64_t)sv->step * 0x9e3779b97f4a7c15ull ^ (uint64_t)wi << 32 ^ sv->lo);
}

// The partial figures of every server summed (in fp32 over the wire: the
// screen and Krum's order need no more).
static dt_status sum_over_servers(server *sv, double *v, size_t n) {
    if (sv->S == 1) return DT_OK;
    float *f = malloc(sizeof(float) * n);
    if (!f) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    for (size_t i = 0; i < n; i++) f[i] = (float)v[i];
    dt_status st = dt_allreduce(f, f, n, DT_F32, DT_SUM, sv->mine);
    for (size_t i = 0; i < n; i++) v[i] = f[i];
    free(f);
    return st;
}

// Workers left out of this step: logged by server 0, counted.
static void report(server *sv, const uint8_t *bad, const double *sq) {
    for (int wi = 0; wi < sv->N; wi++) {
        if (!bad[wi]) continue;
        sv->stats[ST_LEFT_OUT]++;
        if (sv->me == 0)
            dt_log(DT_LOG_WARN, "step %lld: worker %d (rank %d) left out: its gradient %s", (long long)sv->step + 1, wi,
                   sv->w[wi].rank, isfinite(sq[wi]) ? "has a norm above [ps] outlier x the step's median norm"
                                                    : "holds NaN or Inf");
    }
}

// The step's gradient from the N pushes (mode sync), into sv->grad: the
// pushes screened (NaN/Inf always, outlier's norm rule when set), then the
// sum of the kept ones renormalised to N (mean: with none left out, the
// plain sum bit for bit), or N x [ps] aggregator's combination.
dt_status ps_reduce_pushes(server *sv) {
    int N = sv->N;
    const dt_robust_params *p = &sv->c->ps_robust;
    if (!sv->robust) return sum_kept(sv, NULL, NULL), DT_OK;
    int need_rows = !sv->det || p->kind != DT_AGG_MEAN || sv->attack.kind;
    float **rows = need_rows ? malloc(sizeof(float *) * (size_t)N) : NULL;
    double *sq = malloc(sizeof(double) * (size_t)N * (N + 1)), *d2 = dt_robust_needs_d2(p) ? sq + N : NULL;
    uint8_t *bad = calloc((size_t)N, 1);
    dt_status st = (rows || !need_rows) && sq && bad ? DT_OK : dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    if (st == DT_OK) {
        if (rows) rows_of(sv, rows);
        if (rows && sv->attack.kind) attack(sv, rows);
        if (rows) dt_robust_stats((const float *const *)rows, N, 0, sv->len, sq, d2);
        else fixed_sq(sv, sq);
        st = sum_over_servers(sv, sq, (size_t)N * (d2 ? N + 1 : 1));
    }
    if (st == DT_OK) {
        dt_robust_screen(sq, N, p->outlier, bad);
        report(sv, bad, sq);
        int kept;
        float scale;
        if (p->kind == DT_AGG_MEAN) {
            kept = sum_kept(sv, sv->det ? rows : NULL, bad);
            scale = kept ? (float)N / kept : 0;
        } else {  // the aggregate stands for the mean push
            kept = dt_robust_combine(p, (const float *const *)rows, NULL, N, sv->len, sq, d2, bad, sv->grad, NULL);
            scale = (float)N;
        }
        if (!kept) memset(sv->grad, 0, sizeof(float) * sv->len);
        if (kept && scale != 1.0f)
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < sv->len; i++) sv->grad[i] *= scale;
    }
    free(rows);
    free(sq);
    free(bad);
    return st;
}
