/* GPT weights: safetensors (dtrain's own) and llm.c checkpoints.
 *
 * An llm.c checkpoint is a header of 256 little-endian int32
 *   {20240326, 3, maxT, V, L, NH, C, Vp, 0, ...}
 * followed by the fp32 parameters in llm.c's order, which is also the order
 * of dtrain's GPT parameter block: export is the header plus the block, and
 * import is a check plus a memcpy. The safetensors form holds the same 16
 * tensors under llm.c's names, so converting either way keeps every byte of
 * the parameters. */
#include "dtrain/ckpt.h"
#include "dtrain/gpt.h"
#include "ckpt/st_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * 4)

static int32_t rd32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

// The header at buf (HEADER_BYTES of them, when len allows) of an llm.c
// file of len bytes: *c, every size checked against len.
static dt_status llmc_header(const uint8_t *buf, size_t len, const char *what, dt_gpt_config *c) {
    if (len < HEADER_BYTES)
        return dt_error(DT_ERR_FORMAT, "%s: %zu bytes is shorter than the %d-byte header of an llm.c checkpoint (truncated?)",
                        what, len, HEADER_BYTES);
    int32_t magic = rd32(buf), version = rd32(buf + 4);
    if (magic != DT_LLMC_MAGIC)
        return dt_error(DT_ERR_FORMAT, "%s: magic number %d, expected %d (not an llm.c model checkpoint)", what, magic,
                        DT_LLMC_MAGIC);
    if (version != DT_LLMC_VERSION)
        return dt_error(DT_ERR_FORMAT, "%s: version %d, expected %d (fp32 weights; llm.c's bf16 version 5 is not supported)",
                        what, version, DT_LLMC_VERSION);
    dt_gpt_config g = {.block_size = rd32(buf + 8), .vocab_size = rd32(buf + 12), .n_layer = rd32(buf + 16),
                       .n_head = rd32(buf + 20), .n_embd = rd32(buf + 24), .padded_vocab_size = rd32(buf + 28)};
    if (dt_gpt_config_check(&g, what) != DT_OK) {
        char msg[512];  // dt_error overwrites the message it would read
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        return dt_error(DT_ERR_FORMAT, "%s (in the header)", msg);
    }
    size_t np = dt_gpt_config_num_params(&g), want = HEADER_BYTES + np * sizeof(float);
    if (len != want)
        return dt_error(DT_ERR_FORMAT, "%s: header describes %zu parameters (%zu bytes) but the file has %zu bytes (%s)",
                        what, np, want, len, len < want ? "truncated" : "trailing data");
    *c = g;
    return DT_OK;
}

dt_status dt_llmc_parse(const uint8_t *buf, size_t len, const char *what, dt_gpt_config *c,
                        const float **params) {
    dt_status st = llmc_header(buf, len, what, c);
    if (st == DT_OK) *params = (const float *)(buf + HEADER_BYTES);
    return st;
}

static void llmc_head(int32_t h[HEADER_INTS], const dt_gpt_config *c) {
    int32_t v[8] = {DT_LLMC_MAGIC, DT_LLMC_VERSION, c->block_size, c->vocab_size,
                    c->n_layer, c->n_head, c->n_embd, c->padded_vocab_size};
    memset(h, 0, HEADER_BYTES);
    memcpy(h, v, sizeof v);
}

dt_status dt_llmc_write(const char *path, const dt_gpt_config *c, const float *params) {
    dt_status st = dt_gpt_config_check(c, path);
    if (st != DT_OK) return st;
    int32_t h[HEADER_INTS];
    llmc_head(h, c);
    const void *parts[] = {h, params};
    size_t sizes[] = {sizeof h, dt_gpt_config_num_params(c) * sizeof(float)};
    return dt_write_atomic(path, parts, sizes, 2);
}

// ----------------------------------------------------------------------------
// safetensors

static const char *const meta_keys[6] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size",
                                         "padded_vocab_size"};

static int *cfg_field(dt_gpt_config *c, int i) {
    int *f[6] = {&c->n_layer, &c->n_head, &c->n_embd, &c->block_size, &c->vocab_size, &c->padded_vocab_size};
    return f[i];
}

int dt_gpt_weights_meta(const dt_gpt_config *cfg, char vals[6][16], dt_st_meta meta[7]) {
    dt_gpt_config c = *cfg;
    for (int i = 0; i < 6; i++) {
        snprintf(vals[i], sizeof vals[i], "%d", *cfg_field(&c, i));
        meta[i] = (dt_st_meta){meta_keys[i], vals[i]};
    }
    meta[6] = (dt_st_meta){"format", "dtrain-gpt"};
    return 7;
}

// The safetensors form of config c's weights: its metadata (vals, meta[8])
// and its 16 tensors (ti, t; data from block p, or NULL).
static void st_form(const dt_gpt_config *c, const float *p, char vals[6][16], dt_st_meta meta[8],
                    dt_tensor_info ti[16], dt_st_tensor t[16]) {
    dt_gpt_weights_meta(c, vals, meta);
    meta[7] = (dt_st_meta){"dtrain_version", dt_version()};
    dt_gpt_param_shapes(c, ti);
    for (int i = 0; i < 16; i++) {
        t[i] = (dt_st_tensor){.name = ti[i].name, .dtype = DT_F32, .ndim = ti[i].ndim,
                              .data = p ? p + ti[i].offset : NULL, .nbytes = ti[i].numel * sizeof(float)};
        for (int d = 0; d < ti[i].ndim; d++) t[i].shape[d] = ti[i].shape[d];
    }
}

dt_status dt_gpt_weights_save(const char *path, const dt_gpt_config *cfg, const float *p) {
    dt_status st = dt_gpt_config_check(cfg, path);
    if (st != DT_OK) return st;
    char vals[6][16];
    dt_st_meta meta[8];
    dt_tensor_info ti[16];
    dt_st_tensor t[16];
    st_form(cfg, p, vals, meta, ti, t);
    return dt_st_write(path, t, 16, meta, 8);
}

// A tensor-parallel shard is not a whole model's block.
static dt_status whole_model(const dt_gpt *m, const char *path) {
    int ntp, tp = dt_gpt_shard(m, &ntp);
    if (ntp > 1)
        return dt_error(DT_ERR_ARG, "%s: the model is tensor-parallel shard %d of %d: save or load the whole model's block (dt_gpt_part_fill, dt_gpt_part_take)",
                        path, tp, ntp);
    return DT_OK;
}

dt_status dt_gpt_save(const dt_gpt *m, const char *path) {
    dt_status st = whole_model(m, path);
    if (st != DT_OK) return st;
    return dt_gpt_weights_save(path, dt_gpt_get_config(m), dt_gpt_params((dt_gpt *)m));
}

static dt_status st_config(const dt_st_file *f, const char *path, dt_gpt_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 6; i++) {
        char buf[32];
        const char *v = dt_st_weights_meta_get(f, meta_keys[i], buf, sizeof buf);
        char *end;
        long x = v ? strtol(v, &end, 10) : 0;
        if (!v || end == v || *end || x < 1 || x > (1 << 30))
            return dt_error(DT_ERR_FORMAT, "%s: metadata '%s' missing or not a positive integer (not GPT weights?)",
                            path, meta_keys[i]);
        *cfg_field(c, i) = (int)x;
    }
    return dt_gpt_config_check(c, path) == DT_OK ? DT_OK : DT_ERR_FORMAT;
}

static int is_llmc(const char *path) {
    FILE *f = dt_fopen_read(path);
    if (!f) return 0;
    uint8_t h[4] = {0};
    size_t n = fread(h, 1, 4, f);
    fclose(f);
    return n == 4 && rd32(h) == DT_LLMC_MAGIC;
}

dt_status dt_gpt_read_config(const char *path, dt_gpt_config *c) {
    dt_status st;
    if (is_llmc(path)) {
        FILE *f = dt_fopen_read(path);
        uint8_t h[HEADER_BYTES];
        size_t n = f ? fread(h, 1, sizeof h, f) : 0;
        if (f) fclose(f);
        if (n < sizeof h) return dt_error(DT_ERR_FORMAT, "%s: truncated llm.c header", path);
        *c = (dt_gpt_config){.block_size = rd32(h + 8), .vocab_size = rd32(h + 12), .n_layer = rd32(h + 16),
                             .n_head = rd32(h + 20), .n_embd = rd32(h + 24), .padded_vocab_size = rd32(h + 28)};
        return dt_gpt_config_check(c, path) == DT_OK ? DT_OK : DT_ERR_FORMAT;
    }
    dt_st_file *f;
    if ((st = dt_ckpt_open(path, &f, NULL)) != DT_OK) return st;
    st = st_config(f, path, c);
    dt_st_close(f);
    return st;
}

static int same_config(const dt_gpt_config *a, const dt_gpt_config *b) {
    return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->block_size == b->block_size && a->vocab_size == b->vocab_size &&
           a->padded_vocab_size == b->padded_vocab_size;
}

// The 16 tensors of f (GPT safetensors of config c, per its metadata) into
// t: first the bytes the metadata implies against the bytes the file holds,
// then every tensor's dtype and shape, all before anything is allocated.
static dt_status st_tensors(const dt_st_file *f, const char *path, const dt_gpt_config *c, dt_tensor_info ti[16],
                            const dt_st_tensor *t[16]) {
    size_t need = dt_gpt_config_num_params(c) * sizeof(float), have = 0;
    for (int i = 0; i < dt_st_count(f); i++) have += dt_st_get(f, i)->nbytes;
    if (need > have)
        return dt_error(DT_ERR_FORMAT,
                        "%s: metadata n_layer %d, n_head %d, n_embd %d, block_size %d, padded_vocab_size %d describe %zu parameters (%zu bytes), but the file holds %zu bytes of tensors",
                        path, c->n_layer, c->n_head, c->n_embd, c->block_size, c->padded_vocab_size,
                        need / sizeof(float), need, have);
    dt_gpt_param_shapes(c, ti);
    for (int i = 0; i < 16; i++) {
        t[i] = dt_st_find(f, ti[i].name);
        if (!t[i]) return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' missing", path, ti[i].name);
        int same = t[i]->dtype == DT_F32 && t[i]->ndim == ti[i].ndim;
        for (int d = 0; same && d < ti[i].ndim; d++) same = t[i]->shape[d] == ti[i].shape[d];
        if (!same)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' has dtype %s or a shape that differs from the metadata's sizes",
                            path, ti[i].name, dt_dtype_name(t[i]->dtype));
    }
    return DT_OK;
}

// ----------------------------------------------------------------------------
// reading: a piece at a time

struct dt_gpt_weights {
    char path[4096];
    dt_gpt_config c;
    int fd;                     // an llm.c file; -1: safetensors (f)
    dt_st_file *f;
    dt_tensor_info ti[16];
    const dt_st_tensor *t[16];
};

void dt_gpt_weights_close(dt_gpt_weights *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    dt_st_close(w->f);
    free(w);
}

// An llm.c file: its header, checked against its size, then its values,
// streamed a piece at a time for NaN and Inf.
static dt_status open_llmc(dt_gpt_weights *w) {
    const char *path = w->path;
    dt_status st = dt_open_read(path, &w->fd);
    if (st != DT_OK) return st;
    struct stat sb;
    if (fstat(w->fd, &sb) != 0) return dt_error(DT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    size_t len = (size_t)sb.st_size;
    uint8_t h[HEADER_BYTES];
    if ((st = dt_read_at(w->fd, 0, h, len < HEADER_BYTES ? len : HEADER_BYTES, path)) != DT_OK ||
        (st = llmc_header(h, len, path, &w->c)) != DT_OK)
        return st;
    size_t np = dt_gpt_config_num_params(&w->c), bad = 0, piece = DT_ST_PIECE / sizeof(float);
    float *buf = malloc(sizeof(float) * (np < piece ? np : piece));
    if (!buf) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    for (size_t a = 0, m; a < np && st == DT_OK; a += m) {
        m = np - a < piece ? np - a : piece;
        if ((st = dt_read_at(w->fd, HEADER_BYTES + sizeof(float) * a, buf, sizeof(float) * m, path)) == DT_OK)
            bad += dt_count_nonfinite(buf, m, DT_F32);
    }
    free(buf);
    if (st == DT_OK && bad)
        st = dt_error(DT_ERR_NUMERIC, "%s: %zu of %zu values are NaN or Inf (weights of a run that diverged?); "
                      "refused", path, bad, np);
    return st;
}

dt_status dt_gpt_weights_open(dt_gpt_weights **out, const char *path, dt_gpt_config *c) {
    *out = NULL;
    dt_gpt_weights *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    w->fd = -1;
    snprintf(w->path, sizeof w->path, "%s", path);
    dt_status st;
    if (is_llmc(path)) st = open_llmc(w);
    else if ((st = dt_ckpt_open(path, &w->f, NULL)) == DT_OK && (st = dt_st_check_finite(w->f, path)) == DT_OK &&
             (st = st_config(w->f, path, &w->c)) == DT_OK)
        st = st_tensors(w->f, path, &w->c, w->ti, w->t);
    if (st != DT_OK) {
        dt_gpt_weights_close(w);
        return st;
    }
    *c = w->c;
    *out = w;
    return DT_OK;
}

dt_status dt_gpt_weights_read(const dt_gpt_weights *w, size_t lo, size_t hi, float *dst) {
    size_t np = dt_gpt_config_num_params(&w->c);
    if (lo > hi || hi > np)
        return dt_error(DT_ERR_ARG, "%s: elements [%zu, %zu) of a %zu-parameter block", w->path, lo, hi, np);
    if (w->fd >= 0) return dt_read_at(w->fd, HEADER_BYTES + sizeof(float) * lo, dst, sizeof(float) * (hi - lo), w->path);
    dt_status st = DT_OK;
    for (int i = 0; i < 16 && st == DT_OK; i++) {
        size_t b = w->ti[i].offset, e = b + w->ti[i].numel, x = lo > b ? lo : b, y = hi < e ? hi : e;
        if (x < y) st = dt_st_read(w->f, w->t[i], x - b, y - x, DT_F32, dst + (x - lo));
    }
    return st;
}

dt_status dt_gpt_weights_load(const char *path, dt_gpt_config *c, float **params) {
    *params = NULL;
    dt_gpt_weights *w;
    dt_status st = dt_gpt_weights_open(&w, path, c);
    if (st != DT_OK) return st;
    size_t np = dt_gpt_config_num_params(c);
    float *p = dt_alloc(np * sizeof(float));
    st = p ? dt_gpt_weights_read(w, 0, np, p) : DT_ERR_NOMEM;  // (dt_alloc recorded the message)
    dt_gpt_weights_close(w);
    if (st != DT_OK) dt_free(p);
    else *params = p;
    return st;
}

// dt_gpt_load's reading: the runs of the model's part (dt_gpt_part_runs)
// inside the block's [lo, hi), adjacent ones (in the file and in the
// block) joined into one read.
typedef struct {
    const dt_gpt_weights *w;
    float *p;
    size_t local, whole, n;  // the run not read yet
    dt_status st;
    size_t lo, hi;
} load_run;

static void load_flush(load_run *u) {
    if (u->n && u->st == DT_OK) u->st = dt_gpt_weights_read(u->w, u->whole, u->whole + u->n, u->p + u->local);
    u->n = 0;
}

static void load_one(void *user, size_t local, size_t whole, size_t n) {
    load_run *u = user;
    size_t a = local > u->lo ? local : u->lo, b = local + n < u->hi ? local + n : u->hi;
    if (a >= b) return;
    whole += a - local, local = a, n = b - a;
    if (u->n && u->local + u->n == local && u->whole + u->n == whole) {
        u->n += n;
        return;
    }
    load_flush(u);
    u->local = local, u->whole = whole, u->n = n;
}

dt_status dt_gpt_load(dt_gpt *m, const char *path) { return dt_gpt_load_range(m, path, 0, SIZE_MAX); }

dt_status dt_gpt_load_range(dt_gpt *m, const char *path, size_t lo, size_t hi) {
    dt_gpt_config fc;
    dt_gpt_weights *w;
    dt_status st = dt_gpt_weights_open(&w, path, &fc);
    if (st != DT_OK) return st;
    const dt_gpt_config *mc = dt_gpt_get_config(m);
    if (!same_config(&fc, mc)) {
        st = dt_error(DT_ERR_FORMAT,
                      "%s: weights are for L%d H%d C%d block_size %d vocab %d (padded %d) but the model is L%d H%d C%d block_size %d vocab %d (padded %d)",
                      path, fc.n_layer, fc.n_head, fc.n_embd, fc.block_size, fc.vocab_size, fc.padded_vocab_size,
                      mc->n_layer, mc->n_head, mc->n_embd, mc->block_size, mc->vocab_size, mc->padded_vocab_size);
        dt_gpt_weights_close(w);
        return st;
    }
    load_run u = {w, dt_gpt_params(m), 0, 0, 0, DT_OK, lo, hi};
    dt_gpt_part_runs(m, load_one, &u);
    load_flush(&u);
    st = u.st;
    dt_gpt_weights_close(w);
    return st;
}

// ----------------------------------------------------------------------------
// converting: a piece at a time

dt_status dt_gpt_weights_convert(const char *in, const char *out, int to_llmc, dt_gpt_config *c) {
    dt_gpt_weights *w;
    dt_status st = dt_gpt_weights_open(&w, in, c);
    if (st != DT_OK) return st;
    size_t np = dt_gpt_config_num_params(c), piece = DT_ST_PIECE / sizeof(float);
    int32_t h[HEADER_INTS];
    char vals[6][16], *hdr = NULL;
    dt_st_meta meta[8];
    dt_tensor_info ti[16];
    dt_st_tensor t[16];
    size_t hlen = HEADER_BYTES;
    // The header dt_llmc_write or dt_gpt_weights_save writes, then the
    // block (the 16 tensors in block order, as both write them).
    st_form(c, NULL, vals, meta, ti, t);
    for (int i = 1; i < 16; i++)
        if (ti[i].offset != ti[i - 1].offset + ti[i - 1].numel)
            st = dt_error(DT_ERR_INTERNAL, "%s: GPT tensors out of block order", in);
    if (to_llmc) llmc_head(h, c);
    else if (st == DT_OK) st = dt_st_header(out, t, 16, meta, 8, &hdr, &hlen);
    float *buf = st == DT_OK ? dt_alloc(sizeof(float) * piece) : NULL;
    dt_atomic_file *f = NULL;
    if (st == DT_OK && !buf) st = DT_ERR_NOMEM;  // (recorded)
    if (st == DT_OK && (st = dt_atomic_open(&f, out)) == DT_OK) st = dt_atomic_append(f, to_llmc ? (void *)h : hdr, hlen);
    for (size_t a = 0, b; a < np && st == DT_OK; a = b) {
        b = np - a < piece ? np : a + piece;
        if ((st = dt_gpt_weights_read(w, a, b, buf)) == DT_OK) st = dt_atomic_append(f, buf, sizeof(float) * (b - a));
    }
    if (f && st == DT_OK) st = dt_atomic_commit(f);
    else dt_atomic_abort(f);
    dt_free(buf);
    free(hdr);
    dt_gpt_weights_close(w);
    return st;
}
