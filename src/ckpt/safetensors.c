/* safetensors read/write, and model weights in that format. */
#include "dtrain/ckpt.h"
#include "ckpt/st_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct dt_st_file {
    uint8_t *buf;        // the whole file
    size_t len;
    int n;
    dt_st_tensor *t;
    char **names;
    cJSON *meta;         // the "__metadata__" object (owned by root)
    cJSON *root;
};

static int dtype_from_name(const char *s) {
    for (int t = DT_F32; t <= DT_U8; t++)
        if (!strcmp(s, dt_dtype_name((dt_dtype)t))) return t;
    return -1;
}

dt_status dt_st_header(const char *path, const dt_st_tensor *tensors, int n, const dt_st_meta *meta, int nmeta,
                      char **hdr, size_t *hlen) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    if (nmeta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; i < nmeta; i++) cJSON_AddStringToObject(m, meta[i].key, meta[i].value);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = &tensors[i];
        if (cJSON_GetObjectItemCaseSensitive(root, t->name)) {
            cJSON_Delete(root);
            return dt_error(DT_ERR_ARG, "%s: tensor name '%s' used twice", path, t->name);
        }
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        if (numel * dt_dtype_size(t->dtype) != t->nbytes) {
            cJSON_Delete(root);
            return dt_error(DT_ERR_ARG, "%s: tensor '%s' has %zu bytes, its shape needs %zu", path,
                            t->name, t->nbytes, numel * dt_dtype_size(t->dtype));
        }
        cJSON *o = cJSON_AddObjectToObject(root, t->name);
        cJSON_AddStringToObject(o, "dtype", dt_dtype_name(t->dtype));
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *r = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(r, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(r, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    size_t hl = strlen(json), padded = (hl + 7) & ~(size_t)7;
    if (!(*hdr = malloc(8 + padded))) {
        free(json);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    uint64_t le = padded;
    for (int i = 0; i < 8; i++) (*hdr)[i] = (char)(le >> (8 * i));
    memcpy(*hdr + 8, json, hl);
    memset(*hdr + 8 + hl, ' ', padded - hl);
    free(json);
    *hlen = 8 + padded;
    return DT_OK;
}

dt_status dt_st_write(const char *path, const dt_st_tensor *tensors, int n, const dt_st_meta *meta,
                      int nmeta) {
    char *hdr;
    size_t hlen;
    dt_status st = dt_st_header(path, tensors, n, meta, nmeta, &hdr, &hlen);
    if (st != DT_OK) return st;
    const void **parts = malloc(sizeof(void *) * (n + 1));
    size_t *sizes = malloc(sizeof(size_t) * (n + 1));
    if (!parts || !sizes) {
        free(hdr), free(parts), free(sizes);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    parts[0] = hdr;
    sizes[0] = hlen;
    for (int i = 0; i < n; i++) {
        parts[i + 1] = tensors[i].data;
        sizes[i + 1] = tensors[i].nbytes;
    }
    st = dt_write_atomic(path, parts, sizes, n + 1);
    free(hdr), free(parts), free(sizes);
    return st;
}

void dt_st_close(dt_st_file *f) {
    if (!f) return;
    free(f->buf);
    free(f->t);
    cJSON_Delete(f->root);
    free(f);
}

static int cmp_begin(const void *a, const void *b) {
    const dt_st_tensor *x = a, *y = b;
    const uint8_t *p = x->data, *q = y->data;
    return p < q ? -1 : p > q;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const dt_st_tensor *)a)->name, ((const dt_st_tensor *)b)->name);
}

// Takes ownership of buf.
static dt_status parse_owned(dt_st_file **out, uint8_t *buf, size_t len, const char *what) {
    *out = NULL;
    dt_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        free(buf);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", what);
    }
    f->buf = buf;
    f->len = len;
    dt_status st = DT_OK;
    if (len < 8) {
        st = dt_error(DT_ERR_FORMAT, "%s: not a safetensors file (%zu bytes, shorter than the 8-byte header length)", what, len);
        goto fail;
    }
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[i] << (8 * i);
    if (hl == 0 || hl > len - 8 || hl > (100u << 20)) {
        st = dt_error(DT_ERR_FORMAT, "%s: safetensors header length %llu does not fit a %zu-byte file (truncated or not safetensors)",
                      what, (unsigned long long)hl, len);
        goto fail;
    }
    const char *json_end = NULL;
    f->root = cJSON_ParseWithLengthOpts((const char *)buf + 8, (size_t)hl, &json_end, 0);
    if (!f->root || !cJSON_IsObject(f->root)) {
        st = dt_error(DT_ERR_FORMAT, "%s: safetensors header is not a JSON object", what);
        goto fail;
    }
    // After the JSON only the padding (spaces) may follow.
    for (const char *q = json_end; q < (const char *)buf + 8 + hl; q++)
        if (*q != ' ') {
            st = dt_error(DT_ERR_FORMAT, "%s: unexpected byte 0x%02x after the safetensors header's JSON", what,
                          (unsigned char)*q);
            goto fail;
        }
    size_t data_len = len - 8 - hl;
    const uint8_t *data = buf + 8 + hl;
    int count = cJSON_GetArraySize(f->root);
    f->t = calloc(count > 0 ? count : 1, sizeof *f->t);
    if (!f->t) {
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory", what);
        goto fail;
    }
    cJSON *it;
    cJSON_ArrayForEach(it, f->root) {
        if (!strcmp(it->string, "__metadata__")) {
            cJSON *v;
            if (!cJSON_IsObject(it)) goto bad_meta;
            cJSON_ArrayForEach(v, it) if (!cJSON_IsString(v)) goto bad_meta;
            f->meta = it;
            continue;
        bad_meta:
            st = dt_error(DT_ERR_FORMAT, "%s: __metadata__ must map strings to strings", what);
            goto fail;
        }
        dt_st_tensor *t = &f->t[f->n];
        t->name = it->string;
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        int dti = cJSON_IsString(dt) ? dtype_from_name(dt->valuestring) : -1;
        if (!cJSON_IsObject(it) || dti < 0 || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2 || cJSON_GetArraySize(sh) > 8) {
            st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s': needs a known dtype, a shape of at most 8 dims and data_offsets [begin, end]",
                          what, it->string);
            goto fail;
        }
        t->dtype = (dt_dtype)dti;
        size_t numel = 1;
        cJSON *d;
        cJSON_ArrayForEach(d, sh) {
            if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 1e15 ||
                d->valuedouble != (double)(int64_t)d->valuedouble) {
                st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s': bad shape entry", what, t->name);
                goto fail;
            }
            size_t dim = (size_t)d->valuedouble;
            t->shape[t->ndim++] = (int64_t)dim;
            // Checked before multiplying: numel * dim must not wrap around.
            if (dim && numel > ((size_t)1 << 48) / dim) {
                st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s': shape too large", what, t->name);
                goto fail;
            }
            numel *= dim;
        }
        double b = cJSON_GetArrayItem(off, 0)->valuedouble, e = cJSON_GetArrayItem(off, 1)->valuedouble;
        if (!cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) ||
            b < 0 || e < b || e > (double)data_len || b != floor(b) || e != floor(e)) {
            st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%.17g, %.17g] are not whole numbers with begin <= end <= %zu, the data size (truncated?)",
                          what, t->name, b, e, data_len);
            goto fail;
        }
        t->nbytes = (size_t)e - (size_t)b;
        if (t->nbytes != numel * dt_dtype_size(t->dtype)) {
            st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s': %zu bytes do not match its shape (%zu elements of %s)",
                          what, t->name, t->nbytes, numel, dt_dtype_name(t->dtype));
            goto fail;
        }
        t->data = data + (size_t)b;
        f->n++;
    }
    // Names must be unique (JSON parsers differ on which duplicate wins) and
    // byte ranges must not overlap.
    if (f->n > 1) {
        dt_st_tensor *s = malloc(sizeof *s * f->n);
        if (!s) {
            st = dt_error(DT_ERR_NOMEM, "%s: out of memory", what);
            goto fail;
        }
        memcpy(s, f->t, sizeof *s * f->n);
        qsort(s, f->n, sizeof *s, cmp_name);
        for (int i = 1; i < f->n; i++)
            if (!strcmp(s[i].name, s[i - 1].name)) {
                st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", what, s[i].name);
                free(s);
                goto fail;
            }
        qsort(s, f->n, sizeof *s, cmp_begin);
        for (int i = 1; i < f->n; i++)
            if ((const uint8_t *)s[i].data < (const uint8_t *)s[i - 1].data + s[i - 1].nbytes) {
                st = dt_error(DT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", what, s[i - 1].name, s[i].name);
                free(s);
                goto fail;
            }
        free(s);
    }
    *out = f;
    return DT_OK;
fail:
    dt_st_close(f);
    return st;
}

dt_status dt_st_parse(dt_st_file **out, const uint8_t *buf, size_t len, const char *what) {
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return dt_error(DT_ERR_NOMEM, "%s: out of memory", what);
    memcpy(copy, buf, len);
    return parse_owned(out, copy, len, what);
}

dt_status dt_st_build(dt_st_file **out, const dt_st_tensor *tensors, int n, const dt_st_meta *meta, int nmeta,
                      const char *what) {
    *out = NULL;
    char *hdr;
    size_t hlen, len;
    dt_status st = dt_st_header(what, tensors, n, meta, nmeta, &hdr, &hlen);
    if (st != DT_OK) return st;
    len = hlen;
    for (int i = 0; i < n; i++) len += tensors[i].nbytes;
    uint8_t *buf = malloc(len);
    if (!buf) {
        free(hdr);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu bytes", what, len);
    }
    memcpy(buf, hdr, hlen);
    free(hdr);
    for (size_t i = 0, off = hlen; i < (size_t)n; off += tensors[i++].nbytes)
        if (tensors[i].nbytes) memcpy(buf + off, tensors[i].data, tensors[i].nbytes);
    return parse_owned(out, buf, len, what);
}

size_t dt_count_nonfinite(const void *data, size_t n, dt_dtype type) {
    const uint8_t *p = data;
    size_t bad = 0;
    if (type == DT_F32)
        for (size_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);  // (a file's data may not be aligned for floats)
            bad += (v & 0x7f800000u) == 0x7f800000u;
        }
    else if (type == DT_BF16 || type == DT_F16) {
        uint16_t e = type == DT_BF16 ? 0x7f80 : 0x7c00;
        for (size_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            bad += (v & e) == e;
        }
    }
    return bad;
}

dt_status dt_st_check_finite(const dt_st_file *f, const char *path) {
    size_t bad = 0, size;
    const char *first = NULL;
    for (int i = 0; i < f->n; i++) {
        const dt_st_tensor *t = &f->t[i];
        size = dt_dtype_size(t->dtype);
        size_t k = size ? dt_count_nonfinite(t->data, t->nbytes / size, t->dtype) : 0;
        if (k && !first) first = t->name;
        bad += k;
    }
    if (!bad) return DT_OK;
    return dt_error(DT_ERR_NUMERIC, "%s: %zu values are NaN or Inf, the first in tensor '%.64s' (weights of a run that "
                    "diverged?); refused", path, bad, first);
}

dt_status dt_st_open(dt_st_file **out, const char *path) {
    *out = NULL;
    FILE *fp = dt_fopen_read(path);
    if (!fp) return DT_ERR_IO;  // (recorded)
    if (fseek(fp, 0, SEEK_END) != 0) {
        fclose(fp);
        return dt_error(DT_ERR_IO, "%s: cannot seek", path);
    }
    long sz = ftell(fp);
    rewind(fp);
    uint8_t *buf = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (!buf) {
        fclose(fp);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, (size_t)sz, fp);
    fclose(fp);
    if (got != (size_t)sz) {
        free(buf);
        return dt_error(DT_ERR_IO, "%s: read %zu of %ld bytes", path, got, sz);
    }
    return parse_owned(out, buf, (size_t)sz, path);
}

int dt_st_count(const dt_st_file *f) { return f->n; }
const dt_st_tensor *dt_st_get(const dt_st_file *f, int i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }

const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

const char *dt_st_meta_get(const dt_st_file *f, const char *key) {
    if (!f->meta) return NULL;
    cJSON *v = cJSON_GetObjectItemCaseSensitive(f->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

// ----------------------------------------------------------------------------
// model weights

dt_status dt_model_save(dt_model *m, const char *path, const dt_st_meta *meta, int nmeta) {
    int n = dt_model_num_tensors(m);
    dt_st_tensor *t = calloc(n > 0 ? n : 1, sizeof *t);
    if (!t) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    const float *p = dt_model_params(m);
    for (int i = 0; i < n; i++) {
        const dt_tensor_info *ti = dt_model_tensor(m, i);
        t[i].name = ti->name;
        t[i].dtype = DT_F32;
        t[i].ndim = ti->ndim;
        memcpy(t[i].shape, ti->shape, sizeof ti->shape);
        t[i].data = p + ti->offset;
        t[i].nbytes = ti->numel * sizeof(float);
    }
    dt_status st = dt_st_write(path, t, n, meta, nmeta);
    free(t);
    return st;
}

// "[1024, 784]"
void dt_st_format_shape(char *buf, size_t n, const int64_t *shape, int ndim) {
    size_t w = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && w < n; d++)
        w += (size_t)snprintf(buf + w, n - w, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (w < n) snprintf(buf + w, n - w, "]");
}

dt_status dt_st_expect(const dt_st_file *f, const char *path, const char *name, dt_dtype dtype, int ndim,
                       const int64_t *shape, dt_status code, const dt_st_tensor **out) {
    const dt_st_tensor *t = dt_st_find(f, name);
    if (!t) return dt_error(code, "%s: tensor '%s' missing (from a different model?)", path, name);
    int same = t->dtype == dtype && t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
    if (!same) {
        char got[160], want[160];
        dt_st_format_shape(got, sizeof got, t->shape, t->ndim);
        dt_st_format_shape(want, sizeof want, shape, ndim);
        return dt_error(code, "%s: tensor '%s' is %s %s, the model needs %s %s (from a different model?)", path,
                        name, dt_dtype_name(t->dtype), got, dt_dtype_name(dtype), want);
    }
    *out = t;
    return DT_OK;
}

dt_status dt_model_load(dt_model *m, const char *path) {
    dt_st_file *f;
    dt_status st = dt_ckpt_open(path, &f, NULL);
    if (st != DT_OK) return st;
    st = dt_st_check_finite(f, path);
    // Every tensor checked before the first is copied.
    float *p = dt_model_params(m);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < dt_model_num_tensors(m) && st == DT_OK; i++) {
            const dt_tensor_info *ti = dt_model_tensor(m, i);
            const dt_st_tensor *t;
            st = dt_st_expect(f, path, ti->name, DT_F32, ti->ndim, ti->shape, DT_ERR_FORMAT, &t);
            if (st == DT_OK && pass) memcpy(p + ti->offset, t->data, t->nbytes);
        }
    dt_st_close(f);
    return st;
}
