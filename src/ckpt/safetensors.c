/* safetensors read/write, and model weights in that format. */
#include "dtrain/ckpt.h"
#include "ckpt/st_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

// Where a tensor's bytes lie: extents of files, in order. A file's tensor
// has one, in that file; a view of other files' tensors (dt_st_compose: a
// sharded checkpoint gathered) has one for each file its elements come from.
typedef struct {
    const dt_st_file *src;  // the file (its descriptor or buffer) that holds them
    uint64_t off, len;      // bytes of src, from the start of the file
} st_extent;

// A file open for reading: its header, parsed, and its descriptor (or, from
// dt_st_parse, a copy of its bytes). The data stays on disk: dt_st_read
// reads ranges of it, dt_st_scan streams all of it once.
struct dt_st_file {
    char *path;            // names it in errors
    dt_rfile *rf;          // NULL: none (a buffer, or a view)
    uint8_t *mem;          // dt_st_parse's copy of the file
    size_t len;            // the file's size
    int n, cap;
    dt_st_tensor *t;       // data NULL: read with dt_st_read
    int *e0, *ne;          // tensor i's extents: ext[e0[i]] .. ext[e0[i] + ne[i] - 1]
    st_extent *ext;
    int next, ecap;
    char **names;          // a view's tensor names (a file's are in root)
    dt_st_file **kids;     // the files a view reads (closed with it)
    int nkids;
    cJSON *meta;           // the "__metadata__" object (owned by root)
    cJSON *root;
    int scanned;           // dt_st_scan went through every tensor:
    size_t nonfinite;      //   the NaN and Inf values it counted,
    int first_bad;         //   the first tensor (in t's order) with one (-1: none)
};

static _Atomic uint64_t g_read;  // bytes read from files' data (dt_st_bytes_read)

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
    dt_rfile_close(f->rf);
    for (int i = 0; i < f->nkids; i++) dt_st_close(f->kids[i]);
    for (int i = 0; f->names && i < f->n; i++) free(f->names[i]);
    free(f->kids);
    free(f->names);
    free(f->mem);
    free(f->t);
    free(f->e0);
    free(f->ne);
    free(f->ext);
    free(f->path);
    cJSON_Delete(f->root);
    free(f);
}

static dt_st_file *file_new(const char *what) {
    dt_st_file *f = calloc(1, sizeof *f);
    if (f && !(f->path = strdup(what))) {
        free(f);
        f = NULL;
    }
    if (!f) return NULL;
    f->first_bad = -1;
    return f;
}

// Room for one more tensor (and its extent) in f.
static int grow(dt_st_file *f) {
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 16;
        dt_st_tensor *t = realloc(f->t, sizeof *t * (size_t)cap);
        if (t) f->t = t;
        int *e0 = t ? realloc(f->e0, sizeof *e0 * (size_t)cap) : NULL;
        if (e0) f->e0 = e0;
        int *ne = e0 ? realloc(f->ne, sizeof *ne * (size_t)cap) : NULL;
        if (ne) f->ne = ne;
        if (!ne) return 0;
        f->cap = cap;
    }
    if (f->next == f->ecap) {
        int cap = f->ecap ? 2 * f->ecap : 16;
        st_extent *e = realloc(f->ext, sizeof *e * (size_t)cap);
        if (!e) return 0;
        f->ext = e;
        f->ecap = cap;
    }
    return 1;
}

// Bytes [off, off + n) of s's file (its descriptor or its buffer) into dst.
static dt_status read_src(const dt_st_file *s, uint64_t off, void *dst, size_t n) {
    if (!s->rf) {
        if (off > s->len || n > s->len - off)
            return dt_error(DT_ERR_IO, "%s: bytes [%llu, %llu) are past its end (%zu bytes)", s->path,
                            (unsigned long long)off, (unsigned long long)(off + n), s->len);
        if (n) memcpy(dst, s->mem + off, n);
        return DT_OK;
    }
    atomic_fetch_add(&g_read, (uint64_t)n);
    return dt_rfile_read(s->rf, off, dst, n);
}

uint64_t dt_st_bytes_read(void) { return atomic_load(&g_read); }

// Bytes [at, at + n) of tensor i of f, through its extents, into dst.
static dt_status read_bytes(const dt_st_file *f, int i, uint64_t at, void *dst, size_t n) {
    uint8_t *p = dst;
    for (int k = f->e0[i]; n && k < f->e0[i] + f->ne[i]; k++) {
        const st_extent *e = &f->ext[k];
        if (at >= e->len) {
            at -= e->len;
            continue;
        }
        size_t m = e->len - at < n ? (size_t)(e->len - at) : n;
        dt_status st = read_src(e->src, e->off + at, p, m);
        if (st != DT_OK) return st;
        p += m, n -= m, at = 0;
    }
    return n ? dt_error(DT_ERR_INTERNAL, "%s: tensor '%s' has fewer bytes than asked", f->path, f->t[i].name) : DT_OK;
}

// The tensor t of f as an index; -1 (recorded) when t is not one of f's.
static int tensor_index(const dt_st_file *f, const dt_st_tensor *t) {
    if (t && t >= f->t && t < f->t + f->n) return (int)(t - f->t);
    dt_error(DT_ERR_ARG, "%s: a tensor of another file", f->path);
    return -1;
}

dt_status dt_st_read(const dt_st_file *f, const dt_st_tensor *t, size_t first, size_t n, dt_dtype as, void *dst) {
    int i = tensor_index(f, t);
    if (i < 0) return DT_ERR_ARG;
    size_t es = dt_dtype_size(t->dtype), numel = t->nbytes / es;
    if (first > numel || n > numel - first)
        return dt_error(DT_ERR_ARG, "%s: tensor '%s': elements [%zu, %zu) are outside its %zu", f->path, t->name, first,
                        first + n, numel);
    if (as == t->dtype) return read_bytes(f, i, (uint64_t)first * es, dst, n * es);
    int widen = as == DT_F32 && (t->dtype == DT_BF16 || t->dtype == DT_F16);
    if (!widen && !(t->dtype == DT_F32 && (as == DT_BF16 || as == DT_F16)))
        return dt_error(DT_ERR_ARG, "%s: tensor '%s' is %s: it reads as %s, or as F32 from BF16/F16 and BF16/F16 from F32",
                        f->path, t->name, dt_dtype_name(t->dtype), dt_dtype_name(t->dtype));
    enum { PIECE = 1 << 16 };  // elements converted at a time
    float *buf = malloc(sizeof(float) * (n < PIECE ? n + 1 : PIECE));
    if (!buf) return dt_error(DT_ERR_NOMEM, "%s: out of memory", f->path);
    dt_status st = DT_OK;
    for (size_t k = 0, m; k < n && st == DT_OK; k += m) {
        m = n - k < PIECE ? n - k : PIECE;
        if ((st = read_bytes(f, i, (uint64_t)(first + k) * es, buf, m * es)) != DT_OK) break;
        if (widen) dt_to_f32((float *)dst + k, buf, m, t->dtype);
        else dt_from_f32((uint16_t *)dst + k, buf, m, as);
    }
    free(buf);
    return st;
}

// A tensor's place, for sorting: by file and offset, or by name.
typedef struct {
    const char *name;
    const dt_st_file *src;  // NULL: no bytes (sorts first)
    uint64_t off, end;
    int i;
} st_place;

static void places(const dt_st_file *f, st_place *p) {
    for (int i = 0; i < f->n; i++) {
        const st_extent *e = f->ne[i] ? &f->ext[f->e0[i]] : NULL;
        p[i] = (st_place){f->t[i].name, e ? e->src : NULL, e ? e->off : 0, e ? e->off + f->t[i].nbytes : 0, i};
    }
}

static int cmp_disk(const void *a, const void *b) {
    const st_place *x = a, *y = b;
    if (x->src != y->src) return !x->src ? -1 : !y->src ? 1 : x->src < y->src ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

static int cmp_place_name(const void *a, const void *b) {
    return strcmp(((const st_place *)a)->name, ((const st_place *)b)->name);
}

dt_status dt_st_scan(dt_st_file *f, const dt_st_tensor *const *order, dt_st_piece_fn fn, void *user) {
    size_t big = 0;
    for (int i = 0; i < f->n; i++) big = f->t[i].nbytes > big ? f->t[i].nbytes : big;
    size_t cap = big < DT_ST_PIECE ? big : DT_ST_PIECE;
    uint8_t *buf = malloc(cap + 8);
    st_place *ord = malloc(sizeof *ord * (size_t)(f->n + 1));
    if (!buf || !ord) {
        free(buf), free(ord);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", f->path);
    }
    dt_status st = DT_OK;
    places(f, ord);
    if (!order) qsort(ord, (size_t)f->n, sizeof *ord, cmp_disk);
    for (int k = 0; order && k < f->n && st == DT_OK; k++)
        if ((ord[k].i = tensor_index(f, order[k])) < 0) st = DT_ERR_ARG;
    size_t bad = 0;
    int first = -1;
    for (int k = 0; k < f->n && st == DT_OK; k++) {
        int i = ord[k].i;
        const dt_st_tensor *t = &f->t[i];
        size_t at = 0, es = dt_dtype_size(t->dtype);
        do {
            size_t m = t->nbytes - at < cap ? t->nbytes - at : cap;
            if ((st = read_bytes(f, i, at, buf, m)) != DT_OK) break;
            size_t b = dt_count_nonfinite(buf, m / es, t->dtype);
            if (b && (first < 0 || i < first)) first = i;
            bad += b;
            if (fn && (st = fn(user, t, at, buf, m)) != DT_OK) break;
            dt_alive();  // (a pass over gigabytes goes on: not a hang)
            at += m;
        } while (at < t->nbytes);
    }
    free(buf);
    free(ord);
    if (st != DT_OK) return st;
    f->scanned = 1;
    f->nonfinite = bad;
    f->first_bad = first;
    return DT_OK;
}

// Parses the header of f, hl bytes of JSON at h (the file's bytes 8 to
// 8 + hl), against the file's size f->len: the tensors' places in f.
static dt_status parse_header(dt_st_file *f, const char *h, uint64_t hl) {
    const char *what = f->path;
    const char *json_end = NULL;
    f->root = cJSON_ParseWithLengthOpts(h, (size_t)hl, &json_end, 0);
    if (!f->root || !cJSON_IsObject(f->root))
        return dt_error(DT_ERR_FORMAT, "%s: safetensors header is not a JSON object", what);
    // After the JSON only the padding (spaces) may follow.
    for (const char *q = json_end; q < h + hl; q++)
        if (*q != ' ')
            return dt_error(DT_ERR_FORMAT, "%s: unexpected byte 0x%02x after the safetensors header's JSON", what,
                            (unsigned char)*q);
    size_t data_at = 8 + (size_t)hl, data_len = f->len - data_at;
    cJSON *it;
    cJSON_ArrayForEach(it, f->root) {
        if (!strcmp(it->string, "__metadata__")) {
            cJSON *v;
            if (!cJSON_IsObject(it)) goto bad_meta;
            cJSON_ArrayForEach(v, it) if (!cJSON_IsString(v)) goto bad_meta;
            f->meta = it;
            continue;
        bad_meta:
            return dt_error(DT_ERR_FORMAT, "%s: __metadata__ must map strings to strings", what);
        }
        if (!grow(f)) return dt_error(DT_ERR_NOMEM, "%s: out of memory", what);
        dt_st_tensor *t = &f->t[f->n];
        memset(t, 0, sizeof *t);
        t->name = it->string;
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        int dti = cJSON_IsString(dt) ? dtype_from_name(dt->valuestring) : -1;
        if (!cJSON_IsObject(it) || dti < 0 || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2 || cJSON_GetArraySize(sh) > 8)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': needs a known dtype, a shape of at most 8 dims and data_offsets [begin, end]",
                            what, it->string);
        t->dtype = (dt_dtype)dti;
        size_t numel = 1;
        cJSON *d;
        cJSON_ArrayForEach(d, sh) {
            if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 1e15 ||
                d->valuedouble != (double)(int64_t)d->valuedouble)
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': bad shape entry", what, t->name);
            size_t dim = (size_t)d->valuedouble;
            t->shape[t->ndim++] = (int64_t)dim;
            // Checked before multiplying: numel * dim must not wrap around.
            if (dim && numel > ((size_t)1 << 48) / dim)
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': shape too large", what, t->name);
            numel *= dim;
        }
        double b = cJSON_GetArrayItem(off, 0)->valuedouble, e = cJSON_GetArrayItem(off, 1)->valuedouble;
        if (!cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) ||
            b < 0 || e < b || e > (double)data_len || b != floor(b) || e != floor(e))
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%.17g, %.17g] are not whole numbers with begin <= end <= %zu, the data size (truncated?)",
                            what, t->name, b, e, data_len);
        t->nbytes = (size_t)e - (size_t)b;
        if (t->nbytes != numel * dt_dtype_size(t->dtype))
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': %zu bytes do not match its shape (%zu elements of %s)",
                            what, t->name, t->nbytes, numel, dt_dtype_name(t->dtype));
        f->e0[f->n] = f->next;
        f->ne[f->n] = 1;
        f->ext[f->next++] = (st_extent){f, data_at + (size_t)b, t->nbytes};
        f->n++;
    }
    return DT_OK;
}

// Names must be unique (JSON parsers differ on which duplicate wins) and
// byte ranges must not overlap.
static dt_status check_disjoint(const dt_st_file *f) {
    if (f->n < 2) return DT_OK;
    st_place *s = malloc(sizeof *s * (size_t)f->n);
    if (!s) return dt_error(DT_ERR_NOMEM, "%s: out of memory", f->path);
    places(f, s);
    dt_status st = DT_OK;
    qsort(s, (size_t)f->n, sizeof *s, cmp_place_name);
    for (int i = 1; i < f->n && st == DT_OK; i++)
        if (!strcmp(s[i].name, s[i - 1].name))
            st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", f->path, s[i].name);
    if (st == DT_OK) qsort(s, (size_t)f->n, sizeof *s, cmp_disk);
    for (int i = 1; i < f->n && st == DT_OK; i++)
        if (s[i].src && s[i - 1].src && s[i].off < s[i - 1].end)
            st = dt_error(DT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", f->path, s[i - 1].name, s[i].name);
    free(s);
    return st;
}

// The header of f (its descriptor or buffer open, f->len its size): the
// length, checked against the file's size and a cap before anything is
// allocated for it, then the JSON, read and parsed; the data stays where it is.
static dt_status load_header(dt_st_file *f) {
    const char *what = f->path;
    if (f->len < 8)
        return dt_error(DT_ERR_FORMAT, "%s: not a safetensors file (%zu bytes, shorter than the 8-byte header length)",
                        what, f->len);
    uint8_t b8[8];
    dt_status st = read_src(f, 0, b8, 8);
    if (st != DT_OK) return st;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)b8[i] << (8 * i);
    if (hl == 0 || hl > f->len - 8 || hl > DT_ST_MAX_HEADER)
        return dt_error(DT_ERR_FORMAT, "%s: safetensors header length %llu does not fit a %zu-byte file (truncated or not safetensors)",
                        what, (unsigned long long)hl, f->len);
    char *h = malloc((size_t)hl);
    if (!h) return dt_error(DT_ERR_NOMEM, "%s: out of memory for a %llu-byte header", what, (unsigned long long)hl);
    if ((st = read_src(f, 8, h, (size_t)hl)) == DT_OK && (st = parse_header(f, h, hl)) == DT_OK) st = check_disjoint(f);
    free(h);
    return st;
}

dt_status dt_st_parse(dt_st_file **out, const uint8_t *buf, size_t len, const char *what) {
    *out = NULL;
    dt_st_file *f = file_new(what);
    if (!f || !(f->mem = malloc(len ? len : 1))) {
        dt_st_close(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", what);
    }
    memcpy(f->mem, buf, len);
    f->len = len;
    dt_status st = load_header(f);
    if (st != DT_OK) dt_st_close(f);
    else *out = f;
    return st;
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

dt_status dt_st_check_finite(dt_st_file *f, const char *path) {
    if (!f->scanned) {
        dt_status st = dt_st_scan(f, NULL, NULL, NULL);
        if (st != DT_OK) return st;
    }
    if (!f->nonfinite) return DT_OK;
    return dt_error(DT_ERR_NUMERIC, "%s: %zu values are NaN or Inf, the first in tensor '%.64s' (weights of a run that "
                    "diverged?); refused", path, f->nonfinite, f->t[f->first_bad].name);
}

dt_status dt_st_open(dt_st_file **out, const char *path) {
    *out = NULL;
    dt_rfile *rf;
    dt_status st = dt_rfile_open(&rf, path);
    if (st != DT_OK) return st;  // (recorded)
    dt_st_file *f = file_new(path);
    if (!f) {
        dt_rfile_close(rf);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    f->rf = rf;
    f->len = (size_t)dt_rfile_size(rf);
    st = load_header(f);
    if (st != DT_OK) dt_st_close(f);
    else *out = f;
    return st;
}

// ----------------------------------------------------------------------------
// views of other files' tensors

dt_st_file *dt_st_compose(const char *what, cJSON *meta, dt_st_file **kids, int nkids) {
    dt_st_file *f = file_new(what);
    cJSON *root = cJSON_CreateObject();
    if (!f || !root || !(f->kids = calloc((size_t)nkids + 1, sizeof *f->kids))) {
        dt_st_close(f);
        cJSON_Delete(root);
        cJSON_Delete(meta);
        for (int i = 0; i < nkids; i++) dt_st_close(kids[i]);
        return NULL;
    }
    f->root = root;
    if (meta) {
        cJSON_AddItemToObject(root, "__metadata__", meta);
        f->meta = meta;
    }
    memcpy(f->kids, kids, sizeof *kids * (size_t)nkids);
    f->nkids = nkids;
    return f;
}

dt_st_file *dt_st_compose_kid(const dt_st_file *v, int i) { return i >= 0 && i < v->nkids ? v->kids[i] : NULL; }

dt_status dt_st_compose_add(dt_st_file *v, const dt_st_tensor *t) {
    if (!grow(v)) return dt_error(DT_ERR_NOMEM, "%s: out of memory", v->path);
    char **names = realloc(v->names, sizeof *names * (size_t)(v->cap + 1));
    if (!names) return dt_error(DT_ERR_NOMEM, "%s: out of memory", v->path);
    v->names = names;
    if (!(names[v->n] = strdup(t->name))) return dt_error(DT_ERR_NOMEM, "%s: out of memory", v->path);
    v->t[v->n] = *t;
    v->t[v->n].name = names[v->n];
    v->t[v->n].data = NULL;
    v->e0[v->n] = v->next;
    v->ne[v->n] = 0;
    v->n++;
    return DT_OK;
}

dt_status dt_st_compose_take(dt_st_file *v, const dt_st_file *kid, const dt_st_tensor *kt, size_t first, size_t n) {
    int k = tensor_index(kid, kt), i = v->n - 1;
    if (k < 0 || i < 0 || kid->ne[k] != 1 || kt->dtype != v->t[i].dtype) return dt_error(DT_ERR_INTERNAL, "%s: composing", v->path);
    size_t es = dt_dtype_size(kt->dtype), have = 0;
    for (int e = v->e0[i]; e < v->e0[i] + v->ne[i]; e++) have += v->ext[e].len;
    if (first > kt->nbytes / es || n > kt->nbytes / es - first || n * es > v->t[i].nbytes - have)
        return dt_error(DT_ERR_INTERNAL, "%s: tensor '%s' composed past its end", v->path, v->t[i].name);
    if (!grow(v)) return dt_error(DT_ERR_NOMEM, "%s: out of memory", v->path);
    const st_extent *src = &kid->ext[kid->e0[k]];
    v->ext[v->next++] = (st_extent){src->src, src->off + first * es, n * es};
    v->ne[i]++;
    return DT_OK;
}

dt_status dt_st_compose_end(dt_st_file *v) {
    for (int i = 0; i < v->n; i++) {
        size_t have = 0;
        for (int e = v->e0[i]; e < v->e0[i] + v->ne[i]; e++) have += v->ext[e].len;
        if (have != v->t[i].nbytes)
            return dt_error(DT_ERR_INTERNAL, "%s: tensor '%s' composed of %zu of its %zu bytes", v->path, v->t[i].name,
                            have, v->t[i].nbytes);
    }
    // Its values are its kids' (every one scanned and finite: then so is it).
    int clean = 1;
    for (int k = 0; k < v->nkids; k++) clean &= v->kids[k]->scanned && !v->kids[k]->nonfinite;
    v->scanned = clean;
    return DT_OK;
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
    // Every tensor checked before the first is read.
    float *p = dt_model_params(m);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < dt_model_num_tensors(m) && st == DT_OK; i++) {
            const dt_tensor_info *ti = dt_model_tensor(m, i);
            const dt_st_tensor *t;
            st = dt_st_expect(f, path, ti->name, DT_F32, ti->ndim, ti->shape, DT_ERR_FORMAT, &t);
            if (st == DT_OK && pass) st = dt_st_read(f, t, 0, ti->numel, DT_F32, p + ti->offset);
        }
    dt_st_close(f);
    return st;
}
