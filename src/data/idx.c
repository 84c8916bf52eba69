/* IDX files (the MNIST family's format): big-endian header
 *   0x00 0x00 <type> <ndim>, then ndim uint32 dimensions, then the data.
 * dtrain reads unsigned-byte arrays (type 0x08), plain or gzip-compressed. */
#include "dtrain/data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

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

dt_status dt_idx_read_header(const char *path, dt_idx *out) {
    memset(out, 0, sizeof *out);
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

dt_status dt_dataset_load_idx(dt_dataset *ds, const char *images, const char *labels, int classes,
                              float mean, float std, int cache) {
    memset(ds, 0, sizeof *ds);
    if (!(std > 0.0f)) return dt_error(DT_ERR_ARG, "dataset: std must be > 0");
    uint8_t *ib = NULL, *lb = NULL;
    int64_t *y = NULL;
    dt_idx ii, li;
    dt_status st = dt_idx_read(images, &ib, &ii);
    if (st == DT_OK) st = dt_idx_read(labels, &lb, &li);
    if (st != DT_OK) goto done;
    if (ii.ndim != 3) {
        st = dt_error(DT_ERR_FORMAT, "%s: images must be a 3-D IDX array (count, rows, cols), got %d-D", images, ii.ndim);
        goto done;
    }
    if (li.ndim != 1) {
        st = dt_error(DT_ERR_FORMAT, "%s: labels must be a 1-D IDX array, got %d-D", labels, li.ndim);
        goto done;
    }
    if (li.dims[0] != ii.dims[0]) {
        st = dt_error(DT_ERR_FORMAT, "%s has %d labels but %s has %d images", labels, li.dims[0], images,
                      ii.dims[0]);
        goto done;
    }
    if (!(y = malloc(sizeof *y * li.count))) {
        st = dt_error(DT_ERR_NOMEM, "%s: out of memory", labels);
        goto done;
    }
    for (size_t i = 0; i < li.count; i++) y[i] = li.data[i];
    int shape[3] = {1, ii.dims[1], ii.dims[2]};
    st = dt_dataset_from_u8(ds, ii.data, y, ii.dims[0], shape, classes, mean, std, cache, labels);
done:
    free(ib);
    free(lb);
    free(y);
    return st;
}
