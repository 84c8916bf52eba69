/* Client partitions and secure-aggregation masks (fedparts.h). */
#include "engine/federated/fedparts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// partitions

// Gamma(a, 1) by Marsaglia and Tsang (a < 1: Gamma(a + 1) x U^(1/a)).
static double gamma_draw(dt_rng *r, double a) {
    if (a < 1) {
        double u = dt_rng_uniform(r);
        return gamma_draw(r, a + 1) * pow(u > 0 ? u : 1e-300, 1 / a);
    }
    double d = a - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x = dt_rng_normal(r), v = 1 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = dt_rng_uniform(r);
        if (u < 1 - 0.0331 * x * x * x * x || log(u > 0 ? u : 1e-300) < 0.5 * x * x + d * (1 - v + log(v))) return d * v;
    }
}

// The samples sorted by label (stable), into order[n].
static void by_label(const int32_t *y, int n, int classes, uint32_t *order, int *cstart) {
    memset(cstart, 0, sizeof(int) * (size_t)(classes + 1));
    for (int i = 0; i < n; i++) cstart[y[i] + 1]++;
    for (int k = 0; k < classes; k++) cstart[k + 1] += cstart[k];
    int *at = malloc(sizeof(int) * (size_t)classes);
    memcpy(at, cstart, sizeof(int) * (size_t)classes);
    for (int i = 0; i < n; i++) order[at[y[i]]++] = (uint32_t)i;
    free(at);
}

dt_status dt_fed_partition(const dt_config *c, const int32_t *y, int n, int classes, uint32_t **idx, int **start) {
    int C = c->fed_clients;
    *idx = NULL;
    *start = NULL;
    if (n < C)
        return dt_error(DT_ERR_CONFIG, "[federated] clients = %d: more clients than the %d training samples", C, n);
    if (c->fed_partition == 1 && (long)C * c->fed_shards > n)
        return dt_error(DT_ERR_CONFIG, "[federated] shards = %d: %d clients x %d shards is more than the %d training samples",
                        c->fed_shards, C, c->fed_shards, n);
    uint32_t *out = malloc(sizeof(uint32_t) * (size_t)n);
    int *st = calloc((size_t)C + 1, sizeof(int));
    uint32_t *order = malloc(sizeof(uint32_t) * (size_t)n);
    int *cstart = malloc(sizeof(int) * (size_t)(classes + 1));
    int *owner = malloc(sizeof(int) * (size_t)n);  // client of each sample
    double *p = malloc(sizeof(double) * (size_t)C);
    if (!out || !st || !order || !cstart || !owner || !p) {
        free(out), free(st), free(order), free(cstart), free(owner), free(p);
        return dt_error(DT_ERR_NOMEM, "client partition: out of memory");
    }
    dt_rng r;
    dt_rng_seed(&r, c->seed ^ 0x6665646176675f70ull);
    if (c->fed_partition == 0) {  // iid
        for (int i = 0; i < n; i++) order[i] = (uint32_t)i;
        dt_rng_shuffle(&r, order, (size_t)n);
        for (int k = 0; k < C; k++)
            for (int i = (int)((long)n * k / C); i < (int)((long)n * (k + 1) / C); i++) owner[order[i]] = k;
    } else if (c->fed_partition == 1) {  // shards of the label-sorted samples
        by_label(y, n, classes, order, cstart);
        int S = C * c->fed_shards;
        uint32_t *shard = malloc(sizeof(uint32_t) * (size_t)S);
        for (int s = 0; s < S; s++) shard[s] = (uint32_t)s;
        dt_rng_shuffle(&r, shard, (size_t)S);
        for (int j = 0; j < S; j++) {  // the j-th shard drawn goes to client j / shards
            int s = (int)shard[j];
            for (int i = (int)((long)n * s / S); i < (int)((long)n * (s + 1) / S); i++) owner[order[i]] = j / c->fed_shards;
        }
        free(shard);
    } else {  // dirichlet label skew
        by_label(y, n, classes, order, cstart);
        for (int k = 0; k < classes; k++) {
            int lo = cstart[k], nk = cstart[k + 1] - lo;
            dt_rng_shuffle(&r, order + lo, (size_t)nk);
            double sum = 0;
            for (int j = 0; j < C; j++) sum += p[j] = gamma_draw(&r, c->fed_alpha);
            double acc = 0;
            int from = 0;
            for (int j = 0; j < C; j++) {
                acc += p[j];
                int to = j == C - 1 ? nk : (int)llround(nk * (sum > 0 ? acc / sum : (double)(j + 1) / C));
                for (int i = from; i < to; i++) owner[order[lo + i]] = j;
                from = to > from ? to : from;
            }
        }
    }
    for (int i = 0; i < n; i++) st[owner[i] + 1]++;
    for (int k = 0; k < C; k++) st[k + 1] += st[k];
    int *at = malloc(sizeof(int) * (size_t)C);
    memcpy(at, st, sizeof(int) * (size_t)C);
    for (int i = 0; i < n; i++) out[at[owner[i]]++] = (uint32_t)i;  // ascending within a client
    free(at);
    free(order), free(cstart), free(owner), free(p);
    *idx = out;
    *start = st;
    return DT_OK;
}

// ----------------------------------------------------------------------------
// secure aggregation

static inline uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The seed of the mask shared by clients a < b.
static uint64_t pair_seed(uint64_t key, int a, int b) {
    return mix64(key ^ mix64(((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 0x9e3779b97f4a7c15ull));
}

// v[i] += sign x mask(a, b)[i] mod 2^32.
static void add_mask(uint32_t *v, size_t n, uint64_t key, int a, int b, int sign) {
    uint64_t s = pair_seed(key, a < b ? a : b, a < b ? b : a);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint32_t m = (uint32_t)(mix64(s + 0x9e3779b97f4a7c15ull * (i + 1)) >> 32);
        v[i] += sign > 0 ? m : (uint32_t)0 - m;
    }
}

void dt_secagg_mask(uint32_t *out, const float *x, size_t n, double weight, int me, const int *clients, int m,
                    uint64_t key) {
    double scale = weight * (double)(1u << DT_SECAGG_FRAC_BITS);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        double q = (double)x[i] * scale;  // clamped into the signed 32-bit range
        out[i] = (uint32_t)(int32_t)llrint(q > 2147483647.0 ? 2147483647.0 : q < -2147483648.0 ? -2147483648.0 : q);
    }
    for (int j = 0; j < m; j++)
        if (clients[j] != me) add_mask(out, n, key, me, clients[j], me < clients[j] ? 1 : -1);
}

void dt_secagg_unmask(uint32_t *sum, size_t n, const int *survivors, int ns, const int *dropped, int nd,
                      uint64_t key) {
    for (int i = 0; i < ns; i++)
        for (int d = 0; d < nd; d++)  // survivor i added +-mask(i, d); take it away
            add_mask(sum, n, key, survivors[i], dropped[d], survivors[i] < dropped[d] ? -1 : 1);
}

void dt_secagg_decode(const uint32_t *sum, float *out, size_t n) {
    double inv = 1.0 / (double)(1u << DT_SECAGG_FRAC_BITS);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = (float)((double)(int32_t)sum[i] * inv);
}
