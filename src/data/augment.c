/* Augmentation hooks (data.h): a table of functions that change one decoded
 * sample in place, drawing from an rng that the loader seeds per (seed,
 * epoch, sample position). A new hook is a function and a row of the table
 * (and, if it takes a setting, a field of dt_augment_params and a [data]
 * key). */
#include "dtrain/data.h"

#include <ctype.h>
#include <string.h>

// A random H x W window of the image padded by p on each side: the image
// moves by (dy, dx) in [-p, p]^2, what comes in from outside is `fill`.
// In place: rows are visited in the order that reads a row before it is
// written, and memmove handles a shift within a row.
static void crop(float *x, const int shape[3], float fill, const dt_augment_params *ap, dt_rng *r) {
    int p = ap->crop_pad, H = shape[1], W = shape[2];
    int dy = (int)dt_rng_below(r, (uint32_t)(2 * p + 1)) - p, dx = (int)dt_rng_below(r, (uint32_t)(2 * p + 1)) - p;
    if (dy == 0 && dx == 0) return;
    int adx = dx < 0 ? -dx : dx, keep = W - adx;
    for (int c = 0; c < shape[0]; c++) {
        float *img = x + (size_t)c * H * W;
        for (int k = 0; k < H; k++) {
            int y = dy >= 0 ? k : H - 1 - k, src = y + dy;  // output row y shows input row y + dy
            float *out = img + (size_t)y * W;
            if (src < 0 || src >= H || keep <= 0) {
                for (int i = 0; i < W; i++) out[i] = fill;
                continue;
            }
            const float *in = img + (size_t)src * W;
            if (dx >= 0) {
                memmove(out, in + dx, sizeof(float) * (size_t)keep);
                for (int i = keep; i < W; i++) out[i] = fill;
            } else {
                memmove(out + adx, in, sizeof(float) * (size_t)keep);
                for (int i = 0; i < adx; i++) out[i] = fill;
            }
        }
    }
}

// Left-right mirror with probability 1/2.
static void flip(float *x, const int shape[3], float fill, const dt_augment_params *ap, dt_rng *r) {
    (void)fill, (void)ap;
    if (dt_rng_below(r, 2) == 0) return;
    int W = shape[2];
    size_t rows = (size_t)shape[0] * shape[1];
    for (size_t y = 0; y < rows; y++) {
        float *row = x + y * W;
        for (int i = 0, j = W - 1; i < j; i++, j--) {
            float t = row[i];
            row[i] = row[j];
            row[j] = t;
        }
    }
}

static const dt_augment_op ops[] = {
    {"crop", crop},
    {"flip", flip},
};
#define NOPS (int)(sizeof ops / sizeof ops[0])

const dt_augment_op *dt_augment_ops(int *n) {
    *n = NOPS;
    return ops;
}

dt_status dt_augment_parse(const char *text, int *ids, int *n) {
    *n = 0;
    const char *p = text;
    for (;;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) return DT_OK;
        size_t len = strcspn(p, ", \t");
        int found = -1;
        for (int i = 0; i < NOPS; i++)
            if (strlen(ops[i].name) == len && !strncmp(p, ops[i].name, len)) found = i;
        if (found < 0) return dt_error(DT_ERR_ARG, "unknown augmentation '%.*s' (expected crop or flip)", (int)(len > 64 ? 64 : len), p);
        if (*n == DT_MAX_AUGMENT) return dt_error(DT_ERR_ARG, "more than %d augmentations", DT_MAX_AUGMENT);
        ids[(*n)++] = found;
        p += len;
    }
}
