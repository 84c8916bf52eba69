/* libFuzzer target: dt_idx_parse on arbitrary bytes.
 *
 * A successful parse must describe memory inside the buffer: every data byte
 * is read back (ASan flags any overrun) and the header's product of
 * dimensions must equal the count. */
#include "dtrain/data.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_idx idx;
    if (dt_idx_parse(data, size, "fuzz.idx", &idx) != DT_OK) return 0;
    size_t count = 1;
    for (int i = 0; i < idx.ndim; i++) count *= (size_t)idx.dims[i];
    if (idx.ndim < 1 || idx.ndim > 4 || count != idx.count) abort();
    if (idx.data < data || idx.data + idx.count != data + size) abort();
    unsigned sum = 0;
    for (size_t i = 0; i < idx.count; i++) sum += idx.data[i];
    volatile unsigned sink = sum;
    (void)sink;
    return 0;
}
