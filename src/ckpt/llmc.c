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

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * 4)

static int32_t rd32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

dt_status dt_llmc_parse(const uint8_t *buf, size_t len, const char *what, dt_gpt_config *c,
                        const float **params) {
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
    *params = (const float *)(buf + HEADER_BYTES);
    return DT_OK;
}

dt_status dt_llmc_write(const char *path, const dt_gpt_config *c, const float *params) {
    dt_status st = dt_gpt_config_check(c, path);
    if (st != DT_OK) return st;
    int32_t h[HEADER_INTS] = {DT_LLMC_MAGIC, DT_LLMC_VERSION, c->block_size, c->vocab_size,
                              c->n_layer, c->n_head, c->n_embd, c->padded_vocab_size};
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

dt_status dt_gpt_weights_save(const char *path, const dt_gpt_config *cfg, const float *p) {
    dt_status st = dt_gpt_config_check(cfg, path);
    if (st != DT_OK) return st;
    dt_gpt_config c = *cfg;
    char vals[6][16];
    dt_st_meta meta[8];
    dt_gpt_weights_meta(&c, vals, meta);
    meta[7] = (dt_st_meta){"dtrain_version", dt_version()};
    dt_tensor_info ti[16];
    dt_gpt_param_shapes(&c, ti);
    dt_st_tensor t[16];
    for (int i = 0; i < 16; i++) {
        t[i] = (dt_st_tensor){.name = ti[i].name, .dtype = DT_F32, .ndim = ti[i].ndim, .data = p + ti[i].offset,
                              .nbytes = ti[i].numel * sizeof(float)};
        for (int d = 0; d < ti[i].ndim; d++) t[i].shape[d] = ti[i].shape[d];
    }
    return dt_st_write(path, t, 16, meta, 8);
}

dt_status dt_gpt_save(const dt_gpt *m, const char *path) {
    return dt_gpt_weights_save(path, dt_gpt_get_config(m), dt_gpt_params((dt_gpt *)m));
}

static dt_status read_all(const char *path, uint8_t **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    if (sz < 0) {
        fclose(f);
        return dt_error(DT_ERR_IO, "%s: cannot determine size", path);
    }
    *buf = malloc((size_t)sz + 1);
    if (!*buf) {
        fclose(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory for %ld bytes", path, sz);
    }
    *len = fread(*buf, 1, (size_t)sz, f);
    fclose(f);
    if (*len != (size_t)sz) {
        free(*buf);
        return dt_error(DT_ERR_IO, "%s: short read", path);
    }
    return DT_OK;
}

static dt_status st_config(const dt_st_file *f, const char *path, dt_gpt_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < 6; i++) {
        const char *v = dt_st_meta_get(f, meta_keys[i]);
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
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint8_t h[4] = {0};
    size_t n = fread(h, 1, 4, f);
    fclose(f);
    return n == 4 && rd32(h) == DT_LLMC_MAGIC;
}

dt_status dt_gpt_read_config(const char *path, dt_gpt_config *c) {
    dt_status st;
    if (is_llmc(path)) {
        FILE *f = fopen(path, "rb");
        uint8_t h[HEADER_BYTES];
        size_t n = f ? fread(h, 1, sizeof h, f) : 0;
        if (f) fclose(f);
        if (n < sizeof h) return dt_error(DT_ERR_FORMAT, "%s: truncated llm.c header", path);
        *c = (dt_gpt_config){.block_size = rd32(h + 8), .vocab_size = rd32(h + 12), .n_layer = rd32(h + 16),
                             .n_head = rd32(h + 20), .n_embd = rd32(h + 24), .padded_vocab_size = rd32(h + 28)};
        return dt_gpt_config_check(c, path) == DT_OK ? DT_OK : DT_ERR_FORMAT;
    }
    dt_st_file *f;
    if ((st = dt_st_open(&f, path)) != DT_OK) return st;
    st = st_config(f, path, c);
    dt_st_close(f);
    return st;
}

static int same_config(const dt_gpt_config *a, const dt_gpt_config *b) {
    return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->block_size == b->block_size && a->vocab_size == b->vocab_size &&
           a->padded_vocab_size == b->padded_vocab_size;
}

static dt_status mismatch(const char *path, const dt_gpt_config *f, const dt_gpt_config *m) {
    return dt_error(DT_ERR_FORMAT,
                    "%s: weights are for L%d H%d C%d block_size %d vocab %d (padded %d) but the model is L%d H%d C%d block_size %d vocab %d (padded %d)",
                    path, f->n_layer, f->n_head, f->n_embd, f->block_size, f->vocab_size, f->padded_vocab_size,
                    m->n_layer, m->n_head, m->n_embd, m->block_size, m->vocab_size, m->padded_vocab_size);
}

// Copies the 16 tensors of f (a GPT safetensors file of config c) into p.
static dt_status st_params(const dt_st_file *f, const char *path, const dt_gpt_config *c, float *p) {
    dt_tensor_info ti[16];
    dt_gpt_param_shapes(c, ti);
    for (int i = 0; i < 16; i++) {
        const dt_st_tensor *t = dt_st_find(f, ti[i].name);
        if (!t) return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' missing", path, ti[i].name);
        int same = t->dtype == DT_F32 && t->ndim == ti[i].ndim;
        for (int d = 0; same && d < ti[i].ndim; d++) same = t->shape[d] == ti[i].shape[d];
        if (!same)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' has dtype %s or a shape that differs from the metadata's sizes",
                            path, ti[i].name, dt_dtype_name(t->dtype));
        memcpy(p + ti[i].offset, t->data, t->nbytes);
    }
    return DT_OK;
}

dt_status dt_gpt_weights_load(const char *path, dt_gpt_config *c, float **params) {
    *params = NULL;
    dt_status st;
    if (is_llmc(path)) {
        uint8_t *buf = NULL;
        size_t len = 0;
        const float *p;
        if ((st = read_all(path, &buf, &len)) != DT_OK) return st;
        st = dt_llmc_parse(buf, len, path, c, &p);
        if (st == DT_OK) {
            size_t n = dt_gpt_config_num_params(c);
            if (!(*params = dt_alloc(n * sizeof(float)))) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
            else memcpy(*params, p, n * sizeof(float));
        }
        free(buf);
        return st;
    }
    dt_st_file *f;
    if ((st = dt_st_open(&f, path)) != DT_OK) return st;
    if ((st = st_config(f, path, c)) == DT_OK) {
        if (!(*params = dt_alloc(dt_gpt_config_num_params(c) * sizeof(float))))
            st = dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
        else if ((st = st_params(f, path, c, *params)) != DT_OK) {
            dt_free(*params);
            *params = NULL;
        }
    }
    dt_st_close(f);
    return st;
}

dt_status dt_gpt_load(dt_gpt *m, const char *path) {
    const dt_gpt_config *mc = dt_gpt_get_config(m);
    dt_gpt_config fc;
    float *p;
    dt_status st = dt_gpt_weights_load(path, &fc, &p);
    if (st != DT_OK) return st;
    if (!same_config(&fc, mc)) st = mismatch(path, &fc, mc);
    else memcpy(dt_gpt_params(m), p, dt_gpt_num_params(m) * sizeof(float));
    dt_free(p);
    return st;
}
