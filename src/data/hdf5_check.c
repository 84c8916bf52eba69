/* The HDF5 reader's own checks (data.h, dt_hdf5_check): what was found
 * under the images' and labels' names against what a classifier's data
 * must be, before any byte is read. No libhdf5 here, so that a fuzzer can
 * drive the checks with made-up descriptions. */
#include "dtrain/data.h"

#include <stdio.h>

#define DT_HDF5_MAX_BYTES ((int64_t)1 << 32)  // as dt_read_file_gz: 4 GiB

static const char *type_name(const dt_hdf5_desc *d, char *buf, size_t n) {
    const char *cls = d->type_class == 0 ? (d->is_signed ? "signed integers" : "unsigned integers")
                      : d->type_class == 1 ? "floats" : "a non-numeric type";
    if (d->type_class == 0 || d->type_class == 1)
        snprintf(buf, n, "%d-bit %s", d->type_size * 8, cls);
    else
        snprintf(buf, n, "%s", cls);
    return buf;
}

static dt_status exists(const char *file, const dt_hdf5_desc *d, const char *what) {
    if (!d->found)
        return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the %s) not found in the file", file, d->name, what);
    if (!d->is_dataset)
        return dt_error(DT_ERR_FORMAT, "%s: '%s' (the %s) is a group, not a dataset", file, d->name, what);
    if (d->ndim < 0 || d->ndim > 32)
        return dt_error(DT_ERR_FORMAT, "%s: dataset '%s': %d dimensions", file, d->name, d->ndim);
    return DT_OK;
}

// Whether d's stored bytes can hold the `claim` bytes of its shape, inside the file.
static dt_status holds(const char *file, const dt_hdf5_desc *d, const char *what, int64_t claim) {
    if (d->external)
        return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the %s) keeps its data outside the file (external raw storage "
                        "or a virtual dataset); only data inside the file is read", file, d->name, what);
    if (d->stored < 0 || d->stored >= (claim + 1099) / 1100) return DT_OK;
    return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the %s) claims %lld bytes but the file stores %lld for it, too "
                    "few to hold them even compressed (a damaged or crafted file)", file, d->name, what,
                    (long long)claim, (long long)d->stored);
}

dt_status dt_hdf5_check(const char *file, const dt_hdf5_desc *im, const dt_hdf5_desc *lb, int shape[3],
                        int64_t *n) {
    char t[64];
    dt_status st = exists(file, im, "images");
    if (st == DT_OK) st = exists(file, lb, "labels");
    if (st != DT_OK) return st;
    if (im->type_class != 0 || im->type_size != 1 || im->is_signed)
        return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the images) holds %s, expected 8-bit unsigned integers (pixels 0-255)",
                        file, im->name, type_name(im, t, sizeof t));
    if (im->ndim != 3 && im->ndim != 4)
        return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the images) has %d dimensions, expected 3 (N, H, W) or 4 (N, C, H, W)",
                        file, im->name, im->ndim);
    int64_t total = 1;
    for (int i = 0; i < im->ndim; i++) {
        int64_t d = im->dims[i];
        if (d <= 0 || d > 0x7fffffff)
            return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the images): dimension %d is %lld", file, im->name, i,
                            (long long)d);
        if (total > DT_HDF5_MAX_BYTES / d)
            return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the images): more than %lld bytes (4 GiB, the limit of a "
                            "data file)", file, im->name, (long long)DT_HDF5_MAX_BYTES);
        total *= d;
    }
    if ((st = holds(file, im, "images", total)) != DT_OK) return st;
    if (lb->type_class != 0 || lb->type_size < 1 || lb->type_size > 8)
        return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the labels) holds %s, expected integers (class numbers)", file,
                        lb->name, type_name(lb, t, sizeof t));
    if (lb->ndim != 1)
        return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' (the labels) has %d dimensions, expected 1 (N)", file, lb->name,
                        lb->ndim);
    if (lb->dims[0] != im->dims[0])
        return dt_error(DT_ERR_FORMAT, "%s: dataset '%s' has %lld labels but '%s' has %lld images", file, lb->name,
                        (long long)lb->dims[0], im->name, (long long)im->dims[0]);
    if ((st = holds(file, lb, "labels", lb->dims[0] * lb->type_size)) != DT_OK) return st;
    int four = im->ndim == 4;
    shape[0] = four ? (int)im->dims[1] : 1;
    shape[1] = (int)im->dims[1 + four];
    shape[2] = (int)im->dims[2 + four];
    *n = im->dims[0];
    return DT_OK;
}
