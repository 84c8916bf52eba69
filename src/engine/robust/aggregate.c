/* Robust aggregators, the screen of faulty updates and their config check
 * (robust.h). */
#include "engine/robust/robust.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const dt_agg_names[] = {"mean", "median", "trimmed", "krum", "clip"};

int dt_robust_needs_d2(const dt_robust_params *p) { return p->kind == DT_AGG_KRUM; }

void dt_robust_stats(const float *const *rows, int k, size_t lo, size_t hi, double *sq, double *d2) {
    for (int a = 0; a < k; a++) {
        double s = 0;
        for (size_t i = lo; i < hi; i++) s += (double)rows[a][i] * rows[a][i];
        sq[a] = s;
    }
    if (!d2) return;
    for (int a = 0; a < k; a++) {
        d2[a * k + a] = 0;
        for (int b = a + 1; b < k; b++) {
            double s = 0;
            for (size_t i = lo; i < hi; i++) {
                double d = (double)rows[a][i] - rows[b][i];
                s += d * d;
            }
            d2[a * k + b] = d2[b * k + a] = s;
        }
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int dt_robust_screen(const double *sq, int k, float outlier, uint8_t *bad) {
    double *v = malloc(sizeof(double) * (size_t)(k ? k : 1));
    int nv = 0, found = 0;
    for (int j = 0; j < k; j++) {
        if (bad[j]) continue;
        if (!isfinite(sq[j])) {
            bad[j] = 1;
            found++;
        } else if (v) {
            v[nv++] = sqrt(sq[j]);
        }
    }
    if (outlier > 0 && v && nv > 0) {
        qsort(v, (size_t)nv, sizeof *v, cmp_double);
        double med = nv % 2 ? v[nv / 2] : 0.5 * (v[nv / 2 - 1] + v[nv / 2]);
        for (int j = 0; j < k; j++)
            if (!bad[j] && sqrt(sq[j]) > (double)outlier * med) {
                bad[j] = 1;
                found++;
            }
    }
    free(v);
    return found;
}

// ----------------------------------------------------------------------------
// the aggregators

// Insertion sort of v[m] (m is the number of updates: small).
static void sort_floats(float *v, int m) {
    for (int a = 1; a < m; a++) {
        float x = v[a];
        int b = a;
        for (; b > 0 && v[b - 1] > x; b--) v[b] = v[b - 1];
        v[b] = x;
    }
}

// Coordinate-wise: median (cut < 0) or the mean of v sorted without `cut` at each end.
static void coordinatewise(const float *const *rows, const int *use, int m, size_t n, int cut, float *out) {
#pragma omp parallel
    {
        float *v = malloc(sizeof(float) * (size_t)m);
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; i++) {
            if (!v) continue;
            for (int j = 0; j < m; j++) v[j] = rows[use[j]][i];
            sort_floats(v, m);
            if (cut < 0) {
                out[i] = m % 2 ? v[m / 2] : (float)(0.5 * ((double)v[m / 2 - 1] + v[m / 2]));
            } else {
                double s = 0;
                for (int j = cut; j < m - cut; j++) s += v[j];
                out[i] = (float)(s / (m - 2 * cut));
            }
        }
        free(v);
    }
}

// out = sum c[j] rows[use[j]] / total, in double, in row order.
static void weighted_sum(const float *const *rows, const int *use, const double *c, int m, size_t n, double total,
                         float *out) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < m; j++) s += c[j] * rows[use[j]][i];
        out[i] = (float)(s / total);
    }
}

// Krum's choice among use[m]: c[j] = 1 for the krum_m lowest scores, else 0.
static void krum_choose(const dt_robust_params *p, const int *use, int m, int k, const double *d2, double *c) {
    double *score = malloc(sizeof(double) * (size_t)m * 2), *d = score + m;
    int near = m - p->krum_f - 2;
    if (near < 1) near = 1;
    for (int a = 0; a < m; a++) {
        int nd = 0;
        for (int b = 0; b < m; b++)
            if (b != a) d[nd++] = d2[use[a] * k + use[b]];
        qsort(d, (size_t)nd, sizeof *d, cmp_double);
        score[a] = 0;
        for (int j = 0; j < near && j < nd; j++) score[a] += d[j];
        c[a] = 0;
    }
    for (int t = 0; t < p->krum_m && t < m; t++) {
        int best = -1;
        for (int a = 0; a < m; a++)
            if (c[a] == 0 && (best < 0 || score[a] < score[best])) best = a;
        c[best] = 1;
    }
    free(score);
}

int dt_robust_combine(const dt_robust_params *p, const float *const *rows, const double *w, int k, size_t n,
                      const double *sq, const double *d2, const uint8_t *bad, float *out, uint8_t *chosen) {
    int *use = malloc(sizeof(int) * (size_t)(k ? k : 1)), m = 0;
    double *c = malloc(sizeof(double) * (size_t)(k ? k : 1));
    if (!use || !c) return free(use), free(c), 0;
    for (int j = 0; j < k; j++)
        if (!bad || !bad[j]) use[m++] = j;
    for (int j = 0; chosen && j < k; j++) chosen[j] = 0;
    if (m > 0) {
        for (int j = 0; j < m; j++) c[j] = w ? w[use[j]] : 1.0;
        if (p->kind == DT_AGG_MEDIAN || p->kind == DT_AGG_TRIMMED) {
            coordinatewise(rows, use, m, n, p->kind == DT_AGG_MEDIAN ? -1 : (int)floor((double)p->trim * m), out);
        } else {
            if (p->kind == DT_AGG_KRUM) krum_choose(p, use, m, k, d2, c);
            double total = 0;  // the weights' sum, before clipping scales them
            for (int j = 0; j < m; j++) total += c[j];
            if (p->kind == DT_AGG_CLIP)
                for (int j = 0; j < m; j++) {
                    double norm = sqrt(sq[use[j]]);
                    if (norm > p->clip) c[j] *= p->clip / norm;
                }
            weighted_sum(rows, use, c, m, n, total, out);
        }
        for (int j = 0; j < m && chosen; j++) chosen[use[j]] = p->kind != DT_AGG_KRUM || c[j] != 0;
    }
    free(use);
    free(c);
    return m;
}

// ----------------------------------------------------------------------------
// the config check

dt_status dt_robust_check(const dt_robust_params *p, int k, const char *where, int secure) {
    if (p->kind != DT_AGG_MEAN && secure)
        return dt_error(DT_ERR_CONFIG, "%s aggregator = %s: cannot combine with secure aggregation (it needs every "
                        "update in the clear; secure aggregation shows the server only their sum): use aggregator = "
                        "mean or secure = false", where, dt_agg_names[p->kind]);
    int cut = (int)floor((double)p->trim * k);
    if (p->kind == DT_AGG_TRIMMED && 2 * cut >= k)
        return dt_error(DT_ERR_CONFIG, "%s trim = %g: cutting floor(%g x %d) = %d updates at each end of %d leaves "
                        "none; use trim < %g", where, (double)p->trim, (double)p->trim, k, cut, k, 0.5);
    if (p->kind == DT_AGG_KRUM && k <= 2 * p->krum_f + 2)
        return dt_error(DT_ERR_CONFIG, "%s krum_f = %d: Krum needs more than 2 f + 2 = %d updates a step, it has %d",
                        where, p->krum_f, 2 * p->krum_f + 2, k);
    if (p->kind == DT_AGG_KRUM && p->krum_m > k - p->krum_f)
        return dt_error(DT_ERR_CONFIG, "%s krum_m = %d: multi-Krum averages at most n - f = %d - %d = %d updates",
                        where, p->krum_m, k, p->krum_f, k - p->krum_f);
    if (p->kind == DT_AGG_CLIP && !(isfinite(p->clip) && p->clip > 0))
        return dt_error(DT_ERR_CONFIG, "%s clip_bound = %g: aggregator = clip needs a finite, positive bound on "
                        "every update's norm", where, (double)p->clip);
    return DT_OK;
}
