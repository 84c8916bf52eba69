/* IDX files (the MNIST family's format): big-endian header
 *   0x00 0x00 <type> <ndim>, then ndim uint32 dimensions, then the data.
 * dtrain reads unsigned-byte arrays (type 0x08), plain or gzip-compressed. */
#include "dtrain/data.h"
#include "data/data_io.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static _Atomic uint64_t data_bytes;  // dt_data_bytes_read

void dt_data_read_count(uint64_t n) { data_bytes += n; }

uint64_t dt_data_bytes_read(void) { return data_bytes; }

// DIR/NAME.gz, or DIR/NAME when only that exists.
static dt_status find_idx(const char *dir, const char *name, char *out, size_t n) {
    if ((size_t)snprintf(out, n, "%s/%s.gz", dir, name) >= n)
        return dt_error(DT_ERR_ARG, "%s/%s.gz: path longer than %zu bytes", dir, name, n - 1);
    int kind;  // (a file, or an object: dir s3://BUCKET/PREFIX)
    dt_status st = dt_path_kind(out, &kind, NULL);
    if (st != DT_OK || kind) return st;
    snprintf(out, n, "%s/%s", dir, name);
    if ((st = dt_path_kind(out, &kind, NULL)) != DT_OK || kind) return st;
    return dt_error(DT_ERR_IO, "%s/%s.gz: cannot open: no such file (nor %s, plain)", dir, name, out);
}

dt_status dt_idx_find_split(const char *dir, const char *prefix, char *images, char *labels, size_t n) {
    char name[256];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    dt_status st = find_idx(dir, name, images, n);
    if (st != DT_OK) return st;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    return find_idx(dir, name, labels, n);
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// The header of an IDX buffer of at least `len` bytes: fills out's ndim,
// dims and count, and *hdr with the header's length.
static dt_status parse_header(const uint8_t *buf, size_t len, const char *what, dt_idx *out, size_t *hdr) {
    memset(out, 0, sizeof *out);
    if (len < 4)
        return dt_error(DT_ERR_FORMAT, "%s: not an IDX file (%zu bytes, shorter than the 4-byte magic)", what, len);
    if (buf[0] != 0 || buf[1] != 0)
        return dt_error(DT_ERR_FORMAT, "%s: not an IDX file (magic %02x %02x %02x %02x, expected 00 00 08 0N)",
                        what, buf[0], buf[1], buf[2], buf[3]);
    if (buf[2] != 0x08)
        return dt_error(DT_ERR_FORMAT, "%s: IDX element type 0x%02x, expected 0x08 (unsigned byte)", what, buf[2]);
    int nd = buf[3];
    if (nd < 1 || nd > 4)
        return dt_error(DT_ERR_FORMAT, "%s: IDX with %d dimensions, expected 1 to 4", what, nd);
    *hdr = 4 + 4 * (size_t)nd;
    if (len < *hdr)
        return dt_error(DT_ERR_FORMAT, "%s: truncated IDX header (%zu bytes, need %zu)", what, len, *hdr);
    size_t count = 1;
    for (int i = 0; i < nd; i++) {
        uint32_t d = be32(buf + 4 + 4 * i);
        if (d == 0 || d > 0x7fffffff)
            return dt_error(DT_ERR_FORMAT, "%s: IDX dimension %d is %u", what, i, d);
        out->dims[i] = (int32_t)d;
        if (count > ((size_t)1 << 32) / d)  // (dt_read_file_gz's limit)
            return dt_error(DT_ERR_FORMAT, "%s: IDX dimensions announce more than 4 GiB of data, the limit of a data file",
                            what);
        count *= d;
    }
    out->ndim = nd;
    out->count = count;
    return DT_OK;
}

// ----------------------------------------------------------------------------
// a rank's rows of an IDX file: read by ranges

// A data file read forward: a plain file by ranges, a gzip stream inflated
// from its start as its compressed bytes are fetched, GZ_PIECE at a time.
#define GZ_PIECE ((size_t)4 << 20)
#define SKIP_PIECE ((size_t)1 << 20)

typedef struct {
    dt_rfile *f;
    const char *path;
    uint64_t size;
    int gz, zinit;
    z_stream z;
    uint8_t *in, *skip;  // gz: the compressed piece, the bytes inflated to be passed over
    uint64_t in_at;      // gz: the next compressed byte to fetch
    uint64_t out_at;     // gz: the uncompressed bytes inflated so far
} fwd_t;

static dt_status fwd_open(fwd_t *w, const char *path) {
    memset(w, 0, sizeof *w);
    w->path = path;
    dt_status st = dt_rfile_open(&w->f, path);
    if (st != DT_OK) return st;
    dt_rfile_set_block(w->f, 0);  // (exact ranges: no read-ahead into another rank's rows)
    w->size = dt_rfile_size(w->f);
    uint8_t m[2] = {0, 0};
    if (w->size >= 2 && (st = dt_rfile_read(w->f, 0, m, 2)) != DT_OK) return st;
    w->gz = m[0] == 0x1f && m[1] == 0x8b;
    if (!w->gz) return DT_OK;
    dt_data_read_count(2);
    if (!(w->in = malloc(GZ_PIECE)) || !(w->skip = malloc(SKIP_PIECE)))
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    if (inflateInit2(&w->z, 15 + 16) != Z_OK) return dt_error(DT_ERR_NOMEM, "%s: out of memory (zlib)", path);
    w->zinit = 1;
    return DT_OK;
}

static void fwd_close(fwd_t *w) {
    if (w->zinit) inflateEnd(&w->z);
    free(w->in);
    free(w->skip);
    dt_rfile_close(w->f);
}

// n inflated bytes into dst; *got of them (fewer: the stream ended there).
static dt_status gz_next(fwd_t *w, uint8_t *dst, size_t n, size_t *got) {
    *got = 0;
    while (*got < n) {
        size_t want = n - *got < ((size_t)1 << 30) ? n - *got : (size_t)1 << 30;
        w->z.next_out = dst + *got;
        w->z.avail_out = (uInt)want;
        if (w->z.avail_in == 0) {
            if (w->in_at >= w->size) return DT_OK;  // (the caller says what the end means)
            size_t len = w->size - w->in_at < GZ_PIECE ? (size_t)(w->size - w->in_at) : GZ_PIECE;
            dt_status st = dt_rfile_read(w->f, w->in_at, w->in, len);
            if (st != DT_OK) return st;
            dt_data_read_count(len);
            w->in_at += len;
            w->z.next_in = w->in;
            w->z.avail_in = (uInt)len;
        }
        int rc = inflate(&w->z, Z_NO_FLUSH);
        size_t made = want - w->z.avail_out;
        *got += made;
        w->out_at += made;
        if (rc == Z_STREAM_END) {
            if (w->z.avail_in == 0 && w->in_at >= w->size) return DT_OK;
            inflateReset(&w->z);  // (another gzip member follows, as gzread reads it)
        } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
            return dt_error(DT_ERR_FORMAT, "%s: corrupt or truncated gzip data (%s)", w->path,
                            w->z.msg ? w->z.msg : "inflate failed");
        }
    }
    return DT_OK;
}

// Bytes [at, at + n) of the (uncompressed) data into dst; a gzip stream
// only forward (at no earlier than what was read). DT_ERR_FORMAT naming
// where the data ends when it ends first.
static dt_status fwd_read(fwd_t *w, uint64_t at, void *dst, size_t n) {
    if (!w->gz) {
        if (at > w->size || n > w->size - at)
            return dt_error(DT_ERR_FORMAT, "%s: ends at byte %llu, before byte %llu (truncated)", w->path,
                            (unsigned long long)w->size, (unsigned long long)(at + n));
        dt_status st = dt_rfile_read(w->f, at, dst, n);
        if (st == DT_OK) dt_data_read_count(n);
        return st;
    }
    size_t got;
    dt_status st = DT_OK;
    while (st == DT_OK && w->out_at < at) {
        size_t k = at - w->out_at < SKIP_PIECE ? (size_t)(at - w->out_at) : SKIP_PIECE;
        if ((st = gz_next(w, w->skip, k, &got)) == DT_OK && got < k) break;
    }
    if (st == DT_OK && w->out_at == at) st = gz_next(w, dst, n, &got);
    if (st == DT_OK && w->out_at < at + n)
        st = dt_error(DT_ERR_FORMAT, "%s: ends at byte %llu once uncompressed, before byte %llu (truncated gzip data?)",
                      w->path, (unsigned long long)w->out_at, (unsigned long long)(at + n));
    return st;
}

// After the data's last byte: whether more follows (a plain file's length
// was checked with its header).
static dt_status fwd_check_end(fwd_t *w, size_t count) {
    uint8_t b;
    size_t got = 0;
    dt_status st = w->gz ? gz_next(w, &b, 1, &got) : DT_OK;
    if (st == DT_OK && got)
        st = dt_error(DT_ERR_FORMAT, "%s: IDX header announces %zu bytes of data, file has more (trailing bytes)", w->path,
                      count);
    return st;
}

// The file's header, checked: *out its dimensions, *hdr its length.
static dt_status fwd_header(fwd_t *w, dt_idx *out, size_t *hdr) {
    uint8_t hb[4 + 4 * 4];
    dt_status st = fwd_read(w, 0, hb, 4);
    int nd = st == DT_OK && hb[0] == 0 && hb[1] == 0 && hb[3] >= 1 && hb[3] <= 4 ? hb[3] : 0;  // (else parse_header says why)
    if (st == DT_OK && nd) st = fwd_read(w, 4, hb + 4, 4 * (size_t)nd);
    return st == DT_OK ? parse_header(hb, 4 + 4 * (size_t)nd, w->path, out, hdr) : st;
}

// The header of an object read by ranges (not the whole object staged).
static dt_status remote_header(const char *path, dt_idx *out) {
    fwd_t w;
    size_t hdr;
    dt_status st = fwd_open(&w, path);
    if (st == DT_OK) st = fwd_header(&w, out, &hdr);
    fwd_close(&w);
    return st;
}

dt_status dt_idx_read_header(const char *path, dt_idx *out) {
    memset(out, 0, sizeof *out);
    if (dt_path_remote(path)) return remote_header(path, out);
    int fd;
    if (dt_open_read(path, &fd) != DT_OK) return DT_ERR_IO;
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        close(fd);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    uint8_t buf[20];
    int r = gzread(f, buf, sizeof buf), e = Z_OK;
    const char *msg = r < 0 ? gzerror(f, &e) : "";
    dt_status st = r >= 0 ? DT_OK
                 : e == Z_ERRNO ? dt_error(DT_ERR_IO, "%s: cannot read: %s", path, strerror(errno))
                                : dt_error(DT_ERR_FORMAT, "%s: corrupt gzip data (%s)", path, msg);
    gzclose(f);
    if (st != DT_OK) return st;
    size_t hdr = 0;
    return parse_header(buf, (size_t)r, path, out, &hdr);
}

dt_status dt_idx_read(const char *path, uint8_t **buf, dt_idx *out) {
    *buf = NULL;
    size_t len;
    dt_status st = dt_idx_read_header(path, out);
    if (st != DT_OK) return st;
    // (a byte past the claim: dt_idx_parse names trailing bytes)
    if ((st = dt_read_file_gz(path, 4 + 4 * (size_t)out->ndim + out->count + 1, buf, &len)) != DT_OK) return st;
    if ((st = dt_idx_parse(*buf, len, path, out)) != DT_OK) {
        free(*buf);
        *buf = NULL;
    }
    return st;
}

dt_status dt_idx_read_rows(const char *path, int64_t first, int64_t rows, int64_t *total, uint8_t **buf, dt_idx *out) {
    *buf = NULL;
    *total = 0;
    memset(out, 0, sizeof *out);
    fwd_t w;
    dt_idx file;
    size_t hdr = 0;
    dt_status st = fwd_open(&w, path);
    if (st == DT_OK) st = fwd_header(&w, &file, &hdr);
    if (st != DT_OK) goto done;
    size_t row = file.count / (size_t)file.dims[0];
    if (first < 0 || rows < 0 || first + rows > file.dims[0]) {
        st = dt_error(DT_ERR_ARG, "%s: rows [%lld, %lld) of %d", path, (long long)first, (long long)(first + rows),
                      file.dims[0]);
        goto done;
    }
    if (!w.gz && w.size != hdr + file.count) {
        st = dt_error(DT_ERR_FORMAT, "%s: IDX header announces %zu bytes of data, file has %llu (%s)", path, file.count,
                      (unsigned long long)(w.size - hdr), w.size - hdr < file.count ? "truncated" : "trailing bytes");
        goto done;
    }
    size_t n = (size_t)rows * row;
    if (!(*buf = malloc(n ? n : 1))) {
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu bytes", path, n);
        goto done;
    }
    st = fwd_read(&w, hdr + (uint64_t)first * row, *buf, n);
    if (st == DT_OK && first + rows == file.dims[0]) st = fwd_check_end(&w, file.count);
    if (st != DT_OK) goto done;
    *out = file;
    *total = file.dims[0];
    out->dims[0] = (int32_t)rows;
    out->count = n;
    out->data = *buf;
done:
    fwd_close(&w);
    if (st != DT_OK) {
        free(*buf);
        *buf = NULL;
    }
    return st;
}

dt_status dt_idx_parse(const uint8_t *buf, size_t len, const char *what, dt_idx *out) {
    size_t hdr = 0;
    dt_status st = parse_header(buf, len, what, out, &hdr);
    if (st != DT_OK) return st;
    size_t count = out->count;
    if (len - hdr != count)
        return dt_error(DT_ERR_FORMAT, "%s: IDX header announces %zu bytes of data, file has %zu (%s)", what,
                        count, len - hdr, len - hdr < count ? "truncated" : "trailing bytes");
    out->data = buf + hdr;
    return DT_OK;
}

void dt_dataset_free(dt_dataset *ds) {
    dt_free(ds->x);
    free(ds->y);
    free(ds->raw);
    memset(ds, 0, sizeof *ds);
}

size_t dt_dataset_sample_size(const dt_dataset *ds) {
    return (size_t)ds->shape[0] * ds->shape[1] * ds->shape[2];
}

void dt_dataset_sample(const dt_dataset *ds, int j, float *out) {
    size_t ss = dt_dataset_sample_size(ds);
    j -= ds->first;
    if (ds->x) {
        memcpy(out, ds->x + (size_t)j * ss, sizeof(float) * ss);
        return;
    }
    const uint8_t *r = ds->raw + (size_t)j * ss;
    for (size_t i = 0; i < ss; i++) out[i] = r[i] * ds->scale + ds->shift;
}

dt_status dt_dataset_from_u8(dt_dataset *ds, const uint8_t *pixels, const int64_t *labels, int n,
                             const int shape[3], int classes, float mean, float std, int cache,
                             const char *what) {
    memset(ds, 0, sizeof *ds);
    if (!(std > 0.0f)) return dt_error(DT_ERR_ARG, "dataset: std must be > 0");
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return dt_error(DT_ERR_FORMAT, "%s: label %lld of sample %d is outside 0..%d", what,
                            (long long)labels[i], i, classes - 1);
    ds->n = n;
    ds->total = n;
    memcpy(ds->shape, shape, sizeof ds->shape);
    ds->classes = classes;
    ds->scale = 1.0f / (255.0f * std);
    ds->shift = -mean / std;
    size_t count = (size_t)n * dt_dataset_sample_size(ds);
    if (cache)
        ds->x = dt_alloc(sizeof(float) * (count ? count : 1));
    else
        ds->raw = malloc(count ? count : 1);
    ds->y = malloc(sizeof(int32_t) * (n ? (size_t)n : 1));
    if (!(ds->x || ds->raw) || !ds->y) {
        dt_dataset_free(ds);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory for %d samples", what, n);
    }
    if (cache)
        for (size_t i = 0; i < count; i++) ds->x[i] = pixels[i] * ds->scale + ds->shift;
    else
        memcpy(ds->raw, pixels, count);
    for (int i = 0; i < n; i++) ds->y[i] = (int32_t)labels[i];
    return DT_OK;
}

// Samples [first, first + rows) of an image/label pair (rows < 0: the whole
// files, read and checked whole).
static dt_status load_idx(dt_dataset *ds, const char *images, const char *labels, int classes, float mean, float std,
                          int cache, int64_t first, int64_t rows) {
    memset(ds, 0, sizeof *ds);
    if (!(std > 0.0f)) return dt_error(DT_ERR_ARG, "dataset: std must be > 0");
    uint8_t *ib = NULL, *lb = NULL;
    int64_t *y = NULL, ni = 0, nl = 0;
    dt_idx ii, li;
    dt_status st;
    if (rows < 0) {
        st = dt_idx_read(images, &ib, &ii);
        if (st == DT_OK) st = dt_idx_read(labels, &lb, &li);
        ni = ii.dims[0], nl = li.dims[0];
        int kind;  // (what was read: the files whole)
        uint64_t size;
        for (int k = 0; k < 2 && st == DT_OK; k++)
            if (dt_path_kind(k ? labels : images, &kind, &size) == DT_OK) dt_data_read_count(size);
    } else {
        st = dt_idx_read_rows(images, first, rows, &ni, &ib, &ii);
        if (st == DT_OK) st = dt_idx_read_rows(labels, first, rows, &nl, &lb, &li);
    }
    if (st != DT_OK) goto done;
    if (ii.ndim != 3) {
        st = dt_error(DT_ERR_FORMAT, "%s: images must be a 3-D IDX array (count, rows, cols), got %d-D", images, ii.ndim);
        goto done;
    }
    if (li.ndim != 1) {
        st = dt_error(DT_ERR_FORMAT, "%s: labels must be a 1-D IDX array, got %d-D", labels, li.ndim);
        goto done;
    }
    if (nl != ni) {
        st = dt_error(DT_ERR_FORMAT, "%s has %lld labels but %s has %lld images", labels, (long long)nl, images,
                      (long long)ni);
        goto done;
    }
    if (!(y = malloc(sizeof *y * (li.count ? li.count : 1)))) {
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory", labels);
        goto done;
    }
    for (size_t i = 0; i < li.count; i++) y[i] = li.data[i];
    int shape[3] = {1, ii.dims[1], ii.dims[2]};
    st = dt_dataset_from_u8(ds, ii.data, y, ii.dims[0], shape, classes, mean, std, cache, labels);
    if (st == DT_OK) {
        ds->first = (int)(rows < 0 ? 0 : first);
        ds->total = (int)ni;
    }
done:
    free(ib);
    free(lb);
    free(y);
    return st;
}

dt_status dt_dataset_load_idx(dt_dataset *ds, const char *images, const char *labels, int classes,
                              float mean, float std, int cache) {
    return load_idx(ds, images, labels, classes, mean, std, cache, 0, -1);
}

dt_status dt_dataset_load_idx_rows(dt_dataset *ds, const char *images, const char *labels, int classes, float mean,
                                   float std, int cache, int first, int rows) {
    if (first < 0 || rows < 0) return dt_error(DT_ERR_ARG, "%s: samples [%d, %d)", images, first, first + rows);
    return load_idx(ds, images, labels, classes, mean, std, cache, first, rows);
}
