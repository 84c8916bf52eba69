#include "engine/checkpoints.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The training state as int64s, for a broadcast.
enum { S_STEP, S_EPOCH, S_BATCH, S_ESTEPS, S_LOSS, S_RNG, S_WORLD = S_RNG + 4, S_FOUND, S_OPT, S_PARTS, S_LAST, S_SCALE,
       S_CLEAN, S_SKIPPED, S_N };

static void pack_state(int64_t *v, const dt_train_state *s, int64_t opt_step) {
    v[S_STEP] = s->step;
    v[S_EPOCH] = s->epoch;
    v[S_BATCH] = s->epoch_batch;
    v[S_ESTEPS] = s->epoch_steps;
    memcpy(&v[S_LOSS], &s->epoch_loss, sizeof(double));
    memcpy(&v[S_RNG], s->rng.s, sizeof s->rng.s);
    v[S_WORLD] = s->world;
    v[S_OPT] = opt_step;
    memcpy(&v[S_SCALE], &s->loss_scale, sizeof(float));
    v[S_CLEAN] = s->scale_clean;
    v[S_SKIPPED] = s->scale_skipped;
}

static void unpack_state(const int64_t *v, dt_train_state *s, int64_t *opt_step) {
    s->step = v[S_STEP];
    s->epoch = v[S_EPOCH];
    s->epoch_batch = v[S_BATCH];
    s->epoch_steps = v[S_ESTEPS];
    memcpy(&s->epoch_loss, &v[S_LOSS], sizeof(double));
    memcpy(s->rng.s, &v[S_RNG], sizeof s->rng.s);
    s->world = (int)v[S_WORLD];
    *opt_step = v[S_OPT];
    memcpy(&s->loss_scale, &v[S_SCALE], sizeof(float));
    s->scale_clean = v[S_CLEAN];
    s->scale_skipped = v[S_SKIPPED];
}

// The replicated blocks (parameters, optimizer state) from rank `root` to all.
static dt_status broadcast_blocks(dt_run_ckpt *r, int root) {
    dt_status st = dt_broadcast(r->model.params, r->model.params, r->model.nparams, DT_F32, root, r->comm);
    for (int j = 0; j < r->model.nstates && st == DT_OK; j++)
        st = dt_broadcast(r->model.states[j], r->model.states[j], r->model.nparams, DT_F32, root, r->comm);
    return st;
}

// Whether this rank holds a slice of the state rather than all of it (a
// sharded strategy's view, ckpt.h).
static int sliced(const dt_ckpt_model *m) {
    return (m->params_hi && (m->params_lo || m->params_hi != m->nparams)) ||
           (m->states_hi && (m->states_lo || m->states_hi != m->nparams));
}

// Rank 0's resume to every rank: the training state and the path rank 0
// chose (used[n]) with the number of ranks that wrote it (*parts); then,
// when the state is replicated, the buffers themselves; when it is sharded,
// every other rank reads its own slice from that path.
static dt_status broadcast_state(dt_run_ckpt *r, dt_train_state *s, int *found, int *parts, char *used, size_t n) {
    int64_t v[S_N] = {0};
    pack_state(v, s, *r->model.opt_step);
    v[S_FOUND] = *found;
    v[S_PARTS] = *parts;
    dt_status st = dt_broadcast(v, v, S_N, DT_I64, 0, r->comm);
    if (st != DT_OK) return st;
    unpack_state(v, s, r->model.opt_step);
    *found = (int)v[S_FOUND];
    *parts = (int)v[S_PARTS];
    if (!*found) return DT_OK;
    if ((st = dt_broadcast(used, used, n, DT_U8, 0, r->comm)) != DT_OK) return st;
    used[n - 1] = 0;
    if (sliced(&r->model)) {
        if (dt_comm_rank(r->comm) == 0 || r->model.state_only) return DT_OK;  // (state_only: the strategy reads it)
        dt_train_state mine;
        dt_ckpt_model m = r->model;
        m.verified = 1;  // (rank 0 verified the checkpoint it chose: each rank reads its slice alone)
        if ((st = dt_ckpt_read(used, &m, &mine)) != DT_OK)
            return dt_error(st, "rank %d, reading its slice of %s: %s", dt_comm_rank(r->comm), used, dt_last_error());
        return DT_OK;
    }
    return broadcast_blocks(r, 0);
}

static dt_status make_writer(dt_run_ckpt *r);

// The "key = value" lines of a config as dt_config_format writes it, named
// "section.key" (a repeated key's values joined: a model's layer lines).
typedef struct {
    char name[96], value[1024];
} config_line;

static int config_lines(const char *text, config_line *out, int max) {
    char sec[64] = "";
    int n = 0;
    for (const char *p = text; p && *p && n < max;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char line[1200];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), p);
        char *eq = strstr(line, " = ");
        if (line[0] == '[') sscanf(line, "[%63[^]]", sec);
        else if (eq && line[0] != ';') {
            *eq = 0;
            char name[96];
            snprintf(name, sizeof name, "%s.%.80s", sec, line);
            if (n && !strcmp(out[n - 1].name, name))
                snprintf(out[n - 1].value + strlen(out[n - 1].value), sizeof out[n - 1].value - strlen(out[n - 1].value),
                         "; %s", eq + 3);
            else snprintf(out[n].name, sizeof out[n].name, "%s", name), snprintf(out[n++].value, sizeof out[0].value, "%s", eq + 3);
        }
        p = e ? e + 1 : NULL;
    }
    return n;
}

// Changes that make a resumed run another one: the model's, or its data.
static int changes_the_run(const char *name) {
    static const char *const data[] = {"data.dataset", "data.dir", "data.file", "data.train_file", "data.val_file",
                                       "data.train_images", "data.train_labels", "data.test_images", "data.test_labels"};
    if (!strncmp(name, "model.", 6)) return 1;
    for (size_t i = 0; i < sizeof data / sizeof *data; i++)
        if (!strcmp(name, data[i])) return 1;
    return 0;
}

// The value of key `name` among lines l[n], or NULL.
static const char *config_value(const config_line *l, int n, const char *name) {
    for (int k = 0; k < n; k++)
        if (!strcmp(l[k].name, name)) return l[k].value;
    return NULL;
}

// A resumed checkpoint written with another config (dt_ckpt_model's
// config_check): which keys differ, old -> new (a key one side lacks has
// its default there: the other version of dtrain did not write it); a
// change of the model or of the data is refused unless [checkpoint]
// allow_changes says so.
static dt_status config_changes(void *user, const char *path, const char *stored) {
    dt_run_ckpt *r = user;
    enum { MAXL = 400 };
    dt_config def;
    dt_config_defaults(&def);
    char *deftext = dt_config_format(&def);
    config_line *a = deftext ? calloc(3 * MAXL, sizeof *a) : NULL, *b = a ? a + MAXL : NULL, *d = a ? a + 2 * MAXL : NULL;
    if (!a) return free(deftext), dt_error(DT_ERR_NOMEM, "out of memory");
    int na = config_lines(stored, a, MAXL), nb = config_lines(r->config_text, b, MAXL), nd = config_lines(deftext, d, MAXL);
    int serious = 0, shown = 0, more = 0;
    free(deftext);
    char list[2048] = "";
    for (int i = 0; i < na + nb; i++) {  // (a's keys, then b's that a lacks)
        const config_line *x = i < na ? &a[i] : &b[i - na];
        if (i >= na && config_value(a, na, x->name)) continue;
        const char *ov = i < na ? x->value : config_value(d, nd, x->name), *nv = config_value(b, nb, x->name);
        if (!nv) nv = config_value(d, nd, x->name);
        if (!ov) ov = "(none)";
        if (!nv) nv = "(none)";
        if (!strcmp(ov, nv) || !strncmp(x->name, "checkpoint.", 11) || !strncmp(x->name, "s3.", 3))
            continue;  // (how it saves: not the run)
        serious |= changes_the_run(x->name);
        size_t l = strlen(list);
        if (shown < 8 && l < sizeof list - 200)
            snprintf(list + l, sizeof list - l, "%s%s: %.60s -> %.60s", shown ? ", " : "", x->name, ov, nv), shown++;
        else more++;
    }
    free(a);
    char tail[48] = "";
    if (more) snprintf(tail, sizeof tail, " and %d more", more);
    if (serious && !r->c->ckpt_allow_changes)
        return dt_error(DT_ERR_CONFIG, "%s: written with another model or data (%s%s): resuming it would go on with another "
                        "run; set [checkpoint] allow_changes = true to resume it all the same", path, list, tail);
    dt_log(DT_LOG_WARN, "%s: written with another config; going on with this one: %s%s", path, list, tail);
    return DT_OK;
}

// A rank that joined (a spare) starts its writer once it has the state,
// where the loop's writer saves at all.
static dt_status joined_writer(dt_run_ckpt *r) {
    if (!r->dir[0] || r->writer || r->save || (r->c->ckpt_every_steps <= 0 && r->c->ckpt_every_seconds <= 0))
        return DT_OK;
    return make_writer(r);
}

dt_status dt_run_ckpt_share(dt_run_ckpt *r, dt_train_state *s, int have, int *from) {
    int W = dt_comm_size(r->comm), rank = dt_comm_rank(r->comm);
    *from = -1;
    if (r->model.extra)
        return dt_error(DT_ERR_INTERNAL, "sharing the state: rank %d holds state of its own", rank);
    int slices = sliced(&r->model);  // each rank's own, or its buddy's copy (the strategy's take_over)
    if (have && r->writer) dt_ckpt_writer_abandon(r->writer);
    // The replica furthest along (the lowest rank of those) gives its state:
    // a rank whose step ended before the failure is ahead of one whose did not.
    int64_t *steps = malloc((size_t)W * sizeof *steps), mine = have ? s->step : -1;
    if (!steps) return dt_error(DT_ERR_NOMEM, "out of memory");
    dt_status st = dt_allgather(&mine, steps, 1, DT_I64, r->comm);
    int root = -1;
    for (int q = 0; q < W && st == DT_OK; q++)
        if (steps[q] >= 0 && (root < 0 || steps[q] > steps[root])) root = q;
    free(steps);
    if (st != DT_OK) return st;
    if (root < 0) return dt_error(DT_ERR_INTERNAL, "sharing the state: no rank holds it");
    int64_t v[S_N] = {0};
    pack_state(v, s, slices ? r->state_opt : *r->model.opt_step);
    v[S_LAST] = r->last_step;
    if ((st = dt_broadcast(v, v, S_N, DT_I64, root, r->comm)) != DT_OK) return st;
    if (rank != root) {
        unpack_state(v, s, r->model.opt_step);
        r->last_step = v[S_LAST];  // the next save at the same step everywhere
    }
    s->world = W;
    *from = root;
    if ((st = joined_writer(r)) != DT_OK) return st;
    if (slices) {
        *r->model.opt_step = v[S_OPT];
        r->state_opt = v[S_OPT];
        return DT_OK;
    }
    return broadcast_blocks(r, root);
}

// Before any step with no checkpoint yet: the start's training state and
// replicated blocks from rank `root`, which has them (a spare has made its
// own), as a share from a replica does.
static dt_status start_state(dt_run_ckpt *r, dt_train_state *s, int root) {
    if (root < 0 || root >= dt_comm_size(r->comm))
        return dt_error(DT_ERR_INTERNAL, "going back to the start: no rank holds its state");
    int64_t v[S_N] = {0};
    pack_state(v, s, *r->model.opt_step);
    dt_status st = dt_broadcast(v, v, S_N, DT_I64, root, r->comm);
    if (st != DT_OK) return st;
    unpack_state(v, s, r->model.opt_step);
    return sliced(&r->model) ? DT_OK : broadcast_blocks(r, root);  // (slices: each rank's own, seeded)
}

dt_status dt_run_ckpt_rollback(dt_run_ckpt *r, dt_train_state *s, int have, int begun) {
    int found = 0, parts = 1;
    char used[4200] = "";
    if (have && r->writer) dt_ckpt_writer_abandon(r->writer);
    // Whether any rank has begun a step, and the lowest rank with state (W -
    // rank at most); also the barrier: every rank's write in flight is over
    // before rank 0 looks.
    int W = dt_comm_size(r->comm), rank = dt_comm_rank(r->comm);
    int64_t most[2] = {begun || (have && s->step > 0), have ? W - rank : 0};
    dt_status st = dt_allreduce(most, most, 2, DT_I64, DT_MAX, r->comm);
    dt_train_state mine = *s;  // (the start's, where the rollback goes back to it)
    int64_t opt_mine = *r->model.opt_step;
    if (st == DT_OK && rank == 0) {
        st = r->dir[0] ? dt_ckpt_load_newest(r->dir, &r->model, s, &found, used, sizeof used) : DT_OK;
        if (st == DT_OK && !found && most[0])
            st = dt_error(DT_ERR_IO, "going back to the newest checkpoint: there is none yet in %s",
                          r->dir[0] ? r->dir : "(no run directory)");
        if (st == DT_OK && found) st = dt_ckpt_open_part(used, -1, NULL, &parts);
        s->world = dt_comm_size(r->comm);
    }
    // (a failure on rank 0 reaches the others through the abort that follows)
    if (st == DT_OK) st = broadcast_state(r, s, &found, &parts, used, sizeof used);
    if (st == DT_OK && !found) {  // (broadcast_state gave rank 0's, perhaps a spare's: the holder's instead)
        *s = mine, *r->model.opt_step = opt_mine;
        st = start_state(r, s, W - (int)most[1]);
    }
    if (st != DT_OK) return st;
    snprintf(r->from, sizeof r->from, "%s", used);
    r->from_parts = parts;
    r->last_step = s->step;
    r->state_opt = *r->model.opt_step;
    return joined_writer(r);
}

// A resumed checkpoint's state beyond the model that this run does not keep
// (its ranks' extra tensors: a compressed run's codec state, resumed
// without compression or on one worker) is left where it is, said once.
// (The recommender's tables, "tables.*", are read by the ranks that hold
// them: engine/tables.h.)
static dt_status note_unused(const char *path) {
    dt_st_file *f;
    dt_status st = dt_ckpt_open_chosen(path, 0, &f);  // (verified as it was chosen)
    if (st != DT_OK) return st;
    char names[200] = "";
    int n = 0;
    for (int i = 0; i < dt_st_count(f); i++) {
        const char *nm = dt_st_get(f, i)->name;
        if (!strcmp(nm, "params") || !strncmp(nm, "optimizer.", 10) || !strncmp(nm, "tables.", 7)) continue;
        size_t l = strlen(names);
        if (n++ < 3) snprintf(names + l, sizeof names - l, "%s%s", l ? ", " : "", nm);
    }
    if (n)
        dt_log(DT_LOG_WARN, "%s: holds state this run does not keep (%s%s): ignored", path, names,
               n > 3 ? ", ..." : "");
    dt_st_close(f);
    return DT_OK;
}

// Rank 0's writer, or every rank's when checkpoints are sharded. A
// restarted process's writer leaves the directory as it is (rejoin): a
// checkpoint its predecessor's save began may still be being completed by
// the others (a parameter server's), and only a run's first start clears
// unfinished ones.
static dt_status make_writer(dt_run_ckpt *r) {
    if (r->world == 1 && r->rank != 0) return DT_OK;
    return (dt_comm_incarnation(r->comm) > 0 ? dt_ckpt_writer_rejoin : dt_ckpt_writer_create)(
        &r->writer, r->dir, r->c->ckpt_keep, &r->model, r->world > 1 ? r->rank : 0, r->world, 300);
}

dt_status dt_run_ckpt_begin(dt_run_ckpt *r, const dt_config *c, const char *run_dir, dt_comm_t comm,
                            const dt_ckpt_model *m, dt_train_state *s) {
    memset(r, 0, sizeof *r);
    r->c = c;
    r->comm = comm;
    r->model = *m;
    int rank = dt_comm_rank(comm), W = dt_comm_size(comm);
    // The config without the fields that do not shape training (checkpoints,
    // resume, monitoring): changing them on resume is not a different run.
    dt_config plain = *c, d;
    dt_config_defaults(&d);
    memcpy(plain.resume, d.resume, sizeof d.resume);
    plain.ckpt_every_steps = d.ckpt_every_steps;
    plain.ckpt_every_seconds = d.ckpt_every_seconds;
    plain.ckpt_keep = d.ckpt_keep;
    plain.ckpt_sharded = d.ckpt_sharded;
    plain.ckpt_staging = d.ckpt_staging;
    plain.ckpt_allow_changes = d.ckpt_allow_changes;
    memcpy(plain.ckpt_dir, d.ckpt_dir, sizeof d.ckpt_dir);
    memcpy(plain.s3_endpoint, d.s3_endpoint, sizeof d.s3_endpoint);
    memcpy(plain.s3_region, d.s3_region, sizeof d.s3_region);
    plain.metrics_port = d.metrics_port;
    memcpy(plain.metrics_addr, d.metrics_addr, sizeof d.metrics_addr);
    memcpy(plain.trace, d.trace, sizeof d.trace);
    if (!(r->config_text = dt_config_format(&plain))) return dt_error(DT_ERR_NOMEM, "out of memory");
    r->model.config = r->config_text;
    r->model.config_check = config_changes;
    r->model.config_user = r;
    dt_rng rng = s->rng;  // the caller's fresh generator, kept unless resumed
    memset(s, 0, sizeof *s);
    s->rng = rng;
    s->world = W;
    char *dir = r->dir;
    dt_config_ckpt_dir(c, run_dir, r->dir, sizeof r->dir);

    dt_status st = DT_OK;
    int found = 0, parts = 1;
    char used[4200] = "";
    // A process that took a dead rank's place (dt_comm_generation > 0) gets
    // the state from a replica (dt_run_ckpt_share), not from a file.
    int joining = dt_comm_generation(comm) > 0;
    if (c->resume[0] && rank == 0 && !joining) {
        const char *from = !strcmp(c->resume, "auto") ? dir : c->resume;
        if (!*from) st = dt_error(DT_ERR_CONFIG, "[checkpoint] resume = auto needs a run directory");
        else st = dt_ckpt_load_newest(from, &r->model, s, &found, used, sizeof used);
        if (st == DT_OK && found)
            dt_log(DT_LOG_INFO, "resuming from %s: step %lld (epoch %lld, batch %lld), written by %d worker%s", used,
                   (long long)s->step, (long long)s->epoch + 1, (long long)s->epoch_batch, s->world,
                   s->world > 1 ? "s" : "");
        else if (st == DT_OK && from != dir)  // only auto may find none
            st = dt_error(DT_ERR_IO, "[checkpoint] resume: no checkpoint at %s (a file, or a directory holding step-N checkpoints)", from);
        else if (st == DT_OK)
            dt_log(DT_LOG_INFO, "no checkpoint in %s: starting from step 0", from);
        if (st == DT_OK && found && s->world != W)
            dt_log(DT_LOG_INFO, "resuming on %d worker%s (the checkpoint holds the whole state: any number can take it up)",
                   W, W > 1 ? "s" : "");
        if (st == DT_OK && found) st = dt_ckpt_open_part(used, -1, NULL, &parts);
        if (st == DT_OK && found && parts > 1 && !m->extra) st = note_unused(used);
        s->world = W;
    }
    // A failure on rank 0 reaches the others through the abort that follows.
    if (st == DT_OK && c->resume[0] && W > 1 && !joining) st = broadcast_state(r, s, &found, &parts, used, sizeof used);
    if (st != DT_OK) return st;
    if (found) snprintf(r->from, sizeof r->from, "%s", used);
    r->from_parts = parts;
    r->last_step = s->step;
    r->last_time = dt_now();
    r->rank = rank;
    // A rank that holds a slice, or state of its own, writes it: sharded
    // checkpoints, whatever [checkpoint] sharded says.
    r->world = c->ckpt_sharded || sliced(&r->model) || r->model.extra ? W : 1;
    r->state_opt = *r->model.opt_step;
    // a rank that joins starts its writer once it has the state (dt_run_ckpt_share)
    if (dir[0] && (c->ckpt_every_steps > 0 || c->ckpt_every_seconds > 0) && !joining) st = make_writer(r);
    return st;
}

int dt_run_ckpt_vote(const dt_run_ckpt *r) {
    return r->rank == 0 && r->c && r->c->ckpt_every_seconds > 0 &&
           dt_now() - r->last_time >= r->c->ckpt_every_seconds;
}

void dt_run_ckpt_set_saver(dt_run_ckpt *r, dt_status (*save)(void *user, const dt_train_state *s, char *lost, size_t n),
                           void *user) {
    if (r->writer) {
        dt_ckpt_writer_free(r->writer);
        r->writer = NULL;
    }
    r->save = save;
    r->save_user = user;
}

dt_status dt_run_ckpt_step(dt_run_ckpt *r, const dt_train_state *s, int end, int stop, int timed) {
    if (r->save) {  // as the writer: only with checkpoints on, or when stopping
        if (!dt_run_ckpt_due(r, s->step, end, stop, timed)) return DT_OK;
        r->last_step = s->step;
        r->last_time = dt_now();
        if (!r->dir[0] || !(stop || r->c->ckpt_every_steps > 0 || r->c->ckpt_every_seconds > 0)) return DT_OK;
        dt_obs_begin(r->obs, DT_OBS_CHECKPOINT);
        r->lost[0] = 0;
        dt_status st = r->save(r->save_user, s, r->lost, sizeof r->lost);
        dt_obs_end(r->obs, DT_OBS_CHECKPOINT);
        return st;
    }
    if (stop && !r->writer && r->dir[0]) {
        dt_status st = make_writer(r);
        if (st != DT_OK) return st;
    }
    if (!dt_run_ckpt_due(r, s->step, end, stop, timed)) return DT_OK;
    double now = dt_now();
    if (!r->writer) {  // ranks that write nothing keep the same count
        r->last_step = s->step;
        r->last_time = now;
        return DT_OK;
    }
    r->last_step = s->step;
    r->last_time = now;
    dt_obs_begin(r->obs, DT_OBS_CHECKPOINT);
    dt_status st = dt_ckpt_writer_save(r->writer, s);
    if (st == DT_OK && r->wait) st = dt_ckpt_writer_wait(r->writer);
    dt_obs_end(r->obs, DT_OBS_CHECKPOINT);
    return st;
}

dt_status dt_run_ckpt_end(dt_run_ckpt *r, dt_status st) {
    if (st == DT_OK && r->save && r->lost[0])  // (the run ended without its final checkpoint)
        st = dt_error(DT_ERR_IO, "the run's last %s", r->lost);
    if (r->writer) {
        // After a failure, no waiting for the other ranks' shards here: the
        // free finishes this rank's write (rank 0's lingers for the others').
        dt_status w = st == DT_OK ? dt_ckpt_writer_wait(r->writer) : DT_OK;
        int saves;
        double maxp, total, maxw;
        dt_ckpt_writer_stats(r->writer, &saves, &maxp, &total, &maxw);
        if (saves && r->wait)
            dt_log(DT_LOG_INFO, "%d checkpoint%s written from the live state, no snapshot: training waited for "
                                "each write, up to %.1f ms",
                   saves, saves > 1 ? "s" : "", maxw * 1e3);
        else if (saves)
            dt_log(DT_LOG_INFO, "%d checkpoint%s; training paused %.1f ms at most (%.1f ms in all) to snapshot "
                                "them, the writes took up to %.1f ms in the background",
                   saves, saves > 1 ? "s" : "", maxp * 1e3, total * 1e3, maxw * 1e3);
        char why[1024];
        if (st == DT_OK && w == DT_OK && dt_ckpt_writer_failed(r->writer, why, sizeof why))
            w = dt_error(DT_ERR_IO, "the run's last %s", why);  // (the run ended without its final checkpoint)
        if (st == DT_OK) st = w;
        dt_ckpt_writer_free(r->writer);
    }
    free(r->config_text);
    memset(r, 0, sizeof *r);
    return st;
}

// ----------------------------------------------------------------------------
// weights files from pieces held across ranks

#define WEIGHTS_PIECE ((size_t)4 << 20)  // floats

dt_status dt_run_weights_write(const char *path, const dt_tensor_info *tensors, int n, const dt_st_meta *meta,
                               int nmeta, dt_comm_t comm, dt_weights_fill_fn fill, void *user) {
    int root = !comm || dt_comm_rank(comm) == 0;
    dt_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    float *buf = dt_alloc(sizeof(float) * WEIGHTS_PIECE), *sum = root && comm ? dt_alloc(sizeof(float) * WEIGHTS_PIECE) : NULL;
    dt_status st = t && buf && (!root || !comm || sum) ? DT_OK : dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    dt_status wst = DT_OK;  // rank 0's writing: the sums go on after it fails
    char *hdr = NULL;
    size_t hlen = 0;
    dt_atomic_file *f = NULL;
    for (int i = 0; i < n && st == DT_OK; i++) {
        t[i] = (dt_st_tensor){.name = tensors[i].name, .dtype = DT_F32, .ndim = tensors[i].ndim,
                              .nbytes = tensors[i].numel * sizeof(float)};
        for (int d = 0; d < tensors[i].ndim; d++) t[i].shape[d] = tensors[i].shape[d];
    }
    if (st == DT_OK && root && (wst = dt_st_header(path, t, n, meta, nmeta, &hdr, &hlen)) == DT_OK &&
        (wst = dt_atomic_open(&f, path)) == DT_OK)
        wst = dt_atomic_append(f, hdr, hlen);
    for (int i = 0; i < n && st == DT_OK; i++)
        for (size_t lo = tensors[i].offset, end = lo + tensors[i].numel; lo < end && st == DT_OK; lo += WEIGHTS_PIECE) {
            size_t hi = end - lo < WEIGHTS_PIECE ? end : lo + WEIGHTS_PIECE;
            for (size_t j = 0; j < hi - lo; j++) buf[j] = -0.0f;
            fill(user, lo, hi, buf);
            if (comm && (st = dt_reduce(buf, sum, hi - lo, DT_F32, DT_SUM, 0, comm)) != DT_OK)
                st = dt_error(st, "%s: gathering the weights: %s", path, dt_last_error());
            if (st == DT_OK && root && wst == DT_OK) wst = dt_atomic_append(f, comm ? sum : buf, sizeof(float) * (hi - lo));
        }
    if (f && st == DT_OK && wst == DT_OK) wst = dt_atomic_commit(f);
    else dt_atomic_abort(f);
    free(hdr);
    free(t);
    dt_free(buf);
    dt_free(sum);
    return st != DT_OK ? st : wst;
}
