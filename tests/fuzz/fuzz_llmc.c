/* libFuzzer target: llm.c checkpoints (dt_llmc_parse). Any input must either be
 * rejected with a message, or describe a consistent model whose parameter
 * block fills the rest of the buffer exactly. */
#include "dtrain/gpt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile float g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    dt_gpt_config c;
    const float *p;
    if (dt_llmc_parse(buf, size, "fuzz", &c, &p) == DT_OK) {
        if (dt_gpt_config_check(&c, "fuzz") != DT_OK) abort();
        if ((const uint8_t *)p != buf + 1024) abort();
        if (1024 + 4 * dt_gpt_config_num_params(&c) != size) abort();
        float s = 0;
        for (size_t i = 0; i < dt_gpt_config_num_params(&c); i++) s += p[i];  // touch every byte
        g_sink = s;
    } else if (!dt_last_error()[0]) {
        abort();
    }
    free(buf);
    return 0;
}
