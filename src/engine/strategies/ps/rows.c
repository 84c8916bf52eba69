/* The recommender's embedding tables on the parameter servers
 * (docs/recommender.md): [model] preset = dlrm with [recsys] sparse = true.
 *
 * The tables' rows are cut among the S servers by engine/tables.h's
 * placement ([recsys] placement: contiguous ranges of the rows, or rows
 * scattered by a fixed permutation): server j holds the placed numbers
 * dt_shard_range(R, j, S), drawn at its start from the run's seed row by
 * row (dt_dlrm_init_rows) or read from a checkpoint, whatever the number
 * of servers that wrote it, so no worker ever holds a whole table, and
 * the row-wise optimizer's state ([recsys] table_optim: adagrad's one sum
 * a row, or sgd's none). The dense block (the MLPs) goes through the usual
 * protocol (ps.c); the rows have three messages of their own:
 *
 *   worker -> server  PULL   step, count; then the rows' placed numbers (int64, increasing, in its shard)
 *                     SPUSH  step, count, the learning rate's factor; the numbers, then their gradients
 *   server -> worker  ROWS   step, count; then the rows [count, dim]
 *
 * Each step a worker pulls the rows its share touches before its forward
 * and pushes their gradients after its backward (every step, count 0
 * too). Sync: a server keeps each worker's push of a step until every
 * worker's is in, then sums each row's gradients in worker order (the
 * sum does not depend on the order the pushes arrived in) and applies the
 * step's update to the rows touched; a pull for step s waits until the
 * rows of the steps before s are applied, so every worker computes from
 * the same rows, as one process would. Async and ssp: a push is applied on
 * arrival at the share's part of [recsys] table_lr (as the block's
 * learning rate), a pull is answered at once; a server that died is
 * waited for and asked again (faults.c), as the block's pushes are.
 *
 * A server's rows go into its shard of the servers' checkpoints
 * (ckpt.c's writer; tables.h's tensors). Bytes a step: 8 + 4 dim a row
 * each way, headers apart. */
#include "engine/strategies/ps/ps_impl.h"
#include "dtrain/recsys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_has_tables(const dt_config *c) { return c->recsys && c->rs_sparse && c->ps_servers > 0; }

dt_status ps_tables_check(const dt_config *c) {
    const char *no = c->ps_groups > 0                ? "[ps] groups"
                     : c->deterministic              ? "[parallel] deterministic"
                     : c->ps_mode == MODE_BACKUP     ? "[ps] mode = backup"
                     : c->ps_share                   ? "[ps] share = dynamic"
                     : c->rs_shard == 1              ? "[recsys] shard = workers (the tables on the workers)"
                                                     : NULL;
    if (no)
        return dt_error(DT_ERR_CONFIG, "[recsys] sparse = true (the tables on the parameter servers) cannot be combined "
                        "with %s yet; use sparse = false (the tables as part of the block) or leave it unset", no);
    return DT_OK;
}

static void layout_of(const dt_config *c, int S, dt_rows_layout *L) {
    dt_rows_layout_init(L, dt_dlrm_total_rows(&c->dlrm), S, c->rs_placement == 1);
}

// ----------------------------------------------------------------------------
// the worker's side

// The messages of one exchange with server j, posted (5 requests): PULL
// (the reply's header into rep, its rows into the plan's buffer) or
// SPUSH (the plan's gradients with the numbers).
static dt_status post(ps_worker *w, int j, int64_t kind, int64_t *q, int64_t *rep, dt_request_t *r) {
    dt_strategy *s = &w->base;
    dt_rows_plan *p = &w->plan;
    size_t dim = (size_t)s->c->dlrm.dim, a = p->cut[j], k = p->cut[j + 1] - a;
    memset(q, 0, sizeof(int64_t) * H_N);
    q[H_KIND] = kind, q[H_STEP] = w->step, q[H_COUNT] = (int64_t)k, q[H_A] = bits_of(w->weight);
    dt_status st = DT_OK;
    if (kind == M_PULL) {  // the replies' receives first, then the requests
        st = dt_irecv(rep, H_N, DT_I64, j, s->all, &r[0]);
        if (st == DT_OK && k) st = dt_irecv(p->buf + a * dim, k * dim, DT_F32, j, s->all, &r[1]);
    }
    if (st == DT_OK) st = dt_isend(q, H_N, DT_I64, j, s->all, &r[2]);
    if (st == DT_OK && k) st = dt_isend(p->q + a, k, DT_I64, j, s->all, &r[3]);
    if (st == DT_OK && k && kind == M_SPUSH) st = dt_isend(p->buf + a * dim, k * dim, DT_F32, j, s->all, &r[4]);
    return st;
}

// Server j found dead (outside mode sync): waited for and let in
// (ps_server_back); after backward (SPUSH) the block's pieces of this
// step, which went to the dead server, go again, as ps_sync sends them to
// a server it finds dead.
static dt_status back(ps_worker *w, int j, int64_t kind) {
    dt_status st = ps_server_back(w, j);
    return st == DT_OK && kind == M_SPUSH ? ps_repush(w, j) : st;
}

// One exchange with every server: PULL (vals non-NULL: the rows come back
// into it) or SPUSH (g: the gradients go with the numbers). Outside mode
// sync a server found dead is waited for and asked again.
static dt_status exchange(ps_worker *w, int64_t kind, const int64_t *ids, size_t n, float *vals, const float *g) {
    dt_strategy *s = &w->base;
    int S = w->S, dim = s->c->dlrm.dim;
    if (!w->rl.S) layout_of(s->c, S, &w->rl);
    dt_status st = dt_rows_plan_make(&w->plan, &w->rl, ids, n, dim);
    if (st != DT_OK) return st;
    if (g) dt_rows_plan_gather(&w->plan, g, dim);
    int64_t(*h)[H_N] = calloc(2 * (size_t)S, sizeof *h);
    dt_request_t *r = calloc(5 * (size_t)S, sizeof *r);
    dt_status *sj = calloc((size_t)S, sizeof *sj);
    if (!h || !r || !sj) return free(h), free(r), free(sj), dt_error(DT_ERR_NOMEM, "out of memory");
    for (int j = 0; j < S; j++)
        if ((sj[j] = ps_server_lost(w, j) ? back(w, j, kind) : DT_OK) == DT_OK)
            sj[j] = post(w, j, kind, h[j], h[S + j], &r[5 * j]);
    for (int j = 0; j < S; j++) {
        dt_status c = ps_wait_all(&r[5 * j], 5);
        if (sj[j] == DT_OK) sj[j] = c;
        for (int t = 0; sj[j] != DT_OK && t < 3 && ps_server_lost(w, j); t++) {
            sj[j] = back(w, j, kind);
            if (sj[j] == DT_OK) sj[j] = post(w, j, kind, h[j], h[S + j], &r[5 * j]);
            c = ps_wait_all(&r[5 * j], 5);
            if (sj[j] == DT_OK) sj[j] = c;
        }
        if (st == DT_OK) st = sj[j];
    }
    for (int j = 0; j < S && st == DT_OK && kind == M_PULL; j++)
        if (h[S + j][H_KIND] != M_ROWS || h[S + j][H_STEP] != w->step || h[S + j][H_COUNT] != h[j][H_COUNT])
            st = dt_error(DT_ERR_COMM, "worker %d: server %d sent %s for step %lld with %lld rows, expected ROWS for "
                          "step %lld with %lld", s->rank, j, ps_kind_name(h[S + j][H_KIND]),
                          (long long)h[S + j][H_STEP] + 1, (long long)h[S + j][H_COUNT], (long long)w->step + 1,
                          (long long)h[j][H_COUNT]);
    if (st == DT_OK && vals) dt_rows_plan_scatter(&w->plan, vals, dim);
    free(h);
    free(r);
    free(sj);
    return st;
}

dt_status ps_rows_pull(dt_strategy *s, const int64_t *ids, size_t n, float *vals) {
    return exchange((ps_worker *)s, M_PULL, ids, n, vals, NULL);
}

dt_status ps_rows_push(dt_strategy *s, const int64_t *ids, size_t n, const float *g) {
    ps_worker *w = (ps_worker *)s;
    if (!w->rows_to && !(w->rows_to = calloc((size_t)w->S, sizeof *w->rows_to)))
        return dt_error(DT_ERR_NOMEM, "out of memory");
    dt_status st = exchange(w, M_SPUSH, ids, n, NULL, g);
    // A step's bytes: its rows' numbers and values pulled, their numbers
    // and gradients pushed (headers apart); the block's pushes and
    // weights; the rows each server got (its load).
    w->table_steps++;
    w->table_bytes += 2 * n * (sizeof(int64_t) + sizeof(float) * (size_t)s->c->dlrm.dim);
    w->dense_bytes += 2 * sizeof(float) * s->n;
    for (int j = 0; j < w->S && st == DT_OK; j++) w->rows_to[j] += (int64_t)(w->plan.cut[j + 1] - w->plan.cut[j]);
    return st;
}

// ----------------------------------------------------------------------------
// the server's side

// This server's shard of the tables: drawn from the seed, then (from: a
// checkpoint's path, "" or NULL none) its rows and sums from it, written
// on any number of servers. Refused where it does not fit, naming the
// bytes.
dt_status ps_tables_setup(server *sv, const char *from) {
    const dt_config *c = sv->c;
    dt_rows_layout *L = &sv->tb.L;
    layout_of(c, sv->S, L);
    int64_t lo, hi;
    dt_rows_range(L, sv->me, &lo, &hi);
    int adagrad = c->rs_table_optim == 0, dim = c->dlrm.dim;
    const char *dir = c->offload ? c->offload_dir : NULL;
    size_t need = dir ? 0 : dt_rows_shard_bytes(hi - lo, dim, adagrad, 0);
    const char *src;
    size_t avail = dt_mem_available(&src);
    char a[64], b[64];
    if (need > avail)
        return dt_error(DT_ERR_NOMEM, "server %d: the tables' rows [%lld, %lld) need %s (%lld rows of %d floats%s: "
                        "%zu bytes), but %s is available (%s); add servers, or set [parallel] offload = disk",
                        sv->me, (long long)lo, (long long)hi, dt_mem_format(need, a, sizeof a), (long long)(hi - lo),
                        dim, adagrad ? " and their AdaGrad sums" : "", need, dt_mem_format(avail, b, sizeof b), src);
    dt_status st = dt_rows_shard_create(&sv->tb.sh, L, sv->me, dim, adagrad, c->seed, dir);
    if (st == DT_OK && from && *from) st = dt_rows_shard_load(&sv->tb.sh, L, from);
    if (st != DT_OK) return dt_error(st, "server %d: %s", sv->me, dt_last_error());
    sv->tb.step = sv->step;
    for (int wi = 0; wi < sv->N; wi++) sv->w[wi].rows_pushed = sv->step;
    return DT_OK;
}

int ps_tables_extra(void *user, dt_st_tensor *t, int max) {
    server *sv = user;
    return dt_rows_shard_tensors(&sv->tb.sh, t, max);
}

void ps_tables_free(server *sv) {
    dt_rows_shard_free(&sv->tb.sh);
    dt_free(sv->tb.buf);
    for (int wi = 0; sv->w && wi < sv->N; wi++) {
        free(sv->w[wi].ids);
        free(sv->w[wi].pq);
        dt_free(sv->w[wi].pg);
    }
}

// Room for k numbers in *ids (capacity *cap) and, with g, k rows in *g.
static dt_status room(server *sv, int64_t **ids, float **g, size_t *cap, size_t k) {
    if (k <= *cap) return DT_OK;
    free(*ids);
    if (g) dt_free(*g);
    *ids = malloc(sizeof(int64_t) * k);
    if (g) *g = dt_alloc(sizeof(float) * k * (size_t)sv->tb.sh.dim);
    *cap = *ids && (!g || *g) ? k : 0;
    return *cap ? DT_OK : dt_error(DT_ERR_NOMEM, "server %d: %zu rows: out of memory", sv->me, k);
}

// A message's rows, received into ids[k] and checked: inside this
// server's shard, increasing.
static dt_status take_ids(server *sv, int wi, const char *what, int64_t *ids, size_t k) {
    dt_status st = k ? dt_recv(ids, k, DT_I64, sv->w[wi].rank, sv->all) : DT_OK;
    if (st != DT_OK) return st;
    int64_t lo = sv->tb.sh.lo, hi = lo + sv->tb.sh.n;
    for (size_t i = 0; i < k; i++)
        if (ids[i] < lo || ids[i] >= hi || (i > 0 && ids[i] <= ids[i - 1]))
            return dt_error(DT_ERR_COMM, "server %d: refused %s from worker %d at step %lld: field ids[%zu]: row %lld %s",
                            sv->me, what, wi, (long long)sv->w[wi].h[H_STEP] + 1, i, (long long)ids[i],
                            ids[i] < lo || ids[i] >= hi ? "outside this server's rows" : "not after the one before");
    return DT_OK;
}

static dt_status send_rows(server *sv, int wi, const int64_t *ids, size_t k, int64_t step) {
    peer *p = &sv->w[wi];
    int64_t h[H_N] = {M_ROWS, step, sv->tb.step, 0, (int64_t)k, 0, 0, 0};
    dt_status st = dt_send(h, H_N, DT_I64, p->rank, sv->all);
    if (st == DT_OK && k) {
        if (k > sv->tb.buf_rows) {
            dt_free(sv->tb.buf);
            sv->tb.buf_rows = 0;
            if (!(sv->tb.buf = dt_alloc(sizeof(float) * k * (size_t)sv->tb.sh.dim)))
                return dt_error(DT_ERR_NOMEM, "server %d: %zu rows: out of memory", sv->me, k);
            sv->tb.buf_rows = k;
        }
        dt_rows_shard_read(&sv->tb.sh, ids, k, sv->tb.buf);
        st = dt_send(sv->tb.buf, k * (size_t)sv->tb.sh.dim, DT_F32, p->rank, sv->all);
    }
    return st;
}

// Pulls held until their step's rows are applied (sync), answered.
static dt_status release_pulls(server *sv) {
    dt_status st = DT_OK;
    for (int wi = 0; wi < sv->N && st == DT_OK; wi++) {
        peer *p = &sv->w[wi];
        if (!p->pull_held || (sv->mode == MODE_SYNC && p->pull_step > sv->tb.step)) continue;
        p->pull_held = 0;
        st = ps_survive(sv, wi, send_rows(sv, wi, p->ids, p->nids, p->pull_step));
    }
    return st;
}

dt_status ps_take_pull(server *sv, int wi) {
    peer *p = &sv->w[wi];
    int64_t k = p->h[H_COUNT];
    if (k < 0 || k > sv->tb.sh.n)  // (a server with no rows, more servers than rows, gets empty pulls)
        return dt_error(DT_ERR_COMM, "server %d: refused a pull from worker %d: %lld rows of this server's %lld", sv->me,
                        wi, (long long)k, (long long)sv->tb.sh.n);
    dt_status st = room(sv, &p->ids, NULL, &p->cap, (size_t)k);
    if (st == DT_OK) st = take_ids(sv, wi, "a pull", p->ids, (size_t)k);
    if (st != DT_OK) return st;
    p->nids = (size_t)k;
    p->pull_step = p->h[H_STEP];
    p->pull_held = 1;
    return release_pulls(sv);
}

dt_status ps_take_rows(server *sv, int wi) {
    peer *p = &sv->w[wi];
    int64_t k = p->h[H_COUNT];
    size_t dim = (size_t)sv->tb.sh.dim;
    const dt_config *c = sv->c;
    if (k < 0 || k > sv->tb.sh.n)
        return dt_error(DT_ERR_COMM, "server %d: refused rows from worker %d: %lld rows of this server's %lld", sv->me,
                        wi, (long long)k, (long long)sv->tb.sh.n);
    if (sv->mode == MODE_SYNC && p->h[H_STEP] != p->rows_pushed)
        return dt_error(DT_ERR_COMM, "server %d: refused rows from worker %d: step %lld, expected step %lld", sv->me, wi,
                        (long long)p->h[H_STEP] + 1, (long long)p->rows_pushed + 1);
    dt_status st = room(sv, &p->pq, &p->pg, &p->pcap, (size_t)k);
    if (st == DT_OK) st = take_ids(sv, wi, "rows", p->pq, (size_t)k);
    if (st == DT_OK && k) st = dt_recv(p->pg, (size_t)k * dim, DT_F32, p->rank, sv->all);
    if (st != DT_OK) return st;
    p->pk = (size_t)k;
    p->rows_pushed++;
    if (sv->mode != MODE_SYNC) {  // on arrival, at the share's part of the rate
        sv->tb.step++;
        dt_rows_shard_apply(&sv->tb.sh, p->pq, p->pg, p->pk, c->rs_table_lr * (float)double_of(p->h[H_A]),
                            c->rs_table_eps);
        return DT_OK;
    }
    for (int q = 0; q < sv->N; q++)
        if (sv->w[q].rows_pushed <= sv->tb.step) return DT_OK;  // not every worker's yet
    int64_t **ids = malloc(sizeof *ids * (size_t)sv->N);
    float **g = malloc(sizeof *g * (size_t)sv->N);
    size_t *ks = malloc(sizeof *ks * (size_t)sv->N), rows;
    if (!ids || !g || !ks) st = dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    for (int q = 0; q < sv->N && st == DT_OK; q++) ids[q] = sv->w[q].pq, g[q] = sv->w[q].pg, ks[q] = sv->w[q].pk;
    if (st == DT_OK) st = dt_rows_shard_step(&sv->tb.sh, sv->N, ids, g, ks, c->rs_table_lr, c->rs_table_eps, &rows);
    free(ids), free(g), free(ks);
    if (st != DT_OK) return dt_error(st, "server %d: %s", sv->me, dt_last_error());
    sv->tb.step++;
    return release_pulls(sv);
}
