/* libFuzzer target: llm.c token files (dt_tokens_parse). Any input must either
 * be rejected with a status and message, or yield tokens that all lie in
 * the buffer and below the vocabulary. */
#include "dtrain/gpt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // The parser reads the header as int32 and tokens as uint16 in place:
    // give it an aligned copy, as mmap does.
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    const uint16_t *tok;
    size_t n;
    int vocab = size > 0 ? 1 + data[0] * 257 : 256;
    if (dt_tokens_parse(buf, size, "fuzz", vocab, &tok, &n) == DT_OK) {
        if (1024 + 2 * n != size) abort();
        for (size_t i = 0; i < n; i++)
            if (tok[i] >= vocab) abort();
    } else if (!dt_last_error()[0]) {
        abort();  // a failure must say why
    }
    free(buf);
    return 0;
}
