/* Parameter servers, the "ps" strategy ([parallel] servers = S; strategy.h,
 * docs/parameter-server.md).
 *
 * Roles. The run's first S ranks are servers, the others workers: the loop
 * splits the world (split_roles, loop.c), so that data sharding, the
 * control plane, evaluation and checkpoints see only the workers, and runs
 * ps_serve on the servers. The parameter block is cut into S balanced
 * contiguous ranges (dt_shard_range: a tensor may span two servers); server
 * j holds range j's weights and optimizer state and applies the update.
 * Workers keep the whole block for forward and backward.
 *
 * Messages go point to point over the world communicator (dt_isend,
 * dt_irecv), each a header of H_N int64s, some followed by data:
 *
 *   worker -> server  INIT     worker 0, once: the range's weights, optimizer state and step
 *                     PUSH     a piece of the gradient: step, version, offset, count, then the data
 *                     COMMIT   the step's learning rate and clip scale: apply the update
 *                     FETCH    send the optimizer state (before a checkpoint)
 *                     END      this worker is done
 *   server -> worker  NORM     (server 0, mode sync) the global gradient norm
 *                     WEIGHTS  the range's weights after the update, and their version
 *                     STATES   the range's optimizer state
 *
 * A step, mode sync. During the last micro-batch's backward the worker
 * pushes the pieces of its gradient as the grad hook reports them final
 * (the model's gradient order cut into buckets of [parallel] bucket_kb from
 * its end, and at server boundaries); deterministic mode pushes its int64
 * fixed-point sums after backward. A server that has every worker's pushes
 * for its range adds them (in worker order; deterministic: as integers, so
 * in any order) and the servers take the global norm of the sum together
 * (dt_norm_sharded: bitwise dt_sum_squares of the whole block); server 0
 * sends it to every worker, whose loop turns it into a clip scale and a
 * learning rate, and COMMIT brings them to the servers, which update their
 * ranges and send back the weights. The result is plain data parallel's.
 *
 * The other modes ([ps] mode) apply a worker's gradient (its own share's
 * mean, clipped by its own norm; async and ssp apply it at the share's part
 * of the learning rate) without waiting for the others: async on
 * arrival; ssp the same, but the reply to a worker more than [ps]
 * staleness steps ahead of the slowest is held until the slowest catches
 * up; backup makes each step from the first N - b gradients of the step to
 * arrive and drops the late ones. Their workers step at their own pace
 * (own_pace: no per-step control-plane allreduce) and meet at
 * evaluations, checkpoints and the end. The staleness of each applied
 * gradient (updates between the weights it was computed from and those it
 * was applied to) goes into a histogram, and back to its worker. With
 * [ps] share = dynamic (async, ssp) a worker does not train its share of
 * every batch: server 0 hands the pieces of each epoch's batches (a
 * batch's even split) to whichever worker commits, with its WEIGHTS
 * (take_unit, hand_out), and the worker's epoch ends when they are out.
 *
 * Hybrid groups ([ps] groups, mode sync): each group of workers
 * allreduces its gradient, and its leader alone talks to the servers and
 * broadcasts what it gets to the group.
 *
 * With [compression] (a method with point-to-point messages, codec.h) a
 * worker encodes each piece once a step with its own codec (error feedback
 * per worker) and pushes the message (DT_U8, its bytes in H_B); the server
 * decodes it into the worker's buffer (dt_codec_decode).
 *
 * A push is checked against what the server expects: its step, the version
 * of the weights it was computed from, and its shape (offset and count
 * inside the server's range, no element twice, the element type, a
 * message that decodes to its count); anything
 * else fails the run with an error naming the worker, the field, the value
 * and what was expected. A worker has one step in flight at a time (it
 * waits for the weights before its next forward), so a server holds at
 * most one push per worker: its queue cannot grow.
 *
 * Checkpoints in mode sync stay the workers': before a save (params_sync)
 * every worker fetches the optimizer state of every range into its own
 * optimizer, whose view the loop writes as it would dp's. In the other
 * modes the servers write them, each its range as its shard of a sharded
 * checkpoint (DESC, SAVE). On resume worker 0 sends each server its range
 * of the loaded state (INIT).
 *
 * Faults outside mode sync. A worker that dies (or hangs, and is killed)
 * is restarted alone by the launcher; the servers drop it from their
 * bookkeeping (drop: ssp does not wait for it, backup's N - b adapts),
 * empty the channels to it once the launcher restarts it, and let its
 * replacement back in (ps_tend), which rejoins at its predecessor's step with
 * the newest weights (JOIN, RESUME), or joins the meeting (evaluation,
 * checkpoint, end) its predecessor died in, past the barriers it had made
 * (ps_meet). A server that dies is restarted alone (ps_restart) and takes its
 * range of the newest checkpoint, whatever its layout, or without one the
 * weights of the first worker to find it back (restore); each worker,
 * finding it gone or restarted, waits for it, empties the channels and
 * says its step (HELLO, with the model's description and its weights of
 * the range), then pushes its step again (ps_server_back, ps_repush). comm.h's
 * replaceable ranks do the communicator's part.
 *
 * This file holds the strategy's table and what is not a step's: the
 * config check, the set-up (the pieces, the groups, the servers' INIT)
 * and teardown, and the summary. The rest is in the files beside it, by
 * role (ps_impl.h lists them). */
#include "engine/strategies/ps/ps_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Hybrid groups ([ps] groups = G): workers [ceil(g N / G), ceil((g + 1) N / G))
// form group g, whose first is its leader, the servers' peer g (by default
// under mpirun or srun across hosts, mode sync: one group per host).
// Without groups every worker is a group of its own.
static int group_of(int rank, int N, int G) { return (int)((long)rank * G / N); }

static int ps_other_ranks(const dt_config *c) { return c->ps_servers; }

// Outside mode sync a dead worker or server is let in alone again while the
// others go on (faults.c); with dynamic sharing server 0 holds the hand-out
// of the pieces, and its death is the group's.
static int ps_alone_from(const dt_config *c) { return c->ps_mode == MODE_SYNC ? -1 : c->ps_share ? 1 : 0; }

static int ps_wants(const dt_config *c) { return c->ps_servers > 0; }

const char *const ps_mode_names[] = {"sync", "async", "ssp", "backup"};

static dt_status ps_check(const dt_config *c, int W) {
    const char *m = ps_mode_names[c->ps_mode];
    if (ps_has_tables(c)) {
        dt_status tst = ps_tables_check(c);
        if (tst != DT_OK) return tst;
    }
    if (c->ps_groups > W)
        return dt_error(DT_ERR_CONFIG, "[ps] groups = %d: more groups than the %d workers", c->ps_groups, W);
    if (c->ps_groups > 0 && c->ps_mode != MODE_SYNC)
        return dt_error(DT_ERR_CONFIG, "[ps] groups works with mode = sync (mode is %s)", m);
    if (c->ps_mode != MODE_SYNC && c->deterministic)
        return dt_error(DT_ERR_CONFIG, "[ps] mode = %s applies gradients as they arrive: [parallel] deterministic "
                                       "needs mode = sync", m);
    if (c->ps_mode != MODE_SYNC && (c->ckpt_sharded || c->ckpt_every_seconds > 0))
        return dt_error(DT_ERR_CONFIG, "[ps] mode = %s: workers step at their own pace, so checkpoints are by steps "
                                       "and written by the servers, each its range ([checkpoint] %s is not available)",
                        m, c->ckpt_sharded ? "sharded" : "every_seconds");
    if (c->ps_mode == MODE_BACKUP && c->ps_backup >= W)
        return dt_error(DT_ERR_CONFIG, "[ps] backup_workers = %d: must be fewer than the %d workers", c->ps_backup, W);
    if (c->ps_mode != MODE_BACKUP && c->ps_backup > 0)
        return dt_error(DT_ERR_CONFIG, "[ps] backup_workers works with mode = backup (mode is %s)", m);
    if (c->ps_share && c->ps_mode != MODE_ASYNC && c->ps_mode != MODE_SSP)
        return dt_error(DT_ERR_CONFIG, "[ps] share = dynamic works with mode = async or ssp (mode is %s)", m);
    if (c->ps_share && c->dynamic_batch)
        return dt_error(DT_ERR_CONFIG, "[ps] share = dynamic hands out pieces of the even split: [train] "
                                       "dynamic_batch is not available with it");
    // Dynamic sharing: the workers make different numbers of steps, so
    // places counted in steps are no places they share (checkpoints are
    // at epochs' ends: loop.c, which also refuses to resume inside an
    // epoch, whose pieces handed out no checkpoint holds).
    const char *by_steps = c->eval_every > 0 ? "[train] eval_every" : c->max_steps > 0 ? "[train] max_steps" : NULL;
    if (c->ps_share && by_steps)
        return dt_error(DT_ERR_CONFIG, "[ps] share = dynamic: the workers make different numbers of steps, so %s is "
                                       "not available with it (the epochs are its only places)", by_steps);
    if (c->ps_mode != MODE_SSP && c->ps_staleness > 0)
        return dt_error(DT_ERR_CONFIG, "[ps] staleness works with mode = ssp (mode is %s)", m);
    if ((c->ps_mode == MODE_SYNC || c->ps_mode == MODE_BACKUP) && c->ps_staleness_lr)
        return dt_error(DT_ERR_CONFIG, "[ps] staleness_lr: mode = %s applies no stale gradient (async and ssp do)", m);
    if (c->grad_dtype)
        return dt_error(DT_ERR_CONFIG, "[parallel] grad_dtype = bf16: workers push fp32 gradients to parameter servers; "
                        "leave it unset with [parallel] servers");
    if (c->ps_robust.kind != DT_AGG_MEAN && c->ps_mode != MODE_SYNC)
        return dt_error(DT_ERR_CONFIG, "[ps] aggregator = %s combines the gradients of a step: it needs mode = sync "
                        "(mode is %s)", dt_agg_names[c->ps_robust.kind], m);
    dt_status rst = dt_robust_check(&c->ps_robust, c->ps_groups > 0 ? c->ps_groups : W, "[ps]", 0);
    if (rst != DT_OK) return rst;
    return c->deterministic ? dt_strategy_dp_deterministic.check(c, W) : dt_strategy_dp.check(c, W);
}

static int ps_max_micro(const dt_config *c, int W) {
    return c->deterministic ? dt_strategy_dp_deterministic.max_micro(c, W) : dt_strategy_dp.max_micro(c, W);
}

// The pieces: the order from its end, cut every bucket_floats of the order
// and at the servers' boundaries in the block. Returns how many (p NULL:
// only counts).
static int cut(ps_worker *w, const dt_grad_range *order, int norder, size_t bucket_floats, piece *p) {
    size_t n = w->base.n, end = n;  // end: the order position where range r ends
    int k = 0;
    for (int r = norder - 1; r >= 0; r--) {
        size_t start = end - order[r].len;
        for (size_t at = end; at > start;) {
            size_t b = (n - at) / bucket_floats;  // the bucket holding position at - 1
            size_t blo = (b + 1) * bucket_floats >= n ? 0 : n - (b + 1) * bucket_floats;
            size_t from = blo > start ? blo : start;
            size_t plo = order[r].offset + (from - start), phi = order[r].offset + (at - start);
            while (phi > plo) {  // split at server boundaries, from the top
                int j = 0;
                while (w->shi[j] < phi) j++;
                size_t lo = w->slo[j] > plo ? w->slo[j] : plo;
                if (p) p[k] = (piece){lo, phi, start + (lo - order[r].offset), j, NULL, 0, -1};
                k++;
                phi = lo;
            }
            at = from;
        }
        end = start;
    }
    return k;
}

static dt_status ps_init(dt_strategy *s) {
    ps_worker *w = (ps_worker *)s;
    w->S = dt_comm_size(s->all) - s->world;
    if (w->S < 1) return dt_error(DT_ERR_CONFIG, "strategy ps: no server ranks in the world");
    if (s->n < (size_t)w->S)
        return dt_error(DT_ERR_CONFIG, "[parallel] servers = %d: more servers than the model's %zu parameters", w->S,
                        s->n);
    w->slo = malloc(sizeof(size_t) * 2 * (size_t)w->S);
    w->ver = calloc((size_t)w->S, sizeof *w->ver);
    w->sinc = calloc((size_t)w->S, sizeof *w->sinc);
    if (!w->slo || !w->ver || !w->sinc) return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    s->own_pace = s->c->ps_mode != MODE_SYNC;
    // Outside mode sync the servers write the checkpoints, and a server's
    // death is survived: the worker waits for it to come back (ps_server_back).
    s->ckpt_saves = s->own_pace;
    // The recommender's tables are the servers' alone: their checkpoints
    // are the servers' in every mode (rows.c).
    if (ps_has_tables(s->c)) s->ckpt_saves = 1;
    if (s->own_pace) dt_comm_set_peer_faults(s->all, 1);
    for (int j = 0; j < w->S; j++) dt_comm_peer_state(s->all, j, &w->sinc[j]);
    w->leader = 1;
    w->cseq = -1;
    // Hybrid groups: [ps] groups = G, or by default under mpirun or srun
    // across hosts in mode sync, one group per host (its workers allreduce
    // over the host's memory; its leader talks to the servers).
    int hosts = !s->own_pace && s->c->ps_groups == 0 && dt_comm_nnodes(s->all) > 1;
    if (s->c->ps_groups > 0 || hosts) {  // a collective over the workers
        int color = hosts ? dt_comm_node(s->all) : group_of(s->rank, s->world, s->c->ps_groups);
        dt_status st = dt_comm_split(s->comm, color, s->rank, &w->group);
        if (st != DT_OK) return dt_error(st, "strategy ps: the workers' groups: %s", dt_last_error());
        w->leader = dt_comm_rank(w->group) == 0;
    }
    // The leaders' world ranks, in worker order: the servers' peers.
    int64_t *mine = malloc(sizeof(int64_t) * (size_t)s->world);
    w->leaders = malloc(sizeof(int64_t) * (size_t)s->world);
    if (!mine || !w->leaders) {
        free(mine);
        return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    }
    int64_t me = w->leader ? dt_comm_rank(s->all) : -1;
    dt_status ast = DT_OK;
    if (w->group)  // (without groups every worker leads: no collective, which a replacement could not join)
        ast = dt_allgather(&me, mine, 1, DT_I64, s->comm);
    else
        for (int r = 0; r < s->world; r++) mine[r] = w->S + r;
    if (ast != DT_OK) {
        free(mine);
        return dt_error(ast, "strategy ps: the groups' leaders: %s", dt_last_error());
    }
    w->G = 0;
    for (int r = 0; r < s->world; r++)
        if (mine[r] >= 0) w->leaders[w->G++] = mine[r];
    free(mine);
    if (hosts && s->rank == 0)
        dt_log(DT_LOG_INFO, "parameter servers: %d groups of workers, one per host (the hosts of mpirun/srun; "
                            "[ps] groups = N sets another number)", w->G);
    w->shi = w->slo + w->S;
    for (int j = 0; j < w->S; j++) dt_shard_range(s->n, j, w->S, &w->slo[j], &w->shi[j]);
    dt_grad_range whole = {0, s->n};
    const dt_grad_range *order = s->order && s->norder > 0 ? s->order : &whole;
    int norder = s->order && s->norder > 0 ? s->norder : 1;
    size_t covered = 0;
    for (int i = 0; i < norder; i++) covered += order[i].len;
    if (covered != s->n)
        return dt_error(DT_ERR_ARG, "strategy ps: the gradient order covers %zu of the %zu gradients", covered, s->n);
    size_t bf = (size_t)s->c->bucket_kb * 1024 / sizeof(float);
    if (bf == 0) bf = 1;
    w->np = cut(w, order, norder, bf, NULL);
    w->p = malloc(sizeof *w->p * (size_t)w->np);
    w->hdr = malloc(sizeof *w->hdr * (size_t)(w->np + 2 * w->S));
    w->req = calloc((size_t)(2 * w->np + 3 * w->S), sizeof *w->req);
    if (!w->p || !w->hdr || !w->req) return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    cut(w, order, norder, bf, w->p);
    if (s->c->deterministic && !(w->acc = dt_alloc(sizeof(int64_t) * s->n)))
        return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    if (w->acc) memset(w->acc, 0, sizeof(int64_t) * s->n);
    if (s->c->comp_method != DT_COMP_NONE)
        return dt_codec_create(&w->codec, s->c, s->comm, s->n, s->matrices, s->nmatrices);
    return DT_OK;
}

static void ps_fini(dt_strategy *s) {
    ps_worker *w = (ps_worker *)s;
    if (w->req) ps_wait_all(w->req, 2 * w->np + 3 * w->S);
    // Done: the servers end when every worker said so. A broken world, or
    // a failed worker, has nobody to tell (the abort reaches the servers,
    // with the failure's own message).
    if (w->slo && w->leader && !s->rejoin_done && !s->failed && dt_comm_get_async_error(s->all) == DT_OK)
        for (int j = 0; j < w->S; j++) {
            dt_status st = ps_back_if_lost(w, j);
            int64_t h[H_N] = {M_END, w->step, w->ver[j], 0, 0, 0, 0, 0};
            if (st == DT_OK) st = dt_send(h, H_N, DT_I64, j, s->all);
            if (st != DT_OK && ps_server_lost(w, j) && ps_server_back(w, j) == DT_OK) {
                h[H_VERSION] = w->ver[j];
                st = dt_send(h, H_N, DT_I64, j, s->all);
            }
            if (st != DT_OK) break;
            if (j == 0 && w->S > 1) (void)dt_fault_at(s->rank, w->step, "ended");  // (a test's fault: kill)
        }
    dt_comm_destroy(w->group);
    dt_codec_free(w->codec);
    dt_rows_plan_free(&w->plan);
    free(w->rows_to);
    free(w->slo);
    free(w->ver);
    free(w->sinc);
    free(w->leaders);
    free(w->p);
    free(w->hdr);
    free(w->req);
    dt_free(w->acc);
}

// At the start (fresh or resumed): worker 0 gives each server its range of
// the weights and the optimizer state, the loop's step, and as the
// version the optimizer's step count. A replacement rejoins instead.
static dt_status ps_ckpt_restore(dt_strategy *s, const char *path, int parts) {
    ps_worker *w = (ps_worker *)s;
    if (dt_comm_incarnation(s->all) > 0) return ps_rejoin(w);
    // Steps are the loop's; a range's version counts its updates (the
    // optimizer's step count: outside mode sync a server's checkpoint
    // holds its own, several updates a step).
    w->step = s->start_step;
    for (int j = 0; j < w->S; j++) w->ver[j] = *dt_optim_step_count(s->opt);
    if (w->codec) {  // a collective over the workers
        dt_status cst = dt_codec_restore(w->codec, path, parts);
        if (cst != DT_OK) return cst;
    }
    if (s->rank != 0) return DT_OK;
    int ns = dt_optim_num_states(s->opt);
    dt_status st = DT_OK;
    for (int j = 0; j < w->S && st == DT_OK; j++) {
        size_t lo = w->slo[j], len = w->shi[j] - lo;
        int64_t h[H_N] = {M_INIT, w->step, w->ver[j], (int64_t)lo, (int64_t)len, ns, w->G, (int64_t)s->n};
        st = dt_send(h, H_N, DT_I64, j, s->all);
        if (st == DT_OK) st = dt_send(w->leaders, (size_t)w->G, DT_I64, j, s->all);
        if (st == DT_OK) st = dt_send(s->params + lo, len, DT_F32, j, s->all);
        for (int k = 0; k < ns && st == DT_OK; k++) st = dt_send(dt_optim_state(s->opt, k) + lo, len, DT_F32, j, s->all);
        if (st == DT_OK && ps_has_tables(s->c)) {  // the checkpoint its rows of the tables come from ("": none)
            int64_t n = path && *path ? (int64_t)strlen(path) + 1 : 0;
            st = dt_send(&n, 1, DT_I64, j, s->all);
            if (st == DT_OK && n) st = dt_send(path, (size_t)n, DT_U8, j, s->all);
        }
        if (st == DT_OK) st = ps_send_desc(w, j);
    }
    return st == DT_OK ? DT_OK : dt_error(st, "starting the servers: %s", dt_last_error());
}

// summary.json's "ps" object: the mode and server 0's statistics.
static void ps_summary(dt_strategy *s, struct cJSON *o) {
    ps_worker *w = (ps_worker *)s;
    const int64_t *t = w->stats;
    cJSON *ps = cJSON_AddObjectToObject(o, "ps");
    cJSON_AddStringToObject(ps, "mode", ps_mode_names[s->c->ps_mode]);
    cJSON_AddNumberToObject(ps, "servers", w->S);
    cJSON_AddNumberToObject(ps, "groups", w->group ? w->G : 0);
    cJSON_AddNumberToObject(ps, "applied", (double)t[ST_APPLIED]);
    cJSON_AddNumberToObject(ps, "dropped", (double)t[ST_DROPPED]);
    cJSON_AddStringToObject(ps, "aggregator", dt_agg_names[s->c->ps_robust.kind]);
    cJSON_AddNumberToObject(ps, "left_out", (double)t[ST_LEFT_OUT]);
    if (s->c->ps_mode == MODE_BACKUP) cJSON_AddNumberToObject(ps, "skipped", (double)t[ST_SKIPPED]);
    cJSON_AddNumberToObject(ps, "max_step_gap", (double)t[ST_MAX_GAP]);
    cJSON_AddNumberToObject(ps, "min_gradients_per_step", (double)t[ST_MIN_PER_STEP]);
    cJSON_AddNumberToObject(ps, "max_gradients_per_step", (double)t[ST_MAX_PER_STEP]);
    cJSON_AddNumberToObject(ps, "max_queued_pushes", (double)t[ST_MAX_QUEUED]);
    cJSON_AddNumberToObject(ps, "server_peak_rss_bytes", (double)t[ST_PEAK_RSS]);
    cJSON_AddNumberToObject(ps, "workers_died", (double)t[ST_DIED]);
    cJSON_AddNumberToObject(ps, "workers_rejoined", (double)t[ST_REJOINED]);
    cJSON_AddStringToObject(ps, "share", s->units > 0 ? "dynamic" : "fixed");
    if (s->units > 0) cJSON_AddNumberToObject(ps, "pieces", (double)t[ST_PIECES]);
    if (ps_has_tables(s->c)) {  // the recommender's tables: bytes a worker moves a step, rows and block apart
        double n = w->table_steps > 0 ? (double)w->table_steps : 1;
        cJSON_AddNumberToObject(ps, "table_bytes_per_step", (double)w->table_bytes / n);
        cJSON_AddNumberToObject(ps, "dense_bytes_per_step", (double)w->dense_bytes / n);
        // the servers' balance: the rows this worker pushed to each a step, the most over their mean
        cJSON_AddStringToObject(ps, "table_placement", s->c->rs_placement ? "hash" : "range");
        cJSON *per = cJSON_AddArrayToObject(ps, "table_rows_per_server");
        double most = 0, all = 0;
        for (int j = 0; j < w->S && w->rows_to; j++) {
            double r = (double)w->rows_to[j] / n;
            cJSON_AddItemToArray(per, cJSON_CreateNumber(r));
            most = r > most ? r : most;
            all += r;
        }
        cJSON_AddNumberToObject(ps, "table_balance", all > 0 ? most / (all / w->S) : 0);
    }
    int last = 0;
    for (int k = 0; k <= HIST_MAX; k++)
        if (t[k]) last = k;
    cJSON *h = cJSON_AddArrayToObject(ps, "staleness_histogram");
    for (int k = 0; k <= last; k++) cJSON_AddItemToArray(h, cJSON_CreateNumber((double)t[k]));
}

const dt_strategy_ops dt_strategy_ps = {
    .name = "ps",
    .size = sizeof(ps_worker),
    .wants = ps_wants,
    .check = ps_check,
    .max_micro = ps_max_micro,
    .init = ps_init,
    .fini = ps_fini,
    .plan = ps_plan,
    .grad_hook = ps_grad_hook,
    .micro_end = ps_micro_end,
    .sync = ps_sync,
    .grad_norm = ps_grad_norm,
    .update = ps_update,
    .params_sync = ps_params_sync,
    .ckpt_extra = ps_ckpt_extra,
    .ckpt_restore = ps_ckpt_restore,
    .ckpt_save = ps_ckpt_save,
    .other_ranks = ps_other_ranks,
    .alone_from = ps_alone_from,
    .serve = ps_serve,
    .summary = ps_summary,
    .rows_pull = ps_rows_pull,
    .rows_push = ps_rows_push,
};
