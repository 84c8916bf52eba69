/* Training checkpoints: one safetensors file with the weights, the
 * optimizer state and the loop's position, verified by a CRC-32C; the
 * newest-valid search used by --resume; a background writer. */
#include "dtrain/ckpt.h"
#include "ckpt/st_impl.h"

#include "dtrain/data.h"
#include "obs/json.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Metadata keys, in the order the checksum covers them (then "checksum").
enum { K_FORMAT, K_VERSION, K_STEP, K_EPOCH, K_EPOCH_BATCH, K_EPOCH_STEPS, K_EPOCH_LOSS, K_RNG, K_WORLD,
       K_OPTIMIZER, K_CONFIG, K_CONFIG_HASH, K_WEIGHTS_META, K_SHARD, K_DTRAIN_VERSION, NKEYS };
static const char *const keys[NKEYS] = {"format", "format_version", "step", "epoch", "epoch_batch",
                                        "epoch_steps", "epoch_loss", "rng", "world_size", "optimizer",
                                        "config", "config_hash", "weights_meta", "shard", "dtrain_version"};

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

static const char *const state_names[2] = {"optimizer.state.0", "optimizer.state.1"};

// Writes tensors t[n] with the training state as metadata and the checksum.
// shard: "" for a whole checkpoint, "BEGIN:END:NPARAMS:RANK:WORLD" for a shard.
static dt_status write_ckpt(const char *path, const dt_st_tensor *t, int n, const dt_ckpt_model *m,
                            const dt_train_state *s, const char *shard) {
    const dt_st_tensor **tp = calloc((size_t)n, sizeof *tp);
    if (!tp) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
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
    vals[K_FORMAT] = *shard ? "dtrain-checkpoint-shard" : "dtrain-checkpoint";
    vals[K_RNG] = rng;
    vals[K_OPTIMIZER] = m->optimizer ? m->optimizer : "";
    vals[K_CONFIG] = cfg;
    vals[K_CONFIG_HASH] = hash;
    vals[K_WEIGHTS_META] = wmeta;
    vals[K_SHARD] = shard;
    vals[K_DTRAIN_VERSION] = dt_version();
    snprintf(crc, sizeof crc, "%08x", checksum(tp, n, vals));
    free(tp);
    dt_st_meta meta[NKEYS + 1];
    for (int k = 0; k < NKEYS; k++) meta[k] = (dt_st_meta){keys[k], vals[k]};
    meta[NKEYS] = (dt_st_meta){"checksum", crc};
    return dt_st_write(path, t, n, meta, NKEYS + 1);
}

dt_status dt_ckpt_write(const char *path, const dt_ckpt_model *m, const dt_train_state *s) {
    int n = m->ntensors + m->nstates + 1;
    if (m->ntensors < 0 || n > MAX_TENSORS) return dt_error(DT_ERR_ARG, "%s: %d tensors", path, m->ntensors);
    dt_st_tensor *t = calloc((size_t)n, sizeof *t);
    if (!t) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *ti = &m->tensors[i];
        t[i] = (dt_st_tensor){ti->name, DT_F32, ti->ndim, {0}, m->params + ti->offset, ti->numel * sizeof(float)};
        memcpy(t[i].shape, ti->shape, sizeof ti->shape);
    }
    for (int j = 0; j < m->nstates; j++)
        t[m->ntensors + j] = (dt_st_tensor){state_names[j], DT_F32, 1, {(int64_t)m->nparams}, m->states[j],
                                            m->nparams * sizeof(float)};
    t[n - 1] = (dt_st_tensor){"optimizer.step", DT_I64, 1, {1}, m->opt_step, sizeof(int64_t)};
    dt_status st = write_ckpt(path, t, n, m, s, "");
    free(t);
    return st;
}

// A shard: the slice [begin, end) of the parameter block and of each
// optimizer state, as "params" and "optimizer.state.J" (m's buffers hold
// that slice at their start: a snapshot), and the step count.
static dt_status write_shard(const char *path, const dt_ckpt_model *m, const dt_train_state *s, size_t begin,
                             size_t end, int rank, int world) {
    int64_t len = (int64_t)(end - begin);
    dt_st_tensor t[4];
    int n = 0;
    t[n++] = (dt_st_tensor){"params", DT_F32, 1, {len}, m->params, (size_t)len * sizeof(float)};
    for (int j = 0; j < m->nstates; j++)
        t[n++] = (dt_st_tensor){state_names[j], DT_F32, 1, {len}, m->states[j], (size_t)len * sizeof(float)};
    t[n++] = (dt_st_tensor){"optimizer.step", DT_I64, 1, {1}, m->opt_step, sizeof(int64_t)};
    char shard[128];
    snprintf(shard, sizeof shard, "%zu:%zu:%zu:%d:%d", begin, end, m->nparams, rank, world);
    return write_ckpt(path, t, n, m, s, shard);
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
static dt_status open_checked(const char *path, dt_st_file **out, const char **vals, const char *format) {
    dt_st_file *f;
    dt_status st = dt_st_open(&f, path);
    if (st != DT_OK) return st;
    const char *fmt = dt_st_meta_get(f, "format");
    if (!fmt || strcmp(fmt, format)) {
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

// The training state in a checkpoint's metadata values.
static dt_status parse_state(const char **vals, const char *path, dt_train_state *out) {
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
    if (!ok) return dt_error(DT_ERR_FORMAT, "%s: malformed training state in the metadata", path);
    ns.world = (int)world;
    *out = ns;
    return DT_OK;
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static dt_status read_sharded(const char *dir, const dt_ckpt_model *m, dt_train_state *s);

dt_status dt_ckpt_read(const char *path, const dt_ckpt_model *m, dt_train_state *s) {
    if (is_dir(path)) return read_sharded(path, m, s);
    dt_st_file *f;
    const char *vals[NKEYS];
    dt_status st = open_checked(path, &f, vals, "dtrain-checkpoint");
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
    int64_t np = (int64_t)m->nparams, one = 1;
    for (int j = 0; j < m->nstates && st == DT_OK; j++)
        st = dt_st_expect(f, path, state_names[j], DT_F32, 1, &np, DT_ERR_CONFIG, &states[j]);
    if (st == DT_OK) st = dt_st_expect(f, path, "optimizer.step", DT_I64, 1, &one, DT_ERR_CONFIG, &step);
    if (st != DT_OK) goto done;
    dt_train_state ns;
    if ((st = parse_state(vals, path, &ns)) != DT_OK) goto done;
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

// ----------------------------------------------------------------------------
// sharded checkpoints: DIR/step-N/ with one shard-R-of-W.safetensors per
// rank (its slice of the parameter block and optimizer state), index.json
// (the model's tensors, the slices), and COMPLETE, written last, once every
// shard is durable.

static void shard_path(char *buf, size_t n, const char *dir, int rank, int world) {
    snprintf(buf, n, "%s/shard-%05d-of-%05d.safetensors", dir, rank, world);
}

// index.json, then COMPLETE (both atomic).
static dt_status write_index(const char *dir, const dt_ckpt_model *m, const dt_train_state *s, int world) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "dtrain-checkpoint-index");
    cJSON_AddNumberToObject(o, "format_version", DT_CKPT_VERSION);
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON_AddNumberToObject(o, "world_size", world);
    cJSON_AddNumberToObject(o, "nparams", (double)m->nparams);
    cJSON_AddNumberToObject(o, "nstates", m->nstates);
    cJSON_AddStringToObject(o, "optimizer", m->optimizer ? m->optimizer : "");
    cJSON *t = cJSON_AddArrayToObject(o, "tensors");
    for (int i = 0; i < m->ntensors; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", m->tensors[i].name);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < m->tensors[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)m->tensors[i].shape[d]));
        cJSON_AddNumberToObject(e, "offset", (double)m->tensors[i].offset);
        cJSON_AddItemToArray(t, e);
    }
    cJSON *sa = cJSON_AddArrayToObject(o, "shards");
    for (int r = 0; r < world; r++) {
        size_t b, e;
        dt_shard_range(m->nparams, r, world, &b, &e);
        char name[64];
        shard_path(name, sizeof name, ".", r, world);
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "file", name + 2);
        cJSON_AddNumberToObject(x, "begin", (double)b);
        cJSON_AddNumberToObject(x, "end", (double)e);
        cJSON_AddItemToArray(sa, x);
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/index.json", dir);
    dt_status st = dt_json_write(path, o);
    if (st != DT_OK) return st;
    snprintf(path, sizeof path, "%s/COMPLETE", dir);
    const void *parts[] = {""};
    size_t sizes[] = {0};
    return dt_write_atomic(path, parts, sizes, 1);
}

static cJSON *read_json(const char *path) {
    uint8_t *buf;
    size_t len;
    if (dt_read_file_gz(path, &buf, &len) != DT_OK) return NULL;
    cJSON *o = cJSON_ParseWithLength((const char *)buf, len);
    free(buf);
    return o;
}

static double num_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static dt_status read_sharded(const char *dir, const dt_ckpt_model *m, dt_train_state *s) {
    char path[4200];
    snprintf(path, sizeof path, "%s/COMPLETE", dir);
    if (access(path, F_OK) != 0)
        return dt_error(DT_ERR_FORMAT, "%s: incomplete sharded checkpoint (no COMPLETE marker: not every shard was written)",
                        dir);
    snprintf(path, sizeof path, "%s/index.json", dir);
    cJSON *idx = read_json(path);
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(idx, "shards");
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(idx, "tensors");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(idx, "format");
    dt_status st = DT_OK;
    float *tmp = NULL;
    int64_t opt_step = 0;
    if (!cJSON_IsArray(shards) || !cJSON_IsArray(tensors) || !cJSON_IsString(fmt) ||
        strcmp(fmt->valuestring, "dtrain-checkpoint-index")) {
        st = dt_error(DT_ERR_FORMAT, "%s: missing or malformed", path);
        goto done;
    }
    if (num_of(idx, "format_version") != DT_CKPT_VERSION) {
        st = dt_error(DT_ERR_CONFIG, "%s: checkpoint format version %g, this dtrain %s reads version %d", path,
                      num_of(idx, "format_version"), dt_version(), DT_CKPT_VERSION);
        goto done;
    }
    // The model: the same tensors at the same offsets.
    if (num_of(idx, "nparams") != (double)m->nparams || cJSON_GetArraySize(tensors) != m->ntensors) {
        st = dt_error(DT_ERR_CONFIG, "%s: a checkpoint of a different model (%g parameters in %d tensors; this run has %zu in %d)",
                      path, num_of(idx, "nparams"), cJSON_GetArraySize(tensors), m->nparams, m->ntensors);
        goto done;
    }
    for (int i = 0; i < m->ntensors; i++) {
        const cJSON *e = cJSON_GetArrayItem(tensors, i), *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        int same = cJSON_IsString(nm) && !strcmp(nm->valuestring, m->tensors[i].name) &&
                   num_of(e, "offset") == (double)m->tensors[i].offset && cJSON_GetArraySize(sh) == m->tensors[i].ndim;
        for (int d = 0; same && d < m->tensors[i].ndim; d++)
            same = cJSON_GetArrayItem(sh, d)->valuedouble == (double)m->tensors[i].shape[d];
        if (!same) {
            st = dt_error(DT_ERR_CONFIG, "%s: tensor %d is not '%s' of this model's shape (a checkpoint of a different model?)",
                          path, i, m->tensors[i].name);
            goto done;
        }
    }
    // Every shard, verified, into a scratch copy; then the caller's buffers.
    size_t np = m->nparams;
    if (!(tmp = dt_alloc(sizeof(float) * np * (size_t)(1 + m->nstates)))) {
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    int W = cJSON_GetArraySize(shards);
    size_t next = 0;
    for (int r = 0; r < W && st == DT_OK; r++) {
        const cJSON *x = cJSON_GetArrayItem(shards, r), *file = cJSON_GetObjectItemCaseSensitive(x, "file");
        size_t b = (size_t)num_of(x, "begin"), e = (size_t)num_of(x, "end");
        if (!cJSON_IsString(file) || strchr(file->valuestring, '/') || num_of(x, "begin") < 0 || b != next || e < b ||
            e > np) {
            st = dt_error(DT_ERR_FORMAT, "%s: shard %d is malformed or does not continue the one before", path, r);
            break;
        }
        next = e;
        char sp[4400];
        snprintf(sp, sizeof sp, "%s/%s", dir, file->valuestring);
        dt_st_file *f;
        const char *vals[NKEYS];
        if ((st = open_checked(sp, &f, vals, "dtrain-checkpoint-shard")) != DT_OK) break;
        char want[128];
        snprintf(want, sizeof want, "%zu:%zu:%zu:%d:%d", b, e, np, r, W);
        int64_t len = (int64_t)(e - b), one = 1;
        const dt_st_tensor *t, *step;
        if (strcmp(vals[K_SHARD], want))
            st = dt_error(DT_ERR_FORMAT, "%s: holds slice %s, the index says %s", sp, vals[K_SHARD], want);
        else if (strcmp(vals[K_OPTIMIZER], m->optimizer ? m->optimizer : ""))
            st = dt_error(DT_ERR_CONFIG, "%s: written with optimizer '%s', this run uses '%s'", sp, vals[K_OPTIMIZER],
                          m->optimizer ? m->optimizer : "");
        if (st == DT_OK && (st = dt_st_expect(f, sp, "params", DT_F32, 1, &len, DT_ERR_FORMAT, &t)) == DT_OK)
            memcpy(tmp + b, t->data, t->nbytes);
        for (int j = 0; j < m->nstates && st == DT_OK; j++)
            if ((st = dt_st_expect(f, sp, state_names[j], DT_F32, 1, &len, DT_ERR_CONFIG, &t)) == DT_OK)
                memcpy(tmp + np * (size_t)(1 + j) + b, t->data, t->nbytes);
        if (st == DT_OK && (st = dt_st_expect(f, sp, "optimizer.step", DT_I64, 1, &one, DT_ERR_FORMAT, &step)) == DT_OK)
            memcpy(&opt_step, step->data, sizeof opt_step);
        dt_train_state ns;
        if (st == DT_OK && (st = parse_state(vals, sp, &ns)) == DT_OK && r == 0) *s = ns;
        if (st == DT_OK && ns.step != s->step)
            st = dt_error(DT_ERR_FORMAT, "%s: step %lld, shard 0 has step %lld", sp, (long long)ns.step,
                          (long long)s->step);
        dt_st_close(f);
    }
    if (st == DT_OK && next != np) st = dt_error(DT_ERR_FORMAT, "%s: the shards end at %zu of %zu parameters", path, next, np);
    if (st == DT_OK) {
        memcpy(m->params, tmp, sizeof(float) * np);
        for (int j = 0; j < m->nstates; j++) memcpy(m->states[j], tmp + np * (size_t)(1 + j), sizeof(float) * np);
        *m->opt_step = opt_step;
    }
done:
    dt_free(tmp);
    cJSON_Delete(idx);
    return st;
}

static dt_status as_file(const char *ckpt, char *tmp, size_t n, const char **path);

dt_status dt_ckpt_inspect(const char *path_in, FILE *out) {
    char tmp[4200];
    const char *path;
    dt_status st = as_file(path_in, tmp, sizeof tmp, &path);
    if (st != DT_OK) return st;
    if (tmp[0]) fprintf(out, "%s: sharded checkpoint, every shard verified and gathered:\n", path_in);
    dt_st_file *f;
    st = dt_st_open(&f, path);
    if (st != DT_OK) {
        if (tmp[0]) unlink(tmp);
        return st;
    }
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
        if ((st = open_checked(path, &f, vals, "dtrain-checkpoint")) != DT_OK) {
            fprintf(out, "  checksum: FAILED: %s\n", dt_last_error());
        } else {
            fprintf(out, "  checksum %s: ok\n", dt_st_meta_get(f, "checksum"));
            dt_st_close(f);
        }
    }
    if (tmp[0]) unlink(tmp);
    return st;
}

// "key=value" lines (a checkpoint's weights_meta) into meta, in place.
static int parse_wmeta(char *lines, dt_st_meta *meta, int max) {
    int n = 0;
    for (char *save = NULL, *l = strtok_r(lines, "\n", &save); l && n < max; l = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(l, '=');
        if (!eq) continue;
        *eq = 0;
        meta[n++] = (dt_st_meta){l, eq + 1};
    }
    return n;
}

// A sharded checkpoint gathered into one whole checkpoint file `out`.
static dt_status gather(const char *dir, const char *out) {
    char path[4400];
    snprintf(path, sizeof path, "%s/index.json", dir);
    cJSON *idx = read_json(path);
    const cJSON *tj = cJSON_GetObjectItemCaseSensitive(idx, "tensors");
    const cJSON *oj = cJSON_GetObjectItemCaseSensitive(idx, "optimizer");
    int nt = cJSON_GetArraySize(tj), ns = (int)num_of(idx, "nstates");
    double np = num_of(idx, "nparams");
    if (!idx || !cJSON_IsArray(tj) || !cJSON_IsString(oj) || nt > MAX_TENSORS || ns < 0 || ns > 2 || np < 0 ||
        np > 1e12) {
        cJSON_Delete(idx);
        return dt_error(DT_ERR_FORMAT, "%s: missing or malformed", path);
    }
    dt_tensor_info *ti = calloc((size_t)nt + 1, sizeof *ti);
    float *buf = dt_alloc(sizeof(float) * ((size_t)np + 1) * (size_t)(1 + ns));
    int64_t step = 0;
    dt_status st = ti && buf ? DT_OK : dt_error(DT_ERR_NOMEM, "%s: out of memory", dir);
    for (int i = 0; i < nt && st == DT_OK; i++) {
        const cJSON *e = cJSON_GetArrayItem(tj, i), *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        ti[i].name = cJSON_IsString(nm) ? nm->valuestring : "";
        ti[i].ndim = cJSON_GetArraySize(sh);
        ti[i].numel = 1;
        for (int d = 0; d < ti[i].ndim && d < 4; d++) {
            ti[i].shape[d] = (int64_t)cJSON_GetArrayItem(sh, d)->valuedouble;
            ti[i].numel *= (size_t)ti[i].shape[d];
        }
        ti[i].offset = (size_t)num_of(e, "offset");
        if (ti[i].ndim > 4 || num_of(e, "offset") < 0 || ti[i].offset + ti[i].numel > (size_t)np)
            st = dt_error(DT_ERR_FORMAT, "%s: tensor %d is malformed", path, i);
    }
    dt_ckpt_model m = {.tensors = ti, .ntensors = nt, .params = buf, .nparams = (size_t)np, .nstates = ns,
                       .opt_step = &step, .optimizer = oj->valuestring};
    for (int j = 0; j < ns; j++) m.states[j] = buf + ((size_t)np + 1) * (size_t)(1 + j);
    dt_train_state s;
    if (st == DT_OK) st = read_sharded(dir, &m, &s);
    // The config and the weights' metadata, from shard 0.
    dt_st_file *f = NULL;
    const char *vals[NKEYS];
    const cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(idx, "shards"), 0);
    if (st == DT_OK) {
        snprintf(path, sizeof path, "%s/%s", dir, cJSON_GetObjectItemCaseSensitive(s0, "file")->valuestring);
        st = open_checked(path, &f, vals, "dtrain-checkpoint-shard");
    }
    if (st == DT_OK) {
        char *lines = strdup(vals[K_WEIGHTS_META]);
        dt_st_meta meta[32];
        m.config = vals[K_CONFIG];
        m.weights_meta = meta;
        m.nweights_meta = lines ? parse_wmeta(lines, meta, 32) : 0;
        st = dt_ckpt_write(out, &m, &s);
        free(lines);
    }
    dt_st_close(f);
    dt_free(buf);
    free(ti);
    cJSON_Delete(idx);
    return st;
}

// For a sharded checkpoint, a whole one gathered into a temp file (*tmp
// set, to be removed); a file is used as it is.
static dt_status as_file(const char *ckpt, char *tmp, size_t n, const char **path) {
    *path = ckpt;
    tmp[0] = 0;
    if (!is_dir(ckpt)) return DT_OK;
    const char *td = getenv("TMPDIR");
    snprintf(tmp, n, "%s/dtrain-gathered-XXXXXX", td && *td ? td : "/tmp");
    int fd = mkstemp(tmp);
    if (fd < 0) return dt_error(DT_ERR_IO, "%s: cannot create a temp file: %s", tmp, strerror(errno));
    close(fd);
    *path = tmp;
    dt_status st = gather(ckpt, tmp);
    if (st != DT_OK) unlink(tmp);
    return st;
}

dt_status dt_ckpt_export_weights(const char *ckpt_in, const char *out) {
    char tmp[4200];
    const char *ckpt;
    dt_status st = as_file(ckpt_in, tmp, sizeof tmp, &ckpt);
    if (st != DT_OK) return st;
    dt_st_file *f;
    const char *vals[NKEYS];
    st = open_checked(ckpt, &f, vals, "dtrain-checkpoint");
    if (tmp[0]) unlink(tmp);  // the data stays in f
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
    int nm = lines ? parse_wmeta(lines, meta, 32) : 0, has_format = 0;
    for (int i = 0; i < nm; i++) has_format |= !strcmp(meta[i].key, "format");
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
    if (sscanf(name, "step-%lld%n", &s, &end) != 1 || s < 0) return -1;
    return !name[end] || !strcmp(name + end, ".safetensors") ? s : -1;
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
    // An empty directory leaves *paths NULL, which qsort must not be given.
    if (*n > 1) qsort(*paths, *n, sizeof **paths, cmp_desc);
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
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/index.json", dir);
    // One checkpoint: a file, or a sharded checkpoint's directory.
    if (stat(dir, &sb) == 0 && (S_ISREG(sb.st_mode) || access(idx, F_OK) == 0)) {
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
    int rank, world;        // world > 1: sharded
    double shard_timeout;
    size_t begin, end;      // this rank's slice
    _Atomic int cancel;     // stop waiting for the other shards
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

// Removes a checkpoint: a file, or a sharded checkpoint's directory.
static void remove_ckpt(const char *path) {
    if (!is_dir(path)) {
        unlink(path);
        return;
    }
    char p[4400];
    snprintf(p, sizeof p, "%s/COMPLETE", path);
    unlink(p);  // first: a half-removed checkpoint is never taken for whole
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(path);
}

// Deletes all but the newest `keep` checkpoints.
static void prune(const char *dir, int keep) {
    char **paths;
    int n;
    if (dt_ckpt_list(dir, &paths, &n) != DT_OK) return;
    for (int i = keep; i < n; i++) remove_ckpt(paths[i]);
    free_list(paths, n);
}

// Sharded: this rank's shard into DIR/step-N/; rank 0 then waits for the
// others' shards (a shard's final name appears only once it is durable) and
// marks the checkpoint complete.
static dt_status write_sharded(dt_ckpt_writer *w, const char *dir, const dt_train_state *s) {
    dt_status st = dt_make_dirs(dir);
    char path[4400];
    shard_path(path, sizeof path, dir, w->rank, w->world);
    if (st == DT_OK) st = write_shard(path, &w->snap, s, w->begin, w->end, w->rank, w->world);
    if (st != DT_OK || w->rank != 0) return st;
    double deadline = dt_now() + w->shard_timeout;
    for (int r = 1; r < w->world; r++) {
        shard_path(path, sizeof path, dir, r, w->world);
        while (access(path, F_OK) != 0) {
            if (w->cancel) return dt_error(DT_ERR_IO, "%s: not written (the run stopped)", path);
            if (dt_now() > deadline)
                return dt_error(DT_ERR_TIMEOUT, "%s: rank %d's shard not written within %.0f s", path, r,
                                w->shard_timeout);
            usleep(5000);
        }
    }
    return write_index(dir, &w->live, s, w->world);
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
        double t0 = dt_now();
        dt_status st;
        if (w->world > 1) {
            snprintf(path, sizeof path, "%s/step-%08lld", w->dir, (long long)s.step);
            st = write_sharded(w, path, &s);
        } else {
            snprintf(path, sizeof path, "%s/step-%08lld.safetensors", w->dir, (long long)s.step);
            st = dt_ckpt_write(path, &w->snap, &s);
        }
        if (st == DT_OK && w->rank == 0) prune(w->dir, w->keep);
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

dt_status dt_ckpt_writer_create(dt_ckpt_writer **out, const char *dir, int keep, const dt_ckpt_model *m, int rank,
                                int world, double shard_timeout) {
    *out = NULL;
    dt_status st = dt_make_dirs(dir);
    if (st != DT_OK) return st;
    dt_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_NOMEM, "out of memory");
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->keep = keep < 1 ? 1 : keep;
    w->rank = rank;
    w->world = world;
    w->shard_timeout = shard_timeout;
    w->begin = 0;
    w->end = m->nparams;
    if (world > 1) dt_shard_range(m->nparams, rank, world, &w->begin, &w->end);
    size_t len = w->end - w->begin;
    w->live = *m;
    w->snap = *m;
    w->buf = dt_alloc(sizeof(float) * (len ? len : 1) * (size_t)(1 + m->nstates));
    if (!w->buf) {
        free(w);
        return dt_error(DT_ERR_NOMEM, "checkpoint snapshot: out of memory (%zu parameters)", m->nparams);
    }
    w->snap.params = w->buf;
    for (int j = 0; j < m->nstates; j++) w->snap.states[j] = w->buf + len * (size_t)(1 + j);
    w->snap.opt_step = &w->snap_step;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        dt_ckpt_writer_free(w);
        return dt_error(DT_ERR_INTERNAL, "cannot start the checkpoint writer thread");
    }
    w->started = 1;
    // Temp files of a writer that was killed mid-write, and sharded
    // checkpoints never completed (before any rank of this run writes).
    DIR *d = rank == 0 ? opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[4400], c[4500];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        snprintf(c, sizeof c, "%s/COMPLETE", p);
        if (strstr(e->d_name, ".safetensors.tmp.")) unlink(p);
        else if (step_of(e->d_name) >= 0 && is_dir(p) && access(c, F_OK) != 0) remove_ckpt(p);
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
        size_t len = w->end - w->begin;
        memcpy(w->snap.params, w->live.params + w->begin, sizeof(float) * len);
        for (int j = 0; j < w->live.nstates; j++)
            memcpy(w->snap.states[j], w->live.states[j] + w->begin, sizeof(float) * len);
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
    // The writer thread may still be writing (after a failed step nobody
    // waits for it) and updates max_write under the mutex. Locking does not
    // change the writer's state, hence the cast of the const argument.
    pthread_mutex_t *mu = (pthread_mutex_t *)&w->mu;
    pthread_mutex_lock(mu);
    if (max_write) *max_write = w->max_write;
    if (saves) *saves = w->saves;
    if (max_pause) *max_pause = w->max_pause;
    if (total_pause) *total_pause = w->total_pause;
    pthread_mutex_unlock(mu);
}

void dt_ckpt_writer_free(dt_ckpt_writer *w) {
    if (!w) return;
    w->cancel = 1;
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
