/* The servers' checkpoints outside mode sync (ps.c has the overview):
 * the model's description they are written with (DESC), the loop's state
 * of a save (SAVE), the workers' side of both, and a server's writer of
 * its shard. */
#include "engine/strategies/ps/ps_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void ps_desc_free(model_desc *d) {
    free(d->text);
    free(d->tensors);
    free(d->meta);
    memset(d, 0, sizeof *d);
}

// Parses text (len bytes, taken over) into d; a line that does not parse
// fails, naming it.
dt_status ps_desc_decode(model_desc *d, char *text, size_t len, int me) {
    ps_desc_free(d);
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
// the workers' side

// What the servers' checkpoints say about the model (DESC's text; *len 0
// and NULL without a checkpoint directory).
dt_status ps_desc_of(ps_worker *w, char **b, size_t *len) {
    dt_strategy *s = &w->base;
    *b = NULL;
    *len = 0;
    if (!s->ckpt_saves || !s->ckpt_model || !s->ckpt_dir || !s->ckpt_dir[0]) return DT_OK;
    if (!(*b = desc_encode(s->ckpt_model, s->ckpt_dir, len))) return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    return DT_OK;
}

// Worker 0 tells server j what its checkpoints say about the model (DESC).
dt_status ps_send_desc(ps_worker *w, int j) {
    dt_strategy *s = &w->base;
    size_t len;
    char *b;
    dt_status st = s->rank == 0 ? ps_desc_of(w, &b, &len) : DT_OK;
    if (s->rank != 0 || st != DT_OK || !b) return st;
    int64_t h[H_N] = {M_DESC, w->step, w->ver[j], 0, (int64_t)len, 0, 0, 0};
    st = dt_send(h, H_N, DT_I64, j, s->all);
    if (st == DT_OK) st = dt_send(b, len, DT_U8, j, s->all);
    free(b);
    return st;
}

// A worker's codec state, for its own file in the servers' checkpoint.
static int own_extra(void *user, dt_st_tensor *t, int max) { return dt_codec_state(user, t, max); }

// Outside mode sync the servers write the checkpoints (each its range as a
// shard; above): once the workers met (params_sync), worker 0 sends each
// server the loop's state (SAVE) and waits for its SAVED; the others wait
// for worker 0, so that no update comes between. With compression each
// worker first writes its codec state beside the shards (server 0
// completes the checkpoint once they are all there).
// (In object storage a server's writer gives up a shard it cannot upload,
// and a worker its codec state's file: lost says so, and server 0 gives the
// checkpoint up, told by the file's .lost marker; the run goes on.)
dt_status ps_ckpt_save(dt_strategy *s, const dt_train_state *ts, char *lost, size_t n) {
    ps_worker *w = (ps_worker *)s;
    dt_status st = DT_OK;
    if (w->codec) {  // this worker's codec state beside the servers' shards, first (server 0 waits for it)
        dt_ckpt_model m = *s->ckpt_model;
        m.extra = own_extra;
        m.extra_user = w->codec;
        st = dt_ckpt_write_own(s->ckpt_dir, &m, ts, s->rank, s->world);
        if (st != DT_OK && !dt_ckpt_give_up(s->ckpt_dir, st, ts->step, lost, n))
            return dt_error(st, "worker %d, its codec state in the checkpoint of step %lld: %s", s->rank,
                            (long long)ts->step, dt_last_error());
        st = DT_OK;
    }
    int64_t v[TS_N];
    ts_pack(ts, v);
    // SAVE to all first (server 0 completes the checkpoint once every shard
    // is written), then each SAVED; a server that died gets SAVE again.
    dt_status *sent = calloc((size_t)w->S, sizeof *sent);
    if (!sent) return dt_error(DT_ERR_NOMEM, "strategy ps: out of memory");
    for (int j = 0; j < w->S && s->rank == 0; j++) {
        sent[j] = ps_back_if_lost(w, j);
        int64_t h[H_N] = {M_SAVE, w->step, w->ver[j], 0, TS_N, 0, 0, 0};
        if (sent[j] == DT_OK) sent[j] = dt_send(h, H_N, DT_I64, j, s->all);
        if (sent[j] == DT_OK) sent[j] = dt_send(v, TS_N, DT_I64, j, s->all);
    }
    if ((st = dt_fault_at(s->rank, ts->step, "save")) != DT_OK) {  // (a test's fault inside the meeting)
        free(sent);
        return st;
    }
    // SAVED from server 0 last: it completes the checkpoint once every
    // other shard is durable, so its answer waits for theirs. A server
    // that died with the SAVE unwritten gets it again (ps_server_back)
    // while worker 0 waits for that server itself, never for server 0
    // behind it (which waited for the shard of a replacement that nobody
    // told to write it).
    for (int k = 1; k <= w->S && st == DT_OK && s->rank == 0; k++) {
        int j = k % w->S;
        int64_t h[H_N];
        st = sent[j] == DT_OK ? ps_expect(w, j, h, M_SAVED) : sent[j];
        for (int t = 0; st != DT_OK && t < 3 && ps_server_lost(w, j); t++) {
            int64_t q[H_N] = {M_SAVE, w->step, w->ver[j], 0, TS_N, 0, 0, 0};
            st = ps_server_back(w, j);
            if (st == DT_OK) st = dt_send(q, H_N, DT_I64, j, s->all);
            if (st == DT_OK) st = dt_send(v, TS_N, DT_I64, j, s->all);
            if (st == DT_OK) st = ps_expect(w, j, h, M_SAVED);
        }
    }
    free(sent);
    if (st != DT_OK) return dt_error(st, "checkpoint of step %lld by the servers: %s", (long long)ts->step, dt_last_error());
    return ps_meet(w);
}

// Mode sync: the workers' checkpoints carry each worker's codec state (its
// error-feedback residuals), as data parallel's do. Outside it the servers
// write the checkpoints, and each worker its codec state beside them
// (ps_ckpt_save).
int ps_ckpt_extra(dt_strategy *s, dt_st_tensor *t, int max) {
    ps_worker *w = (ps_worker *)s;
    return w->codec && !s->own_pace ? dt_codec_state(w->codec, t, max) : 0;
}

// ----------------------------------------------------------------------------
// the server's side

// DESC from worker wi: what the checkpoints say about the model, kept
// (the writer points into it), then the writer.
dt_status ps_take_desc(server *sv, int wi) {
    peer *p = &sv->w[wi];
    size_t len = (size_t)p->h[H_COUNT];
    if (p->h[H_COUNT] <= 0 || p->h[H_COUNT] > (16 << 20))
        return dt_error(DT_ERR_COMM, "server %d: DESC of %lld bytes from worker %d", sv->me,
                        (long long)p->h[H_COUNT], wi);
    char *text = malloc(len);
    if (!text) return dt_error(DT_ERR_NOMEM, "server %d: out of memory", sv->me);
    dt_status st = dt_recv(text, len, DT_U8, p->rank, sv->all);
    if (st != DT_OK) {
        free(text);
        return st;
    }
    if ((st = ps_desc_decode(&sv->desc, text, len, sv->me)) != DT_OK) return st;
    return ps_make_writer(sv);
}

// The checkpoint writer of this server's shard, made when DESC arrives
// (before any save: server 0's removes what an earlier run left unfinished;
// a restarted server's leaves them: the save in flight may be among them).
dt_status ps_make_writer(server *sv) {
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
    if (ps_has_tables(sv->c)) {  // its shard of the recommender's tables (rows.c), written from the live rows:
        m->extra = ps_tables_extra;  // nothing changes them before SAVED (the workers wait for it)
        m->extra_user = sv;
        m->extra_stable = 1;
    }
    if ((st = (dt_comm_incarnation(sv->all) > 0 ? dt_ckpt_writer_rejoin : dt_ckpt_writer_create)(
             &sv->writer, sv->desc.dir, sv->c->ckpt_keep, m, sv->me, sv->S, ps_timeout(sv->all))) != DT_OK)
        return dt_error(st, "server %d, its checkpoint writer: %s", sv->me, dt_last_error());
    // The workers' codec states, each in its own file (ps_ckpt_save).
    if (sv->c->comp_method != DT_COMP_NONE) dt_ckpt_writer_expect_own(sv->writer, sv->N);
    return DT_OK;
}

// SAVE from worker 0: this server's range into its shard of the
// checkpoint of the loop's state that follows (the writer snapshots it at
// once), then SAVED once the shard is durable (server 0: the checkpoint
// complete, every server's shard written), so that a server that dies
// after it has its shard on disk. The server serves on meanwhile (ps_saved
// answers): worker 0 may die once it asked, before every server read its
// SAVE, and its replacement asks again. A SAVE of the step saved last is
// that (inside the meeting, where no update comes): nothing is written
// again.
dt_status ps_save(server *sv, int wi) {
    int64_t v[TS_N];
    peer *p = &sv->w[wi];
    dt_status st = dt_recv(v, TS_N, DT_I64, p->rank, sv->all);
    if (st != DT_OK) return st;
    if (!sv->writer) return dt_error(DT_ERR_COMM, "server %d: SAVE from worker %d before the model's DESC", sv->me, wi);
    dt_train_state ts = {0};
    ts_unpack(v, &ts);
    // (a test's fault: server j, rank -1 - j, once it has a SAVE, before it writes)
    if ((st = dt_fault_at(-1 - sv->me, ts.step, "save")) != DT_OK) return st;
    if (ts.step != sv->saved_step && (st = dt_ckpt_writer_save(sv->writer, &ts)) != DT_OK)
        return dt_error(st, "server %d, checkpoint of step %lld: %s", sv->me, (long long)ts.step, dt_last_error());
    sv->saved_step = ts.step;
    p->save_owed = 1;
    p->save_step = p->h[H_STEP];
    return DT_OK;
}

// The SAVED owed, once the checkpoint is written (*moved: some were sent).
dt_status ps_saved(server *sv, int *moved) {
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
        st = ps_survive(sv, wi, dt_send(h, H_N, DT_I64, p->rank, sv->all));
    }
    return st;
}
