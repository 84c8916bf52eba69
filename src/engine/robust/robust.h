/* Robust aggregation of k updates of n values each (engine/robust/): what
 * federated rounds (engine/federated/federate.c) and parameter servers in
 * mode sync (engine/strategies/ps/server.c) combine their updates with
 * instead of the mean, the screen that leaves out faulty updates, the
 * config checks, and the attacks that tests and benches simulate
 * (docs/federated.md, docs/parameter-server.md).
 *
 * An aggregation is three calls, so that a parameter server holding one
 * range of the model can sum the whole-vector figures over the servers:
 *
 *   dt_robust_stats(rows, k, lo, hi, sq, d2)     partial squared norms and
 *                                                distances over [lo, hi)
 *   (sum sq and d2 over the ranges: an allreduce)
 *   dt_robust_screen(sq, k, outlier, bad)        the faulty updates
 *   dt_robust_combine(p, rows, w, k, n, sq, d2, bad, out, chosen)
 *
 * Every function is deterministic: the same rows give the same bits on
 * every rank, whatever the thread count. */
#ifndef DT_ENGINE_ROBUST_H
#define DT_ENGINE_ROBUST_H

#include "dtrain/config.h"

#include <stddef.h>
#include <stdint.h>

extern const char *const dt_agg_names[];  /* by dt_agg_kind */

/* Whether p needs the whole vector of every update (its squared norms or
 * pairwise distances): krum (d2), clip and the outlier rule (sq). */
int dt_robust_needs_d2(const dt_robust_params *p);

/* sq[j] = sum over [lo, hi) of rows[j][i]^2, and, when d2 is not NULL,
 * d2[a * k + b] = sum over [lo, hi) of (rows[a][i] - rows[b][i])^2, in
 * double, in index order. NaN or Inf in a row makes its sq non-finite. */
void dt_robust_stats(const float *const *rows, int k, size_t lo, size_t hi, double *sq, double *d2);

/* The screen of faulty updates: bad[j] = 1 (and counted in the return)
 * when sq[j] is not finite (NaN or Inf in the update), or, with outlier > 0,
 * when its norm sqrt(sq[j]) is above outlier x the median norm of the
 * updates with finite norms (a norm far beyond its peers'). Entries with
 * bad[j] already set (updates that never came) are left as they are and
 * do not count towards the median. */
int dt_robust_screen(const double *sq, int k, float outlier, uint8_t *bad);

/* out[n] = the aggregate of the rows j with !bad[j] (bad may be NULL), by
 * p->kind:
 *   mean     sum w_j x_j / sum w_j (w NULL: every weight 1)
 *   median   the coordinate-wise median (the mean of the two middle values
 *            for an even count)
 *   trimmed  coordinate-wise: the floor(trim x k) smallest and largest
 *            values cut, the mean of the rest
 *   krum     each update scored by the sum of its k - f - 2 smallest
 *            squared distances to the others (d2), the krum_m lowest
 *            scores (ties: the lower index) averaged with equal weights
 *   clip     every update scaled to norm <= p->clip (sq), then the mean
 * k counts the rows left after bad. chosen (NULL or k entries): 1 for
 * the rows that krum chose (every kept row for the others). Returns the
 * number of rows combined; 0 (out untouched) when none is left. The rows
 * are not changed. */
int dt_robust_combine(const dt_robust_params *p, const float *const *rows, const double *w, int k, size_t n,
                      const double *sq, const double *d2, const uint8_t *bad, float *out, uint8_t *chosen);

/* The config check of p for k updates a step (`where` names the section,
 * "[federated]" or "[ps]"; secure: the updates arrive masked): DT_ERR_CONFIG
 * with the numbers for a trim that leaves no update (2 floor(trim k) >= k),
 * krum with k <= 2 krum_f + 2 or krum_m > k - krum_f, clip without a
 * positive clip_bound, and any aggregator but mean under secure
 * aggregation (they need the updates in the clear). */
dt_status dt_robust_check(const dt_robust_params *p, int k, const char *where, int secure);

/* ---- simulated attacks (tests and benches only, never a training option) --
 * DTRAIN_ATTACK="KIND:FRACTION" makes the first round(FRACTION x K) of the
 * K updates of a step attackers: of each round's sampled clients, in
 * ascending order (dtrain federate), or of the workers (the parameter
 * servers' mode sync):
 *   signflip   send -x instead of their update x
 *   scale      send -10 x
 *   random     send Gaussian noise, N(0, 1) per value
 *   lie        "a little is enough" (Baruch et al., NeurIPS 2019): send
 *              mean - z std of the honest updates, coordinate-wise, z from
 *              the normal quantile for K and the attackers
 *   labelflip  train on labels flipped (y -> classes - 1 - y; dtrain
 *              federate only: the data is the client's)
 *   nan        a NaN in the middle of the update (a faulty worker) */
typedef enum { DT_ATTACK_NONE = 0, DT_ATTACK_SIGNFLIP, DT_ATTACK_SCALE, DT_ATTACK_RANDOM, DT_ATTACK_LIE,
               DT_ATTACK_LABELFLIP, DT_ATTACK_NAN } dt_attack_kind;

typedef struct {
    int kind;         /* dt_attack_kind */
    double fraction;  /* of the clients or workers */
} dt_attack;

/* DTRAIN_ATTACK into *a (kind NONE when unset); DT_ERR_CONFIG naming the
 * variable and what is expected. */
dt_status dt_attack_from_env(dt_attack *a);
/* The attackers among K updates: indices 0 .. dt_attack_count(a, K) - 1. */
int dt_attack_count(const dt_attack *a, int K);
/* Row x[n] of an attacker, replaced in place (signflip, scale, random: from
 * seed; nan), for the kinds that need no other update. */
void dt_attack_row(const dt_attack *a, float *x, size_t n, uint64_t seed);
/* lie: rows j with evil[j] set to mean - z std of the others, coordinate-
 * wise, over [lo, hi) (the servers' ranges: z depends only on k and the
 * attackers). */
void dt_attack_lie(float *const *rows, int k, const uint8_t *evil, size_t lo, size_t hi);

#endif
