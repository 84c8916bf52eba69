/* Faults of the parameter-server strategy outside mode sync (ps.c has
 * the overview): on the workers' side a server found dead, waited for and
 * told the step again (HELLO, the pushes again), and a replacement's
 * rejoining (JOIN, RESUME); on the servers' side a worker's death (drop),
 * its replacement let in (ps_tend) and answered, and a server restarted
 * alone (its range from a checkpoint or a worker's weights). */
#include "engine/strategies/ps/ps_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// the worker's side

// A failure talking to server j outside mode sync: did it die (to be
// restarted alone by the launcher)?
int ps_server_lost(ps_worker *w, int j) {
    if (!w->base.own_pace) return 0;
    int inc, state = dt_comm_peer_state(w->base.all, j, &inc);
    return state != DT_PEER_RUNNING || inc > w->sinc[j];
}

// This worker's pieces of the step for server j that may still be in
// flight (pushed during backward: the recommender's rows' exchange after
// it finds j dead before ps_sync waits for them) waited for, whatever
// their outcome (they went to the dead server): none may be left for the
// communicator's progress to write into the channels that
// dt_comm_peer_reset empties, where the replacement would read a PUSH
// before this worker's HELLO.
static void settle(ps_worker *w, int j) {
    for (int i = 0; i < w->np; i++)
        if (w->p[i].server == j) (void)ps_wait_all(&w->req[2 * i], 2);
}

// Server j died and the launcher restarts it alone from its range of the
// newest checkpoint: this worker settles what it had in flight to it,
// empties the channels between the two for the replacement, waits for it
// (bounded) and tells it its step and what the checkpoints say about the
// model (HELLO; the first to arrive makes the server take its range),
// taking the version of the range it now holds.
dt_status ps_server_back(ps_worker *w, int j) {
    dt_strategy *s = &w->base;
    settle(w, j);
    double t0 = dt_now(), T = ps_timeout(s->all);
    int inc = 0, state = dt_comm_peer_state(s->all, j, &inc);
    for (; inc <= w->sinc[j]; state = dt_comm_peer_state(s->all, j, &inc)) {
        if (state == DT_PEER_GONE)  // the launcher stops the group: nobody takes its place
            return dt_error(DT_ERR_COMM, "worker %d: server %d died and is not restarted", s->rank, j);
        if (dt_now() - t0 > T)
            return dt_error(DT_ERR_TIMEOUT, "worker %d: server %d died and was not restarted within %.0f s", s->rank,
                            j, T);
        dt_heartbeat(-1);
        usleep(2000);
    }
    dt_status st = dt_comm_peer_reset(s->all, j);
    w->sinc[j] = inc;
    while (st == DT_OK && (state = dt_comm_peer_state(s->all, j, &inc)) != DT_PEER_RUNNING) {
        if (inc > w->sinc[j]) {  // died again before it ran
            st = dt_comm_peer_reset(s->all, j);
            w->sinc[j] = inc;
        }
        if (state == DT_PEER_GONE)
            return dt_error(DT_ERR_COMM, "worker %d: server %d was restarted (incarnation %d) but is gone", s->rank, j,
                            inc);
        if (dt_now() - t0 > T)
            return dt_error(DT_ERR_TIMEOUT, "worker %d: server %d was restarted (incarnation %d) but did not come back "
                            "within %.0f s", s->rank, j, inc, T);
        dt_heartbeat(-1);
        usleep(2000);
    }
    if (st == DT_OK) st = dt_fault_at(s->rank, w->step, "hello");  // (a test's fault: before its HELLO)
    char *b = NULL;
    size_t len = 0;
    if (st == DT_OK) st = ps_desc_of(w, &b, &len);
    int64_t h[H_N] = {M_HELLO, w->step, w->ver[j], 0, (int64_t)len, (int64_t)s->n, 0, w->cseq};
    if (st == DT_OK) st = dt_send(h, H_N, DT_I64, j, s->all);
    if (st == DT_OK && len) st = dt_send(b, len, DT_U8, j, s->all);
    free(b);
    // (its weights of the range: those the server takes when no checkpoint holds it)
    if (st == DT_OK) st = dt_send(s->params + w->slo[j], w->shi[j] - w->slo[j], DT_F32, j, s->all);
    if (st == DT_OK) st = dt_recv(h, H_N, DT_I64, j, s->all);
    if (st == DT_OK && h[H_KIND] != M_HELLOED)
        st = dt_error(DT_ERR_COMM, "worker %d: restarted server %d sent %s, expected HELLOED", s->rank, j,
                      ps_kind_name(h[H_KIND]));
    if (st == DT_OK) w->ver[j] = h[H_VERSION];
    if (st != DT_OK) return dt_error(st, "worker %d, server %d back: %s", s->rank, j, dt_last_error());
    dt_log(DT_LOG_WARN, "worker %d: server %d died; it is back (incarnation %d, %s) at version %lld, step %lld retried",
           s->rank, j, inc, h[H_A] ? "from a worker's weights, its optimizer state fresh" : "from its checkpoint",
           (long long)w->ver[j], (long long)w->step + 1);
    return DT_OK;
}

// Before a worker's first message to server j in a step, a meeting or at
// the end: a server restarted since this worker last talked to it runs
// already, but reads nothing from this worker before it lets it in
// (ps_server_back); a message sent first would wait for it for ever.
dt_status ps_back_if_lost(ps_worker *w, int j) { return ps_server_lost(w, j) ? ps_server_back(w, j) : DT_OK; }

// This step's pieces for server j again (blocking), to a restarted server
// (after ps_server_back, which settled those sent to its predecessor: they
// failed, or went to a channel the restart emptied).
dt_status ps_repush(ps_worker *w, int j) {
    w->err = DT_OK;
    for (int i = 0; i < w->np; i++)
        if (w->p[i].server == j) ps_push(w, i);
    dt_status st = DT_OK;
    for (int i = 0; i < w->np; i++)
        if (w->p[i].server == j) {
            dt_status a = ps_wait_all(&w->req[2 * i], 2);
            if (st == DT_OK) st = a;
        }
    if (w->err != DT_OK) return dt_error(w->err, "%s", w->errmsg);
    return st;
}

// The first of a replacement's steps: every server lets it in
// (dt_comm_rejoin_peers), again when one exited meanwhile; gone[j]: server
// j exited (it had had its predecessor's END).
static dt_status let_in(ps_worker *w, int *gone) {
    dt_strategy *s = &w->base;
    int *peers = malloc(sizeof(int) * (size_t)w->S);
    dt_status st = peers ? DT_OK : dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    for (int again = 1; again && st == DT_OK;) {  // again when a server exited meanwhile
        int np = 0;
        for (int j = 0; j < w->S; j++)
            if (!(gone[j] |= dt_comm_peer_state(s->all, j, NULL) == DT_PEER_GONE)) peers[np++] = j;
        st = dt_comm_rejoin_peers(s->all, peers, np);
        again = 0;
        for (int i = 0; i < np && st != DT_OK; i++) again |= dt_comm_peer_state(s->all, peers[i], NULL) == DT_PEER_GONE;
        if (again) st = DT_OK;
    }
    free(peers);
    return st;
}

// JOIN to every server still running: the earliest step the predecessor
// was at (*m), the workers' collectives made before it (*cseq), and a
// server that had its END (*finished).
static dt_status ask_steps(ps_worker *w, const int *gone, int64_t *m, int64_t *cseq, int *finished) {
    dt_strategy *s = &w->base;
    dt_status st = DT_OK;
    int64_t h[H_N];
    for (int j = 0; j < w->S && st == DT_OK; j++) {
        if (gone[j]) {
            *finished = j;
            continue;
        }
        int64_t q[H_N] = {M_JOIN, 0, 0, 0, 0, 0, 0, 0};
        st = dt_send(q, H_N, DT_I64, j, s->all);
        if (st == DT_OK) st = dt_recv(h, H_N, DT_I64, j, s->all);
        if (st == DT_OK && h[H_KIND] != M_JOINED)
            st = dt_error(DT_ERR_COMM, "worker %d, rejoining: server %d sent %s, expected JOINED", s->rank, j,
                          ps_kind_name(h[H_KIND]));
        if (st == DT_OK && h[H_A]) *finished = j;
        if (st == DT_OK && h[H_STEP] < *m) {  // the count at the step's COMMIT, from a server at that step
            *m = h[H_STEP];
            *cseq = h[H_C];
        }
    }
    return st;
}

// The predecessor had finished (server `finished` had its END): the
// replacement only tells the other servers, at step m (rejoin_done).
static dt_status end_for_predecessor(ps_worker *w, const int *gone, int64_t m, int finished) {
    dt_strategy *s = &w->base;
    dt_status st = DT_OK;
    for (int j = 0; j < w->S && st == DT_OK; j++) {
        int64_t q[H_N] = {M_END, m, 0, 0, 0, 0, 0, 0};
        if (!gone[j]) st = dt_send(q, H_N, DT_I64, j, s->all);
    }
    if (st != DT_OK) return dt_error(st, "worker %d, ending for its predecessor: %s", s->rank, dt_last_error());
    s->rejoin_done = 1;
    dt_log(DT_LOG_WARN, "worker %d (restarted, incarnation %d): its predecessor had finished (server %d had its "
                        "END); it only told the other servers",
           s->rank, dt_comm_incarnation(s->all), finished);
    return DT_OK;
}

// RESUME at step m to every server: the newest weights of its range, and
// from server 0 with dynamic sharing where the replacement goes on.
static dt_status resume_at(ps_worker *w, int64_t m, int64_t cseq) {
    dt_strategy *s = &w->base;
    dt_status st = DT_OK;
    int64_t h[H_N];
    for (int j = 0; j < w->S && st == DT_OK; j++) {
        int64_t q[H_N] = {M_RESUME, m, 0, 0, 0, 0, 0, cseq};
        st = dt_send(q, H_N, DT_I64, j, s->all);
        if (st == DT_OK) st = dt_recv(h, H_N, DT_I64, j, s->all);
        if (st == DT_OK && (h[H_KIND] != M_WEIGHTS || h[H_OFF] != (int64_t)w->slo[j] ||
                            h[H_COUNT] != (int64_t)(w->shi[j] - w->slo[j])))
            st = dt_error(DT_ERR_COMM, "worker %d, rejoining: server %d sent %s, expected the WEIGHTS of its range",
                          s->rank, j, ps_kind_name(h[H_KIND]));
        if (st == DT_OK) st = dt_recv(s->params + w->slo[j], w->shi[j] - w->slo[j], DT_F32, j, s->all);
        if (st == DT_OK) w->ver[j] = h[H_VERSION];
        if (st == DT_OK && j == 0 && s->c->ps_share && h[H_B] >= 0) {  // dynamic sharing: where it goes on
            s->rejoin_pieces = 1;
            s->rejoin_epoch = h[H_B];
            s->unit = h[H_C];
        }
    }
    return st;
}

// A replacement for a worker that died (outside mode sync; the launcher
// restarted it alone): once every server has let it in (dt_comm_rejoin_peers),
// it asks each for the step its predecessor was at (JOIN), goes on from
// the earliest (RESUME: a server that had applied that step's gradient
// takes it again) and gets the newest weights of every range.
//
// Its predecessor may have died inside the meeting after that step (an
// evaluation, a checkpoint, the end), where the other workers wait for it
// in a barrier or are past it. The step's COMMIT told the servers how many
// collectives the workers had made then (cseq); the predecessor's count
// (dt_comm_seq of the workers' communicator it rejoined) is higher by the
// meeting's barriers it had made. The loop then runs that meeting again
// (rejoin_meet) and skips those barriers (ps_meet): the replacement arrives
// at the one the others are in, or, past the meeting, at the next.
//
// Its predecessor may also have died at the very end, after it told some
// server that it was done (END) but not every one: a server that had the
// END says so in JOINED, and one that exited since had it too (a server
// ends once every worker did); the replacement then only tells the others
// (rejoin_done: the loop does nothing more).
dt_status ps_rejoin(ps_worker *w) {
    dt_strategy *s = &w->base;
    int *gone = calloc((size_t)w->S, sizeof(int));
    dt_status st = gone ? let_in(w, gone) : dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    int64_t m = INT64_MAX, cseq = -1;
    int finished = -1;  // a server that had its predecessor's END
    if (st == DT_OK) st = ask_steps(w, gone, &m, &cseq, &finished);
    if (st == DT_OK && m == INT64_MAX)
        st = dt_error(DT_ERR_COMM, "worker %d, rejoining: no server knows the step its predecessor was at (each was "
                                   "restarted since)", s->rank);
    if (st == DT_OK && finished >= 0) {
        st = end_for_predecessor(w, gone, m, finished);
        free(gone);
        return st;
    }
    free(gone);
    uint64_t made = dt_comm_seq(s->comm);
    if (st == DT_OK && cseq >= 0 && (uint64_t)cseq > made)
        st = dt_error(DT_ERR_COMM, "worker %d, rejoining: the servers say it had made %lld collectives with the other "
                      "workers at step %lld, its predecessor made %llu", s->rank, (long long)cseq, (long long)m,
                      (unsigned long long)made);
    if (st == DT_OK) st = resume_at(w, m, cseq);
    if (st != DT_OK) return dt_error(st, "worker %d, rejoining the servers: %s", s->rank, dt_last_error());
    w->step = m;
    w->cseq = cseq;
    s->rejoined = 1;
    s->rejoin_step = m;
    // A step made since the start (cseq known): the meeting after it, if
    // there is one, is run again, without the barriers already made.
    s->rejoin_meet = cseq >= 0;
    s->skip_barriers = cseq >= 0 ? made - (uint64_t)cseq : 0;
    if (s->skip_barriers > 0)
        dt_log(DT_LOG_WARN, "worker %d (restarted, incarnation %d) rejoined at server version %lld inside the meeting "
                            "after step %lld (its predecessor had made %llu of its barriers): joining it there",
               s->rank, dt_comm_incarnation(s->all), (long long)w->ver[0], (long long)m,
               (unsigned long long)s->skip_barriers);
    else
        dt_log(DT_LOG_WARN, "worker %d (restarted, incarnation %d) rejoined at server version %lld: going on with step "
                            "%lld", s->rank, dt_comm_incarnation(s->all), (long long)w->ver[0], (long long)m + 1);
    return DT_OK;
}

// ----------------------------------------------------------------------------
// the server's side

// Outside mode sync a worker's death does not stop the server: worker wi's
// process died (the launcher restarts it alone): what it had pushed of its
// step is forgotten and it leaves the staleness, ssp and backup
// bookkeeping until its replacement rejoins (ps_tend).
static void drop(server *sv, int wi, const char *why) {
    peer *p = &sv->w[wi];
    if (p->dropped >= 4) p->nostep = 1;  // it died before its HELLO to this replacement: its step unknown
    if (p->req) dt_wait(&p->req);  // fails at once: its peer is gone
    memset(p->seen, 0, sv->len);
    p->got = 0;
    p->committed = 0;
    p->held = 0;
    p->save_owed = 0;  // its replacement asks again
    p->dropped = 1;
    p->dead_at = dt_now();
    sv->stats[ST_DIED]++;
    if (sv->me == 0)
        dt_log(DT_LOG_WARN, "server 0: worker %d died at its step %lld (%s); dropped from the %s bookkeeping until it rejoins",
               wi, (long long)p->step + 1, why, sv->mode == MODE_SSP ? "ssp" : sv->mode == MODE_BACKUP ? "backup" : "staleness");
}

// st from an exchange with worker wi: a failure because its process died
// drops it (DT_OK); any other stays a failure.
dt_status ps_survive(server *sv, int wi, dt_status st) {
    if (st == DT_OK || sv->mode == MODE_SYNC || sv->w[wi].dropped == 1) return st;
    if (dt_comm_peer_state(sv->all, sv->w[wi].rank, NULL) == DT_PEER_RUNNING) return st;
    char why[512];
    snprintf(why, sizeof why, "%s", dt_last_error());
    drop(sv, wi, why);
    return DT_OK;
}

// The dropped workers: once the launcher is restarting one, the channels
// to it are emptied for the replacement; once that runs, its JOIN is
// awaited (a worker still dead after 60 s fails the server: the launcher
// stops the group long before when it does not restart it). *moved:
// something changed.
dt_status ps_tend(server *sv, int *moved) {
    double T = ps_timeout(sv->all);
    for (int wi = 0; wi < sv->N; wi++) {
        peer *p = &sv->w[wi];
        if (!p->dropped && !p->ended) continue;  // taking part: nothing to tend
        int inc, state = dt_comm_peer_state(sv->all, p->rank, &inc);
        // A worker that died after its END to this server (before another's):
        // its replacement is let in as any, and only ends (JOINED says so).
        if (p->ended && !p->dropped && state == DT_PEER_RESTARTING && inc > p->inc) {
            p->ended = 0;
            sv->ended--;
            p->dropped = 1;
            p->dead_at = dt_now();
            *moved = 1;
            if (sv->me == 0)
                dt_log(DT_LOG_WARN, "server 0: worker %d died after it said END; its replacement only ends", wi);
        }
        if (!p->dropped) continue;
        if (p->dropped >= 4 && (state == DT_PEER_RESTARTING || inc > p->inc)) {
            // A worker that died before it said HELLO to this replacement:
            // its own replacement rejoins (JOIN), at a step this server
            // does not know (JOINED says so: the others' is taken).
            p->dropped = 1;
            p->nostep = 1;
            p->dead_at = dt_now();
        }
        if (p->dropped >= 4) {  // this server is a replacement: each worker lets it in
            if (state == DT_PEER_GONE) {  // it finished before this server came back
                p->dropped = 0;
                p->ended = 1;
                sv->ended++;
                *moved = 1;
            } else if (p->dropped == 4 && dt_comm_peer_ready(sv->all, p->rank)) {
                p->dropped = 5;
                *moved = 1;
                dt_status st = ps_post_header(sv, wi);
                if (st != DT_OK) return st;
            } else if (dt_now() - p->dead_at > T) {  // (dead_at: this server's start)
                return dt_error(DT_ERR_TIMEOUT, "server %d (restarted, incarnation %d) could not rejoin: worker %d %s "
                                "within %.0f s", sv->me, dt_comm_incarnation(sv->all), wi,
                                p->dropped == 4 ? "did not let it in" : "let it in but did not say its step (HELLO)", T);
            }
            continue;
        }
        if (state == DT_PEER_RESTARTING && (p->dropped == 1 || inc > p->inc)) {
            if (p->req) dt_wait(&p->req);
            dt_status st = dt_comm_peer_reset(sv->all, p->rank);
            if (st != DT_OK) return st;
            p->dropped = 2;
            p->inc = inc;
            *moved = 1;
        } else if (p->dropped == 2 && state == DT_PEER_RUNNING && inc >= p->inc) {
            p->dropped = 3;
            *moved = 1;
            dt_status st = ps_post_header(sv, wi);
            if (st != DT_OK) return st;
        } else if (p->dropped <= 3 && dt_now() - p->dead_at > T) {
            return dt_error(DT_ERR_TIMEOUT, "server %d: worker %d died %.0f s ago and %s", sv->me, wi,
                            dt_now() - p->dead_at,
                            p->dropped == 1   ? "was not restarted"
                            : p->dropped == 2 ? "its replacement did not start"
                                              : "its replacement did not rejoin (JOIN, RESUME)");
        }
    }
    return DT_OK;
}

// A server restarted alone (outside mode sync): it knows its peers (every
// worker), lets each in as it finds the server back, and waits for their
// HELLOs; the first brings the model's description, with which it takes
// its range from the newest checkpoint (restore).
dt_status ps_restart(server *sv) {
    if (!(sv->w = calloc((size_t)sv->N, sizeof *sv->w))) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    for (int wi = 0; wi < sv->N; wi++) {
        sv->w[wi].rank = sv->S + wi;
        sv->w[wi].dropped = 4;  // each lets it in, then says HELLO (within ps_timeout of now)
        sv->w[wi].dead_at = dt_now();
        (void)dt_comm_peer_state(sv->all, sv->w[wi].rank, &sv->w[wi].inc);  // (a higher one later: it died)
    }
    return dt_comm_rejoin_peers(sv->all, NULL, 0);
}

// The recommender's tables (rows.c): its shard of them from checkpoint
// `from` (whatever number of servers wrote it), or without one from the
// seed: no worker holds them, so their training on this server is lost.
static dt_status restore_tables(server *sv, const char *from) {
    if (!ps_has_tables(sv->c)) return DT_OK;
    dt_status st = ps_tables_setup(sv, from);
    if (st != DT_OK) return st;
    const dt_rows_shard *sh = &sv->tb.sh;
    if (from)
        dt_log(DT_LOG_WARN, "server %d (restarted, incarnation %d): its rows [%lld, %lld) of the tables from %s", sv->me,
               dt_comm_incarnation(sv->all), (long long)sh->lo, (long long)(sh->lo + sh->n), from);
    else
        dt_log(DT_LOG_WARN, "server %d (restarted, incarnation %d): no checkpoint holds its rows [%lld, %lld) of the "
                            "tables: drawn from the seed again (their training is lost)",
               sv->me, dt_comm_incarnation(sv->all), (long long)sh->lo, (long long)(sh->lo + sh->n));
    return DT_OK;
}

// Its range of the n parameters, the optimizer state and the version (the
// updates it held then) from the newest checkpoint in the model's
// directory (sv->desc), whatever its layout: a whole file (one server), or
// shards of any number of servers (ckpt.h reads a range of either). With
// none (it died before the first, or the run keeps none), the weights
// worker wi pulled last, which come with its HELLO, and a fresh optimizer
// state (its step count 0). *seeded: the weights are those.
static dt_status restore(server *sv, size_t n, int wi, int *seeded) {
    size_t lo, hi;
    dt_shard_range(n, sv->me, sv->S, &lo, &hi);
    sv->n = n;
    sv->lo = lo;
    sv->len = hi - lo;
    dt_status st = ps_setup(sv);
    if (st != DT_OK) return st;
    dt_ckpt_model m = {.tensors = sv->desc.tensors, .ntensors = sv->desc.ntensors, .params = sv->params, .nparams = n,
                       .nstates = dt_optim_num_states(sv->opt), .opt_step = dt_optim_step_count(sv->opt),
                       .optimizer = sv->desc.optimizer, .config = sv->desc.config, .params_lo = lo, .params_hi = hi,
                       .states_lo = lo, .states_hi = hi};
    for (int k = 0; k < m.nstates && k < 2; k++) m.states[k] = dt_optim_state(sv->opt, k);
    dt_train_state ts = {0};
    int found = 0;
    char used[4200] = "";
    if (sv->desc.dir && (st = dt_ckpt_load_newest(sv->desc.dir, &m, &ts, &found, used, sizeof used)) != DT_OK)
        return dt_error(st, "server %d, restarted: its range [%zu, %zu): %s", sv->me, lo, hi, dt_last_error());
    *seeded = !found;
    if (!found) {
        sv->version = *m.opt_step = 0;
        sv->step = sv->w[wi].h[H_STEP];
        dt_log(DT_LOG_WARN, "server %d (restarted, incarnation %d): no checkpoint %s%s holds its range [%zu, %zu): its "
                            "weights from worker %d's newest (its step %lld), its optimizer state fresh",
               sv->me, dt_comm_incarnation(sv->all), sv->desc.dir ? "in " : "", sv->desc.dir ? sv->desc.dir : "", lo,
               hi, wi, (long long)sv->step + 1);
        return restore_tables(sv, NULL);
    }
    sv->version = *m.opt_step;
    sv->step = ts.step;
    dt_log(DT_LOG_WARN, "server %d (restarted, incarnation %d): its range [%zu, %zu) from %s (step %lld, version %lld)",
           sv->me, dt_comm_incarnation(sv->all), lo, hi, used, (long long)sv->step, (long long)sv->version);
    return restore_tables(sv, used);
}

// HELLO from worker wi, which found this restarted server back: the step it
// is at, the model's description (DESC's text; none without a checkpoint
// directory) and its newest weights of the range; the first one restores
// the range (and makes the checkpoint writer), then each gets the version.
dt_status ps_hello(server *sv, int wi) {
    peer *p = &sv->w[wi];
    int64_t len = p->h[H_COUNT], n = p->h[H_A];
    if (p->dropped != 5)
        return dt_error(DT_ERR_COMM, "server %d: HELLO from worker %d, which knew this server", sv->me, wi);
    if (len < 0 || len > (16 << 20) || n < sv->S || (sv->params && (size_t)n != sv->n))
        return dt_error(DT_ERR_COMM, "server %d, restarted: HELLO from worker %d with a description of %lld bytes, for "
                                     "%lld parameters%s", sv->me, wi, (long long)len, (long long)n,
                        sv->params ? " (the range is of another model)" : "");
    char *text = len ? malloc((size_t)len) : NULL;
    if (len && !text) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    dt_status st = len ? dt_recv(text, (size_t)len, DT_U8, p->rank, sv->all) : DT_OK;
    int first = !sv->params;
    if (st == DT_OK && first) {  // the description is kept (the writer points into it)
        if (len) st = ps_desc_decode(&sv->desc, text, (size_t)len, sv->me);
        text = NULL;
        if (st == DT_OK) st = restore(sv, (size_t)n, wi, &sv->seeded);
        if (st == DT_OK && len) st = ps_make_writer(sv);
    }
    free(text);
    // The worker's weights of the range: the range's when restore found no
    // checkpoint, else dropped (sv->grad is scratch between steps).
    if (st == DT_OK) st = dt_recv(first && sv->seeded ? sv->params : sv->grad, sv->len, DT_F32, p->rank, sv->all);
    if (st != DT_OK) return st;
    p->step = p->h[H_STEP];
    p->done_cseq = p->h[H_C];
    p->sent = sv->version;
    p->dropped = 0;
    // The server's step follows the workers past its checkpoint's: backup
    // makes it from the gradients of that step (a worker behind is late).
    if (p->step > sv->step) sv->step = p->step;
    int64_t h[H_N] = {M_HELLOED, p->step, sv->version, 0, 0, sv->seeded, 0, 0};
    return dt_send(h, H_N, DT_I64, p->rank, sv->all);
}

// JOIN from worker wi's replacement: the step its predecessor was at
// (INT64_MAX: this server, a replacement, never heard it), whether it had
// said END, and the workers' collectives it had made before that step.
dt_status ps_joined(server *sv, int wi) {
    peer *p = &sv->w[wi];
    if (p->dropped != 3)
        return dt_error(DT_ERR_COMM, "server %d: JOIN from worker %d, which did not die", sv->me, wi);
    int64_t h[H_N] = {M_JOINED, p->nostep ? INT64_MAX : p->step, sv->version, 0, 0, p->finished, 0, p->done_cseq};
    return dt_send(h, H_N, DT_I64, p->rank, sv->all);
}

// Dynamic sharing: where a replacement for worker p goes on (RESUME's
// reply from server 0): the piece its predecessor was training, which
// nobody else has (*piece, in *epoch), or, when its epoch's pieces were all
// out (it was going to the meeting at that epoch's end, or was in it, or
// past it with its next epoch's first piece given it), -1 and the epoch of
// its last piece: it runs that meeting, then the next epoch from its own
// first piece. -1, -1 without pieces yet (the loop's own start).
static void rejoin_piece(server *sv, const peer *p, int64_t *epoch, int64_t *piece) {
    int64_t U = sv->units, last = U > 0 && p->unit > 0 ? (p->unit - 1) / U : -1;
    if (U > 0 && p->doing >= 0 && (last < 0 || p->doing / U == last)) {
        *epoch = p->doing / U;
        *piece = p->doing;
    } else if (last >= 0) {
        *epoch = last;
        *piece = -1;
    }
}

// RESUME from worker wi's replacement: it goes on from the step it names,
// with the newest weights of the range (from server 0 with dynamic
// sharing, with where it goes on: rejoin_piece).
dt_status ps_resume(server *sv, int wi) {
    peer *p = &sv->w[wi];
    if (p->dropped != 3)
        return dt_error(DT_ERR_COMM, "server %d: RESUME from worker %d, which did not die", sv->me, wi);
    p->step = p->h[H_STEP];
    p->done_cseq = p->h[H_C];
    p->dropped = 0;
    p->nostep = 0;
    p->stale = 0;
    sv->stats[ST_REJOINED]++;
    if (sv->me == 0)
        dt_log(DT_LOG_WARN, "server 0: worker %d rejoined at server version %lld, with its step %lld", wi,
               (long long)sv->version, (long long)p->step + 1);
    int64_t h[H_N] = {M_WEIGHTS, p->step - 1, sv->version, (int64_t)sv->lo, (int64_t)sv->len, 0, -1, -1};
    if (sv->me == 0) rejoin_piece(sv, p, &h[H_B], &h[H_C]);
    dt_status st = dt_send(h, H_N, DT_I64, p->rank, sv->all);
    if (st == DT_OK) st = dt_send(sv->params, sv->len, DT_F32, p->rank, sv->all);
    p->sent = sv->version;
    return st;
}
