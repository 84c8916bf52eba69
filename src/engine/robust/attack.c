/* Simulated attacks for tests and benches (robust.h, DTRAIN_ATTACK). */
#include "engine/robust/robust.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const attack_names[] = {"none", "signflip", "scale", "random", "lie", "labelflip", "nan", NULL};

dt_status dt_attack_from_env(dt_attack *a) {
    memset(a, 0, sizeof *a);
    const char *s = getenv("DTRAIN_ATTACK");
    if (!s || !*s) return DT_OK;
    char kind[32];
    double f;
    int used = 0;
    if (sscanf(s, "%31[a-z]:%lf%n", kind, &f, &used) == 2 && !s[used] && f >= 0 && f <= 1)
        for (int k = 1; attack_names[k]; k++)
            if (!strcmp(kind, attack_names[k])) {
                a->kind = k;
                a->fraction = f;
                return DT_OK;
            }
    return dt_error(DT_ERR_CONFIG, "DTRAIN_ATTACK: expected KIND:FRACTION, KIND one of signflip, scale, random, lie, "
                    "labelflip, nan and FRACTION in [0, 1], got '%s'", s);
}

int dt_attack_count(const dt_attack *a, int K) { return a->kind ? (int)lround(a->fraction * K) : 0; }

void dt_attack_row(const dt_attack *a, float *x, size_t n, uint64_t seed) {
    if (a->kind == DT_ATTACK_SIGNFLIP || a->kind == DT_ATTACK_SCALE) {
        float s = a->kind == DT_ATTACK_SIGNFLIP ? -1.0f : -10.0f;
        for (size_t i = 0; i < n; i++) x[i] *= s;
    } else if (a->kind == DT_ATTACK_RANDOM) {
        dt_rng r;
        dt_rng_seed(&r, seed);
        for (size_t i = 0; i < n; i++) x[i] = dt_rng_normal(&r);
    } else if (a->kind == DT_ATTACK_NAN && n > 0) {
        x[n / 2] = NAN;
    }
}

// The standard normal quantile of p in (0, 1), by bisection on the CDF.
static double normal_quantile(double p) {
    double lo = -10, hi = 10;
    for (int it = 0; it < 100; it++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

void dt_attack_lie(float *const *rows, int k, const uint8_t *evil, size_t lo, size_t hi) {
    int bad = 0;
    for (int j = 0; j < k; j++) bad += evil[j] != 0;
    int honest = k - bad, s = k / 2 + 1 - bad;  // Baruch et al.: the supporters the attackers need
    if (bad == 0 || honest == 0) return;
    double z = s > 0 && s < k ? normal_quantile((double)(k - s) / k) : 1.0;
#pragma omp parallel for schedule(static)
    for (size_t i = lo; i < hi; i++) {
        double sum = 0, sum2 = 0;
        for (int j = 0; j < k; j++)
            if (!evil[j]) sum += rows[j][i];
        double mean = sum / honest;
        for (int j = 0; j < k; j++)
            if (!evil[j]) sum2 += (rows[j][i] - mean) * (rows[j][i] - mean);
        float v = (float)(mean - z * sqrt(sum2 / honest));
        for (int j = 0; j < k; j++)
            if (evil[j]) rows[j][i] = v;
    }
}
