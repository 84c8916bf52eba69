/* A parameter server's own loop (ps.c has the overview): its start (INIT;
 * a restart alone is in faults.c), the headers it handles, and what each
 * mode does with them: sync's sum, norm and update, async's and ssp's
 * update on arrival, the replies ssp holds, backup's step from the first
 * gradients, and dynamic sharing's pieces. */
#include "engine/strategies/ps/ps_impl.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

// The newest weights, the optimizer state and the statistics.
static dt_status send_states(server *sv, int wi) {
    // (a test's fault: server j, rank -1 - j, as a worker fetches its range after step S)
    dt_status fst = dt_fault_at(-1 - sv->me, sv->w[wi].step, "fetch");
    if (fst != DT_OK) return fst;
    int ns = dt_optim_num_states(sv->opt);
    int64_t h[H_N] = {M_STATES, sv->w[wi].step, sv->version, (int64_t)sv->lo, (int64_t)sv->len, ns, 0, 0};
    dt_status st = dt_send(h, H_N, DT_I64, sv->w[wi].rank, sv->all);
    if (st == DT_OK) st = dt_send(sv->params, sv->len, DT_F32, sv->w[wi].rank, sv->all);
    for (int k = 0; k < ns && st == DT_OK; k++)
        st = dt_send(dt_optim_state(sv->opt, k), sv->len, DT_F32, sv->w[wi].rank, sv->all);
    struct rusage ru;
    sv->stats[ST_PEAK_RSS] = getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss * 1024 : 0;
    if (st == DT_OK) st = dt_send(sv->stats, ST_N, DT_I64, sv->w[wi].rank, sv->all);
    sv->w[wi].sent = sv->version;
    return st;
}

// Dynamic sharing ([ps] share = dynamic, async and ssp): server 0 hands
// out the pieces of each epoch's batches (piece batch x N + part of an
// epoch, U = steps x N of them, numbered over the run) to the workers as
// they commit: each worker starts an epoch with its own first piece (e x U
// + its index, the first N pieces) and gets its next one with the WEIGHTS
// of each step, until the epoch's are all out (-1: its epoch is over, it
// goes to the meeting). A piece's batch over the run (piece / N) is the
// worker's clock for ssp's bound (release).
static void take_unit(server *sv, peer *p) {
    sv->units = p->h[H_COUNT];
    p->unit = p->h[H_OFF];
    if (sv->me != 0) return;
    int64_t U = sv->units, e = (p->unit - 1) / U;
    if (sv->next_unit < e * U + sv->N) {  // the epoch's first COMMIT: every worker on its own first piece
        sv->next_unit = e * U + sv->N;
        for (int wi = 0; wi < sv->N; wi++)
            if (sv->w[wi].doing < e * U) sv->w[wi].doing = e * U + wi;
    }
    p->doing = p->unit - 1;
}

static int64_t hand_out(server *sv, peer *p) {
    int64_t e = (p->unit - 1) / sv->units;
    p->doing = sv->next_unit < (e + 1) * sv->units ? sv->next_unit++ : -1;
    return p->doing;
}

// Backup: a late worker catches up (ps_update): a message of a later step
// than this server has it at says that it skipped the steps every server
// had made without it, so the step is at most this server's.
static void catch_up(server *sv, peer *p) {
    int64_t to = p->h[H_STEP], k = p->h[H_KIND];
    if (sv->mode != MODE_BACKUP || (k != M_PUSH && k != M_FETCH && k != M_SAVE && k != M_END) || to <= p->step ||
        to > sv->step || p->got || p->committed)
        return;
    sv->stats[ST_SKIPPED] += to - p->step;
    p->step = to;
}

// COMMIT from worker wi, once its pushes are all in (sync: summed, and
// the norm sent): the step's learning rate and clip scale, with which
// the mode applies its gradient (advance).
static dt_status take_commit(server *sv, int wi) {
    peer *p = &sv->w[wi];
    if (p->got != sv->len || (sv->mode == MODE_SYNC && !sv->reduced))
        return ps_refuse(sv, wi, "COMMIT after %lld of the range's %lld gradients", (long long)p->got,
                         (long long)sv->len);
    p->committed = 1;
    p->lr = double_of(p->h[H_A]);
    p->scale = double_of(p->h[H_B]);
    p->cseq = p->h[H_C];
    if (p->h[H_OFF] > 0 && p->h[H_COUNT] > 0) take_unit(sv, p);
    return DT_OK;
}

// END from worker wi: it is done.
static dt_status take_end(server *sv, int wi) {
    peer *p = &sv->w[wi];
    if (p->got)
        return dt_error(DT_ERR_COMM, "server %d: worker %d left in the middle of step %lld", sv->me, wi,
                        (long long)p->step + 1);
    p->ended = p->finished = 1;
    p->dropped = 0;  // (a replacement for one that had finished: it only ends)
    sv->ended++;
    return DT_OK;
}

// One header from worker wi.
static dt_status handle(server *sv, int wi) {
    peer *p = &sv->w[wi];
    dt_status st = DT_OK;
    catch_up(sv, p);
    switch (p->h[H_KIND]) {
    case M_PUSH:
        if ((st = ps_take_push(sv, wi)) == DT_OK && p->got == sv->len) p->arrived = ++sv->arrivals;
        break;
    case M_COMMIT:
        st = take_commit(sv, wi);
        break;
    case M_FETCH:
        st = send_states(sv, wi);
        break;
    case M_DESC:  // the model, for checkpoints
        st = ps_take_desc(sv, wi);
        break;
    case M_SAVE:
        st = ps_save(sv, wi);
        break;
    case M_HELLO:  // a worker found this server restarted: it goes on from its step
        st = ps_hello(sv, wi);
        break;
    case M_JOIN:  // a replacement: the step its predecessor was at
        st = ps_joined(sv, wi);
        break;
    case M_RESUME:  // ... going on from that step, with the newest weights
        st = ps_resume(sv, wi);
        break;
    case M_PULL:  // the recommender's rows (rows.c)
        st = ps_take_pull(sv, wi);
        break;
    case M_SPUSH:  // ... and their gradients
        st = ps_take_rows(sv, wi);
        break;
    case M_END:
        return take_end(sv, wi);  // no further header from it
    default:
        return dt_error(DT_ERR_COMM, "server %d: a message of kind %lld (%s) from worker %d", sv->me,
                        (long long)p->h[H_KIND], ps_kind_name(p->h[H_KIND]), wi);
    }
    return st == DT_OK ? ps_post_header(sv, wi) : st;
}

// Sync: every worker's push is in: their sum (in worker order; or screened
// and combined, robust.c), the global norm over the servers, and server 0
// tells the workers.
static dt_status reduce(server *sv) {
    dt_status st = ps_reduce_pushes(sv);  // (robust.c: screened and combined when set so)
    if (st != DT_OK) return st;
    double norm;
    st = dt_norm_sharded(sv->grad, sv->n, sv->lo, sv->lo + sv->len, sv->mine, &norm);
    if (st != DT_OK || sv->me != 0) return st;
    int64_t h[H_N] = {M_NORM, sv->step, sv->version, 0, 0, bits_of(norm), 0, 0};
    for (int wi = 0; wi < sv->N && st == DT_OK; wi++) st = dt_send(h, H_N, DT_I64, sv->w[wi].rank, sv->all);
    return st;
}

// A worker's push was used or dropped: ready for its next step.
static void next_step(server *sv, peer *p) {
    memset(p->seen, 0, sv->len);  // a whole push covers buf: nothing else to clear
    p->got = 0;
    p->committed = 0;
    p->step++;
    p->done_cseq = p->cseq;
    (void)sv;
}

// The weights to worker wi (blocking: an update may follow at once), with
// the staleness its gradient was applied at (-1: dropped) and, from server
// 0 with dynamic sharing, the next piece it is to train (hand_out).
// (Backup: H_B says the step this server collects, which a late worker
// catches up with.)
static dt_status reply(server *sv, int wi) {
    peer *p = &sv->w[wi];
    int64_t h[H_N] = {M_WEIGHTS, p->step - 1, sv->version, (int64_t)sv->lo, (int64_t)sv->len, p->stale,
                      sv->mode == MODE_BACKUP ? sv->step : 0, sv->me == 0 && p->unit > 0 ? hand_out(sv, p) : 0};
    dt_status st = dt_send(h, H_N, DT_I64, sv->w[wi].rank, sv->all);
    if (st == DT_OK) st = dt_send(sv->params, sv->len, DT_F32, sv->w[wi].rank, sv->all);
    p->sent = sv->version;
    p->held = 0;
    return st;
}

// Sync: every worker committed: the update, then the weights to every
// worker, all at once.
static dt_status apply_sync(server *sv) {
    peer *p0 = &sv->w[0];
    dt_optim_begin_step(sv->opt);
    dt_optim_update(sv->opt, 0, sv->len, sv->params, sv->grad, (float)p0->lr, (float)p0->scale);
    sv->step++;
    sv->version++;
    sv->stats[0] += sv->N;  // all of them fresh
    sv->stats[ST_APPLIED] += sv->N;
    sv->stats[ST_STEPS]++;
    sv->stats[ST_MIN_PER_STEP] = sv->stats[ST_MAX_PER_STEP] = sv->N;
    int64_t h[H_N] = {M_WEIGHTS, sv->step - 1, sv->version, (int64_t)sv->lo, (int64_t)sv->len, 0, 0, 0};
    dt_request_t *r = calloc(2 * (size_t)sv->N, sizeof *r);
    if (!r) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    dt_status st = DT_OK;
    for (int wi = 0; wi < sv->N && st == DT_OK; wi++) {
        st = dt_isend(h, H_N, DT_I64, sv->w[wi].rank, sv->all, &r[2 * wi]);
        if (st == DT_OK) st = dt_isend(sv->params, sv->len, DT_F32, sv->w[wi].rank, sv->all, &r[2 * wi + 1]);
    }
    dt_status w = ps_wait_all(r, 2 * sv->N);
    free(r);
    for (int wi = 0; wi < sv->N; wi++) {
        next_step(sv, &sv->w[wi]);
        sv->w[wi].sent = sv->version;
    }
    sv->reduced = 0;
    dt_heartbeat(sv->step);
    return st != DT_OK ? st : w;
}

// The slowest step among the workers still running.
static int64_t min_step(const server *sv) {
    int64_t m = INT64_MAX;
    for (int wi = 0; wi < sv->N; wi++)
        if (!sv->w[wi].ended && !sv->w[wi].dropped && sv->w[wi].step < m) m = sv->w[wi].step;
    return m;
}

// A push to apply alone (async, ssp, backup) whose range holds NaN or Inf:
// left out by this server (the others judge their ranges), named and
// counted. Mode sync screens whole pushes (robust.c). (Here too the first
// workers' pushes are replaced first under DTRAIN_ATTACK, but for "lie",
// which needs a step's set.)
static int faulty(server *sv, int wi) {
    if (wi < dt_attack_count(&sv->attack, sv->N) && sv->attack.kind != DT_ATTACK_LIE)
        dt_attack_row(&sv->attack, sv->w[wi].buf, sv->len, (uint64_t)sv->w[wi].step * 0x9e3779b97f4a7c15ull ^ sv->lo);
    if (isfinite(dt_sum_squares(sv->w[wi].buf, sv->len))) return 0;
    sv->stats[ST_LEFT_OUT]++;
    dt_log(DT_LOG_WARN, "server %d, step %lld: worker %d (rank %d) left out: its gradient holds NaN or Inf", sv->me,
           (long long)sv->w[wi].step + 1, wi, sv->w[wi].rank);
    return 1;
}

// Async and ssp: worker wi's gradient on its own, on arrival, at the rate
// its staleness allows (a faulty one left out); ssp holds the reply of a
// worker too far ahead.
static dt_status apply_one(server *sv, int wi) {
    peer *p = &sv->w[wi];
    int64_t stale = sv->version - p->sent;
    float lr = (float)p->lr;
    if (sv->c->ps_staleness_lr && stale > 1) lr /= (float)stale;
    if (faulty(sv, wi)) {  // answered with the newest weights, as a dropped gradient is
        sv->stats[ST_DROPPED]++;
        p->stale = -1;
        next_step(sv, p);
        if (p->step > sv->step) sv->step = p->step;
        p->held = 1;
        return DT_OK;
    }
    dt_optim_begin_step(sv->opt);
    dt_optim_update(sv->opt, 0, sv->len, sv->params, p->buf, lr, (float)p->scale);
    sv->version++;
    sv->stats[stale < HIST_MAX ? stale : HIST_MAX]++;
    sv->stats[ST_APPLIED]++;
    sv->stats[ST_PIECES] += p->unit > 0;
    p->stale = stale;
    next_step(sv, p);
    if (p->step > sv->step) {
        sv->step = p->step;
        dt_heartbeat(sv->step);
    }
    p->held = 1;
    return DT_OK;
}

// Ssp (and async, with no bound): the replies whose workers may go on.
// With dynamic sharing a worker's clock is the batch of its piece, and
// server 0 alone holds: a worker is released when the piece it would get
// next is at most `staleness` batches ahead of the slowest piece being
// trained (the other servers answer at once; the worker waits for all).
static dt_status release(server *sv) {
    int64_t lim = sv->mode == MODE_SSP ? sv->c->ps_staleness : INT64_MAX / 2, slow = min_step(sv);
    int gauge = 1;  // the gap is measured (dynamic: on server 0, while a piece is being trained)
    if (sv->units > 0) {
        slow = INT64_MAX;
        for (int wi = 0; wi < sv->N; wi++) {
            const peer *q = &sv->w[wi];
            if (!q->ended && !q->dropped && !q->held && q->doing >= 0 && q->doing / sv->N < slow)
                slow = q->doing / sv->N;
        }
        gauge = sv->me == 0 && slow != INT64_MAX;
        if (!gauge) lim = INT64_MAX / 2, slow = 0;
    }
    dt_status st = DT_OK;
    for (int wi = 0; wi < sv->N && st == DT_OK; wi++) {
        peer *p = &sv->w[wi];
        int64_t at = sv->units > 0 ? sv->next_unit / sv->N : p->step;  // dynamic: the clock of its next piece
        if (!p->held || at - slow > lim) continue;
        if (gauge && at - slow > sv->stats[ST_MAX_GAP]) sv->stats[ST_MAX_GAP] = at - slow;
        st = ps_survive(sv, wi, reply(sv, wi));
    }
    return st;
}

// Backup: the first N - b gradients of the server's step, in the order they
// arrived, make the step (their mean, each with its clip scale); the late
// ones are dropped and their workers get the newest weights.
static dt_status backup(server *sv, int *moved) {
    int need = sv->N - sv->c->ps_backup, have = 0, live = 0;
    for (int wi = 0; wi < sv->N; wi++) live += !sv->w[wi].dropped;
    if (live < need) need = live;  // N - b adapts to the workers taking part
    if (need < 1) return DT_OK;
    dt_status st = DT_OK;
    for (int wi = 0; wi < sv->N && st == DT_OK; wi++) {
        peer *p = &sv->w[wi];
        if (!p->committed) continue;
        if (p->step < sv->step) {  // late: its step was made without it
            sv->stats[ST_DROPPED]++;
            p->stale = -1;
            next_step(sv, p);
            st = ps_survive(sv, wi, reply(sv, wi));
            *moved = 1;
        } else if (p->step == sv->step) {
            have++;
        }
    }
    if (st != DT_OK || have < need) return st;
    int *use = malloc(sizeof(int) * (size_t)need);
    if (!use) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    for (int k = 0; k < need; k++) {  // the k-th arrival among the committed
        int best = -1;
        for (int wi = 0; wi < sv->N; wi++) {
            peer *p = &sv->w[wi];
            int taken = 0;
            for (int q = 0; q < k; q++) taken |= use[q] == wi;
            if (p->committed && p->step == sv->step && !taken && (best < 0 || p->arrived < sv->w[best].arrived))
                best = wi;
        }
        use[k] = best;
    }
    memset(sv->grad, 0, sizeof(float) * sv->len);
    int fine = 0;
    for (int k = 0; k < need; k++) fine += !faulty(sv, use[k]);
    for (int k = 0; k < need; k++) {
        const peer *p = &sv->w[use[k]];
        const float *g = p->buf;
        if (!isfinite(dt_sum_squares(g, sv->len))) continue;  // (left out above)
        float f = (float)(p->scale / fine);
        for (size_t i = 0; i < sv->len; i++) sv->grad[i] += f * g[i];
        int64_t stale = sv->version - p->sent;
        sv->stats[stale < HIST_MAX ? stale : HIST_MAX]++;
        sv->w[use[k]].stale = stale;
    }
    dt_optim_begin_step(sv->opt);
    dt_optim_update(sv->opt, 0, sv->len, sv->params, sv->grad, (float)sv->w[use[0]].lr, 1.0f);
    sv->version++;
    sv->step++;
    sv->stats[ST_APPLIED] += need;
    if (!sv->stats[ST_STEPS] || need < sv->stats[ST_MIN_PER_STEP]) sv->stats[ST_MIN_PER_STEP] = need;
    if (need > sv->stats[ST_MAX_PER_STEP]) sv->stats[ST_MAX_PER_STEP] = need;
    sv->stats[ST_STEPS]++;
    for (int k = 0; k < need && st == DT_OK; k++) {
        next_step(sv, &sv->w[use[k]]);
        st = ps_survive(sv, use[k], reply(sv, use[k]));
    }
    free(use);
    dt_heartbeat(sv->step);
    *moved = 1;
    return st;
}

// The range's buffers, the peers and the optimizer, for sv->n, lo, len,
// step and version.
dt_status ps_setup(server *sv) {
    size_t es = sv->det ? sizeof(int64_t) : sizeof(float);
    sv->params = dt_alloc(sizeof(float) * sv->len);
    sv->grad = dt_alloc(sizeof(float) * sv->len);
    if (!sv->w) sv->w = calloc((size_t)sv->N, sizeof *sv->w);  // (a restarted server has its peers already)
    if (!sv->params || !sv->grad || !sv->w) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    for (int wi = 0; wi < sv->N; wi++) {
        peer *p = &sv->w[wi];
        p->buf = dt_alloc(es * sv->len);
        p->seen = calloc(sv->len, 1);
        if (!p->buf || !p->seen) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
        memset(p->buf, 0, es * sv->len);
        p->step = sv->step;
        p->sent = sv->version;
        p->cseq = p->done_cseq = -1;
        p->doing = -1;
        p->rank = sv->ranks ? (int)sv->ranks[wi] : sv->S + wi;
    }
    const dt_robust_params *rp = &sv->c->ps_robust;
    sv->robust = sv->mode == MODE_SYNC;  // (the NaN/Inf screen is always on)
    if (sv->robust && sv->det && (rp->kind != DT_AGG_MEAN || sv->attack.kind) && !sv->rows &&
        !(sv->rows = dt_alloc(sizeof(float) * sv->len * (size_t)sv->N)))
        return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    dt_status st = dt_optim_create_at(&sv->opt, &sv->c->optim, sv->len, NULL);
    if (st == DT_OK) *dt_optim_step_count(sv->opt) = sv->version;
    return st;
}

// The recommender's tables (rows.c), after INIT: worker 0 names the
// checkpoint the run resumes from ("": none), whose rows this server takes.
static dt_status tables_from(server *sv, int w0) {
    int64_t n;
    dt_status st = dt_recv(&n, 1, DT_I64, w0, sv->all);
    if (st != DT_OK) return st;
    if (n < 0 || n > 8192) return dt_error(DT_ERR_COMM, "server %d: INIT names a checkpoint of %lld bytes", sv->me, (long long)n);
    char path[8193] = "";
    if (n && (st = dt_recv(path, (size_t)n, DT_U8, w0, sv->all)) != DT_OK) return st;
    path[n ? n - 1 : 0] = 0;
    return ps_tables_setup(sv, path);
}

// The start: worker 0's INIT with the range's weights and optimizer state.
static dt_status start(server *sv) {
    int64_t h[H_N];
    int w0 = sv->S;  // worker 0
    dt_status st = dt_recv(h, H_N, DT_I64, w0, sv->all);
    if (st != DT_OK) return st;
    size_t lo = 0, hi = 0;
    if (h[H_KIND] == M_INIT && h[H_C] > 0) dt_shard_range((size_t)h[H_C], sv->me, sv->S, &lo, &hi);
    int nw = dt_comm_size(sv->all) - sv->S;
    if (h[H_KIND] != M_INIT || h[H_C] <= 0 || h[H_OFF] != (int64_t)lo || h[H_COUNT] != (int64_t)(hi - lo) ||
        h[H_B] < 1 || h[H_B] > nw)
        return dt_error(DT_ERR_COMM, "server %d: the first message from worker 0 is %s, not the INIT of its range",
                        sv->me, ps_kind_name(h[H_KIND]));
    sv->N = (int)h[H_B];  // its peers: the workers, or the groups' leaders
    if (!(sv->ranks = malloc(sizeof(int64_t) * (size_t)sv->N)))
        return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    if ((st = dt_recv(sv->ranks, (size_t)sv->N, DT_I64, w0, sv->all)) != DT_OK) return st;
    for (int wi = 0; wi < sv->N; wi++)
        if (sv->ranks[wi] < sv->S || sv->ranks[wi] >= dt_comm_size(sv->all))
            return dt_error(DT_ERR_COMM, "server %d: INIT names rank %lld as a worker", sv->me, (long long)sv->ranks[wi]);
    sv->n = (size_t)h[H_C];
    sv->lo = lo;
    sv->len = hi - lo;
    sv->step = h[H_STEP];
    sv->version = h[H_VERSION];
    dt_heartbeat(sv->step);  // the step the run starts from (resumed: the checkpoint's), as the workers' first beat
    if ((st = ps_setup(sv)) != DT_OK) return st;
    if (h[H_A] != dt_optim_num_states(sv->opt))
        return dt_error(DT_ERR_COMM, "server %d: INIT brings %lld optimizer states, the optimizer has %d", sv->me,
                        (long long)h[H_A], dt_optim_num_states(sv->opt));
    st = dt_recv(sv->params, sv->len, DT_F32, w0, sv->all);
    for (int k = 0; k < dt_optim_num_states(sv->opt) && st == DT_OK; k++)
        st = dt_recv(dt_optim_state(sv->opt, k), sv->len, DT_F32, w0, sv->all);
    return st == DT_OK && ps_has_tables(sv->c) ? tables_from(sv, w0) : st;
}

static dt_status server_free(server *sv, dt_status st) {
    for (int wi = 0; sv->w && wi < sv->N; wi++) {
        if (sv->w[wi].req) dt_wait(&sv->w[wi].req);
        dt_free(sv->w[wi].buf);
        free(sv->w[wi].seen);
    }
    if (sv->writer) {  // the last write completes (after a failure, no waiting for the others' shards)
        dt_status w = st == DT_OK ? dt_ckpt_writer_wait(sv->writer) : DT_OK;
        if (st == DT_OK && w != DT_OK) st = dt_error(w, "server %d, checkpoint: %s", sv->me, dt_last_error());
        dt_ckpt_writer_free(sv->writer);
    }
    ps_tables_free(sv);
    ps_desc_free(&sv->desc);
    free(sv->ranks);
    free(sv->msg);
    free(sv->w);
    dt_free(sv->params);
    dt_free(sv->grad);
    dt_free(sv->rows);
    dt_optim_free(sv->opt);
    return st;
}

// What the mode does once the headers that arrived are handled.
static dt_status advance(server *sv, int *moved) {
    if (sv->mode == MODE_BACKUP) return backup(sv, moved);
    if (sv->mode != MODE_SYNC) {
        dt_status st = DT_OK;
        int queued = 0;
        for (int wi = 0; wi < sv->N; wi++) queued += sv->w[wi].got > 0 && !sv->w[wi].committed;
        if (queued > sv->stats[ST_MAX_QUEUED]) sv->stats[ST_MAX_QUEUED] = queued;
        for (int wi = 0; wi < sv->N && st == DT_OK; wi++)
            if (sv->w[wi].committed) {
                st = apply_one(sv, wi);
                *moved = 1;
            }
        return st == DT_OK ? release(sv) : st;
    }
    int pushed = 1, committed = 1;
    for (int wi = 0; wi < sv->N; wi++) {
        pushed &= sv->w[wi].got == sv->len;
        committed &= sv->w[wi].committed;
    }
    if (pushed && !sv->reduced && sv->ended == 0) {
        *moved = 1;
        sv->reduced = 1;
        return reduce(sv);
    }
    if (pushed && sv->reduced && committed) {
        *moved = 1;
        return apply_sync(sv);
    }
    return DT_OK;
}

// A server's own loop: receive pushes, update its range, answer, until
// every worker said END.
dt_status ps_serve(const dt_config *c, dt_comm_t all, dt_comm_t mine, const char *run_dir) {
    server sv = {.c = c, .all = all, .mine = mine, .det = c->deterministic, .mode = c->ps_mode, .run_dir = run_dir,
                 .saved_step = -1};
    sv.S = dt_comm_size(mine);
    sv.me = dt_comm_rank(mine);
    sv.N = dt_comm_size(all) - sv.S;  // its peers: the workers (INIT says the groups' leaders in mode sync)
    if (sv.mode != MODE_SYNC) dt_comm_set_peer_faults(all, 1);  // a worker's death is not the server's
    int again = dt_comm_incarnation(all) > 0;  // restarted alone (outside mode sync)
    dt_status st = dt_attack_from_env(&sv.attack);
    if (st == DT_OK) st = again ? ps_restart(&sv) : start(&sv);
    if (st == DT_OK && sv.me == 0 && !again)
        dt_log(DT_LOG_INFO, "server 0 of %d: %zu of %zu parameters, %d %s, mode %s%s%s%s", sv.S, sv.len, sv.n, sv.N,
               sv.N < dt_comm_size(all) - sv.S ? "groups' leaders" : "workers",
               ps_mode_names[sv.mode], sv.det ? ", deterministic" : "", c->ps_robust.kind ? ", aggregator " : "",
               c->ps_robust.kind ? dt_agg_names[c->ps_robust.kind] : "");
    for (int wi = 0; wi < sv.N && st == DT_OK && !again; wi++) st = ps_post_header(&sv, wi);
    int idle = 0;
    double beat = dt_now();
    int64_t at = sv.step;
    while (st == DT_OK && sv.ended < sv.N) {
        int moved = 0;
        if (sv.mode != MODE_SYNC) st = ps_tend(&sv, &moved);
        for (int wi = 0; wi < sv.N && st == DT_OK; wi++) {
            int done = 0;
            if (!sv.w[wi].req) continue;
            st = ps_survive(&sv, wi, dt_test(&sv.w[wi].req, &done));
            if (st != DT_OK || !done || sv.w[wi].dropped == 1) continue;
            moved = 1;
            st = ps_survive(&sv, wi, handle(&sv, wi));
        }
        if (st == DT_OK) st = advance(&sv, &moved);
        if (st == DT_OK && sv.writer) st = ps_saved(&sv, &moved);
        // DTRAIN_FAULT_STEP names server j as rank -1 - j (engine/worker.h).
        if (st == DT_OK && sv.step != at) st = dt_fault_step(-1 - sv.me, at = sv.step);
        if (moved) {
            idle = 0;
            continue;
        }
        // Nothing arrived: back off (the cores are the workers'), and say
        // that this server is alive.
        if (++idle > 64) usleep(idle > 1000 ? 1000 : 50);
        if (dt_now() - beat > 1) {
            dt_heartbeat(-1);
            beat = dt_now();
        }
    }
    if (st != DT_OK) {  // the others hear it now, and the receives still posted end
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_comm_abort(all, msg);
        server_free(&sv, st);
        return dt_error(st, "%s", msg);
    }
    return server_free(&sv, st);
}
