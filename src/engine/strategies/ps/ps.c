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
 * replacement back in (tend), which rejoins at its predecessor's step with
 * the newest weights (JOIN, RESUME), or joins the meeting (evaluation,
 * checkpoint, end) its predecessor died in, past the barriers it had made
 * (meet). A server that dies is restarted alone (restart) and takes its
 * range of the newest checkpoint, whatever its layout, or without one the
 * weights of the first worker to find it back (restore); each worker,
 * finding it gone or restarted, waits for it, empties the channels and
 * says its step (HELLO, with the model's description and its weights of
 * the range), then pushes its step again (server_back, repush). comm.h's
 * replaceable ranks do the communicator's part. */
#include "dtrain/launch.h"
#include "engine/codecs/codec.h"
#include "engine/strategies/strategy.h"
#include "engine/worker.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// the messages

enum { H_KIND, H_STEP, H_VERSION, H_OFF, H_COUNT, H_A, H_B, H_C, H_N };
#define PS_MAGIC 0x50530000LL  // "PS" in a message kind
enum {
    M_INIT = PS_MAGIC + 1,
    M_PUSH,
    M_COMMIT,
    M_FETCH,
    M_END,
    M_NORM,
    M_WEIGHTS,
    M_STATES,
    M_JOIN,
    M_JOINED,
    M_RESUME,
    M_DESC,
    M_SAVE,
    M_SAVED,
    M_HELLO,
    M_HELLOED,
};

// Statistics a server keeps (sent with STATES): the staleness of every
// applied gradient (updates of the range between the weights it was
// computed from and its own; the last bin counts HIST_MAX and above),
// then the figures below.
enum { HIST_MAX = 63, ST_APPLIED = 64, ST_DROPPED, ST_STEPS, ST_MAX_GAP, ST_MIN_PER_STEP, ST_MAX_PER_STEP, ST_MAX_QUEUED,
       ST_PEAK_RSS, ST_DIED, ST_REJOINED, ST_PIECES, ST_SKIPPED, ST_N };

static const char *kind_name(int64_t k) {
    static const char *names[] = {"INIT", "PUSH", "COMMIT", "FETCH", "END", "NORM", "WEIGHTS", "STATES",
                                  "JOIN", "JOINED", "RESUME", "DESC", "SAVE", "SAVED", "HELLO", "HELLOED"};
    return k > PS_MAGIC && k <= M_HELLOED ? names[k - PS_MAGIC - 1] : "unknown";
}

static int64_t bits_of(double x) {
    int64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static double double_of(int64_t b) {
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

// Waits for every request of r[0..n) (NULL ones are skipped); the first error.
static dt_status wait_all(dt_request_t *r, int n) {
    dt_status st = DT_OK;
    char msg[1024] = "";
    for (int i = 0; i < n; i++) {
        dt_status s = dt_wait(&r[i]);
        if (s != DT_OK && st == DT_OK) {
            st = s;
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    return st == DT_OK ? DT_OK : dt_error(st, "%s", msg);
}

// Hybrid groups ([ps] groups = G): workers [ceil(g N / G), ceil((g + 1) N / G))
// form group g, whose first is its leader, the servers' peer g (by default
// under mpirun or srun across hosts, mode sync: one group per host).
// Without groups every worker is a group of its own.
static int group_of(int rank, int N, int G) { return (int)((long)rank * G / N); }

// ----------------------------------------------------------------------------
// the servers' checkpoints (outside mode sync)
//
// Each server writes its range of the weights and the optimizer state as
// its shard of a sharded checkpoint (ckpt.h: DIR/step-N/, shard j of S is
// dt_shard_range(n, j, S), the server's range), and server 0 the index.
// What a checkpoint says about the model (the directory, the optimizer's
// name, the config, the tensor table, the weights' metadata) comes from
// worker 0 (DESC) as lines of text: "dir\tPATH", "optimizer\tNAME",
// "meta\tKEY\tVALUE", "tensor\tNAME\tOFFSET\tNDIM\tD0 D1 ..", then
// "config" and the config text to the end. The loop's state comes with
// each SAVE, after the workers met (params_sync).

typedef struct {
    char *text;  // the blob, cut in place; the fields point into it
    const char *dir, *optimizer, *config;
    dt_tensor_info *tensors;
    int ntensors;
    dt_st_meta *meta;
    int nmeta;
} model_desc;

static char *desc_encode(const dt_ckpt_model *m, const char *dir, size_t *len) {
    size_t cap = 4096 + strlen(m->config ? m->config : "") + strlen(dir);
    for (int i = 0; i < m->ntensors; i++) cap += strlen(m->tensors[i].name) + 128;
    for (int i = 0; i < m->nweights_meta; i++)
        cap += strlen(m->weights_meta[i].key) + strlen(m->weights_meta[i].value) + 16;
    char *b = malloc(cap);
    if (!b) return NULL;
    size_t o = (size_t)snprintf(b, cap, "dir\t%s\noptimizer\t%s\n", dir, m->optimizer ? m->optimizer : "");
    for (int i = 0; i < m->nweights_meta; i++)
        o += (size_t)snprintf(b + o, cap - o, "meta\t%s\t%s\n", m->weights_meta[i].key, m->weights_meta[i].value);
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        o += (size_t)snprintf(b + o, cap - o, "tensor\t%s\t%zu\t%d\t", t->name, t->offset, t->ndim);
        for (int d = 0; d < t->ndim; d++) o += (size_t)snprintf(b + o, cap - o, "%lld ", (long long)t->shape[d]);
        o += (size_t)snprintf(b + o, cap - o, "\n");
    }
    o += (size_t)snprintf(b + o, cap - o, "config\n%s", m->config ? m->config : "");
    *len = o + 1;
    return b;
}

static void desc_free(model_desc *d) {
    free(d->text);
    free(d->tensors);
    free(d->meta);
    memset(d, 0, sizeof *d);
}

// Parses text (len bytes, taken over) into d; a line that does not parse
// fails, naming it.
static dt_status desc_decode(model_desc *d, char *text, size_t len, int me) {
    desc_free(d);
    d->text = text;
    text[len - 1] = 0;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    d->tensors = calloc(lines, sizeof *d->tensors);
    d->meta = calloc(lines, sizeof *d->meta);
    if (!d->tensors || !d->meta) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", me);
    for (char *l = text; l && *l;) {
        char *nl = strchr(l, '\n'), *f[5] = {0};
        if (!strncmp(l, "config\n", 7)) {
            d->config = l + 7;
            break;
        }
        if (nl) *nl = 0;
        int nf = 0;
        for (char *q = l; q && nf < 5; nf++) {
            f[nf] = q;
            q = strchr(q, '\t');
            if (q) *q++ = 0;
        }
        if (nf == 2 && !strcmp(f[0], "dir")) d->dir = f[1];
        else if (nf == 2 && !strcmp(f[0], "optimizer")) d->optimizer = f[1];
        else if (nf == 3 && !strcmp(f[0], "meta")) d->meta[d->nmeta++] = (dt_st_meta){f[1], f[2]};
        else if (nf == 5 && !strcmp(f[0], "tensor")) {
            dt_tensor_info *t = &d->tensors[d->ntensors++];
            t->name = f[1];
            t->offset = (size_t)strtoull(f[2], NULL, 10);
            t->ndim = atoi(f[3]);
            if (t->ndim < 1 || t->ndim > 4)
                return dt_error(DT_ERR_COMM, "server %d: DESC: tensor %s with %d dimensions", me, t->name, t->ndim);
            char *q = f[4];
            t->numel = 1;
            for (int k = 0; k < t->ndim; k++) {
                t->shape[k] = strtoll(q, &q, 10);
                t->numel *= (size_t)t->shape[k];
            }
        } else {
            return dt_error(DT_ERR_COMM, "server %d: DESC: a line \"%.40s\" that is not a field", me, l);
        }
        l = nl ? nl + 1 : NULL;
    }
    if (!d->dir || !d->config) return dt_error(DT_ERR_COMM, "server %d: DESC without a directory or a config", me);
    return DT_OK;
}

// The loop's state, as SAVE carries it.
enum { TS_STEP, TS_EPOCH, TS_BATCH, TS_ESTEPS, TS_LOSS, TS_RNG, TS_WORLD = TS_RNG + 4, TS_N };

static void ts_pack(const dt_train_state *s, int64_t *v) {
    v[TS_STEP] = s->step;
    v[TS_EPOCH] = s->epoch;
    v[TS_BATCH] = s->epoch_batch;
    v[TS_ESTEPS] = s->epoch_steps;
    v[TS_LOSS] = bits_of(s->epoch_loss);
    memcpy(&v[TS_RNG], s->rng.s, sizeof s->rng.s);
    v[TS_WORLD] = s->world;
}

static void ts_unpack(const int64_t *v, dt_train_state *s) {
    s->step = v[TS_STEP];
    s->epoch = v[TS_EPOCH];
    s->epoch_batch = v[TS_BATCH];
    s->epoch_steps = v[TS_ESTEPS];
    s->epoch_loss = double_of(v[TS_LOSS]);
    memcpy(s->rng.s, &v[TS_RNG], sizeof s->rng.s);
    s->world = (int)v[TS_WORLD];
}

// ----------------------------------------------------------------------------
// the worker's side

typedef struct {
    size_t lo, hi;  // a contiguous part of the block, inside one server's range
    size_t pos;     // where it starts in the gradient order
    int server;
    const uint8_t *msg;  // [compression]: the piece's message of step `coded` (the codec's buffer), bytes long
    size_t bytes;
    int64_t coded;
} piece;

typedef struct {
    dt_strategy base;
    int S;              // servers: world ranks 0..S-1
    size_t *slo, *shi;  // their ranges
    piece *p;           // from the END of the order: p[0] is final first
    int np, next;
    int64_t (*hdr)[H_N];
    dt_request_t *req;  // two per piece: header and data
    int64_t *acc;       // deterministic: this worker's fixed-point sums
    int64_t step;
    int64_t *ver;       // the version of each server's weights this worker holds
    int *sinc;          // the incarnation of each server this worker knows (a restarted one's is higher)
    int64_t *leaders;   // the world ranks of the workers that talk to the servers (groups' leaders), G of them
    int G;
    int64_t stats[ST_N];  // server 0's, from the last params_sync (ps_summary)
    int64_t cseq;         // the workers' collectives made before this worker's last committed step (-1: none yet)
    dt_comm_t group;      // [ps] groups: this worker's group (NULL: none)
    dt_codec *codec;      // [compression]: what the pushes are encoded with (NULL: none, fp32)
    int leader;           // this worker talks to the servers
    float weight;         // async, ssp: the share's part of the global batch, which the server's learning rate scales by
    double t_first, t_backward_end;
    dt_status err;
    char errmsg[1024];
} ps_worker;

static int ps_other_ranks(const dt_config *c) { return c->ps_servers; }

static int ps_wants(const dt_config *c) { return c->ps_servers > 0; }

enum { MODE_SYNC, MODE_ASYNC, MODE_SSP, MODE_BACKUP };
static const char *const mode_names[] = {"sync", "async", "ssp", "backup"};

static dt_status ps_check(const dt_config *c, int W) {
    const char *m = mode_names[c->ps_mode];
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
    // death is survived: the worker waits for it to come back (server_back).
    s->ckpt_saves = s->own_pace;
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

static void push(ps_worker *w, int i);

// A failure talking to server j outside mode sync: did it die (to be
// restarted alone by the launcher)?
static int server_lost(ps_worker *w, int j) {
    if (!w->base.own_pace) return 0;
    int inc, state = dt_comm_peer_state(w->base.all, j, &inc);
    return state != DT_PEER_RUNNING || inc > w->sinc[j];
}

// What the servers' checkpoints say about the model (DESC's text; *len 0
// and NULL without a checkpoint directory).
static dt_status desc_of(ps_worker *w, char **b, size_t *len) {
    dt_strategy *s = &w->base;
    *b = NULL;
    *len = 0;
    if (!s->ckpt_saves || !s->ckpt_model || !s->ckpt_dir || !s->ckpt_dir[0]) return DT_OK;
    if (!(*b = desc_encode(s->ckpt_model, s->ckpt_dir, len))) return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    return DT_OK;
}

// Worker 0 tells server j what its checkpoints say about the model (DESC).
static dt_status send_desc(ps_worker *w, int j) {
    dt_strategy *s = &w->base;
    size_t len;
    char *b;
    dt_status st = s->rank == 0 ? desc_of(w, &b, &len) : DT_OK;
    if (s->rank != 0 || st != DT_OK || !b) return st;
    int64_t h[H_N] = {M_DESC, w->step, w->ver[j], 0, (int64_t)len, 0, 0, 0};
    st = dt_send(h, H_N, DT_I64, j, s->all);
    if (st == DT_OK) st = dt_send(b, len, DT_U8, j, s->all);
    free(b);
    return st;
}

// Server j died and the launcher restarts it alone from its range of the
// newest checkpoint: this worker empties the channels between the two for
// the replacement, waits for it (bounded) and tells it its step and what
// the checkpoints say about the model (HELLO; the first to arrive makes
// the server take its range), taking the version of the range it now
// holds.
static dt_status server_back(ps_worker *w, int j) {
    dt_strategy *s = &w->base;
    double t0 = dt_now();
    int inc = 0, state = dt_comm_peer_state(s->all, j, &inc);
    for (; inc <= w->sinc[j]; state = dt_comm_peer_state(s->all, j, &inc)) {
        if (dt_now() - t0 > 60)
            return dt_error(DT_ERR_COMM, "worker %d: server %d died and was not restarted", s->rank, j);
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
        if (state == DT_PEER_GONE || dt_now() - t0 > 120)
            return dt_error(DT_ERR_COMM, "worker %d: server %d was restarted but did not come back", s->rank, j);
        dt_heartbeat(-1);
        usleep(2000);
    }
    if (st == DT_OK) st = dt_fault_at(s->rank, w->step, "hello");  // (a test's fault: before its HELLO)
    char *b = NULL;
    size_t len = 0;
    if (st == DT_OK) st = desc_of(w, &b, &len);
    int64_t h[H_N] = {M_HELLO, w->step, w->ver[j], 0, (int64_t)len, (int64_t)s->n, 0, w->cseq};
    if (st == DT_OK) st = dt_send(h, H_N, DT_I64, j, s->all);
    if (st == DT_OK && len) st = dt_send(b, len, DT_U8, j, s->all);
    free(b);
    // (its weights of the range: those the server takes when no checkpoint holds it)
    if (st == DT_OK) st = dt_send(s->params + w->slo[j], w->shi[j] - w->slo[j], DT_F32, j, s->all);
    if (st == DT_OK) st = dt_recv(h, H_N, DT_I64, j, s->all);
    if (st == DT_OK && h[H_KIND] != M_HELLOED)
        st = dt_error(DT_ERR_COMM, "worker %d: restarted server %d sent %s, expected HELLOED", s->rank, j,
                      kind_name(h[H_KIND]));
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
// (server_back); a message sent first would wait for it for ever.
static dt_status back_if_lost(ps_worker *w, int j) { return server_lost(w, j) ? server_back(w, j) : DT_OK; }

// This step's pieces for server j again (blocking), to a restarted server.
static dt_status repush(ps_worker *w, int j) {
    w->err = DT_OK;
    for (int i = 0; i < w->np; i++)
        if (w->p[i].server == j) push(w, i);
    dt_status st = DT_OK;
    for (int i = 0; i < w->np; i++)
        if (w->p[i].server == j) {
            dt_status a = wait_all(&w->req[2 * i], 2);
            if (st == DT_OK) st = a;
        }
    if (w->err != DT_OK) return dt_error(w->err, "%s", w->errmsg);
    return st;
}

static void ps_fini(dt_strategy *s) {
    ps_worker *w = (ps_worker *)s;
    if (w->req) wait_all(w->req, 2 * w->np + 3 * w->S);
    // Done: the servers end when every worker said so. A broken world has
    // nobody to tell (the abort reaches the servers).
    if (w->slo && w->leader && !s->rejoin_done && dt_comm_get_async_error(s->all) == DT_OK)
        for (int j = 0; j < w->S; j++) {
            dt_status st = back_if_lost(w, j);
            int64_t h[H_N] = {M_END, w->step, w->ver[j], 0, 0, 0, 0, 0};
            if (st == DT_OK) st = dt_send(h, H_N, DT_I64, j, s->all);
            if (st != DT_OK && server_lost(w, j) && server_back(w, j) == DT_OK) {
                h[H_VERSION] = w->ver[j];
                st = dt_send(h, H_N, DT_I64, j, s->all);
            }
            if (st != DT_OK) break;
            if (j == 0 && w->S > 1) (void)dt_fault_at(s->rank, w->step, "ended");  // (a test's fault: kill)
        }
    dt_comm_destroy(w->group);
    dt_codec_free(w->codec);
    free(w->slo);
    free(w->ver);
    free(w->sinc);
    free(w->leaders);
    free(w->p);
    free(w->hdr);
    free(w->req);
    dt_free(w->acc);
}

static int ps_plan(dt_strategy *s, int first, int share, int global) {
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
static void push(ps_worker *w, int i) {
    dt_strategy *s = &w->base;
    piece *p = &w->p[i];
    if (!w->t_first) w->t_first = dt_now();
    if (server_lost(w, p->server)) return;  // restarted: its pieces go once it is back (ps_sync)
    int det = w->acc != NULL;
    // Compressed: the piece's message, made once a step (the same again
    // when a restarted server needs the step's pieces twice: repush).
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
    while (w->next < w->np && w->p[w->next].pos >= pos && w->err == DT_OK) push(w, w->next++);
}

static dt_grad_ready_fn ps_grad_hook(dt_strategy *s, int k, void **user) {
    *user = s;
    return !s->c->deterministic && !((ps_worker *)s)->group && k == s->nmicro - 1 ? ready : NULL;
}

// Deterministic: each shard's gradient on its own into the fixed-point sums.
static void ps_micro_end(dt_strategy *s, int k) {
    ps_worker *w = (ps_worker *)s;
    (void)k;
    if (!w->acc) return;
    dt_fixed_add(w->acc, s->grads, s->n, DT_FIXED_SCALE);
    memset(s->grads, 0, sizeof(float) * s->n);
}

static dt_status ps_sync(dt_strategy *s) {
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
    while (w->next < w->np && w->err == DT_OK) push(w, w->next++);
    st = wait_all(w->req, 2 * w->np);
    if (s->own_pace) {  // a server died (or was restarted before this step): its pieces again, once it is back
        int lost = 0;
        dt_status again = DT_OK;
        for (int j = 0; j < w->S && again == DT_OK; j++)
            if (server_lost(w, j)) {
                lost = 1;
                again = server_back(w, j);
                if (again == DT_OK) again = repush(w, j);
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

// Receives a header from server j and checks that it is the one expected.
static dt_status expect(ps_worker *w, int j, int64_t *h, int64_t kind) {
    dt_status st = dt_recv(h, H_N, DT_I64, j, w->base.all);
    if (st != DT_OK) return st;
    if (h[H_KIND] != kind || h[H_STEP] != w->step)
        return dt_error(DT_ERR_COMM, "worker %d: server %d sent %s for step %lld, expected %s for step %lld",
                        w->base.rank, j, kind_name(h[H_KIND]), (long long)h[H_STEP] + 1, kind_name(kind),
                        (long long)w->step + 1);
    return DT_OK;
}

// The global norm of the summed gradient, from server 0 (sync); apart from
// sync, the norm of this worker's own gradient, which is applied alone.
static dt_status ps_grad_norm(dt_strategy *s, double *norm) {
    ps_worker *w = (ps_worker *)s;
    if (s->c->ps_mode != MODE_SYNC) return dt_strategy_norm_replicated(s, norm);
    int64_t h[H_N] = {0};
    dt_status st = w->leader ? expect(w, 0, h, M_NORM) : DT_OK;
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
    c[H_C] = (int64_t)dt_comm_seq(w->base.comm);  // where this step stands among the workers' meetings (rejoin)
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
    dt_status st2 = wait_all(w->req + 2 * w->np + 2 * j, 2);
    if (st == DT_OK) st = st2;
    if (st == DT_OK && (h[H_KIND] != M_WEIGHTS || h[H_STEP] != w->step))
        st = dt_error(DT_ERR_COMM, "worker %d: server %d sent %s for step %lld, expected WEIGHTS for step %lld", s->rank,
                      j, kind_name(h[H_KIND]), (long long)h[H_STEP] + 1, (long long)w->step + 1);
    return st;
}

// COMMIT to every server, then the new weights of every range. The
// receives of the weights are posted before the commits go: a server that
// sends a worker its weights must not wait for that worker to get its
// commit into another server that waits for a third worker (the cycle of
// blocked sends a worker's one-at-a-time exchange made possible). Outside
// mode sync a server that died is waited for, and gets this step's pieces
// and COMMIT again.
static dt_status ps_update(dt_strategy *s, float lr, float scale) {
    ps_worker *w = (ps_worker *)s;
    int S = w->S;
    lr *= w->weight;
    int64_t(*h)[H_N] = w->hdr + w->np;  // S commits, then S replies
    dt_request_t *cr = w->req + 2 * w->np + 2 * S;  // the commits in flight
    dt_status st = DT_OK, *cst = calloc((size_t)S, sizeof *cst);
    if (!cst) return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    for (int j = 0; j < S && w->leader; j++)  // (a server restarted since the pushes: below)
        cst[j] = server_lost(w, j) ? DT_ERR_COMM : weights_post(w, j);
    for (int j = 0; j < S && w->leader; j++)
        if (cst[j] == DT_OK) cst[j] = commit_to(w, j, lr, scale, &cr[j]);
    for (int j = 0; j < S && w->leader; j++) {
        dt_status c = dt_wait(&cr[j]);
        if (cst[j] == DT_OK) cst[j] = c;
    }
    for (int j = 0; j < S && w->leader; j++) {
        dt_status sj = weights_wait(w, j, cst[j]);
        for (int t = 0; sj != DT_OK && t < 3 && server_lost(w, j); t++) {
            sj = server_back(w, j);
            if (sj == DT_OK) sj = repush(w, j);
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
// predecessor had made (skip_barriers, from rejoin), which the others are past.
static dt_status meet(ps_worker *w) {
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
static dt_status ps_params_sync(dt_strategy *s) {
    ps_worker *w = (ps_worker *)s;
    int ns = dt_optim_num_states(s->opt);
    dt_status st = meet(w);
    for (int j = 0; j < w->S && st == DT_OK && w->leader; j++) {
        size_t len = w->shi[j] - w->slo[j];
        for (int t = 0; t < 4; t++) {  // again after a server's restart (outside mode sync)
            if ((t > 0 && !server_lost(w, j)) || (st = back_if_lost(w, j)) != DT_OK) break;
            int64_t h[H_N] = {M_FETCH, w->step, w->ver[j], 0, 0, 0, 0, 0};
            st = dt_send(h, H_N, DT_I64, j, s->all);
            if (st == DT_OK) st = expect(w, j, h, M_STATES);
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
    if (st == DT_OK) st = meet(w);  // nobody steps on before all fetched
    return st == DT_OK ? DT_OK : dt_error(st, "weights and optimizer state from the servers: %s", dt_last_error());
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
// (rejoin_meet) and skips those barriers (meet): the replacement arrives
// at the one the others are in, or, past the meeting, at the next.
//
// Its predecessor may also have died at the very end, after it told some
// server that it was done (END) but not every one: a server that had the
// END says so in JOINED, and one that exited since had it too (a server
// ends once every worker did); the replacement then only tells the others
// (rejoin_done: the loop does nothing more).
static dt_status rejoin(ps_worker *w) {
    dt_strategy *s = &w->base;
    int *peers = malloc(sizeof(int) * (size_t)w->S), *gone = calloc((size_t)w->S, sizeof(int));
    dt_status st = peers && gone ? DT_OK : dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
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
    int64_t m = INT64_MAX, cseq = -1, h[H_N];
    int finished = -1;  // a server that had its predecessor's END
    for (int j = 0; j < w->S && st == DT_OK; j++) {
        if (gone[j]) {
            finished = j;
            continue;
        }
        int64_t q[H_N] = {M_JOIN, 0, 0, 0, 0, 0, 0, 0};
        st = dt_send(q, H_N, DT_I64, j, s->all);
        if (st == DT_OK) st = dt_recv(h, H_N, DT_I64, j, s->all);
        if (st == DT_OK && h[H_KIND] != M_JOINED)
            st = dt_error(DT_ERR_COMM, "worker %d, rejoining: server %d sent %s, expected JOINED", s->rank, j,
                          kind_name(h[H_KIND]));
        if (st == DT_OK && h[H_A]) finished = j;
        if (st == DT_OK && h[H_STEP] < m) {  // the count at the step's COMMIT, from a server at that step
            m = h[H_STEP];
            cseq = h[H_C];
        }
    }
    if (st == DT_OK && m == INT64_MAX)
        st = dt_error(DT_ERR_COMM, "worker %d, rejoining: no server knows the step its predecessor was at (each was "
                                   "restarted since)", s->rank);
    if (st == DT_OK && finished >= 0) {
        for (int j = 0; j < w->S && st == DT_OK; j++) {
            int64_t q[H_N] = {M_END, m, 0, 0, 0, 0, 0, 0};
            if (!gone[j]) st = dt_send(q, H_N, DT_I64, j, s->all);
        }
        free(gone);
        if (st != DT_OK) return dt_error(st, "worker %d, ending for its predecessor: %s", s->rank, dt_last_error());
        s->rejoin_done = 1;
        dt_log(DT_LOG_WARN, "worker %d (restarted, incarnation %d): its predecessor had finished (server %d had its "
                            "END); it only told the other servers",
               s->rank, dt_comm_incarnation(s->all), finished);
        return DT_OK;
    }
    free(gone);
    uint64_t made = dt_comm_seq(s->comm);
    if (st == DT_OK && cseq >= 0 && (uint64_t)cseq > made)
        st = dt_error(DT_ERR_COMM, "worker %d, rejoining: the servers say it had made %lld collectives with the other "
                      "workers at step %lld, its predecessor made %llu", s->rank, (long long)cseq, (long long)m,
                      (unsigned long long)made);
    for (int j = 0; j < w->S && st == DT_OK; j++) {
        int64_t q[H_N] = {M_RESUME, m, 0, 0, 0, 0, 0, cseq};
        st = dt_send(q, H_N, DT_I64, j, s->all);
        if (st == DT_OK) st = dt_recv(h, H_N, DT_I64, j, s->all);
        if (st == DT_OK && (h[H_KIND] != M_WEIGHTS || h[H_OFF] != (int64_t)w->slo[j] ||
                            h[H_COUNT] != (int64_t)(w->shi[j] - w->slo[j])))
            st = dt_error(DT_ERR_COMM, "worker %d, rejoining: server %d sent %s, expected the WEIGHTS of its range",
                          s->rank, j, kind_name(h[H_KIND]));
        if (st == DT_OK) st = dt_recv(s->params + w->slo[j], w->shi[j] - w->slo[j], DT_F32, j, s->all);
        if (st == DT_OK) w->ver[j] = h[H_VERSION];
        if (st == DT_OK && j == 0 && s->c->ps_share && h[H_B] >= 0) {  // dynamic sharing: where it goes on
            s->rejoin_pieces = 1;
            s->rejoin_epoch = h[H_B];
            s->unit = h[H_C];
        }
    }
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

// A worker's codec state, for its own file in the servers' checkpoint.
static int own_extra(void *user, dt_st_tensor *t, int max) { return dt_codec_state(user, t, max); }

// Outside mode sync the servers write the checkpoints (each its range as a
// shard; above): once the workers met (params_sync), worker 0 sends each
// server the loop's state (SAVE) and waits for its SAVED; the others wait
// for worker 0, so that no update comes between. With compression each
// worker first writes its codec state beside the shards (server 0
// completes the checkpoint once they are all there).
static dt_status ps_ckpt_save(dt_strategy *s, const dt_train_state *ts) {
    ps_worker *w = (ps_worker *)s;
    dt_status st = DT_OK;
    if (w->codec) {  // this worker's codec state beside the servers' shards, first (server 0 waits for it)
        dt_ckpt_model m = *s->ckpt_model;
        m.extra = own_extra;
        m.extra_user = w->codec;
        if ((st = dt_ckpt_write_own(s->ckpt_dir, &m, ts, s->rank, s->world)) != DT_OK)
            return dt_error(st, "worker %d, its codec state in the checkpoint of step %lld: %s", s->rank,
                            (long long)ts->step, dt_last_error());
    }
    int64_t v[TS_N];
    ts_pack(ts, v);
    // SAVE to all first (server 0 completes the checkpoint once every shard
    // is written), then each SAVED; a server that died gets SAVE again.
    dt_status *sent = calloc((size_t)w->S, sizeof *sent);
    if (!sent) return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    for (int j = 0; j < w->S && s->rank == 0; j++) {
        sent[j] = back_if_lost(w, j);
        int64_t h[H_N] = {M_SAVE, w->step, w->ver[j], 0, TS_N, 0, 0, 0};
        if (sent[j] == DT_OK) sent[j] = dt_send(h, H_N, DT_I64, j, s->all);
        if (sent[j] == DT_OK) sent[j] = dt_send(v, TS_N, DT_I64, j, s->all);
    }
    if ((st = dt_fault_at(s->rank, ts->step, "save")) != DT_OK) {  // (a test's fault inside the meeting)
        free(sent);
        return st;
    }
    for (int j = 0; j < w->S && st == DT_OK && s->rank == 0; j++) {
        int64_t h[H_N];
        st = sent[j] == DT_OK ? expect(w, j, h, M_SAVED) : sent[j];
        for (int t = 0; st != DT_OK && t < 3 && server_lost(w, j); t++) {
            int64_t q[H_N] = {M_SAVE, w->step, w->ver[j], 0, TS_N, 0, 0, 0};
            st = server_back(w, j);
            if (st == DT_OK) st = dt_send(q, H_N, DT_I64, j, s->all);
            if (st == DT_OK) st = dt_send(v, TS_N, DT_I64, j, s->all);
            if (st == DT_OK) st = expect(w, j, h, M_SAVED);
        }
    }
    free(sent);
    if (st != DT_OK) return dt_error(st, "checkpoint of step %lld by the servers: %s", (long long)ts->step, dt_last_error());
    return meet(w);
}

// Mode sync: the workers' checkpoints carry each worker's codec state (its
// error-feedback residuals), as data parallel's do. Outside it the servers
// write the checkpoints, and each worker its codec state beside them
// (ps_ckpt_save).
static int ps_ckpt_extra(dt_strategy *s, dt_st_tensor *t, int max) {
    ps_worker *w = (ps_worker *)s;
    return w->codec && !s->own_pace ? dt_codec_state(w->codec, t, max) : 0;
}

// At the start (fresh or resumed): worker 0 gives each server its range of
// the weights and the optimizer state, the loop's step, and as the
// version the optimizer's step count. A replacement rejoins instead.
static dt_status ps_ckpt_restore(dt_strategy *s, const char *path, int parts) {
    ps_worker *w = (ps_worker *)s;
    if (dt_comm_incarnation(s->all) > 0) return rejoin(w);
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
        if (st == DT_OK) st = send_desc(w, j);
    }
    return st == DT_OK ? DT_OK : dt_error(st, "starting the servers: %s", dt_last_error());
}

// ----------------------------------------------------------------------------
// the server's side


typedef struct {
    int64_t h[H_N];   // the header being received
    dt_request_t req; // its receive, NULL once the worker ended
    void *buf;        // this step's push: the range's gradient (int64 sums when deterministic)
    uint8_t *seen;    // elements of the range pushed this step
    size_t got;
    int64_t step;     // the worker's next step: the one its pushes are for
    int64_t sent;     // the version of the weights it was last sent
    int64_t arrived;  // when its push completed (backup: the first N - b of a step)
    int committed, held, ended;
    int finished;     // it said END: a replacement for it after that only ends (JOINED says so)
    int rank;         // in the world
    int dropped;      // its process died: 1 until the launcher restarts it, 2 until the replacement runs,
                      // 3 while it rejoins (JOIN, RESUME); 0: taking part
    int inc;          // the replacement's incarnation
    int nostep;       // this server (a replacement) never heard its step: it died before its HELLO
    double dead_at;
    int64_t stale;    // the staleness its last gradient was applied at (-1: dropped)
    int64_t unit;     // dynamic sharing: 1 + the piece its last COMMIT trained (0: none)
    int64_t doing;    // server 0: the piece it trains now (-1: none, its epoch's are all out)
    int64_t cseq;     // the workers' collectives its COMMIT says it had made (rejoin), and those of
    int64_t done_cseq;// its last step done with (before `step`; -1: none since the start)
    int save_owed;    // its SAVE's checkpoint is being written: SAVED (of save_step) once it is (saved)
    int64_t save_step;
    double lr, scale;
} peer;

typedef struct {
    const dt_config *c;
    dt_comm_t all, mine;
    int S, N, me;      // servers, workers (world ranks S..S+N-1), this server's index
    int mode;
    size_t n, lo, len;
    int det;
    float *params, *grad;
    uint8_t *msg;      // [compression]: a push's message, before it is decoded (msgcap bytes)
    size_t msgcap;
    dt_optim *opt;
    int64_t step, version, arrivals;
    peer *w;
    int reduced;       // sync: this step's pushes are summed and the norm sent
    int ended;         // workers that said END
    int64_t stats[ST_N];
    const char *run_dir;
    int64_t *ranks;    // the world ranks of its peers (INIT; NULL: every worker)
    model_desc desc;   // worker 0's DESC (checkpoints)
    dt_ckpt_model cm;  // this server's view for its writer
    dt_ckpt_writer *writer;
    int64_t saved_step; // the step of its last checkpoint (-1: none)
    int seeded;         // restarted alone with no checkpoint: its range from a worker's weights (restore)
    int64_t units;      // dynamic sharing: pieces an epoch (steps x workers; 0: fixed shares)
    int64_t next_unit;  // server 0: the next piece to hand out, numbered over the run
} server;

// A failure naming this server and the worker.
static dt_status refuse(server *sv, int wi, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static dt_status refuse(server *sv, int wi, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return dt_error(DT_ERR_COMM, "server %d: refused a push from worker %d at step %lld: %s", sv->me, wi,
                    (long long)sv->w[wi].step + 1, what);
}

static dt_status post_header(server *sv, int wi) {
    return dt_irecv(sv->w[wi].h, H_N, DT_I64, sv->w[wi].rank, sv->all, &sv->w[wi].req);
}

// A push from worker wi: checked, then its data into the worker's buffer.
static dt_status take_push(server *sv, int wi) {
    peer *p = &sv->w[wi];
    const int64_t *h = p->h;
    int64_t off = h[H_OFF], cnt = h[H_COUNT], lo = (int64_t)sv->lo, hi = (int64_t)(sv->lo + sv->len);
    if (h[H_STEP] != p->step) return refuse(sv, wi, "step %lld, expected step %lld", (long long)h[H_STEP] + 1,
                                            (long long)p->step + 1);
    if (h[H_VERSION] != p->sent)
        return refuse(sv, wi, "computed from weights version %lld, expected version %lld", (long long)h[H_VERSION],
                      (long long)p->sent);
    // fp32, int64 fixed point (deterministic), or with [compression] a
    // message of the method's (DT_U8, H_B bytes; small pieces go as fp32)
    int coded = sv->c->comp_method != DT_COMP_NONE && h[H_A] == DT_U8;
    if (h[H_A] != (sv->det ? DT_I64 : DT_F32) && !coded)
        return refuse(sv, wi, "element type %lld, expected %d%s", (long long)h[H_A], sv->det ? DT_I64 : DT_F32,
                      sv->c->comp_method != DT_COMP_NONE ? " or a compressed message" : "");
    if (cnt <= 0 || off < lo || off + cnt > hi)
        return refuse(sv, wi, "shape: elements [%lld, +%lld) outside this server's range", (long long)off,
                      (long long)cnt);
    if (memchr(p->seen + (off - lo), 1, (size_t)cnt))
        return refuse(sv, wi, "shape: elements [%lld, +%lld) pushed twice in one step", (long long)off,
                      (long long)cnt);
    size_t es = sv->det ? sizeof(int64_t) : sizeof(float);
    dt_status st;
    if (coded) {
        if (h[H_B] <= 0 || h[H_B] > 8 * cnt + 64)
            return refuse(sv, wi, "a compressed message of %lld bytes for %lld values", (long long)h[H_B],
                          (long long)cnt);
        size_t bytes = (size_t)h[H_B];
        if (bytes > sv->msgcap) {
            free(sv->msg);
            sv->msgcap = 0;
            if (!(sv->msg = malloc(bytes))) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
            sv->msgcap = bytes;
        }
        if ((st = dt_recv(sv->msg, bytes, DT_U8, sv->w[wi].rank, sv->all)) != DT_OK) return st;
        if (dt_codec_decode(sv->c, sv->msg, bytes, (size_t)cnt, (float *)p->buf + (off - lo)) != DT_OK)
            return refuse(sv, wi, "elements [%lld, +%lld): %s", (long long)off, (long long)cnt, dt_last_error());
    } else {
        st = dt_recv((char *)p->buf + (size_t)(off - lo) * es, (size_t)cnt, sv->det ? DT_I64 : DT_F32,
                     sv->w[wi].rank, sv->all);
        if (st != DT_OK) return st;
    }
    memset(p->seen + (off - lo), 1, (size_t)cnt);
    p->got += (size_t)cnt;
    return DT_OK;
}

// The newest weights, the optimizer state and the statistics.
static dt_status send_states(server *sv, int wi) {
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

static dt_status save(server *sv, int wi);
static dt_status survive(server *sv, int wi, dt_status st);
static dt_status make_writer(server *sv);
static dt_status hello(server *sv, int wi);

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

// One header from worker wi.
static dt_status handle(server *sv, int wi) {
    peer *p = &sv->w[wi];
    dt_status st = DT_OK;
    catch_up(sv, p);
    switch (p->h[H_KIND]) {
    case M_PUSH:
        if ((st = take_push(sv, wi)) == DT_OK && p->got == sv->len) p->arrived = ++sv->arrivals;
        break;
    case M_COMMIT:
        if (p->got != sv->len || (sv->mode == MODE_SYNC && !sv->reduced))
            return refuse(sv, wi, "COMMIT after %lld of the range's %lld gradients", (long long)p->got,
                          (long long)sv->len);
        p->committed = 1;
        p->lr = double_of(p->h[H_A]);
        p->scale = double_of(p->h[H_B]);
        p->cseq = p->h[H_C];
        if (p->h[H_OFF] > 0 && p->h[H_COUNT] > 0) take_unit(sv, p);
        break;
    case M_FETCH:
        st = send_states(sv, wi);
        break;
    case M_DESC: {  // the model, for checkpoints
        size_t len = (size_t)p->h[H_COUNT];
        if (p->h[H_COUNT] <= 0 || p->h[H_COUNT] > (16 << 20))
            return dt_error(DT_ERR_COMM, "server %d: DESC of %lld bytes from worker %d", sv->me,
                            (long long)p->h[H_COUNT], wi);
        char *text = malloc(len);
        if (!text) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
        st = dt_recv(text, len, DT_U8, p->rank, sv->all);
        if (st != DT_OK) {
            free(text);
            return st;
        }
        if ((st = desc_decode(&sv->desc, text, len, sv->me)) != DT_OK) return st;
        st = make_writer(sv);
        break;
    }
    case M_SAVE:
        st = save(sv, wi);
        break;
    case M_HELLO:  // a worker found this server restarted: it goes on from its step
        st = hello(sv, wi);
        break;
    case M_JOIN:  // a replacement: the step its predecessor was at
        if (p->dropped != 3)
            return dt_error(DT_ERR_COMM, "server %d: JOIN from worker %d, which did not die", sv->me, wi);
        {
            int64_t h[H_N] = {M_JOINED, p->nostep ? INT64_MAX : p->step, sv->version, 0, 0, p->finished, 0, p->done_cseq};
            st = dt_send(h, H_N, DT_I64, p->rank, sv->all);
        }
        break;
    case M_RESUME:  // ... going on from that step, with the newest weights
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
        {
            int64_t h[H_N] = {M_WEIGHTS, p->step - 1, sv->version, (int64_t)sv->lo, (int64_t)sv->len, 0, -1, -1};
            if (sv->me == 0) rejoin_piece(sv, p, &h[H_B], &h[H_C]);
            st = dt_send(h, H_N, DT_I64, p->rank, sv->all);
            if (st == DT_OK) st = dt_send(sv->params, sv->len, DT_F32, p->rank, sv->all);
            p->sent = sv->version;
        }
        break;
    case M_END:
        if (p->got)
            return dt_error(DT_ERR_COMM, "server %d: worker %d left in the middle of step %lld", sv->me, wi,
                            (long long)p->step + 1);
        p->ended = p->finished = 1;
        p->dropped = 0;  // (a replacement for one that had finished: it only ends)
        sv->ended++;
        return DT_OK;  // no further header from it
    default:
        return dt_error(DT_ERR_COMM, "server %d: a message of kind %lld (%s) from worker %d", sv->me,
                        (long long)p->h[H_KIND], kind_name(p->h[H_KIND]), wi);
    }
    return st == DT_OK ? post_header(sv, wi) : st;
}

// Sync: every worker's push is in: their sum (in worker order), the global
// norm over the servers, and server 0 tells the workers.
static dt_status reduce(server *sv) {
    size_t len = sv->len;
    if (sv->det) {
        int64_t *a = sv->w[0].buf;
        for (int wi = 1; wi < sv->N; wi++) {
            const int64_t *b = sv->w[wi].buf;
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < len; i++) a[i] += b[i];
        }
        dt_fixed_to_float(sv->grad, a, len);
    } else {
        memcpy(sv->grad, sv->w[0].buf, sizeof(float) * len);
        for (int wi = 1; wi < sv->N; wi++) {
            const float *b = sv->w[wi].buf;
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < len; i++) sv->grad[i] += b[i];
        }
    }
    double norm;
    dt_status st = dt_norm_sharded(sv->grad, sv->n, sv->lo, sv->lo + sv->len, sv->mine, &norm);
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

// The checkpoint writer of this server's shard, made when DESC arrives
// (before any save: server 0's removes what an earlier run left unfinished;
// a restarted server's leaves them: the save in flight may be among them).
static dt_status make_writer(server *sv) {
    if (sv->writer) return DT_OK;
    dt_status st;
    dt_ckpt_model *m = &sv->cm;
    memset(m, 0, sizeof *m);
    m->tensors = sv->desc.tensors;
    m->ntensors = sv->desc.ntensors;
    m->params = sv->params;
    m->nparams = sv->n;
    m->nstates = dt_optim_num_states(sv->opt);
    for (int k = 0; k < m->nstates && k < 2; k++) m->states[k] = dt_optim_state(sv->opt, k);
    m->opt_step = dt_optim_step_count(sv->opt);
    m->optimizer = sv->desc.optimizer;
    m->config = sv->desc.config;
    m->weights_meta = sv->desc.meta;
    m->nweights_meta = sv->desc.nmeta;
    m->params_lo = m->states_lo = sv->lo;
    m->params_hi = m->states_hi = sv->lo + sv->len;
    if ((st = (dt_comm_incarnation(sv->all) > 0 ? dt_ckpt_writer_rejoin : dt_ckpt_writer_create)(
             &sv->writer, sv->desc.dir, sv->c->ckpt_keep, m, sv->me, sv->S, 120)) != DT_OK)
        return dt_error(st, "server %d, its checkpoint writer: %s", sv->me, dt_last_error());
    // The workers' codec states, each in its own file (ps_ckpt_save).
    if (sv->c->comp_method != DT_COMP_NONE) dt_ckpt_writer_expect_own(sv->writer, sv->N);
    return DT_OK;
}

// SAVE from worker 0: this server's range into its shard of the
// checkpoint of the loop's state that follows (the writer snapshots it at
// once), then SAVED once the shard is durable (server 0: the checkpoint
// complete, every server's shard written), so that a server that dies
// after it has its shard on disk. The server serves on meanwhile (saved
// answers): worker 0 may die once it asked, before every server read its
// SAVE, and its replacement asks again. A SAVE of the step saved last is
// that (inside the meeting, where no update comes): nothing is written
// again.
static dt_status save(server *sv, int wi) {
    int64_t v[TS_N];
    peer *p = &sv->w[wi];
    dt_status st = dt_recv(v, TS_N, DT_I64, p->rank, sv->all);
    if (st != DT_OK) return st;
    if (!sv->writer) return dt_error(DT_ERR_COMM, "server %d: SAVE from worker %d before the model's DESC", sv->me, wi);
    dt_train_state ts = {0};
    ts_unpack(v, &ts);
    if (ts.step != sv->saved_step && (st = dt_ckpt_writer_save(sv->writer, &ts)) != DT_OK)
        return dt_error(st, "server %d, checkpoint of step %lld: %s", sv->me, (long long)ts.step, dt_last_error());
    sv->saved_step = ts.step;
    p->save_owed = 1;
    p->save_step = p->h[H_STEP];
    return DT_OK;
}

// The SAVED owed, once the checkpoint is written (*moved: some were sent).
static dt_status saved(server *sv, int *moved) {
    int owed = 0;
    for (int wi = 0; wi < sv->N; wi++) owed |= sv->w[wi].save_owed;
    if (!owed || !dt_ckpt_writer_idle(sv->writer)) return DT_OK;
    dt_status st = dt_ckpt_writer_wait(sv->writer);  // (at once: its status)
    if (st != DT_OK)
        return dt_error(st, "server %d, checkpoint of step %lld: %s", sv->me, (long long)sv->saved_step, dt_last_error());
    for (int wi = 0; wi < sv->N && st == DT_OK; wi++) {
        peer *p = &sv->w[wi];
        if (!p->save_owed) continue;
        p->save_owed = 0;
        *moved = 1;
        int64_t h[H_N] = {M_SAVED, p->save_step, sv->version, 0, 0, 0, 0, 0};
        st = survive(sv, wi, dt_send(h, H_N, DT_I64, p->rank, sv->all));
    }
    return st;
}

// Outside mode sync a worker's death does not stop the server: worker wi's
// process died (the launcher restarts it alone): what it had pushed of its
// step is forgotten and it leaves the staleness, ssp and backup
// bookkeeping until its replacement rejoins (tend).
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
static dt_status survive(server *sv, int wi, dt_status st) {
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
static dt_status tend(server *sv, int *moved) {
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
                dt_status st = post_header(sv, wi);
                if (st != DT_OK) return st;
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
            dt_status st = post_header(sv, wi);
            if (st != DT_OK) return st;
        } else if (p->dropped == 1 && dt_now() - p->dead_at > 60) {
            return dt_error(DT_ERR_COMM, "server %d: worker %d died %.0f s ago and was not restarted", sv->me, wi,
                            dt_now() - p->dead_at);
        }
    }
    return DT_OK;
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
    dt_status w = wait_all(r, 2 * sv->N);
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

// Async and ssp: worker wi's gradient on its own, on arrival, at the rate
// its staleness allows; ssp holds the reply of a worker too far ahead.
static dt_status apply_one(server *sv, int wi) {
    peer *p = &sv->w[wi];
    int64_t stale = sv->version - p->sent;
    float lr = (float)p->lr;
    if (sv->c->ps_staleness_lr && stale > 1) lr /= (float)stale;
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
        st = survive(sv, wi, reply(sv, wi));
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
            st = survive(sv, wi, reply(sv, wi));
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
    for (int k = 0; k < need; k++) {
        const peer *p = &sv->w[use[k]];
        const float *g = p->buf;
        float f = (float)(p->scale / need);
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
        st = survive(sv, use[k], reply(sv, use[k]));
    }
    free(use);
    dt_heartbeat(sv->step);
    *moved = 1;
    return st;
}

// The range's buffers, the peers and the optimizer, for sv->n, lo, len,
// step and version.
static dt_status setup(server *sv) {
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
    dt_status st = dt_optim_create_at(&sv->opt, &sv->c->optim, sv->len, NULL);
    if (st == DT_OK) *dt_optim_step_count(sv->opt) = sv->version;
    return st;
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
                        sv->me, kind_name(h[H_KIND]));
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
    if ((st = setup(sv)) != DT_OK) return st;
    if (h[H_A] != dt_optim_num_states(sv->opt))
        return dt_error(DT_ERR_COMM, "server %d: INIT brings %lld optimizer states, the optimizer has %d", sv->me,
                        (long long)h[H_A], dt_optim_num_states(sv->opt));
    st = dt_recv(sv->params, sv->len, DT_F32, w0, sv->all);
    for (int k = 0; k < dt_optim_num_states(sv->opt) && st == DT_OK; k++)
        st = dt_recv(dt_optim_state(sv->opt, k), sv->len, DT_F32, w0, sv->all);
    return st;
}

// A server restarted alone (outside mode sync): it knows its peers (every
// worker), lets each in as it finds the server back, and waits for their
// HELLOs; the first brings the model's description, with which it takes
// its range from the newest checkpoint (restore).
static dt_status restart(server *sv) {
    if (!(sv->w = calloc((size_t)sv->N, sizeof *sv->w))) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    for (int wi = 0; wi < sv->N; wi++) {
        sv->w[wi].rank = sv->S + wi;
        sv->w[wi].dropped = 4;  // each lets it in, then says HELLO
        (void)dt_comm_peer_state(sv->all, sv->w[wi].rank, &sv->w[wi].inc);  // (a higher one later: it died)
    }
    return dt_comm_rejoin_peers(sv->all, NULL, 0);
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
    dt_status st = setup(sv);
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
        return DT_OK;
    }
    sv->version = *m.opt_step;
    sv->step = ts.step;
    dt_log(DT_LOG_WARN, "server %d (restarted, incarnation %d): its range [%zu, %zu) from %s (step %lld, version %lld)",
           sv->me, dt_comm_incarnation(sv->all), lo, hi, used, (long long)sv->step, (long long)sv->version);
    return DT_OK;
}

// HELLO from worker wi, which found this restarted server back: the step it
// is at, the model's description (DESC's text; none without a checkpoint
// directory) and its newest weights of the range; the first one restores
// the range (and makes the checkpoint writer), then each gets the version.
static dt_status hello(server *sv, int wi) {
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
        if (len) st = desc_decode(&sv->desc, text, (size_t)len, sv->me);
        text = NULL;
        if (st == DT_OK) st = restore(sv, (size_t)n, wi, &sv->seeded);
        if (st == DT_OK && len) st = make_writer(sv);
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
    desc_free(&sv->desc);
    free(sv->ranks);
    free(sv->msg);
    free(sv->w);
    dt_free(sv->params);
    dt_free(sv->grad);
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
static dt_status ps_serve(const dt_config *c, dt_comm_t all, dt_comm_t mine, const char *run_dir) {
    server sv = {.c = c, .all = all, .mine = mine, .det = c->deterministic, .mode = c->ps_mode, .run_dir = run_dir,
                 .saved_step = -1};
    sv.S = dt_comm_size(mine);
    sv.me = dt_comm_rank(mine);
    sv.N = dt_comm_size(all) - sv.S;  // its peers: the workers (INIT says the groups' leaders in mode sync)
    if (sv.mode != MODE_SYNC) dt_comm_set_peer_faults(all, 1);  // a worker's death is not the server's
    int again = dt_comm_incarnation(all) > 0;  // restarted alone (outside mode sync)
    dt_status st = again ? restart(&sv) : start(&sv);
    if (st == DT_OK && sv.me == 0 && !again)
        dt_log(DT_LOG_INFO, "server 0 of %d: %zu of %zu parameters, %d %s, mode %s%s", sv.S, sv.len, sv.n, sv.N,
               sv.N < dt_comm_size(all) - sv.S ? "groups' leaders" : "workers",
               mode_names[sv.mode], sv.det ? ", deterministic" : "");
    for (int wi = 0; wi < sv.N && st == DT_OK && !again; wi++) st = post_header(&sv, wi);
    int idle = 0;
    double beat = dt_now();
    int64_t at = sv.step;
    while (st == DT_OK && sv.ended < sv.N) {
        int moved = 0;
        if (sv.mode != MODE_SYNC) st = tend(&sv, &moved);
        for (int wi = 0; wi < sv.N && st == DT_OK; wi++) {
            int done = 0;
            if (!sv.w[wi].req) continue;
            st = survive(&sv, wi, dt_test(&sv.w[wi].req, &done));
            if (st != DT_OK || !done || sv.w[wi].dropped == 1) continue;
            moved = 1;
            st = survive(&sv, wi, handle(&sv, wi));
        }
        if (st == DT_OK) st = advance(&sv, &moved);
        if (st == DT_OK && sv.writer) st = saved(&sv, &moved);
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

// summary.json's "ps" object: the mode and server 0's statistics.
static void ps_summary(dt_strategy *s, struct cJSON *o) {
    ps_worker *w = (ps_worker *)s;
    const int64_t *t = w->stats;
    cJSON *ps = cJSON_AddObjectToObject(o, "ps");
    cJSON_AddStringToObject(ps, "mode", mode_names[s->c->ps_mode]);
    cJSON_AddNumberToObject(ps, "servers", w->S);
    cJSON_AddNumberToObject(ps, "groups", w->group ? w->G : 0);
    cJSON_AddNumberToObject(ps, "applied", (double)t[ST_APPLIED]);
    cJSON_AddNumberToObject(ps, "dropped", (double)t[ST_DROPPED]);
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
    .serve = ps_serve,
    .summary = ps_summary,
};
