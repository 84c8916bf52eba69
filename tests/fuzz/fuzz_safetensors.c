/* libFuzzer target: dt_st_parse on arbitrary bytes, then every accessor over
 * the result.
 *
 * A file that parses must be safe to use: each tensor's bytes lie inside the
 * buffer (read back in full with dt_st_read, so ASan flags an overrun, and
 * streamed by dt_st_scan), its byte count matches its shape and dtype, a
 * range past its end is refused, and lookups by name and metadata key work. */
#include "dtrain/ckpt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_st_file *f = NULL;
    if (dt_st_parse(&f, data, size, "fuzz.safetensors") != DT_OK) {
        if (f) abort();  // a failed parse hands back nothing
        return 0;
    }
    int n = dt_st_count(f);
    if (n < 0) abort();
    unsigned sum = 0;
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = dt_st_get(f, i);
        if (!t || !t->name) abort();
        if (t->ndim < 0 || t->ndim > 8) abort();
        // The shape's byte count, without wrapping around, must be nbytes.
        size_t bytes = dt_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0 || __builtin_mul_overflow(bytes, (size_t)t->shape[d], &bytes)) abort();
        if (bytes != t->nbytes) abort();
        if (t->data) abort();  // (a file's tensors are read, never mapped)
        uint8_t *p = malloc(t->nbytes + 1);
        size_t ne = t->nbytes / dt_dtype_size(t->dtype);
        if (!p) abort();
        if (dt_st_read(f, t, 0, ne, t->dtype, p) != DT_OK) abort();
        for (size_t b = 0; b < t->nbytes; b++) sum += p[b];
        if (ne && dt_st_read(f, t, ne - 1, 1, t->dtype, p) != DT_OK) abort();
        if (dt_st_read(f, t, ne, 1, t->dtype, p) != DT_ERR_ARG) abort();
        free(p);
        const dt_st_tensor *u = dt_st_find(f, t->name);
        if (!u || strcmp(u->name, t->name)) abort();
    }
    if (dt_st_scan(f, NULL, NULL, NULL) != DT_OK) abort();
    dt_status fin = dt_st_check_finite(f, "fuzz.safetensors");
    if (fin != DT_OK && fin != DT_ERR_NUMERIC) abort();
    if (dt_st_get(f, -1) || dt_st_get(f, n)) abort();
    if (dt_st_find(f, "no such tensor \x01")) abort();
    const char *keys[] = {"format", "dtrain_version", "name", ""};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *v = dt_st_meta_get(f, keys[k]);
        if (v) sum += (unsigned)strlen(v);
    }
    volatile unsigned sink = sum;
    (void)sink;
    dt_st_close(f);
    return 0;
}
