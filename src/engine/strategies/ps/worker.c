/* The workers' side of the parameter-server strategy (ps.c has the
 * overview): a step's pushes, from the grad hook or after backward, the
 * global norm (mode sync), COMMIT and the new weights of every range, and
 * the meetings at their own pace (params_sync: the newest weights and
 * optimizer state). */
#include "engine/strategies/ps/ps_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_plan(dt_strategy *s, int first, int share, int global) {
    ps_worker *w = (ps_worker *)s;
    w->next = 0;
    w->err = DT_OK;
    w->t_first = 0;
    int k = s->c->deterministic ? dt_strategy_dp_deterministic.plan(s, first, share, global)
                                : dt_strategy_plan_accum(s, first, share, global);
    // Apart from sync, each push is a step of its own: its share's mean
    // (its loss, norm and clipping are its own). Async and ssp apply it at
    // its part of the learning rate, so that the N pushes of a step move
    // the weights as far as sync's one step, with any optimizer: SGD's
    // steps and weight decay, and Adam's, whose step does not grow with
    // the gradient.
    if (s->c->ps_mode != MODE_SYNC) s->loss_denom = share;
    w->weight = (s->c->ps_mode == MODE_ASYNC || s->c->ps_mode == MODE_SSP) && global > 0 ? (float)share / (float)global : 1.0f;
    return k;
}

// Sends piece i: its header and its data (float gradients, or the
// deterministic int64 sums).
void ps_push(ps_worker *w, int i) {
    dt_strategy *s = &w->base;
    piece *p = &w->p[i];
    if (!w->t_first) w->t_first = dt_now();
    if (ps_server_lost(w, p->server)) return;  // restarted: its pieces go once it is back (ps_sync)
    int det = w->acc != NULL;
    // Compressed: the piece's message, made once a step (the same again
    // when a restarted server needs the step's pieces twice: ps_repush).
    int coded = w->codec && !dt_codec_small(w->codec, p->lo, p->hi);
    if (coded && p->coded != w->step) {
        p->bytes = w->codec->ops->encode(w->codec, s->grads, p->lo, p->hi, &p->msg);
        p->coded = w->step;
        if (!p->bytes) {
            if (w->err == DT_OK) w->err = DT_ERR_NOMEM;
            snprintf(w->errmsg, sizeof w->errmsg, "encoding [%zu, %zu): %s", p->lo, p->hi, dt_last_error());
            return;
        }
    }
    int64_t *h = w->hdr[i];
    h[H_KIND] = M_PUSH;
    h[H_STEP] = w->step;
    h[H_VERSION] = w->ver[p->server];
    h[H_OFF] = (int64_t)p->lo;
    h[H_COUNT] = (int64_t)(p->hi - p->lo);
    h[H_A] = det ? DT_I64 : coded ? DT_U8 : DT_F32;
    h[H_B] = coded ? (int64_t)p->bytes : 0;  // the message's bytes
    h[H_C] = 0;
    // DTRAIN_FAULT_PUSH=WORKER:STEP:step|version|shape: that worker's
    // pushes of that step (1-based) are wrong in that field (tests).
    const char *f = getenv("DTRAIN_FAULT_PUSH");
    int fw;
    long long fs;
    char what[16];
    if (f && sscanf(f, "%d:%lld:%15s", &fw, &fs, what) == 3 && fw == s->rank && fs == w->step + 1) {
        if (!strcmp(what, "step")) h[H_STEP]++;
        if (!strcmp(what, "version")) h[H_VERSION]--;
        if (!strcmp(what, "shape")) h[H_OFF] = (int64_t)w->shi[p->server] - 1;
    }
    dt_status st = dt_isend(h, H_N, DT_I64, p->server, s->all, &w->req[2 * i]);
    if (st == DT_OK)
        st = det     ? dt_isend(w->acc + p->lo, p->hi - p->lo, DT_I64, p->server, s->all, &w->req[2 * i + 1])
             : coded ? dt_isend(p->msg, p->bytes, DT_U8, p->server, s->all, &w->req[2 * i + 1])
                     : dt_isend(s->grads + p->lo, p->hi - p->lo, DT_F32, p->server, s->all, &w->req[2 * i + 1]);
    if (st != DT_OK && w->err == DT_OK) {
        w->err = st;
        snprintf(w->errmsg, sizeof w->errmsg, "%s", dt_last_error());
    }
}

// The model's grad hook: gradients at positions >= pos of the order are final.
static void ready(size_t pos, void *user) {
    ps_worker *w = user;
    while (w->next < w->np && w->p[w->next].pos >= pos && w->err == DT_OK) ps_push(w, w->next++);
}

dt_grad_ready_fn ps_grad_hook(dt_strategy *s, int k, void **user) {
    *user = s;
    return !s->c->deterministic && !((ps_worker *)s)->group && k == s->nmicro - 1 ? ready : NULL;
}

// Deterministic: each shard's gradient on its own into the fixed-point sums.
void ps_micro_end(dt_strategy *s, int k) {
    ps_worker *w = (ps_worker *)s;
    (void)k;
    if (!w->acc) return;
    dt_fixed_add(w->acc, s->grads, s->n, DT_FIXED_SCALE);
    memset(s->grads, 0, sizeof(float) * s->n);
}

dt_status ps_sync(dt_strategy *s) {
    ps_worker *w = (ps_worker *)s;
    w->t_backward_end = dt_now();
    dt_status st = DT_OK;
    if (w->group) {  // the group's sum first; its leader pushes it
        if (!w->t_first) w->t_first = w->t_backward_end;
        st = w->acc ? dt_allreduce(w->acc, w->acc, s->n, DT_I64, DT_SUM, w->group)
                    : dt_allreduce(s->grads, s->grads, s->n, DT_F32, DT_SUM, w->group);
        if (st != DT_OK) return dt_error(st, "gradient allreduce in the group: %s", dt_last_error());
        if (!w->leader) w->next = w->np;
    }
    while (w->next < w->np && w->err == DT_OK) ps_push(w, w->next++);
    st = ps_wait_all(w->req, 2 * w->np);
    if (s->own_pace) {  // a server died (or was restarted before this step): its pieces again, once it is back
        int lost = 0;
        dt_status again = DT_OK;
        for (int j = 0; j < w->S && again == DT_OK; j++)
            if (ps_server_lost(w, j)) {
                lost = 1;
                again = ps_server_back(w, j);
                if (again == DT_OK) again = ps_repush(w, j);
            }
        if (lost) {
            st = again;
            w->err = DT_OK;
        }
    }
    if (w->acc) memset(w->acc, 0, sizeof(int64_t) * s->n);
    double t = dt_now();
    if (!w->t_first) w->t_first = t;
    s->comm_seconds += t - w->t_first;
    s->comm_exposed_seconds += t - (w->t_backward_end > w->t_first ? w->t_backward_end : w->t_first);
    if (w->err != DT_OK) return dt_error(w->err, "gradient push: %s", w->errmsg);
    return st != DT_OK ? dt_error(st, "gradient push: %s", dt_last_error()) : DT_OK;
}

// The global norm of the summed gradient, from server 0 (sync); apart from
// sync, the norm of this worker's own gradient, which is applied alone.
dt_status ps_grad_norm(dt_strategy *s, double *norm) {
    ps_worker *w = (ps_worker *)s;
    if (s->c->ps_mode != MODE_SYNC) return dt_strategy_norm_replicated(s, norm);
    int64_t h[H_N] = {0};
    dt_status st = w->leader ? ps_expect(w, 0, h, M_NORM) : DT_OK;
    if (st == DT_OK && w->group) st = dt_broadcast(&h[H_A], &h[H_A], 1, DT_I64, 0, w->group);
    *norm = st == DT_OK ? double_of(h[H_A]) : 0;
    return st == DT_OK ? DT_OK : dt_error(st, "gradient norm from the servers: %s", dt_last_error());
}

// The leader's weights and versions to its group (with states: the
// optimizer state and the statistics too).
static dt_status share(ps_worker *w, int states) {
    dt_strategy *s = &w->base;
    dt_status st = dt_broadcast(s->params, s->params, s->n, DT_F32, 0, w->group);
    if (st == DT_OK) st = dt_broadcast(w->ver, w->ver, (size_t)w->S, DT_I64, 0, w->group);
    for (int k = 0; k < (states ? dt_optim_num_states(s->opt) : 0) && st == DT_OK; k++)
        st = dt_broadcast(dt_optim_state(s->opt, k), dt_optim_state(s->opt, k), s->n, DT_F32, 0, w->group);
    if (st == DT_OK && states) st = dt_broadcast(w->stats, w->stats, ST_N, DT_I64, 0, w->group);
    return st;
}

// COMMIT to server j: this step's learning rate and clip scale (req NULL:
// blocking).
static dt_status commit_to(ps_worker *w, int j, float lr, float scale, dt_request_t *req) {
    int64_t *c = w->hdr[w->np + j];
    c[H_KIND] = M_COMMIT;
    c[H_STEP] = w->step;
    c[H_VERSION] = w->ver[j];
    c[H_OFF] = w->base.units > 0 ? w->base.unit + 1 : 0;  // dynamic sharing: the piece this step trained
    c[H_COUNT] = w->base.units;
    c[H_C] = (int64_t)dt_comm_seq(w->base.comm);  // where this step stands among the workers' meetings (ps_rejoin)
    c[H_A] = bits_of(lr);
    c[H_B] = bits_of(scale);
    return req ? dt_isend(c, H_N, DT_I64, j, w->base.all, req) : dt_send(c, H_N, DT_I64, j, w->base.all);
}

// Server j's WEIGHTS of this step, into the block: the receives posted
// (post), then waited for.
static dt_status weights_post(ps_worker *w, int j) {
    dt_strategy *s = &w->base;
    dt_request_t *r = w->req + 2 * w->np + 2 * j;
    dt_status st = dt_irecv(w->hdr[w->np + w->S + j], H_N, DT_I64, j, s->all, &r[0]);
    if (st == DT_OK) st = dt_irecv(s->params + w->slo[j], w->shi[j] - w->slo[j], DT_F32, j, s->all, &r[1]);
    return st;
}

static dt_status weights_wait(ps_worker *w, int j, dt_status st) {
    dt_strategy *s = &w->base;
    int64_t *h = w->hdr[w->np + w->S + j];
    dt_status st2 = ps_wait_all(w->req + 2 * w->np + 2 * j, 2);
    if (st == DT_OK) st = st2;
    if (st == DT_OK && (h[H_KIND] != M_WEIGHTS || h[H_STEP] != w->step))
        st = dt_error(DT_ERR_COMM, "worker %d: server %d sent %s for step %lld, expected WEIGHTS for step %lld", s->rank,
                      j, ps_kind_name(h[H_KIND]), (long long)h[H_STEP] + 1, (long long)w->step + 1);
    return st;
}

// COMMIT to every server, then the new weights of every range. The
// receives of the weights are posted before the commits go: a server that
// sends a worker its weights must not wait for that worker to get its
// commit into another server that waits for a third worker (the cycle of
// blocked sends a worker's one-at-a-time exchange made possible). Outside
// mode sync a server that died is waited for, and gets this step's pieces
// and COMMIT again.
dt_status ps_update(dt_strategy *s, float lr, float scale) {
    ps_worker *w = (ps_worker *)s;
    int S = w->S;
    lr *= w->weight;
    int64_t(*h)[H_N] = w->hdr + w->np;  // S commits, then S replies
    dt_request_t *cr = w->req + 2 * w->np + 2 * S;  // the commits in flight
    dt_status st = DT_OK, *cst = calloc((size_t)S, sizeof *cst);
    if (!cst) return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    for (int j = 0; j < S && w->leader; j++)  // (a server restarted since the pushes: below)
        cst[j] = ps_server_lost(w, j) ? DT_ERR_COMM : weights_post(w, j);
    for (int j = 0; j < S && w->leader; j++)
        if (cst[j] == DT_OK) cst[j] = commit_to(w, j, lr, scale, &cr[j]);
    for (int j = 0; j < S && w->leader; j++) {
        dt_status c = dt_wait(&cr[j]);
        if (cst[j] == DT_OK) cst[j] = c;
    }
    for (int j = 0; j < S && w->leader; j++) {
        dt_status sj = weights_wait(w, j, cst[j]);
        for (int t = 0; sj != DT_OK && t < 3 && ps_server_lost(w, j); t++) {
            sj = ps_server_back(w, j);
            if (sj == DT_OK) sj = ps_repush(w, j);
            if (sj == DT_OK) sj = weights_post(w, j);
            if (sj == DT_OK) sj = commit_to(w, j, lr, scale, NULL);
            sj = weights_wait(w, j, sj);
        }
        if (st == DT_OK) st = sj;
    }
    free(cst);
    if (st != DT_OK) return dt_error(st, "weights from the servers: %s", dt_last_error());
    for (int j = 0; j < S && w->leader; j++) w->ver[j] = h[S + j][H_VERSION];  // the others': share() below
    s->has_staleness = 1;
    s->staleness = w->leader ? (int)h[S][H_A] : 0;  // as server 0 applied it
    if (s->units > 0) s->unit = h[S][H_C];          // server 0's next piece for this worker (-1: none left)
    if (w->group && (st = share(w, 0)) != DT_OK) return dt_error(st, "weights in the group: %s", dt_last_error());
    w->step++;
    w->cseq = (int64_t)dt_comm_seq(s->comm);
    dt_optim_begin_step(s->opt);  // the step count that checkpoints keep
    // Backup: a worker whose gradient came late finds every server past
    // its next step too when it is slow for good; it catches up instead
    // of computing gradients that would be dropped: it skips the steps
    // every server has made (their least step, H_B), and the loop passes
    // their batches over (skip_steps). Only a lasting straggler skips: one
    // late by less than a step goes on with the next.
    if (s->c->ps_mode == MODE_BACKUP) {
        int64_t to = INT64_MAX;
        for (int j = 0; j < S; j++) to = h[S + j][H_B] < to ? h[S + j][H_B] : to;
        for (; to > w->step && to != INT64_MAX; w->step++, s->skip_steps++) dt_optim_begin_step(s->opt);
    }
    return DT_OK;
}

// A barrier of the workers at their own pace, where they meet (before an
// evaluation, a checkpoint and the final weights). These barriers are the
// meetings' only collectives (worker 0 evaluates alone: loop.c), so a
// replacement for a worker that died inside a meeting joins it where the
// others are: it runs the meeting again and skips the barriers its
// predecessor had made (skip_barriers, from ps_rejoin), which the others are past.
dt_status ps_meet(ps_worker *w) {
    dt_strategy *s = &w->base;
    if (!s->own_pace || s->world < 2) return DT_OK;
    if (s->skip_barriers > 0) {
        s->skip_barriers--;
        return DT_OK;
    }
    return dt_barrier(s->comm);
}

// Before an evaluation, a checkpoint and the final weights: the newest
// weights and the optimizer state of every range, into this worker's
// blocks (what checkpoints write), and server 0's statistics. Workers at
// their own pace meet first, so that all of them take the same weights.
dt_status ps_params_sync(dt_strategy *s) {
    ps_worker *w = (ps_worker *)s;
    int ns = dt_optim_num_states(s->opt);
    dt_status st = ps_meet(w);
    for (int j = 0; j < w->S && st == DT_OK && w->leader; j++) {
        size_t len = w->shi[j] - w->slo[j];
        for (int t = 0; t < 4; t++) {  // again after a server's restart (outside mode sync)
            if ((t > 0 && !ps_server_lost(w, j)) || (st = ps_back_if_lost(w, j)) != DT_OK) break;
            int64_t h[H_N] = {M_FETCH, w->step, w->ver[j], 0, 0, 0, 0, 0};
            st = dt_send(h, H_N, DT_I64, j, s->all);
            if (st == DT_OK) st = ps_expect(w, j, h, M_STATES);
            if (st == DT_OK) w->ver[j] = h[H_VERSION];
            if (st == DT_OK) st = dt_recv(s->params + w->slo[j], len, DT_F32, j, s->all);
            for (int k = 0; k < ns && st == DT_OK; k++)
                st = dt_recv(dt_optim_state(s->opt, k) + w->slo[j], len, DT_F32, j, s->all);
            int64_t stats[ST_N];
            if (st == DT_OK) st = dt_recv(stats, ST_N, DT_I64, j, s->all);
            if (st == DT_OK && j == 0) memcpy(w->stats, stats, sizeof stats);
            if (st == DT_OK) break;
        }
    }
    if (st == DT_OK) st = dt_fault_at(s->rank, w->step, "fetch");  // (a test's fault inside the meeting)
    if (st == DT_OK && w->group) st = share(w, 1);
    if (st == DT_OK) st = ps_meet(w);  // nobody steps on before all fetched
    return st == DT_OK ? DT_OK : dt_error(st, "weights and optimizer state from the servers: %s", dt_last_error());
}
