/* libFuzzer target: the HDF5 reader's own checks (dt_hdf5_check) and the
 * labels' range check (dt_dataset_from_u8), on made-up descriptions of what
 * a file holds. libhdf5's parsing of the file itself is libhdf5's; what
 * dtrain decides from its answers is tested here.
 *
 * Input: two descriptions (images, then labels) of 70 bytes each: found,
 * is_dataset, type class, type size, signed, ndim (int8), 8 dims (int64
 * little-endian); the rest are the labels (int8 each) and pixels. An
 * accepted pair must describe a loadable set: 3 or 4 positive dimensions of
 * bytes, no more than 2^40 of them, integer labels as many as images. A
 * set small enough for the rest of the input is then built from it. */
#include "dtrain/data.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DESC 70

static void desc(const uint8_t *p, dt_hdf5_desc *d, const char *name) {
    memset(d, 0, sizeof *d);
    d->name = name;
    d->found = p[0] & 1;
    d->is_dataset = p[1] & 1;
    d->type_class = p[2] % 3;
    d->type_size = p[3];
    d->is_signed = p[4] & 1;
    d->ndim = (int8_t)p[5];
    for (int i = 0; i < 8; i++) {
        uint64_t v = 0;
        for (int b = 7; b >= 0; b--) v = v << 8 | p[6 + 8 * i + b];
        d->dims[i] = (int64_t)v;
    }
    d->stored = p[4] & 2 ? -1 : (int64_t)(p[4] >> 2) << (p[3] & 31);  // unknown, or 0 to 63 x 2^31
    d->external = (p[2] & 0x80) != 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 * DESC) return 0;
    dt_hdf5_desc im, lb;
    desc(data, &im, "images");
    desc(data + DESC, &lb, "labels");
    int shape[3];
    int64_t n;
    if (dt_hdf5_check("fuzz.h5", &im, &lb, shape, &n) != DT_OK) {
        if (!dt_last_error()[0]) abort();  // a refusal says why
        return 0;
    }
    if (!im.found || !im.is_dataset || im.type_class != 0 || im.type_size != 1 || im.is_signed) abort();
    if (im.ndim != 3 && im.ndim != 4) abort();
    if (lb.type_class != 0 || lb.ndim != 1 || lb.dims[0] != n || n <= 0) abort();
    int64_t total = n;
    for (int i = 0; i < 3; i++) {
        if (shape[i] <= 0) abort();
        total *= shape[i];
    }
    if (total > ((int64_t)1 << 32) || total <= 0) abort();
    if (im.stored >= 0 && im.stored * 1100 < total) abort();  // more than deflate can expand to
    if (im.external || lb.external) abort();                     // data outside the file
    // Build it when the rest of the input holds n labels and n samples.
    const uint8_t *rest = data + 2 * DESC;
    size_t left = size - 2 * DESC, ss = (size_t)shape[0] * shape[1] * shape[2];
    if (n > 256 || (size_t)n > left || ss > (left - (size_t)n) / (size_t)n) return 0;
    int64_t y[256];
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        y[i] = (int8_t)rest[i];
        bad |= y[i] < 0 || y[i] >= 10;
    }
    dt_dataset ds;
    dt_status st = dt_dataset_from_u8(&ds, rest + n, y, (int)n, shape, 10, 0.5f, 0.25f, rest[0] & 1, "fuzz.h5: labels");
    if ((st == DT_OK) == bad) abort();  // refused exactly when a label is out of range
    if (st == DT_OK) {
        float s[64];
        if (ss <= 64) dt_dataset_sample(&ds, (int)(n - 1), s);
        dt_dataset_free(&ds);
    }
    return 0;
}
