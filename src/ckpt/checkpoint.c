/* Training checkpoints: one safetensors file with the weights, the
 * optimizer state and the loop's position, verified by a CRC-32C; the
 * newest-valid search used by --resume; a background writer. */
#include "dtrain/ckpt.h"
#include "ckpt/st_impl.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Metadata keys, in the order the checksum covers them (then "checksum").
enum { K_FORMAT, K_VERSION, K_STEP, K_EPOCH, K_EPOCH_BATCH, K_EPOCH_STEPS, K_EPOCH_LOSS, K_RNG, K_WORLD,
       K_OPTIMIZER, K_CONFIG, K_CONFIG_HASH, K_WEIGHTS_META, K_DTRAIN_VERSION, NKEYS };
static const char *const keys[NKEYS] = {"format", "format_version", "step", "epoch", "epoch_batch",
                                        "epoch_steps", "epoch_loss", "rng", "world_size", "optimizer",
                                        "config", "config_hash", "weights_meta", "dtrain_version"};

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const dt_st_tensor *const *)a)->name, (*(const dt_st_tensor *const *)b)->name);
}

// CRC-32C over the tensors in name order (name, dtype, shape, bytes) and
// the metadata values in key order.
static uint32_t checksum(const dt_st_tensor *const *t, int n, const char *const *vals) {
    const dt_st_tensor **s = malloc(sizeof *s * (n > 0 ? n : 1));
    if (!s) return 0;
    memcpy(s, t, sizeof *s * n);
    qsort(s, n, sizeof *s, cmp_tensor_name);
    uint32_t c = 0;
    for (int i = 0; i < n; i++) {
        c = dt_crc32c(c, s[i]->name, strlen(s[i]->name) + 1);
        int32_t d[2] = {(int32_t)s[i]->dtype, s[i]->ndim};
        c = dt_crc32c(c, d, sizeof d);
        c = dt_crc32c(c, s[i]->shape, sizeof(int64_t) * s[i]->ndim);
        c = dt_crc32c(c, s[i]->data, s[i]->nbytes);
    }
    for (int k = 0; k < NKEYS; k++) c = dt_crc32c(c, vals[k], strlen(vals[k]) + 1);
    free(s);
    return c;
}

// FNV-1a of the config text: a short name for "the same config".
static uint64_t config_hash(const char *text) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

#define MAX_TENSORS 4096

dt_status dt_ckpt_write(const char *path, const dt_ckpt_model *m, const dt_train_state *s) {
    int n = m->ntensors + m->nstates + 1;
    if (m->ntensors < 0 || n > MAX_TENSORS) return dt_error(DT_ERR_ARG, "%s: %d tensors", path, m->ntensors);
    dt_st_tensor *t = calloc((size_t)n, sizeof *t);
    const dt_st_tensor **tp = calloc((size_t)n, sizeof *tp);
    if (!t || !tp) {
        free(t);
        free(tp);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *ti = &m->tensors[i];
        t[i] = (dt_st_tensor){ti->name, DT_F32, ti->ndim, {0}, m->params + ti->offset, ti->numel * sizeof(float)};
        memcpy(t[i].shape, ti->shape, sizeof ti->shape);
    }
    static const char *const state_names[2] = {"optimizer.state.0", "optimizer.state.1"};
    for (int j = 0; j < m->nstates; j++)
        t[m->ntensors + j] = (dt_st_tensor){state_names[j], DT_F32, 1, {(int64_t)m->nparams}, m->states[j],
                                            m->nparams * sizeof(float)};
    t[n - 1] = (dt_st_tensor){"optimizer.step", DT_I64, 1, {1}, m->opt_step, sizeof(int64_t)};
    for (int i = 0; i < n; i++) tp[i] = &t[i];

    char num[NKEYS][64], rng[80], hash[24], crc[16], wmeta[2048] = "";
    // The weights file's metadata as "key=value" lines.
    for (int i = 0; i < m->nweights_meta; i++) {
        size_t l = strlen(wmeta);
        snprintf(wmeta + l, sizeof wmeta - l, "%s=%s\n", m->weights_meta[i].key, m->weights_meta[i].value);
    }
    const char *vals[NKEYS];
    snprintf(num[K_VERSION], 64, "%d", DT_CKPT_VERSION);
    snprintf(num[K_STEP], 64, "%" PRId64, s->step);
    snprintf(num[K_EPOCH], 64, "%" PRId64, s->epoch);
    snprintf(num[K_EPOCH_BATCH], 64, "%" PRId64, s->epoch_batch);
    snprintf(num[K_EPOCH_STEPS], 64, "%" PRId64, s->epoch_steps);
    snprintf(num[K_EPOCH_LOSS], 64, "%a", s->epoch_loss);  // hex float: exact
    snprintf(num[K_WORLD], 64, "%d", s->world);
    snprintf(rng, sizeof rng, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, s->rng.s[0], s->rng.s[1],
             s->rng.s[2], s->rng.s[3]);
    const char *cfg = m->config ? m->config : "";
    snprintf(hash, sizeof hash, "%016" PRIx64, config_hash(cfg));
    for (int k = 0; k < NKEYS; k++) vals[k] = num[k];
    vals[K_FORMAT] = "dtrain-checkpoint";
    vals[K_RNG] = rng;
    vals[K_OPTIMIZER] = m->optimizer ? m->optimizer : "";
    vals[K_CONFIG] = cfg;
    vals[K_CONFIG_HASH] = hash;
    vals[K_WEIGHTS_META] = wmeta;
    vals[K_DTRAIN_VERSION] = dt_version();
    snprintf(crc, sizeof crc, "%08x", checksum(tp, n, vals));
    dt_st_meta meta[NKEYS + 1];
    for (int k = 0; k < NKEYS; k++) meta[k] = (dt_st_meta){keys[k], vals[k]};
    meta[NKEYS] = (dt_st_meta){"checksum", crc};
    dt_status st = dt_st_write(path, t, n, meta, NKEYS + 1);
    free(t);
    free(tp);
    return st;
}

static int parse_i64(const char *v, int64_t *out) {
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || errno) return 0;
    *out = x;
    return 1;
}

// The metadata values of f in key order; DT_ERR_FORMAT naming a missing key.
static dt_status get_meta(const dt_st_file *f, const char *path, const char **vals) {
    for (int k = 0; k < NKEYS; k++)
        if (!(vals[k] = dt_st_meta_get(f, keys[k])))
            return dt_error(DT_ERR_FORMAT, "%s: checkpoint metadata has no '%s'", path, keys[k]);
    return DT_OK;
}

// Opens path and checks that it is an intact dtrain checkpoint of a
// version this build reads.
static dt_status open_checked(const char *path, dt_st_file **out, const char **vals) {
    dt_st_file *f;
    dt_status st = dt_st_open(&f, path);
    if (st != DT_OK) return st;
    const char *fmt = dt_st_meta_get(f, "format");
    if (!fmt || strcmp(fmt, "dtrain-checkpoint")) {
        st = dt_error(DT_ERR_CONFIG, "%s: not a dtrain checkpoint (format '%s'; weights alone cannot resume a run)",
                      path, fmt ? fmt : "none");
        goto fail;
    }
    int64_t ver;
    const char *v = dt_st_meta_get(f, "format_version");
    if (!parse_i64(v, &ver)) {
        st = dt_error(DT_ERR_FORMAT, "%s: bad format_version '%s'", path, v ? v : "none");
        goto fail;
    }
    if (ver != DT_CKPT_VERSION) {
        st = dt_error(DT_ERR_CONFIG, "%s: checkpoint format version %lld, this dtrain %s reads version %d", path,
                      (long long)ver, dt_version(), DT_CKPT_VERSION);
        goto fail;
    }
    if ((st = get_meta(f, path, vals)) != DT_OK) goto fail;
    int n = dt_st_count(f);
    const dt_st_tensor **tp = malloc(sizeof *tp * (n > 0 ? n : 1));
    if (!tp) {
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int i = 0; i < n; i++) tp[i] = dt_st_get(f, i);
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", checksum(tp, n, vals));
    free(tp);
    const char *want = dt_st_meta_get(f, "checksum");
    if (!want || strcmp(want, crc)) {
        st = dt_error(DT_ERR_FORMAT, "%s: checksum mismatch (stored %s, computed %s): the file is damaged", path,
                      want ? want : "none", crc);
        goto fail;
    }
    *out = f;
    return DT_OK;
fail:
    dt_st_close(f);
    return st;
}

dt_status dt_ckpt_read(const char *path, const dt_ckpt_model *m, dt_train_state *s) {
    dt_st_file *f;
    const char *vals[NKEYS];
    dt_status st = open_checked(path, &f, vals);
    if (st != DT_OK) return st;
    // Check everything before touching the caller's buffers.
    const dt_st_tensor *w[MAX_TENSORS], *states[2] = {0}, *step = NULL;
    if (m->ntensors > MAX_TENSORS) {
        st = dt_error(DT_ERR_ARG, "%s: %d tensors", path, m->ntensors);
        goto done;
    }
    for (int i = 0; i < m->ntensors && st == DT_OK; i++)
        st = dt_st_expect(f, path, m->tensors[i].name, DT_F32, m->tensors[i].ndim, m->tensors[i].shape, DT_ERR_CONFIG, &w[i]);
    if (st != DT_OK) goto done;
    const char *opt = m->optimizer ? m->optimizer : "";
    if (strcmp(vals[K_OPTIMIZER], opt)) {
        st = dt_error(DT_ERR_CONFIG, "%s: written with optimizer '%s', this run uses '%s'", path, vals[K_OPTIMIZER], opt);
        goto done;
    }
    static const char *const state_names[2] = {"optimizer.state.0", "optimizer.state.1"};
    int64_t np = (int64_t)m->nparams, one = 1;
    for (int j = 0; j < m->nstates && st == DT_OK; j++)
        st = dt_st_expect(f, path, state_names[j], DT_F32, 1, &np, DT_ERR_CONFIG, &states[j]);
    if (st == DT_OK) st = dt_st_expect(f, path, "optimizer.step", DT_I64, 1, &one, DT_ERR_CONFIG, &step);
    if (st != DT_OK) goto done;
    dt_train_state ns = {0};
    int ok = parse_i64(vals[K_STEP], &ns.step) && parse_i64(vals[K_EPOCH], &ns.epoch) &&
             parse_i64(vals[K_EPOCH_BATCH], &ns.epoch_batch) && parse_i64(vals[K_EPOCH_STEPS], &ns.epoch_steps) &&
             ns.step >= 0 && ns.epoch >= 0 && ns.epoch_batch >= 0 && ns.epoch_steps >= 0;
    char *end;
    ns.epoch_loss = strtod(vals[K_EPOCH_LOSS], &end);
    ok = ok && !*end && strlen(vals[K_RNG]) == 64;
    for (int i = 0; ok && i < 4; i++) {
        char part[17];
        memcpy(part, vals[K_RNG] + 16 * i, 16);
        part[16] = 0;
        ns.rng.s[i] = strtoull(part, &end, 16);
        ok = !*end;
    }
    int64_t world;
    ok = ok && parse_i64(vals[K_WORLD], &world) && world >= 1 && world <= 1 << 20;
    if (!ok) {
        st = dt_error(DT_ERR_FORMAT, "%s: malformed training state in the metadata", path);
        goto done;
    }
    ns.world = (int)world;
    for (int i = 0; i < m->ntensors; i++) memcpy(m->params + m->tensors[i].offset, w[i]->data, w[i]->nbytes);
    for (int j = 0; j < m->nstates; j++) memcpy(m->states[j], states[j]->data, states[j]->nbytes);
    memcpy(m->opt_step, step->data, sizeof(int64_t));
    *s = ns;
    if (m->config && strcmp(vals[K_CONFIG], m->config))
        dt_log(DT_LOG_WARN, "%s: written with a different config (hash %s); continuing with this one", path,
               vals[K_CONFIG_HASH]);
done:
    dt_st_close(f);
    return st;
}

dt_status dt_ckpt_inspect(const char *path, FILE *out) {
    dt_st_file *f;
    dt_status st = dt_st_open(&f, path);
    if (st != DT_OK) return st;
    const char *fmt = dt_st_meta_get(f, "format");
    fprintf(out, "%s: safetensors, %d tensors, format %s\n", path, dt_st_count(f), fmt ? fmt : "(none)");
    int is_ckpt = fmt && !strcmp(fmt, "dtrain-checkpoint");
    if (is_ckpt) {
        for (int k = 0; k < NKEYS; k++) {
            const char *v = dt_st_meta_get(f, keys[k]);
            if (k == K_CONFIG) continue;
            fprintf(out, "  %-15s %s\n", keys[k], v ? v : "(missing)");
        }
        const char *cfg = dt_st_meta_get(f, "config");
        if (cfg) {
            fprintf(out, "  config:\n");
            for (const char *p = cfg; *p;) {
                size_t l = strcspn(p, "\n");
                if (l) fprintf(out, "    | %.*s\n", (int)l, p);
                p += l + (p[l] == '\n');
            }
        }
    }
    size_t bytes = 0;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_get(f, i);
        char shape[160];
        dt_st_format_shape(shape, sizeof shape, t->shape, t->ndim);
        fprintf(out, "  tensor %-28s %s %s\n", t->name, dt_dtype_name(t->dtype), shape);
        bytes += t->nbytes;
    }
    fprintf(out, "  %zu bytes of tensor data\n", bytes);
    dt_st_close(f);
    if (is_ckpt) {
        const char *vals[NKEYS];
        if ((st = open_checked(path, &f, vals)) != DT_OK) {
            fprintf(out, "  checksum: FAILED: %s\n", dt_last_error());
            return st;
        }
        fprintf(out, "  checksum %s: ok\n", dt_st_meta_get(f, "checksum"));
        dt_st_close(f);
    }
    return DT_OK;
}

dt_status dt_ckpt_export_weights(const char *ckpt, const char *out) {
    dt_st_file *f;
    const char *vals[NKEYS];
    dt_status st = open_checked(ckpt, &f, vals);
    if (st != DT_OK) return st;
    int n = 0;
    dt_st_tensor *t = calloc((size_t)dt_st_count(f) + 1, sizeof *t);
    if (!t) {
        dt_st_close(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", ckpt);
    }
    for (int i = 0; i < dt_st_count(f); i++)
        if (strncmp(dt_st_get(f, i)->name, "optimizer.", 10)) t[n++] = *dt_st_get(f, i);
    // The weights file's own metadata, then ours where it has none.
    char *lines = strdup(vals[K_WEIGHTS_META]);
    dt_st_meta meta[35];
    int nm = 0, has_format = 0;
    for (char *save = NULL, *l = lines ? strtok_r(lines, "\n", &save) : NULL; l && nm < 32;
         l = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(l, '=');
        if (!eq) continue;
        *eq = 0;
        has_format |= !strcmp(l, "format");
        meta[nm++] = (dt_st_meta){l, eq + 1};
    }
    if (!has_format) meta[nm++] = (dt_st_meta){"format", "dtrain-weights"};
    meta[nm++] = (dt_st_meta){"dtrain_version", dt_version()};
    meta[nm++] = (dt_st_meta){"step", vals[K_STEP]};
    st = lines ? dt_st_write(out, t, n, meta, nm) : dt_error(DT_ERR_NOMEM, "out of memory");
    free(lines);
    free(t);
    dt_st_close(f);
    return st;
}

// ----------------------------------------------------------------------------
// the checkpoints of a directory

static int64_t step_of(const char *name) {
    long long s;
    int end = 0;
    if (sscanf(name, "step-%lld.safetensors%n", &s, &end) == 1 && name[end] == 0 && s >= 0) return s;
    return -1;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = step_of(strrchr(*(char *const *)a, '/') + 1), y = step_of(strrchr(*(char *const *)b, '/') + 1);
    return x < y ? 1 : x > y ? -1 : 0;
}

dt_status dt_ckpt_list(const char *dir, char ***paths, int *n) {
    *paths = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return DT_OK;
        return dt_error(DT_ERR_IO, "%s: cannot read directory: %s", dir, strerror(errno));
    }
    struct dirent *e;
    int cap = 0;
    dt_status st = DT_OK;
    while ((e = readdir(d))) {
        if (step_of(e->d_name) < 0) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = realloc(*paths, sizeof *p * cap);
            if (!p) {
                st = dt_error(DT_ERR_NOMEM, "out of memory");
                break;
            }
            *paths = p;
        }
        size_t l = strlen(dir) + strlen(e->d_name) + 2;
        if (!((*paths)[*n] = malloc(l))) {
            st = dt_error(DT_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf((*paths)[(*n)++], l, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (st != DT_OK) {
        for (int i = 0; i < *n; i++) free((*paths)[i]);
        free(*paths);
        *paths = NULL;
        *n = 0;
        return st;
    }
    qsort(*paths, *n, sizeof **paths, cmp_desc);
    return DT_OK;
}

static void free_list(char **p, int n) {
    for (int i = 0; i < n; i++) free(p[i]);
    free(p);
}

dt_status dt_ckpt_load_newest(const char *dir, const dt_ckpt_model *m, dt_train_state *s, int *found, char *used,
                              size_t nused) {
    *found = 0;
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) {
        dt_status st = dt_ckpt_read(dir, m, s);
        if (st == DT_OK) {
            *found = 1;
            snprintf(used, nused, "%s", dir);
        }
        return st;
    }
    char **paths;
    int n;
    dt_status st = dt_ckpt_list(dir, &paths, &n);
    if (st != DT_OK) return st;
    int damaged = 0;
    for (int i = 0; i < n; i++) {
        st = dt_ckpt_read(paths[i], m, s);
        if (st == DT_OK) {
            *found = 1;
            snprintf(used, nused, "%s", paths[i]);
            break;
        }
        if (st != DT_ERR_IO && st != DT_ERR_FORMAT) break;  // sound but incompatible: no fallback
        damaged++;
        dt_log(DT_LOG_WARN, "skipping damaged checkpoint: %s%s", dt_last_error(),
               i + 1 < n ? "; trying an older one" : "");
    }
    if (!*found && damaged && damaged == n)
        st = dt_error(DT_ERR_FORMAT, "%s: all %d checkpoints are damaged (see the warnings above)", dir, n);
    free_list(paths, n);
    return st;
}

// ----------------------------------------------------------------------------
// background writer

struct dt_ckpt_writer {
    char dir[4096];
    int keep;
    dt_ckpt_model live;     // the training buffers
    dt_ckpt_model snap;     // copies the thread writes from
    float *buf;             // params + states of the snapshot
    int64_t snap_step;
    dt_train_state state;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, busy, quit, started;
    dt_status err;          // first failed write
    char errmsg[1024];
    int saves;
    double max_pause, total_pause, max_write;
};

// Deletes all but the newest `keep` checkpoints, and temp files that a
// writer killed mid-write left behind.
static void prune(const char *dir, int keep) {
    char **paths;
    int n;
    if (dt_ckpt_list(dir, &paths, &n) != DT_OK) return;
    for (int i = keep; i < n; i++) unlink(paths[i]);
    free_list(paths, n);
}

static void *writer_main(void *arg) {
    dt_ckpt_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->pending && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->pending) break;
        w->pending = 0;
        w->busy = 1;
        dt_train_state s = w->state;
        pthread_mutex_unlock(&w->mu);
        char path[4200];
        snprintf(path, sizeof path, "%s/step-%08lld.safetensors", w->dir, (long long)s.step);
        double t0 = dt_now();
        dt_status st = dt_ckpt_write(path, &w->snap, &s);
        if (st == DT_OK) prune(w->dir, w->keep);
        double took = dt_now() - t0;
        dt_log(DT_LOG_DEBUG, "checkpoint %s written in %.1f ms", path, took * 1e3);
        pthread_mutex_lock(&w->mu);
        if (took > w->max_write) w->max_write = took;
        if (st != DT_OK && w->err == DT_OK) {
            w->err = st;
            snprintf(w->errmsg, sizeof w->errmsg, "checkpoint at step %lld: %s", (long long)s.step, dt_last_error());
        }
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

dt_status dt_ckpt_writer_create(dt_ckpt_writer **out, const char *dir, int keep, const dt_ckpt_model *m) {
    *out = NULL;
    dt_status st = dt_make_dirs(dir);
    if (st != DT_OK) return st;
    dt_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_NOMEM, "out of memory");
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->keep = keep < 1 ? 1 : keep;
    w->live = *m;
    w->snap = *m;
    w->buf = dt_alloc(sizeof(float) * m->nparams * (size_t)(1 + m->nstates));
    if (!w->buf) {
        free(w);
        return dt_error(DT_ERR_NOMEM, "checkpoint snapshot: out of memory (%zu parameters)", m->nparams);
    }
    w->snap.params = w->buf;
    for (int j = 0; j < m->nstates; j++) w->snap.states[j] = w->buf + m->nparams * (size_t)(1 + j);
    w->snap.opt_step = &w->snap_step;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        dt_ckpt_writer_free(w);
        return dt_error(DT_ERR_INTERNAL, "cannot start the checkpoint writer thread");
    }
    w->started = 1;
    // Temp files of a writer that was killed mid-write.
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strstr(e->d_name, ".safetensors.tmp.")) {
            char p[4400];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    if (d) closedir(d);
    *out = w;
    return DT_OK;
}

dt_status dt_ckpt_writer_save(dt_ckpt_writer *w, const dt_train_state *s) {
    double t0 = dt_now();
    pthread_mutex_lock(&w->mu);
    while (w->pending || w->busy) pthread_cond_wait(&w->cv, &w->mu);
    dt_status st = w->err;
    if (st == DT_OK) {
        memcpy(w->snap.params, w->live.params, sizeof(float) * w->live.nparams);
        for (int j = 0; j < w->live.nstates; j++)
            memcpy(w->snap.states[j], w->live.states[j], sizeof(float) * w->live.nparams);
        w->snap_step = *w->live.opt_step;
        w->state = *s;
        w->pending = 1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (st != DT_OK) return dt_error(st, "%s", w->errmsg);
    double p = dt_now() - t0;
    w->saves++;
    w->total_pause += p;
    if (p > w->max_pause) w->max_pause = p;
    return DT_OK;
}

dt_status dt_ckpt_writer_wait(dt_ckpt_writer *w) {
    pthread_mutex_lock(&w->mu);
    while (w->pending || w->busy) pthread_cond_wait(&w->cv, &w->mu);
    dt_status st = w->err;
    pthread_mutex_unlock(&w->mu);
    return st != DT_OK ? dt_error(st, "%s", w->errmsg) : DT_OK;
}

void dt_ckpt_writer_stats(const dt_ckpt_writer *w, int *saves, double *max_pause, double *total_pause,
                          double *max_write) {
    if (max_write) *max_write = w->max_write;
    if (saves) *saves = w->saves;
    if (max_pause) *max_pause = w->max_pause;
    if (total_pause) *total_pause = w->total_pause;
}

void dt_ckpt_writer_free(dt_ckpt_writer *w) {
    if (!w) return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->quit = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    dt_free(w->buf);
    free(w);
}
