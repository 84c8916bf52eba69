/* Click logs (recsys.h; the format in docs/recommender.md): the planted
 * model that generates them, the writer, the checked reader, and the AUC.
 *
 * File: a 32-byte header ("DTCLICK1", u32 version 1, u32 ndense, u32
 * ntables, u32 0, u64 records), u64 rows of each table, then the records,
 * little-endian and packed: u8 label, f32 dense[ndense], u32 id[ntables]. */
#include "dtrain/recsys.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADER_BYTES 32

size_t dt_clicks_record_bytes(int ndense, int ntables) { return 1 + 4 * (size_t)ndense + 4 * (size_t)ntables; }

void dt_clicks_free(dt_clicks *c) {
    if (!c) return;
    free(c->label);
    free(c->dense);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

// ----------------------------------------------------------------------------
// reading

// The field a byte offset inside a record falls in.
static void field_at(size_t off, int nd, char *buf, size_t n) {
    if (off == 0) snprintf(buf, n, "label");
    else if (off < 1 + 4 * (size_t)nd) snprintf(buf, n, "dense[%zu]", (off - 1) / 4);
    else snprintf(buf, n, "id[%zu]", (off - 1 - 4 * (size_t)nd) / 4);
}

static dt_status read_header(FILE *f, const char *path, dt_clicks *c, const dt_dlrm_spec *spec, long long *size) {
    uint8_t h[HEADER_BYTES];
    if (fread(h, 1, sizeof h, f) != sizeof h || memcmp(h, DT_CLICKS_MAGIC, 8))
        return dt_error(DT_ERR_FORMAT, "%s: not a click log (expected the magic '%s' in a %d-byte header)", path,
                        DT_CLICKS_MAGIC, HEADER_BYTES);
    uint32_t v[4];
    uint64_t n;
    memcpy(v, h + 8, 16);
    memcpy(&n, h + 24, 8);
    if (v[0] != 1) return dt_error(DT_ERR_FORMAT, "%s: header: version %u, expected 1", path, v[0]);
    if (v[1] > 4096 || v[2] < 1 || v[2] > DT_DLRM_MAX_TABLES)
        return dt_error(DT_ERR_FORMAT, "%s: header: %u dense features and %u tables (expected at most 4096 and 1 to %d)",
                        path, v[1], v[2], DT_DLRM_MAX_TABLES);
    c->ndense = (int)v[1];
    c->ntables = (int)v[2];
    if (spec && (spec->ndense != c->ndense || spec->ntables != c->ntables))
        return dt_error(DT_ERR_FORMAT, "%s: header: %d dense features and %d tables, but [recsys] has dense = %d and %d "
                        "tables", path, c->ndense, c->ntables, spec->ndense, spec->ntables);
    uint64_t rows[DT_DLRM_MAX_TABLES];
    if (fread(rows, 8, (size_t)c->ntables, f) != (size_t)c->ntables)
        return dt_error(DT_ERR_FORMAT, "%s: header: cut short in the tables' row counts", path);
    for (int t = 0; t < c->ntables; t++) {
        if (rows[t] < 1 || rows[t] > (1ull << 32))
            return dt_error(DT_ERR_FORMAT, "%s: header: table %d has %llu rows (expected 1 to 2^32)", path, t,
                            (unsigned long long)rows[t]);
        c->rows[t] = spec ? spec->rows[t] : (int64_t)rows[t];
    }
    size_t rb = dt_clicks_record_bytes(c->ndense, c->ntables), start = HEADER_BYTES + 8 * (size_t)c->ntables;
    if (n > (uint64_t)(*size - (long long)start) / rb) {  // fewer bytes than the header's records
        long long body = *size - (long long)start;
        long long whole = body / (long long)rb, part = body % (long long)rb;
        char fld[32];
        field_at((size_t)part, c->ndense, fld, sizeof fld);
        return dt_error(DT_ERR_FORMAT, "%s: record %lld: field %s: the file ends inside it (%lld whole records of the "
                        "header's %llu, then %lld bytes of a %zu-byte record)", path, whole, fld, whole,
                        (unsigned long long)n, part, rb);
    }
    if ((uint64_t)(*size - (long long)start) != n * rb)
        return dt_error(DT_ERR_FORMAT, "%s: %lld bytes after the header's %llu records of %zu bytes", path,
                        (long long)(*size - (long long)start - (long long)(n * rb)), (unsigned long long)n, rb);
    c->n = (int64_t)n;
    return DT_OK;
}

// One record's checks and values.
static dt_status take_record(dt_clicks *c, int64_t i, const uint8_t *r, const char *path) {
    if (r[0] > 1) return dt_error(DT_ERR_FORMAT, "%s: record %lld: field label: %u, expected 0 or 1", path, (long long)i, r[0]);
    c->label[i] = r[0];
    float *x = c->dense + i * c->ndense;
    memcpy(x, r + 1, 4 * (size_t)c->ndense);
    for (int j = 0; j < c->ndense; j++)
        if (!isfinite(x[j]) || x[j] < 0)
            return dt_error(DT_ERR_FORMAT, "%s: record %lld: field dense[%d]: %g, expected a finite value >= 0 (dense "
                            "features are counts)", path, (long long)i, j, (double)x[j]);
    uint32_t *id = c->ids + i * c->ntables;
    memcpy(id, r + 1 + 4 * (size_t)c->ndense, 4 * (size_t)c->ntables);
    for (int t = 0; t < c->ntables; t++)
        if ((int64_t)id[t] >= c->rows[t])
            return dt_error(DT_ERR_FORMAT, "%s: record %lld: field id[%d]: %u is outside table %d's %lld rows", path,
                            (long long)i, t, id[t], t, (long long)c->rows[t]);
    return DT_OK;
}

dt_status dt_clicks_load(dt_clicks *out, const char *path, const dt_dlrm_spec *spec) {
    memset(out, 0, sizeof *out);
    FILE *f = dt_fopen_read(path);
    if (!f) return dt_error(DT_ERR_IO, "click log %s", dt_last_error());
    fseek(f, 0, SEEK_END);
    long long size = ftell(f);
    rewind(f);
    dt_clicks c = {0};
    dt_status st = read_header(f, path, &c, spec, &size);
    size_t rb = dt_clicks_record_bytes(c.ndense, c.ntables);
    uint8_t *buf = NULL;
    if (st == DT_OK) {
        c.label = malloc((size_t)c.n + 1);
        c.dense = malloc(sizeof(float) * ((size_t)c.n * c.ndense + 1));
        c.ids = malloc(sizeof(uint32_t) * ((size_t)c.n * c.ntables + 1));
        buf = malloc(rb * 4096);
        if (!c.label || !c.dense || !c.ids || !buf) st = dt_error(DT_ERR_NOMEM, "%s: %lld records: out of memory", path, (long long)c.n);
    }
    for (int64_t i = 0; i < c.n && st == DT_OK; i += 4096) {
        size_t k = c.n - i < 4096 ? (size_t)(c.n - i) : 4096;
        if (fread(buf, rb, k, f) != k) st = dt_error(DT_ERR_IO, "%s: a read failed at record %lld", path, (long long)i);
        for (size_t j = 0; j < k && st == DT_OK; j++) st = take_record(&c, i + (int64_t)j, buf + j * rb, path);
    }
    free(buf);
    fclose(f);
    if (st != DT_OK) dt_clicks_free(&c);
    else *out = c;
    return st;
}

// ----------------------------------------------------------------------------
// the planted model and the writer

dt_clicks_gen dt_clicks_gen_default(void) {
    dt_clicks_gen g = {.ntables = 4, .rows = {1000, 500, 200, 100}, .ndense = 4, .train = 50000, .test = 10000,
                       .zipf = 1.1, .rank = 4, .scale = 1.0f, .seed = 1};
    return g;
}

typedef struct {
    const dt_clicks_gen *g;
    float bias, w[4096];
    float *a[DT_DLRM_MAX_TABLES];  // per-id weights
    float *e[DT_DLRM_MAX_TABLES];  // per-id planted embeddings [rows, rank]
} planted;

// An id of a table: a rank drawn from the power law (inverse of the
// continuous approximation of its CDF), scattered over the table by a
// multiplicative permutation so that the frequent ids are not the first rows.
static uint32_t draw_id(dt_rng *r, int64_t rows, double s) {
    double u = dt_rng_uniform(r), k;
    double N = (double)rows;
    if (fabs(s - 1) < 1e-9) k = exp(u * log(N + 1)) - 1;
    else k = pow(u * (pow(N + 1, 1 - s) - 1) + 1, 1 / (1 - s)) - 1;
    uint64_t rank = (uint64_t)k;
    if (rank >= (uint64_t)rows) rank = (uint64_t)rows - 1;
    uint64_t mult = 2654435761u;  // odd and prime: coprime with rows unless rows is a multiple of it
    if ((uint64_t)rows % mult == 0) mult = 1;
    return (uint32_t)((rank * mult + 12345) % (uint64_t)rows);
}

static dt_status planted_make(planted *p, const dt_clicks_gen *g) {
    memset(p, 0, sizeof *p);
    p->g = g;
    dt_rng r;
    dt_rng_seed(&r, g->seed * 0x9e3779b97f4a7c15ull + 7);
    p->bias = -1.0f;
    for (int j = 0; j < g->ndense; j++) p->w[j] = 0.5f * g->scale * dt_rng_normal(&r);
    float es = g->scale / sqrtf((float)(g->rank > 0 ? g->rank : 1)) / sqrtf((float)g->ntables) * 1.5f;
    for (int t = 0; t < g->ntables; t++) {
        p->a[t] = malloc(sizeof(float) * (size_t)g->rows[t]);
        p->e[t] = malloc(sizeof(float) * (size_t)g->rows[t] * (size_t)(g->rank > 0 ? g->rank : 1));
        if (!p->a[t] || !p->e[t]) return dt_error(DT_ERR_NOMEM, "the planted model's tables: out of memory");
        for (int64_t i = 0; i < g->rows[t]; i++) p->a[t][i] = 0.7f * g->scale * dt_rng_normal(&r);
        for (int64_t i = 0; i < g->rows[t] * g->rank; i++) p->e[t][i] = es * dt_rng_normal(&r);
    }
    return DT_OK;
}

static void planted_free(planted *p) {
    for (int t = 0; t < p->g->ntables; t++) free(p->a[t]), free(p->e[t]);
}

static float planted_logit(const planted *p, const float *x, const uint32_t *id) {
    const dt_clicks_gen *g = p->g;
    float z = p->bias;
    for (int j = 0; j < g->ndense; j++) z += p->w[j] * (log1pf(x[j]) - 0.7f);
    for (int t = 0; t < g->ntables; t++) z += p->a[t][id[t]];
    for (int t = 0; t < g->ntables; t++)
        for (int u = t + 1; u < g->ntables; u++) {
            const float *et = p->e[t] + (size_t)id[t] * g->rank, *eu = p->e[u] + (size_t)id[u] * g->rank;
            for (int k = 0; k < g->rank; k++) z += et[k] * eu[k];
        }
    return z;
}

// Writes n records of the planted model to path; *prob[n] and *lab[n]
// (when asked) get each record's click probability and label.
static dt_status write_log(const planted *p, dt_rng *r, int64_t n, const char *path, float *prob, uint8_t *lab) {
    const dt_clicks_gen *g = p->g;
    dt_atomic_file *f;
    dt_status st = dt_atomic_open(&f, path);
    if (st != DT_OK) return st;
    uint8_t h[HEADER_BYTES] = {0};
    memcpy(h, DT_CLICKS_MAGIC, 8);
    uint32_t v[4] = {1, (uint32_t)g->ndense, (uint32_t)g->ntables, 0};
    uint64_t nn = (uint64_t)n, rows[DT_DLRM_MAX_TABLES];
    memcpy(h + 8, v, 16);
    memcpy(h + 24, &nn, 8);
    for (int t = 0; t < g->ntables; t++) rows[t] = (uint64_t)g->rows[t];
    st = dt_atomic_append(f, h, sizeof h);
    if (st == DT_OK) st = dt_atomic_append(f, rows, 8 * (size_t)g->ntables);
    size_t rb = dt_clicks_record_bytes(g->ndense, g->ntables);
    uint8_t *rec = malloc(rb);
    float x[4096];
    uint32_t id[DT_DLRM_MAX_TABLES];
    if (!rec) st = dt_error(DT_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n && st == DT_OK; i++) {
        for (int j = 0; j < g->ndense; j++) x[j] = floorf(-logf(1.0f - dt_rng_uniform(r)) * 3.0f);  // counts
        for (int t = 0; t < g->ntables; t++) id[t] = draw_id(r, g->rows[t], g->zipf);
        float q = 1.0f / (1.0f + expf(-planted_logit(p, x, id)));
        rec[0] = dt_rng_uniform(r) < q;
        memcpy(rec + 1, x, 4 * (size_t)g->ndense);
        memcpy(rec + 1 + 4 * (size_t)g->ndense, id, 4 * (size_t)g->ntables);
        if (prob) prob[i] = q, lab[i] = rec[0];
        st = dt_atomic_append(f, rec, rb);
    }
    free(rec);
    if (st == DT_OK) return dt_atomic_commit(f);
    dt_atomic_abort(f);
    return st;
}

dt_status dt_clicks_generate(const dt_clicks_gen *g, const char *train_path, const char *test_path, double *auc) {
    if (g->ntables < 1 || g->ntables > DT_DLRM_MAX_TABLES || g->ndense < 0 || g->ndense > 4096 || g->train < 1 ||
        g->test < 0 || g->rank < 0 || g->rank > 64 || !(g->zipf >= 0) || !(g->zipf <= 4))
        return dt_error(DT_ERR_ARG, "click log generator: tables 1..%d, dense 0..4096, records >= 1, rank 0..64 and "
                        "zipf 0..4 expected", DT_DLRM_MAX_TABLES);
    for (int t = 0; t < g->ntables; t++)
        if (g->rows[t] < 1 || g->rows[t] > (1ll << 32))
            return dt_error(DT_ERR_ARG, "click log generator: table %d has %lld rows (expected 1 to 2^32)", t,
                            (long long)g->rows[t]);
    planted p;
    dt_status st = planted_make(&p, g);
    int64_t ne = test_path ? g->test : g->train;
    float *prob = malloc(sizeof(float) * (size_t)(ne + 1));
    uint8_t *lab = malloc((size_t)ne + 1);
    if (st == DT_OK && (!prob || !lab)) st = dt_error(DT_ERR_NOMEM, "out of memory");
    dt_rng r;
    dt_rng_seed(&r, g->seed);
    if (st == DT_OK) st = write_log(&p, &r, g->train, train_path, test_path ? NULL : prob, lab);
    if (st == DT_OK && test_path) st = write_log(&p, &r, g->test, test_path, prob, lab);
    if (st == DT_OK && auc) *auc = dt_auc(prob, lab, ne);
    free(prob);
    free(lab);
    planted_free(&p);
    return st;
}

// ----------------------------------------------------------------------------
// AUC: the rank-sum (Mann-Whitney) statistic, ties at their mean rank

typedef struct {
    float s;
    uint8_t y;
} scored;

static int by_score(const void *a, const void *b) {
    float x = ((const scored *)a)->s, y = ((const scored *)b)->s;
    return (x > y) - (x < y);
}

double dt_auc(const float *score, const uint8_t *label, int64_t n) {
    scored *v = malloc(sizeof *v * (size_t)(n + 1));
    if (!v) return 0.5;
    int64_t pos = 0;
    for (int64_t i = 0; i < n; i++) v[i] = (scored){score[i], label[i]}, pos += label[i] != 0;
    qsort(v, (size_t)n, sizeof *v, by_score);
    double ranks = 0;  // the sum of the positives' ranks (1-based)
    for (int64_t i = 0; i < n;) {
        int64_t j = i;
        while (j < n && v[j].s == v[i].s) j++;
        double mid = (double)(i + 1 + j) / 2;
        for (int64_t k = i; k < j; k++) ranks += v[k].y ? mid : 0;
        i = j;
    }
    free(v);
    int64_t neg = n - pos;
    if (!pos || !neg) return 0.5;
    return (ranks - (double)pos * (pos + 1) / 2) / ((double)pos * neg);
}
