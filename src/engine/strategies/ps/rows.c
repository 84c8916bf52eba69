/* The recommender's embedding tables on the parameter servers
 * (docs/recommender.md): [model] preset = dlrm with [recsys] sparse = true.
 *
 * The tables' rows, numbered globally (table t's row r is offset(t) + r),
 * are cut into S balanced contiguous ranges (dt_shard_range over the rows,
 * the project's one shard function): server j holds rows [lo_j, hi_j),
 * drawn at its start from the run's seed row by row
 * (dt_dlrm_init_rows), so no worker ever holds a whole table, and the
 * row-wise optimizer's state ([recsys] table_optim: adagrad's one sum a
 * row, or sgd's none). The dense block (the MLPs) goes through the usual
 * protocol (ps.c); the rows have three messages of their own:
 *
 *   worker -> server  PULL   step, count; then the rows' numbers (int64, sorted, distinct, in its range)
 *                     SPUSH  step, count, the learning rate's factor; the numbers, then their gradients
 *   server -> worker  ROWS   step, count; then the rows [count, dim]
 *
 * Each step a worker pulls the rows its share touches before its forward
 * and pushes their gradients after its backward (every step, count 0
 * too). Sync: a server sums the pushes of a step as they arrive and
 * applies the step's update to the rows touched once every worker's are
 * in; a pull for step s waits until the rows of steps before s are
 * applied, so every worker computes from the same rows, as one process
 * would. Async and ssp: a push is applied on arrival at the share's part
 * of [recsys] table_lr (as the block's learning rate), a pull is answered
 * at once. Bytes a step: 8 + 4 dim a row each way, headers apart. */
#include "engine/strategies/ps/ps_impl.h"
#include "dtrain/recsys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_has_tables(const dt_config *c) { return c->recsys && c->rs_sparse && c->ps_servers > 0; }

dt_status ps_tables_check(const dt_config *c) {
    const char *no = c->ps_groups > 0                            ? "[ps] groups"
                     : c->deterministic                          ? "[parallel] deterministic"
                     : c->ps_mode == MODE_BACKUP                 ? "[ps] mode = backup"
                     : c->ps_share                               ? "[ps] share = dynamic"
                     : c->ckpt_every_steps > 0 || c->ckpt_every_seconds > 0 ? "[checkpoint] every_steps or every_seconds"
                                                                 : NULL;
    if (no)
        return dt_error(DT_ERR_CONFIG, "[recsys] sparse = true (the tables on the parameter servers) cannot be combined "
                        "with %s yet; use sparse = false (the tables as part of the block) or leave it unset", no);
    return DT_OK;
}

// Server j's rows: [lo, hi) of the tables' R.
static void range_of(const dt_config *c, int j, int S, int64_t *lo, int64_t *hi) {
    size_t a, b;
    dt_shard_range((size_t)dt_dlrm_total_rows(&c->dlrm), j, S, &a, &b);
    *lo = (int64_t)a;
    *hi = (int64_t)b;
}

// ----------------------------------------------------------------------------
// the worker's side

static dt_status ranges(ps_worker *w) {
    if (w->rlo) return DT_OK;
    if (!(w->rlo = malloc(sizeof(int64_t) * (size_t)(w->S + 1)))) return dt_error(DT_ERR_NOMEM, "out of memory");
    int64_t hi = 0;
    for (int j = 0; j < w->S; j++) range_of(w->base.c, j, w->S, &w->rlo[j], &hi);
    w->rlo[w->S] = hi;
    return DT_OK;
}

// ids[a, b): the rows of ids[a...] on server j.
static size_t cut(const ps_worker *w, const int64_t *ids, size_t n, size_t a, int j) {
    while (a < n && ids[a] < w->rlo[j + 1]) a++;
    return a;
}

// One exchange with every server: PULL (vals non-NULL: the rows come back
// into it) or SPUSH (g: the gradients go with the numbers).
static dt_status exchange(ps_worker *w, int64_t kind, const int64_t *ids, size_t n, float *vals, const float *g) {
    dt_strategy *s = &w->base;
    int S = w->S, dim = s->c->dlrm.dim;
    dt_status st = ranges(w);
    if (st != DT_OK) return st;
    int64_t(*h)[H_N] = calloc(2 * (size_t)S, sizeof *h);
    dt_request_t *r = calloc(4 * (size_t)S, sizeof *r);
    if (!h || !r) return free(h), free(r), dt_error(DT_ERR_NOMEM, "out of memory");
    size_t a = 0;
    for (int j = 0; j < S && st == DT_OK; j++) {
        size_t b = cut(w, ids, n, a, j), k = b - a;
        int64_t *q = h[j], *rep = h[S + j];
        q[H_KIND] = kind, q[H_STEP] = w->step, q[H_COUNT] = (int64_t)k, q[H_A] = bits_of(w->weight);
        if (kind == M_PULL) {  // the replies' receives first, then the requests
            st = dt_irecv(rep, H_N, DT_I64, j, s->all, &r[4 * j]);
            if (st == DT_OK && k) st = dt_irecv(vals + a * dim, k * dim, DT_F32, j, s->all, &r[4 * j + 1]);
        }
        if (st == DT_OK) st = dt_isend(q, H_N, DT_I64, j, s->all, &r[4 * j + 2]);
        if (st == DT_OK && k) st = dt_isend(ids + a, k, DT_I64, j, s->all, &r[4 * j + 3]);
        if (st == DT_OK && k && g) st = dt_send(g + a * dim, k * dim, DT_F32, j, s->all);
        a = b;
    }
    dt_status w2 = ps_wait_all(r, 4 * S);
    if (st == DT_OK) st = w2;
    for (int j = 0; j < S && st == DT_OK && kind == M_PULL; j++)
        if (h[S + j][H_KIND] != M_ROWS || h[S + j][H_STEP] != w->step || h[S + j][H_COUNT] != h[j][H_COUNT])
            st = dt_error(DT_ERR_COMM, "worker %d: server %d sent %s for step %lld with %lld rows, expected ROWS for "
                          "step %lld with %lld", s->rank, j, ps_kind_name(h[S + j][H_KIND]),
                          (long long)h[S + j][H_STEP] + 1, (long long)h[S + j][H_COUNT], (long long)w->step + 1,
                          (long long)h[j][H_COUNT]);
    free(h);
    free(r);
    return st;
}

dt_status ps_rows_pull(dt_strategy *s, const int64_t *ids, size_t n, float *vals) {
    return exchange((ps_worker *)s, M_PULL, ids, n, vals, NULL);
}

dt_status ps_rows_push(dt_strategy *s, const int64_t *ids, size_t n, const float *g) {
    ps_worker *w = (ps_worker *)s;
    // A step's bytes: its rows' numbers and values pulled, their numbers
    // and gradients pushed (headers apart); the block's pushes and weights.
    w->table_steps++;
    w->table_bytes += 2 * n * (sizeof(int64_t) + sizeof(float) * (size_t)s->c->dlrm.dim);
    w->dense_bytes += 2 * sizeof(float) * s->n;
    return exchange(w, M_SPUSH, ids, n, NULL, g);
}

// ----------------------------------------------------------------------------
// the server's side

dt_status ps_tables_setup(server *sv) {
    const dt_config *c = sv->c;
    if (dt_comm_incarnation(sv->all) > 0)  // restarted alone: its rows would start again from the seed
        return dt_error(DT_ERR_COMM, "server %d was restarted, and its rows of the tables were not kept (a server's "
                        "shard of the tables is not checkpointed yet: docs/recommender.md)", sv->me);
    int64_t hi;
    range_of(c, sv->me, sv->S, &sv->tb.lo, &hi);
    sv->tb.n = hi - sv->tb.lo;
    sv->tb.dim = c->dlrm.dim;
    sv->tb.step = sv->step;
    size_t n = (size_t)sv->tb.n, dim = (size_t)sv->tb.dim, adagrad = c->rs_table_optim == 0;
    size_t need = n * (sizeof(float) * dim + sizeof(int32_t) + (adagrad ? sizeof(float) : 0));
    const char *src;
    size_t avail = dt_mem_available(&src);
    char a[64], b[64];
    if (need > avail)
        return dt_error(DT_ERR_NOMEM, "server %d: the tables' rows [%lld, %lld) need %s (%zu rows of %zu floats, the "
                        "optimizer's sums and the step's index: %zu bytes), but %s is available (%s); add servers",
                        sv->me, (long long)sv->tb.lo, (long long)hi, dt_mem_format(need, a, sizeof a), n, dim, need,
                        dt_mem_format(avail, b, sizeof b), src);
    sv->tb.tab = dt_alloc(sizeof(float) * (n * dim + 1));
    sv->tb.acc = adagrad ? dt_alloc(sizeof(float) * (n + 1)) : NULL;
    sv->tb.slot = malloc(sizeof(int32_t) * (n + 1));
    if (!sv->tb.tab || (adagrad && !sv->tb.acc) || !sv->tb.slot)
        return dt_error(DT_ERR_NOMEM, "server %d: the tables' %zu rows: out of memory", sv->me, n);
    dt_dlrm_init_rows(sv->tb.tab, sv->tb.lo, sv->tb.n, sv->tb.dim, c->seed);
    memset(sv->tb.slot, 0xff, sizeof(int32_t) * n);
    for (int wi = 0; wi < sv->N; wi++) sv->w[wi].rows_pushed = sv->step;
    return DT_OK;
}

void ps_tables_free(server *sv) {
    dt_free(sv->tb.tab);
    dt_free(sv->tb.acc);
    free(sv->tb.slot);
    dt_free(sv->tb.sg);
    dt_free(sv->tb.g);
    free(sv->tb.sids);
    free(sv->tb.ids);
    for (int wi = 0; sv->w && wi < sv->N; wi++) free(sv->w[wi].ids);
}

static dt_status grow(server *sv, size_t k) {
    if (k <= sv->tb.cap) return DT_OK;
    size_t cap = k > 2 * sv->tb.cap ? k : 2 * sv->tb.cap, row = sizeof(float) * (size_t)sv->tb.dim;
    float *sg = dt_alloc(row * cap), *g = dt_alloc(row * cap);
    int64_t *sids = malloc(sizeof(int64_t) * cap), *ids = malloc(sizeof(int64_t) * cap);
    if (!sg || !g || !sids || !ids) {
        dt_free(sg), dt_free(g), free(sids), free(ids);
        return dt_error(DT_ERR_NOMEM, "server %d: %zu rows' gradients: out of memory", sv->me, cap);
    }
    if (sv->tb.ns) memcpy(sg, sv->tb.sg, row * sv->tb.ns), memcpy(sids, sv->tb.sids, sizeof(int64_t) * sv->tb.ns);
    dt_free(sv->tb.sg), dt_free(sv->tb.g), free(sv->tb.sids), free(sv->tb.ids);
    sv->tb.sg = sg, sv->tb.g = g, sv->tb.sids = sids, sv->tb.ids = ids, sv->tb.cap = cap;
    return DT_OK;
}

// A message's rows, received into ids[k] and checked: inside this
// server's range, increasing; made local numbers.
static dt_status take_ids(server *sv, int wi, const char *what, int64_t *ids, size_t k) {
    dt_status st = k ? dt_recv(ids, k, DT_I64, sv->w[wi].rank, sv->all) : DT_OK;
    if (st != DT_OK) return st;
    int64_t lo = sv->tb.lo, hi = lo + sv->tb.n;
    for (size_t i = 0; i < k; i++) {
        if (ids[i] < lo || ids[i] >= hi || (i > 0 && ids[i] <= ids[i - 1] + lo))
            return dt_error(DT_ERR_COMM, "server %d: refused %s from worker %d at step %lld: field ids[%zu]: row %lld %s",
                            sv->me, what, wi, (long long)sv->w[wi].h[H_STEP] + 1, i, (long long)ids[i],
                            ids[i] < lo || ids[i] >= hi ? "outside this server's rows" : "not after the one before");
        ids[i] -= lo;
    }
    (void)hi;
    return DT_OK;
}

static dt_status send_rows(server *sv, int wi, const int64_t *ids, size_t k, int64_t step) {
    peer *p = &sv->w[wi];
    int64_t h[H_N] = {M_ROWS, step, sv->tb.step, 0, (int64_t)k, 0, 0, 0};
    dt_status st = dt_send(h, H_N, DT_I64, p->rank, sv->all);
    size_t dim = (size_t)sv->tb.dim;
    for (size_t i = 0; i < k && st == DT_OK; i++) memcpy(sv->tb.g + i * dim, sv->tb.tab + (size_t)ids[i] * dim, sizeof(float) * dim);
    if (st == DT_OK && k) st = dt_send(sv->tb.g, k * dim, DT_F32, p->rank, sv->all);
    return st;
}

// Pulls held until their step's rows are applied (sync), answered.
static dt_status release_pulls(server *sv) {
    dt_status st = DT_OK;
    for (int wi = 0; wi < sv->N && st == DT_OK; wi++) {
        peer *p = &sv->w[wi];
        if (!p->pull_held || (sv->mode == MODE_SYNC && p->pull_step > sv->tb.step)) continue;
        p->pull_held = 0;
        if ((st = grow(sv, p->nids)) == DT_OK) st = send_rows(sv, wi, p->ids, p->nids, p->pull_step);
    }
    return st;
}

dt_status ps_take_pull(server *sv, int wi) {
    peer *p = &sv->w[wi];
    int64_t k = p->h[H_COUNT];
    if (k < 0 || k > sv->tb.n)  // (a server with no rows, more servers than rows, gets empty pulls)
        return dt_error(DT_ERR_COMM, "server %d: refused a pull from worker %d: %lld rows of this server's %lld", sv->me,
                        wi, (long long)k, (long long)sv->tb.n);
    if ((size_t)k > p->cap) {
        free(p->ids);
        p->cap = 0;
        if (!(p->ids = malloc(sizeof(int64_t) * (size_t)k))) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
        p->cap = (size_t)k;
    }
    dt_status st = take_ids(sv, wi, "a pull", p->ids, (size_t)k);
    if (st != DT_OK) return st;
    p->nids = (size_t)k;
    p->pull_step = p->h[H_STEP];
    p->pull_held = 1;
    return release_pulls(sv);
}

// Sync: the step's summed gradients, once every worker's are in.
static dt_status apply_rows(server *sv, const int64_t *ids, const float *g, size_t k, float lr) {
    const dt_config *c = sv->c;
    dt_adagrad_rows(sv->tb.tab, sv->tb.acc, ids, g, k, sv->tb.dim, lr, c->rs_table_eps);
    return DT_OK;
}

dt_status ps_take_rows(server *sv, int wi) {
    peer *p = &sv->w[wi];
    int64_t k = p->h[H_COUNT];
    size_t dim = (size_t)sv->tb.dim;
    if (k < 0 || k > sv->tb.n)
        return dt_error(DT_ERR_COMM, "server %d: refused rows from worker %d: %lld rows of this server's %lld", sv->me,
                        wi, (long long)k, (long long)sv->tb.n);
    if (sv->mode == MODE_SYNC && p->h[H_STEP] != p->rows_pushed)
        return dt_error(DT_ERR_COMM, "server %d: refused rows from worker %d: step %lld, expected step %lld", sv->me, wi,
                        (long long)p->h[H_STEP] + 1, (long long)p->rows_pushed + 1);
    dt_status st = grow(sv, sv->tb.ns + (size_t)k);
    if (st == DT_OK) st = take_ids(sv, wi, "rows", sv->tb.ids, (size_t)k);
    if (st == DT_OK && k) st = dt_recv(sv->tb.g, (size_t)k * dim, DT_F32, p->rank, sv->all);
    if (st != DT_OK) return st;
    p->rows_pushed++;
    float lr = sv->c->rs_table_lr;
    if (sv->mode != MODE_SYNC) {  // on arrival, at the share's part of the rate
        sv->tb.step++;
        return apply_rows(sv, sv->tb.ids, sv->tb.g, (size_t)k, lr * (float)double_of(p->h[H_A]));
    }
    for (int64_t i = 0; i < k; i++) {  // summed as they arrive, into the step's rows
        int64_t r = sv->tb.ids[i];
        if (sv->tb.slot[r] < 0) {
            sv->tb.slot[r] = (int32_t)sv->tb.ns;
            sv->tb.sids[sv->tb.ns] = r;
            memset(sv->tb.sg + sv->tb.ns * dim, 0, sizeof(float) * dim);
            sv->tb.ns++;
        }
        float *dst = sv->tb.sg + (size_t)sv->tb.slot[r] * dim;
        const float *src = sv->tb.g + (size_t)i * dim;
        for (size_t e = 0; e < dim; e++) dst[e] += src[e];
    }
    for (int q = 0; q < sv->N; q++)
        if (sv->w[q].rows_pushed <= sv->tb.step) return DT_OK;  // not every worker's yet
    apply_rows(sv, sv->tb.sids, sv->tb.sg, sv->tb.ns, lr);
    for (size_t i = 0; i < sv->tb.ns; i++) sv->tb.slot[sv->tb.sids[i]] = -1;
    sv->tb.ns = 0;
    sv->tb.step++;
    return release_pulls(sv);
}
