/* A federated round's aggregation (round.h): the screen, the sums, the
 * robust combination of the gathered updates and the server step. */
#include "engine/federated/round.h"
#include "engine/federated/fedparts.h"
#include "engine/strategies/strategy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t fed_round_key(const dt_config *c, int r, int k) {
    uint64_t z = c->seed * 0x9e3779b97f4a7c15ull + (uint64_t)r * 0xbf58476d1ce4e5b9ull + (uint64_t)(k + 1);
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    return z ^ (z >> 29);
}

void fed_put_double(int64_t *slot, double x) { memcpy(slot, &x, sizeof x); }
double fed_get_double(const int64_t *slot) {
    double x;
    memcpy(&x, slot, sizeof x);
    return x;
}

// Client k's share of the round's `total` samples.
double fed_share_of(const fed *f, int k, long total) {
    return total ? (double)(f->start[k + 1] - f->start[k]) / (double)total : 0;
}

// Every rank the same: which of the round's clients are left out (did not
// report, or screened: a NaN or Inf in the update, or a norm above
// [federated] outlier x the median; under DP non-finite ones only), each
// screened one named in the log and in summary.json's left_out.
void fed_screen(fed *f, int r) {
    int m = f->m;
    double *sq = malloc(sizeof(double) * (size_t)m);
    if (!sq) return;
    for (int j = 0; j < m; j++) {  // (a client without samples sends nothing: out of the median and the sums)
        int k = f->sampled[j];
        f->bad[j] = !f->meta[j] || f->start[k + 1] == f->start[k];
        sq[j] = fed_get_double(&f->meta[m + j]);
    }
    float outlier = f->sigma > 0 ? 0 : f->c->fed_robust.outlier;
    uint8_t *before = malloc((size_t)m);
    if (before) memcpy(before, f->bad, (size_t)m);
    dt_robust_screen(sq, m, outlier, f->bad);
    for (int j = 0; j < m && before; j++) {
        if (!f->bad[j] || before[j]) continue;
        const char *why = isfinite(sq[j]) ? "norm" : "nonfinite";
        if (f->rank == 0)
            dt_log(DT_LOG_WARN, "round %d: client %d left out: its update %s", r, f->sampled[j],
                   isfinite(sq[j]) ? "has a norm above [federated] outlier x the round's median norm"
                                   : "holds NaN or Inf");
        f->nleft++;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "round", r);
        cJSON_AddNumberToObject(e, "client", f->sampled[j]);
        cJSON_AddNumberToObject(e, "norm", isfinite(sq[j]) ? sqrt(sq[j]) : -1);
        cJSON_AddStringToObject(e, "reason", why);
        if (f->left_out && cJSON_GetArraySize(f->left_out) < 1000) cJSON_AddItemToArray(f->left_out, e);
        else cJSON_Delete(e);
    }
    free(before);
    free(sq);
}

// This rank's kept clients' updates into the sums, weighted by their share
// of the round (1 each under DP), masked when secure.
void fed_sum_rows(fed *f, long total, uint64_t key) {
    size_t n = f->n;
    memset(f->acc, 0, sizeof(int64_t) * n);
    if (f->c->fed_secure) memset(f->msum, 0, sizeof(uint32_t) * n);
    for (int j = f->rank; j < f->m; j += f->W) {
        int k = f->sampled[j];
        if (f->bad[j]) continue;
        double weight = f->sigma > 0 ? 1 : fed_share_of(f, k, total);
        const float *row = f->rows + (size_t)j * n;
        if (f->c->fed_secure) {
            dt_secagg_mask(f->masked, row, n, weight, k, f->sampled, f->m, key);
            for (size_t i = 0; i < n; i++) f->msum[i] += f->masked[i];
        } else {
            dt_fixed_add(f->acc, row, n, weight * DT_FIXED_SCALE);
        }
    }
    if (f->c->fed_secure)
        for (size_t i = 0; i < n; i++) f->acc[i] = f->msum[i];  // what the server receives: masked sums
}

// The aggregate of the gathered rows (robust.h) into f->grads: FedAvg's
// weights (the clients' shares) for mean and clip, equal ones otherwise.
static void combine_rows(fed *f, long total) {
    int m = f->m;
    size_t n = f->n;
    const dt_robust_params *p = &f->c->fed_robust;
    float **rows = malloc(sizeof(float *) * (size_t)m);
    double *w = malloc(sizeof(double) * (size_t)m), *sq = malloc(sizeof(double) * (size_t)m);
    double *d2 = dt_robust_needs_d2(p) ? malloc(sizeof(double) * (size_t)m * m) : NULL;
    if (rows && w && sq) {
        for (int j = 0; j < m; j++) {
            rows[j] = f->rows + (size_t)j * n;
            w[j] = fed_share_of(f, f->sampled[j], total);
        }
        if (f->attack.kind == DT_ATTACK_LIE) {
            uint8_t *evil = calloc((size_t)m, 1);
            for (int j = 0; j < m && evil; j++) evil[j] = j < f->evil && !f->bad[j];
            if (evil) dt_attack_lie(rows, m, evil, 0, n);
            free(evil);
        }
        dt_robust_stats((const float *const *)rows, m, 0, n, sq, d2);
        dt_robust_combine(p, (const float *const *)rows, w, m, n, sq, d2, f->bad, f->grads, NULL);
    }
    free(rows), free(w), free(sq), free(d2);
}

// The server step of round r from the allreduced sums or rows: the mean
// update (renormalised over the kept clients' share of the round's
// `total` samples, unmasked with the round's key when secure; the robust
// aggregate when gathered; the noisy sum over the m sampled under DP), the
// server optimizer's step. Fills the outputs of run_round.
dt_status fed_server_step(fed *f, int r, long total, uint64_t key, int *reported, float *loss, float *norm,
                             int *applied) {
    const dt_config *c = f->c;
    size_t n = f->n;
    int m = f->m;
    int *surv = malloc(sizeof(int) * (size_t)m * 2), *drop = surv + m, ns = 0, nd = 0;
    if (!surv) return dt_error(DT_ERR_NOMEM, "out of memory");
    double P = 0, L = 0;
    for (int j = 0; j < m; j++) {
        int k = f->sampled[j];
        if (f->bad[j]) {
            drop[nd++] = k;
            continue;
        }
        surv[ns++] = k;
        P += fed_share_of(f, k, total);
        L += fed_share_of(f, k, total) * fed_get_double(&f->meta[2 * m + j]);
    }
    *reported = ns;
    *applied = 0;
    *norm = 0;
    *loss = P > 0 ? (float)(L / P) : 0;
    if (ns < c->fed_min_clients || P <= 0) {
        dt_log(DT_LOG_WARN, "round %d: %d of %d clients reported, fewer than min_clients = %d: the model is unchanged",
               r, ns, m, c->fed_min_clients);
        free(surv);
        return DT_OK;
    }
    if (f->gather) {
        combine_rows(f, total);
    } else if (c->fed_secure) {
        for (size_t i = 0; i < n; i++) f->msum[i] = (uint32_t)f->acc[i];
        dt_secagg_unmask(f->msum, n, surv, ns, drop, nd, key);
        dt_secagg_decode(f->msum, f->grads, n);
    } else {
        dt_fixed_to_float(f->grads, f->acc, n);
    }
    free(surv);
    // The mean update as the server optimizer's negative gradient. DP: the
    // sum of the clipped updates plus N(0, (sigma C)^2), over the m sampled
    // (the same noise on every rank: drawn from the round's key).
    float inv = (float)(f->gather ? -1.0 : f->sigma > 0 ? -1.0 / m : -1.0 / P);
    dt_rng g;
    dt_rng_seed(&g, fed_round_key(c, r, -3));
    double sd = f->sigma * c->fed_dp_clip;
    for (size_t i = 0; i < n && f->sigma > 0; i++) f->grads[i] += (float)(sd * dt_rng_normal(&g));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) f->grads[i] *= inv;
    *norm = (float)sqrt(dt_sum_squares(f->grads, n));
    dt_optim_step(f->server_opt, f->global, f->grads, c->fed_server_lr, 1);
    *applied = 1;
    return DT_OK;
}
