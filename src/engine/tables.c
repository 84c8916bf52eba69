/* The recommender's tables cut by row (tables.h has the overview). */
#include "engine/tables.h"
#include "dtrain/optim.h"
#include "dtrain/recsys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

// ----------------------------------------------------------------------------
// placement

static uint64_t gcd(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// a^-1 mod m (a coprime with m), by the extended Euclid.
static uint64_t inverse(uint64_t a, uint64_t m) {
    __int128 t = 0, nt = 1, r = m, nr = a;
    while (nr) {
        __int128 q = r / nr, x = t - q * nt, y = r - q * nr;
        t = nt, nt = x, r = nr, nr = y;
    }
    return (uint64_t)(t < 0 ? t + m : t);
}

void dt_rows_layout_init(dt_rows_layout *L, int64_t R, int S, int hash) {
    *L = (dt_rows_layout){.R = R, .S = S, .hash = hash && R > 2, .a = 1, .ainv = 1};
    if (!L->hash) return;
    uint64_t n = (uint64_t)R, a = (uint64_t)((double)n * 0.6180339887498949) | 1;
    while (gcd(a, n) != 1) a += 2;  // (odd, below n: R > 2 has a unit there)
    L->a = a % n;
    L->ainv = inverse(L->a, n);
}

int64_t dt_rows_place(const dt_rows_layout *L, int64_t g) {
    return L->hash ? (int64_t)((unsigned __int128)L->a * (uint64_t)g % (uint64_t)L->R) : g;
}

int64_t dt_rows_global(const dt_rows_layout *L, int64_t q) {
    return L->hash ? (int64_t)((unsigned __int128)L->ainv * (uint64_t)q % (uint64_t)L->R) : q;
}

void dt_rows_range(const dt_rows_layout *L, int j, int64_t *lo, int64_t *hi) {
    size_t a, b;
    dt_shard_range((size_t)L->R, j, L->S, &a, &b);
    *lo = (int64_t)a;
    *hi = (int64_t)b;
}

// ----------------------------------------------------------------------------
// a step's rows as a rank sends them

typedef struct {
    int64_t q;
    int32_t i;
} placed;

static int by_q(const void *a, const void *b) {
    int64_t x = ((const placed *)a)->q, y = ((const placed *)b)->q;
    return (x > y) - (x < y);
}

dt_status dt_rows_plan_make(dt_rows_plan *p, const dt_rows_layout *L, const int64_t *ids, size_t n, int dim) {
    if (!p->cut || p->S != L->S) {
        free(p->cut);
        if (!(p->cut = malloc(sizeof(size_t) * (size_t)(L->S + 1)))) return dt_error(DT_ERR_NOMEM, "out of memory");
        p->S = L->S;
    }
    if (n > p->cap) {
        free(p->q), free(p->from), dt_free(p->buf);
        p->q = malloc(sizeof(int64_t) * n);
        p->from = malloc(sizeof(int32_t) * n);
        p->buf = dt_alloc(sizeof(float) * n * (size_t)dim);
        p->cap = p->q && p->from && p->buf ? n : 0;
        if (!p->cap) return dt_error(DT_ERR_NOMEM, "a step's %zu rows: out of memory", n);
    }
    p->n = n;
    if (L->hash) {
        placed *v = malloc(sizeof *v * (n + 1));
        if (!v) return dt_error(DT_ERR_NOMEM, "a step's %zu rows: out of memory", n);
        for (size_t i = 0; i < n; i++) v[i] = (placed){dt_rows_place(L, ids[i]), (int32_t)i};
        qsort(v, n, sizeof *v, by_q);
        for (size_t i = 0; i < n; i++) p->q[i] = v[i].q, p->from[i] = v[i].i;
        free(v);
    } else {
        memcpy(p->q, ids, sizeof(int64_t) * n);
        for (size_t i = 0; i < n; i++) p->from[i] = (int32_t)i;
    }
    size_t a = 0;
    for (int j = 0; j < L->S; j++) {
        int64_t lo, hi;
        dt_rows_range(L, j, &lo, &hi);
        p->cut[j] = a;
        while (a < n && p->q[a] < hi) a++;
    }
    p->cut[L->S] = n;
    return DT_OK;
}

void dt_rows_plan_scatter(const dt_rows_plan *p, float *vals, int dim) {
    for (size_t i = 0; i < p->n; i++)
        memcpy(vals + (size_t)p->from[i] * dim, p->buf + i * dim, sizeof(float) * (size_t)dim);
}

void dt_rows_plan_gather(dt_rows_plan *p, const float *grads, int dim) {
    for (size_t i = 0; i < p->n; i++)
        memcpy(p->buf + i * dim, grads + (size_t)p->from[i] * dim, sizeof(float) * (size_t)dim);
}

void dt_rows_plan_free(dt_rows_plan *p) {
    free(p->q);
    free(p->from);
    free(p->cut);
    dt_free(p->buf);
    memset(p, 0, sizeof *p);
}

// ----------------------------------------------------------------------------
// a shard

size_t dt_rows_shard_bytes(int64_t n, int dim, int adagrad, int ckpt) {
    size_t one = sizeof(float) * ((size_t)dim + (adagrad ? 1 : 0));
    return (size_t)n * one * (ckpt ? 2 : 1);
}

static float *block(size_t n, const char *dir) {
    float *p = dt_state_alloc(n, dir);
    if (p && dir) madvise(p, sizeof(float) * (n ? n : 1), MADV_RANDOM);  // rows are looked up anywhere
    return p;
}

dt_status dt_rows_shard_create(dt_rows_shard *sh, const dt_rows_layout *L, int j, int dim, int adagrad,
                               uint64_t seed, const char *offload_dir) {
    memset(sh, 0, sizeof *sh);
    int64_t lo, hi;
    dt_rows_range(L, j, &lo, &hi);
    *sh = (dt_rows_shard){.lo = lo, .n = hi - lo, .dim = dim, .adagrad = adagrad, .dir = offload_dir,
                          .meta = {lo, hi, L->R, L->hash}};
    size_t n = (size_t)sh->n;
    sh->tab = block(n * (size_t)dim, offload_dir);
    sh->acc = adagrad ? block(n, offload_dir) : NULL;
    if (!sh->tab || (adagrad && !sh->acc)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", offload_dir ? dt_last_error() : "out of memory");
        dt_rows_shard_free(sh);
        return dt_error(offload_dir ? DT_ERR_IO : DT_ERR_NOMEM, "the tables' rows [%lld, %lld): %s", (long long)lo,
                        (long long)hi, msg);
    }
    if (!L->hash) dt_dlrm_init_rows(sh->tab, lo, sh->n, dim, seed);
    else
        for (int64_t i = 0; i < sh->n; i++) dt_dlrm_init_rows(sh->tab + i * dim, dt_rows_global(L, lo + i), 1, dim, seed);
    if (sh->acc && !offload_dir) memset(sh->acc, 0, sizeof(float) * n);  // (a new file reads as zeros)
    return DT_OK;
}

void dt_rows_shard_free(dt_rows_shard *sh) {
    dt_state_free(sh->tab, (size_t)sh->n * (size_t)sh->dim, sh->dir);
    dt_state_free(sh->acc, (size_t)sh->n, sh->dir);
    free(sh->sid);
    dt_free(sh->sg);
    free(sh->keys);
    memset(sh, 0, sizeof *sh);
}

void dt_rows_shard_read(const dt_rows_shard *sh, const int64_t *q, size_t k, float *out) {
    size_t dim = (size_t)sh->dim;
    for (size_t i = 0; i < k; i++) memcpy(out + i * dim, sh->tab + (size_t)(q[i] - sh->lo) * dim, sizeof(float) * dim);
}

// dt_adagrad_rows over placed numbers (local ones in the shard's block).
static void apply(dt_rows_shard *sh, int64_t *q, const float *g, size_t k, float lr, float eps) {
    for (size_t i = 0; i < k; i++) q[i] -= sh->lo;
    dt_adagrad_rows(sh->tab, sh->acc, q, g, k, sh->dim, lr, eps);
    for (size_t i = 0; i < k; i++) q[i] += sh->lo;
}

void dt_rows_shard_apply(dt_rows_shard *sh, const int64_t *q, const float *g, size_t k, float lr, float eps) {
    for (size_t i = 0; i < k; i++) {
        int64_t r = q[i] - sh->lo;
        dt_adagrad_rows(sh->tab, sh->acc, &r, g + i * (size_t)sh->dim, 1, sh->dim, lr, eps);
    }
}

typedef struct {
    int64_t q;
    int32_t who, i;
} keyed;

static int by_row_then_sender(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    if (x->q != y->q) return (x->q > y->q) - (x->q < y->q);
    return (x->who > y->who) - (x->who < y->who);
}

static dt_status room(dt_rows_shard *sh, size_t rows, size_t keys) {
    if (keys > sh->kcap) {
        free(sh->keys);
        sh->kcap = 0;
        if (!(sh->keys = malloc(sizeof(keyed) * keys))) return dt_error(DT_ERR_NOMEM, "a step's rows: out of memory");
        sh->kcap = keys;
    }
    if (rows > sh->cap) {
        free(sh->sid), dt_free(sh->sg);
        sh->sid = malloc(sizeof(int64_t) * rows);
        sh->sg = dt_alloc(sizeof(float) * rows * (size_t)sh->dim);
        sh->cap = sh->sid && sh->sg ? rows : 0;
        if (!sh->cap) return dt_error(DT_ERR_NOMEM, "a step's %zu rows: out of memory", rows);
    }
    return DT_OK;
}

dt_status dt_rows_shard_step(dt_rows_shard *sh, int N, int64_t *const *q, float *const *g, const size_t *k, float lr,
                             float eps, size_t *rows) {
    size_t K = 0, dim = (size_t)sh->dim;
    for (int w = 0; w < N; w++) K += k[w];
    *rows = 0;
    dt_status st = room(sh, K + 1, K + 1);
    if (st != DT_OK) return st;
    keyed *v = sh->keys;
    for (int w = 0, at = 0; w < N; w++)
        for (size_t i = 0; i < k[w]; i++) v[at++] = (keyed){q[w][i], w, (int32_t)i};
    qsort(v, K, sizeof *v, by_row_then_sender);
    size_t m = 0;
    for (size_t i = 0; i < K; i++) {  // each row: 0 + its senders' gradients, in their order
        if (i == 0 || v[i].q != v[i - 1].q) {
            sh->sid[m] = v[i].q;
            memset(sh->sg + m * dim, 0, sizeof(float) * dim);
            m++;
        }
        float *d = sh->sg + (m - 1) * dim;
        const float *s = g[v[i].who] + (size_t)v[i].i * dim;
        for (size_t e = 0; e < dim; e++) d[e] += s[e];
    }
    apply(sh, sh->sid, sh->sg, m, lr, eps);
    *rows = m;
    return DT_OK;
}

int dt_rows_shard_tensors(dt_rows_shard *sh, dt_st_tensor *t, int max) {
    int n = 1 + (sh->n > 0) + (sh->n > 0 && sh->acc);
    if (!t || max < n) return n;
    size_t rows = (size_t)sh->n, dim = (size_t)sh->dim;
    t[0] = (dt_st_tensor){"tables.range", DT_I64, 1, {4}, sh->meta, sizeof sh->meta};
    if (n > 1) t[1] = (dt_st_tensor){"tables.rows", DT_F32, 2, {sh->n, sh->dim}, sh->tab, sizeof(float) * rows * dim};
    if (n > 2) t[2] = (dt_st_tensor){"tables.adagrad", DT_F32, 1, {sh->n}, sh->acc, sizeof(float) * rows};
    return n;
}

// Part `part` of checkpoint path: the rows of [lo, hi) it holds, into the shard.
static dt_status load_part(dt_rows_shard *sh, const dt_rows_layout *L, const char *path, int part, int64_t *covered) {
    dt_st_file *f;
    dt_status st = dt_ckpt_open_chosen(path, part, &f);
    if (st != DT_OK) return st;
    const dt_st_tensor *r = dt_st_find(f, "tables.range"), *rows = dt_st_find(f, "tables.rows"),
                       *acc = dt_st_find(f, "tables.adagrad");
    int64_t m[4] = {0};
    if (!r || r->dtype != DT_I64 || r->ndim != 1 || r->shape[0] != 4) {
        st = dt_error(DT_ERR_CONFIG, "%s: part %d holds no rows of the tables (tables.range): written with the tables "
                      "elsewhere ([recsys] sparse = false, or no servers)", path, part);
        goto done;
    }
    if ((st = dt_st_read(f, r, 0, 4, DT_I64, m)) != DT_OK) goto done;
    if (m[2] != L->R || m[3] != L->hash || m[0] < 0 || m[1] < m[0] || m[1] > L->R) {
        st = dt_error(DT_ERR_CONFIG, "%s: part %d holds rows [%lld, %lld) of %lld placed by %s; this run has %lld rows "
                      "placed by %s ([recsys] tables, placement)", path, part, (long long)m[0], (long long)m[1],
                      (long long)m[2], m[3] ? "hash" : "range", (long long)L->R, L->hash ? "hash" : "range");
        goto done;
    }
    int64_t a = m[0] > sh->lo ? m[0] : sh->lo, b = m[1] < sh->lo + sh->n ? m[1] : sh->lo + sh->n;
    if (a >= b) goto done;
    size_t dim = (size_t)sh->dim;
    if (!rows || rows->ndim != 2 || rows->shape[0] != m[1] - m[0] || rows->shape[1] != sh->dim) {
        st = dt_error(DT_ERR_CONFIG, "%s: part %d: tables.rows is not [%lld, %d] (another [recsys] dim?)", path, part,
                      (long long)(m[1] - m[0]), sh->dim);
        goto done;
    }
    st = dt_st_read(f, rows, (size_t)(a - m[0]) * dim, (size_t)(b - a) * dim, DT_F32, sh->tab + (size_t)(a - sh->lo) * dim);
    if (st == DT_OK && sh->acc) {
        if (!acc || acc->ndim != 1 || acc->shape[0] != m[1] - m[0])
            st = dt_error(DT_ERR_CONFIG, "%s: part %d holds no AdaGrad sums of the rows (written with [recsys] "
                          "table_optim = sgd)", path, part);
        else
            st = dt_st_read(f, acc, (size_t)(a - m[0]), (size_t)(b - a), DT_F32, sh->acc + (a - sh->lo));
    }
    if (st == DT_OK) *covered += b - a;
done:
    dt_st_close(f);
    return st;
}

dt_status dt_rows_shard_load(dt_rows_shard *sh, const dt_rows_layout *L, const char *path) {
    int parts = 0;
    int64_t covered = 0;
    dt_status st = dt_ckpt_open_part(path, -1, NULL, &parts);
    for (int p = 0; p < parts && st == DT_OK; p++) st = load_part(sh, L, path, p, &covered);
    if (st == DT_OK && covered != sh->n)
        st = dt_error(DT_ERR_FORMAT, "%s: its %d parts hold %lld of the rows [%lld, %lld)", path, parts,
                      (long long)covered, (long long)sh->lo, (long long)(sh->lo + sh->n));
    return st;
}

int dt_tables_on_workers(const dt_config *c) {
    return c->recsys && c->rs_sparse && c->ps_servers == 0 && c->rs_shard == 1;
}
