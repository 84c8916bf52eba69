/* The RDP accountant of DP-FedAvg (privacy.h has the formulas). */
#include "engine/federated/privacy.h"

#include <math.h>
#include <stddef.h>

double dt_rdp_sampled_gaussian(double q, double sigma, int alpha) {
    if (q >= 1) return alpha / (2 * sigma * sigma);
    // log A by log-sum-exp over the terms k = 0 .. alpha.
    double terms[DT_RDP_MAX_ORDER + 1], top = -INFINITY;
    for (int k = 0; k <= alpha; k++) {
        double lb = lgamma(alpha + 1.0) - lgamma(k + 1.0) - lgamma(alpha - k + 1.0);
        terms[k] = lb + (alpha - k) * log1p(-q) + k * log(q) + (double)k * (k - 1) / (2 * sigma * sigma);
        if (terms[k] > top) top = terms[k];
    }
    double s = 0;
    for (int k = 0; k <= alpha; k++) s += exp(terms[k] - top);
    return (top + log(s)) / (alpha - 1);
}

double dt_rdp_epsilon(double q, double sigma, int rounds, double delta, int *order) {
    double best = INFINITY;
    if (order) *order = 0;
    if (!(sigma > 0)) return best;
    for (int a = 2; a <= DT_RDP_MAX_ORDER; a++) {
        double eps = rounds * dt_rdp_sampled_gaussian(q, sigma, a) + log((a - 1.0) / a) - (log(delta) + log(a)) / (a - 1);
        if (eps < best) {
            best = eps;
            if (order) *order = a;
        }
    }
    return best < 0 ? 0 : best;
}

double dt_rdp_noise_for(double q, int rounds, double delta, double epsilon) {
    double lo = 1e-3, hi = 1;
    while (dt_rdp_epsilon(q, hi, rounds, delta, NULL) > epsilon && hi < 1e6) hi *= 2;
    while (hi - lo > 1e-4 * hi) {
        double mid = 0.5 * (lo + hi);
        if (dt_rdp_epsilon(q, mid, rounds, delta, NULL) > epsilon) lo = mid;
        else hi = mid;
    }
    return hi;
}
