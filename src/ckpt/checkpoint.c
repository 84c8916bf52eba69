/* Training checkpoints: one safetensors file with the weights, the
 * optimizer state and the loop's position, verified by a CRC-32C; the
 * newest-valid search used by --resume; a background writer. */
#include "dtrain/ckpt.h"
#include "ckpt/st_impl.h"

#include "core/file.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
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
// fp16's dynamic loss scaler, "SCALE CLEAN SKIPPED" (the scale as a hex
// float): only in the checkpoints of runs that have one. A checkpoint
// without it (written before it existed, or by a bf16/fp32 run) resumes
// an fp16 run at the scaler's defaults. The checksum covers it after the
// keys above when it is there.
#define KEY_SCALER "loss_scaler"

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const dt_st_tensor *const *)a)->name, (*(const dt_st_tensor *const *)b)->name);
}

// The checksum: a CRC-32C over the tensors in name order (each one's name,
// dtype, shape, then bytes), the metadata values in key order, then the
// scaler's value (NULL: none).
static uint32_t crc_head(uint32_t c, const dt_st_tensor *t) {
    c = dt_crc32c(c, t->name, strlen(t->name) + 1);
    int32_t d[2] = {(int32_t)t->dtype, t->ndim};
    c = dt_crc32c(c, d, sizeof d);
    return dt_crc32c(c, t->shape, sizeof(int64_t) * t->ndim);
}

static uint32_t crc_meta(uint32_t c, const char *const *vals, const char *scaler) {
    for (int k = 0; k < NKEYS; k++) c = dt_crc32c(c, vals[k], strlen(vals[k]) + 1);
    return scaler ? dt_crc32c(c, scaler, strlen(scaler) + 1) : c;
}

// t[n] sorted by name, in a malloc'd array; NULL (recorded) when out of memory.
static const dt_st_tensor **by_name(const dt_st_tensor *const *t, int n, const char *what) {
    const dt_st_tensor **s = malloc(sizeof *s * (n > 0 ? n : 1));
    if (!s) {
        dt_error(DT_ERR_NOMEM, "%s: out of memory", what);
        return NULL;
    }
    memcpy(s, t, sizeof *s * n);
    qsort(s, n, sizeof *s, cmp_tensor_name);
    return s;
}

// The checksum of tensors whose bytes are in memory (a checkpoint being written).
static dt_status checksum(const dt_st_tensor *const *t, int n, const char *const *vals, const char *scaler,
                          const char *what, uint32_t *out) {
    const dt_st_tensor **s = by_name(t, n, what);
    if (!s) return DT_ERR_NOMEM;
    uint32_t c = 0;
    for (int i = 0; i < n; i++) c = dt_crc32c(crc_head(c, s[i]), s[i]->data, s[i]->nbytes);
    *out = crc_meta(c, vals, scaler);
    free(s);
    return DT_OK;
}

static dt_status crc_piece(void *user, const dt_st_tensor *t, size_t at, const void *bytes, size_t len) {
    uint32_t *c = user;
    if (at == 0) *c = crc_head(*c, t);
    *c = dt_crc32c(*c, bytes, len);
    return DT_OK;
}

// The checksum of a file's tensors, read in the streaming pass (dt_st_scan,
// which counts the NaN and Inf values on the way).
static dt_status checksum_file(dt_st_file *f, const char *const *vals, const char *scaler, const char *what,
                               uint32_t *out) {
    int n = dt_st_count(f);
    const dt_st_tensor **tp = malloc(sizeof *tp * (n > 0 ? n : 1)), **s = NULL;
    if (!tp) return dt_error(DT_ERR_NOMEM, "%s: out of memory", what);
    for (int i = 0; i < n; i++) tp[i] = dt_st_get(f, i);
    s = by_name(tp, n, what);
    free(tp);
    if (!s) return DT_ERR_NOMEM;
    uint32_t c = 0;
    dt_status st = dt_st_scan(f, s, crc_piece, &c);
    free(s);
    *out = crc_meta(c, vals, scaler);
    return st;
}

// FNV-1a of the config text: a short name for "the same config".
static uint64_t config_hash(const char *text) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

#define MAX_TENSORS 4096

static const char *const state_names[2] = {"optimizer.state.0", "optimizer.state.1"};

// What m's buffers hold (ckpt.h): [*plo, *phi) of the parameter block and
// [*slo, *shi) of each optimizer state (m's fields: hi 0 means all).
// A model of state_only holds none of them: [0, 0).
static void held(const dt_ckpt_model *m, size_t *plo, size_t *phi, size_t *slo, size_t *shi) {
    if (m->state_only) {
        *plo = *phi = *slo = *shi = 0;
        return;
    }
    *plo = m->params_hi ? m->params_lo : 0;
    *phi = m->params_hi ? m->params_hi : m->nparams;
    *slo = m->states_hi ? m->states_lo : 0;
    *shi = m->states_hi ? m->states_hi : m->nparams;
}

static int holds_all(const dt_ckpt_model *m) {
    size_t plo, phi, slo, shi;
    if (m->state_only) return 0;
    held(m, &plo, &phi, &slo, &shi);
    return plo == 0 && phi == m->nparams && slo == 0 && shi == m->nparams;
}

// The part of tensor t of f, block positions [lo, hi), that falls inside
// [dlo, dhi), read into dst (dst[0] is position dlo): only those bytes.
static dt_status read_overlap(float *dst, size_t dlo, size_t dhi, const dt_st_file *f, const dt_st_tensor *t,
                              size_t lo, size_t hi) {
    size_t a = lo > dlo ? lo : dlo, b = hi < dhi ? hi : dhi;
    return a < b ? dt_st_read(f, t, a - lo, b - a, DT_F32, dst + (a - dlo)) : DT_OK;
}

// A checkpoint's metadata: the values in key order (vals, pointing into
// the struct itself: not to be copied), the loss scaler's ("" none), and,
// once the checksum is known (meta_sum), the file's metadata list.
typedef struct {
    char num[NKEYS][64], rng[80], hash[24], crc[16], wmeta[2048], scaler[96], shard[128];
    const char *vals[NKEYS];
    dt_st_meta meta[NKEYS + 2];
    int nmeta;
} ckpt_meta;

// shard: "" for a whole checkpoint, "BEGIN:END:NPARAMS:RANK:WORLD" for a shard.
static void meta_make(ckpt_meta *k, const dt_ckpt_model *m, const dt_train_state *s, const char *shard) {
    k->wmeta[0] = k->scaler[0] = 0;
    // The weights file's metadata as "key=value" lines.
    for (int i = 0; i < m->nweights_meta; i++) {
        size_t l = strlen(k->wmeta);
        snprintf(k->wmeta + l, sizeof k->wmeta - l, "%s=%s\n", m->weights_meta[i].key, m->weights_meta[i].value);
    }
    snprintf(k->num[K_VERSION], 64, "%d", DT_CKPT_VERSION);
    snprintf(k->num[K_STEP], 64, "%" PRId64, s->step);
    snprintf(k->num[K_EPOCH], 64, "%" PRId64, s->epoch);
    snprintf(k->num[K_EPOCH_BATCH], 64, "%" PRId64, s->epoch_batch);
    snprintf(k->num[K_EPOCH_STEPS], 64, "%" PRId64, s->epoch_steps);
    snprintf(k->num[K_EPOCH_LOSS], 64, "%a", s->epoch_loss);  // hex float: exact
    snprintf(k->num[K_WORLD], 64, "%d", s->world);
    snprintf(k->rng, sizeof k->rng, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, s->rng.s[0], s->rng.s[1],
             s->rng.s[2], s->rng.s[3]);
    const char *cfg = m->config ? m->config : "";
    snprintf(k->hash, sizeof k->hash, "%016" PRIx64, config_hash(cfg));
    for (int i = 0; i < NKEYS; i++) k->vals[i] = k->num[i];
    k->vals[K_FORMAT] = *shard ? "dtrain-checkpoint-shard" : "dtrain-checkpoint";
    k->vals[K_RNG] = k->rng;
    k->vals[K_OPTIMIZER] = m->optimizer ? m->optimizer : "";
    k->vals[K_CONFIG] = cfg;
    k->vals[K_CONFIG_HASH] = k->hash;
    k->vals[K_WEIGHTS_META] = k->wmeta;
    snprintf(k->shard, sizeof k->shard, "%s", shard);
    k->vals[K_SHARD] = k->shard;
    k->vals[K_DTRAIN_VERSION] = dt_version();
    if (s->loss_scale > 0)
        snprintf(k->scaler, sizeof k->scaler, "%a %" PRId64 " %" PRId64, (double)s->loss_scale, s->scale_clean,
                 s->scale_skipped);
}

// The metadata list with the checksum `sum` (always 8 hex digits: a file's
// header has the same length whatever its checksum).
static void meta_sum(ckpt_meta *k, uint32_t sum) {
    snprintf(k->crc, sizeof k->crc, "%08x", sum);
    for (int i = 0; i < NKEYS; i++) k->meta[i] = (dt_st_meta){keys[i], k->vals[i]};
    k->meta[NKEYS] = (dt_st_meta){"checksum", k->crc};
    k->nmeta = NKEYS + 1;
    if (*k->scaler) k->meta[k->nmeta++] = (dt_st_meta){KEY_SCALER, k->scaler};
}

// Writes tensors t[n] with the training state as metadata and the checksum.
static dt_status write_ckpt(const char *path, const dt_st_tensor *t, int n, const dt_ckpt_model *m,
                            const dt_train_state *s, const char *shard) {
    const dt_st_tensor **tp = calloc((size_t)n, sizeof *tp);
    ckpt_meta *k = malloc(sizeof *k);
    if (!tp || !k) {
        free(tp);
        free(k);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < n; i++) tp[i] = &t[i];
    meta_make(k, m, s, shard);
    uint32_t sum = 0;
    dt_status st = checksum(tp, n, k->vals, *k->scaler ? k->scaler : NULL, path, &sum);
    free(tp);
    if (st == DT_OK) {
        meta_sum(k, sum);
        st = dt_st_write(path, t, n, k->meta, k->nmeta);
    }
    free(k);
    return st;
}

dt_status dt_ckpt_write(const char *path, const dt_ckpt_model *m, const dt_train_state *s) {
    int n = m->ntensors + m->nstates + 1;
    if (m->ntensors < 0 || n > MAX_TENSORS) return dt_error(DT_ERR_ARG, "%s: %d tensors", path, m->ntensors);
    if (!holds_all(m))
        return dt_error(DT_ERR_ARG, "%s: a whole checkpoint needs the whole state; this rank holds a slice (write sharded checkpoints)",
                        path);
    if (m->extra)
        return dt_error(DT_ERR_ARG, "%s: a whole checkpoint is rank 0's alone; every rank keeps state of its own (write sharded checkpoints)",
                        path);
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

// m's extra tensors (the state a rank keeps for itself) into t, *n of
// them; `what` names the file or snapshot in an error.
static dt_status extra_tensors(const dt_ckpt_model *m, dt_st_tensor *t, const char *what, int *n) {
    *n = m->extra ? m->extra(m->extra_user, t, DT_CKPT_MAX_EXTRA) : 0;
    if (*n < 0) return dt_error(DT_ERR_NOMEM, "%s: %s", what, dt_last_error());
    if (*n > DT_CKPT_MAX_EXTRA)
        return dt_error(DT_ERR_ARG, "%s: %d extra tensors, at most %d", what, *n, DT_CKPT_MAX_EXTRA);
    return DT_OK;
}

// A shard's tensors: the slice [begin, end) of the parameter block and of
// each optimizer state, as "params" and "optimizer.state.J" (their data m's
// buffers, which hold that slice at their start: a snapshot; NULL in a
// model of state_only), the step count, and the rank's extra state; into
// t[4 + DT_CKPT_MAX_EXTRA], *n of them.
static dt_status shard_tensors(const dt_ckpt_model *m, size_t begin, size_t end, const char *what, dt_st_tensor *t,
                               int *n) {
    int64_t len = (int64_t)(end - begin);
    int k = 0;
    t[k++] = (dt_st_tensor){"params", DT_F32, 1, {len}, m->params, (size_t)len * sizeof(float)};
    for (int j = 0; j < m->nstates; j++)
        t[k++] = (dt_st_tensor){state_names[j], DT_F32, 1, {len}, m->states[j], (size_t)len * sizeof(float)};
    t[k++] = (dt_st_tensor){"optimizer.step", DT_I64, 1, {1}, m->opt_step, sizeof(int64_t)};
    int nx;
    dt_status st = extra_tensors(m, t + k, what, &nx);
    *n = k + (st == DT_OK ? nx : 0);
    return st;
}

static void shard_label(char *buf, size_t n, const dt_ckpt_model *m, size_t begin, size_t end, int rank, int world) {
    snprintf(buf, n, "%zu:%zu:%zu:%d:%d", begin, end, m->nparams, rank, world);
}

static dt_status write_shard(const char *path, const dt_ckpt_model *m, const dt_train_state *s, size_t begin,
                             size_t end, int rank, int world) {
    dt_st_tensor t[4 + DT_CKPT_MAX_EXTRA];
    int n;
    dt_status st = shard_tensors(m, begin, end, path, t, &n);
    if (st != DT_OK) return st;
    char shard[128];
    shard_label(shard, sizeof shard, m, begin, end, rank, world);
    return write_ckpt(path, t, n, m, s, shard);
}

// ----------------------------------------------------------------------------
// the one verified reader
//
// Every reader of a checkpoint or weights file (resume, eval, sample,
// convert, inspect, export, init_from) opens it through open_verified: a
// sharded checkpoint's directory becomes a view of its verified shards
// (gather); a file that carries a checkpoint's metadata is verified (format
// version, checksum, every value in range) before anyone uses it. None is
// read into memory: the verification streams it a piece at a time, then
// each reader reads the ranges it needs (dt_st_read).

// Limits of the integers a checkpoint or its index may hold: beyond them a
// value is damage, not a run, and arithmetic on it could wrap around.
#define MAX_COUNT ((int64_t)1 << 50)  // steps, batches, parameters
#define MAX_EPOCH ((int64_t)1 << 30)
#define MAX_WORLD ((int64_t)1 << 20)
#define MAX_DIM ((int64_t)1 << 40)

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

// Whether f carries a checkpoint's metadata: its format says so, or two of
// the keys only dtrain checkpoints have are there. A bit flip damages one
// key or the format value, never both, so a damaged checkpoint is still
// verified, not taken for plain weights; other tools' weights, which may
// use a key such as "config", are not taken for checkpoints.
static int looks_like_ckpt(const dt_st_file *f) {
    static const char *const own[] = {"checksum", "format_version", "config_hash", "weights_meta", "epoch_batch",
                                      "epoch_steps", "epoch_loss"};
    const char *fmt = dt_st_meta_get(f, "format");
    if (fmt && !strncmp(fmt, "dtrain-checkpoint", 17)) return 1;
    int n = 0;
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) n += dt_st_meta_get(f, own[k]) != NULL;
    return n >= 2;
}

// The training state in a checkpoint's metadata values (and the loss
// scaler's, NULL: none), every one in range.
static dt_status parse_state(const char **vals, const char *scaler, const char *path, dt_train_state *out) {
    dt_train_state ns = {0};
    int64_t world = 0;
    const struct { int key; int64_t lo, hi; int64_t *to; } ints[] = {
        {K_STEP, 0, MAX_COUNT, &ns.step},         {K_EPOCH, 0, MAX_EPOCH, &ns.epoch},
        {K_EPOCH_BATCH, 0, MAX_COUNT, &ns.epoch_batch}, {K_EPOCH_STEPS, 0, MAX_COUNT, &ns.epoch_steps},
        {K_WORLD, 1, MAX_WORLD, &world}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (!parse_i64(vals[ints[i].key], ints[i].to) || *ints[i].to < ints[i].lo || *ints[i].to > ints[i].hi)
            return dt_error(DT_ERR_FORMAT, "%s: metadata '%s' is '%.40s', expected a whole number from %lld to %lld",
                            path, keys[ints[i].key], vals[ints[i].key], (long long)ints[i].lo, (long long)ints[i].hi);
    char *end;
    ns.epoch_loss = strtod(vals[K_EPOCH_LOSS], &end);
    if (!*vals[K_EPOCH_LOSS] || *end || !isfinite(ns.epoch_loss))
        return dt_error(DT_ERR_FORMAT, "%s: metadata 'epoch_loss' is '%.40s', expected a finite number", path,
                        vals[K_EPOCH_LOSS]);
    int ok = strlen(vals[K_RNG]) == 64;
    for (int i = 0; ok && i < 4; i++) {
        char part[17];
        memcpy(part, vals[K_RNG] + 16 * i, 16);
        part[16] = 0;
        ns.rng.s[i] = strtoull(part, &end, 16);
        ok = !*end && isxdigit((unsigned char)part[0]);
    }
    if (!ok) return dt_error(DT_ERR_FORMAT, "%s: metadata 'rng' is not 64 hexadecimal digits", path);
    if (scaler) {
        double scale = strtod(scaler, &end);
        long long clean = -1, skipped = -1;
        int used = 0;
        ok = *scaler && *end == ' ' && isfinite(scale) && scale > 0 && scale <= 0x1p127 &&
             sscanf(end, " %lld %lld%n", &clean, &skipped, &used) == 2 && !end[used] && clean >= 0 &&
             clean <= MAX_COUNT && skipped >= 0 && skipped <= MAX_COUNT;
        if (!ok)
            return dt_error(DT_ERR_FORMAT, "%s: metadata '" KEY_SCALER "' is '%.60s', expected a scale above 0 and two "
                            "whole numbers from 0 to %lld (clean and skipped steps)", path, scaler, (long long)MAX_COUNT);
        ns.loss_scale = (float)scale;
        ns.scale_clean = clean;
        ns.scale_skipped = skipped;
    }
    ns.world = (int)world;
    *out = ns;
    return DT_OK;
}

enum { KIND_WEIGHTS, KIND_WHOLE, KIND_SHARD };

// Verifies f, which looks like a checkpoint: a format version this build
// reads, every metadata key, the checksum (the streaming pass: the file is
// read once, a piece at a time, and the NaN/Inf count comes with it), then
// the values the checksum covers (format, training state, optimizer step) in
// range. vals gets the metadata values, *s the training state, *kind whole
// or shard.
// verify = 0: what the file says, without the checksum pass (a checkpoint
// another reader of the run verified: dt_ckpt_model.verified).
static dt_status check_ckpt(dt_st_file *f, const char *path, const char **vals, dt_train_state *s, int *kind,
                            int verify) {
    int64_t ver;
    const char *v = dt_st_meta_get(f, "format_version");
    if (!parse_i64(v, &ver))
        return dt_error(DT_ERR_FORMAT, "%s: bad format_version '%.40s'", path, v ? v : "none");
    if (ver != DT_CKPT_VERSION)
        return dt_error(DT_ERR_CONFIG, "%s: checkpoint format version %lld, this dtrain %s reads version %d", path,
                        (long long)ver, dt_version(), DT_CKPT_VERSION);
    dt_status st = get_meta(f, path, vals);
    if (st != DT_OK) return st;
    char crc[16];
    const char *scaler = dt_st_meta_get(f, KEY_SCALER);
    uint32_t sum = 0;
    if (verify && (st = checksum_file(f, vals, scaler, path, &sum)) != DT_OK) return st;
    snprintf(crc, sizeof crc, "%08x", sum);
    const char *want = dt_st_meta_get(f, "checksum");
    if (verify && (!want || strcmp(want, crc)))
        return dt_error(DT_ERR_FORMAT, "%s: checksum mismatch (stored %.16s, computed %s): the file is damaged", path,
                        want ? want : "none", crc);
    // Sound bytes; now what they say.
    int shard = !strcmp(vals[K_FORMAT], "dtrain-checkpoint-shard");
    if (!shard && strcmp(vals[K_FORMAT], "dtrain-checkpoint"))
        return dt_error(DT_ERR_FORMAT, "%s: format '%.40s' with a checkpoint's metadata", path, vals[K_FORMAT]);
    if (shard != !!*vals[K_SHARD])
        return dt_error(DT_ERR_FORMAT, "%s: metadata 'shard' '%.40s' does not fit format '%s'", path, vals[K_SHARD],
                        vals[K_FORMAT]);
    if ((st = parse_state(vals, scaler, path, s)) != DT_OK) return st;
    const dt_st_tensor *step;
    int64_t one = 1, opt_step;
    if ((st = dt_st_expect(f, path, "optimizer.step", DT_I64, 1, &one, DT_ERR_FORMAT, &step)) != DT_OK ||
        (st = dt_st_read(f, step, 0, 1, DT_I64, &opt_step)) != DT_OK)
        return st;
    if (opt_step < 0 || opt_step > MAX_COUNT)
        return dt_error(DT_ERR_FORMAT, "%s: tensor 'optimizer.step' is %lld, expected 0 to %lld", path,
                        (long long)opt_step, (long long)MAX_COUNT);
    *kind = shard ? KIND_SHARD : KIND_WHOLE;
    return DT_OK;
}

// Paths are files or objects (s3://, dtrain/core.h): a sharded checkpoint's
// directory is a prefix there.
static int is_dir(const char *path) {
    int k;
    return dt_path_kind(path, &k, NULL) == DT_OK && k == 2;
}

// Whether a checkpoint of dt_ckpt_list is sharded (a step-N directory) or
// whole (step-N.safetensors): its name says, with no look (a request each
// in object storage).
static int sharded_name(const char *path) {
    size_t l = strlen(path);
    return l < 12 || strcmp(path + l - 12, ".safetensors") != 0;
}

// Whether path is there: *there 1 or 0, or an error when that cannot be
// told (object storage that does not answer), which is never taken for
// "not there": nothing is skipped or deleted on a guess.
static dt_status there(const char *path, int *yes) {
    int k;
    dt_status st = dt_path_kind(path, &k, NULL);
    *yes = st == DT_OK && k != 0;
    return st;
}

static dt_status gather(const char *dir, dt_st_file **out, const char **vals, dt_train_state *s, int *kind,
                        int verify);

// Opens path (a file, or a sharded checkpoint's directory, gathered as a
// view of its verified shards) and verifies it when it is a checkpoint
// (verify = 0: checks what it says alone, check_ckpt).
// *kind: KIND_WEIGHTS (vals and *s untouched), KIND_WHOLE or KIND_SHARD.
// The checkpoint's values are read only as far as the checksum needs (a
// piece at a time); the caller reads the ranges it needs (dt_st_read).
static dt_status open_verified(const char *path, dt_st_file **out, const char **vals, dt_train_state *s,
                               int *kind, int verify) {
    if (is_dir(path)) return gather(path, out, vals, s, kind, verify);
    dt_st_file *f;
    dt_status st = dt_st_open(&f, path);
    if (st != DT_OK) return st;
    *kind = KIND_WEIGHTS;
    if (looks_like_ckpt(f) && (st = check_ckpt(f, path, vals, s, kind, verify)) != DT_OK) {
        dt_st_close(f);
        return st;
    }
    *out = f;
    return DT_OK;
}

static dt_status open_ckpt(const char *path, dt_st_file **out, int *is_ckpt, int verify) {
    const char *vals[NKEYS];
    dt_train_state s;
    int kind;
    dt_status st = open_verified(path, out, vals, &s, &kind, verify);
    if (st != DT_OK) return st;
    if (kind == KIND_SHARD) {
        dt_st_close(*out);
        *out = NULL;
        return dt_error(DT_ERR_CONFIG, "%s: one shard of a sharded checkpoint (give its directory, step-N/)", path);
    }
    if (is_ckpt) *is_ckpt = kind == KIND_WHOLE;
    return DT_OK;
}

dt_status dt_ckpt_open(const char *path, dt_st_file **out, int *is_ckpt) { return open_ckpt(path, out, is_ckpt, 1); }

// The error for a file that is not the checkpoint wanted.
static dt_status not_a_ckpt(const char *path, int kind, const dt_st_file *f) {
    if (kind == KIND_SHARD)
        return dt_error(DT_ERR_CONFIG, "%s: one shard of a sharded checkpoint (give its directory, step-N/)", path);
    const char *fmt = dt_st_meta_get(f, "format");
    return dt_error(DT_ERR_CONFIG, "%s: not a dtrain checkpoint (format '%.40s'; weights alone cannot resume a run)",
                    path, fmt ? fmt : "none");
}

static dt_status read_sharded(const char *dir, const dt_ckpt_model *m, dt_train_state *s);

// The config a checkpoint was written with against the run's (m->config):
// the model's check, or a warning.
static dt_status check_config(const dt_ckpt_model *m, const char *path, const char **vals) {
    if (!m->config || !strcmp(vals[K_CONFIG], m->config)) return DT_OK;
    if (m->config_check) return m->config_check(m->config_user, path, vals[K_CONFIG]);
    dt_log(DT_LOG_WARN, "%s: written with a different config (hash %.16s); continuing with this one", path,
           vals[K_CONFIG_HASH]);
    return DT_OK;
}

dt_status dt_ckpt_read(const char *path, const dt_ckpt_model *m, dt_train_state *s) {
    if (is_dir(path)) return read_sharded(path, m, s);
    dt_st_file *f;
    const char *vals[NKEYS];
    dt_train_state ns;
    int kind;
    dt_status st = open_verified(path, &f, vals, &ns, &kind, !m->verified);
    if (st != DT_OK) return st;
    // Check everything before touching the caller's buffers.
    const dt_st_tensor *w[MAX_TENSORS], *states[2] = {0}, *step = NULL;
    if (kind != KIND_WHOLE) {
        st = not_a_ckpt(path, kind, f);
        goto done;
    }
    if (m->ntensors > MAX_TENSORS) {
        st = dt_error(DT_ERR_ARG, "%s: %d tensors", path, m->ntensors);
        goto done;
    }
    for (int i = 0; i < m->ntensors && st == DT_OK; i++)
        st = dt_st_expect(f, path, m->tensors[i].name, DT_F32, m->tensors[i].ndim, m->tensors[i].shape, DT_ERR_CONFIG, &w[i]);
    if (st != DT_OK) goto done;
    const char *opt = m->optimizer ? m->optimizer : "";
    if (strcmp(vals[K_OPTIMIZER], opt)) {
        st = dt_error(DT_ERR_CONFIG, "%s: written with optimizer '%.40s', this run uses '%s'", path, vals[K_OPTIMIZER],
                      opt);
        goto done;
    }
    int64_t np = (int64_t)m->nparams, one = 1;
    for (int j = 0; j < m->nstates && st == DT_OK; j++)
        st = dt_st_expect(f, path, state_names[j], DT_F32, 1, &np, DT_ERR_CONFIG, &states[j]);
    if (st == DT_OK) st = dt_st_expect(f, path, "optimizer.step", DT_I64, 1, &one, DT_ERR_CONFIG, &step);
    if (st == DT_OK) st = check_config(m, path, vals);
    if (st == DT_OK && !m->verified) st = dt_st_check_finite(f, path);
    if (st != DT_OK) goto done;
    // Only this rank's part of each tensor is read (its slice: held()).
    size_t plo, phi, slo, shi;
    held(m, &plo, &phi, &slo, &shi);
    for (int i = 0; i < m->ntensors && st == DT_OK; i++)
        st = read_overlap(m->params, plo, phi, f, w[i], m->tensors[i].offset, m->tensors[i].offset + m->tensors[i].numel);
    for (int j = 0; j < m->nstates && st == DT_OK; j++)
        st = read_overlap(m->states[j], slo, shi, f, states[j], 0, m->nparams);
    if (st == DT_OK) st = dt_st_read(f, step, 0, 1, DT_I64, m->opt_step);
    if (st == DT_OK) *s = ns;
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

// A worker's own file beside the servers' shards (dt_ckpt_write_own).
static void own_path(char *buf, size_t n, const char *dir, int rank, int world) {
    snprintf(buf, n, "%s/worker-%05d-of-%05d.safetensors", dir, rank, world);
}

// The CRC-32C of an index without its "checksum" (its compact JSON, which
// cJSON prints the same from the same values), as 8 hex digits.
static int index_sum(cJSON *o, char out[16]) {
    cJSON *had = cJSON_DetachItemFromObjectCaseSensitive(o, "checksum");
    char *text = cJSON_PrintUnformatted(o);
    if (text) snprintf(out, 16, "%08x", dt_crc32c(0, text, strlen(text)));
    free(text);
    if (had) cJSON_AddItemToObject(o, "checksum", had);
    return text != NULL;
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
    char path[4400], sum[16];
    snprintf(path, sizeof path, "%s/index.json", dir);
    if (!index_sum(o, sum)) {
        cJSON_Delete(o);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    cJSON_AddStringToObject(o, "checksum", sum);
    dt_status st = dt_json_write(path, o);
    if (st != DT_OK) return st;
    snprintf(path, sizeof path, "%s/COMPLETE", dir);
    const void *parts[] = {""};
    size_t sizes[] = {0};
    return dt_write_atomic(path, parts, sizes, 1);
}

// A sharded checkpoint's index.json, every value checked before it is used.
typedef struct {
    const char *file;
    size_t begin, end;
} index_shard;

typedef struct {
    cJSON *root;                 // owns the strings below
    int64_t step, world, nparams, nstates;
    const char *optimizer;
    int ntensors;
    dt_tensor_info *tensors;     // within [0, nparams)
    index_shard *shards;         // world of them, covering [0, nparams) in order
} ckpt_index;

static void index_free(ckpt_index *ix) {
    cJSON_Delete(ix->root);
    free(ix->tensors);
    free(ix->shards);
    memset(ix, 0, sizeof *ix);
}

// v as a whole number in [lo, hi].
static int whole(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) ||
        v->valuedouble != floor(v->valuedouble))
        return 0;
    *out = (int64_t)v->valuedouble;
    return 1;
}

// o's field key as a whole number in [lo, hi], else an error naming it
// (where: "" or "tensor 3 ", "shard 1 ").
static dt_status index_int(const cJSON *o, const char *key, const char *where, const char *path, int64_t lo,
                           int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (whole(v, lo, hi, out)) return DT_OK;
    char got[40] = "missing or not a number";
    if (cJSON_IsNumber(v)) snprintf(got, sizeof got, "%.17g", v->valuedouble);
    return dt_error(DT_ERR_FORMAT, "%s: %s\"%s\" is %s, expected a whole number from %lld to %lld", path, where, key,
                    got, (long long)lo, (long long)hi);
}

static int cmp_offset(const void *a, const void *b) {
    const dt_tensor_info *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

// The tensors cover [0, nparams) exactly once: in order of offset, each
// begins where the one before ends.
static dt_status index_covers(const ckpt_index *ix, const char *path) {
    dt_tensor_info *t = malloc(sizeof *t * (size_t)ix->ntensors);
    if (!t) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    memcpy(t, ix->tensors, sizeof *t * (size_t)ix->ntensors);
    qsort(t, (size_t)ix->ntensors, sizeof *t, cmp_offset);
    size_t next = 0;
    dt_status st = DT_OK;
    for (int i = 0; i < ix->ntensors && st == DT_OK; next = t[i].offset + t[i].numel, i++)
        if (t[i].offset != next)
            st = dt_error(DT_ERR_FORMAT, "%s: tensor '%.64s' at offset %zu %s the tensor before (which ends at %zu): "
                          "the tensors must cover the block once", path, t[i].name, t[i].offset,
                          t[i].offset < next ? "overlaps" : "leaves a gap after", next);
    if (st == DT_OK && next != (size_t)ix->nparams)
        st = dt_error(DT_ERR_FORMAT, "%s: the tensors end at %zu of \"nparams\" %lld: the tensors must cover the block "
                      "once", path, next, (long long)ix->nparams);
    free(t);
    return st;
}

// Parses index.json text (len bytes; path names it in errors).
static dt_status index_parse(const char *text, size_t len, const char *path, ckpt_index *ix) {
    memset(ix, 0, sizeof *ix);
    cJSON *o = ix->root = cJSON_ParseWithLength(text, len);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(o, "optimizer");
    const cJSON *tj = cJSON_GetObjectItemCaseSensitive(o, "tensors"), *sj = cJSON_GetObjectItemCaseSensitive(o, "shards");
    if (!cJSON_IsObject(o) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "dtrain-checkpoint-index"))
        return dt_error(DT_ERR_FORMAT, "%s: not a JSON object with format \"dtrain-checkpoint-index\"", path);
    int64_t ver;
    dt_status st = index_int(o, "format_version", "", path, 0, INT32_MAX, &ver);
    if (st != DT_OK) return st;
    if (ver != DT_CKPT_VERSION)
        return dt_error(DT_ERR_CONFIG, "%s: checkpoint format version %lld, this dtrain %s reads version %d", path,
                        (long long)ver, dt_version(), DT_CKPT_VERSION);
    if ((st = index_int(o, "step", "", path, 0, MAX_COUNT, &ix->step)) != DT_OK ||
        (st = index_int(o, "world_size", "", path, 1, MAX_WORLD, &ix->world)) != DT_OK ||
        (st = index_int(o, "nparams", "", path, 1, MAX_COUNT, &ix->nparams)) != DT_OK ||
        (st = index_int(o, "nstates", "", path, 0, 2, &ix->nstates)) != DT_OK)
        return st;
    if (!cJSON_IsString(opt)) return dt_error(DT_ERR_FORMAT, "%s: \"optimizer\" is not a string", path);
    ix->optimizer = opt->valuestring;
    int nt = cJSON_GetArraySize(tj), ns = cJSON_GetArraySize(sj);
    if (!cJSON_IsArray(tj) || nt < 1 || nt > MAX_TENSORS)
        return dt_error(DT_ERR_FORMAT, "%s: \"tensors\" must list 1 to %d tensors (%d)", path, MAX_TENSORS, nt);
    if (!cJSON_IsArray(sj) || ns != ix->world)
        return dt_error(DT_ERR_FORMAT, "%s: \"shards\" must list world_size = %lld shards (%d)", path,
                        (long long)ix->world, ns);
    ix->tensors = calloc((size_t)nt, sizeof *ix->tensors);
    ix->shards = calloc((size_t)ns, sizeof *ix->shards);
    if (!ix->tensors || !ix->shards) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    size_t np = (size_t)ix->nparams;
    const cJSON *e;
    cJSON_ArrayForEach(e, tj) {
        dt_tensor_info *t = &ix->tensors[ix->ntensors];
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name"), *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        char where[40];
        snprintf(where, sizeof where, "tensor %d ", ix->ntensors);
        int nd = cJSON_GetArraySize(sh);
        if (!cJSON_IsString(nm) || !*nm->valuestring || !cJSON_IsArray(sh) || nd > 4)
            return dt_error(DT_ERR_FORMAT, "%s: %sneeds a \"name\" and a \"shape\" of at most 4 dimensions", path, where);
        t->name = nm->valuestring;
        t->numel = 1;
        const cJSON *d;
        cJSON_ArrayForEach(d, sh) {
            int64_t dim;
            if (!whole(d, 0, MAX_DIM, &dim))
                return dt_error(DT_ERR_FORMAT, "%s: %s('%.64s') shape[%d] is not a whole number from 0 to %lld", path,
                                where, t->name, t->ndim, (long long)MAX_DIM);
            t->shape[t->ndim++] = dim;
            // Checked before multiplying: the product stays within nparams.
            if (dim && t->numel > np / (size_t)dim)
                return dt_error(DT_ERR_FORMAT, "%s: %s('%.64s') has more elements than \"nparams\" %zu", path, where,
                                t->name, np);
            t->numel *= (size_t)dim;
        }
        int64_t off;
        if ((st = index_int(e, "offset", where, path, 0, ix->nparams, &off)) != DT_OK) return st;
        t->offset = (size_t)off;
        if (t->numel > np - t->offset)
            return dt_error(DT_ERR_FORMAT, "%s: %s('%.64s') at offset %zu with %zu elements ends past \"nparams\" %zu",
                            path, where, t->name, t->offset, t->numel, np);
        ix->ntensors++;
    }
    size_t next = 0;
    int r = 0;
    cJSON_ArrayForEach(e, sj) {
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
        char where[40];
        snprintf(where, sizeof where, "shard %d ", r);
        int64_t b, end;
        if (!cJSON_IsString(file) || !*file->valuestring || strchr(file->valuestring, '/') ||
            file->valuestring[0] == '.' || strlen(file->valuestring) > 255)
            return dt_error(DT_ERR_FORMAT, "%s: %s\"file\" must be a file name in the checkpoint's directory", path,
                            where);
        if ((st = index_int(e, "begin", where, path, 0, ix->nparams, &b)) != DT_OK ||
            (st = index_int(e, "end", where, path, b, ix->nparams, &end)) != DT_OK)
            return st;
        if ((size_t)b != next)
            return dt_error(DT_ERR_FORMAT, "%s: %s\"begin\" %lld does not continue the shard before (%zu)", path, where,
                            (long long)b, next);
        ix->shards[r] = (index_shard){file->valuestring, (size_t)b, (size_t)end};
        next = (size_t)end;
        r++;
    }
    if (next != np)
        return dt_error(DT_ERR_FORMAT, "%s: the shards end at %zu of \"nparams\" %zu", path, next, np);
    return index_covers(ix, path);
}

// The checksum, checked once the fields are (which name what is wrong).
static dt_status index_check_sum(const ckpt_index *ix, const char *path) {
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(ix->root, "checksum");
    char sum[16];
    if (!cJSON_IsString(want)) return dt_error(DT_ERR_FORMAT, "%s: no \"checksum\" (damaged, or edited by hand)", path);
    if (!index_sum(ix->root, sum)) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    if (strcmp(sum, want->valuestring))
        return dt_error(DT_ERR_FORMAT, "%s: checksum mismatch (stored %.16s, computed %s): the index is damaged", path,
                        want->valuestring, sum);
    return DT_OK;
}

// Reads DIR/index.json of a complete sharded checkpoint, and checks the
// sizes it claims against the shard files' real sizes before anyone
// allocates for them.
static dt_status index_read(const char *dir, ckpt_index *ix) {
    memset(ix, 0, sizeof *ix);
    char path[4200];
    snprintf(path, sizeof path, "%s/COMPLETE", dir);
    int done;
    dt_status st = there(path, &done);
    if (st != DT_OK) return st;
    if (!done)
        return dt_error(DT_ERR_FORMAT, "%s: incomplete sharded checkpoint (no COMPLETE marker: not every shard was written)",
                        dir);
    snprintf(path, sizeof path, "%s/index.json", dir);
    uint8_t *buf;
    size_t len;
    if ((st = dt_read_file_gz(path, 0, &buf, &len)) != DT_OK) return st;
    st = index_parse((const char *)buf, len, path, ix);
    free(buf);
    for (int64_t r = 0; st == DT_OK && r < ix->world; r++) {
        char sp[4500];
        snprintf(sp, sizeof sp, "%s/%s", dir, ix->shards[r].file);
        int kind;
        uint64_t size;
        if ((st = dt_path_kind(sp, &kind, &size)) != DT_OK) break;
        if (kind != 1) {
            st = dt_error(DT_ERR_IO, "%s: cannot open: %s", sp, kind ? "a directory" : "no such file");
            break;
        }
        // The slice and each optimizer state, 4 bytes an element.
        unsigned long long need = (unsigned long long)(ix->shards[r].end - ix->shards[r].begin) * 4u *
                                  (unsigned long long)(1 + ix->nstates);
        if ((unsigned long long)size < need)
            st = dt_error(DT_ERR_FORMAT, "%s: shard %lld: [%zu, %zu) of \"nparams\" %lld with \"nstates\" %lld needs %llu bytes, but %s has %lld bytes",
                          path, (long long)r, ix->shards[r].begin, ix->shards[r].end, (long long)ix->nparams,
                          (long long)ix->nstates, need, ix->shards[r].file, (long long)size);
    }
    if (st == DT_OK) st = index_check_sum(ix, path);
    if (st != DT_OK) index_free(ix);
    return st;
}

// Shard r of ix, open in *out once verified (its checksum, its values
// finite: the streaming pass) and checked against the index and, for r > 0,
// against shard 0's training state *s0; vals gets its metadata, *ns its
// training state; sp[n] its path.
static dt_status open_shard(const char *dir, const ckpt_index *ix, int r, const dt_train_state *s0,
                            dt_st_file **out, const char **vals, dt_train_state *ns, char *sp, size_t n, int verify) {
    size_t b = ix->shards[r].begin, e = ix->shards[r].end, np = (size_t)ix->nparams;
    snprintf(sp, n, "%s/%s", dir, ix->shards[r].file);
    dt_st_file *f;
    int kind;
    dt_status st = open_verified(sp, &f, vals, ns, &kind, verify);
    if (st != DT_OK) return st;
    char want[128];
    snprintf(want, sizeof want, "%zu:%zu:%zu:%d:%lld", b, e, np, r, (long long)ix->world);
    int64_t len = (int64_t)(e - b), one = 1;
    const dt_st_tensor *t;
    if (verify && (st = dt_st_check_finite(f, sp)) != DT_OK) {
    } else if (kind != KIND_SHARD)
        st = dt_error(DT_ERR_FORMAT, "%s: not a checkpoint shard", sp);
    else if (strcmp(vals[K_SHARD], want))
        st = dt_error(DT_ERR_FORMAT, "%s: holds slice %.40s, the index says %s", sp, vals[K_SHARD], want);
    else if (strcmp(vals[K_OPTIMIZER], ix->optimizer))
        st = dt_error(DT_ERR_FORMAT, "%s: written with optimizer '%.40s', the index says '%.40s'", sp,
                      vals[K_OPTIMIZER], ix->optimizer);
    else if (ns->step != ix->step)
        st = dt_error(DT_ERR_FORMAT, "%s: step %lld, the index says %lld", sp, (long long)ns->step,
                      (long long)ix->step);
    else if (r > 0 && memcmp(ns, s0, sizeof *ns))
        st = dt_error(DT_ERR_FORMAT, "%s: a training state that differs from shard 0's", sp);
    if (st == DT_OK) st = dt_st_expect(f, sp, "params", DT_F32, 1, &len, DT_ERR_FORMAT, &t);
    for (int j = 0; j < ix->nstates && st == DT_OK; j++)
        st = dt_st_expect(f, sp, state_names[j], DT_F32, 1, &len, DT_ERR_FORMAT, &t);
    if (st == DT_OK) st = dt_st_expect(f, sp, "optimizer.step", DT_I64, 1, &one, DT_ERR_FORMAT, &t);
    if (st != DT_OK) {
        dt_st_close(f);
        return st;
    }
    *out = f;
    return DT_OK;
}

// Whether shard r ([b, e)) gives the optimizer's step count of a reader
// whose part starts at block position lo: the shard that holds element lo
// (shard 0's for an empty range), since writers that count apart (the
// parameter servers) each keep their own.
static int step_from(int r, size_t b, size_t e, size_t lo) { return r == 0 || (b <= lo && lo < e); }

// Every shard of ix, verified, into dst's buffers: the part of each shard
// that falls inside what dst holds (held(); its params, states and
// opt_step are written, nothing else is read from it); the training state
// (the same in every shard) into *s.
static dt_status load_shards(const char *dir, const ckpt_index *ix, const dt_ckpt_model *dst, dt_train_state *s) {
    size_t plo, phi, slo, shi;
    held(dst, &plo, &phi, &slo, &shi);
    dt_status st = DT_OK;
    for (int r = 0; r < (int)ix->world && st == DT_OK; r++) {
        size_t b = ix->shards[r].begin, e = ix->shards[r].end;
        char sp[4500];
        dt_st_file *f;
        const char *vals[NKEYS];
        dt_train_state ns;
        if ((st = open_shard(dir, ix, r, s, &f, vals, &ns, sp, sizeof sp, !dst->verified)) != DT_OK) break;
        st = read_overlap(dst->params, plo, phi, f, dt_st_find(f, "params"), b, e);
        for (int j = 0; j < ix->nstates && st == DT_OK; j++)
            st = read_overlap(dst->states[j], slo, shi, f, dt_st_find(f, state_names[j]), b, e);
        if (st == DT_OK && step_from(r, b, e, plo))
            st = dt_st_read(f, dt_st_find(f, "optimizer.step"), 0, 1, DT_I64, dst->opt_step);
        if (st == DT_OK && r == 0) *s = ns;
        if (st == DT_OK && r == 0) st = check_config(dst, sp, vals);
        dt_st_close(f);
    }
    return st;
}

static dt_status read_sharded(const char *dir, const dt_ckpt_model *m, dt_train_state *s) {
    ckpt_index ix;
    dt_status st = index_read(dir, &ix);
    if (st != DT_OK) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/index.json", dir);
    float *tmp = NULL;
    int64_t opt_step = 0;
    // The model: the same tensors at the same offsets, the same optimizer.
    if ((size_t)ix.nparams != m->nparams || ix.ntensors != m->ntensors) {
        st = dt_error(DT_ERR_CONFIG, "%s: a checkpoint of a different model (%lld parameters in %d tensors; this run has %zu in %d)",
                      path, (long long)ix.nparams, ix.ntensors, m->nparams, m->ntensors);
        goto done;
    }
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *a = &ix.tensors[i], *b = &m->tensors[i];
        int same = !strcmp(a->name, b->name) && a->offset == b->offset && a->ndim == b->ndim;
        for (int d = 0; same && d < b->ndim; d++) same = a->shape[d] == b->shape[d];
        if (!same) {
            st = dt_error(DT_ERR_CONFIG, "%s: tensor %d is not '%s' of this model's shape (a checkpoint of a different model?)",
                          path, i, b->name);
            goto done;
        }
    }
    if (strcmp(ix.optimizer, m->optimizer ? m->optimizer : "") || ix.nstates != m->nstates) {
        st = dt_error(DT_ERR_CONFIG, "%s: written with optimizer '%.40s', this run uses '%s'", path, ix.optimizer,
                      m->optimizer ? m->optimizer : "");
        goto done;
    }
    // Every shard, verified, into a scratch copy of what m holds; then the
    // caller's buffers.
    size_t plo, phi, slo, shi;
    held(m, &plo, &phi, &slo, &shi);
    size_t pn = phi - plo, sn = shi - slo;
    if (!(tmp = dt_alloc(sizeof(float) * (pn + sn * (size_t)m->nstates + 1)))) {
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    dt_ckpt_model scratch = *m;
    scratch.params = tmp;
    for (int j = 0; j < m->nstates; j++) scratch.states[j] = tmp + pn + sn * (size_t)j;
    scratch.opt_step = &opt_step;
    dt_train_state ns;
    if ((st = load_shards(dir, &ix, &scratch, &ns)) != DT_OK) goto done;
    if (pn) memcpy(m->params, tmp, sizeof(float) * pn);
    for (int j = 0; j < m->nstates && sn; j++) memcpy(m->states[j], scratch.states[j], sizeof(float) * sn);
    *m->opt_step = opt_step;
    *s = ns;
done:
    dt_free(tmp);
    index_free(&ix);
    return st;
}

static dt_status open_part(const char *path, int part, dt_st_file **out, int *parts, int verify) {
    if (out) *out = NULL;
    *parts = 1;
    const char *vals[NKEYS];
    dt_train_state s;
    int kind;
    if (!is_dir(path)) {
        if (part == -1) return DT_OK;
        if (part != 0) return dt_error(DT_ERR_ARG, "%s: a whole checkpoint has no part %d", path, part);
        dt_status st = open_verified(path, out, vals, &s, &kind, verify);
        if (st == DT_OK && kind != KIND_WHOLE) {
            st = not_a_ckpt(path, kind, *out);
            dt_st_close(*out);
            *out = NULL;
        }
        return st;
    }
    ckpt_index ix;
    dt_status st = index_read(path, &ix);
    if (st != DT_OK) return st;
    *parts = (int)ix.world;
    char sp[4500];
    if (part == -1) {
    } else if (part < 0 || part >= ix.world) {
        st = dt_error(DT_ERR_ARG, "%s: written by %lld ranks, has no part %d", path, (long long)ix.world, part);
    } else {
        snprintf(sp, sizeof sp, "%s/%s", path, ix.shards[part].file);
        st = open_verified(sp, out, vals, &s, &kind, verify);
        if (st == DT_OK && kind != KIND_SHARD) st = dt_error(DT_ERR_FORMAT, "%s: not a checkpoint shard", sp);
        if (st != DT_OK) {
            dt_st_close(*out);
            *out = NULL;
        }
    }
    index_free(&ix);
    return st;
}

dt_status dt_ckpt_open_part(const char *path, int part, dt_st_file **out, int *parts) {
    return open_part(path, part, out, parts, 1);
}

dt_status dt_ckpt_open_chosen(const char *path, int part, dt_st_file **out) {
    int parts;
    return part < 0 ? open_ckpt(path, out, NULL, 0) : open_part(path, part, out, &parts, 0);
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

const char *dt_st_weights_meta_get(const dt_st_file *f, const char *key, char *buf, size_t n) {
    const char *v = dt_st_meta_get(f, key), *wm = dt_st_meta_get(f, "weights_meta");
    if (v || !wm) return v;
    char *lines = strdup(wm);
    dt_st_meta meta[32];
    int nm = lines ? parse_wmeta(lines, meta, 32) : 0;
    for (int i = 0; i < nm && !v; i++)
        if (!strcmp(meta[i].key, key) && strlen(meta[i].value) < n) v = strcpy(buf, meta[i].value);
    free(lines);
    return v;
}

// A sharded checkpoint gathered into one whole checkpoint: every shard
// verified (open_shard), then a view of them (dt_st_compose) that has a
// whole checkpoint's tensors (the model's, each optimizer state, the step
// count) and metadata (shard 0's, as a whole checkpoint's, with no checksum
// of its own: each shard's was verified). Nothing is read into memory but
// the shards' headers; the view reads the shards' bytes when asked.
static dt_status gather(const char *dir, dt_st_file **out, const char **vals, dt_train_state *s, int *kind,
                        int verify) {
    *out = NULL;
    ckpt_index ix;
    dt_status st = index_read(dir, &ix);
    if (st != DT_OK) return st;
    int W = (int)ix.world;
    dt_st_file **kids = calloc((size_t)W, sizeof *kids), *v = NULL;
    if (!kids) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", dir);
    dt_train_state s0 = {0}, ns;
    const char *kv[NKEYS];
    char sp[4500];
    for (int r = 0; r < W && st == DT_OK; r++)
        if ((st = open_shard(dir, &ix, r, &s0, &kids[r], kv, &ns, sp, sizeof sp, verify)) == DT_OK && r == 0) s0 = ns;
    cJSON *meta = st == DT_OK ? cJSON_CreateObject() : NULL;
    if (st == DT_OK) {  // (shard 0's values, kv's the last shard's: the same but for the slice)
        for (int k = 0; k < NKEYS && meta; k++)
            if (!cJSON_AddStringToObject(meta, keys[k], k == K_FORMAT ? "dtrain-checkpoint" : k == K_SHARD ? ""
                                                                                  : dt_st_meta_get(kids[0], keys[k])))
                cJSON_Delete(meta), meta = NULL;
        const char *sc = dt_st_meta_get(kids[0], KEY_SCALER);
        if (meta && sc && !cJSON_AddStringToObject(meta, KEY_SCALER, sc)) cJSON_Delete(meta), meta = NULL;
        if (meta) {
            v = dt_st_compose(dir, meta, kids, W);
            memset(kids, 0, sizeof *kids * (size_t)W);  // (the view's now, or freed by it)
        }
        if (!v) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", dir);
    }
    for (int r = 0; kids && r < W; r++) dt_st_close(kids[r]);
    free(kids);
    size_t np = (size_t)ix.nparams;
    for (int i = 0; i < ix.ntensors && st == DT_OK; i++) {  // the model's tensors from the shards' params
        const dt_tensor_info *ti = &ix.tensors[i];
        dt_st_tensor t = {ti->name, DT_F32, ti->ndim, {0}, NULL, ti->numel * sizeof(float)};
        memcpy(t.shape, ti->shape, sizeof ti->shape);
        st = dt_st_compose_add(v, &t);
        for (int r = 0; r < W && st == DT_OK; r++) {
            size_t b = ix.shards[r].begin, e = ix.shards[r].end, x = ti->offset > b ? ti->offset : b,
                   y = ti->offset + ti->numel < e ? ti->offset + ti->numel : e;
            dt_st_file *k = dt_st_compose_kid(v, r);
            if (x < y) st = dt_st_compose_take(v, k, dt_st_find(k, "params"), x - b, y - x);
        }
    }
    for (int j = 0; j < ix.nstates && st == DT_OK; j++) {
        st = dt_st_compose_add(v, &(dt_st_tensor){state_names[j], DT_F32, 1, {(int64_t)np}, NULL, np * sizeof(float)});
        for (int r = 0; r < W && st == DT_OK; r++) {
            dt_st_file *k = dt_st_compose_kid(v, r);
            size_t len = ix.shards[r].end - ix.shards[r].begin;
            if (len) st = dt_st_compose_take(v, k, dt_st_find(k, state_names[j]), 0, len);
        }
    }
    if (st == DT_OK) st = dt_st_compose_add(v, &(dt_st_tensor){"optimizer.step", DT_I64, 1, {1}, NULL, sizeof(int64_t)});
    if (st == DT_OK) {
        int r0 = 0;
        for (int r = 0; r < W; r++)
            if (step_from(r, ix.shards[r].begin, ix.shards[r].end, 0)) r0 = r;  // (the last one load_shards would read)
        dt_st_file *k = dt_st_compose_kid(v, r0);
        st = dt_st_compose_take(v, k, dt_st_find(k, "optimizer.step"), 0, 1);
    }
    if (st == DT_OK) st = dt_st_compose_end(v);
    if (st == DT_OK) st = get_meta(v, dir, vals);
    index_free(&ix);
    if (st != DT_OK) {
        dt_st_close(v);
        return st;
    }
    *s = s0;
    *kind = KIND_WHOLE;
    *out = v;
    return DT_OK;
}

// Text from the file, escaped for the terminal (dt_escape_text).
static const char *esc(char *buf, size_t n, const char *s) { return dt_escape_text(buf, n, s, strlen(s)); }

dt_status dt_ckpt_inspect(const char *path, FILE *out) {
    dt_st_file *f;
    const char *vals[NKEYS];
    dt_train_state s;
    int kind = KIND_WEIGHTS, sharded = is_dir(path);
    char e1[4096], e2[4096];
    // A sharded checkpoint is verified as it is gathered; a file is shown
    // first, then verified.
    dt_status st = sharded ? open_verified(path, &f, vals, &s, &kind, 1) : dt_st_open(&f, path);
    if (st != DT_OK) return st;
    if (sharded) fprintf(out, "%s: sharded checkpoint, every shard verified and gathered:\n", esc(e1, sizeof e1, path));
    const char *fmt = dt_st_meta_get(f, "format");
    int is_ckpt = sharded || looks_like_ckpt(f);
    fprintf(out, "%s: safetensors, %d tensors, format %s\n", esc(e1, sizeof e1, path), dt_st_count(f),
            fmt ? esc(e2, sizeof e2, fmt) : "(none)");
    if (is_ckpt) {
        for (int k = 0; k < NKEYS; k++) {
            const char *v = dt_st_meta_get(f, keys[k]);
            if (k == K_CONFIG) continue;
            fprintf(out, "  %-15s %s\n", keys[k], v ? esc(e1, sizeof e1, v) : "(missing)");
        }
        const char *sc = dt_st_meta_get(f, KEY_SCALER);
        if (sc) fprintf(out, "  %-15s %s (scale, clean steps, skipped steps)\n", KEY_SCALER, esc(e1, sizeof e1, sc));
        const char *cfg = dt_st_meta_get(f, "config");
        if (cfg) {
            fprintf(out, "  config:\n");
            for (const char *p = cfg; *p;) {
                size_t l = strcspn(p, "\n");
                if (l) fprintf(out, "    | %s\n", dt_escape_text(e1, sizeof e1, p, l));
                p += l + (p[l] == '\n');
            }
        }
    }
    size_t bytes = 0;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_get(f, i);
        char shape[160];
        dt_st_format_shape(shape, sizeof shape, t->shape, t->ndim);
        fprintf(out, "  tensor %-28s %s %s\n", esc(e1, sizeof e1, t->name), dt_dtype_name(t->dtype), shape);
        bytes += t->nbytes;
    }
    fprintf(out, "  %zu bytes of tensor data\n", bytes);
    // One streaming pass gives a file's checksum and its NaN/Inf count (a
    // checksum that fails before it reads any value leaves the count to a
    // pass of its own). A sharded checkpoint's shards were verified as it
    // was gathered.
    char why[1024] = "";
    if (is_ckpt && !sharded && (st = check_ckpt(f, path, vals, &s, &kind, 1)) != DT_OK)
        snprintf(why, sizeof why, "%s", dt_last_error());
    dt_status fin = dt_st_check_finite(f, path);
    if (fin == DT_ERR_NUMERIC)  // (said, not refused: inspect shows what is there)
        fprintf(out, "  values: %s\n", esc(e1, sizeof e1, strchr(dt_last_error(), ' ') + 1));
    if (*why) {
        fprintf(out, "  checksum: FAILED: %s\n", esc(e1, sizeof e1, why));
        dt_error(st, "%s", why);
    } else if (fin != DT_OK && fin != DT_ERR_NUMERIC) {
        st = fin;  // (the file could not be read to its end)
    } else if (is_ckpt && sharded) {
        fprintf(out, "  checksums: ok (every shard's)\n");
    } else if (is_ckpt) {
        fprintf(out, "  checksum %s: ok\n", esc(e1, sizeof e1, dt_st_meta_get(f, "checksum")));
    }
    dt_st_close(f);
    return st;
}

dt_status dt_ckpt_export_weights(const char *ckpt, const char *out) {
    return dt_ckpt_export_weights_as(ckpt, out, DT_F32);
}

// A tensor's bytes from f appended to w, converted to `as`, DT_ST_PIECE
// bytes of it at a time through buf.
static dt_status copy_tensor(dt_atomic_file *w, const dt_st_file *f, const dt_st_tensor *t, dt_dtype as, void *buf) {
    size_t es = dt_dtype_size(as), n = t->nbytes / dt_dtype_size(t->dtype),
           piece = DT_ST_PIECE / (es > dt_dtype_size(t->dtype) ? es : dt_dtype_size(t->dtype));
    dt_status st = DT_OK;
    for (size_t a = 0, m; a < n && st == DT_OK; a += m) {
        m = n - a < piece ? n - a : piece;
        if ((st = dt_st_read(f, t, a, m, as, buf)) == DT_OK) st = dt_atomic_append(w, buf, m * es);
    }
    return st;
}

dt_status dt_ckpt_export_weights_as(const char *ckpt, const char *out, dt_dtype type) {
    if (type != DT_F32 && type != DT_BF16 && type != DT_F16)
        return dt_error(DT_ERR_ARG, "export: weights are F32, BF16 or F16, not %s", dt_dtype_name(type));
    dt_st_file *f;
    const char *vals[NKEYS];
    dt_train_state s;
    int kind;
    dt_status st = open_verified(ckpt, &f, vals, &s, &kind, 1);
    if (st != DT_OK) return st;
    if (kind != KIND_WHOLE || (st = dt_st_check_finite(f, ckpt)) != DT_OK) {
        if (kind != KIND_WHOLE) st = not_a_ckpt(ckpt, kind, f);
        dt_st_close(f);
        return st;
    }
    // The weights' tensors as they will be written (16-bit weights: the F32
    // tensors converted), their data unread until the copy.
    int n = 0;
    dt_st_tensor *t = calloc((size_t)dt_st_count(f) + 1, sizeof *t);
    const dt_st_tensor **src = calloc((size_t)dt_st_count(f) + 1, sizeof *src);
    void *buf = dt_alloc(DT_ST_PIECE);
    char *lines = strdup(vals[K_WEIGHTS_META]), *hdr = NULL;
    if (!t || !src || !buf || !lines) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", ckpt);
    for (int i = 0; i < dt_st_count(f) && st == DT_OK; i++) {
        if (!strncmp(dt_st_get(f, i)->name, "optimizer.", 10)) continue;
        src[n] = dt_st_get(f, i);
        t[n] = *src[n];
        if (t[n].dtype == DT_F32 && type != DT_F32) t[n].dtype = type, t[n].nbytes /= 2;
        n++;
    }
    // The weights file's own metadata, then ours where it has none.
    dt_st_meta meta[35];
    int nm = lines ? parse_wmeta(lines, meta, 32) : 0, has_format = 0;
    for (int i = 0; i < nm; i++) has_format |= !strcmp(meta[i].key, "format");
    if (!has_format) meta[nm++] = (dt_st_meta){"format", "dtrain-weights"};
    meta[nm++] = (dt_st_meta){"dtrain_version", dt_version()};
    meta[nm++] = (dt_st_meta){"step", vals[K_STEP]};
    // The header, then each tensor a piece at a time: what dt_st_write
    // writes, never held whole.
    size_t hlen;
    dt_atomic_file *w = NULL;
    if (st == DT_OK && (st = dt_st_header(out, t, n, meta, nm, &hdr, &hlen)) == DT_OK &&
        (st = dt_atomic_open(&w, out)) == DT_OK)
        st = dt_atomic_append(w, hdr, hlen);
    for (int i = 0; i < n && st == DT_OK; i++) st = copy_tensor(w, f, src[i], t[i].dtype, buf);
    if (w && st == DT_OK) st = dt_atomic_commit(w);
    else dt_atomic_abort(w);
    free(hdr);
    free(lines);
    dt_free(buf);
    free(src);
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
    char **names;
    int nn;
    dt_status st = dt_path_list(dir, &names, &nn);
    if (st != DT_OK) return st;
    for (int i = 0; i < nn && st == DT_OK; i++) {
        if (step_of(names[i]) < 0) continue;
        if (!*paths && !(*paths = malloc(sizeof **paths * (size_t)nn))) {
            st = dt_error(DT_ERR_NOMEM, "out of memory");
            break;
        }
        size_t l = strlen(dir) + strlen(names[i]) + 2;
        if (!((*paths)[*n] = malloc(l))) {
            st = dt_error(DT_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf((*paths)[(*n)++], l, "%s/%s", dir, names[i]);
    }
    dt_path_list_free(names, nn);
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
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/index.json", dir);
    int kind, has_index = 0;
    dt_status st = dt_path_kind(dir, &kind, NULL);
    if (st == DT_OK && kind == 2) st = there(idx, &has_index);
    if (st != DT_OK) return st;
    // One checkpoint: a file, or a sharded checkpoint's directory.
    if (kind == 1 || has_index) {
        dt_status st = dt_ckpt_read(dir, m, s);
        if (st == DT_OK) {
            *found = 1;
            snprintf(used, nused, "%s", dir);
        }
        return st;
    }
    char **paths;
    int n;
    if ((st = dt_ckpt_list(dir, &paths, &n)) != DT_OK) return st;
    int damaged = 0, incomplete = 0;
    for (int i = 0; i < n; i++) {
        // A sharded checkpoint without its COMPLETE marker was being written
        // when the run stopped (a crash, a killed rank): it never was one.
        char done[4400];
        snprintf(done, sizeof done, "%s/COMPLETE", paths[i]);
        int complete = 1;
        if (is_dir(paths[i]) && (st = there(done, &complete)) != DT_OK) break;
        if (!complete) {
            incomplete++;
            dt_log(DT_LOG_WARN, "skipping %s: its writing never finished (no COMPLETE marker)%s", paths[i],
                   i + 1 < n ? "; trying an older one" : "");
            continue;
        }
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
    if (!*found && damaged && damaged + incomplete == n)
        st = dt_error(DT_ERR_FORMAT, "%s: all %d checkpoints are damaged or incomplete (see the warnings above)", dir,
                      n);
    else if (!*found && incomplete == n)
        st = DT_OK;  // none: as an empty directory
    free_list(paths, n);
    return st;
}

// ----------------------------------------------------------------------------
// background writer

typedef struct {
    _Atomic double at;   // stop from then on (0: not set)
    _Atomic int linger;  // ... DT_CKPT_LINGER seconds after the first look that sees it
} wait_stop;

struct dt_ckpt_writer {
    char dir[4096];
    int keep;
    int rank, world;        // world > 1: sharded
    int own;                // the workers' own files rank 0 waits for (dt_ckpt_writer_expect_own): sharded too
    double shard_timeout;
    size_t begin, end;      // this rank's slice
    wait_stop stop;         // rank 0's waits for the other shards stopped (wait_stopped)
    dt_ckpt_model live;     // the training buffers
    dt_ckpt_model snap;     // copies the thread writes from
    float *buf;             // params + states of the snapshot
    int64_t snap_step;
    dt_st_tensor xt[DT_CKPT_MAX_EXTRA];  // the snapshot's extra state, in xbuf
    char xname[DT_CKPT_MAX_EXTRA][64];
    uint8_t *xbuf;
    size_t xcap;
    int nx;
    dt_train_state state;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, busy, quit, started;
    int pruning;            // deleting old checkpoints after a save (abandon waits for it: a rollback reads the directory)
    dt_status err;          // first failed write
    char errmsg[1024];
    int given_up;           // the newest write failed in object storage and was given up (failmsg says why)
    char failmsg[1024];
    int saves;
    double max_pause, total_pause, max_write;
};

// Removes a checkpoint of dt_ckpt_list: a file, or a sharded checkpoint's
// directory.
static void remove_ckpt(const char *path) {
    if (!sharded_name(path)) {
        if (dt_path_remove(path) != DT_OK) dt_log(DT_LOG_WARN, "removing an old checkpoint: %s", dt_last_error());
        return;
    }
    char p[4400], **names;
    int n;
    snprintf(p, sizeof p, "%s/COMPLETE", path);
    // first: a half-removed checkpoint is never taken for whole
    if (dt_path_remove(p) != DT_OK || dt_path_list(path, &names, &n) != DT_OK) {
        dt_log(DT_LOG_WARN, "removing an old checkpoint: %s", dt_last_error());
        return;
    }
    for (int i = 0; i < n; i++) {
        if (names[i][0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        if (dt_path_remove(p) != DT_OK) dt_log(DT_LOG_WARN, "removing an old checkpoint: %s", dt_last_error());
    }
    dt_path_list_free(names, n);
    dt_path_rmdir(path);
}

// Deletes all but the newest `keep` complete checkpoints. An unfinished one
// (no COMPLETE: a write given up, or abandoned after a rank's death) counts
// for nothing and goes once a complete one is newer; one whose marker
// cannot be looked at stays, as if complete.
static void prune(const char *dir, int keep) {
    char **paths;
    int n, kept = 0;
    if (dt_ckpt_list(dir, &paths, &n) != DT_OK) return;
    for (int i = 0; i < n; i++) {
        char done[4400];
        snprintf(done, sizeof done, "%s/COMPLETE", paths[i]);
        int complete = 1;
        if (sharded_name(paths[i]) && there(done, &complete) != DT_OK) complete = 1;
        if (complete && kept < keep) kept++;
        else if (complete || kept) remove_ckpt(paths[i]);
    }
    free_list(paths, n);
}

// A rank's file of a sharded checkpoint in object storage that it gave up
// (its upload failed past the retries): PATH.lost beside it, so that rank 0
// gives the checkpoint up at once instead of waiting for it (best effort:
// with the server gone rank 0's looks fail too, and it gives up then).
static void mark_lost(const char *path) {
    char lost[4500];
    snprintf(lost, sizeof lost, "%s.lost", path);
    const void *parts[] = {"given up\n"};
    size_t sizes[] = {9};
    if (dt_write_atomic(lost, parts, sizes, 1) != DT_OK) dt_log(DT_LOG_DEBUG, "%s", dt_last_error());
}

// Whether rank 0's waits for the other shards are to stop: from `at` on
// (abandon: at once), or with `linger` (a free after a failure)
// DT_CKPT_LINGER seconds after the first look that sees it.
static int wait_stopped(wait_stop *w) {
    if (w->linger && w->at == 0) w->at = dt_now() + DT_CKPT_LINGER;
    return w->at > 0 && dt_now() >= w->at;
}

// Waits for path (a shard, or a worker's own file) until `deadline`, or
// until stop says (wait_stopped). In object storage (each look a request:
// every 10 ms at first, backing off to 200 ms) a look that fails past the
// client's retries, or a PATH.lost marker (mark_lost), ends the wait with
// DT_ERR_IO.
static dt_status wait_file(const char *path, int is_own, int k, double deadline, double timeout, wait_stop *stop) {
    const char *who = is_own ? "worker" : "rank";
    int remote = dt_path_remote(path);
    char lost[4500];
    snprintf(lost, sizeof lost, "%s.lost", path);
    for (useconds_t pause = 10000;; pause = pause * 2 < 200000 ? pause * 2 : 200000) {
        int yes, gone = 0;
        dt_status st = there(path, &yes);
        if (st == DT_OK && !yes && remote) st = there(lost, &gone);
        if (st != DT_OK && remote) return st;
        if (yes) return DT_OK;
        if (gone) return dt_error(DT_ERR_IO, "%s: %s %d gave it up (its upload failed)", path, who, k);
        if (stop && wait_stopped(stop)) return dt_error(DT_ERR_IO, "%s: not written (the run stopped)", path);
        if (dt_now() > deadline)
            return dt_error(DT_ERR_TIMEOUT, "%s: %s %d's %s not written within %.0f s", path, who, k,
                            is_own ? "own state" : "shard", timeout);
        usleep(remote ? pause : 5000);
    }
}

// Rank 0, its shard written: waits (up to `timeout` seconds, or until
// stop says) for the other ranks' shards of checkpoint dir (a shard's final name
// appears only once it is durable), then for the workers' own files
// (dt_ckpt_write_own, `own` of them), and marks the checkpoint complete.
static dt_status finish_sharded(const char *dir, const dt_ckpt_model *m, const dt_train_state *s, int world, int own,
                                double timeout, wait_stop *stop) {
    char path[4400];
    double deadline = dt_now() + timeout;
    for (int r = 1; r < world + own; r++) {
        int is_own = r >= world, k = is_own ? r - world : r;
        if (is_own) own_path(path, sizeof path, dir, k, own);
        else shard_path(path, sizeof path, dir, k, world);
        dt_status st = wait_file(path, is_own, k, deadline, timeout, stop);
        if (st != DT_OK) return st;
    }
    return write_index(dir, m, s, world);
}

// Sharded: this rank's shard into DIR/step-N/; rank 0 then waits for the
// others' shards and marks the checkpoint complete.
static dt_status write_sharded(dt_ckpt_writer *w, const char *dir, const dt_train_state *s) {
    dt_status st = dt_make_dirs(dir);
    char path[4400];
    shard_path(path, sizeof path, dir, w->rank, w->world);
    if (st == DT_OK) st = write_shard(path, &w->snap, s, w->begin, w->end, w->rank, w->world);
    if (st != DT_OK || w->rank != 0) return st;
    return finish_sharded(dir, &w->live, s, w->world, w->own, w->shard_timeout, &w->stop);
}

// The snapshot's extra tensors: the model's extra() for the writer thread.
static int snap_extra(void *user, dt_st_tensor *t, int max) {
    const dt_ckpt_writer *w = user;
    for (int i = 0; i < w->nx && i < max; i++) t[i] = w->xt[i];
    return w->nx;
}

// Copies the live extra state into the snapshot.
static dt_status snap_extras(dt_ckpt_writer *w) {
    dt_st_tensor t[DT_CKPT_MAX_EXTRA];
    int n;
    dt_status st = extra_tensors(&w->live, t, "checkpoint snapshot", &n);
    if (st != DT_OK) return st;
    size_t bytes = 0;
    for (int i = 0; i < n && !w->live.extra_stable; i++) bytes += (t[i].nbytes + 7) / 8 * 8;
    if (bytes > w->xcap) {
        free(w->xbuf);
        w->xcap = 0;
        if (!(w->xbuf = malloc(bytes)))
            return dt_error(DT_ERR_NOMEM, "checkpoint snapshot: out of memory for %zu bytes of extra state", bytes);
        w->xcap = bytes;
    }
    w->nx = 0;
    for (size_t i = 0, at = 0; i < (size_t)n; i++) {
        if (strlen(t[i].name) >= sizeof w->xname[i])
            return dt_error(DT_ERR_ARG, "checkpoint snapshot: extra tensor name '%.64s...' too long", t[i].name);
        w->xt[i] = t[i];
        w->xt[i].name = strcpy(w->xname[i], t[i].name);
        if (w->live.extra_stable) continue;  // (written from the live buffers)
        w->xt[i].data = memcpy(w->xbuf + at, t[i].data, t[i].nbytes);
        at += (t[i].nbytes + 7) / 8 * 8;
    }
    w->nx = n;
    return DT_OK;
}

static void *writer_main(void *arg) {
    dt_ckpt_writer *w = arg;
    // Below the training's threads (nice +10; the threads of an upload
    // inherit it): a write takes the CPU the steps leave first. (Linux
    // threads have a nice of their own; raising it needs no privilege.)
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
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
        if (w->world > 1 || w->own || w->live.extra) {  // (extra state: a rank's own, in its shard)
            snprintf(path, sizeof path, "%s/step-%08lld", w->dir, (long long)s.step);
            st = write_sharded(w, path, &s);
        } else {
            snprintf(path, sizeof path, "%s/step-%08lld.safetensors", w->dir, (long long)s.step);
            st = dt_ckpt_write(path, &w->snap, &s);
        }
        int written = st == DT_OK;
        double took = dt_now() - t0;
        dt_log(DT_LOG_DEBUG, "checkpoint %s written in %.1f ms", path, took * 1e3);
        // Object storage that failed for good (after the client's retries):
        // this checkpoint is given up (never marked complete), training
        // goes on and the next save tries again.
        char failmsg[1024];
        int given_up = w->stop.at == 0 && !w->stop.linger && dt_ckpt_give_up(w->dir, st, s.step, failmsg, sizeof failmsg);
        if (given_up && w->rank != 0 && (w->world > 1 || w->own || w->live.extra)) {  // (its shard: rank 0 waits for it)
            char shard[4400];
            shard_path(shard, sizeof shard, path, w->rank, w->world);
            mark_lost(shard);
        }
        if (given_up) st = DT_OK;
        pthread_mutex_lock(&w->mu);
        if (took > w->max_write) w->max_write = took;
        w->given_up = given_up;
        if (given_up) snprintf(w->failmsg, sizeof w->failmsg, "%s", failmsg);
        if (st != DT_OK && w->err == DT_OK) {
            w->err = st;
            snprintf(w->errmsg, sizeof w->errmsg, "checkpoint at step %lld: %s", (long long)s.step, dt_last_error());
        }
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
        // The old checkpoints go once this one is complete, after the save
        // is over: nobody waits for the deletes (a parameter server's
        // SAVED, the next snapshot), and the next write follows them.
        if (written && w->rank == 0) {
            w->pruning = 1;
            pthread_mutex_unlock(&w->mu);
            prune(w->dir, w->keep);
            pthread_mutex_lock(&w->mu);
            w->pruning = 0;
            pthread_cond_broadcast(&w->cv);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int dt_ckpt_give_up(const char *dir, dt_status st, int64_t step, char *msg, size_t n) {
    if (st == DT_OK || !dt_path_remote(dir) || (st != DT_ERR_IO && st != DT_ERR_TIMEOUT)) return 0;
    snprintf(msg, n, "checkpoint at step %lld not written: %s", (long long)step, dt_last_error());
    dt_log(DT_LOG_WARN, "%s; training goes on, and the next checkpoint tries again", msg);
    return 1;
}

static dt_status writer_create(dt_ckpt_writer **out, const char *dir, int keep, const dt_ckpt_model *m, int rank,
                               int world, double shard_timeout, int clean);

dt_status dt_ckpt_writer_create(dt_ckpt_writer **out, const char *dir, int keep, const dt_ckpt_model *m, int rank,
                                int world, double shard_timeout) {
    return writer_create(out, dir, keep, m, rank, world, shard_timeout, 1);
}

dt_status dt_ckpt_writer_rejoin(dt_ckpt_writer **out, const char *dir, int keep, const dt_ckpt_model *m, int rank,
                                int world, double shard_timeout) {
    return writer_create(out, dir, keep, m, rank, world, shard_timeout, 0);
}

static dt_status writer_create(dt_ckpt_writer **out, const char *dir, int keep, const dt_ckpt_model *m, int rank,
                               int world, double shard_timeout, int clean) {
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
    // The shard must lie inside what the rank holds (a sharded strategy's
    // slice comes from the same dt_shard_range).
    size_t plo, phi, slo, shi;
    held(m, &plo, &phi, &slo, &shi);
    if (!m->state_only && (w->begin < plo || w->end > phi || w->begin < slo || w->end > shi)) {
        st = dt_error(DT_ERR_ARG, "checkpoint writer, rank %d of %d: its shard [%zu, %zu) is not inside what it holds (parameters [%zu, %zu), optimizer state [%zu, %zu))",
                      rank, world, w->begin, w->end, plo, phi, slo, shi);
        free(w);
        return st;
    }
    size_t len = w->end - w->begin;
    w->live = *m;
    w->snap = *m;
    w->snap.params_lo = w->snap.states_lo = w->begin;
    w->snap.params_hi = w->snap.states_hi = w->end;
    size_t snap_bytes = sizeof(float) * (len ? len : 1) * (size_t)(1 + m->nstates);
    w->buf = m->stable || m->state_only ? NULL : dt_alloc(snap_bytes);
    if (!w->buf && !m->stable && !m->state_only) {
        free(w);
        return dt_error(DT_ERR_NOMEM, "checkpoint snapshot: out of memory (%zu parameters)", m->nparams);
    }
    // Its pages touched now, at the start, rather than in the first save's
    // pause (gpt2-124m's 1.49 GB: that pause took 3.3-3.6 s under the
    // project's machine's memory pressure, the later saves' 0.1-0.2 s).
    if (w->buf) memset(w->buf, 0, snap_bytes);
    w->snap.params = w->buf;
    for (int j = 0; j < m->nstates && w->buf; j++) w->snap.states[j] = w->buf + len * (size_t)(1 + j);
    if (m->stable && !m->state_only) {  // the live buffers are the snapshot
        w->snap.params = m->params + (w->begin - plo);
        for (int j = 0; j < m->nstates; j++) w->snap.states[j] = m->states[j] + (w->begin - slo);
    }
    w->snap.opt_step = &w->snap_step;
    if (m->extra) {
        w->snap.extra = snap_extra;
        w->snap.extra_user = w;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        dt_ckpt_writer_free(w);
        return dt_error(DT_ERR_INTERNAL, "cannot start the checkpoint writer thread");
    }
    w->started = 1;
    // Temp files of a writer that was killed mid-write, and sharded
    // checkpoints never completed (before any rank of this run writes).
    char **names = NULL;
    int nn = 0;
    if (rank == 0 && clean && dt_path_list(dir, &names, &nn) != DT_OK)
        dt_log(DT_LOG_WARN, "looking for unfinished checkpoints: %s", dt_last_error());
    for (int i = 0; i < nn; i++) {
        char p[4400], c[4500];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        snprintf(c, sizeof c, "%s/COMPLETE", p);
        int complete = 1;
        if (strstr(names[i], ".safetensors.tmp.")) dt_path_remove(p);
        else if (step_of(names[i]) >= 0 && sharded_name(p) && there(c, &complete) == DT_OK && !complete) remove_ckpt(p);
    }
    dt_path_list_free(names, nn);
    *out = w;
    return DT_OK;
}

void dt_ckpt_writer_expect_own(dt_ckpt_writer *w, int files) { w->own = files > 0 ? files : 0; }

dt_status dt_ckpt_write_own(const char *dir, const dt_ckpt_model *m, const dt_train_state *s, int rank, int world) {
    char path[4400];
    snprintf(path, sizeof path, "%s/step-%08lld", dir, (long long)s->step);
    dt_status st = dt_make_dirs(path);
    if (st != DT_OK) return st;
    own_path(path + strlen(path), sizeof path - strlen(path), "", rank, world);
    dt_st_tensor t[1 + DT_CKPT_MAX_EXTRA];
    t[0] = (dt_st_tensor){"optimizer.step", DT_I64, 1, {1}, m->opt_step, sizeof(int64_t)};
    int nx;
    if ((st = extra_tensors(m, t + 1, path, &nx)) != DT_OK) return st;
    char shard[128];  // a shard of none of the parameters
    snprintf(shard, sizeof shard, "0:0:%zu:%d:%d", m->nparams, rank, world);
    st = write_ckpt(path, t, 1 + nx, m, s, shard);
    if (st != DT_OK && dt_path_remote(path)) {  // (server 0 waits for it: told at once)
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        mark_lost(path);
        dt_error(st, "%s", msg);
    }
    return st;
}

dt_status dt_ckpt_open_own(const char *path, int part, dt_st_file **out, int *parts) {
    if (out) *out = NULL;
    *parts = 0;
    char p[4500], **names = NULL;
    int w, nn = 0;
    if (is_dir(path)) dt_path_list(path, &names, &nn);
    for (int i = 0; i < nn; i++)
        if (sscanf(names[i], "worker-00000-of-%5d.safetensors", &w) == 1 && w > 0) {
            char want[64];
            own_path(want, sizeof want, "", 0, w);
            if (!strcmp(want + 1, names[i])) *parts = w;
        }
    dt_path_list_free(names, nn);
    if (part == -1) return DT_OK;
    if (part < 0 || part >= *parts)
        return dt_error(DT_ERR_ARG, "%s: holds the files of %d workers, not worker %d's", path, *parts, part);
    own_path(p, sizeof p, path, part, *parts);
    const char *vals[NKEYS];
    dt_train_state s;
    int kind, r = -1, n = -1;
    dt_status st = open_verified(p, out, vals, &s, &kind, 1);
    if (st == DT_OK && (kind != KIND_SHARD || sscanf(vals[K_SHARD], "0:0:%*[0-9]:%d:%d", &r, &n) != 2 || r != part ||
                        n != *parts))
        st = dt_error(DT_ERR_FORMAT, "%s: not worker %d of %d's own state in a checkpoint", p, part, *parts);
    if (st != DT_OK && out) {
        dt_st_close(*out);
        *out = NULL;
    }
    return st;
}

void dt_ckpt_writer_abandon(dt_ckpt_writer *w) {
    pthread_mutex_lock(&w->mu);
    dt_status before = w->err;
    w->stop.at = dt_now();
    while (w->pending || w->busy || w->pruning) pthread_cond_wait(&w->cv, &w->mu);
    w->stop.at = 0;
    if (before == DT_OK && w->err != DT_OK) {
        dt_log(DT_LOG_WARN, "%s: given up after a worker's death", w->errmsg);
        w->err = DT_OK;
    }
    pthread_mutex_unlock(&w->mu);
}

dt_status dt_ckpt_writer_save(dt_ckpt_writer *w, const dt_train_state *s) {
    double t0 = dt_now();
    pthread_mutex_lock(&w->mu);
    while (w->pending || w->busy) pthread_cond_wait(&w->cv, &w->mu);
    dt_status st = w->err, snap = DT_OK;
    if (w->live.state_only) {  // (nothing to write from: the strategy writes it, dt_ckpt_pieces)
        pthread_mutex_unlock(&w->mu);
        return dt_error(DT_ERR_INTERNAL, "checkpoint writer: the model holds the training state alone");
    }
    if (st == DT_OK) {
        size_t len = w->end - w->begin;
        size_t plo, phi, slo, shi;
        held(&w->live, &plo, &phi, &slo, &shi);
        if (!w->live.stable) memcpy(w->snap.params, w->live.params + (w->begin - plo), sizeof(float) * len);
        for (int j = 0; j < w->live.nstates && !w->live.stable; j++)
            memcpy(w->snap.states[j], w->live.states[j] + (w->begin - slo), sizeof(float) * len);
        w->snap_step = *w->live.opt_step;
        w->state = *s;
        if (w->live.extra) snap = snap_extras(w);
        w->pending = snap == DT_OK;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (st != DT_OK) return dt_error(st, "%s", w->errmsg);
    if (snap != DT_OK) return snap;
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

int dt_ckpt_writer_failed(dt_ckpt_writer *w, char *msg, size_t n) {
    pthread_mutex_lock(&w->mu);
    int failed = w->given_up;
    if (failed && n) snprintf(msg, n, "%s", w->failmsg);
    pthread_mutex_unlock(&w->mu);
    return failed;
}

int dt_ckpt_writer_idle(dt_ckpt_writer *w) {
    pthread_mutex_lock(&w->mu);
    int idle = !w->pending && !w->busy;
    pthread_mutex_unlock(&w->mu);
    return idle;
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
    w->stop.linger = 1;
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
    free(w->xbuf);
    free(w);
}

// ----------------------------------------------------------------------------
// a shard written a piece at a time (dt_ckpt_pieces)
//
// The file is what write_shard writes, byte for byte: the header (made
// first with a placeholder checksum: 8 hex digits either way, so the same
// length), the tensors' bytes at their offsets as the pieces come, the
// checksum over them in name order (crc_head, then the bytes), and the
// header again with it.

struct dt_ckpt_pieces {
    char dir[4200], path[4400];
    const dt_ckpt_model *m;
    dt_train_state s;
    int rank, world;
    size_t begin, end;
    dt_st_tensor t[4 + DT_CKPT_MAX_EXTRA];
    int n;
    const dt_st_tensor *sorted[4 + DT_CKPT_MAX_EXTRA];  // t in name order: the checksum's
    size_t off[4 + DT_CKPT_MAX_EXTRA];                  // each one's bytes in the file
    int next;                                           // the sorted tensor the checksum is in
    size_t done;                                        // ... and its bytes summed so far
    uint32_t crc;
    ckpt_meta k;
    dt_atomic_file *f;
};

// Sums (and writes) t's bytes [at, at + len) into the checksum: the tensors
// before it in name order must be complete, those held in memory (data
// set: the step count, the extra state) are summed and written on the way.
static dt_status pieces_feed(dt_ckpt_pieces *w, const dt_st_tensor *t, size_t at, const void *bytes, size_t len) {
    while (w->next < w->n && w->sorted[w->next] != t) {
        const dt_st_tensor *u = w->sorted[w->next];
        if ((!u->data && u->nbytes) || w->done)  // (an empty range has nothing to come)
            return dt_error(DT_ERR_INTERNAL, "%s: tensor '%s' written before '%s' is complete", w->path, t ? t->name : "(end)",
                            u->name);
        w->crc = crc_head(w->crc, u);
        if (u->nbytes) {
            w->crc = dt_crc32c(w->crc, u->data, u->nbytes);
            dt_status st = dt_atomic_write_at(w->f, w->off[u - w->t], u->data, u->nbytes);
            if (st != DT_OK) return st;
        }
        w->next++;
    }
    if (!t) return DT_OK;
    if (w->next == w->n || at != w->done || at + len > t->nbytes)
        return dt_error(DT_ERR_INTERNAL, "%s: tensor '%s': bytes [%zu, %zu) out of order (%zu of %zu written)", w->path,
                        t->name, at, at + len, w->done, t->nbytes);
    if (at == 0) w->crc = crc_head(w->crc, t);
    w->crc = dt_crc32c(w->crc, bytes, len);
    dt_status st = dt_atomic_write_at(w->f, w->off[t - w->t] + at, bytes, len);
    if (st != DT_OK) return st;
    w->done += len;
    if (w->done == t->nbytes) w->next++, w->done = 0;
    return DT_OK;
}

dt_status dt_ckpt_pieces_open(dt_ckpt_pieces **out, const char *dir, const dt_ckpt_model *m, const dt_train_state *s,
                              int rank, int world) {
    *out = NULL;
    dt_ckpt_pieces *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(w->dir, sizeof w->dir, "%s/step-%08lld", dir, (long long)s->step);
    shard_path(w->path, sizeof w->path, w->dir, rank, world);
    w->m = m;
    w->s = *s;
    w->rank = rank;
    w->world = world;
    dt_shard_range(m->nparams, rank, world, &w->begin, &w->end);
    dt_ckpt_model none = *m;  // (the blocks' data come in pieces)
    none.params = NULL;
    for (int j = 0; j < 2; j++) none.states[j] = NULL;
    char shard[128], *hdr = NULL;
    size_t hlen = 0;
    shard_label(shard, sizeof shard, m, w->begin, w->end, rank, world);
    meta_make(&w->k, m, s, shard);
    meta_sum(&w->k, 0);
    dt_status st = shard_tensors(&none, w->begin, w->end, w->path, w->t, &w->n);
    const dt_st_tensor *tp[4 + DT_CKPT_MAX_EXTRA];
    for (int i = 0; i < w->n; i++) tp[i] = &w->t[i];
    const dt_st_tensor **by = st == DT_OK ? by_name(tp, w->n, w->path) : NULL;
    if (st == DT_OK && !by) st = DT_ERR_NOMEM;
    if (by) memcpy(w->sorted, by, sizeof *by * (size_t)w->n);
    free(by);
    if (st == DT_OK) st = dt_st_header(w->path, w->t, w->n, w->k.meta, w->k.nmeta, &hdr, &hlen);
    for (int i = 0; i < w->n && st == DT_OK; i++)
        w->off[i] = hlen + (i ? w->off[i - 1] - hlen + w->t[i - 1].nbytes : 0);
    if (st == DT_OK) st = dt_make_dirs(w->dir);
    if (st == DT_OK) st = dt_atomic_open(&w->f, w->path);
    if (st == DT_OK) st = dt_atomic_write_at(w->f, 0, hdr, hlen);
    free(hdr);
    if (st != DT_OK) {
        dt_ckpt_pieces_abort(w);
        return st;
    }
    *out = w;
    return DT_OK;
}

dt_status dt_ckpt_pieces_put(dt_ckpt_pieces *w, int j, size_t at, const float *x, size_t n) {
    if (j < -1 || j >= w->m->nstates || at < w->begin || at + n > w->end)
        return dt_error(DT_ERR_INTERNAL, "%s: a piece [%zu, %zu) of block %d outside the shard [%zu, %zu)", w->path, at,
                        at + n, j, w->begin, w->end);
    return pieces_feed(w, &w->t[j + 1], sizeof(float) * (at - w->begin), x, sizeof(float) * n);
}

dt_status dt_ckpt_pieces_commit(dt_ckpt_pieces *w) {
    dt_status st = pieces_feed(w, NULL, 0, NULL, 0);  // (what is held in memory, after the last piece)
    if (st == DT_OK && (w->next != w->n || w->done))
        st = dt_error(DT_ERR_INTERNAL, "%s: tensor '%s' incomplete", w->path, w->sorted[w->next]->name);
    char *hdr = NULL;
    size_t hlen;
    if (st == DT_OK) {
        meta_sum(&w->k, crc_meta(w->crc, w->k.vals, *w->k.scaler ? w->k.scaler : NULL));
        st = dt_st_header(w->path, w->t, w->n, w->k.meta, w->k.nmeta, &hdr, &hlen);
    }
    if (st == DT_OK && hlen != w->off[0])
        st = dt_error(DT_ERR_INTERNAL, "%s: the header's length changed with its checksum (%zu, %zu)", w->path, hlen, w->off[0]);
    if (st == DT_OK) st = dt_atomic_write_at(w->f, 0, hdr, hlen);
    free(hdr);
    if (st == DT_OK) {
        st = dt_atomic_commit(w->f);
        w->f = NULL;
    }
    return st;
}

dt_status dt_ckpt_pieces_finish(dt_ckpt_pieces *w, int keep, double timeout) {
    dt_status st = DT_OK;
    if (w->rank == 0) {
        char parent[4200];
        snprintf(parent, sizeof parent, "%s", w->dir);
        *strrchr(parent, '/') = 0;
        st = finish_sharded(w->dir, w->m, &w->s, w->world, 0, timeout, NULL);
        if (st == DT_OK) prune(parent, keep < 1 ? 1 : keep);
    }
    dt_ckpt_pieces_abort(w);
    return st;
}

void dt_ckpt_pieces_abort(dt_ckpt_pieces *w) {
    if (!w) return;
    dt_atomic_abort(w->f);
    free(w);
}

// ----------------------------------------------------------------------------
// a range of a checkpoint's block

dt_status dt_ckpt_read_range(const dt_st_file *f, const char *what, const dt_ckpt_model *m, int j, size_t lo, size_t hi,
                             float *dst) {
    if (j >= 0) {
        const dt_st_tensor *t = j < 2 ? dt_st_find(f, state_names[j]) : NULL;
        if (!t || t->dtype != DT_F32 || t->nbytes != sizeof(float) * m->nparams)
            return dt_error(DT_ERR_FORMAT, "%s: no optimizer state %d of %zu F32 values", what, j, m->nparams);
        return read_overlap(dst, lo, hi, f, t, 0, m->nparams);
    }
    dt_status st = DT_OK;
    for (int i = 0; i < m->ntensors && st == DT_OK; i++) {
        const dt_tensor_info *ti = &m->tensors[i];
        if (ti->offset >= hi || ti->offset + ti->numel <= lo) continue;
        const dt_st_tensor *t = dt_st_find(f, ti->name);
        if (!t || t->dtype != DT_F32 || t->nbytes != sizeof(float) * ti->numel)
            return dt_error(DT_ERR_FORMAT, "%s: no tensor '%s' of %zu F32 values", what, ti->name, ti->numel);
        st = read_overlap(dst, lo, hi, f, t, ti->offset, ti->offset + ti->numel);
    }
    return st;
}
