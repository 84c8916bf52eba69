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

// ----------------------------------------------------------------------------
// the tables under tensor parallel

int dt_tables_on_workers(const dt_config *c) { return c->recsys && c->rs_sparse && c->ps_servers == 0 && c->rs_shard == 1; }

dt_status dt_tables_tp_check(const dt_config *c) {
    const char *no = c->deterministic     ? "[parallel] deterministic"
                     : c->zero > 0         ? "[parallel] zero"
                     : c->tensor > 1       ? "[parallel] tensor"
                     : c->pipeline > 1     ? "[parallel] pipeline"
                     : c->sync_every > 0   ? "[parallel] sync_every"
                     : c->dynamic_batch    ? "[train] dynamic_batch"
                                           : NULL;
    if (no)
        return dt_error(DT_ERR_CONFIG, "[recsys] shard = workers (the tables sharded across the workers, the MLPs data "
                        "parallel) cannot be combined with %s yet", no);
    return DT_OK;
}

struct dt_tp_tables {
    const dt_config *c;
    dt_comm_t comm;
    int W, me, dim;
    dt_rows_layout L;
    dt_rows_shard sh;
    dt_rows_plan plan;   // this step's rows, by owner
    int64_t *counts;     // [W, W]: counts[i W + j], the rows worker i asks of worker j
    int64_t **rq;        // the rows each worker asked of this one (placed numbers) ...
    float **rg;          // ... and their gradients
    size_t *rk, *rcap;
    float *out;          // the rows this one answers, worker after worker
    size_t ocap;
    dt_request_t *req;   // 2 W
    uint64_t bytes;      // the tables' bytes sent and received in steps (pulls and pushes, this worker's own apart)
    uint64_t cur;        // ... since the last pull (an evaluation's pulls have no push: not counted)
    int64_t steps, *asked;
};

dt_status dt_tp_tables_create(dt_tp_tables **out, const dt_config *c, dt_comm_t comm) {
    dt_tp_tables *t = calloc(1, sizeof *t);
    if (!(*out = t)) return dt_error(DT_ERR_NOMEM, "out of memory");
    t->c = c;
    t->comm = comm;
    t->W = comm ? dt_comm_size(comm) : 1;
    t->me = comm ? dt_comm_rank(comm) : 0;
    t->dim = c->dlrm.dim;
    size_t W = (size_t)t->W;
    t->counts = calloc(W * W, sizeof *t->counts);
    t->rq = calloc(W, sizeof *t->rq);
    t->rg = calloc(W, sizeof *t->rg);
    t->rk = calloc(W, sizeof *t->rk);
    t->rcap = calloc(W, sizeof *t->rcap);
    t->req = calloc(2 * W, sizeof *t->req);
    t->asked = calloc(W, sizeof *t->asked);
    if (!t->counts || !t->rq || !t->rg || !t->rk || !t->rcap || !t->req || !t->asked)
        return dt_error(DT_ERR_NOMEM, "out of memory");
    dt_rows_layout_init(&t->L, dt_dlrm_total_rows(&c->dlrm), t->W, c->rs_placement == 1);
    dt_status st = dt_rows_shard_create(&t->sh, &t->L, t->me, t->dim, c->rs_table_optim == 0, c->seed,
                                        c->offload ? c->offload_dir : NULL);
    return st == DT_OK ? DT_OK : dt_error(st, "worker %d: %s", t->me, dt_last_error());
}

void dt_tp_tables_free(dt_tp_tables *t) {
    if (!t) return;
    for (int i = 0; i < t->W && t->rq; i++) {
        free(t->rq[i]);
        dt_free(t->rg ? t->rg[i] : NULL);
    }
    dt_rows_shard_free(&t->sh);
    dt_rows_plan_free(&t->plan);
    free(t->counts), free(t->rq), free(t->rg), free(t->rk), free(t->rcap), free(t->req), free(t->asked);
    dt_free(t->out);
    free(t);
}

// One phase of the all-to-all: from each worker i into in(i) (n_in(i)
// elements), to each worker j from out(j) (n_out(j)); this worker's own
// part copied. Counts 0 send nothing.
static dt_status exchange(dt_tp_tables *t, dt_dtype type, size_t esz, void *const *in, const size_t *nin,
                          void *const *out, const size_t *nout, const char *what) {
    dt_status st = DT_OK;
    for (int i = 0; i < t->W && st == DT_OK; i++)
        if (i != t->me && nin[i]) st = dt_irecv(in[i], nin[i], type, i, t->comm, &t->req[i]);
    for (int j = 0; j < t->W && st == DT_OK; j++)
        if (j != t->me && nout[j]) st = dt_isend(out[j], nout[j], type, j, t->comm, &t->req[t->W + j]);
    if (nin[t->me]) memcpy(in[t->me], out[t->me], esz * nin[t->me]);
    dt_status w = DT_OK;
    char msg[512] = "";
    for (int i = 0; i < 2 * t->W; i++) {
        dt_status x = t->req[i] ? dt_wait(&t->req[i]) : DT_OK;
        if (x != DT_OK && w == DT_OK) w = x, snprintf(msg, sizeof msg, "%s", dt_last_error());
    }
    if (st == DT_OK && w != DT_OK) st = dt_error(w, "%s", msg);
    if (st == DT_OK)
        for (int i = 0; i < t->W; i++)
            if (i != t->me) t->cur += esz * (nin[i] + nout[i]);
    return st == DT_OK ? DT_OK : dt_error(st, "worker %d, the tables' %s across the workers: %s", t->me, what, dt_last_error());
}

static dt_status grow(dt_tp_tables *t, int i, size_t k) {
    if (k <= t->rcap[i]) return DT_OK;
    free(t->rq[i]), dt_free(t->rg[i]);
    t->rq[i] = malloc(sizeof(int64_t) * k);
    t->rg[i] = dt_alloc(sizeof(float) * k * (size_t)t->dim);
    t->rcap[i] = t->rq[i] && t->rg[i] ? k : 0;
    return t->rcap[i] ? DT_OK : dt_error(DT_ERR_NOMEM, "worker %d: %zu rows: out of memory", t->me, k);
}

dt_status dt_tp_tables_pull(dt_tp_tables *t, const int64_t *ids, size_t n, float *vals) {
    int W = t->W, me = t->me;
    size_t dim = (size_t)t->dim;
    dt_status st = dt_rows_plan_make(&t->plan, &t->L, ids, n, t->dim);
    if (st != DT_OK) return st;
    t->cur = 0;
    const size_t *cut = t->plan.cut;
    int64_t *mine = t->counts + (size_t)me * W;
    for (int j = 0; j < W; j++) mine[j] = (int64_t)(cut[j + 1] - cut[j]);
    if (W > 1 && (st = dt_allgather(mine, t->counts, (size_t)W, DT_I64, t->comm)) != DT_OK)
        return dt_error(st, "worker %d, the tables' rows across the workers: %s", me, dt_last_error());
    size_t total = 0, *nin = calloc(2 * (size_t)W, sizeof(size_t)), *nout = nin ? nin + W : NULL;
    void **in = calloc(2 * (size_t)W, sizeof(void *)), **out = in ? in + W : NULL;
    if (!nin || !in) return free(nin), free(in), dt_error(DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < W && st == DT_OK; i++) {
        t->rk[i] = (size_t)t->counts[(size_t)i * W + me];
        total += t->rk[i];
        st = grow(t, i, t->rk[i] + 1);
    }
    if (st == DT_OK && total * dim > t->ocap) {
        dt_free(t->out);
        t->ocap = (t->out = dt_alloc(sizeof(float) * (total * dim + 1))) ? total * dim : 0;
        if (!t->out) st = dt_error(DT_ERR_NOMEM, "worker %d: %zu rows: out of memory", me, total);
    }
    // the placed numbers to their owners
    for (int i = 0; i < W && st == DT_OK; i++) {
        in[i] = t->rq[i], nin[i] = t->rk[i];
        out[i] = t->plan.q + cut[i], nout[i] = cut[i + 1] - cut[i];
    }
    if (st == DT_OK) st = exchange(t, DT_I64, sizeof(int64_t), in, nin, out, nout, "rows' numbers");
    // each owner's rows back
    for (int i = 0, at = 0; i < W && st == DT_OK; i++) {
        for (size_t r = 0; r < t->rk[i]; r++)
            if (t->rq[i][r] < t->sh.lo || t->rq[i][r] >= t->sh.lo + t->sh.n)
                st = dt_error(DT_ERR_COMM, "worker %d: worker %d asked for row %lld, outside this worker's rows [%lld, "
                              "%lld)", me, i, (long long)t->rq[i][r], (long long)t->sh.lo,
                              (long long)(t->sh.lo + t->sh.n));
        if (st != DT_OK) break;
        dt_rows_shard_read(&t->sh, t->rq[i], t->rk[i], t->out + (size_t)at * dim);
        out[i] = t->out + (size_t)at * dim, nout[i] = t->rk[i] * dim;
        in[i] = t->plan.buf + cut[i] * dim, nin[i] = (cut[i + 1] - cut[i]) * dim;
        at += (int)t->rk[i];
    }
    if (st == DT_OK) st = exchange(t, DT_F32, sizeof(float), in, nin, out, nout, "rows");
    free(nin), free(in);
    if (st == DT_OK) dt_rows_plan_scatter(&t->plan, vals, t->dim);
    return st;
}

dt_status dt_tp_tables_push(dt_tp_tables *t, const int64_t *ids, size_t n, const float *g) {
    int W = t->W;
    size_t dim = (size_t)t->dim;
    (void)ids;
    if (n != t->plan.n)
        return dt_error(DT_ERR_INTERNAL, "worker %d: a push of %zu rows after a pull of %zu", t->me, n, t->plan.n);
    dt_rows_plan_gather(&t->plan, g, t->dim);
    size_t *nin = calloc(2 * (size_t)W, sizeof(size_t)), *nout = nin ? nin + W : NULL, rows;
    void **in = calloc(2 * (size_t)W, sizeof(void *)), **out = in ? in + W : NULL;
    if (!nin || !in) return free(nin), free(in), dt_error(DT_ERR_NOMEM, "out of memory");
    const size_t *cut = t->plan.cut;
    for (int i = 0; i < W; i++) {
        in[i] = t->rg[i], nin[i] = t->rk[i] * dim;
        out[i] = t->plan.buf + cut[i] * dim, nout[i] = (cut[i + 1] - cut[i]) * dim;
        t->asked[i] += (int64_t)(cut[i + 1] - cut[i]);
    }
    dt_status st = exchange(t, DT_F32, sizeof(float), in, nin, out, nout, "rows' gradients");
    free(nin), free(in);
    if (st == DT_OK)
        st = dt_rows_shard_step(&t->sh, W, t->rq, t->rg, t->rk, t->c->rs_table_lr, t->c->rs_table_eps, &rows);
    t->steps++;
    t->bytes += t->cur;
    return st;
}

int dt_tp_tables_tensors(dt_tp_tables *t, dt_st_tensor *tt, int max) { return dt_rows_shard_tensors(&t->sh, tt, max); }

dt_status dt_tp_tables_restore(dt_tp_tables *t, const char *path) {
    if (!path || !*path) return DT_OK;
    dt_status st = dt_rows_shard_load(&t->sh, &t->L, path);
    return st == DT_OK ? DT_OK : dt_error(st, "worker %d: %s", t->me, dt_last_error());
}

void dt_tp_tables_stats(const dt_tp_tables *t, double *bytes, double *per, double *balance) {
    double n = t->steps > 0 ? (double)t->steps : 1, most = 0, all = 0;
    *bytes = (double)t->bytes / n;
    for (int j = 0; j < t->W; j++) {
        per[j] = (double)t->asked[j] / n;
        most = per[j] > most ? per[j] : most;
        all += per[j];
    }
    *balance = all > 0 ? most / (all / t->W) : 0;
}
